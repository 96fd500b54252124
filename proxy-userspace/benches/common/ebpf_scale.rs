//! Synthetic node states for the eBPF datapath at scale, shared by the
//! `ebpfsync` bench and the `ebpf_capacity` kernel test: `services` ClusterIP
//! services with one TCP port each and `endpoints` distinct backends spread
//! evenly over them (VIPs from 10.0.0.0, backends from 100.0.0.0, port 8080).
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use ebpf_kube_proxy::model::{testing, IpSet, LocalEndpoint, LocalState, ServiceEndpoints};

pub const BACKEND_PORT: u16 = 8080;

/// The VIP of service `i`.
pub fn vip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(0x0a00_0000u32 + i as u32)
}

/// One ClusterIP service on `vip:80` with these backends on `port`.
pub fn service(i: usize, backends: &[IpAddr], port: u16) -> ServiceEndpoints {
    let mut s = testing::service(&format!("ns-{}", i % 100), &format!("svc-{i}"), &[])
        .with_endpoints(backends.iter().map(|ip| LocalEndpoint {
            node_name: "node-2".into(),
            ..testing::endpoint_at(*ip, port, testing::ALL_SCOPES)
        }));
    s.service.uid = Default::default();
    s.service.cluster_ips = IpSet::from_ips([IpAddr::V4(vip(i))].iter());
    s.service.ports[0].target_port = port;
    s
}

/// Backend `n` of the synthetic cluster.
pub fn backend(n: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x6400_0000u32 + n as u32))
}

/// Service `i` of [`state`], with its backends `per` at a time.
pub fn nth_service(i: usize, per: usize) -> ServiceEndpoints {
    let backends: Vec<IpAddr> = (0..per).map(|j| backend(i * per + j)).collect();
    service(i, &backends, BACKEND_PORT)
}

/// `services` services with `endpoints` backends in all.
pub fn state(services: usize, endpoints: usize) -> LocalState {
    let per = endpoints / services.max(1);
    LocalState::new((0..services).map(|i| nth_service(i, per)))
}

/// `state` with service `i`'s backends replaced (kept sorted).
pub fn with_service(state: &LocalState, replacement: ServiceEndpoints) -> LocalState {
    let mut next = state.clone();
    match next
        .services
        .binary_search_by(|s| s.service.key.cmp(&replacement.service.key))
    {
        Ok(at) => next.services[at] = Arc::new(replacement),
        Err(at) => next.services.insert(at, Arc::new(replacement)),
    }
    next
}
