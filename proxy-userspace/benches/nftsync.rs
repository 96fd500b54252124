//! `cargo xtask bench` (root): the nftables datapath at 10k services /
//! 100k endpoints and 50k / 250k, in a network namespace of its own, each
//! figure printed with a ratio against `nft -f` in the same run:
//!
//! * full sync: one netlink transaction vs. one `nft -f` file holding the
//!   same services in kube-proxy's layout (a chain per service, one
//!   `numgen` DNAT rule per endpoint: nft cannot parse the datapath's own
//!   group rules back);
//! * one endpoint removed / re-added: the datapath's partial sync (set
//!   and map elements only) vs. `nft -f` rewriting that service's chain,
//!   the work an endpoint change costs in kube-proxy's layout.
//!
//! `EKP_BENCH_SCALES=10000x10,50000x5` picks the scales.

mod common;

use std::fmt::Write as _;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebpf_kube_proxy::apply::Applier;
use ebpf_kube_proxy::datapath::nft::rules::TABLE;
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

/// `se`'s chain in kube-proxy's layout: rule *i* of *N* DNATs with
/// probability 1/(N - i).
fn chain_rules(out: &mut String, i: usize, se: &ServiceEndpoints) {
    let t = format!("ip {TABLE}");
    let n = se.endpoints.len();
    for (k, ep) in se.endpoints.iter().enumerate() {
        let port = ep.ports.first().map_or(8080, |p| p.port);
        let pick = if n - k > 1 {
            format!("numgen random mod {} 0 ", n - k)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "add rule {t} svc-{i} {pick}meta l4proto tcp dnat to {}:{port}",
            ep.ip
        );
    }
}

/// The services of `state` as one `nft -f` file (IPv4, ClusterIPs).
fn baseline_text(state: &LocalState) -> String {
    let t = format!("ip {TABLE}");
    let mut out = format!(
        "add table {t}\n\
         add map {t} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; }}\n\
         add chain {t} nat-prerouting {{ type nat hook prerouting priority -100 ; policy accept ; }}\n\
         add chain {t} services\n\
         add rule {t} nat-prerouting jump services\n\
         add rule {t} services ip daddr . meta l4proto . th dport vmap @service-ips\n"
    );
    let mut elements = Vec::new();
    for (i, se) in state.services.iter().enumerate() {
        let _ = writeln!(out, "add chain {t} svc-{i}");
        chain_rules(&mut out, i, se);
        for ip in se.service.cluster_ips.iter() {
            elements.push(format!("{ip} . tcp . 80 : goto svc-{i}"));
        }
    }
    let _ = writeln!(
        out,
        "add element {t} service-ips {{ {} }}",
        elements.join(", ")
    );
    out
}

/// One service's chain rewritten, as `nft -f` commands.
fn change_text(state: &LocalState, index: usize) -> String {
    let mut out = format!("flush chain ip {TABLE} svc-{index}\n");
    chain_rules(&mut out, index, &state.services[index]);
    out
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
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

    let text = baseline_text(&full);
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for _ in 0..FULL_RUNS {
        delete_tables();
        let mut dp = Applier::new(Box::new(NftDatapath::open(Vec::new()).expect("open")));
        let t = Instant::now();
        dp.apply(&full).expect("full sync");
        ours.push(t.elapsed());
        delete_tables();
        theirs.push(nft_file(&text));
    }
    report(
        &format!("nftables full sync {services}/{}", services * per_service),
        median(ours),
        "nft -f of the same services",
        median(theirs),
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
    delete_tables();
    nft_file(&text);
    let mut theirs = Vec::new();
    for i in 0..CHANGE_RUNS {
        let state = if i % 2 == 0 { &one_less } else { &full };
        theirs.push(nft_file(&change_text(state, changed)));
    }
    report(
        &format!(
            "nftables one endpoint change {services}/{}",
            services * per_service
        ),
        median(ours),
        "nft -f rewriting that chain",
        median(theirs),
        Duration::from_millis(50),
    );
    delete_tables();
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
