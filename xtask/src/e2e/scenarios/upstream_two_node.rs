//! Upstream tests that need both nodes.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use super::two_node::{at, http_get, slice, two_nodes, READY};
use super::*;
use crate::e2e::bed::{NODE1, NODE2};

/// A LoadBalancer service whose only endpoint is on node 2, its
/// externalTrafficPolicy changed Local → Cluster → Local:
/// * Local: node 1's health-check node port answers 503 (no local
///   endpoint); outside clients are served on node 2's NodePort and not on
///   node 1's; the node's own client (a hostNetwork process on node 1) is
///   served on node 1's NodePort, as kube-proxy treats traffic from the
///   node as Cluster;
/// * Cluster: the health-check node port stops answering; outside clients
///   are served on node 1's NodePort;
/// * Local again: the health-check node port answers again on the same
///   port.
pub(super) fn etp_changes_and_the_nodes_own_client(bed: &mut Bed) -> Result<()> {
    let (_, remote) = two_nodes(bed)?;
    // A LoadBalancer (with no load balancer in front, as upstream runs it
    // without a cloud): only that type gets a health-check node port.
    let local_policy = Svc {
        kind: "LoadBalancer",
        node_ports: &[30190],
        spec: &["externalTrafficPolicy: Local", "healthCheckNodePort: 32190"],
        ..svc("external-local-update", "10.96.1.190")
    };
    let cluster_policy = Svc {
        spec: &["externalTrafficPolicy: Cluster"],
        ..local_policy
    };
    let manifests = |s: &Svc| docs(&[s.yaml(), slice(s, false, &[(&remote, NODE2.name, READY)])]);
    let node1_port = at(NODE1.ip, 30190);
    let node2_port = at(NODE2.ip, 30190);
    let hcnp: SocketAddr = at(NODE1.ip, 32190).parse()?;
    let outside = bed.outside_netns.clone();
    let expect_hcnp = |bed: &Bed, wanted: Option<u16>, what: &str| -> Result<()> {
        let started = Instant::now();
        loop {
            let got = http_get(bed, hcnp);
            let ok = match (&got, wanted) {
                (Ok((code, _)), Some(w)) => *code == w,
                (Err(_), None) => true,
                _ => false,
            };
            if ok {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(5) {
                bail!("{what}: health-check node port {hcnp}: expected {wanted:?}, got {got:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };

    bed.apply_manifests(&manifests(&local_policy))?;
    wait_served_from_outside(bed, &node2_port).context("Local: node 2's NodePort from outside")?;
    expect_hcnp(bed, Some(503), "Local")?;
    let r = request_from(bed, Some(&outside), "tcp", &node1_port, 3, DROP_TIMEOUT)?;
    ensure!(
        r.ok_count() == 0,
        "Local: node 1 (no local endpoint) served an outside client on {node1_port}"
    );
    let r = request_from(bed, None, "tcp", &node1_port, 5, CLIENT_TIMEOUT)?;
    ensure!(
        r.ok_count() == 5,
        "Local: the node's own client to {node1_port} (endpoint only on node 2): {} of 5 served, e.g. {:?}",
        r.ok_count(),
        r.errors.first()
    );

    bed.apply_manifests(&manifests(&cluster_policy))?;
    wait_served_from_outside(bed, &node1_port)
        .context("Cluster: node 1's NodePort from outside")?;
    expect_hcnp(bed, None, "Cluster")?;

    bed.apply_manifests(&manifests(&local_policy))?;
    expect_hcnp(bed, Some(503), "Local again")
}
