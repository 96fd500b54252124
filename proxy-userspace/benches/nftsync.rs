//! `cargo xtask bench` (root): the nftables datapath at 10k services /
//! 100k endpoints and 50k / 250k (`EKP_BENCH_SCALES=10000x10,50000x5`
//! picks others), in a network namespace of its own, each figure printed
//! with a ratio against `nft -f` loading the same cluster as a
//! kube-proxy-shaped ruleset (a chain per service, a DNAT rule per
//! endpoint) in the same run (`EKP_BENCH_BASELINE=0` skips it):
//!
//! * full sync: one netlink transaction vs. one `nft -f` file;
//! * one endpoint removed / re-added (a service of 5 goes to 4 and back):
//!   the datapath's partial sync (map elements only) vs. `nft -f` with
//!   that service's chain rewritten; the slowest of the runs is printed
//!   too.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebpf_kube_proxy::apply::Applier;
use ebpf_kube_proxy::datapath::nft::expr;
use ebpf_kube_proxy::datapath::nft::rules::{self, Family, TABLE};
use ebpf_kube_proxy::datapath::nft::{self, NftDatapath};
use ebpf_kube_proxy::model::{compute, LocalState, ServiceEndpoints};

use common::{cluster_of, report};

const FULL_RUNS: usize = 3;
const CHANGE_RUNS: usize = 7;

fn nft_file(text: &str) -> Duration {
    let t = Instant::now();
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("nft");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write");
    assert!(child.wait().expect("nft").success(), "nft -f failed");
    t.elapsed()
}

fn delete_tables() {
    nft::cleanup().expect("cleanup");
}

/// The kube-proxy-shaped IPv4 table as one `nft -f` file: the base
/// chains and maps, and per service a chain with one DNAT rule per
/// endpoint (`numgen random mod (N - i) 0`), dispatched from `service-ips`
/// (the layout this datapath had before its endpoints moved to maps).
fn baseline_text(state: &LocalState) -> String {
    let f = Family::V4;
    let t = format!("ip {TABLE}");
    let mut out = vec![
        format!("add table {t}"),
        format!(
            "add map {t} {} {{ type ipv4_addr . inet_proto . inet_service : verdict ; }}",
            rules::SERVICE_IPS
        ),
        format!(
            "add set {t} {} {{ type ipv4_addr . ipv4_addr ; }}",
            rules::HAIRPIN
        ),
    ];
    for (name, kind, hook, prio) in rules::BASE_CHAINS {
        let hook = ["prerouting", "input", "forward", "output", "postrouting"][hook as usize];
        out.push(format!(
            "add chain {t} {name} {{ type {kind} hook {hook} priority {prio} ; policy accept ; }}"
        ));
    }
    let chains: Vec<(String, Vec<expr::Rule>)> =
        state.services.iter().map(|se| baseline_chain(se)).collect();
    for (name, _) in &chains {
        out.push(format!("add chain {t} {name}"));
    }
    out.push(format!(
        "add rule {t} nat-prerouting ip daddr . meta l4proto . th dport vmap @{}",
        rules::SERVICE_IPS
    ));
    let mut elements = Vec::new();
    let mut hairpin = std::collections::BTreeSet::new();
    for ((name, rs), se) in chains.iter().zip(&state.services) {
        for r in rs {
            out.push(format!("add rule {t} {name} {}", r.text(f)));
        }
        let ip = se.service.cluster_ips.v4()[0];
        elements.push(format!(
            "{ip} . tcp . {} : goto {name}",
            se.service.ports[0].port
        ));
        hairpin.extend(
            se.endpoints
                .iter()
                .map(|ep| format!("{} . {}", ep.ip, ep.ip)),
        );
    }
    out.push(format!(
        "add element {t} {} {{ {} }}",
        rules::SERVICE_IPS,
        elements.join(", ")
    ));
    let hairpin: Vec<String> = hairpin.into_iter().collect();
    out.push(format!(
        "add element {t} {} {{ {} }}",
        rules::HAIRPIN,
        hairpin.join(", ")
    ));
    out.join("\n") + "\n"
}

/// A service's chain in the kube-proxy-shaped layout.
fn baseline_chain(se: &ServiceEndpoints) -> (String, Vec<expr::Rule>) {
    let n = se.endpoints.len();
    let rules = se
        .endpoints
        .iter()
        .enumerate()
        .map(|(i, ep)| {
            let mut matches = Vec::new();
            if n - i > 1 {
                matches.push(expr::Match::OneIn((n - i) as u32));
            }
            matches.push(expr::Match::L4Proto(6));
            let port = ep.ports[0].port;
            expr::Rule::new(matches, vec![expr::Stmt::Dnat(ep.ip, port)])
        })
        .collect();
    (format!("svc-{}", se.service.key), rules)
}

