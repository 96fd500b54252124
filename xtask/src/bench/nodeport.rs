//! The NodePort cell (issue 16): the request rate a client outside the
//! node gets through a NodePort served by the tc programs, by the
//! nftables datapath, and straight to the pod, in the same run.
//!
//! ```text
//!   outside netns (192.168.100.2) ── client threads of this process
//!     │ veth
//!   node netns: 192.168.100.1 on the uplink (the tc programs attach here),
//!     │         ip_forward on, the release daemon, no client in its cgroup
//!     │ routed veth
//!   pod1 netns (10.244.1.11) ── server threads of this process, port 9000
//! ```
//!
//! The bed is the e2e one ([`Bed`]). Each round measures the three paths in
//! a rotated order: direct (no daemon: its pins and tables cleaned up, so
//! the node only routes), the daemon with `--proxy-mode ebpf`, and with
//! `--proxy-mode nftables`; each path twice, short connections (connect,
//! one request, close) and requests over a few persistent connections. The
//! figures are the medians over the rounds; the ratios are of medians.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};

use super::daemon::metric;
use super::load::{self, Load, Pattern, Server};
use crate::e2e::bed::{Bed, NODE_EXTERNAL_IP};

const SERVER_PORT: u16 = 9000;
const NODE_PORT: u16 = 30090;
/// Client threads making short connections (the machine has 2 cores).
const SHORT_THREADS: usize = 2;
const PERSISTENT_CONNECTIONS: usize = 4;
/// issue 16: tc ≥ 0.95 of direct.
const GOAL_TC_OF_DIRECT: f64 = 0.95;
/// issue 16: tc ≥ nftables.
const GOAL_TC_OF_NFT: f64 = 1.0;
/// The tc programs' counter of translated node-external packets.
const TC_COUNTER: &str = "ebpf_kube_proxy_datapath_external_packets_total{result=\"translated\"}";

#[derive(Clone, Debug)]
pub struct Settings {
    pub rounds: usize,
    pub warmup: Duration,
    pub window: Duration,
    pub daemon_bin: PathBuf,
}

/// The three ways to the pod, in report order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Direct,
    Tc,
    Nft,
}

const PATHS: [Path; 3] = [Path::Direct, Path::Tc, Path::Nft];

impl Path {
    fn label(self) -> &'static str {
        match self {
            Path::Direct => "direct to the pod",
            Path::Tc => "NodePort via tc (eBPF)",
            Path::Nft => "NodePort via nftables",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Path::Direct => "direct",
            Path::Tc => "tc",
            Path::Nft => "nftables",
        }
    }
}

/// Per-round rates of one path.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    /// Short connections per second.
    pub connections: Vec<f64>,
    /// Requests per second over the persistent connections.
    pub requests: Vec<f64>,
    /// Failed connects/requests over all rounds.
    pub errors: u64,
}

/// One figure's samples of a path.
type Pick = fn(&Samples) -> &Vec<f64>;

#[derive(Debug, Default)]
pub struct NodePortResult {
    pub direct: Samples,
    pub tc: Samples,
    pub nft: Samples,
    /// What showed the datapath under test was in the path.
    pub checks: Vec<String>,
    /// Why the cell stopped early, if it did.
    pub error: Option<String>,
}

pub fn median(samples: &[f64]) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

impl NodePortResult {
    fn samples(&self, p: Path) -> &Samples {
        match p {
            Path::Direct => &self.direct,
            Path::Tc => &self.tc,
            Path::Nft => &self.nft,
        }
    }

    fn samples_mut(&mut self, p: Path) -> &mut Samples {
        match p {
            Path::Direct => &mut self.direct,
            Path::Tc => &mut self.tc,
            Path::Nft => &mut self.nft,
        }
    }

