//! The drift check at 10,000 services / 100,000 endpoints against the real
//! kernel (root only; otherwise the test says why and passes): right
//! after a full sync it finds nothing (no false difference at scale), and
//! one check takes well under a second on each datapath (the daemon runs
//! it every `--sync-period`); on nftables a deleted element is then found
//! and repaired. (Changes by hand on both datapaths, through the daemon,
//! are the e2e `drift-*` scenarios.)
//!
//! A drift check runs beside the applies: on nftables, a one-endpoint
//! change published while a check runs is programmed in the time of a
//! partial sync, not after the check, and is not taken for drift.
//!
//! nftables runs in a network namespace of its own; eBPF attaches to a
//! cgroup and pins under a bpffs directory made for the test, both removed
//! at the end.

#[path = "../benches/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebpf_kube_proxy::apply::{self, Applier};
use ebpf_kube_proxy::datapath::ebpf::{self, loader, EbpfConfig, EbpfDatapath};
use ebpf_kube_proxy::datapath::nft::batch::{Batch, Element, Family};
use ebpf_kube_proxy::datapath::nft::drift::{self, ElementData};
use ebpf_kube_proxy::datapath::nft::expr::{key_bytes, KeyPart};
use ebpf_kube_proxy::datapath::nft::rules::{self, TABLE};
use ebpf_kube_proxy::datapath::nft::NftDatapath;
use ebpf_kube_proxy::datapath::{DriftKind, ProxyMode};
use ebpf_kube_proxy::model::{compute, LocalState};
use ebpf_kube_proxy::snapshot::{snapshot_channel, Snapshot};
use ebpf_kube_proxy::status::{Status, StatusOptions};

/// What one check may take at this size: about 0.4 s in a release build
/// on a busy 2-core machine, 1.3 s unoptimized.
const BUDGET: Duration = if cfg!(debug_assertions) {
    Duration::from_secs(5)
} else {
    Duration::from_secs(1)
};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn state() -> Arc<LocalState> {
    Arc::new(compute(&common::cluster(), &common::node()))
}

/// Runs one check after the full sync: none found, within [`BUDGET`].
fn timed_clean_check(dp: &mut Applier, what: &str) {
    let started = Instant::now();
    let drifts = dp.verify().expect("verify");
    let took = started.elapsed();
    println!(
        "{what}: drift check at {} services took {:.1} ms",
        common::SERVICES,
        took.as_secs_f64() * 1e3
    );
    assert_eq!(drifts, vec![], "{what}: drift right after a full sync");
    assert!(took < BUDGET, "{what}: the check took {took:?}");
}

#[test]
fn nftables_check_at_10k_services_is_clean_fast_and_finds_a_deleted_element() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let full = state();
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: unshare only moves this scoped test thread into a
            // fresh network namespace; the host's rules are never seen.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
            let mut dp = Applier::new(Box::new(NftDatapath::open(Vec::new()).expect("open")));
            dp.apply(&full).expect("full sync");
            timed_clean_check(&mut dp, "nftables");

            // The first service's ClusterIP element, deleted by hand.
            let svc = &full.services[0].service;
            // So is its first endpoint.
            let frontend = [
                KeyPart::Addr(std::net::IpAddr::V4(svc.cluster_ips.v4()[0])),
                KeyPart::Proto(6),
                KeyPart::Port(svc.ports[0].port),
            ];
            let mut b = Batch::new();
            for (map, key) in [
                (rules::SERVICE_IPS, key_bytes(&frontend)),
                (
                    rules::INTERNAL_ENDPOINTS,
                    key_bytes(&[&frontend[..], &[KeyPart::Mark(0)]].concat()),
                ),
            ] {
                let elem = Element {
                    key,
                    verdict: None,
                    data: None,
                };
                b.delete_elements(
                    Family::V4.nfproto_u8(),
                    TABLE,
                    map,
                    &[elem],
                    "delete by hand".into(),
                );
            }
            b.commit().expect("delete the elements");
            let drifts = dp.verify().expect("verify");
            assert_eq!(drifts.len(), 2, "{drifts:#?}");
            for d in &drifts {
                assert_eq!(d.kind, DriftKind::Element);
                assert_eq!(d.service.as_deref(), Some(&*svc.key.to_string()));
            }
            assert!(
                drifts[0].object.ends_with("internal-endpoints")
                    && drifts[0].key.ends_with(" . 0")
                    && drifts[0].expected.ends_with(" . 8080"),
                "{drifts:#?}"
            );
            // The full sync that follows repairs it.
            dp.apply(&full).expect("repair");
            assert_eq!(dp.verify().expect("verify"), vec![]);
        })
        .join()
        .unwrap()
    });
}

/// `full` with the last endpoint of its first service moved to `to`
/// (every other service shared).
fn one_endpoint_moved(full: &LocalState, to: std::net::IpAddr) -> LocalState {
    let mut next = full.clone();
    let mut se = (*next.services[0]).clone();
    se.endpoints.last_mut().expect("an endpoint").ip = to;
    next.services[0] = Arc::new(se);
    next
}

