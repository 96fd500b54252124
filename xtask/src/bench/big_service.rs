//! Issue 37's big-service cell: one Service with 100k endpoints (100
//! EndpointSlices of 1,000) beside the 1k/10k cluster, on the release
//! daemon's mini node with the file source (kubectl-style YAML, one file
//! per slice). Per datapath: `exec` → programmed and served, one endpoint
//! of the big service changed (a slice file rewritten) → programmed, the
//! big service removed and added again on the running daemon, and the
//! connect rate to a small service (`probe`, the bed's pods) with the big
//! one against without it, in alternating rounds of the same run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use super::daemon::{self, unix_now};
use super::manifests::{self, Scale};
use super::scale::{self, percentile, Changes};
use crate::e2e::bed::Bed;

/// Slices of the big service (of [`manifests::BIG_PER_SLICE`] each).
pub const SLICES: usize = 100;
/// Connects per connect-rate measurement.
const CONNECTS: usize = 3000;
/// Issue 37: connect rate to a small service at least this × without.
pub const RATE_GOAL: f64 = 0.98;

/// How much a run takes.
pub struct Settings {
    pub daemon_bin: PathBuf,
    /// One-endpoint changes of the big service.
    pub changes: usize,
    /// Rounds of (with, without) connect rates; each removes and adds the
    /// big service once.
    pub rounds: usize,
}

/// Each figure of one datapath, or why it is missing.
pub struct BigResult {
    pub datapath: &'static str,
    /// Spawn → the whole state (the big service included) programmed.
    pub start_s: Result<f64, String>,
    /// Spawn → the big service and the sampled small ones answering.
    pub served_s: Result<f64, String>,
    /// The big service's files renamed into place on the running daemon
    /// → programmed, each round.
    pub added_s: Result<Vec<f64>, String>,
    pub changes: Result<Changes, String>,
    /// VmHWM after the start and the changes.
    pub peak_rss_mib: Result<f64, String>,
    /// Connects per second to `probe` with the big service, without it
    /// (best of the rounds each).
    pub rate_with: Result<f64, String>,
    pub rate_without: Result<f64, String>,
}

fn err<T>(e: anyhow::Error) -> Result<T, String> {
    Err(format!("{e:#}"))
}

/// The small services beside the big one.
fn small() -> Scale {
    manifests::parse_scale("1k/10k").expect("a valid scale")
}

fn slice_file(k: usize) -> String {
    format!("big-{k:03}.yaml")
}

const SERVICE_FILE: &str = "big-service.yaml";

/// Runs the cell on `datapath`; a figure that cannot be measured is an
/// error in its place.
pub fn run(datapath: &'static str, settings: &Settings) -> BigResult {
    let mut r = BigResult {
        datapath,
        start_s: Err("not reached".into()),
        served_s: Err("not reached".into()),
        added_s: Err("not reached".into()),
        changes: Err("not reached".into()),
        peak_rss_mib: Err("not reached".into()),
        rate_with: Err("not reached".into()),
        rate_without: Err("not reached".into()),
    };
    let mut bed = match Bed::new(datapath, settings.daemon_bin.clone()) {
        Ok(b) => b,
        Err(e) => {
            r.start_s = err(e.context("building the bed"));
            return r;
        }
    };
    let pods: Vec<String> = bed.pods.iter().map(|p| p.ipv4.clone()).collect();
    let dir = bed.dir.join("manifests");
    let prepared = manifests::write_files(&dir, small(), &pods)
        .and_then(|()| write_big(&dir))
        .and_then(|()| scale::route_generated(&bed));
    if let Err(e) = prepared {
        r.start_s = err(e.context("preparing the cluster"));
        return r;
    }
    let total = small().total_services() as u64 + 1;
    let mut sampled = vec![manifests::BIG_IP.to_owned()];
    sampled.extend(scale::sampled_ips(small()));
    let timing = scale::start_settings(&settings.daemon_bin);
    match scale::full_sync(&mut bed, total, &sampled, &timing) {
        Ok((programmed, served)) => {
            r.start_s = Ok(programmed);
            r.served_s = served;
        }
        Err(e) => {
            r.start_s = err(e);
            return r;
        }
    }
    r.changes = changes(&mut bed, &dir, settings.changes).or_else(err);
    r.peak_rss_mib = daemon::peak_rss_mib(&bed).or_else(err);
    match rounds(&mut bed, &dir, settings.rounds) {
        Ok((with, without, added)) => {
            r.rate_with = Ok(with);
            r.rate_without = Ok(without);
            r.added_s = Ok(added);
        }
        Err(e) => r.rate_with = err(e),
    }
    drop(bed);
    r
}

