//! `cleanup` as operators run it (SPEC §10.2): with the daemon's exact
//! argument list, as kube-proxy's `--cleanup` with that list, and with no
//! flags at all for a daemon on the default paths. Each must leave no pin,
//! link, nftables table or socket, on either datapath.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use super::*;

const DEFAULT_BPFFS_ROOT: &str = "/sys/fs/bpf/ebpf-kube-proxy";
const DEFAULT_SOCKETS: &str = "/run/ebpf-kube-proxy";

/// Programs a service, kills the daemon (SIGKILL: the datapath and the
/// socket files stay, as after a crash), runs `cleanup_args`, then checks
/// that nothing is left.
fn program_then_clean(bed: &mut Bed, cleanup_args: impl Fn(&Bed) -> Vec<OsString>) -> Result<()> {
    ensure_daemon(bed)?;
    apply_service(bed, &WEB, false, &three_pods())?;
    wait_until_served(bed, "tcp", "10.96.0.10:80", Duration::from_secs(5))?;
    bed.kill_daemon();
    let r = request(bed, "tcp", "10.96.0.10:80", 1)?;
    ensure!(r.ok_count() == 1, "the datapath must outlive the daemon");
    for socket in [&bed.localnet_socket, &bed.podinfo_socket] {
        ensure!(
            socket.exists(),
            "a killed daemon leaves {}",
            socket.display()
        );
    }
    let args = cleanup_args(bed);
    let report = bed.run_in_node(&args)?;
    println!(
        "    {args:?}:\n      {}",
        report.trim().replace('\n', "\n      ")
    );
    let pins: Vec<PathBuf> = match std::fs::read_dir(&bed.bpffs) {
        Ok(entries) => entries.flatten().map(|e| e.path()).collect(),
        Err(_) => Vec::new(),
    };
    ensure!(pins.is_empty(), "pins left behind: {pins:?}");
    let tables = bed
        .run_in_node(&[
            "dump".into(),
            "--bpffs-root".into(),
            bed.bpffs.clone().into(),
        ])
        .unwrap_or_default();
    ensure!(
        !tables.contains("table ip"),
        "an nftables table is left: {tables}"
    );
    for socket in [&bed.localnet_socket, &bed.podinfo_socket] {
        ensure!(!socket.exists(), "socket left behind: {}", socket.display());
    }
    // No hook and no rule any more: the service address goes nowhere.
    let r = request(bed, "tcp", "10.96.0.10:80", 1)?;
    ensure!(
        r.ok_count() == 0,
        "the service still answers after cleanup: programs or rules are left"
    );
    Ok(())
}

pub(super) fn with_the_daemons_arguments(bed: &mut Bed) -> Result<()> {
    program_then_clean(bed, |bed| {
        std::iter::once("cleanup".into())
            .chain(bed.last_args.iter().cloned())
            .collect()
    })
}

pub(super) fn kube_proxy_cleanup_flag(bed: &mut Bed) -> Result<()> {
    program_then_clean(bed, |bed| {
        std::iter::once("--cleanup".into())
            .chain(bed.last_args.iter().cloned())
            .collect()
    })
}

/// A daemon on the default bpffs root and socket paths, cleaned up by a
/// bare `cleanup`. The bed's own paths are restored afterwards, whatever
/// happened.
pub(super) fn with_no_flags(bed: &mut Bed) -> Result<()> {
    bed.stop_daemon()?;
    // The stopped daemon's programs stay attached to the bed's cgroup from
    // the bed's own bpffs root (a graceful stop keeps the datapath); left
    // there, they would go on serving what earlier scenarios programmed
    // after the default-path datapath is cleaned up.
    bed.cleanup_command()
        .context("cleaning up the bed's own datapath first")?;
    let saved = (
        std::mem::replace(&mut bed.bpffs, PathBuf::from(DEFAULT_BPFFS_ROOT)),
        std::mem::replace(
            &mut bed.localnet_socket,
            PathBuf::from(DEFAULT_SOCKETS).join("localnet.sock"),
        ),
        std::mem::replace(
            &mut bed.podinfo_socket,
            PathBuf::from(DEFAULT_SOCKETS).join("podinfo.sock"),
        ),
    );
    let result = program_then_clean(bed, |_| vec!["cleanup".into()]);
    // Whatever happened, nothing stays on the default paths.
    let _ = bed.stop_daemon();
    let _ = bed.cleanup_command();
    let _ = std::fs::remove_dir_all(&bed.bpffs);
    (bed.bpffs, bed.localnet_socket, bed.podinfo_socket) = saved;
    result.context("daemon on the default paths, bare `cleanup`")
}

/// `dump -o json` with the daemon's own arguments reads the programmed
/// service back from the kernel as JSON, on either datapath.
pub(super) fn dump_json_shows_the_programmed_service(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    apply_service(bed, &WEB, false, &three_pods())?;
    wait_until_served(bed, "tcp", "10.96.0.10:80", Duration::from_secs(5))?;
    let args: Vec<OsString> = ["dump".into(), "-o".into(), "json".into()]
        .into_iter()
        .chain(bed.last_args.iter().cloned())
        .collect();
    let out = bed.run_in_node(&args)?;
    let doc: serde_json::Value =
        serde_json::from_str(out.trim()).with_context(|| format!("dump -o json: {out}"))?;
    if bed.proxy_mode == "ebpf" {
        let vips: Vec<String> = doc["services"]
            .as_array()
            .context("no services array")?
            .iter()
            .map(|s| format!("{}:{}", s["address"].as_str().unwrap_or(""), s["port"]))
            .collect();
        ensure!(
            vips.contains(&"10.96.0.10:80".to_owned()),
            "10.96.0.10:80 not in {vips:?}"
        );
    } else {
        let tables = doc["nftables"].as_array().context("no nftables array")?;
        let v4 = tables
            .iter()
            .find(|t| t["family"] == "ip")
            .context("no ip table")?;
        let lines = v4["services"]["e2e/web"]
            .as_array()
            .with_context(|| format!("no e2e/web in {v4}"))?;
        ensure!(
            lines
                .iter()
                .any(|l| l.as_str().is_some_and(|l| l.contains("10.96.0.10"))),
            "e2e/web has no element for 10.96.0.10: {lines:?}"
        );
    }
    Ok(())
}
