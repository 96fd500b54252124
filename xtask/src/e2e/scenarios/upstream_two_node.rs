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

/// Upstream's terminating fallback through a NodePort: a NodePort service
/// whose only endpoint (pod1, node 1) terminates but still serves. The
/// node-1 pod (pod3) and the node-2 pod (n2pod1) both connect to node 1's
/// NodePort, before and after the endpoint turns terminating: with
/// externalTrafficPolicy=Cluster both are served by pod1 throughout.
pub(super) fn etp_cluster_terminating_fallback(bed: &mut Bed) -> Result<()> {
    etp_terminating_fallback(bed, false)
}

/// The same with externalTrafficPolicy=Local: while pod1 terminates, the
/// node-1 pod and the node-2 pod are still served through node 1's
/// NodePort (the endpoint is local there; the node-1 pod's own node treats
/// it as Cluster), and the node-1 pod is not served through node 2's
/// NodePort (it arrives there from outside, and node 2 has no local
/// endpoint).
pub(super) fn etp_local_terminating_fallback(bed: &mut Bed) -> Result<()> {
    etp_terminating_fallback(bed, true)
}

fn etp_terminating_fallback(bed: &mut Bed, local: bool) -> Result<()> {
    let (endpoint, remote) = two_nodes(bed)?;
    let (name, cluster_ip, marker_ip, node_port, policy) = if local {
        (
            "etp-local-terminating",
            "10.96.1.199",
            "10.96.1.201",
            30199,
            "externalTrafficPolicy: Local",
        )
    } else {
        (
            "etp-cluster-terminating",
            "10.96.1.198",
            "10.96.1.200",
            30198,
            "externalTrafficPolicy: Cluster",
        )
    };
    let spec = [policy];
    let ports = [node_port];
    let s = Svc {
        kind: "NodePort",
        node_ports: &ports,
        spec: &spec,
        ..svc(name, cluster_ip)
    };
    // Nothing on the wire tells a terminating endpoint from a ready one:
    // a second service written with the change (in the same file, so read
    // in the same sync) shows when each node's daemon has programmed it.
    let marker_name = format!("{name}-marker");
    let marker = svc(&marker_name, marker_ip);
    let marker_at = at(marker_ip, 80);
    let manifests = |conditions: &str, with_marker: bool| {
        let mut d = vec![
            s.yaml(),
            slice(&s, false, &[(&endpoint, NODE1.name, conditions)]),
        ];
        if with_marker {
            d.push(marker.yaml());
            d.push(slice(&marker, false, &[(&endpoint, NODE1.name, READY)]));
        }
        docs(&d)
    };
    // pausePod0 of upstream: a pod on the endpoint's node; pausePod1: one
    // on the other node.
    let node1_client = bed.pods[2].netns.clone();
    let node2_client = remote.netns.clone();
    let node1_port = at(NODE1.ip, node_port);
    let node2_port = at(NODE2.ip, node_port);
    let served = |bed: &Bed, client: &str, what: &str| -> Result<()> {
        let r = request_from(bed, Some(client), "tcp", &node1_port, 10, CLIENT_TIMEOUT)?;
        let pods: Vec<String> = r.pods().into_keys().collect();
        ensure!(
            r.ok_count() == 10 && pods == [endpoint.name.clone()],
            "{what}: {node1_port} from {client}: {} of 10 answered, by {pods:?} (expected {}), e.g. {:?}",
            r.ok_count(),
            endpoint.name,
            r.errors.first()
        );
        Ok(())
    };
    let programmed = |bed: &Bed, target: &str, what: &str| -> Result<()> {
        for client in [&node1_client, &node2_client] {
            wait_until_served_from(
                bed,
                Some(client),
                "tcp",
                target,
                Duration::from_secs(5),
                CLIENT_TIMEOUT,
            )
            .with_context(|| format!("{what}: {target} from {client}"))?;
        }
        Ok(())
    };

    bed.apply_manifests(&manifests(READY, false))?;
    programmed(bed, &node1_port, "endpoint ready")?;
    served(bed, &node1_client, "endpoint ready")?;
    served(bed, &node2_client, "endpoint ready")?;

    bed.apply_manifests(&manifests(super::two_node::TERMINATING, true))?;
    programmed(bed, &marker_at, "endpoint terminating")?;
    served(bed, &node1_client, "endpoint terminating")?;
    served(bed, &node2_client, "endpoint terminating")?;
    if local {
        let r = request_from(
            bed,
            Some(&node1_client),
            "tcp",
            &node2_port,
            3,
            DROP_TIMEOUT,
        )?;
        ensure!(
            r.ok_count() == 0,
            "endpoint terminating: node 2 (no local endpoint) served {node2_port} to a pod on node 1: {} of 3, by {:?}",
            r.ok_count(),
            r.pods()
        );
    }
    Ok(())
}
