//! Initial sync at scale from the fake API server. In a test binary of its
//! own so that no other daemon of the same run competes for the two cores
//! while the time is taken.

mod common;

use std::time::{Duration, Instant};

use common::fake_apiserver::{service_object as service, slice_object as slice, FakeApiServer};
use common::Daemon;
use ebpf_kube_proxy::localnet::client;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_services_with_ten_thousand_endpoints_sync_within_two_seconds() {
    let api = FakeApiServer::start().await;
    for i in 0..1000u32 {
        let name = format!("svc-{i:04}");
        api.apply(service(
            "bulk",
            &name,
            &format!("10.96.{}.{}", i / 250, i % 250 + 1),
        ));
        let ips: Vec<String> = (0..10u32)
            .map(|j| format!("10.{}.{}.{}", 100 + i / 250, i % 250, j + 1))
            .collect();
        api.apply(slice("bulk", &name, &ips));
    }
    api.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}));
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let d = Daemon::start_kube(dir, &kubeconfig, &[]);
    let mut c = d.tcp().await;
    let s = tokio::time::timeout(Duration::from_secs(10), client::next(&mut c, 0, 0))
        .await
        .expect("a state within 10 s")
        .unwrap();
    let took = started.elapsed();
    assert_eq!(
        s.services.len(),
        1000,
        "never partial: the first state is complete"
    );
    let endpoints: usize = s.services.iter().map(|x| x.endpoints.len()).sum();
    assert_eq!(endpoints, 10_000);
    assert!(took < Duration::from_secs(2), "initial sync took {took:?}");
}

/// A first list longer than the chunks the source passes on while it
/// reads: its continue token expires two pages in (after the first chunk
/// reached the model), a service on the first page is deleted meanwhile,
/// and the list starts over. The first state is the whole second list,
/// without the deleted service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_list_restarted_part_way_drops_what_vanished_meanwhile() {
    let api = FakeApiServer::start().await;
    for i in 0..2500u32 {
        let name = format!("svc-{i:04}");
        api.apply(service(
            "bulk",
            &name,
            &format!("10.96.{}.{}", i / 250, i % 250 + 1),
        ));
    }
    api.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}));
    // Pages of 500: the third page's request is the second continued one.
    api.expire_continue(2, ("Service", "bulk", "svc-0007"));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let d = Daemon::start_kube(dir, &kubeconfig, &[]);
    let mut c = d.tcp().await;
    let s = tokio::time::timeout(Duration::from_secs(20), client::next(&mut c, 0, 0))
        .await
        .expect("a state within 20 s")
        .unwrap();
    let names: std::collections::BTreeSet<String> = s
        .services
        .iter()
        .filter_map(|x| x.service.as_ref())
        .map(|x| x.name.clone())
        .collect();
    assert_eq!(names.len(), 2499, "the whole second list, nothing more");
    assert!(!names.contains("svc-0007"), "the deleted service is gone");
    assert!(names.contains("svc-0006") && names.contains("svc-2499"));
}
