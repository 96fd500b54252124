//! Initial sync at scale from the fake API server. In a test binary of its
//! own so that no other daemon of the same run competes for the two cores
//! while the time is taken.

mod common;

use std::time::{Duration, Instant};

use common::fake_apiserver::{service_object as service, slice_object as slice, FakeApiServer};
use common::Daemon;
use ebpf_kube_proxy::localnet::client;
use serde_json::json;

/// Services `svc-0000` … of namespace `bulk`, 250 per /24 from 10.96.0.1;
/// `with_slice(i, name)` may add each one's EndpointSlice.
fn bulk_services(api: &FakeApiServer, count: u32, with_slice: impl Fn(u32, &str)) {
    for i in 0..count {
        let name = format!("svc-{i:04}");
        api.apply(service(
            "bulk",
            &name,
            &format!("10.96.{}.{}", i / 250, i % 250 + 1),
        ));
        with_slice(i, &name);
    }
    api.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}));
}

/// A daemon on `api` and its first published state (within `wait`).
async fn first_state(api: &FakeApiServer, wait: Duration) -> (Daemon, client::State) {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let d = Daemon::start_kube(dir, &kubeconfig, &[]);
    let mut c = d.tcp().await;
    let s = tokio::time::timeout(wait, client::next(&mut c, 0, 0))
        .await
        .unwrap_or_else(|_| panic!("a state within {wait:?}"))
        .unwrap();
    (d, s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_services_with_ten_thousand_endpoints_sync_within_two_seconds() {
    let api = FakeApiServer::start().await;
    bulk_services(&api, 1000, |i, name| {
        let ips: Vec<String> = (0..10u32)
            .map(|j| format!("10.{}.{}.{}", 100 + i / 250, i % 250, j + 1))
            .collect();
        api.apply(slice("bulk", name, &ips));
    });
    let started = Instant::now();
    let (_d, s) = first_state(&api, Duration::from_secs(10)).await;
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
    bulk_services(&api, 2500, |_, _| {});
    // Pages of 500: the third page's request is the second continued one.
    api.expire_continue(2, ("Service", "bulk", "svc-0007"));
    let (_d, s) = first_state(&api, Duration::from_secs(20)).await;
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