/// The sum of `ebpf_kube_proxy_datapath_drift_total` over its kinds.
fn drift_total(status: &Status) -> f64 {
    let text = String::from_utf8(status.metrics().encode_all()).unwrap();
    assert!(
        text.contains("ebpf_kube_proxy_datapath_drift_total{"),
        "{text}"
    );
    text.lines()
        .filter(|l| l.starts_with("ebpf_kube_proxy_datapath_drift_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn nftables_change_during_a_drift_check_is_programmed_at_once_and_is_not_drift() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let full = state();
    let moved_to: std::net::IpAddr = "10.250.0.1".parse().unwrap();
    let next = Arc::new(one_endpoint_moved(&full, moved_to));
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: unshare only moves this scoped test thread (and the
            // threads it starts) into a fresh network namespace.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
            // How long one check takes here, in place.
            let mut applier = Applier::new(Box::new(NftDatapath::open(Vec::new()).expect("open")));
            applier.apply(&full).expect("full sync");
            let started = Instant::now();
            assert_eq!(applier.verify().expect("verify"), vec![]);
            let check = started.elapsed();
            println!(
                "nftables: one drift check at {} services: {check:?}",
                common::SERVICES
            );
            assert!(
                check >= Duration::from_millis(300),
                "a check this quick ({check:?}) cannot tell a change that waited for it"
            );
            // The coordinator runs on the runtime's workers; this thread
            // publishes and watches, so a coordinator that blocks does not
            // stop the clock.
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let status = Arc::new(
                Status::new(StatusOptions {
                    sync_period: Duration::from_secs(3600),
                    requested_mode: ProxyMode::Nftables,
                    active_mode: ProxyMode::Nftables,
                    source: "file",
                    resources: &["services"],
                    families: vec![],
                    flags: vec![],
                })
                .unwrap(),
            );
            let rev = || status.metrics().datapath_revision.get();
            let (tx, rx) = snapshot_channel();
            let (stop, checks) = (
                tokio_util::sync::CancellationToken::new(),
                Arc::new(tokio::sync::Notify::new()),
            );
            let task = rt.spawn(apply::run(
                applier,
                rx,
                stop.clone(),
                status.clone(),
                Duration::from_secs(3600),
                checks.clone(),
                Arc::new(tokio::sync::Notify::new()),
            ));
            tx.send_replace(Arc::new(Snapshot {
                rev: 1,
                state: full.clone(),
                changed: None,
            }));
            // Bounded: 60 s.
            for _ in 0..3000 {
                if rev() == 1 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            assert_eq!(rev(), 1, "the first full sync");

            // A check (SIGHUP), and while it runs one endpoint moves.
            checks.notify_one();
            std::thread::sleep(Duration::from_millis(50));
            let published = Instant::now();
            tx.send_replace(Arc::new(Snapshot {
                rev: 2,
                state: next.clone(),
                changed: Some(vec![next.services[0].service.key.clone()].into()),
            }));
            // Bounded: 30 s.
            for _ in 0..30_000 {
                if rev() == 2 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            let latency = published.elapsed();
            println!(
                "nftables: one endpoint moved during a drift check: programmed after {latency:?}"
            );
            assert_eq!(rev(), 2);
            assert!(
                latency < check / 3,
                "the change waited {latency:?} for a drift check of {check:?}"
            );
            // In the kernel: the frontend's last slot is the new address.
            let listed = [rules::INTERNAL_ENDPOINTS].into_iter().collect();
            let (found, _) = drift::read(Family::V4, &listed)
                .expect("read back")
                .expect("the table");
            let value = key_bytes(&[KeyPart::Addr(moved_to), KeyPart::Port(8080)]);
            assert!(
                found
                    .elements
                    .values()
                    .any(|d| *d == ElementData::Value(value.clone())),
                "{moved_to} is not among the endpoints"
            );

            // The check (and one more, should it look again) ends without
            // taking the change for drift.
            std::thread::sleep(check * 3);
            assert_eq!(drift_total(&status), 0.0, "the change was taken for drift");
            stop.cancel();
            rt.block_on(task).unwrap();
        })
        .join()
        .unwrap()
    });
}

/// A cgroup and a bpffs directory of the test's own, removed on drop.
struct EbpfPlace {
    cgroup: PathBuf,
    bpffs: PathBuf,
}

impl Drop for EbpfPlace {
    fn drop(&mut self) {
        let _ = loader::cleanup(&self.bpffs);
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

#[test]
fn ebpf_check_at_10k_services_is_clean_and_fast() {
    if !is_root() || !ebpf::object_embedded() {
        eprintln!("skipped: needs root and the eBPF object (cargo xtask build-ebpf --release)");
        return;
    }
    let id = std::process::id();
    let place = EbpfPlace {
        cgroup: test_support::cgroup2_root()
            .expect("cgroup v2")
            .join(format!("ebpf-kube-proxy-drift-{id}")),
        bpffs: PathBuf::from(format!("/sys/fs/bpf/ebpf-kube-proxy-drift-{id}")),
    };
    std::fs::create_dir_all(&place.cgroup).expect("test cgroup");
    let dp = EbpfDatapath::open(&EbpfConfig {
        bpffs_root: place.bpffs.clone(),
        cgroup_path: Some(place.cgroup.clone()),
        map_size: ebpf::generation::DEFAULT_MAP_SIZE,
        // No node address is in 0.0.0.0/32: the tc programs attach to no
        // interface of the machine (this measures the socket hooks).
        nodeport_addresses: vec!["0.0.0.0/32".parse().unwrap()],
    })
    .expect("open the eBPF datapath");
    let mut dp = Applier::new(Box::new(dp));
    dp.apply(&state()).expect("full sync");
    timed_clean_check(&mut dp, "ebpf");
    drop(dp);
    drop(place);
}
