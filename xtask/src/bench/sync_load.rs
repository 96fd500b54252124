//! `cargo xtask bench --only sync-under-load` (issue 38): lost handshakes
//! while the daemon syncs.
//!
//! On each datapath three clients open short connections (connect, one
//! request, close), each about [`RATE`] a second: one in pod1's netns and
//! one in the node's, both in the node's cgroup (so through the socket
//! hooks, or the node's nftables: forwarded and locally sent), to a
//! ClusterIP, and one in the outside netns to the NodePort of the same
//! service. Meanwhile the
//! daemon performs full syncs (in turn: a drift repair on SIGHUP, a drift
//! repair found by the periodic check, SIGKILL and restart, SIGTERM and
//! restart) and, between them, partial ones (the service's endpoints
//! changed through the file source). The drift is made by hand on a decoy
//! service (its nftables `service-ips` element or its eBPF service header
//! deleted), so that the repair is a full sync of a table that carries the
//! load; deleting the whole table would drop the load's own rules, which
//! loses handshakes by construction and tells nothing about the daemon.
//!
//! A lost handshake is a connect that failed, or one whose SYN was sent
//! again: the clients' netns counters `TcpExtTCPSynRetrans` (and
//! `TcpRetransSegs`), read by entering the netns, before and after. Goal:
//! 0 on both datapaths. Counted apart: connections that failed after
//! their handshake, and sockets the eBPF datapath destroyed because the
//! backend they were sent to left the service (`bpf_sock_destroy`, by
//! design, see `datapath/ebpf/sockdestroy.rs`: the application sees
//! ECONNABORTED, also on a connect still in progress); the endpoint changes
//! take backends out on purpose.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use super::daemon::{self, metric, unix_now};
use crate::e2e::bed::{Bed, NODE_EXTERNAL_IP};

/// Connections a second each client aims at (one connect, one request,
/// close; the client sleeps this long's inverse between two).
const RATE: u32 = 200;
/// The pause between two connections: a connection takes about a
/// millisecond on the bed.
const INTERVAL_MS: &str = "4";
const CLUSTER_IP: &str = "10.96.0.210";
const NODE_PORT: u16 = 30210;
const DECOY_IP: [u8; 4] = [10, 96, 0, 211];
/// The periodic drift check's period: one kind of full sync waits for it.
const SYNC_PERIOD: &str = "1s";
/// A connect whose SYN is lost is retried after 1 s: the client waits
/// longer, so that a lost SYN shows as a retransmission, not a timeout.
const CONNECT_TIMEOUT_MS: &str = "3000";
const DRIFT_TOTAL: &str = "ebpf_kube_proxy_datapath_drift_total";

pub struct Settings {
    pub full_syncs: usize,
    pub partial_syncs: usize,
    /// nftables: rounds of [`table_drift`].
    pub table_drifts: usize,
    pub daemon_bin: PathBuf,
}

/// The ways a full sync is caused, taken in turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Full {
    DriftSighup,
    DriftPeriodic,
    Sigkill,
    Sigterm,
}

const FULLS: [Full; 4] = [
    Full::DriftSighup,
    Full::DriftPeriodic,
    Full::Sigkill,
    Full::Sigterm,
];

impl Full {
    fn label(self) -> &'static str {
        match self {
            Full::DriftSighup => "drift repair on SIGHUP",
            Full::DriftPeriodic => "drift repair by the periodic check",
            Full::Sigkill => "SIGKILL + restart",
            Full::Sigterm => "SIGTERM + restart",
        }
    }
}

/// Failures of one client kept with their time, for the timeline.
const ERRORS_KEPT: usize = 100;

/// What one client counted.
#[derive(Clone, Debug, Default)]
pub struct ClientCount {
    pub ok: u64,
    /// Connects that failed.
    pub failed: u64,
    /// Connections that failed after the handshake.
    pub broken: u64,
    /// Sockets the daemon destroyed (ECONNABORTED): their backend left.
    pub destroyed: u64,
    pub first_error: Option<String>,
    /// Every failure (at most [`ERRORS_KEPT`]): when the client reported
    /// it (since the load started) and its line.
    pub errors: Vec<(Duration, String)>,
    pub syn_retrans: u64,
    pub retrans_segs: u64,
    pub per_second: f64,
}

