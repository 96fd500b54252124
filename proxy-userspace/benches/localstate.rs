//! `cargo xtask bench`: compute() and full-state publishing at 10k services
//! / 100k endpoints, each printed with a ratio against a baseline measured
//! in the same run on the same data:
//!
//! * compute() vs. cloning its input (one pass over the same memory);
//! * a full `Next` over the unix socket vs. prost-encoding and decoding the
//!   same messages in memory (what any gRPC transfer must at least do).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebpf_kube_proxy::localnet::client::{self, Target};
use ebpf_kube_proxy::localnet::convert;
use ebpf_kube_proxy::localnet::server::{Listeners, LocalnetService};
use ebpf_kube_proxy::model::*;
use ebpf_kube_proxy::sync::{snapshot_channel, Snapshot};
use prost::Message;
use tokio_util::sync::CancellationToken;

const SERVICES: usize = 10_000;
const ENDPOINTS_PER_SERVICE: usize = 10;
const RUNS: usize = 7;

fn cluster() -> ClusterState {
    let mut c = ClusterState::default();
    c.nodes.insert(
        "node-1".into(),
        Node {
            name: "node-1".into(),
            labels: BTreeMap::from([(LABEL_ZONE.to_owned(), "zone-a".to_owned())]),
            deleting: false,
            taint_keys: vec![],
            addresses: vec![],
        },
    );
    for i in 0..SERVICES {
        let key = ObjectKey::new(format!("ns-{}", i % 50), format!("svc-{i}"));
        let vip = Ipv4Addr::from(0x0a60_0000u32 + i as u32);
        c.services.insert(
            key.clone(),
            Service {
                key: key.clone(),
                uid: format!("uid-{i}"),
                labels: BTreeMap::new(),
                service_type: ServiceType::ClusterIp,
                cluster_ips: vec![IpAddr::V4(vip)],
                external_ips: vec![],
                load_balancer_ingress: vec![],
                ports: vec![ServicePort {
                    name: "http".into(),
                    protocol: Protocol::Tcp,
                    port: 80,
                    node_port: 0,
                    target_port: TargetPort::Name("http".into()),
                    app_protocol: None,
                }],
                internal_traffic_policy: TrafficPolicy::Cluster,
                external_traffic_policy: TrafficPolicy::Cluster,
                session_affinity_timeout: None,
                health_check_node_port: 0,
                traffic_distribution: None,
                load_balancer_source_ranges: vec![],
            },
        );
        let endpoints = (0..ENDPOINTS_PER_SERVICE)
            .map(|j| {
                let n = (i * ENDPOINTS_PER_SERVICE + j) as u32;
                Endpoint {
                    ip: IpAddr::V4(Ipv4Addr::from(0x0af4_0000u32 + n)),
                    hostname: None,
                    node_name: Some(format!("node-{}", j % 5 + 1)),
                    zone: Some(format!("zone-{}", if j % 2 == 0 { 'a' } else { 'b' })),
                    ready: Some(j != 0),
                    serving: None,
                    terminating: None,
                    hints_for_zones: vec![],
                    hints_for_nodes: vec![],
                    target_ref: None,
                }
            })
            .collect();
        let slice_key = ObjectKey::new(key.namespace.clone(), format!("svc-{i}-abcde"));
        c.endpoint_slices.insert(
            slice_key.clone(),
            EndpointSlice {
                key: slice_key,
                labels: BTreeMap::from([(LABEL_SERVICE_NAME.to_owned(), key.name.clone())]),
                address_type: AddressType::Ipv4,
                ports: vec![EndpointSlicePort {
                    name: "http".into(),
                    protocol: Protocol::Tcp,
                    port: Some(8080),
                    app_protocol: None,
                }],
                endpoints,
                last_change_trigger_time: None,
            },
        );
    }
    c
}

/// Median of `RUNS` timings of `f`.
fn median<T>(mut f: impl FnMut() -> T) -> Duration {
    let mut times: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed()
        })
        .collect();
    times.sort();
    times[RUNS / 2]
}

fn report(
    name: &str,
    measured: Duration,
    baseline_name: &str,
    baseline: Duration,
    target: Duration,
) {
    println!(
        "{name:<44} {:>9.1} ms   {:>6.2}x {baseline_name} ({:.1} ms)   target <= {} ms: {}",
        measured.as_secs_f64() * 1e3,
        measured.as_secs_f64() / baseline.as_secs_f64(),
        baseline.as_secs_f64() * 1e3,
        target.as_millis(),
        if measured <= target { "met" } else { "MISSED" }
    );
}

fn main() {
    let cluster = cluster();
    let node = NodeContext {
        node_name: "node-1".into(),
        synthesize_hints: false,
    };
    println!(
        "{SERVICES} services, {} endpoints, median of {RUNS} runs",
        SERVICES * ENDPOINTS_PER_SERVICE
    );

    let clone = median(|| cluster.clone());
    let compute_time = median(|| compute(&cluster, &node));
    report(
        "compute()",
        compute_time,
        "clone of the input",
        clone,
        Duration::from_millis(200),
    );

    let state = Arc::new(compute(&cluster, &node));
    let messages: Vec<_> = state
        .services
        .iter()
        .map(convert::service_endpoints)
        .collect();
    let encode_decode = median(|| {
        messages
            .iter()
            .map(|m| {
                let bytes = m.encode_to_vec();
                proto::localnet::v1::ServiceEndpoints::decode(bytes.as_slice()).map(|_| bytes.len())
            })
            .sum::<Result<usize, _>>()
    });

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let publish = rt.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("localnet.sock");
        let (tx, rx) = snapshot_channel();
        let shutdown = CancellationToken::new();
        let listeners = Listeners::bind(None, Some(&socket)).await.expect("bind");
        let service = LocalnetService::new(1, rx, shutdown.clone());
        let server = tokio::spawn(listeners.serve(service, shutdown.clone()));
        tx.send_replace(Arc::new(Snapshot {
            rev: 1,
            state: state.clone(),
        }));
        let mut c = client::connect(&Target::Unix(socket))
            .await
            .expect("connect");
        // Warm-up: waits for the frame conversion and the connection.
        let first = client::next(&mut c, 0, 0).await.expect("next");
        assert_eq!(first.services.len(), SERVICES);
        let mut times = Vec::new();
        for _ in 0..RUNS {
            let t = Instant::now();
            let s = client::next(&mut c, 0, 0).await.expect("next");
            times.push(t.elapsed());
            assert_eq!(s.services.len(), SERVICES);
        }
        shutdown.cancel();
        let _ = server.await;
        times.sort();
        times[RUNS / 2]
    });
    report(
        "full state to one client (Next over unix)",
        publish,
        "in-memory encode+decode",
        encode_decode,
        Duration::from_millis(200),
    );
}
