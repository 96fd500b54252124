//! `cargo xtask soak --minutes N [--proxy-mode ebpf|nftables]
//! [--churn-per-second R] [--seed S]`: the daemon on the e2e bed (see
//! `bed.rs`), on the kube source against the fake API server, for N minutes
//! of:
//!
//! * client traffic (TCP and UDP, from the node and from pods) to a few
//!   stable services whose endpoints never change;
//! * a churn of other services and EndpointSlices (create, update, delete)
//!   at R writes per second through the fake API server;
//! * the API server flapping: 500s for a while, connections closed, 410
//!   (history compacted), watches dropped, a restart with a new history;
//! * the daemon SIGKILLed and restarted every 20–60 s, except in the last
//!   quarter of the run, so that one process lives long enough to show a
//!   leak of its own.
//!
//! It passes when no request to a stable service failed, the final churn
//! state is what localnet publishes and what the datapath serves (services
//! answer from exactly their final endpoints, deleted ones not at all), and
//! the daemon's RSS and open descriptors are flat after warm-up. Every
//! random choice comes from one seeded generator: `--seed` replays a run's
//! sequence of operations. The bed is removed on every exit, Ctrl-C too.

mod churn;
mod memory;
mod verify;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;

use super::bed::Bed;
use super::fake_apiserver::FakeApiServer;
use churn::{Churn, Rng};
use memory::{read_proc, Flatness, Sample};

pub struct Options {
    pub minutes: f64,
    pub proxy_mode: String,
    pub churn_per_second: f64,
    pub seed: Option<u64>,
}

pub fn parse_args(args: &[String]) -> Result<Options> {
    let mut opts = Options {
        minutes: 0.0,
        proxy_mode: "ebpf".to_owned(),
        churn_per_second: 2.0,
        seed: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--minutes" => opts.minutes = value()?.parse().context("--minutes")?,
            "--proxy-mode" => opts.proxy_mode = value()?.clone(),
            "--churn-per-second" => {
                opts.churn_per_second = value()?.parse().context("--churn-per-second")?
            }
            "--seed" => opts.seed = Some(value()?.parse().context("--seed")?),
            other => bail!("soak: unknown argument {other}"),
        }
    }
    if !(opts.minutes > 0.0 && opts.minutes <= 24.0 * 60.0) {
        bail!("soak: --minutes N is required (0 < N <= 1440)");
    }
    if !(0.0..=50.0).contains(&opts.churn_per_second) {
        bail!("soak: --churn-per-second must be within 0..=50");
    }
    if !matches!(opts.proxy_mode.as_str(), "ebpf" | "nftables") {
        bail!("soak: --proxy-mode must be ebpf or nftables");
    }
    Ok(opts)
}

/// Namespace of every object the soak writes.
const NS: &str = "soak";
/// Daemon kills: one every 20–60 s, none in the kill-free tail.
const KILL_EVERY_S: (u64, u64) = (20, 60);
const KILL_FREE_TAIL_MIN: Duration = Duration::from_secs(45);
/// Each stable client: one request every 50 ms, each given 2 s.
const CLIENT_INTERVAL_MS: u64 = 50;
const CLIENT_TIMEOUT_MS: u64 = 2000;

/// A stable service: (port name, protocol, port, slice port), its pods.
struct Stable {
    name: &'static str,
    ip: &'static str,
    ports: &'static [(&'static str, &'static str, u16, u16)],
    pods: &'static [usize],
}

const STABLE: &[Stable] = &[
    Stable {
        name: "stable-web",
        ip: "10.96.1.10",
        ports: &[("http", "TCP", 80, 8080)],
        pods: &[0, 1, 2],
    },
    Stable {
        name: "stable-dns",
        ip: "10.96.1.11",
        ports: &[("dns", "UDP", 53, 5353)],
        pods: &[0, 1, 2],
    },
    Stable {
        name: "stable-mixed",
        ip: "10.96.1.12",
        ports: &[("tcp", "TCP", 80, 8081), ("udp", "UDP", 80, 8080)],
        pods: &[0, 1],
    },
];

/// Traffic: (stable service, its port, client in pod N's netns or the node's).
const CLIENTS: &[(usize, usize, Option<usize>)] = &[
    (0, 0, None),
    (0, 0, Some(0)),
    (1, 0, None),
    (1, 0, Some(1)),
    (2, 0, None),
    (2, 1, Some(2)),
];

/// What happened when, seconds since the start: printed around failures.
struct Timeline {
    start: Instant,
    events: Mutex<Vec<(f64, String)>>,
}

impl Timeline {
    fn note(&self, what: String) {
        let t = self.start.elapsed().as_secs_f64();
        if let Ok(mut e) = self.events.lock() {
            e.push((t, what));
        }
    }

