//! One cell of the scale table: the release daemon on a fresh mini node
//! (network namespaces, a cgroup and a bpffs directory of its own, all
//! removed when the cell ends, also on failure) with one datapath and one
//! source, driven through the measurements of issue 17.

use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::daemon::{self, unix_now, Progress};
use super::fanout_floor::{self, Transport};
use super::manifests::{self, Scale};
use crate::e2e::bed::Bed;
use crate::e2e::fake_apiserver::FakeApiServer;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    File,
    Kube,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::File => "file",
            Source::Kube => "kube",
        }
    }
}

/// How much of each measurement a run takes.
#[derive(Clone, Debug)]
pub struct Settings {
    pub change_samples: usize,
    pub idle: Duration,
    pub watchers: usize,
    pub sync_timeout: Duration,
    pub daemon_bin: PathBuf,
    pub fanout_bin: PathBuf,
}

/// Milliseconds of each one-endpoint change, in the order made.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    pub source_to_state: Vec<f64>,
    pub state_to_programmed: Vec<f64>,
    pub end_to_end: Vec<f64>,
}

#[derive(Clone, Debug)]
pub struct Restart {
    pub requests: usize,
    pub failed: usize,
    pub reconcile_s: f64,
}

/// A one-off event the daemon goes through: an API server restart that
/// changed nothing (every watch gets 410 Gone and relists, kube source),
/// or every pod rotated at once (every manifest rewritten beside the old
/// one, then all renamed into place in one burst, file source).
#[derive(Clone, Debug)]
pub struct Episode {
    /// From the event until the daemon took it in (every resource
    /// relisted; the rotation programmed).
    pub seconds: f64,
    /// VmHWM once it had: the daemon's peak so far, the event included
    /// (for a rotation, the daemon restarted under load: its start, then
    /// the rotation).
    pub peak_rss_mib: f64,
}

impl Episode {
    fn to_json(&self) -> Value {
        json!({"seconds": self.seconds, "vmhwm_mib": self.peak_rss_mib})
    }
}

/// One full-frame fan-out: how long, how large a frame, whose CPU.
#[derive(Clone, Debug)]
pub struct FanOut {
    pub ms: f64,
    pub frame_bytes: usize,
    pub cpu: FanoutCpu,
}

/// CPU seconds spent from the change to the last watcher holding it.
#[derive(Clone, Copy, Debug)]
pub struct FanoutCpu {
    pub daemon_s: f64,
    pub watchers_s: f64,
}

/// Each figure, or why it is missing (`Err`).
#[derive(Debug)]
pub struct CellResult {
    pub scale: Scale,
    pub datapath: &'static str,
    pub source: Source,
    pub full_sync_s: Result<f64, String>,
    /// Seconds from spawning the daemon to the last of the sampled
    /// services ([`sampled_ips`]) answering a TCP exchange through the
    /// datapath: the start a user sees.
    pub served_s: Result<f64, String>,
    pub changes: Result<Changes, String>,
    pub idle_cpu_pct: Result<f64, String>,
    pub peak_rss_mib: Result<f64, String>,
    pub fanout_ms: Result<f64, String>,
    /// The kernel's share of that: the bytes of one full frame copied to
    /// each watcher over unix sockets, no gRPC, no decoding.
    pub fanout_floor_ms: Result<f64, String>,
    /// CPU seconds the daemon and the watchers spent on that revision.
    pub fanout_cpu: Result<FanoutCpu, String>,
    /// The same with watchers that ask for delta frames.
    pub fanout_delta_ms: Result<f64, String>,
    /// The kube source only.
    pub relist: Result<Episode, String>,
    /// The file source only.
    pub rotation: Result<Episode, String>,
    pub restart: Result<Restart, String>,
}

fn skipped<T>(why: &str) -> Result<T, String> {
    Err(why.to_owned())
}

/// Where the one-endpoint changes are made.
enum Driver {
    File(PathBuf),
    Kube {
        api: FakeApiServer,
        rt: Option<tokio::runtime::Runtime>,
    },
}

