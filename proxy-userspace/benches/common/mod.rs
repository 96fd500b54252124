//! What the benchmarks share: the 10k-service cluster they measure and
//! the way they time and print. Each bench uses part of it.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use ebpf_kube_proxy::model::*;

pub const SERVICES: usize = 10_000;
pub const ENDPOINTS_PER_SERVICE: usize = 10;
pub const RUNS: usize = 7;

pub fn cluster() -> ClusterState {
    cluster_of(SERVICES, ENDPOINTS_PER_SERVICE)
}

/// `services` services with `endpoints_per_service` endpoints each (the
/// first of each not ready).
pub fn cluster_of(services: usize, endpoints_per_service: usize) -> ClusterState {
    let mut c = ClusterState::default();
    c.nodes.insert(
        "node-1".into(),
        Node {
            name: "node-1".into(),
            labels: Labels::from_iter([(LABEL_ZONE, "zone-a")]),
            deleting: false,
            taint_keys: vec![],
            addresses: vec![],
        },
    );
    for i in 0..services {
        let key = ObjectKey::new(format!("ns-{}", i % 50), format!("svc-{i}"));
        let vip = Ipv4Addr::from(0x0a60_0000u32 + i as u32);
        c.services.insert(
            key.clone(),
            Box::new(Service {
                key: key.clone(),
                uid: format!("uid-{i}").into(),
                labels: Labels::default(),
                created: None,
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
            }),
        );
        let endpoints = (0..endpoints_per_service)
            .map(|j| {
                let n = (i * endpoints_per_service + j) as u32;
                Endpoint {
                    ip: IpAddr::V4(Ipv4Addr::from(0x0af4_0000u32 + n)),
                    hostname: None,
                    node_name: Some(intern(&format!("node-{}", j % 5 + 1))),
                    zone: Some(intern(&format!(
                        "zone-{}",
                        if j % 2 == 0 { 'a' } else { 'b' }
                    ))),
                    ready: Some(j != 0),
                    serving: None,
                    terminating: None,
                    hints: None,
                    target_ref: None,
                }
            })
            .collect();
        let slice_key = ObjectKey::new(key.namespace.clone(), format!("svc-{i}-abcde"));
        c.endpoint_slices.insert(
            slice_key.clone(),
            Box::new(EndpointSlice {
                key: slice_key,
                labels: Labels::from_iter([(LABEL_SERVICE_NAME, key.name.as_str())]),
                address_type: AddressType::Ipv4,
                ports: vec![EndpointSlicePort {
                    name: "http".into(),
                    protocol: Protocol::Tcp,
                    port: Some(8080),
                    app_protocol: None,
                }],
                endpoints,
                last_change_trigger_time: None,
            }),
        );
    }
    c
}

/// Median of `RUNS` timings of `f`.
pub fn median<T>(mut f: impl FnMut() -> T) -> Duration {
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

pub fn report(
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

/// The node the benchmarks compute for.
pub fn node() -> NodeContext {
    NodeContext {
        node_name: "node-1".into(),
        synthesize_hints: false,
    }
}