impl ClientCount {
    /// Handshakes lost: failed connects and SYNs sent again.
    pub fn lost(&self) -> u64 {
        self.failed + self.syn_retrans
    }
}

#[derive(Clone, Debug, Default)]
pub struct Row {
    pub datapath: String,
    pub fulls: BTreeMap<String, usize>,
    pub partials: usize,
    /// ClusterIP from pod1, ClusterIP from the node, NodePort from outside.
    pub clients: [ClientCount; 3],
    pub seconds: f64,
    /// nftables: the e2e table-drift scenario, repeated.
    pub table_drift: Option<TableDrift>,
    pub error: Option<String>,
}

impl Row {
    pub fn met(&self) -> bool {
        self.error.is_none()
            && self.clients.iter().all(|c| c.lost() == 0)
            && self
                .table_drift
                .is_none_or(|t| t.failed + t.syn_retrans == 0)
    }
}

/// Runs the bench on each of `datapaths`; one row each.
pub fn run(settings: &Settings, datapaths: &[&str]) -> Vec<Row> {
    datapaths
        .iter()
        .filter(|d| **d != "none")
        .map(|d| {
            println!(
                "==> sync under load, {d}: {} full and {} partial syncs, {RATE} connections/s to a ClusterIP and to a NodePort",
                settings.full_syncs, settings.partial_syncs
            );
            let started = Instant::now();
            let mut row = Row {
                datapath: (*d).to_owned(),
                ..Row::default()
            };
            if let Err(e) = cell(settings, d, &mut row) {
                row.error = Some(format!("{e:#}"));
            }
            row.seconds = started.elapsed().as_secs_f64();
            println!("{}", line(&row));
            row
        })
        .collect()
}

/// The clients, in [`Row::clients`] order.
pub const CLIENTS: [&str; 3] = [
    "ClusterIP from a pod",
    "ClusterIP from the node",
    "NodePort from outside",
];

fn line(r: &Row) -> String {
    let mut text = format!(
        "    {}: {} full syncs {:?}, {} partial, {:.0} s — {}",
        r.datapath,
        r.fulls.values().sum::<usize>(),
        r.fulls,
        r.partials,
        r.seconds,
        if r.met() { "goal met" } else { "MISSED" },
    );
    for (name, c) in CLIENTS.iter().zip(&r.clients) {
        text.push_str(&format!(
            "\n      {name}: {} ok ({:.0}/s), {} connects failed, {} SYNs retransmitted ({} segments); apart: {} broken after the handshake, {} destroyed (backend left){}",
            c.ok,
            c.per_second,
            c.failed,
            c.syn_retrans,
            c.retrans_segs,
            c.broken,
            c.destroyed,
            c.first_error
                .as_deref()
                .map(|e| format!(", first error {e}"))
                .unwrap_or_default()
        ));
    }
    if let Some(t) = &r.table_drift {
        text.push_str(&format!(
            "\n      table flushed or deleted by hand, {} rounds: {} of {} requests after the repair failed, {} SYNs retransmitted outside the broken windows",
            t.rounds, t.failed, t.requests, t.syn_retrans
        ));
    }
    if let Some(e) = &r.error {
        text.push_str(&format!("\n      error: {e}"));
    }
    text
}

/// The markdown table of the rows: one line per datapath and client.
pub fn markdown(rows: &[Row]) -> String {
    let mut md = String::from(
        "| datapath | full / partial syncs | client | connections | connects failed | SYNs retransmitted | broken after the handshake | destroyed (backend left) | goal: 0 lost handshakes |\n\
         |---|---|---|---:|---:|---:|---:|---:|---|\n",
    );
    for r in rows {
        for (name, c) in CLIENTS.iter().zip(&r.clients) {
            md.push_str(&format!(
                "| {} | {} / {} | {name} | {} ({:.0}/s) | {} | {} | {} | {} | {} |\n",
                r.datapath,
                r.fulls.values().sum::<usize>(),
                r.partials,
                c.ok,
                c.per_second,
                c.failed,
                c.syn_retrans,
                c.broken,
                c.destroyed,
                match &r.error {
                    Some(e) => format!("ERROR {e}"),
                    None if c.lost() == 0 => "goal met".to_owned(),
                    None => "MISSED".to_owned(),
                }
            ));
        }
    }
    md
}