impl Driver {
    fn change(&self, pods: &[String], generation: usize) -> Result<()> {
        match self {
            Driver::File(dir) => manifests::write_driven(dir, pods, generation),
            Driver::Kube { api, .. } => {
                // [probe svc, probe slice, churn svc, churn slice]
                let churn_slice = manifests::driven(pods, generation).swap_remove(3);
                api.apply(churn_slice);
                Ok(())
            }
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Driver::Kube { rt, .. } = self {
            // Stopping the runtime ends the server's tasks.
            if let Some(rt) = rt.take() {
                rt.shutdown_timeout(Duration::from_secs(2));
            }
        }
    }
}

fn prepare(bed: &mut Bed, scale: Scale, source: Source, pods: &[String]) -> Result<Driver> {
    match source {
        Source::File => {
            let dir = bed.dir.join("manifests");
            manifests::write_files(&dir, scale, pods)?;
            Ok(Driver::File(dir))
        }
        Source::Kube => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()?;
            // The daemon runs in the node namespace: the server listens there.
            let api = bed.in_node_netns(|| rt.block_on(FakeApiServer::start()))?;
            for o in manifests::objects(scale, pods) {
                api.apply(o);
            }
            let kubeconfig = bed.dir.join("kubeconfig");
            api.write_kubeconfig(&kubeconfig);
            bed.kubeconfig = Some(kubeconfig);
            Ok(Driver::Kube { api, rt: Some(rt) })
        }
    }
}

/// Runs one cell; a figure that cannot be measured is reported as an
/// error in its place, and the cell goes on with the next where it can.
pub fn run_cell(
    scale: Scale,
    datapath: &'static str,
    source: Source,
    settings: &Settings,
) -> CellResult {
    let mut result = CellResult {
        scale,
        datapath,
        source,
        full_sync_s: skipped("not reached"),
        served_s: skipped("not reached"),
        changes: skipped("not reached"),
        idle_cpu_pct: skipped("not reached"),
        peak_rss_mib: skipped("not reached"),
        fanout_ms: skipped("not reached"),
        fanout_floor_ms: skipped("not reached"),
        fanout_cpu: skipped("not reached"),
        fanout_delta_ms: skipped("not reached"),
        relist: skipped("not reached"),
        rotation: skipped("not reached"),
        restart: skipped("not reached"),
    };
    let mut bed = match Bed::new(datapath, settings.daemon_bin.clone()) {
        Ok(b) => b,
        Err(e) => {
            result.full_sync_s = Err(format!("building the bed: {e:#}"));
            return result;
        }
    };
    let pods: Vec<String> = bed.pods.iter().map(|p| p.ipv4.clone()).collect();
    let driver = match prepare(&mut bed, scale, source, &pods) {
        Ok(d) => d,
        Err(e) => {
            result.full_sync_s = Err(format!("preparing the cluster: {e:#}"));
            return result;
        }
    };
    let total = scale.total_services() as u64;
    if datapath != "none" {
        if let Err(e) = route_generated(&bed) {
            result.full_sync_s = Err(format!("routing the generated endpoints: {e:#}"));
            return result;
        }
    }
    let sampled = match datapath {
        "none" => Vec::new(),
        _ => sampled_ips(scale),
    };
    match full_sync(&mut bed, total, &sampled, settings) {
        Ok((programmed, served)) => {
            result.full_sync_s = Ok(programmed);
            result.served_s = served;
        }
        Err(e) => {
            result.full_sync_s = Err(format!("{e:#}"));
            return result;
        }
    }
    if datapath == "none" {
        result.served_s = skipped("no datapath");
    }
    progress_line("exec -> served (s)", &result.served_s);
    progress_line("exec -> programmed (s)", &result.full_sync_s);
    result.changes = changes(&mut bed, &driver, &pods, settings).map_err(|e| format!("{e:#}"));
    if let Ok(c) = &result.changes {
        println!(
            "      {} changes: end to end p50 {:.1} ms, p99 {:.1} ms",
            c.end_to_end.len(),
            percentile(&c.end_to_end, 50.0),
            percentile(&c.end_to_end, 99.0)
        );
    }
    std::thread::sleep(Duration::from_secs(1));
    result.idle_cpu_pct = daemon::idle_cpu(&bed, settings.idle).map_err(|e| format!("{e:#}"));
    result.peak_rss_mib = daemon::peak_rss_mib(&bed).map_err(|e| format!("{e:#}"));
    result.relist = match &driver {
        Driver::Kube { api, .. } => relist(&mut bed, api).map_err(|e| format!("{e:#}")),
        Driver::File(_) => skipped("the file source does not list"),
    };
    if let Ok(r) = &result.relist {
        println!(
            "      relist after an API server restart: {:.2} s, VmHWM {:.0} MiB",
            r.seconds, r.peak_rss_mib
        );
    }
    let next_generation = settings.change_samples + 1;
    let mut fan = |generation, deltas| {
        if settings.watchers == 0 {
            skipped("skipped")
        } else {
            fanout(&mut bed, &driver, &pods, generation, deltas, settings)
                .map_err(|e| format!("{e:#}"))
        }
    };
    let full = fan(next_generation, false);
    result.fanout_ms = full.as_ref().map(|f| f.ms).map_err(Clone::clone);
    progress_line("fan-out (ms)", &result.fanout_ms);
    result.fanout_cpu = full.as_ref().map(|f| f.cpu).map_err(Clone::clone);
    if let Ok(c) = &result.fanout_cpu {
        println!(
            "      fan-out CPU: daemon {:.2} s, watchers {:.2} s",
            c.daemon_s, c.watchers_s
        );
    }
    result.fanout_floor_ms = full.and_then(|f| {
        fanout_floor::floor_ms(f.frame_bytes, settings.watchers, Transport::Unix, 3)
            .map_err(|e| format!("{e:#}"))
    });
    progress_line(
        "fan-out floor, unix sockets only (ms)",
        &result.fanout_floor_ms,
    );
    progress_line("fan-out / floor", &result.fanout_ratio());
    result.fanout_delta_ms = fan(next_generation + 1, true).map(|f| f.ms);
    progress_line("fan-out, delta Watch (ms)", &result.fanout_delta_ms);
    result.restart = if datapath == "none" {
        skipped("no datapath")
    } else {
        restart_under_load(&mut bed, total, settings).map_err(|e| format!("{e:#}"))
    };
    result.rotation = match &driver {
        Driver::File(dir) => rotation(&mut bed, dir, scale).map_err(|e| format!("{e:#}")),
        Driver::Kube { .. } => skipped("measured for the file source"),
    };
    if let Ok(r) = &result.rotation {
        println!(
            "      every pod rotated in one burst: {:.2} s, VmHWM {:.0} MiB",
            r.seconds, r.peak_rss_mib
        );
    }
    drop(bed);
    drop(driver);
    result
}

