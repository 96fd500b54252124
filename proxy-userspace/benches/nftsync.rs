//! `cargo xtask bench` (root): the nftables datapath at 10k services /
//! 100k endpoints, in a network namespace of its own, each figure printed
//! with a ratio against `nft -f` loading the very same ruleset (rendered
//! from the same rules) in the same run:
//!
//! * full sync: one netlink transaction vs. one `nft -f` file;
//! * one endpoint removed / re-added: the datapath's partial sync vs.
//!   `nft -f` with that service's chain rewritten.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebpf_kube_proxy::apply::Applier;
use ebpf_kube_proxy::datapath::nft::expr::key_text;
use ebpf_kube_proxy::datapath::nft::rules::{self, Family, TABLE};
use ebpf_kube_proxy::datapath::nft::{self, NftDatapath};
use ebpf_kube_proxy::model::{compute, LocalState};

use common::{cluster, report, ENDPOINTS_PER_SERVICE, SERVICES};

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

/// The whole IPv4 table as one `nft -f` file: what the full sync loads.
fn full_text(state: &LocalState) -> String {
    let f = Family::V4;
    let t = format!("ip {TABLE}");
    let mut out = vec![
        format!("add table {t}"),
        format!(
            "add map {t} {} {{ type ipv4_addr . inet_proto . inet_service : verdict ; }}",
            rules::SERVICE_IPS
        ),
        format!(
            "add map {t} {} {{ type inet_proto . inet_service : verdict ; }}",
            rules::SERVICE_NODEPORTS
        ),
        format!(
            "add map {t} {} {{ type ipv4_addr . inet_proto . inet_service : verdict ; }}",
            rules::NO_ENDPOINT_SERVICES
        ),
        format!(
            "add map {t} {} {{ type inet_proto . inet_service : verdict ; }}",
            rules::NO_ENDPOINT_NODEPORTS
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
    for name in rules::HELPER_CHAINS {
        out.push(format!("add chain {t} {name}"));
    }
    let objs: Vec<_> = state
        .services
        .iter()
        .map(|se| rules::service_objects(se, f, &[], false))
        .collect();
    for o in &objs {
        for name in o.chains.keys() {
            out.push(format!("add chain {t} {name}"));
        }
    }
    for (chain, rule) in rules::base_rules(f, &[]) {
        out.push(format!("add rule {t} {chain} {}", rule.text(f)));
    }
    let mut elements: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    let mut hairpin = std::collections::BTreeSet::new();
    for o in &objs {
        for (name, rs) in &o.chains {
            for r in rs {
                out.push(format!("add rule {t} {name} {}", r.text(f)));
            }
        }
        for ((map, key), verdict) in &o.elements {
            elements
                .entry(map)
                .or_default()
                .push(format!("{} : {verdict}", key_text(key)));
        }
        hairpin.extend(o.hairpin.iter().map(|ip| format!("{ip} . {ip}")));
    }
    for (map, elems) in elements {
        out.push(format!("add element {t} {map} {{ {} }}", elems.join(", ")));
    }
    let hairpin: Vec<String> = hairpin.into_iter().collect();
    out.push(format!(
        "add element {t} {} {{ {} }}",
        rules::HAIRPIN,
        hairpin.join(", ")
    ));
    out.join("\n") + "\n"
}

/// One service's chains rewritten, as `nft -f` commands.
fn change_text(state: &LocalState, index: usize) -> String {
    let f = Family::V4;
    let o = rules::service_objects(&state.services[index], f, &[], false);
    let mut out = Vec::new();
    for (name, rs) in &o.chains {
        out.push(format!("flush chain ip {TABLE} {name}"));
        for r in rs {
            out.push(format!("add rule ip {TABLE} {name} {}", r.text(f)));
        }
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
    let full = compute(&cluster(), &common::node());
    let mut one_less = full.clone();
    let changed = 0;
    Arc::make_mut(&mut one_less.services[changed])
        .endpoints
        .pop();
    let (full, one_less) = (Arc::new(full), Arc::new(one_less));
    println!(
        "nftables datapath: {SERVICES} services, {} endpoints; full sync median of {FULL_RUNS}, one change median of {CHANGE_RUNS}",
        SERVICES * ENDPOINTS_PER_SERVICE
    );

    let text = full_text(&full);
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
        "nftables full sync (netlink, one transaction)",
        median(ours),
        "nft -f of the same ruleset",
        median(theirs),
        Duration::from_secs(5),
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
    for i in 0..CHANGE_RUNS {
        let state = if i % 2 == 0 { &full } else { &one_less };
        theirs.push(nft_file(&change_text(state, changed)));
    }
    report(
        "nftables one endpoint change (partial sync)",
        median(ours),
        "nft -f rewriting that chain",
        median(theirs),
        Duration::from_millis(50),
    );
    delete_tables();
}