    fn around(&self, t: f64, span: f64) -> Vec<(f64, String)> {
        self.events
            .lock()
            .map(|e| {
                e.iter()
                    .filter(|(at, _)| (at - t).abs() <= span)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}

pub fn run(root: &Path, opts: &Options) -> Result<()> {
    super::preflight()?;
    let seed = opts.seed.unwrap_or_else(fresh_seed);
    println!(
        "soak: seed {seed} (replay with --seed {seed}); {} min on {}, churn {}/s",
        opts.minutes, opts.proxy_mode, opts.churn_per_second
    );
    let stop = Arc::new(AtomicBool::new(false));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.spawn(stop_on_signal(stop.clone()));
    let mut bed = Bed::new(&opts.proxy_mode, crate::paths::daemon_bin(root))?;
    println!("soak: {}", super::bed::describe(&bed));
    // The daemon runs in the node namespace: the API server listens there.
    let api = Arc::new(bed.in_node_netns(|| rt.block_on(FakeApiServer::start()))?);
    let result = soak(&mut bed, &api, opts, seed, &stop);
    if let Err(e) = &result {
        keep_logs(&bed, seed);
        println!("soak FAILED (seed {seed}): {e:#}");
    }
    drop(bed);
    drop(api);
    rt.shutdown_timeout(Duration::from_secs(2));
    result
}

async fn stop_on_signal(stop: Arc<AtomicBool>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    eprintln!("soak: interrupted; cleaning up the bed");
    stop.store(true, Ordering::SeqCst);
}

fn fresh_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}

/// The bed's directory goes with it: copy the daemon logs somewhere that
/// stays, for the report.
fn keep_logs(bed: &Bed, seed: u64) {
    let keep = std::env::temp_dir().join(format!("ebpf-kube-proxy-soak-{seed}"));
    if std::fs::create_dir_all(&keep).is_err() {
        return;
    }
    if let Ok(entries) = std::fs::read_dir(&bed.dir) {
        for e in entries.flatten() {
            let name = e.file_name();
            if name.to_string_lossy().starts_with("daemon-") {
                let _ = std::fs::copy(e.path(), keep.join(&name));
            }
        }
    }
    println!("soak: daemon logs kept in {}", keep.display());
}

fn soak(
    bed: &mut Bed,
    api: &Arc<FakeApiServer>,
    opts: &Options,
    seed: u64,
    stop: &Arc<AtomicBool>,
) -> Result<()> {
    let duration = Duration::from_secs_f64(opts.minutes * 60.0);
    let kubeconfig = bed.dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    api.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}}));
    let pods = churn::pod_endpoints(bed);
    for s in STABLE {
        let svc_ports: Vec<(&str, &str, u16, u16)> = s
            .ports
            .iter()
            .map(|&(n, p, port, t)| (n, p, port, t))
            .collect();
        let slice_ports: Vec<(&str, &str, u16)> =
            s.ports.iter().map(|&(n, p, _, t)| (n, p, t)).collect();
        let members: Vec<(String, String)> = s.pods.iter().map(|&i| pods[i].clone()).collect();
        api.apply(churn::service_object(s.name, s.ip, &svc_ports));
        api.apply(churn::slice_object(s.name, &slice_ports, &members));
    }
    bed.kubeconfig = Some(kubeconfig);
    bed.start_daemon().context("the first start")?;
    for s in STABLE {
        for &(_, proto, port, _) in s.ports {
            verify::wait_until_answered(bed, proto, &format!("{}:{port}", s.ip))?;
        }
    }

    let start = Instant::now();
    let timeline = Arc::new(Timeline {
        start,
        events: Mutex::new(Vec::new()),
    });
    let deadline = start + duration;
    let mut traffic = Traffic::start(bed, duration, &timeline)?;

    let mut rng = Rng::new(seed);
    let chaos_rng = rng.fork();
    let chaos = {
        let (api, stop, timeline) = (api.clone(), stop.clone(), timeline.clone());
        let rate = opts.churn_per_second;
        std::thread::spawn(move || {
            let mut churn = Churn::new(pods, chaos_rng);
            churn.run(&api, rate, deadline, &stop, &timeline);
            churn
        })
    };

    let lives = drive_daemon(bed, &mut rng, start, deadline, stop, &timeline);
    let churn = chaos
        .join()
        .map_err(|_| anyhow::anyhow!("the churn thread panicked"))?;
    let traffic_report = traffic.finish(deadline + Duration::from_secs(10));
    if stop.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    let lives = lives?;

    println!("soak: churn and chaos stopped; checking the final state");
    let verified = verify::final_state(bed, api);
    let memory = Flatness::of(&lives.samples);

    println!("soak: --- figures (seed {seed}, {}) ---", opts.proxy_mode);
    println!("  duration            {:.0} s", duration.as_secs_f64());
    traffic_report.print();
    churn.print(api.resource_version());
    println!(
        "  daemon              {} SIGKILLs and restarts, {} slow starts (no state within 20 s)",
        lives.restarts, lives.slow_starts
    );
    memory.print();
    if let Ok(v) = &verified {
        v.print();
    }

    let mut failed = Vec::new();
    if traffic_report.failures > 0 || traffic_report.attempts == 0 {
        failed.push(format!(
            "{} of {} requests to stable services failed",
            traffic_report.failures, traffic_report.attempts
        ));
        for (t, line) in traffic_report.first_errors.iter().take(5) {
            println!("  failure at {t:.1}s: {line}");
        }
        if let Some((t, _)) = traffic_report.first_errors.first() {
            println!("  what happened around the first failure:");
            for (at, what) in timeline.around(*t, 10.0) {
                println!("      {at:7.1}s {what}");
            }
        }
    }
    match verified {
        Ok(v) => failed.extend(v.problems()),
        Err(e) => failed.push(format!("final state: {e:#}")),
    }
    failed.extend(memory.problems());
    let logs = LogScan::of(bed);
    logs.print();
    failed.extend(logs.problems());
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    println!("soak PASSED ({} min, {})", opts.minutes, opts.proxy_mode);
    Ok(())
}