fn progress_line(what: &str, r: &Result<f64, String>) {
    match r {
        Ok(v) => println!("      {what}: {v:.3}"),
        Err(e) => println!("      {what}: ERROR {}", e.lines().next().unwrap_or("")),
    }
}

/// The first generated service's ClusterIP: the `i`th is this plus `i`.
const FIRST_GENERATED_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 1, 0);
/// Where the generated endpoints live (10.128.0.0/16 on, rotated ones
/// from 10.160.0.0): routed to the first pod, which takes them as its own.
const GENERATED_ENDPOINTS: &str = "10.128.0.0/10";

/// The ClusterIPs whose answer makes a cell served: the first, the
/// middle and the last generated service.
pub fn sampled_ips(scale: Scale) -> Vec<String> {
    let last = scale.services.saturating_sub(1);
    let mut idx = vec![0, last / 2, last];
    idx.dedup();
    idx.into_iter()
        .map(|i| {
            let ip = u32::from(FIRST_GENERATED_IP).wrapping_add(i as u32);
            Ipv4Addr::from(ip).to_string()
        })
        .collect()
}

/// Makes every generated endpoint answer: the node routes
/// [`GENERATED_ENDPOINTS`] to the first pod, whose namespace holds them
/// all as local addresses (its netexec listens on every address), so a
/// connection to a generated service is answered once the datapath
/// translates it, and not before.
fn route_generated(bed: &Bed) -> Result<()> {
    let pod = bed.pods.first().context("the bed has no pod")?;
    // The first pod's veth on the node (see the bed's add_pod).
    let veth = format!("{}v1", bed.prefix);
    for args in [
        vec![
            "-n",
            pod.netns.as_str(),
            "route",
            "add",
            "local",
            GENERATED_ENDPOINTS,
            "dev",
            "lo",
        ],
        vec![
            "-n",
            bed.node_netns.as_str(),
            "route",
            "add",
            GENERATED_ENDPOINTS,
            "dev",
            veth.as_str(),
        ],
    ] {
        let out = Command::new("ip")
            .args(&args)
            .output()
            .context("running ip")?;
        if !out.status.success() {
            bail!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    Ok(())
}

/// Clients that connect to each of `ips` port 80 every 5 ms from the
/// node: the moment each first got an answer. Before the datapath has a
/// service, its connection fails at once on the eBPF bed (no route) and
/// waits out the 100 ms timeout on the nftables one (a default route into
/// a dead veth): the figure is late by at most that plus 5 ms.
struct ServedProbe {
    clients: Vec<Child>,
    answered: mpsc::Receiver<f64>,
}

impl ServedProbe {
    fn start(bed: &Bed, ips: &[String], timeout: Duration) -> Result<ServedProbe> {
        let (tx, answered) = mpsc::channel();
        let mut clients = Vec::new();
        let duration = timeout.as_millis().to_string();
        for ip in ips {
            let target = format!("{ip}:80");
            let spawned = bed.spawn_client(
                None,
                &[
                    "--proto",
                    "tcp",
                    "--target",
                    &target,
                    "--duration-ms",
                    &duration,
                    "--interval-ms",
                    "5",
                    "--timeout-ms",
                    "100",
                ],
            );
            let mut client = match spawned {
                Ok(c) => c,
                Err(e) => {
                    clients.iter_mut().for_each(kill);
                    return Err(e);
                }
            };
            let lines = line_reader(&mut client);
            clients.push(client);
            let lines = match lines {
                Ok(l) => l,
                Err(e) => {
                    clients.iter_mut().for_each(kill);
                    return Err(e);
                }
            };
            let tx = tx.clone();
            std::thread::spawn(move || {
                if lines.iter().any(|l| l.starts_with("ok ")) {
                    let _ = tx.send(unix_now());
                }
            });
        }
        Ok(ServedProbe { clients, answered })
    }

    /// The moment the last of them first answered, waiting at most
    /// `timeout` more; stops the clients.
    fn last_answer(mut self, timeout: Duration) -> Result<f64> {
        let deadline = Instant::now() + timeout;
        let mut last: f64 = 0.0;
        let mut result = Ok(());
        for n in 0..self.clients.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.answered.recv_timeout(left) {
                Ok(at) => last = last.max(at),
                Err(_) => {
                    result = Err(anyhow::anyhow!(
                        "{n} of {} sampled services answered within {} s of programmed",
                        self.clients.len(),
                        timeout.as_secs()
                    ));
                    break;
                }
            }
        }
        self.clients.iter_mut().for_each(kill);
        result.map(|()| last)
    }
}

/// How long after programmed the sampled services may take to answer: far
/// past either goal (2 s, 5 s from exec), short enough that a cell that never
/// serves costs little.
const SERVED_AFTER_PROGRAMMED: Duration = Duration::from_secs(10);

/// Seconds from spawning the daemon to the whole state programmed, by the
/// daemon's own clock of the apply's end; and to the last of `sampled`
/// answering through the datapath, or why not.
fn full_sync(
    bed: &mut Bed,
    total: u64,
    sampled: &[String],
    settings: &Settings,
) -> Result<(f64, Result<f64, String>)> {
    let spawned = unix_now();
    bed.spawn_daemon()?;
    let probe = ServedProbe::start(bed, sampled, settings.sync_timeout);
    let programmed = programmed(bed, total, settings)? - spawned;
    let served = probe
        .and_then(|p| p.last_answer(SERVED_AFTER_PROGRAMMED))
        .map(|at| at - spawned)
        .map_err(|e| format!("{e:#}"));
    Ok((programmed, served))
}

/// When the whole state was programmed, by the daemon's clock.
fn programmed(bed: &mut Bed, total: u64, settings: &Settings) -> Result<f64> {
    let first = daemon::wait_for(
        bed,
        settings.sync_timeout,
        Duration::from_millis(20),
        "first state programmed",
        |p| p.programmed_rev >= 1 && p.programmed_rev >= p.state_rev,
    )?;
    if first.services == total {
        return Ok(first.programmed_at);
    }
    // Never-partial: the first state should be whole; give a late object a
    // moment, then report what is missing.
    let p = daemon::wait_for(
        bed,
        Duration::from_secs(30),
        Duration::from_millis(20),
        &format!(
            "all {total} services (the first state had {})",
            first.services
        ),
        |p| p.programmed_rev >= p.state_rev && p.services == total,
    )?;
    Ok(p.programmed_at)
}

fn settled(p: &Progress, after: u64) -> bool {
    p.state_rev > after && p.programmed_rev >= p.state_rev
}

fn changes(
    bed: &mut Bed,
    driver: &Driver,
    pods: &[String],
    settings: &Settings,
) -> Result<Changes> {
    let mut out = Changes::default();
    for generation in 1..=settings.change_samples {
        let before = daemon::progress(bed)?;
        let written = unix_now();
        driver.change(pods, generation)?;
        let p = daemon::wait_for(
            bed,
            Duration::from_secs(60),
            Duration::from_millis(5),
            &format!("change {generation} programmed"),
            |p| settled(p, before.state_rev),
        )?;
        out.source_to_state.push(1e3 * (p.state_at - written));
        out.state_to_programmed
            .push(1e3 * (p.programmed_at - p.state_at));
        out.end_to_end.push(1e3 * (p.programmed_at - written));
        // Let the source go quiet before the next one.
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(out)
}

const FANOUT_TIMEOUT: Duration = Duration::from_secs(120);
const FANOUT_RSS_CAP_MIB: f64 = 6144.0;

/// Reads a child's stdout lines on a thread.
fn line_reader(child: &mut Child) -> Result<mpsc::Receiver<String>> {
    let stdout = child.stdout.take().context("no stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok(rx)
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// From one change to every one of the watchers holding it: how long,
/// the bytes of a full frame on the wire, and the CPU the daemon and the
/// watchers spent meanwhile; `deltas`: watchers that ask for delta frames.
fn fanout(
    bed: &mut Bed,
    driver: &Driver,
    pods: &[String],
    generation: usize,
    deltas: bool,
    settings: &Settings,
) -> Result<FanOut> {
    let mut helper = Command::new(&settings.fanout_bin)
        .arg("--target")
        .arg(format!("unix:{}", bed.localnet_socket.display()))
        .args(["--clients", &settings.watchers.to_string()])
        .args(deltas.then_some("--deltas"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", settings.fanout_bin.display()))?;
    let helper_pid = helper.id();
    let result = (|| -> Result<FanOut> {
        let lines = line_reader(&mut helper)?;
        let ready = next_line(bed, &lines, "the watchers did not all get the first state")?;
        let (ready_rev, frame_bytes): (u64, usize) = ready
            .strip_prefix("ready ")
            .and_then(|r| r.split_once(' '))
            .and_then(|(rev, bytes)| Some((rev.parse().ok()?, bytes.parse().ok()?)))
            .with_context(|| format!("unexpected line {ready:?}"))?;
        let cpu = || -> Result<(u64, u64)> {
            Ok((daemon::cpu_ticks(bed)?, daemon::pid_cpu_ticks(helper_pid)?))
        };
        let before = cpu()?;
        let written = unix_now();
        driver.change(pods, generation)?;
        loop {
            let line = next_line(bed, &lines, "the watchers did not all get the new revision")?;
            let mut words = line.split_whitespace().skip(1);
            let rev: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
            let at: f64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0.0);
            if rev > ready_rev {
                let after = cpu()?;
                return Ok(FanOut {
                    ms: 1e3 * (at - written),
                    frame_bytes,
                    cpu: FanoutCpu {
                        daemon_s: daemon::cpu_seconds(after.0 - before.0),
                        watchers_s: daemon::cpu_seconds(after.1 - before.1),
                    },
                });
            }
        }
    })();
    kill(&mut helper);
    if result.is_err() {
        let mut err = String::new();
        if let Some(mut e) = helper.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        return result.with_context(|| format!("fan-out helper: {}", err.trim()));
    }
    result
}

/// The fan-out helper's next line, within [`FANOUT_TIMEOUT`]; gives up
/// early when the daemon's RSS passes [`FANOUT_RSS_CAP_MIB`] (a copy of the
/// state per watcher must not take the machine down).
fn next_line(bed: &Bed, lines: &mpsc::Receiver<String>, what: &str) -> Result<String> {
    let deadline = Instant::now() + FANOUT_TIMEOUT;
    loop {
        match lines.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => return Ok(line),
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("{what}: the helper exited"),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if Instant::now() > deadline {
            bail!("{what} within {} s", FANOUT_TIMEOUT.as_secs());
        }
        let rss = daemon::rss_mib(bed)?;
        if rss > FANOUT_RSS_CAP_MIB {
            bail!("{what}: stopped at a daemon RSS of {rss:.0} MiB (cap {FANOUT_RSS_CAP_MIB} MiB)");
        }
    }
}

/// SIGKILL and restart while a client connects to the probe ClusterIP
/// every 5 ms: the requests that failed and the seconds from the restart
/// to the whole state programmed again.
fn restart_under_load(bed: &mut Bed, total: u64, settings: &Settings) -> Result<Restart> {
    let mut client = bed.spawn_client(
        None,
        &[
            "--proto",
            "tcp",
            "--target",
            &format!("{}:80", manifests::PROBE_IP),
            "--duration-ms",
            "900000",
            "--interval-ms",
            "5",
            "--timeout-ms",
            "500",
        ],
    )?;
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let rx = line_reader(&mut client)?;
    let sink = lines.clone();
    let collector = std::thread::spawn(move || {
        for l in rx {
            sink.lock().unwrap_or_else(|e| e.into_inner()).push(l);
        }
    });
    let result = (|| -> Result<Restart> {
        std::thread::sleep(Duration::from_secs(1));
        let oks = |v: &[String]| v.iter().filter(|l| l.starts_with("ok ")).count();
        if oks(&lines.lock().unwrap_or_else(|e| e.into_inner())) == 0 {
            bail!("the probe ClusterIP answered nothing before the restart");
        }
        bed.kill_daemon();
        let restarted = unix_now();
        bed.spawn_daemon()?;
        let p = daemon::wait_for(
            bed,
            settings.sync_timeout,
            Duration::from_millis(20),
            "reconciled after the restart",
            |p| p.programmed_rev >= 1 && p.programmed_rev >= p.state_rev && p.services == total,
        )?;
        std::thread::sleep(Duration::from_secs(1));
        Ok(Restart {
            requests: 0,
            failed: 0,
            reconcile_s: p.programmed_at - restarted,
        })
    })();
    kill(&mut client);
    let _ = collector.join();
    let mut r = result?;
    let all = lines.lock().unwrap_or_else(|e| e.into_inner());
    r.requests = all.len();
    r.failed = all.iter().filter(|l| !l.starts_with("ok ")).count();
    Ok(r)
}

/// Restarts the API server (a new resourceVersion history, nothing
/// changed): every watch gets 410 Gone and lists again, and the daemon
/// should take in what changed (nothing), not hold a second copy of the
/// cluster. Waits for each resource's "relisted" log line.
fn relist(bed: &mut Bed, api: &FakeApiServer) -> Result<Episode> {
    // Services, EndpointSlices, the Node, its Pods.
    const RESOURCES: usize = 4;
    let relisted = |bed: &Bed| bed.daemon_log().matches("relisted").count();
    let before = relisted(bed);
    let started = Instant::now();
    api.restart();
    while relisted(bed) < before + RESOURCES {
        if !bed.daemon_alive()? {
            bail!("the daemon exited; log:\n{}", daemon::log_tail(bed, 15));
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!(
                "not relisted within 60 s; log:\n{}",
                daemon::log_tail(bed, 20)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Episode {
        seconds: started.elapsed().as_secs_f64(),
        peak_rss_mib: daemon::peak_rss_mib(bed)?,
    })
}

/// Every generated manifest rewritten with its pods rotated, then all
/// renamed into place at once. The file source takes each file whole but
/// may take the burst in more than one state; the rotation is in when the
/// service the last file adds is programmed.
fn rotation(bed: &mut Bed, dir: &std::path::Path, scale: Scale) -> Result<Episode> {
    let staged = manifests::stage_rotated(dir, scale)?;
    let before = daemon::progress(bed)?;
    let started = unix_now();
    manifests::rename_all(&staged)?;
    let p = daemon::wait_for(
        bed,
        Duration::from_secs(120),
        Duration::from_millis(20),
        "the rotation programmed",
        |p| p.services > before.services && p.programmed_rev >= p.state_rev,
    )?;
    Ok(Episode {
        seconds: p.programmed_at - started,
        peak_rss_mib: daemon::peak_rss_mib(bed)?,
    })
}

/// The `q`th percentile (nearest rank) of `samples`.
pub fn percentile(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((q / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

fn json_of<T>(r: &Result<T, String>, f: impl Fn(&T) -> Value) -> Value {
    match r {
        Ok(v) => f(v),
        Err(e) => json!({ "error": e }),
    }
}

fn summary(samples: &[f64]) -> Value {
    json!({
        "p50_ms": percentile(samples, 50.0),
        "p99_ms": percentile(samples, 99.0),
        "samples_ms": samples,
    })
}

impl CellResult {
    /// The full-frame fan-out over its floor measured in the same run
    /// (issue 37: at most 1.5).
    pub fn fanout_ratio(&self) -> Result<f64, String> {
        let fanout = self.fanout_ms.clone()?;
        let floor = self.fanout_floor_ms.clone()?;
        if floor > 0.0 {
            Ok(fanout / floor)
        } else {
            Err(format!("a floor of {floor} ms"))
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "scale": self.scale.label(),
            "services": self.scale.services,
            "endpoints": self.scale.endpoints,
            "datapath": self.datapath,
            "source": self.source.as_str(),
            "full_sync_s": json_of(&self.full_sync_s, |v| json!(v)),
            "exec_to_served_s": json_of(&self.served_s, |v| json!(v)),
            "change": json_of(&self.changes, |c| json!({
                "source_to_state": summary(&c.source_to_state),
                "state_to_programmed": summary(&c.state_to_programmed),
                "end_to_end": summary(&c.end_to_end),
            })),
            "idle_cpu_percent": json_of(&self.idle_cpu_pct, |v| json!(v)),
            "vmhwm_mib": json_of(&self.peak_rss_mib, |v| json!(v)),
            "fanout_ms": json_of(&self.fanout_ms, |v| json!(v)),
            "fanout_floor_ms": json_of(&self.fanout_floor_ms, |v| json!(v)),
            "fanout_over_floor": json_of(&self.fanout_ratio(), |v| json!(v)),
            "fanout_cpu_s": json_of(&self.fanout_cpu, |c| json!({
                "daemon": c.daemon_s,
                "watchers": c.watchers_s,
            })),
            "fanout_delta_ms": json_of(&self.fanout_delta_ms, |v| json!(v)),
            "relist": json_of(&self.relist, Episode::to_json),
            "rotation": json_of(&self.rotation, Episode::to_json),
            "restart": json_of(&self.restart, |r| json!({
                "requests": r.requests,
                "failed": r.failed,
                "reconcile_s": r.reconcile_s,
            })),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let s: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&s, 50.0), 10.0);
        assert_eq!(percentile(&s, 99.0), 20.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    /// The sampled ClusterIPs are those of the first, middle and last
    /// generated service, as the manifests write them.
    #[test]
    fn sampled_ips_are_generated_services() {
        let scale = manifests::parse_scale("1k/10k").unwrap();
        let ips = sampled_ips(scale);
        assert_eq!(ips.len(), 3);
        let objects = manifests::objects(scale, &[]);
        for (name, ip) in ["svc-0", "svc-499", "svc-999"].iter().zip(&ips) {
            let svc = objects
                .iter()
                .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == *name)
                .unwrap_or_else(|| panic!("no {name}"));
            assert_eq!(svc["spec"]["clusterIP"], json!(ip), "{name}");
            let slice = objects
                .iter()
                .find(|o| {
                    o["kind"] == "EndpointSlice"
                        && o["metadata"]["labels"]["kubernetes.io/service-name"] == *name
                })
                .unwrap_or_else(|| panic!("no slice of {name}"));
            let ep: Ipv4Addr = slice["endpoints"][0]["addresses"][0]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(
                ep.octets()[..2],
                [10, 128],
                "{name}: {ep} outside {GENERATED_ENDPOINTS}"
            );
        }
    }
}
