//! `cargo xtask e2e [--proxy-mode ebpf|nftables] [--filter NAME]`: the
//! real daemon, real kernel datapath and real traffic between network
//! namespaces (see `bed.rs` for the topology). Needs root.
//!
//! Prints one line per scenario and ends with `N passed, N failed`. The
//! scenarios named after kube-proxy's upstream e2e tests are run by
//! `cargo xtask conformance` (see `conformance.rs`).

pub mod bed;
pub mod bench;
pub mod demo;
/// The fake API server of the integration tests, shared as one source file.
pub use test_support::{fake_apiserver, netexec};
pub mod conformance;
pub(crate) mod scenarios;
pub mod soak;
pub mod upgrade;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

pub struct Options {
    pub proxy_mode: String,
    pub filter: Option<String>,
    /// The old build of the upgrade scenario (`--upgrade-from REF`).
    pub upgrade_from: Option<String>,
}

pub fn parse_args(args: &[String]) -> Result<Options> {
    let mut opts = Options {
        proxy_mode: "ebpf".to_owned(),
        filter: None,
        upgrade_from: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--proxy-mode" => {
                opts.proxy_mode = it.next().context("--proxy-mode needs a value")?.clone()
            }
            "--filter" => opts.filter = Some(it.next().context("--filter needs a value")?.clone()),
            "--upgrade-from" => {
                opts.upgrade_from = Some(it.next().context("--upgrade-from needs a REF")?.clone())
            }
            other => bail!("e2e: unknown argument {other}"),
        }
    }
    Ok(opts)
}

fn preflight() -> Result<()> {
    let uid = Command::new("id").arg("-u").output()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        bail!("the e2e suite needs root (network namespaces, cgroups, eBPF)");
    }
    for tool in ["ip", "nsenter", "bash", "sysctl"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()?
            .status
            .success();
        if !found {
            bail!("the e2e suite needs `{tool}` (Debian: iproute2, util-linux, procps)");
        }
    }
    let mounted = Command::new("mountpoint")
        .args(["-q", "/sys/fs/bpf"])
        .status()?
        .success();
    if !mounted {
        let st = Command::new("mount")
            .args(["-t", "bpf", "bpf", "/sys/fs/bpf"])
            .status()?;
        if !st.success() {
            bail!("could not mount bpffs at /sys/fs/bpf");
        }
    }
    Ok(())
}

/// Runs the suite; returns (passed, failed, skipped). Each scenario runs
/// once: a scenario that passes only sometimes is a bug to find, never
/// hidden behind a rerun (issue 38).
pub fn run(root: &Path, opts: &Options) -> Result<(usize, usize, usize)> {
    preflight()?;
    let selected = |name: &str| opts.filter.as_deref().is_none_or(|f| name.contains(f));
    if scenarios::all()
        .iter()
        .any(|s| s.name.starts_with("upgrade") && selected(s.name))
    {
        upgrade::prepare(root, opts.upgrade_from.as_deref())?;
    }
    let daemon_bin = crate::paths::daemon_bin(root);
    let mut bed = bed::Bed::new(&opts.proxy_mode, daemon_bin)?;
    println!(
        "e2e: proxy-mode {} ({})",
        opts.proxy_mode,
        bed::describe(&bed)
    );
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for s in scenarios::all() {
        if !selected(s.name) {
            continue;
        }
        let started = Instant::now();
        match (s.run)(&mut bed) {
            Ok(()) => {
                passed += 1;
                println!(
                    "PASS {} [{}] ({:.1}s)",
                    s.name,
                    opts.proxy_mode,
                    started.elapsed().as_secs_f64()
                );
            }
            Err(e) if e.downcast_ref::<scenarios::Skip>().is_some() => {
                skipped += 1;
                println!("SKIP {} [{}]: {e}", s.name, opts.proxy_mode);
            }
            Err(e) => {
                failed += 1;
                println!(
                    "FAIL {} [{}] ({:.1}s): {e:#}",
                    s.name,
                    opts.proxy_mode,
                    started.elapsed().as_secs_f64()
                );
                print_daemon_logs(&bed);
            }
        }
    }
    drop(bed);
    Ok((passed, failed, skipped))
}

/// The last lines of both daemons' logs, after a failure.
fn print_daemon_logs(bed: &bed::Bed) {
    let log = bed.daemon_log();
    let tail: Vec<&str> = log.lines().rev().take(15).collect();
    for l in tail.iter().rev() {
        println!("    daemon| {l}");
    }
    let log = bed.node2_daemon_log();
    let tail: Vec<&str> = log.lines().rev().take(8).collect();
    for l in tail.iter().rev() {
        println!("    node-2 daemon| {l}");
    }
}
