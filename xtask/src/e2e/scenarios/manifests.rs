//! Manifests the scenarios write: Services (the shared builder of
//! `test_support::manifests`) and EndpointSlices of the bed's pods.

use anyhow::Result;
pub(super) use test_support::manifests::{docs, Svc};
use test_support::manifests::{Endpoint, PortSpec};

use super::Bed;

pub(super) fn service_yaml(s: &Svc) -> String {
    s.yaml()
}

/// One slice of `svc` with the given pods (index into bed.pods, node name).
pub(super) fn slice_yaml(bed: &Bed, svc: &Svc, v6: bool, members: &[(usize, &str)]) -> String {
    let endpoints: Vec<Endpoint> = members
        .iter()
        .map(|(i, node)| {
            let pod = &bed.pods[*i];
            Endpoint {
                pod: Some(pod.name.clone()),
                ..Endpoint::ready(if v6 { &pod.ipv6 } else { &pod.ipv4 }, node)
            }
        })
        .collect();
    test_support::manifests::slice_yaml(svc, if v6 { "v6" } else { "v4" }, v6, &endpoints)
}

/// Writes `svc` and one EndpointSlice of it with `members` as the
/// scenario's manifests.
pub(super) fn apply_service(
    bed: &Bed,
    svc: &Svc,
    v6: bool,
    members: &[(usize, &str)],
) -> Result<()> {
    bed.apply_manifests(&docs(&[
        service_yaml(svc),
        slice_yaml(bed, svc, v6, members),
    ]))
}

/// A Service of the e2e namespace with the usual http port.
pub(super) const fn svc<'a>(name: &'a str, cluster_ip: &'a str) -> Svc<'a> {
    Svc::new("e2e", name, cluster_ip)
}

/// TCP 80 → 8080 and UDP 53 → 5353 (both served by every netexec).
pub(super) const TCP_AND_UDP: &[PortSpec] = &[("http", "TCP", 80, 8080), ("dns", "UDP", 53, 5353)];

pub(super) const WEB: Svc = svc("web", "10.96.0.10");

/// The three pods of node 1, only the first labelled as on node 1: for
/// scenarios about which endpoints are local (topology, eTP/iTP Local).
pub(super) fn three_pods() -> [(usize, &'static str); 3] {
    [(0, "node-1"), (1, "node-2"), (2, "node-3")]
}

/// The three pods labelled as on node 1, where they are: for traffic from
/// outside with eTP=Cluster, which a datapath forwards to an endpoint on
/// another node differently (SNAT towards that node), so the labels must
/// match where the packets really go.
pub(super) fn three_pods_on_node1() -> [(usize, &'static str); 3] {
    [(0, "node-1"), (1, "node-1"), (2, "node-1")]
}