/// One service's chain rewritten in the kube-proxy-shaped layout, as
/// `nft -f` commands.
fn change_text(state: &LocalState, index: usize) -> String {
    let f = Family::V4;
    let (name, rs) = baseline_chain(&state.services[index]);
    let mut out = vec![format!("flush chain ip {TABLE} {name}")];
    for r in rs {
        out.push(format!("add rule ip {TABLE} {name} {}", r.text(f)));
    }
    out.join("\n") + "\n"
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn main() {
    // EKP_BENCH_LOG=ebpf_kube_proxy=debug shows each transaction's time.
    if let Ok(filter) = std::env::var("EKP_BENCH_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .init();
    }
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        println!("nftables sync benchmark skipped: it needs root");
        return;
    }
    // SAFETY: the process is still single-threaded; everything after
    // this, `nft` included, sees only this new, empty namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        println!(
            "nftables sync benchmark skipped: unshare(CLONE_NEWNET): {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    for (services, per_service) in scales() {
        bench(services, per_service);
    }
}

fn scales() -> Vec<(usize, usize)> {
    let spec = std::env::var("EKP_BENCH_SCALES").unwrap_or_else(|_| "10000x10,50000x5".into());
    spec.split(',')
        .filter_map(|s| {
            let (a, b) = s.split_once('x')?;
            Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
        })
        .collect()
}

fn bench(services: usize, per_service: usize) {
    let full = compute(&cluster_of(services, per_service), &common::node());
    let mut one_less = full.clone();
    let changed = 0;
    Arc::make_mut(&mut one_less.services[changed])
        .endpoints
        .pop();
    let (full, one_less) = (Arc::new(full), Arc::new(one_less));
    println!(
        "nftables datapath: {services} services, {} endpoints; full sync median of {FULL_RUNS}, one change median of {CHANGE_RUNS}",
        services * per_service
    );

    let baseline = std::env::var("EKP_BENCH_BASELINE").map_or(true, |v| v != "0");
    let text = baseline_text(&full);
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for _ in 0..FULL_RUNS {
        delete_tables();
        let mut dp = Applier::new(Box::new(NftDatapath::open(Vec::new()).expect("open")));
        let t = Instant::now();
        dp.apply(&full).expect("full sync");
        ours.push(t.elapsed());
        if baseline {
            delete_tables();
            theirs.push(nft_file(&text));
        }
    }
    report_against(
        &format!("nftables full sync {services}/{}", services * per_service),
        ours,
        "nft -f of a kube-proxy-shaped ruleset",
        theirs,
        Duration::from_secs(10),
    );

    delete_tables();
    let mut dp = Applier::new(Box::new(NftDatapath::open(Vec::new()).expect("open")));
    dp.apply(&full).expect("full sync");
    let mut ours = Vec::new();
    for i in 0..CHANGE_RUNS {
        let to = if i % 2 == 0 { &one_less } else { &full };
        let t = Instant::now();
        dp.apply(to).expect("partial sync");
        ours.push(t.elapsed());
    }
    let mut theirs = Vec::new();
    if baseline {
        delete_tables();
        nft_file(&text);
        for i in 0..CHANGE_RUNS {
            let state = if i % 2 == 0 { &one_less } else { &full };
            theirs.push(nft_file(&change_text(state, changed)));
        }
    }
    report_against(
        &format!(
            "nftables one endpoint change {services}/{}",
            services * per_service
        ),
        ours,
        "nft -f rewriting that chain",
        theirs,
        Duration::from_millis(50),
    );
    delete_tables();
}

/// The median of `ours` against the median of `theirs` (when measured),
/// and the slowest of `ours`.
fn report_against(
    name: &str,
    ours: Vec<Duration>,
    baseline_name: &str,
    theirs: Vec<Duration>,
    target: Duration,
) {
    let slowest = ours.iter().max().copied().unwrap_or_default();
    let ours = median(ours);
    if theirs.is_empty() {
        println!(
            "{name:<44} {:>9.1} ms   target <= {} ms: {}",
            ours.as_secs_f64() * 1e3,
            target.as_millis(),
            if ours <= target { "met" } else { "MISSED" }
        );
    } else {
        report(name, ours, baseline_name, median(theirs), target);
    }
    println!(
        "{:<44} {:>9.1} ms   slowest",
        "",
        slowest.as_secs_f64() * 1e3
    );
}
