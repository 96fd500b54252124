//! Least privilege: the daemon runs under `capsh` with exactly the
//! capabilities README ("Privileges") and `deploy/daemonset.yaml` grant,
//! serves a ClusterIP with them, and started without any one of them it
//! fails at once with an error naming the missing capability.
//!
//! `capsh --drop` shrinks the bounding set before the daemon is executed
//! as root, so its permitted and effective sets become exactly what is
//! left: what a container runtime does with `drop: [ALL]` and `add: [...]`;
//! `--no-new-privs` is the DaemonSet's `allowPrivilegeEscalation: false`.

use std::ffi::OsString;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};

use super::{
    apply_service, datapath_counter, request, three_pods, wait_until_served, Bed, Skip, WEB,
};

/// A capability: its number (`linux/capability.h`) and name.
type Cap = (u32, &'static str);

const CAP_NET_ADMIN: Cap = (12, "CAP_NET_ADMIN");
const CAP_PERFMON: Cap = (38, "CAP_PERFMON");
const CAP_BPF: Cap = (39, "CAP_BPF");

/// What each datapath needs, measured: the same set as the DaemonSet's
/// `capabilities.add` (asserted by `tests/deploy_manifests.rs`).
fn needed(proxy_mode: &str) -> Option<&'static [Cap]> {
    match proxy_mode {
        "ebpf" => Some(&[CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON]),
        "nftables" => Some(&[CAP_NET_ADMIN]),
        _ => None,
    }
}

fn mask(caps: &[Cap]) -> u64 {
    caps.iter().fold(0, |m, (n, _)| m | 1 << n)
}

fn names(caps: &[Cap]) -> String {
    let v: Vec<&str> = caps.iter().map(|(_, name)| *name).collect();
    v.join(",")
}

/// The wrapper that starts the daemon with only `keep`: every other
/// capability the kernel knows is dropped from the bounding set, then
/// capsh's shell execs the daemon's command line (so the bed's child
/// process is the daemon itself).
fn capsh_keeping(keep: &[Cap]) -> Result<Vec<OsString>> {
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .context("reading /proc/sys/kernel/cap_last_cap")?
        .trim()
        .parse()
        .context("parsing /proc/sys/kernel/cap_last_cap")?;
    let drop: Vec<String> = (0..=last)
        .filter(|c| !keep.iter().any(|(k, _)| k == c))
        .map(|c| c.to_string())
        .collect();
    Ok(vec![
        "capsh".into(),
        "--no-new-privs".into(),
        format!("--drop={}", drop.join(",")).into(),
        "--".into(),
        "-c".into(),
        r#"exec "$0" "$@""#.into(),
    ])
}

/// A `/proc/PID/status` line's hex mask (`CapEff`, `CapBnd`, ...).
fn status_mask(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .with_context(|| format!("no {field} in /proc/{pid}/status"))?;
    Ok(u64::from_str_radix(hex.trim(), 16)?)
}

pub(super) fn daemon_runs_with_only_the_needed_capabilities(bed: &mut Bed) -> Result<()> {
    let Some(caps) = needed(&bed.proxy_mode) else {
        return Err(Skip("the capability sets are measured for ebpf and nftables").into());
    };
    // From nothing: whatever serves the ClusterIP below was programmed by
    // the daemon under capsh, not left by an earlier, fully privileged one.
    bed.stop_daemon()?;
    bed.cleanup_command()?;
    apply_service(bed, &WEB, false, &three_pods())?;
    let result = under_capsh(bed, caps);
    bed.daemon_wrapper.clear();
    // A daemon left running by a failed check had too few capabilities;
    // the next scenario starts its own.
    let stopped = bed.stop_daemon();
    result.and(stopped)
}

fn under_capsh(bed: &mut Bed, caps: &[Cap]) -> Result<()> {
    bed.daemon_wrapper = capsh_keeping(caps)?;
    // The second start finds the first one's pins: it reuses the maps and
    // replaces the links, as an upgrade does, with the same capabilities.
    for start in ["first start", "restart over its own state"] {
        bed.start_daemon()
            .with_context(|| format!("{start} with only {}", names(caps)))?;
        let pid = bed.daemon_pid().context("no daemon process")?;
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))?;
        ensure!(
            exe == bed.daemon_bin,
            "process {pid} is {}, not the daemon",
            exe.display()
        );
        ensure!(
            status_mask(pid, "NoNewPrivs")? == 1,
            "the daemon runs without no_new_privs"
        );
        let eff = status_mask(pid, "CapEff")?;
        ensure!(
            eff == mask(caps),
            "{start}: the daemon's CapEff is {eff:#018x}, expected exactly {} ({:#018x})",
            names(caps),
            mask(caps)
        );
        wait_until_served(bed, "tcp", "10.96.0.10:80", Duration::from_secs(5))
            .with_context(|| format!("{start}: the ClusterIP"))?;
        let before = datapath_counter(bed, "load_balanced")?;
        let r = request(bed, "tcp", "10.96.0.10:80", 30)?;
        ensure!(
            r.ok_count() == 30,
            "{start}: {} of 30 requests answered: {:?}",
            r.ok_count(),
            r.errors.first()
        );
        // On eBPF the programs' own counter, read from the pinned map by
        // the daemon, shows the connections went through the datapath.
        if let (Some(before), Some(after)) = (before, datapath_counter(bed, "load_balanced")?) {
            ensure!(
                after >= before + 30,
                "{start}: load_balanced went from {before} to {after} over 30 connections"
            );
        }
        println!(
            "    {start}: CapEff {eff:#x} = {}, 30/30 answered",
            names(caps)
        );
        bed.stop_daemon()?;
    }
    for missing in caps {
        let keep: Vec<Cap> = caps.iter().filter(|c| c != &missing).copied().collect();
        bed.daemon_wrapper = capsh_keeping(&keep)?;
        let Err(e) = bed.start_daemon() else {
            bail!("the daemon started and served without {}", missing.1);
        };
        let text = format!("{e:#}");
        let named = format!("missing capabilities {}", missing.1);
        ensure!(
            text.contains(&named),
            "without {}: the error does not say `{named}`:\n{text}",
            missing.1
        );
        println!("    without {}: refused, naming it", missing.1);
        bed.stop_daemon()?;
    }
    Ok(())
}