    /// (figure, one path's samples of it) for both load patterns.
    fn figures() -> [(&'static str, Pick); 2] {
        [
            ("short connections (connect, 1 request, close) /s", |s| {
                &s.connections
            }),
            ("requests /s over 4 persistent connections", |s| &s.requests),
        ]
    }

    fn ratio(&self, pick: Pick, a: Path, b: Path) -> Option<f64> {
        let (x, y) = (
            median(pick(self.samples(a)))?,
            median(pick(self.samples(b)))?,
        );
        (y > 0.0).then(|| x / y)
    }

    /// Counts of ratios that met and missed their goal.
    pub fn verdicts(&self) -> (usize, usize) {
        let (mut met, mut missed) = (0, 0);
        for (_, pick) in Self::figures() {
            for (a, b, goal) in [
                (Path::Tc, Path::Direct, GOAL_TC_OF_DIRECT),
                (Path::Tc, Path::Nft, GOAL_TC_OF_NFT),
            ] {
                match self.ratio(pick, a, b) {
                    Some(r) if r >= goal => met += 1,
                    _ => missed += 1,
                }
            }
        }
        (met, missed)
    }

    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| NodePort, client outside the node, one local endpoint | direct | tc (eBPF) | nftables | tc ÷ direct | nft ÷ direct | tc ÷ nft |\n\
             |---|---|---|---|---|---|---|\n",
        );
        let verdict = |r: Option<f64>, goal: f64| match r {
            Some(r) if r >= goal => format!("{r:.3} met (≥ {goal:.2})"),
            Some(r) => format!("**{r:.3} MISSED (≥ {goal:.2})**"),
            None => format!("**— MISSED (≥ {goal:.2})**"),
        };
        for (figure, pick) in Self::figures() {
            out.push_str(&format!("| {figure} |"));
            for p in PATHS {
                let samples = pick(self.samples(p));
                // The spread says how much the machine's noise moved it.
                let text = match median(samples) {
                    Some(m) => {
                        let lo = samples.iter().copied().fold(f64::INFINITY, f64::min);
                        let hi = samples.iter().copied().fold(0.0, f64::max);
                        format!("{m:.0} ({lo:.0}–{hi:.0})")
                    }
                    None => "—".to_owned(),
                };
                out.push_str(&format!(" {text} |"));
            }
            let nft_direct = self
                .ratio(pick, Path::Nft, Path::Direct)
                .map(|r| format!("{r:.3}"))
                .unwrap_or_else(|| "—".to_owned());
            out.push_str(&format!(
                " {} | {nft_direct} | {} |\n",
                verdict(self.ratio(pick, Path::Tc, Path::Direct), GOAL_TC_OF_DIRECT),
                verdict(self.ratio(pick, Path::Tc, Path::Nft), GOAL_TC_OF_NFT),
            ));
        }
        let rounds = self.direct.connections.len();
        let errors: Vec<String> = PATHS
            .iter()
            .map(|p| format!("{} {}", p.key(), self.samples(*p).errors))
            .collect();
        out.push_str(&format!(
            "\nMedians (min–max) of {rounds} interleaved round(s); failed requests: {}.\n",
            errors.join(", ")
        ));
        for c in &self.checks {
            out.push_str(&format!("* {c}\n"));
        }
        if let Some(e) = &self.error {
            out.push_str(&format!("\n**ERROR: {}**\n", e.replace('\n', " ")));
        }
        out
    }

    pub fn to_json(&self) -> Value {
        let mut paths = serde_json::Map::new();
        for p in PATHS {
            let s = self.samples(p);
            paths.insert(
                p.key().to_owned(),
                json!({
                    "short_connections_per_s": s.connections,
                    "short_connections_per_s_median": median(&s.connections),
                    "persistent_requests_per_s": s.requests,
                    "persistent_requests_per_s_median": median(&s.requests),
                    "errors": s.errors,
                }),
            );
        }
        let ratios = |pick| {
            json!({
                "tc_over_direct": self.ratio(pick, Path::Tc, Path::Direct),
                "nft_over_direct": self.ratio(pick, Path::Nft, Path::Direct),
                "tc_over_nft": self.ratio(pick, Path::Tc, Path::Nft),
            })
        };
        let [(_, short), (_, persistent)] = Self::figures();
        json!({
            "paths": paths,
            "ratios": {
                "short_connections": ratios(short),
                "persistent_requests": ratios(persistent),
            },
            "goals": { "tc_over_direct_min": GOAL_TC_OF_DIRECT, "tc_over_nft_min": GOAL_TC_OF_NFT },
            "checks": self.checks,
            "error": self.error,
        })
    }
}

