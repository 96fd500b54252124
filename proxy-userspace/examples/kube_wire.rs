//! Reads list answers of the API server (files holding the body of a GET
//! of a collection, protobuf or JSON) as the kube source reads them and
//! prints one JSON line: the objects accepted and refused, and the CPU
//! seconds (user + system, every thread) and wall seconds of the fastest
//! of `RUNS` reads.
//!
//! ```text
//! kube_wire RUNS RESOURCE=FILE [RESOURCE=FILE ...]
//! ```
//!
//! `cargo xtask bench --only kube-wire` runs it on the fake API server's
//! answers for the bench cluster in each encoding.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use ebpf_kube_proxy::sources::kube::read_list;

/// CPU seconds this process has used, every thread.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: kube_wire RUNS RESOURCE=FILE [RESOURCE=FILE ...]";
    let runs: usize = args.next().context(usage)?.parse().context(usage)?;
    let mut lists = Vec::new();
    for arg in args {
        let (resource, file) = arg.split_once('=').context(usage)?;
        let body = std::fs::read(file).with_context(|| format!("reading {file}"))?;
        lists.push((resource.to_owned(), bytes::Bytes::from(body)));
    }
    if lists.is_empty() || runs == 0 {
        bail!(usage);
    }
    let mut best: Option<(f64, f64, usize, usize)> = None;
    for _ in 0..runs {
        let (cpu, wall) = (cpu_seconds(), Instant::now());
        let (mut accepted, mut refused) = (0, 0);
        for (resource, body) in &lists {
            let read = read_list(resource, body.clone())
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("reading the {resource} list"))?;
            accepted += read.accepted;
            refused += read.refused;
        }
        let run = (
            cpu_seconds() - cpu,
            wall.elapsed().as_secs_f64(),
            accepted,
            refused,
        );
        if best.is_none_or(|b| run.0 < b.0) {
            best = Some(run);
        }
    }
    let (cpu, wall, accepted, refused) = best.context("no run")?;
    println!(
        "{}",
        serde_json::json!({"accepted": accepted, "refused": refused, "cpu_seconds": cpu, "wall_seconds": wall})
    );
    Ok(())
}
