//! More upstream tests: session affinity, EndpointSlices split over
//! several slices, terminating fallback, UDP flows of pod and hostNetwork
//! clients across backend changes, and the Networking granular checks
//! that the others do not cover.

use std::time::Duration;

use anyhow::{ensure, Context, Result};

use super::two_node::{slice, READY, TERMINATING};
use super::upstream_services::{wait_answered_by, wait_not_served};
use super::*;
use crate::e2e::bed::hostnet::HOST_ENDPOINT_NAME;
use crate::e2e::bed::{Pod, NODE1, NODE_EXTERNAL_IP};

/// The exec pod: pod3, on node 1.
fn exec_pod(bed: &Bed) -> String {
    bed.pods[2].netns.clone()
}

/// How many pods answered 30 requests from `netns` to `target`, none
/// failing.
fn pods_answering(bed: &Bed, netns: Option<&str>, target: &str) -> Result<usize> {
    let r = request_from(bed, netns, "tcp", target, 30, CLIENT_TIMEOUT)?;
    ensure!(
        r.errors.is_empty(),
        "{target}: {} of 30 failed, e.g. {:?}",
        r.errors.len(),
        r.errors.first()
    );
    Ok(r.pods().len())
}

const CLIENT_IP: &[&str] = &["sessionAffinity: ClientIP"];
const NO_AFFINITY: &[&str] = &["sessionAffinity: None"];

/// ClientIP affinity through a cluster IP: 30 requests of the exec pod
/// reach one pod.
pub(super) fn affinity_cluster_ip(bed: &mut Bed) -> Result<()> {
    affinity(bed, "", false)
}

/// ClientIP affinity through node 1's NodePort, from the exec pod.
pub(super) fn affinity_node_port(bed: &mut Bed) -> Result<()> {
    affinity(bed, "NodePort", false)
}

/// ClientIP → None (more than one pod answers) → ClientIP (one pod).
pub(super) fn affinity_switch_cluster_ip(bed: &mut Bed) -> Result<()> {
    affinity(bed, "", true)
}

pub(super) fn affinity_switch_node_port(bed: &mut Bed) -> Result<()> {
    affinity(bed, "NodePort", true)
}