/// What the daemon's logs (one per start) say: a panic in a task that
/// does not take the process down is a failure nothing else would see.
struct LogScan {
    starts: usize,
    errors: usize,
    warnings: usize,
    panics: Vec<String>,
}

impl LogScan {
    fn of(bed: &Bed) -> LogScan {
        let mut scan = LogScan {
            starts: 0,
            errors: 0,
            warnings: 0,
            panics: Vec::new(),
        };
        let entries = std::fs::read_dir(&bed.dir).into_iter().flatten().flatten();
        for e in entries.filter(|e| e.file_name().to_string_lossy().starts_with("daemon-")) {
            scan.starts += 1;
            let log = std::fs::read_to_string(e.path()).unwrap_or_default();
            for l in log.lines() {
                if l.contains("panicked") {
                    scan.panics.push(l.to_owned());
                } else if l.contains(" ERROR ") {
                    scan.errors += 1;
                } else if l.contains(" WARN ") {
                    scan.warnings += 1;
                }
            }
        }
        scan
    }

    fn print(&self) {
        println!(
            "  daemon logs         {} starts: {} ERROR and {} WARN lines, {} panics",
            self.starts,
            self.errors,
            self.warnings,
            self.panics.len()
        );
    }

    fn problems(&self) -> Vec<String> {
        self.panics
            .first()
            .map(|p| {
                format!(
                    "the daemon panicked {} time(s), e.g. {p}",
                    self.panics.len()
                )
            })
            .into_iter()
            .collect()
    }
}

struct Lives {
    samples: Vec<Sample>,
    restarts: u32,
    slow_starts: u32,
}

