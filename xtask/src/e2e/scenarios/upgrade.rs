//! Upgrades and downgrades keep traffic (issue 38 item 2). The pinned
//! maps and links and the nftables tables outlive the daemon, so a new
//! build meets the old build's datapath, and a rollback meets the new
//! one's. The DaemonSet replaces the pod as this does: SIGTERM to the
//! running daemon, then the other build on the same paths.
//!
//! Old → new → old (the old build: [`crate::e2e::upgrade`]) under a
//! steady load from the node (socket-LB / output path) and from outside
//! (NodePort: tc / prerouting). After each step: no request failed, the
//! pins and nftables tables are those a fresh start of that build makes
//! (nothing of the other build left), and `dump` reads the same
//! programmed state back. At the end the old build's own `cleanup` leaves
//! nothing (no pin, no attached program, no table).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use super::*;
use crate::e2e::bed::NODE_EXTERNAL_IP;
use crate::e2e::upgrade::{old_build, OldBuild};

/// How long each load client runs; a switch (SIGTERM, start, first state
/// programmed) must fit well inside it.
const LOAD_MS: u64 = 9000;
/// Load before the switch starts.
const BEFORE_SWITCH: Duration = Duration::from_millis(1500);
/// The longest a switch may take and still leave load after it.
const SWITCH_BUDGET: Duration = Duration::from_millis(6000);

/// What a step leaves in the kernel, as the scenario compares it.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    /// `dump` (by this tree's binary) without its traffic-driven lines.
    dump: String,
    /// Every path under the bed's bpffs root.
    pins: BTreeSet<String>,
    /// `nft list tables` in the node namespace.
    tables: BTreeSet<String>,
}

pub(super) fn old_new_old(bed: &mut Bed) -> Result<()> {
    let old = old_build()
        .context("no old build prepared (run through `cargo xtask e2e --filter upgrade`)")?
        .clone();
    let new_bin = bed.daemon_bin.clone();
    let result = steps(bed, &old, &new_bin);
    // Whatever happened: nothing of either build stays for the next
    // scenario, which runs this tree's daemon.
    let _ = bed.stop_daemon();
    bed.daemon_bin = new_bin;
    let _ = bed.cleanup_command();
    result
}

fn steps(bed: &mut Bed, old: &OldBuild, new_bin: &Path) -> Result<()> {
    println!("    old build: {} ({})", old.title, old.sha);
    bed.stop_daemon()?;
    bed.cleanup_command()
        .context("cleaning up before the upgrade")?;
    let np = Svc {
        kind: "NodePort",
        node_ports: &[30080],
        ..svc("np", "10.96.0.80")
    };
    bed.apply_manifests(&docs(&[
        service_yaml(&WEB),
        slice_yaml(bed, &WEB, false, &three_pods()),
        service_yaml(&np),
        slice_yaml(bed, &np, false, &three_pods_on_node1()),
    ]))?;

    // What a fresh start of each build leaves: the references.
    let fresh_new = fresh_start(bed, new_bin).context("fresh start of this tree's build")?;
    bed.cleanup_command()
        .context("this tree's cleanup after its fresh start")?;
    let fresh_old = fresh_start(bed, &old.daemon_bin).context("fresh start of the old build")?;
    if fresh_old.dump != fresh_new.dump {
        println!(
            "    note: the two builds program differently (dump of a fresh start):\n{}",
            diff(&fresh_old.dump, &fresh_new.dump)
        );
    }

    for (step, bin, reference) in [
        ("old -> new", new_bin, &fresh_new),
        ("new -> old", old.daemon_bin.as_path(), &fresh_old),
    ] {
        let started = Instant::now();
        switch_under_load(bed, bin).with_context(|| step.to_owned())?;
        let after = settled(bed, reference).with_context(|| format!("{step}: after the switch"))?;
        check_same(step, reference, &after)?;
        println!(
            "    {step}: 0 failed requests, pins, tables and dump as a fresh start ({:.1}s)",
            started.elapsed().as_secs_f64()
        );
        for line in bed.daemon_log().lines().filter(|l| {
            ["replaced", "generation", "layout", "migrat", "repopulat"]
                .iter()
                .any(|w| l.contains(w))
        }) {
            println!("      daemon| {line}");
        }
    }

    // The build left running cleans up after both.
    bed.stop_daemon()?;
    let report = bed
        .cleanup_command()
        .context("the old build's cleanup after the downgrade")?;
    let left = snapshot(bed)?;
    ensure!(
        left.pins.is_empty() && left.tables.is_empty(),
        "the old build's cleanup left pins {:?} and tables {:?}; it said:\n{report}",
        left.pins,
        left.tables
    );
    Ok(())
}

/// Starts `bin` on an empty datapath, waits until both targets answer and
/// the dump is stable; what it programmed. Leaves it running.
fn fresh_start(bed: &mut Bed, bin: &Path) -> Result<Snapshot> {
    bed.stop_daemon()?;
    bed.daemon_bin = bin.to_path_buf();
    bed.start_daemon()?;
    wait_until_served(bed, "tcp", "10.96.0.10:80", Duration::from_secs(5))?;
    wait_served_from_outside(bed, &format!("{NODE_EXTERNAL_IP}:30080"))?;
    let first = snapshot(bed)?;
    // One more read: a snapshot taken mid-apply would make a bad reference.
    std::thread::sleep(Duration::from_millis(300));
    let second = snapshot(bed)?;
    ensure!(
        first == second,
        "the fresh start's state moved while nothing changed:\n{}",
        diff(&first.dump, &second.dump)
    );
    Ok(second)
}

