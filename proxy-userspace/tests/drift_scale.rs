//! The drift check at 10,000 services / 100,000 endpoints against the real
//! kernel (root only; otherwise the test says why and passes): right
//! after a full sync it finds nothing (no false difference at scale), and
//! one check takes well under a second on each datapath (the daemon runs
//! it every `--sync-period`); on nftables a deleted element is then found
//! and repaired. (Changes by hand on both datapaths, through the daemon,
//! are the e2e `drift-*` scenarios.)
//!
//! nftables runs in a network namespace of its own; eBPF attaches to a
//! cgroup and pins under a bpffs directory made for the test, both removed
//! at the end.

#[path = "../benches/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebpf_kube_proxy::apply::Applier;
use ebpf_kube_proxy::datapath::ebpf::{self, loader, EbpfConfig, EbpfDatapath};
use ebpf_kube_proxy::datapath::nft::batch::{Batch, Element, Family};
use ebpf_kube_proxy::datapath::nft::expr::{key_bytes, KeyPart};
use ebpf_kube_proxy::datapath::nft::rules::{self, TABLE};
use ebpf_kube_proxy::datapath::nft::NftDatapath;
use ebpf_kube_proxy::datapath::DriftKind;
use ebpf_kube_proxy::model::{compute, LocalState};

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