/// Runs the cell; an error ends it early and is reported in its place
/// with whatever rounds were complete.
pub fn run(settings: &Settings) -> NodePortResult {
    let mut result = NodePortResult::default();
    if let Err(e) = rounds(settings, &mut result) {
        result.error = Some(format!("{e:#}"));
    }
    result
}

fn manifests(pod: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: np, namespace: bench}}\n\
         spec: {{type: NodePort, clusterIP: 10.96.0.90, \
         ports: [{{name: app, port: 80, targetPort: {SERVER_PORT}, nodePort: {NODE_PORT}, protocol: TCP}}]}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: np-1, namespace: bench, labels: {{kubernetes.io/service-name: np}}}}\n\
         addressType: IPv4\nports: [{{name: app, port: {SERVER_PORT}, protocol: TCP}}]\n\
         endpoints: [{{addresses: [\"{pod}\"], nodeName: node-1, conditions: {{ready: true}}}}]\n"
    )
}

fn sysctl(netns: &str, key: &str, value: &str) -> Result<()> {
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{netns}"))
        .args(["sysctl", "-q", "-w", &format!("{key}={value}")])
        .output()?;
    ensure!(
        out.status.success(),
        "sysctl {key}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// `nft list tables` in the node namespace.
fn nft_tables(bed: &Bed) -> Result<String> {
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", bed.node_netns))
        .args(["nft", "list", "tables"])
        .output()
        .context("running nft")?;
    ensure!(
        out.status.success(),
        "nft list tables: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn tc_counter(bed: &Bed) -> Result<f64> {
    let page = bed.metrics()?;
    metric(&page, TC_COUNTER).with_context(|| format!("no {TC_COUNTER} on /metrics"))
}

fn rounds(settings: &Settings, result: &mut NodePortResult) -> Result<()> {
    // Built for eBPF: no default route to a dead veth in the node (the
    // nftables bed adds one for ClusterIP connects from the node; the
    // outside client needs none).
    let mut bed = Bed::new("ebpf", settings.daemon_bin.clone()).context("building the bed")?;
    let outside = bed.outside_netns.clone();
    // The client closes first: its ports sit in TIME_WAIT, and thousands of
    // connections a second would run out of them without reuse.
    sysctl(&outside, "net.ipv4.tcp_tw_reuse", "1")?;
    sysctl(&outside, "net.ipv4.ip_local_port_range", "10000 65000")?;
    let pod = bed.pods[0].ipv4.clone();
    let direct: SocketAddr = format!("{pod}:{SERVER_PORT}").parse()?;
    let nodeport: SocketAddr = format!("{NODE_EXTERNAL_IP}:{NODE_PORT}").parse()?;
    let server = Server::start(
        &bed.pods[0].netns,
        format!("0.0.0.0:{SERVER_PORT}").parse()?,
        SHORT_THREADS + PERSISTENT_CONNECTIONS + 2,
    )?;
    bed.apply_manifests(&manifests(&pod))?;
    ensure!(
        load::answers(&outside, direct, Duration::from_secs(2))?,
        "the pod's server does not answer {direct} from outside the node"
    );
    for round in 0..settings.rounds {
        for i in 0..PATHS.len() {
            let path = PATHS[(round + i) % PATHS.len()];
            let target = if path == Path::Direct {
                direct
            } else {
                nodeport
            };
            let (short, persistent) = match path {
                Path::Direct => measure_both(&outside, target, settings)?,
                Path::Tc | Path::Nft => {
                    let r = with_daemon(&mut bed, path, result, round == 0, || {
                        measure_both(&outside, target, settings)
                    });
                    // Pins, tc links and nft tables go whatever happened, so
                    // the next direct round measures a bare node.
                    bed.stop_daemon()?;
                    bed.cleanup_command()?;
                    r?
                }
            };
            println!(
                "      round {}: {:<24} {:>7.0} conn/s  {:>7.0} req/s{}",
                round + 1,
                path.label(),
                short.per_second(),
                persistent.per_second(),
                match (short.errors + persistent.errors, &short.first_error) {
                    (0, _) => String::new(),
                    (n, e) => format!("  ({n} failed: {})", e.as_deref().unwrap_or("")),
                }
            );
            let s = result.samples_mut(path);
            s.connections.push(short.per_second());
            s.requests.push(persistent.per_second());
            s.errors += short.errors + persistent.errors;
        }
        // After the daemon left: the NodePort is gone, direct stays.
        ensure!(
            !load::answers(&outside, nodeport, Duration::from_millis(500))?,
            "the NodePort still answers with no daemon (round {})",
            round + 1
        );
    }
    drop(server);
    drop(bed);
    Ok(())
}

fn measure_both(netns: &str, target: SocketAddr, s: &Settings) -> Result<(Load, Load)> {
    let short = load::measure(
        netns,
        target,
        Pattern::ShortConnections {
            threads: SHORT_THREADS,
        },
        s.warmup,
        s.window,
    )?;
    let persistent = load::measure(
        netns,
        target,
        Pattern::Persistent {
            connections: PERSISTENT_CONNECTIONS,
        },
        s.warmup,
        s.window,
    )?;
    Ok((short, persistent))
}

/// Starts the daemon for `path`, waits for the NodePort to answer, runs
/// `f`, and checks the datapath of `path` carried the traffic.
fn with_daemon(
    bed: &mut Bed,
    path: Path,
    result: &mut NodePortResult,
    record: bool,
    f: impl FnOnce() -> Result<(Load, Load)>,
) -> Result<(Load, Load)> {
    bed.proxy_mode = match path {
        Path::Tc => "ebpf",
        _ => "nftables",
    }
    .to_owned();
    bed.start_daemon()?;
    let outside = bed.outside_netns.clone();
    let nodeport: SocketAddr = format!("{NODE_EXTERNAL_IP}:{NODE_PORT}").parse()?;
    let started = Instant::now();
    while !load::answers(&outside, nodeport, Duration::from_millis(500))? {
        if started.elapsed() > Duration::from_secs(15) {
            bail!(
                "{}: {nodeport} not served within 15 s; daemon log:\n{}",
                path.label(),
                super::daemon::log_tail(bed, 10)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let tables = nft_tables(bed)?;
    let before = if path == Path::Tc {
        ensure!(
            tables.is_empty(),
            "eBPF mode, yet the node has nftables tables: {tables}"
        );
        Some(tc_counter(bed)?)
    } else {
        ensure!(
            !tables.is_empty(),
            "nftables mode, yet the node has no nftables table"
        );
        None
    };
    let (short, persistent) = f()?;
    if let Some(before) = before {
        // Every request crosses the uplink's ingress at least once.
        let packets = tc_counter(bed)? - before;
        let requests = (short.ok + persistent.ok) as f64;
        ensure!(
            packets >= requests,
            "the tc programs translated {packets} packets for {requests} requests: not in the path"
        );
        if record {
            result.checks.push(format!(
                "tc: `{TC_COUNTER}` grew by {packets:.0} over {requests:.0} counted requests; no nftables table in the node"
            ));
        }
    } else if record {
        result.checks.push(format!(
            "nftables: the node's tables: {}",
            tables.replace('\n', ", ")
        ));
    }
    Ok((short, persistent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_no_rounds() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn ratios_of_medians_against_the_goals() {
        let samples = |c: &[f64], r: &[f64]| Samples {
            connections: c.to_vec(),
            requests: r.to_vec(),
            errors: 0,
        };
        let result = NodePortResult {
            direct: samples(&[100.0, 1.0, 100.0], &[1000.0]),
            // Short: 0.96 of direct (met), above nftables (met).
            // Persistent: 0.9 of direct (missed), below nftables (missed).
            tc: samples(&[96.0, 500.0, 90.0, 97.0, 10.0], &[900.0]),
            nft: samples(&[80.0], &[950.0]),
            ..NodePortResult::default()
        };
        assert_eq!(result.verdicts(), (2, 2));
        let md = result.markdown();
        assert!(md.contains("0.960 met (≥ 0.95)"), "{md}");
        assert!(md.contains("**0.900 MISSED (≥ 0.95)**"), "{md}");
        let json = result.to_json();
        assert_eq!(json["ratios"]["short_connections"]["tc_over_nft"], 1.2);
        // No rounds: every goal missed, not met by default.
        assert_eq!(NodePortResult::default().verdicts(), (0, 4));
    }
}