/// Load from the node and from outside while the running daemon is
/// stopped (SIGTERM) and `bin` started on the same paths; fails on any
/// failed request.
fn switch_under_load(bed: &mut Bed, bin: &Path) -> Result<()> {
    let duration = LOAD_MS.to_string();
    let outside = bed.outside_netns.clone();
    let nodeport = format!("{NODE_EXTERNAL_IP}:30080");
    let loads: [(Option<&str>, &str); 2] = [(None, "10.96.0.10:80"), (Some(&outside), &nodeport)];
    let mut clients = Vec::new();
    for (netns, target) in loads {
        let mut child = bed.spawn_client(
            netns,
            &[
                "--proto",
                "tcp",
                "--target",
                target,
                "--duration-ms",
                &duration,
                "--interval-ms",
                "10",
            ],
        )?;
        let stdout = child.stdout.take().context("client stdout")?;
        let reader = std::thread::spawn(move || {
            BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .collect::<Vec<String>>()
        });
        clients.push((target.to_owned(), child, reader));
    }
    std::thread::sleep(BEFORE_SWITCH);
    let started = Instant::now();
    let switched = (|| -> Result<Duration> {
        bed.stop_daemon()?;
        bed.daemon_bin = bin.to_path_buf();
        bed.start_daemon()?;
        Ok(started.elapsed())
    })();
    let mut failures = Vec::new();
    for (target, mut child, reader) in clients {
        let status = child.wait()?;
        let lines = reader
            .join()
            .map_err(|_| anyhow::anyhow!("reader panicked"))?;
        let r = Results::parse(&lines);
        if !status.success() || r.ok_count() < 200 || !r.errors.is_empty() {
            failures.push(format!(
                "{target}: {} answered, {} failed (client {status}), e.g. {:?}",
                r.ok_count(),
                r.errors.len(),
                r.errors.first()
            ));
        }
    }
    let took = switched?;
    ensure!(
        took < SWITCH_BUDGET,
        "the switch took {took:?}: the load ended too soon after it to prove anything"
    );
    ensure!(failures.is_empty(), "{}", failures.join("; "));
    Ok(())
}

/// The state once it equals `reference`, or the last one read after 5 s
/// (the new daemon reconciles after it first publishes).
fn settled(bed: &Bed, reference: &Snapshot) -> Result<Snapshot> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = snapshot(bed)?;
        if s == *reference || Instant::now() > deadline {
            return Ok(s);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn check_same(step: &str, reference: &Snapshot, after: &Snapshot) -> Result<()> {
    let extra: Vec<&String> = after.pins.difference(&reference.pins).collect();
    let missing: Vec<&String> = reference.pins.difference(&after.pins).collect();
    ensure!(
        extra.is_empty() && missing.is_empty(),
        "{step}: pins differ from a fresh start of that build: left over {extra:?}, missing {missing:?}"
    );
    ensure!(
        after.tables == reference.tables,
        "{step}: nftables tables {:?}, a fresh start has {:?}",
        after.tables,
        reference.tables
    );
    ensure!(
        after.dump == reference.dump,
        "{step}: dump differs from a fresh start of that build:\n{}",
        diff(&reference.dump, &after.dump)
    );
    Ok(())
}

fn snapshot(bed: &Bed) -> Result<Snapshot> {
    let mut pins = BTreeSet::new();
    list_pins(&bed.bpffs, &bed.bpffs, &mut pins);
    let tables = in_node(bed, Path::new("nft"), &["list".into(), "tables".into()])?
        .lines()
        .map(str::to_owned)
        .collect();
    // This tree's `dump` reads both builds' pins and tables.
    let mut args: Vec<OsString> = vec!["dump".into()];
    args.extend(bed.last_args.iter().cloned());
    let dump = in_node(bed, &this_tree_daemon(), &args)?;
    Ok(Snapshot {
        dump: steady_lines(&dump),
        pins,
        tables,
    })
}

/// This tree's daemon (the scenario swaps `bed.daemon_bin`).
fn this_tree_daemon() -> PathBuf {
    crate::paths::daemon_bin(&crate::workspace_root())
}

/// The dump without what traffic moves: conntrack, affinity and
/// reverse-NAT entries (socket-LB's, one per connected socket), counters.
fn steady_lines(dump: &str) -> String {
    dump.lines()
        .map(|l| match l.split_once("  reverse-NAT entries: ") {
            Some((services, _)) if l.starts_with("services: ") => services,
            _ => l,
        })
        .filter(|l| {
            !(l.starts_with("conntrack (node-external)")
                || l.starts_with("affinity entries")
                || l.starts_with("  netns ")
                || l.starts_with("stats:")
                || l.contains("counter packets"))
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

fn list_pins(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let rel = path.strip_prefix(root).unwrap_or(&path);
        out.insert(rel.display().to_string());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            list_pins(root, &path, out);
        }
    }
}

/// Runs `bin args` in the node namespace; its stdout.
fn in_node(bed: &Bed, bin: &Path, args: &[OsString]) -> Result<String> {
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", bed.node_netns))
        .arg(bin)
        .args(args)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "{} {args:?} failed: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The lines only one side has, `-` for `a`, `+` for `b`.
fn diff(a: &str, b: &str) -> String {
    let (la, lb): (BTreeSet<&str>, BTreeSet<&str>) = (a.lines().collect(), b.lines().collect());
    let mut out = String::new();
    for l in la.difference(&lb) {
        out.push_str(&format!("      - {l}\n"));
    }
    for l in lb.difference(&la) {
        out.push_str(&format!("      + {l}\n"));
    }
    out
}