/// The load service (ClusterIP and NodePort) on the endpoints `eps`, and
/// the decoy service the drift is made on.
fn manifests(bed: &Bed, generation: usize) -> String {
    // pod2 and pod3 in turn alone or together: every change moves one
    // endpoint. pod1 runs the ClusterIP client.
    let eps: Vec<&str> = match generation % 4 {
        0 | 2 => vec![&bed.pods[1].ipv4, &bed.pods[2].ipv4],
        1 => vec![&bed.pods[1].ipv4],
        _ => vec![&bed.pods[2].ipv4],
    };
    let endpoints = |ips: &[&str]| {
        ips.iter()
            .map(|ip| {
                format!("{{addresses: [\"{ip}\"], nodeName: node-1, conditions: {{ready: true}}}}")
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let decoy = format!(
        "{}.{}.{}.{}",
        DECOY_IP[0], DECOY_IP[1], DECOY_IP[2], DECOY_IP[3]
    );
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: load, namespace: bench}}\n\
         spec: {{type: NodePort, clusterIP: {CLUSTER_IP}, \
         ports: [{{name: http, port: 80, targetPort: 8080, nodePort: {NODE_PORT}, protocol: TCP}}]}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: load-1, namespace: bench, labels: {{kubernetes.io/service-name: load}}}}\n\
         addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\n\
         endpoints: [{}]\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: decoy, namespace: bench}}\n\
         spec: {{clusterIP: {decoy}, ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP}}]}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: decoy-1, namespace: bench, labels: {{kubernetes.io/service-name: decoy}}}}\n\
         addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\n\
         endpoints: [{}]\n",
        endpoints(&eps),
        endpoints(&[&bed.pods[1].ipv4]),
    )
}

