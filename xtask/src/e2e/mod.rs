//! `cargo xtask e2e [--proxy-mode ebpf|nftables] [--filter NAME]`: the
//! real daemon, real kernel datapath and real traffic between network
//! namespaces (see `bed.rs` for the topology). Needs root.
//!
//! Prints one line per scenario and ends with `N passed, N failed`.

pub mod bed;
pub mod bench;
pub mod demo;
/// The fake API server of the integration tests, shared as one source file.
pub use test_support::{fake_apiserver, netexec};
mod scenarios;
pub mod soak;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

pub struct Options {
    pub proxy_mode: String,
    pub filter: Option<String>,
}

pub fn parse_args(args: &[String]) -> Result<Options> {
    let mut opts = Options {
        proxy_mode: "ebpf".to_owned(),
        filter: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--proxy-mode" => {
                opts.proxy_mode = it.next().context("--proxy-mode needs a value")?.clone()
            }
            "--filter" => opts.filter = Some(it.next().context("--filter needs a value")?.clone()),
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

/// How often a failing scenario runs before it counts as failed.
const RUNS_PER_SCENARIO: u32 = 2;

/// Runs the suite; returns (passed, failed, skipped).
pub fn run(root: &Path, opts: &Options) -> Result<(usize, usize, usize)> {
    preflight()?;
    let daemon_bin = crate::paths::daemon_bin(root);
    let mut bed = bed::Bed::new(&opts.proxy_mode, daemon_bin)?;
    println!(
        "e2e: proxy-mode {} ({})",
        opts.proxy_mode,
        bed::describe(&bed)
    );
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    let mut passed_on_retry = Vec::new();
    for s in scenarios::all() {
        if let Some(f) = &opts.filter {
            if !s.name.contains(f.as_str()) {
                continue;
            }
        }
        // A scenario that fails is run once more, and a pass on that retry
        // is reported as such, never silently: it is how the rare lost TCP
        // handshake across an nftables full sync (README, Deeper checks) shows
        // without failing CI, while a regression fails both runs.
        for attempt in 1..=RUNS_PER_SCENARIO {
            let started = Instant::now();
            let took = || started.elapsed().as_secs_f64();
            match (s.run)(&mut bed) {
                Ok(()) => {
                    passed += 1;
                    if attempt > 1 {
                        passed_on_retry.push(s.name);
                        println!(
                            "PASS {} [{}] ({:.1}s) on retry {attempt}",
                            s.name,
                            opts.proxy_mode,
                            took()
                        );
                    } else {
                        println!("PASS {} [{}] ({:.1}s)", s.name, opts.proxy_mode, took());
                    }
                    break;
                }
                Err(e) if e.downcast_ref::<scenarios::Skip>().is_some() => {
                    skipped += 1;
                    println!("SKIP {} [{}]: {e}", s.name, opts.proxy_mode);
                    break;
                }
                Err(e) => {
                    let last = attempt == RUNS_PER_SCENARIO;
                    println!(
                        "FAIL {} [{}] ({:.1}s){}: {e:#}",
                        s.name,
                        opts.proxy_mode,
                        took(),
                        if last { "" } else { ", running it again" }
                    );
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
                    if last {
                        failed += 1;
                    }
                }
            }
        }
    }
    if !passed_on_retry.is_empty() {
        println!(
            "{} scenario(s) passed only on retry: {}",
            passed_on_retry.len(),
            passed_on_retry.join(", ")
        );
    }
    drop(bed);
    Ok((passed, failed, skipped))
}