/// The big service's slices, then its Service, into `dir`.
fn write_big(dir: &Path) -> Result<()> {
    for k in 0..SLICES {
        manifests::write_atomically(dir, &slice_file(k), &[manifests::big_slice(k, 0)])?;
    }
    manifests::write_atomically(dir, SERVICE_FILE, &[manifests::big_service()])
}

/// `n` one-endpoint changes, each to the next slice in turn: its file
/// rewritten with its first endpoint at a fresh address.
fn changes(bed: &mut Bed, dir: &Path, n: usize) -> Result<Changes> {
    let mut out = Changes::default();
    let first = unix_now();
    for generation in 1..=n {
        let k = generation % SLICES;
        let before = daemon::progress(bed)?;
        let written = unix_now();
        manifests::write_atomically(dir, &slice_file(k), &[manifests::big_slice(k, generation)])?;
        let p = daemon::wait_for(
            bed,
            Duration::from_secs(60),
            Duration::from_millis(2),
            &format!("change {generation} of the big service programmed"),
            |p| p.state_rev > before.state_rev && p.programmed_rev >= p.state_rev,
        )?;
        out.source_to_state.push(1e3 * (p.state_at - written));
        out.state_to_programmed
            .push(1e3 * (p.programmed_at - p.state_at));
        out.end_to_end.push(1e3 * (p.programmed_at - written));
        out.span_s = p.programmed_at - first;
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(out)
}

/// Alternating rounds: the connect rate with the big service, the big
/// service's files removed, the rate without it, the files renamed into
/// place again. The best rate of each kind and every add's seconds.
fn rounds(bed: &mut Bed, dir: &Path, rounds: usize) -> Result<(f64, f64, Vec<f64>)> {
    let whole = daemon::progress(bed)?;
    let big = (SLICES * manifests::BIG_PER_SLICE) as u64;
    let (mut with, mut without, mut added) = (0f64, 0f64, Vec::new());
    for round in 1..=rounds {
        with = with.max(rate(bed)?);
        for name in std::iter::once(SERVICE_FILE.to_owned()).chain((0..SLICES).map(slice_file)) {
            std::fs::remove_file(dir.join(&name)).with_context(|| format!("removing {name}"))?;
        }
        daemon::wait_for(
            bed,
            Duration::from_secs(120),
            Duration::from_millis(20),
            &format!("round {round}: the big service removed"),
            |p| {
                p.services + 1 == whole.services
                    && p.endpoints + big == whole.endpoints
                    && p.programmed_rev >= p.state_rev
            },
        )?;
        without = without.max(rate(bed)?);
        // Staged beside their final names, then renamed in one burst, the
        // Service last.
        let mut staged = Vec::new();
        for k in 0..SLICES {
            let tmp = dir.join(format!(".{}.staged", slice_file(k)));
            let text =
                manifests::documents_as(&[manifests::big_slice(k, 0)], manifests::Format::Yaml);
            std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
            staged.push((tmp, dir.join(slice_file(k))));
        }
        let tmp = dir.join(".big-service.staged");
        std::fs::write(
            &tmp,
            manifests::documents_as(&[manifests::big_service()], manifests::Format::Yaml),
        )?;
        staged.push((tmp, dir.join(SERVICE_FILE)));
        let renamed = unix_now();
        manifests::rename_all(&staged)?;
        let p = daemon::wait_for(
            bed,
            Duration::from_secs(120),
            Duration::from_millis(10),
            &format!("round {round}: the big service added again"),
            |p| {
                p.services == whole.services
                    && p.endpoints == whole.endpoints
                    && p.programmed_rev >= p.state_rev
            },
        )?;
        added.push(p.programmed_at - renamed);
    }
    Ok((with, without, added))
}

/// Connects per second from the node to `probe` (one request each).
fn rate(bed: &Bed) -> Result<f64> {
    let started = Instant::now();
    let target = format!("{}:80", manifests::PROBE_IP);
    let lines = bed.client(
        None,
        &[
            "--proto",
            "tcp",
            "--target",
            &target,
            "--count",
            &CONNECTS.to_string(),
        ],
    )?;
    let elapsed = started.elapsed().as_secs_f64();
    let ok = lines.iter().filter(|l| l.starts_with("ok ")).count();
    ensure!(
        ok == CONNECTS,
        "{target}: {ok} of {CONNECTS} requests answered"
    );
    Ok(CONNECTS as f64 / elapsed)
}

/// A goal: at most (`true`) or at least a figure.
#[derive(Clone, Copy)]
enum Goal {
    AtMost(f64),
    AtLeast(f64),
    None,
}

impl Goal {
    fn verdict(self, v: f64) -> Option<bool> {
        match self {
            Goal::AtMost(g) => Some(v <= g),
            Goal::AtLeast(g) => Some(v >= g),
            Goal::None => None,
        }
    }
}

/// One row: figure, unit, the goal per datapath, the value.
struct Row {
    figure: &'static str,
    unit: &'static str,
    goal: fn(&str) -> Goal,
    value: fn(&BigResult) -> Result<f64, String>,
}

fn by_datapath(d: &str, ebpf: f64, nftables: f64) -> Goal {
    match d {
        "ebpf" => Goal::AtMost(ebpf),
        "nftables" => Goal::AtMost(nftables),
        _ => Goal::None,
    }
}

fn of_changes(r: &BigResult, f: fn(&Changes) -> f64) -> Result<f64, String> {
    r.changes.as_ref().map(f).map_err(Clone::clone)
}

fn rows() -> Vec<Row> {
    vec![
        Row {
            figure: "exec → whole state programmed (the big service included)",
            unit: "s",
            goal: |d| by_datapath(d, 1.0, 3.0),
            value: |r| r.start_s.clone(),
        },
        Row {
            figure: "  … exec → served: the big service and 3 small ones answering",
            unit: "s",
            goal: |_| Goal::None,
            value: |r| r.served_s.clone(),
        },
        Row {
            figure:
                "the big service added to the running daemon → programmed, slowest of the rounds",
            unit: "s",
            goal: |d| by_datapath(d, 1.0, 3.0),
            value: |r| {
                r.added_s
                    .as_ref()
                    .map(|a| percentile(a, 100.0))
                    .map_err(Clone::clone)
            },
        },
        Row {
            figure: "one endpoint of it changed, end to end, p99",
            unit: "ms",
            goal: |d| by_datapath(d, 10.0, 100.0),
            value: |r| of_changes(r, |c| percentile(&c.end_to_end, 99.0)),
        },
        Row {
            figure: "  … state → programmed, p99",
            unit: "ms",
            goal: |_| Goal::None,
            value: |r| of_changes(r, |c| percentile(&c.state_to_programmed, 99.0)),
        },
        Row {
            figure: "daemon peak RSS (VmHWM) after the start and the changes",
            unit: "MiB",
            goal: |_| Goal::AtMost(200.0),
            value: |r| r.peak_rss_mib.clone(),
        },
        Row {
            figure: "connects/s to a small service with the big one",
            unit: "/s",
            goal: |_| Goal::None,
            value: |r| r.rate_with.clone(),
        },
        Row {
            figure: "  … without it (the same run, alternating rounds)",
            unit: "/s",
            goal: |_| Goal::None,
            value: |r| r.rate_without.clone(),
        },
        Row {
            figure: "  … with ÷ without",
            unit: "×",
            goal: |_| Goal::AtLeast(RATE_GOAL),
            value: |r| Ok(r.rate_with.clone()? / r.rate_without.clone()?),
        },
    ]
}

fn number(v: f64, unit: &str) -> String {
    match unit {
        "/s" => format!("{v:.0}/s"),
        "×" => format!("{v:.3}×"),
        "MiB" => format!("{v:.0} MiB"),
        _ if v >= 100.0 => format!("{v:.0} {unit}"),
        _ if v >= 10.0 => format!("{v:.1} {unit}"),
        _ => format!("{v:.2} {unit}"),
    }
}

fn goal_text(goal: Goal, unit: &str) -> String {
    match goal {
        Goal::AtMost(g) => format!("≤ {}", number(g, unit)),
        Goal::AtLeast(g) => format!("≥ {}", number(g, unit)),
        Goal::None => "—".to_owned(),
    }
}

/// The cell's table: one column per datapath run; the counts of figures
/// that met and missed their goal.
pub fn markdown(results: &[BigResult]) -> (String, usize, usize) {
    let (mut met, mut missed) = (0, 0);
    let mut out = format!(
        "| one Service of {}k endpoints ({SLICES} slices of {}) beside {} services |",
        SLICES * manifests::BIG_PER_SLICE / 1000,
        manifests::BIG_PER_SLICE,
        small().label()
    );
    for r in results {
        out.push_str(&format!(" {} |", r.datapath));
    }
    out.push_str(" goal |\n|---|");
    out.push_str(&"---|".repeat(results.len() + 1));
    out.push('\n');
    for row in rows() {
        out.push_str(&format!("| {} |", row.figure));
        let mut goals = Vec::new();
        for r in results {
            let goal = (row.goal)(r.datapath);
            goals.push(format!("{} {}", r.datapath, goal_text(goal, row.unit)));
            let text = match ((row.value)(r), goal) {
                (Ok(v), goal) => match goal.verdict(v) {
                    Some(true) => {
                        met += 1;
                        format!("{} met", number(v, row.unit))
                    }
                    Some(false) => {
                        missed += 1;
                        format!("**{} MISSED**", number(v, row.unit))
                    }
                    None => number(v, row.unit),
                },
                (Err(e), Goal::None) => format!("error: {}", first_line(&e)),
                (Err(e), _) => {
                    missed += 1;
                    format!("**MISSED: {}**", first_line(&e))
                }
            };
            out.push_str(&format!(" {text} |"));
        }
        goals.dedup_by(|a, b| a.split_once(' ').map(|x| x.1) == b.split_once(' ').map(|x| x.1));
        let goal = match goals.as_slice() {
            [one] => one.split_once(' ').map_or("—", |x| x.1).to_owned(),
            many => many.join("; "),
        };
        out.push_str(&format!(" {goal} |\n"));
    }
    (out, met, missed)
}

fn first_line(e: &str) -> String {
    e.lines().next().unwrap_or("").chars().take(70).collect()
}

pub fn to_json(r: &BigResult) -> serde_json::Value {
    let v = |x: &Result<f64, String>| match x {
        Ok(v) => serde_json::json!(v),
        Err(e) => serde_json::json!({ "error": e }),
    };
    serde_json::json!({
        "datapath": r.datapath,
        "start_s": v(&r.start_s),
        "exec_to_served_s": v(&r.served_s),
        "added_s": match &r.added_s {
            Ok(a) => serde_json::json!(a),
            Err(e) => serde_json::json!({ "error": e }),
        },
        "change_end_to_end_p99_ms": v(&of_changes(r, |c| percentile(&c.end_to_end, 99.0))),
        "change_state_to_programmed_p99_ms":
            v(&of_changes(r, |c| percentile(&c.state_to_programmed, 99.0))),
        "vmhwm_mib": v(&r.peak_rss_mib),
        "connects_per_s_with": v(&r.rate_with),
        "connects_per_s_without": v(&r.rate_without),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(datapath: &'static str) -> BigResult {
        BigResult {
            datapath,
            start_s: Ok(0.9),
            served_s: Ok(1.2),
            added_s: Ok(vec![0.5, 2.5]),
            changes: Err("not measured".into()),
            peak_rss_mib: Ok(150.0),
            rate_with: Ok(970.0),
            rate_without: Ok(1000.0),
        }
    }

    #[test]
    fn each_goal_per_datapath_and_the_rate_ratio_as_at_least() {
        let (md, met, missed) = markdown(&[result("ebpf"), result("nftables")]);
        assert!(md.contains("| exec → whole state programmed (the big service included) | 0.90 s met | 0.90 s met | ebpf ≤ 1.00 s; nftables ≤ 3.00 s |"), "{md}");
        // The slowest add counts: 2.5 s.
        assert!(md.contains("| **2.50 s MISSED** | 2.50 s met |"), "{md}");
        assert!(
            md.contains("| **0.970× MISSED** | **0.970× MISSED** | ≥ 0.980× |"),
            "{md}"
        );
        assert!(md.contains("| **MISSED: not measured** |"), "{md}");
        assert_eq!((met, missed), (5, 5));
    }
}