/// Samples the daemon once a second and SIGKILLs and restarts it at
/// random; fails when the daemon dies by itself.
fn drive_daemon(
    bed: &mut Bed,
    rng: &mut Rng,
    start: Instant,
    deadline: Instant,
    stop: &AtomicBool,
    timeline: &Timeline,
) -> Result<Lives> {
    let duration = deadline - start;
    let tail = KILL_FREE_TAIL_MIN.max(duration / 4);
    let kills_until = start + duration.saturating_sub(tail);
    let next_kill = |rng: &mut Rng| {
        Instant::now() + Duration::from_secs(rng.range(KILL_EVERY_S.0, KILL_EVERY_S.1))
    };
    let mut kill_at = next_kill(rng);
    let mut born = Instant::now();
    let mut lives = Lives {
        samples: Vec::new(),
        restarts: 0,
        slow_starts: 0,
    };
    timeline.note(format!("daemon: running, pid {:?}", bed.daemon_pid()));
    while Instant::now() < deadline && !stop.load(Ordering::SeqCst) {
        let pid = bed.daemon_pid().context("no daemon")?;
        match read_proc(pid) {
            Some((rss_kib, fds)) => lives.samples.push(Sample {
                at: start.elapsed(),
                age: born.elapsed(),
                pid,
                rss_kib,
                fds,
            }),
            None => bail!(
                "the daemon (pid {pid}) exited by itself at {:.1}s; log tail:\n{}",
                start.elapsed().as_secs_f64(),
                tail_of(&bed.daemon_log(), 30)
            ),
        }
        let now = Instant::now();
        if now >= kill_at && now < kills_until {
            timeline.note(format!("daemon: SIGKILL pid {pid}"));
            bed.kill_daemon();
            std::thread::sleep(Duration::from_millis(rng.range(0, 1500)));
            lives.restarts += 1;
            born = Instant::now();
            if let Err(e) = bed.start_daemon() {
                // Still running but not synced (the API server may be
                // failing, the watches backing off): the final check says
                // whether it caught up. A daemon that exited is a failure.
                if !bed.daemon_running() {
                    return Err(e.context("restarting the daemon"));
                }
                lives.slow_starts += 1;
                timeline.note("daemon: no state within 20 s of the restart".to_owned());
            }
            timeline.note(format!("daemon: started, pid {:?}", bed.daemon_pid()));
            kill_at = next_kill(rng);
            continue;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    Ok(lives)
}

fn tail_of(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The stable clients: one long-running netexec client each, its output
/// counted line by line as it comes.
struct Traffic {
    start: Instant,
    clients: Vec<crate::KillOnDrop>,
    readers: Vec<std::thread::JoinHandle<ClientCount>>,
    labels: Vec<String>,
}

#[derive(Default)]
struct ClientCount {
    attempts: u64,
    failures: u64,
    max_ok_ms: u64,
    /// (seconds since the start, line), the first few.
    first_errors: Vec<(f64, String)>,
}

#[derive(Default)]
struct TrafficReport {
    attempts: u64,
    failures: u64,
    first_errors: Vec<(f64, String)>,
    lines: Vec<String>,
}

impl TrafficReport {
    fn print(&self) {
        println!(
            "  stable traffic      {} requests, {} failed",
            self.attempts, self.failures
        );
        for l in &self.lines {
            println!("      {l}");
        }
    }
}

impl Traffic {
    fn start(bed: &Bed, duration: Duration, timeline: &Arc<Timeline>) -> Result<Traffic> {
        let mut t = Traffic {
            start: timeline.start,
            clients: Vec::new(),
            readers: Vec::new(),
            labels: Vec::new(),
        };
        for &(svc, port, from) in CLIENTS {
            let s = &STABLE[svc];
            let (_, proto, number, _) = s.ports[port];
            let target = format!("{}:{number}", s.ip);
            let netns = from.map(|i| bed.pods[i].netns.clone());
            let proto = proto.to_lowercase();
            let mut child = bed.spawn_client(
                netns.as_deref(),
                &[
                    "--proto",
                    &proto,
                    "--target",
                    &target,
                    "--duration-ms",
                    &duration.as_millis().to_string(),
                    "--interval-ms",
                    &CLIENT_INTERVAL_MS.to_string(),
                    "--timeout-ms",
                    &CLIENT_TIMEOUT_MS.to_string(),
                ],
            )?;
            let stdout = child.stdout.take().context("client stdout")?;
            t.labels.push(format!(
                "{} {target}/{proto} from {}",
                s.name,
                from.map_or("the node".to_owned(), |i| bed.pods[i].name.clone())
            ));
            t.clients.push(crate::KillOnDrop(child));
            let timeline = timeline.clone();
            t.readers.push(std::thread::spawn(move || {
                use std::io::BufRead;
                let mut c = ClientCount::default();
                for line in std::io::BufReader::new(stdout)
                    .lines()
                    .map_while(Result::ok)
                {
                    c.attempts += 1;
                    let ms = line
                        .rsplit_once("ms=")
                        .and_then(|(_, v)| v.parse().ok())
                        .unwrap_or(0);
                    if line.starts_with("ok ") {
                        c.max_ok_ms = c.max_ok_ms.max(ms);
                    } else {
                        c.failures += 1;
                        if c.first_errors.len() < 5 {
                            let at = timeline.start.elapsed().as_secs_f64();
                            c.first_errors.push((at, line));
                        }
                    }
                }
                c
            }));
        }
        Ok(t)
    }

    /// Waits for the clients (they stop on their own at the end of the
    /// run; killed at `by`), then sums their counts.
    fn finish(&mut self, by: Instant) -> TrafficReport {
        let mut report = TrafficReport::default();
        for (i, client) in self.clients.iter_mut().enumerate() {
            let mut exited = None;
            while Instant::now() < by {
                if let Ok(Some(st)) = client.0.try_wait() {
                    exited = Some(st);
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if exited.is_none_or(|st| !st.success()) {
                report.failures += 1;
                report.first_errors.push((
                    self.start.elapsed().as_secs_f64(),
                    format!("client {} ended badly: {exited:?}", self.labels[i]),
                ));
            }
        }
        self.clients.clear();
        for (label, reader) in self.labels.iter().zip(self.readers.drain(..)) {
            let c = reader.join().unwrap_or_default();
            report.attempts += c.attempts;
            report.failures += c.failures;
            report.first_errors.extend(c.first_errors);
            report.lines.push(format!(
                "{label}: {} requests, {} failed, slowest answer {} ms",
                c.attempts, c.failures, c.max_ok_ms
            ));
        }
        report
            .first_errors
            .sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
        report
    }
}