fn cell(settings: &Settings, datapath: &str, row: &mut Row) -> Result<()> {
    let mut bed = Bed::new(datapath, settings.daemon_bin.clone()).context("building the bed")?;
    bed.daemon_args = vec!["--sync-period".into(), SYNC_PERIOD.into()];
    let mut generation = 0;
    bed.apply_manifests(&manifests(&bed, generation))?;
    bed.start_daemon()?;
    settled(&mut bed, "the first state")?;
    let pod_ns = bed.pods[0].netns.clone();
    let node_ns = bed.node_netns.clone();
    let outside = bed.outside_netns.clone();
    let clusterip = format!("{CLUSTER_IP}:80");
    let nodeport = format!("{NODE_EXTERNAL_IP}:{NODE_PORT}");
    let targets = [
        (pod_ns, clusterip.clone()),
        (node_ns, clusterip),
        (outside, nodeport),
    ];
    // Each answers before the load starts (the bed's first packets
    // resolve neighbours; they are not what is measured).
    for (ns, target) in &targets {
        let r = bed.client(
            Some(ns),
            &[
                "--proto",
                "tcp",
                "--target",
                target,
                "--count",
                "3",
                "--timeout-ms",
                CONNECT_TIMEOUT_MS,
            ],
        )?;
        ensure!(
            r.iter().all(|l| l.starts_with("ok ")),
            "{target} from {ns} before the load: {r:?}"
        );
    }
    let before = targets
        .iter()
        .map(|(ns, _)| counters(ns))
        .collect::<Result<Vec<_>>>()?;
    let started = Instant::now();
    let clients = targets
        .iter()
        .map(|(ns, target)| Client::start(&bed, ns, target, started))
        .collect::<Result<Vec<_>>>()?;
    let every = (settings.partial_syncs / settings.full_syncs.max(1)).max(1);
    // When each sync was asked for and done, to place the failures.
    let mut timeline: Vec<(Duration, Duration, String)> = Vec::new();
    let syncs = (|| -> Result<()> {
        let mut fulls = 0;
        for i in 0..settings.partial_syncs.max(settings.full_syncs) {
            if i < settings.partial_syncs {
                generation += 1;
                let asked = started.elapsed();
                let rev = daemon::progress(&bed)?.programmed_rev;
                bed.apply_manifests(&manifests(&bed, generation))?;
                let waited = daemon::wait_for(
                    &mut bed,
                    Duration::from_secs(10),
                    Duration::from_millis(2),
                    "a partial sync",
                    |p| p.programmed_rev > rev && p.programmed_rev == p.state_rev,
                );
                if let Err(e) = waited {
                    // Whether the daemon did not see the change (no new
                    // state) or did not program it.
                    let now = daemon::progress(&bed).ok();
                    return Err(e.context(format!(
                        "generation {generation} written when rev {rev} was programmed; now {now:?}"
                    )));
                }
                row.partials += 1;
                timeline.push((
                    asked,
                    started.elapsed(),
                    format!(
                        "partial sync to endpoints of generation {generation} (pods {})",
                        match generation % 4 {
                            0 | 2 => "2+3",
                            1 => "2",
                            _ => "3",
                        }
                    ),
                ));
            }
            if fulls < settings.full_syncs
                && (i % every == every - 1 || i >= settings.partial_syncs)
            {
                let kind = FULLS[fulls % FULLS.len()];
                let asked = started.elapsed();
                full_sync(&mut bed, kind)
                    .with_context(|| format!("full sync {} ({})", fulls + 1, kind.label()))?;
                timeline.push((asked, started.elapsed(), kind.label().to_owned()));
                *row.fulls.entry(kind.label().to_owned()).or_default() += 1;
                fulls += 1;
            }
        }
        Ok(())
    })();
    // The last connections finish (or their SYNs are sent again) before
    // the clients stop.
    std::thread::sleep(Duration::from_millis(1500));
    let elapsed = started.elapsed();
    for ((count, client), ((ns, _), b)) in row
        .clients
        .iter_mut()
        .zip(clients)
        .zip(targets.iter().zip(&before))
    {
        *count = client.stop(elapsed);
        let a = counters(ns)?;
        let delta = |name: &str| {
            a.get(name)
                .copied()
                .unwrap_or(0)
                .saturating_sub(b.get(name).copied().unwrap_or(0))
        };
        count.syn_retrans = delta("TcpExt:TCPSynRetrans");
        count.retrans_segs = delta("Tcp:RetransSegs");
    }
    syncs?;
    print_failures(&row.clients, &timeline);
    if datapath == "nftables" {
        row.table_drift = Some(table_drift(&mut bed, settings.table_drifts)?);
    }
    Ok(())
}

/// Each failure a client reported, with the full syncs of the
/// [`CONNECT_TIMEOUT_MS`] (and a half second) before it, and how many
/// partial ones: a connection that waited out its timeout was opened then.
fn print_failures(clients: &[ClientCount], timeline: &[(Duration, Duration, String)]) {
    let window = Duration::from_millis(CONNECT_TIMEOUT_MS.parse().unwrap_or(3000) + 500);
    for (name, c) in CLIENTS.iter().zip(clients) {
        for (at, line) in &c.errors {
            let from = at.saturating_sub(window);
            let near: Vec<&(Duration, Duration, String)> = timeline
                .iter()
                .filter(|(asked, done, _)| *done >= from && asked <= at)
                .collect();
            let partials = near.iter().filter(|e| e.2.starts_with("partial")).count();
            let fulls: Vec<String> = near
                .iter()
                .filter(|e| !e.2.starts_with("partial"))
                .map(|(asked, done, what)| {
                    format!(
                        "{what} {:.2}-{:.2}s",
                        asked.as_secs_f64(),
                        done.as_secs_f64()
                    )
                })
                .collect();
            println!(
                "      {name}: at {:.2}s {line}; in the {window:?} before: {partials} partial syncs, full: {}",
                at.as_secs_f64(),
                if fulls.is_empty() { "none".to_owned() } else { fulls.join(", ") }
            );
        }
    }
}

