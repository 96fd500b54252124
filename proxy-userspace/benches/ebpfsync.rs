//! `cargo bench -p proxy-userspace --bench ebpfsync` (root, with the eBPF
//! object embedded): the eBPF datapath at 10k services / 100k endpoints
//! and 50k / 250k, attached to a cgroup of its own (nothing else is
//! hooked), each figure with a ratio against a baseline measured in the
//! same run on the same kernel:
//!
//! * full sync (`program_all` into empty maps) vs. writing the same
//!   number of map entries one `bpf_map_update_elem` each, the way the
//!   datapath wrote them before batching;
//! * one endpoint change (`program_changes` for one service) vs. one
//!   `bpf_map_update_elem`.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use aya::maps::{HashMap, MapData};
use ebpf_kube_proxy::datapath::ebpf::{self, generation, EbpfConfig, EbpfDatapath};
use ebpf_kube_proxy::datapath::{Datapath, ServiceChange};
use ebpf_kube_proxy::model::claims::Claims;
use ebpf_kube_proxy::model::LocalState;

#[path = "common/ebpf_scale.rs"]
mod scale;

use common::report;

const FULL_RUNS: usize = 3;
const CHANGE_RUNS: usize = 21;

struct Place {
    cgroup: PathBuf,
    bpffs: PathBuf,
}

impl Drop for Place {
    fn drop(&mut self) {
        let _ = ebpf::cleanup(&self.bpffs);
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// Writes `n` entries one syscall each into a scratch map like the
/// services map.
fn per_element_baseline(n: usize) -> Duration {
    let mut map = HashMap::<MapData, proxy_common::ServiceKey, proxy_common::ServiceValue>::create(
        n as u32 + 1,
        generation::BPF_F_NO_PREALLOC,
    )
    .expect("scratch map");
    let t = Instant::now();
    for i in 0..n {
        let key = proxy_common::ServiceKey {
            addr: [i as u32, 0, 0, 0],
            ..Default::default()
        };
        map.insert(key, proxy_common::ServiceValue::default(), 0)
            .expect("insert");
    }
    t.elapsed()
}

fn open(place: &Place) -> EbpfDatapath {
    EbpfDatapath::open(&EbpfConfig {
        bpffs_root: place.bpffs.clone(),
        cgroup_path: Some(place.cgroup.clone()),
        map_size: generation::DEFAULT_MAP_SIZE,
        // No node address is in 0.0.0.0/32: the tc programs attach to no
        // interface of the machine (this measures the socket hooks).
        nodeport_addresses: vec!["0.0.0.0/32".parse().unwrap()],
    })
    .expect("opening the eBPF datapath")
}

fn bench(place: &Place, services: usize, endpoints: usize) {
    let label = format!("{}k/{}k", services / 1000, endpoints / 1000);
    let state = scale::state(services, endpoints);
    let claims = Claims::of(&state);
    let entries = services + endpoints * 2;

    let mut full = Vec::new();
    let mut dp = None;
    for _ in 0..FULL_RUNS {
        drop(dp.take());
        ebpf::cleanup(&place.bpffs).expect("cleanup");
        let mut d = open(place);
        let t = Instant::now();
        d.program_all(&state, &claims).expect("program_all");
        full.push(t.elapsed());
        dp = Some(d);
    }
    let baseline = per_element_baseline(entries);
    report(
        &format!("eBPF {label}: program_all"),
        median(full),
        "per-element writes",
        baseline,
        Duration::from_secs(2),
    );

    // One endpoint of one service replaced, back and forth.
    let mut dp = dp.expect("a datapath");
    let per = endpoints / services;
    let i = services / 2;
    let a = scale::nth_service(i, per);
    let mut b = a.clone();
    b.endpoints[0].ip = scale::backend(endpoints + 1);
    let mut times = Vec::new();
    for run in 0..CHANGE_RUNS {
        let next = if run % 2 == 0 { &b } else { &a };
        let change = [ServiceChange {
            key: &next.service.key,
            next: Some(next),
        }];
        let empty = LocalState::default();
        let t = Instant::now();
        dp.program_changes(&empty, &empty, &change, &claims)
            .expect("program_changes");
        times.push(t.elapsed());
    }
    let one = median(times);
    println!("  one endpoint change, median of {CHANGE_RUNS}: {one:?}");
    report(
        &format!("eBPF {label}: one endpoint change"),
        one,
        "one bpf_map_update_elem",
        per_element_baseline(1),
        Duration::from_millis(5),
    );
}

fn main() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 || !ebpf::object_embedded() {
        println!("SKIP ebpfsync: needs root and the eBPF object");
        return;
    }
    let Ok(root) = test_support::cgroup2_root() else {
        println!("SKIP ebpfsync: no cgroup v2 mount");
        return;
    };
    let pid = std::process::id();
    let place = Place {
        cgroup: root.join(format!("ebpf-kube-proxy-bench-{pid}")),
        bpffs: PathBuf::from(format!("/sys/fs/bpf/ebpf-kube-proxy-bench-{pid}")),
    };
    std::fs::create_dir_all(&place.cgroup).expect("bench cgroup");
    let scales: Vec<(usize, usize)> = match std::env::var("EKP_BENCH_SCALE").as_deref() {
        // 50k/200k: the largest the fixed 262,144-entry maps held before.
        Ok("50k/200k") => vec![(50_000, 200_000)],
        Ok("100k/1m") => vec![(100_000, 1_000_000)],
        _ => vec![(10_000, 100_000), (50_000, 250_000)],
    };
    for (services, endpoints) in scales {
        bench(&place, services, endpoints);
    }
}