fn affinity(bed: &mut Bed, kind: &str, switch: bool) -> Result<()> {
    ensure_daemon(bed)?;
    let with = |spec| Svc {
        kind,
        node_ports: if kind.is_empty() { &[] } else { &[30140] },
        spec,
        ..svc("affinity", "10.96.1.140")
    };
    let target = if kind.is_empty() {
        "10.96.1.140:80".to_owned()
    } else {
        format!("{NODE_EXTERNAL_IP}:30140")
    };
    let client = exec_pod(bed);
    apply_service(bed, &with(CLIENT_IP), false, &three_pods_on_node1())?;
    wait_until_served_from(
        bed,
        Some(&client),
        "tcp",
        &target,
        Duration::from_secs(5),
        CLIENT_TIMEOUT,
    )?;
    let n = pods_answering(bed, Some(&client), &target)?;
    ensure!(n == 1, "ClientIP: 30 requests to {target} reached {n} pods");
    if !switch {
        return Ok(());
    }
    apply_service(bed, &with(NO_AFFINITY), false, &three_pods_on_node1())?;
    let mut spread = false;
    for _ in 0..50 {
        if pods_answering(bed, Some(&client), &target)? > 1 {
            spread = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    ensure!(
        spread,
        "sessionAffinity None: {target} still answered by one pod only"
    );
    apply_service(bed, &with(CLIENT_IP), false, &three_pods_on_node1())?;
    let mut sticky = false;
    for _ in 0..50 {
        if pods_answering(bed, Some(&client), &target)? == 1 {
            sticky = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    ensure!(
        sticky,
        "ClientIP again: {target} still spread over several pods"
    );
    Ok(())
}

/// One service, two EndpointSlices each carrying one of its ports (and
/// one pod): both ports are served, each by its slice's pod.
pub(super) fn slices_with_different_ports(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let ports = [
        ("example-port-1", "TCP", 80, 8080),
        ("example-port-2", "TCP", 81, 8081),
    ];
    let s = Svc {
        ports: &ports,
        ..svc("example-multi-slice", "10.96.1.150")
    };
    let (a, b) = (bed.pods[0].clone(), bed.pods[1].clone());
    let first = Svc {
        ports: &ports[..1],
        ..s
    };
    let second = Svc {
        ports: &ports[1..],
        ..s
    };
    bed.apply_manifests(&docs(&[
        s.yaml(),
        named_slice(&first, "a", &[(&a, NODE1.name, READY)]),
        named_slice(&second, "b", &[(&b, NODE1.name, READY)]),
    ]))?;
    let client = exec_pod(bed);
    wait_answered_by(bed, Some(&client), "tcp", "10.96.1.150:80", &["pod1"])
        .context("port 80 (first slice)")?;
    wait_answered_by(bed, Some(&client), "tcp", "10.96.1.150:81", &["pod2"])
        .context("port 81 (second slice)")
}

/// One service, two EndpointSlices with the same port and different
/// addresses: both addresses are endpoints.
pub(super) fn slices_with_different_addresses(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let s = svc("example-multi-ip", "10.96.1.151");
    let (a, b) = (bed.pods[0].clone(), bed.pods[1].clone());
    bed.apply_manifests(&docs(&[
        s.yaml(),
        named_slice(&s, "a", &[(&a, NODE1.name, READY)]),
        named_slice(&s, "b", &[(&b, NODE1.name, READY)]),
    ]))?;
    wait_answered_by(
        bed,
        Some(&exec_pod(bed)),
        "tcp",
        "10.96.1.151:80",
        &["pod1", "pod2"],
    )
}

/// [`slice`] under its own name suffix, so that two slices of one service
/// can coexist.
fn named_slice(svc: &Svc, suffix: &str, members: &[(&Pod, &str, &str)]) -> String {
    slice(svc, false, members).replacen(
        &format!("name: {}-v4,", svc.name),
        &format!("name: {}-{suffix},", svc.name),
        1,
    )
}

/// With every endpoint terminating (still serving) and none ready, the
/// service keeps serving through them (iTP=Cluster).
pub(super) fn terminating_fallback_cluster(bed: &mut Bed) -> Result<()> {
    terminating_fallback(bed, "internalTrafficPolicy: Cluster", &["pod1", "pod2"])
}

/// iTP=Local: the local terminating endpoint serves; a remote one does
/// not.
pub(super) fn terminating_fallback_local(bed: &mut Bed) -> Result<()> {
    terminating_fallback(bed, "internalTrafficPolicy: Local", &["pod1"])
}

fn terminating_fallback(bed: &mut Bed, policy: &str, expected: &[&str]) -> Result<()> {
    ensure_daemon(bed)?;
    let spec = [policy];
    let s = Svc {
        spec: &spec,
        ..svc("terminating-fallback", "10.96.1.160")
    };
    let (a, b) = (bed.pods[0].clone(), bed.pods[1].clone());
    // pod2 is labelled as on node 2: remote for the iTP=Local case.
    let manifests = |conditions: &str| {
        docs(&[
            s.yaml(),
            slice(
                &s,
                false,
                &[(&a, NODE1.name, conditions), (&b, "node-2", conditions)],
            ),
        ])
    };
    let client = exec_pod(bed);
    bed.apply_manifests(&manifests(READY))?;
    wait_answered_by(bed, Some(&client), "tcp", "10.96.1.160:80", expected).context("ready")?;
    bed.apply_manifests(&manifests(TERMINATING))?;
    std::thread::sleep(Duration::from_millis(500));
    wait_answered_by(bed, Some(&client), "tcp", "10.96.1.160:80", expected)
        .context("all endpoints terminating, still serving")
}

/// iTP=Local with a hostNetwork endpoint on node 1 (and one labelled on
/// node 2): a pod and the node itself reach the node's endpoint only.
pub(super) fn itp_local_to_host_network_endpoint(bed: &mut Bed) -> Result<()> {
    use crate::e2e::bed::hostnet::HOST_TCP_PORT;
    use test_support::manifests::Endpoint;
    ensure_daemon(bed)?;
    bed.host_endpoint()?;
    let ports = [("http", "TCP", 80, HOST_TCP_PORT)];
    let s = Svc {
        ports: &ports,
        spec: &["internalTrafficPolicy: Local"],
        ..svc("itp-local-host", "10.96.1.165")
    };
    let slice = test_support::manifests::slice_yaml(
        &s,
        "v4",
        false,
        &[
            Endpoint::ready(NODE1.ip, NODE1.name),
            Endpoint::ready(crate::e2e::bed::NODE2.ip, "node-2"),
        ],
    );
    bed.apply_manifests(&docs(&[s.yaml(), slice]))?;
    let client = exec_pod(bed);
    for (netns, what) in [
        (Some(client.as_str()), "from a pod"),
        (None, "from the node"),
    ] {
        wait_answered_by(bed, netns, "tcp", "10.96.1.165:80", &[HOST_ENDPOINT_NAME])
            .with_context(|| what.to_owned())?;
    }
    Ok(())
}

/// A UDP client keeping its source port (a pod, or the node as a
/// hostNetwork client) sends to a cluster IP; its endpoint pod1 is
/// replaced by pod2: its last datagrams reach pod2.
pub(super) fn udp_cluster_ip_server_cycles_from_a_pod(bed: &mut Bed) -> Result<()> {
    let client = exec_pod(bed);
    udp_server_cycles(
        bed,
        Some(&client),
        &[],
        (&[(0, "node-1")], &[(1, "node-1")]),
    )
}

/// The same with iTP=Local: the local endpoint is replaced by another
/// local one while a remote one stays.
pub(super) fn udp_cluster_ip_server_cycles_itp_local(bed: &mut Bed) -> Result<()> {
    let client = exec_pod(bed);
    udp_server_cycles(
        bed,
        Some(&client),
        &["internalTrafficPolicy: Local"],
        (
            &[(0, "node-1"), (2, "node-2")],
            &[(1, "node-1"), (2, "node-2")],
        ),
    )
}

/// Slice members: (index into the bed's pods, node label).
type Members<'a> = &'a [(usize, &'a str)];

fn udp_server_cycles(
    bed: &mut Bed,
    netns: Option<&str>,
    spec: &[&str],
    (before, after): (Members, Members),
) -> Result<()> {
    ensure_daemon(bed)?;
    let s = Svc {
        ports: &[("udp", "UDP", 80, 8080)],
        spec,
        ..svc("svc-udp-cycles", "10.96.1.170")
    };
    apply_service(bed, &s, false, before)?;
    wait_until_served_from(
        bed,
        netns,
        "udp",
        "10.96.1.170:80",
        Duration::from_secs(5),
        DROP_TIMEOUT,
    )?;
    let client = udp_client(bed, netns, "10.96.1.170:80", 4000)?;
    std::thread::sleep(Duration::from_millis(1000));
    apply_service(bed, &s, false, after)?;
    let tail = tail_of(client)?;
    let pods: Vec<String> = tail.pods().into_keys().collect();
    ensure!(
        pods == ["pod2"],
        "3 s after pod1 was replaced by pod2, the last answers came from {:?} (errors {:?})",
        tail.pods(),
        tail.errors.first()
    );
    Ok(())
}

/// A UDP client keeping its source port sends to a service whose only
/// endpoint is not ready yet; once it turns ready the client's datagrams
/// reach it (no stale entry blackholes them).
pub(super) fn udp_unready_endpoint_gets_ready(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let s = Svc {
        ports: &[("udp", "UDP", 80, 8080)],
        ..svc("svc-udp-unready", "10.96.1.171")
    };
    let a = bed.pods[0].clone();
    let manifests =
        |conditions: &str| docs(&[s.yaml(), slice(&s, false, &[(&a, NODE1.name, conditions)])]);
    bed.apply_manifests(&manifests("{ready: false}"))?;
    std::thread::sleep(Duration::from_millis(500));
    let client_ns = exec_pod(bed);
    let client = udp_client(bed, Some(&client_ns), "10.96.1.171:80", 4000)?;
    std::thread::sleep(Duration::from_millis(1000));
    bed.apply_manifests(&manifests(READY))?;
    let tail = tail_of(client)?;
    ensure!(
        tail.ok_count() == 10 && tail.pods().contains_key("pod1"),
        "3 s after its endpoint turned ready, the client's last 10 datagrams: {:?} answered, errors {:?}",
        tail.pods(),
        tail.errors.first()
    );
    Ok(())
}

/// An ExternalName service becomes a NodePort service: served on its
/// cluster IP and on node 1's NodePort.
pub(super) fn external_name_to_node_port(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let external = Svc {
        kind: "ExternalName",
        cluster_ip: "\"\"",
        spec: &["externalName: example.com"],
        ..svc("externalname-np", "")
    };
    bed.apply_manifests(&service_yaml(&external))?;
    std::thread::sleep(Duration::from_millis(500));
    let np = Svc {
        kind: "NodePort",
        node_ports: &[30172],
        ..svc("externalname-np", "10.96.1.172")
    };
    apply_service(bed, &np, false, &three_pods_on_node1())?;
    let client = exec_pod(bed);
    let every = ["pod1", "pod2", "pod3"];
    wait_answered_by(bed, Some(&client), "tcp", "10.96.1.172:80", &every).context("cluster IP")?;
    wait_answered_by(
        bed,
        Some(&client),
        "tcp",
        &format!("{NODE_EXTERNAL_IP}:30172"),
        &every,
    )
    .context("node port")
}

/// UDP endpoints removed and added, as "update endpoints: http" for UDP.
pub(super) fn update_endpoints_udp(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let s = Svc {
        ports: &[("udp", "UDP", 90, 5353)],
        ..svc("update-udp", "10.96.1.173")
    };
    let client = exec_pod(bed);
    let all = three_pods();
    apply_service(bed, &s, false, &all)?;
    wait_answered_by(
        bed,
        Some(&client),
        "udp",
        "10.96.1.173:90",
        &["pod1", "pod2", "pod3"],
    )?;
    apply_service(bed, &s, false, &all[..1])?;
    wait_answered_by(bed, Some(&client), "udp", "10.96.1.173:90", &["pod1"])
        .context("two endpoints removed")?;
    apply_service(bed, &s, false, &[])?;
    wait_not_served(bed, Some(&client), "udp", "10.96.1.173:90").context("none left")
}

/// A UDP NodePort from outside, spread over the endpoints.
pub(super) fn basic_node_port_udp(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let s = Svc {
        kind: "NodePort",
        ports: &[("udp", "UDP", 90, 5353)],
        node_ports: &[30174],
        ..svc("nodeport-udp", "10.96.1.174")
    };
    apply_service(bed, &s, false, &three_pods_on_node1())?;
    let outside = bed.outside_netns.clone();
    wait_answered_by(
        bed,
        Some(&outside),
        "udp",
        &format!("{NODE_EXTERNAL_IP}:30174"),
        &["pod1", "pod2", "pod3"],
    )
}

/// An endpoint pod is itself the client of its service, TCP: answered
/// by every endpoint, itself included.
pub(super) fn endpoint_to_service_tcp(bed: &mut Bed) -> Result<()> {
    endpoint_to_service(bed, "tcp", "10.96.1.175:80")
}

/// The same over UDP.
pub(super) fn endpoint_to_service_udp(bed: &mut Bed) -> Result<()> {
    endpoint_to_service(bed, "udp", "10.96.1.175:53")
}

fn endpoint_to_service(bed: &mut Bed, proto: &str, target: &str) -> Result<()> {
    ensure_daemon(bed)?;
    let s = Svc {
        ports: TCP_AND_UDP,
        ..svc("endpoint-service", "10.96.1.175")
    };
    apply_service(bed, &s, false, &three_pods())?;
    let endpoint = bed.pods[0].netns.clone();
    wait_answered_by(
        bed,
        Some(&endpoint),
        proto,
        target,
        &["pod1", "pod2", "pod3"],
    )
    .context("from pod1, one of the endpoints")
}