/// What [`table_drift`] counted: requests made once the table was
/// repaired, those that failed, and the SYNs sent again meanwhile.
#[derive(Clone, Copy, Debug, Default)]
pub struct TableDrift {
    pub rounds: usize,
    pub requests: u64,
    pub failed: u64,
    pub syn_retrans: u64,
}

/// The e2e scenario `drift-flushed-or-deleted-nft-table-repaired`, over
/// and over, after the load: the table flushed (then deleted, in turn) by
/// hand, requests from the node every 50 ms with a 300 ms timeout until
/// the periodic check has repaired it, then 30 requests that must all be
/// answered within 1 s each. Counts the failures after the repair and the
/// node's SYN retransmissions outside the broken windows.
fn table_drift(bed: &mut Bed, rounds: usize) -> Result<TableDrift> {
    let target = format!("{CLUSTER_IP}:80");
    let node = bed.node_netns.clone();
    let mut out = TableDrift {
        rounds,
        ..TableDrift::default()
    };
    let request = |bed: &Bed, count: &str, timeout_ms: &str| -> Result<Vec<String>> {
        bed.client(
            None,
            &[
                "--proto",
                "tcp",
                "--target",
                &target,
                "--count",
                count,
                "--timeout-ms",
                timeout_ms,
            ],
        )
    };
    let syn_retrans = |ns: &str| -> Result<u64> {
        Ok(counters(ns)?
            .get("TcpExt:TCPSynRetrans")
            .copied()
            .unwrap_or(0))
    };
    for round in 0..rounds {
        let verb = if round % 2 == 0 { "flush" } else { "delete" };
        nft(bed, &[verb, "table", "ip", "ebpf-kube-proxy"])?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if request(bed, "1", "300")?
                .iter()
                .all(|l| l.starts_with("ok "))
            {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "the {verb}ed table was not repaired within 10 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // From here on the table is repaired: nothing may be lost.
        let before = syn_retrans(&node)?;
        let lines = request(bed, "30", "1000")?;
        out.syn_retrans += syn_retrans(&node)?.saturating_sub(before);
        out.requests += lines.len() as u64;
        let failed: Vec<&String> = lines.iter().filter(|l| !l.starts_with("ok ")).collect();
        out.failed += failed.len() as u64;
        if let Some(first) = failed.first() {
            println!(
                "      table {verb}ed, round {}: {} of 30 failed after the repair, e.g. {first}",
                round + 1,
                failed.len()
            );
        }
    }
    Ok(out)
}

/// `nft args` in the node's network namespace.
fn nft(bed: &Bed, args: &[&str]) -> Result<()> {
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", bed.node_netns))
        .arg("nft")
        .args(args)
        .output()
        .context("running nft")?;
    ensure!(
        out.status.success(),
        "nft {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Waits until the daemon has programmed the state it computed.
fn settled(bed: &mut Bed, what: &str) -> Result<daemon::Progress> {
    daemon::wait_for(
        bed,
        Duration::from_secs(20),
        Duration::from_millis(5),
        what,
        |p| p.programmed_rev > 0 && p.programmed_rev == p.state_rev,
    )
}

fn full_sync(bed: &mut Bed, kind: Full) -> Result<()> {
    match kind {
        Full::DriftSighup | Full::DriftPeriodic => {
            let page = bed.metrics()?;
            let drifts = metric(&page, DRIFT_TOTAL).unwrap_or(0.0);
            let since = unix_now();
            delete_decoy(bed)?;
            if kind == Full::DriftSighup {
                bed.signal_daemon("HUP")?;
            }
            daemon::wait_for(
                bed,
                Duration::from_secs(10),
                Duration::from_millis(5),
                "the drift repair",
                |p| p.programmed_at >= since,
            )?;
            let page = bed.metrics()?;
            ensure!(
                metric(&page, DRIFT_TOTAL).unwrap_or(0.0) > drifts,
                "an apply came, but no drift was counted"
            );
            Ok(())
        }
        Full::Sigkill => {
            bed.kill_daemon();
            bed.start_daemon()?;
            settled(bed, "the restarted daemon's first sync").map(drop)
        }
        Full::Sigterm => {
            bed.stop_daemon()?;
            bed.start_daemon()?;
            settled(bed, "the restarted daemon's first sync").map(drop)
        }
    }
}

/// Deletes the decoy service's entry by hand: its `service-ips` element,
/// or its eBPF service header.
fn delete_decoy(bed: &Bed) -> Result<()> {
    if bed.proxy_mode == "ebpf" {
        let map = bed.bpffs.join("EKP_SERVICES");
        let found =
            crate::e2e::scenarios::drift::bpf::delete_service_header(&map, DECOY_IP, 80, 6)?;
        ensure!(found, "no header entry of the decoy in {}", map.display());
        return Ok(());
    }
    let [a, b, c, d] = DECOY_IP;
    nft(
        bed,
        &[
            "delete",
            "element",
            "ip",
            "ebpf-kube-proxy",
            "service-ips",
            &format!("{{ {a}.{b}.{c}.{d} . tcp . 80 }}"),
        ],
    )
}

/// `Tcp:` and `TcpExt:` counters of `netns` (`/proc/net/snmp` and
/// `/proc/net/netstat` read inside it), keyed `Tcp:RetransSegs`.
fn counters(netns: &str) -> Result<BTreeMap<String, u64>> {
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{netns}"))
        .args(["cat", "/proc/net/snmp", "/proc/net/netstat"])
        .output()
        .context("reading the netns counters")?;
    ensure!(out.status.success(), "cat /proc/net/snmp in {netns} failed");
    parse_counters(&String::from_utf8_lossy(&out.stdout))
}

/// The files' header/value line pairs as `Prefix:Name → value`.
fn parse_counters(text: &str) -> Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    for pair in lines.chunks(2) {
        let [names, values] = pair else {
            bail!("an odd number of counter lines");
        };
        let (prefix, names) = names.split_once(':').context("no prefix")?;
        let (_, values) = values.split_once(':').context("no prefix")?;
        for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
            // Tcp:MaxConn is -1: not a counter.
            if let Ok(v) = v.parse() {
                out.insert(format!("{prefix}:{n}"), v);
            }
        }
    }
    Ok(out)
}

/// A client process (`xtask client`) opening short connections until
/// stopped, and the thread counting its answers.
struct Client {
    child: Child,
    reader: JoinHandle<ClientCount>,
}

impl Client {
    fn start(bed: &Bed, netns: &str, target: &str, started: Instant) -> Result<Client> {
        let mut child = bed.spawn_client(
            Some(netns),
            &[
                "--proto",
                "tcp",
                "--target",
                target,
                // Stopped by `stop`; the duration only bounds a leak.
                "--duration-ms",
                "3600000",
                "--interval-ms",
                INTERVAL_MS,
                "--timeout-ms",
                CONNECT_TIMEOUT_MS,
            ],
        )?;
        let stdout = child.stdout.take().context("client stdout")?;
        let reader = std::thread::spawn(move || {
            let mut c = ClientCount::default();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("ok ") {
                    c.ok += 1;
                    continue;
                }
                if line.contains("(os_error_103)") {
                    c.destroyed += 1;
                } else if line.starts_with("err connect:") {
                    c.failed += 1;
                } else {
                    c.broken += 1;
                }
                if c.errors.len() < ERRORS_KEPT {
                    c.errors.push((started.elapsed(), line.clone()));
                }
                c.first_error.get_or_insert(line);
            }
            c
        });
        Ok(Client { child, reader })
    }

    fn stop(mut self, elapsed: Duration) -> ClientCount {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut c = self.reader.join().unwrap_or_default();
        c.per_second = c.ok as f64 / elapsed.as_secs_f64();
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_of_snmp_and_netstat() {
        let text = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
                    Tcp: RtoAlgorithm MaxConn RetransSegs\nTcp: 1 -1 7\n\
                    TcpExt: SyncookiesSent TCPSynRetrans\nTcpExt: 0 3\n";
        let c = parse_counters(text).unwrap();
        assert_eq!(c["Tcp:RetransSegs"], 7);
        assert_eq!(c["TcpExt:TCPSynRetrans"], 3);
        assert!(!c.contains_key("Tcp:MaxConn"));
    }
}
