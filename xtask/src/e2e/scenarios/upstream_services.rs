//! Upstream Services and Networking tests that no e2e scenario covered:
//! what each checks is what the upstream test checks, from a pod (pod3,
//! the exec pod), the node, or the outside client.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use super::*;
use crate::e2e::bed::hostnet::{HOST_ENDPOINT_NAME, HOST_TCP_PORT, HOST_UDP_PORT};
use crate::e2e::bed::{NODE1, NODE_EXTERNAL_IP, OUTSIDE_SUBNET};

/// How long a change may take to show (kube-proxy's e2e allows far more).
const PROGRAMMED_WITHIN: Duration = Duration::from_secs(5);

/// The exec pod of the upstream tests: pod3, on node 1.
fn exec_pod(bed: &Bed) -> String {
    bed.pods[2].netns.clone()
}

/// Waits until `target` is answered by exactly `pods` (30 requests, none
/// failed) from `netns` (the node's when `None`).
pub(super) fn wait_answered_by(
    bed: &Bed,
    netns: Option<&str>,
    proto: &str,
    target: &str,
    pods: &[&str],
) -> Result<()> {
    let started = Instant::now();
    loop {
        let r = request_from(bed, netns, proto, target, 30, CLIENT_TIMEOUT)?;
        let got: Vec<String> = r.pods().into_keys().collect();
        if got == pods && r.errors.is_empty() {
            return Ok(());
        }
        if started.elapsed() > PROGRAMMED_WITHIN {
            bail!(
                "{target}/{proto}: answered by {:?} with {} errors (e.g. {:?}) after {PROGRAMMED_WITHIN:?}, expected exactly {pods:?}",
                r.pods(),
                r.errors.len(),
                r.errors.first()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until no request to `target` from `netns` is answered.
pub(super) fn wait_not_served(
    bed: &Bed,
    netns: Option<&str>,
    proto: &str,
    target: &str,
) -> Result<()> {
    let started = Instant::now();
    loop {
        let r = request_from(bed, netns, proto, target, 3, DROP_TIMEOUT)?;
        if r.ok_count() == 0 {
            return Ok(());
        }
        if started.elapsed() > PROGRAMMED_WITHIN {
            bail!(
                "{target}/{proto} still answered by {:?} {PROGRAMMED_WITHIN:?} after it should have stopped",
                r.pods()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Stays unanswered: `target` gets no answer for 1 s.
fn assert_not_served(bed: &Bed, netns: Option<&str>, proto: &str, target: &str) -> Result<()> {
    let r = request_from(bed, netns, proto, target, 3, DROP_TIMEOUT)?;
    ensure!(
        r.ok_count() == 0,
        "{target}/{proto} must not be served, answered by {:?}",
        r.pods()
    );
    Ok(())
}

/// `svc`'s manifest with `labels` on its metadata.
fn labelled(svc: &Svc, labels: &str) -> String {
    svc.yaml().replacen(
        "metadata: {",
        &format!("metadata: {{labels: {{{labels}}}, "),
        1,
    )
}

/// Endpoints change under a service (pods created and deleted upstream):
/// none, pod1, pod1+pod2, pod2, none; the exec pod sees exactly those.
pub(super) fn basic_endpoint(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let s = svc("endpoint-test2", "10.96.1.1");
    let client = exec_pod(bed);
    let target = "10.96.1.1:80";
    apply_service(bed, &s, false, &[(0, "node-1")])?;
    wait_answered_by(bed, Some(&client), "tcp", target, &["pod1"]).context("pod1")?;
    apply_service(bed, &s, false, &[(0, "node-1"), (1, "node-1")])?;
    wait_answered_by(bed, Some(&client), "tcp", target, &["pod1", "pod2"])
        .context("pod1 and pod2")?;
    apply_service(bed, &s, false, &[(1, "node-1")])?;
    wait_answered_by(bed, Some(&client), "tcp", target, &["pod2"]).context("pod1 deleted")?;
    apply_service(bed, &s, false, &[])?;
    wait_not_served(bed, Some(&client), "tcp", target).context("both deleted")
}

/// A port added to the service is served, a port removed stops.
pub(super) fn ports_added_and_removed(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let one = Svc {
        ports: &[("portname1", "TCP", 80, 8080)],
        ..svc("edit-port-test", "10.96.1.2")
    };
    let two = Svc {
        ports: &[
            ("portname1", "TCP", 80, 8080),
            ("portname2", "TCP", 81, 8081),
        ],
        ..one
    };
    let client = exec_pod(bed);
    apply_service(bed, &one, false, &[(0, "node-1")])?;
    wait_answered_by(bed, Some(&client), "tcp", "10.96.1.2:80", &["pod1"])?;
    apply_service(bed, &two, false, &[(0, "node-1")])?;
    wait_answered_by(bed, Some(&client), "tcp", "10.96.1.2:81", &["pod1"])
        .context("the added port")?;
    apply_service(bed, &one, false, &[(0, "node-1")])?;
    wait_not_served(bed, Some(&client), "tcp", "10.96.1.2:81").context("the removed port")?;
    wait_answered_by(bed, Some(&client), "tcp", "10.96.1.2:80", &["pod1"]).context("the kept port")
}

/// The endpoint sees the client pod's own address, from a pod on the
/// same node and from a pod on the other node.
pub(super) fn source_pod_ip_preserved(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let remote = bed.node2()?.pods[0].clone();
    let s = svc("sourceip-test", "10.96.1.3");
    apply_service(bed, &s, false, &[(0, "node-1")])?;
    let local = bed.pods[1].clone();
    for pod in [&local, &remote] {
        wait_until_served_from(
            bed,
            Some(&pod.netns),
            "tcp",
            "10.96.1.3:80",
            PROGRAMMED_WITHIN,
            CLIENT_TIMEOUT,
        )
        .with_context(|| format!("from {}", pod.name))?;
        let r = request_from(
            bed,
            Some(&pod.netns),
            "tcp",
            "10.96.1.3:80",
            5,
            CLIENT_TIMEOUT,
        )?;
        ensure!(r.errors.is_empty(), "from {}: {:?}", pod.name, r.errors);
        let seen: Vec<&String> = r.seen.values().flatten().collect();
        ensure!(
            seen == [&pod.ipv4],
            "the endpoint saw {seen:?} as the source of {}'s requests, expected {}",
            pod.name,
            pod.ipv4
        );
    }
    Ok(())
}

/// Two services up; one removed stops while the other serves; a third
/// added serves beside it.
pub(super) fn up_and_down(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let (s1, s2, s3) = (
        svc("up-down-1", "10.96.1.31"),
        svc("up-down-2", "10.96.1.32"),
        svc("up-down-3", "10.96.1.33"),
    );
    let all = three_pods();
    let manifests = |services: &[&Svc]| {
        let mut parts = Vec::new();
        for s in services {
            parts.push(service_yaml(s));
            parts.push(slice_yaml(bed, s, false, &all));
        }
        docs(&parts)
    };
    let client = exec_pod(bed);
    let every = ["pod1", "pod2", "pod3"];
    bed.apply_manifests(&manifests(&[&s1, &s2]))?;
    wait_answered_by(bed, Some(&client), "tcp", "10.96.1.31:80", &every).context("up-down-1")?;
    wait_answered_by(bed, Some(&client), "tcp", "10.96.1.32:80", &every).context("up-down-2")?;
    bed.apply_manifests(&manifests(&[&s2]))?;
    wait_not_served(bed, Some(&client), "tcp", "10.96.1.31:80").context("up-down-1 stopped")?;
    wait_answered_by(bed, Some(&client), "tcp", "10.96.1.32:80", &every)
        .context("up-down-2 still up")?;
    bed.apply_manifests(&manifests(&[&s2, &s3]))?;
    wait_answered_by(bed, Some(&client), "tcp", "10.96.1.32:80", &every)
        .context("up-down-2 beside up-down-3")?;
    wait_answered_by(bed, Some(&client), "tcp", "10.96.1.33:80", &every).context("up-down-3")
}

/// Deleted, gone; created again (with a new cluster IP), served there.
pub(super) fn recreated(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let client = exec_pod(bed);
    let first = svc("service-deletion", "10.96.1.40");
    apply_service(bed, &first, false, &[(0, "node-1")])?;
    wait_answered_by(bed, Some(&client), "tcp", "10.96.1.40:80", &["pod1"])?;
    bed.apply_manifests("")?;
    wait_not_served(bed, Some(&client), "tcp", "10.96.1.40:80").context("deleted")?;
    let again = svc("service-deletion", "10.96.1.41");
    apply_service(bed, &again, false, &[(0, "node-1")])?;
    wait_answered_by(bed, Some(&client), "tcp", "10.96.1.41:80", &["pod1"]).context("recreated")
}

/// An external IP no node holds (RFC 5737's 203.0.113.250) serves the
/// exec pod, as kube-proxy serves it from the node.
pub(super) fn external_ip_not_on_a_node(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let s = Svc {
        external_ips: &["203.0.113.250"],
        ..svc("externalip-test", "10.96.1.50")
    };
    apply_service(bed, &s, false, &three_pods_on_node1())?;
    let client = exec_pod(bed);
    wait_answered_by(
        bed,
        Some(&client),
        "tcp",
        "203.0.113.250:80",
        &["pod1", "pod2", "pod3"],
    )
    .context("from a pod")?;
    wait_answered_by(
        bed,
        None,
        "tcp",
        "203.0.113.250:80",
        &["pod1", "pod2", "pod3"],
    )
    .context("from the node")
}

/// TCP and UDP on the same port number; dropping the UDP port stops only
/// UDP.
pub(super) fn same_port_different_protocols(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let both = Svc {
        ports: &[("tcp-port", "TCP", 53, 8082), ("udp-port", "UDP", 53, 5353)],
        ..svc("proto-test", "10.96.1.60")
    };
    let tcp_only = Svc {
        ports: &[("tcp-port", "TCP", 53, 8082)],
        ..both
    };
    let client = exec_pod(bed);
    apply_service(bed, &both, false, &[(0, "node-1")])?;
    wait_answered_by(bed, Some(&client), "tcp", "10.96.1.60:53", &["pod1"]).context("TCP")?;
    wait_answered_by(bed, Some(&client), "udp", "10.96.1.60:53", &["pod1"]).context("UDP")?;
    apply_service(bed, &tcp_only, false, &[(0, "node-1")])?;
    wait_not_served(bed, Some(&client), "udp", "10.96.1.60:53").context("UDP port removed")?;
    wait_answered_by(bed, Some(&client), "tcp", "10.96.1.60:53", &["pod1"])
        .context("TCP once the UDP port is gone")
}

/// An ExternalName service (no cluster IP, nothing to proxy) becomes a
/// ClusterIP service, served at its new address.
pub(super) fn external_name_to_cluster_ip(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let external = Svc {
        kind: "ExternalName",
        cluster_ip: "\"\"",
        spec: &["externalName: example.com"],
        ..svc("externalname-service", "")
    };
    bed.apply_manifests(&service_yaml(&external))?;
    let cluster_ip = svc("externalname-service", "10.96.1.70");
    // The ExternalName service was read and published (nothing to serve).
    std::thread::sleep(Duration::from_millis(500));
    apply_service(bed, &cluster_ip, false, &three_pods())?;
    wait_answered_by(
        bed,
        Some(&exec_pod(bed)),
        "tcp",
        "10.96.1.70:80",
        &["pod1", "pod2", "pod3"],
    )
}

/// A service labelled for another proxy is not served; once the label is
/// removed it is; an unlabelled one beside it always is.
pub(super) fn service_proxy_name_label(bed: &mut Bed) -> Result<()> {
    label_hides_the_service(bed, "service.kubernetes.io/service-proxy-name: foo-bar")
}

/// A service labelled `service.kubernetes.io/headless` is not served (as
/// kube-proxy's informers filter it); once the label is removed it is.
pub(super) fn headless_label(bed: &mut Bed) -> Result<()> {
    label_hides_the_service(bed, "service.kubernetes.io/headless: \"\"")
}

fn label_hides_the_service(bed: &mut Bed, label: &str) -> Result<()> {
    ensure_daemon(bed)?;
    let hidden = svc("service-labelled", "10.96.1.81");
    let plain = svc("service-plain", "10.96.1.82");
    let all = three_pods();
    let manifests = |labelled_yaml: String| {
        docs(&[
            labelled_yaml,
            slice_yaml(bed, &hidden, false, &all),
            service_yaml(&plain),
            slice_yaml(bed, &plain, false, &all),
        ])
    };
    let client = exec_pod(bed);
    let every = ["pod1", "pod2", "pod3"];
    bed.apply_manifests(&manifests(labelled(&hidden, label)))?;
    wait_answered_by(bed, Some(&client), "tcp", "10.96.1.82:80", &every)
        .context("the unlabelled service")?;
    assert_not_served(bed, Some(&client), "tcp", "10.96.1.81:80")
        .with_context(|| format!("the service labelled {label}"))?;
    bed.apply_manifests(&manifests(service_yaml(&hidden)))?;
    wait_answered_by(bed, Some(&client), "tcp", "10.96.1.81:80", &every)
        .context("once the label is removed")?;
    bed.apply_manifests(&manifests(labelled(&hidden, label)))?;
    wait_not_served(bed, Some(&client), "tcp", "10.96.1.81:80")
        .context("once the label is added again")
}

/// No endpoints: a pod's connection to the cluster IP is refused at once
/// (TCP and UDP), and so is an outside client's to the NodePort.
pub(super) fn rejected_without_endpoints(bed: &mut Bed) -> Result<()> {
    no_endpoints(bed).context("through the cluster IP, from the node")?;
    let s = Svc {
        kind: "NodePort",
        node_ports: &[30194],
        ..svc("no-endpoints-np", "10.96.1.94")
    };
    let target = format!("{NODE_EXTERNAL_IP}:30194");
    apply_service(bed, &s, false, &[(0, "node-1")])?;
    wait_served_from_outside(bed, &target)?;
    apply_service(bed, &s, false, &[])?;
    let outside = bed.outside_netns.clone();
    let started = Instant::now();
    loop {
        let r = request_from(bed, Some(&outside), "tcp", &target, 1, CLIENT_TIMEOUT)?;
        if r.ok_count() == 0 {
            // The attempt above may have straddled the change; these start
            // after it.
            let r = request_from(bed, Some(&outside), "tcp", &target, 3, CLIENT_TIMEOUT)?;
            let refused = r.errors.iter().all(|e| e.contains("refused"));
            ensure!(
                r.ok_count() == 0 && refused && r.max_error_ms < 1000,
                "{target} from outside without endpoints: {:?} after {} ms, expected a refusal at once",
                r.errors,
                r.max_error_ms
            );
            return Ok(());
        }
        ensure!(
            started.elapsed() < PROGRAMMED_WITHIN,
            "{target} still served {PROGRAMMED_WITHIN:?} after its endpoints went away"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// internalTrafficPolicy=Local from a pod: only the endpoint on the
/// pod's node answers.
pub(super) fn itp_local_pod_to_pod(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let s = Svc {
        spec: &["internalTrafficPolicy: Local"],
        ..svc("itp-local", "10.96.1.95")
    };
    apply_service(bed, &s, false, &three_pods())?;
    wait_answered_by(bed, Some(&exec_pod(bed)), "tcp", "10.96.1.95:80", &["pod1"])
}

/// Endpoints that are hostNetwork processes (the node's own address):
/// served from a pod and from the node, TCP and UDP.
pub(super) fn host_network_endpoints(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    bed.host_endpoint()?;
    let ports = [
        ("http", "TCP", 80, HOST_TCP_PORT),
        ("udp", "UDP", 90, HOST_UDP_PORT),
    ];
    let s = Svc {
        ports: &ports,
        ..svc("host-endpoints", "10.96.1.96")
    };
    let slice = test_support::manifests::slice_yaml(
        &s,
        "v4",
        false,
        &[test_support::manifests::Endpoint::ready(
            NODE1.ip, NODE1.name,
        )],
    );
    bed.apply_manifests(&docs(&[service_yaml(&s), slice]))?;
    let client = exec_pod(bed);
    for (netns, what) in [
        (Some(client.as_str()), "from a pod"),
        (None, "from the node"),
    ] {
        for (proto, target) in [("tcp", "10.96.1.96:80"), ("udp", "10.96.1.96:90")] {
            wait_answered_by(bed, netns, proto, target, &[HOST_ENDPOINT_NAME])
                .with_context(|| format!("{what}, {proto}"))?;
        }
    }
    Ok(())
}

/// 2,000-byte UDP datagrams (fragmented on 1,500-byte links) through a
/// cluster IP from a pod and through a NodePort from outside: each is
/// answered, so it reached the endpoint whole.
pub(super) fn large_udp_requests(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let s = Svc {
        kind: "NodePort",
        ports: &[("dns", "UDP", 53, 5353)],
        node_ports: &[30197],
        ..svc("large-udp", "10.96.1.97")
    };
    apply_service(bed, &s, false, &three_pods_on_node1())?;
    let client = exec_pod(bed);
    let outside = bed.outside_netns.clone();
    let node_port = format!("{NODE_EXTERNAL_IP}:30197");
    wait_until_served(bed, "udp", "10.96.1.97:53", PROGRAMMED_WITHIN)?;
    for (netns, target) in [(&client, "10.96.1.97:53"), (&outside, node_port.as_str())] {
        let lines = bed.client(
            Some(netns),
            &[
                "--proto",
                "udp",
                "--target",
                target,
                "--count",
                "10",
                "--payload-bytes",
                "2000",
            ],
        )?;
        let r = Results::parse(&lines);
        ensure!(
            r.ok_count() == 10,
            "2,000-byte datagrams to {target} from {netns}: {} of 10 answered, e.g. {:?}",
            r.ok_count(),
            r.errors.first()
        );
    }
    Ok(())
}

/// A leading-zero cluster IP (`10.96.1.010`, accepted by the API server
/// for legacy reasons) is read as decimal, as kube-proxy reads it: the
/// service answers on 10.96.1.10.
pub(super) fn leading_zero_cluster_ip(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let s = svc("funny-ip", "10.96.1.010");
    apply_service(bed, &s, false, &[(0, "node-1")])?;
    wait_answered_by(bed, Some(&exec_pod(bed)), "tcp", "10.96.1.10:80", &["pod1"])
        .context("the service at 10.96.1.010 (decimal: 10.96.1.10)")
}

/// loadBalancerSourceRanges filter every client of the load-balancer IP:
/// from outside (the client's subnet out of the ranges: dropped; in:
/// served), and pods on the node: the one inside the ranges is served,
/// the one outside is not.
pub(super) fn lb_source_ranges_pods_on_the_node(bed: &mut Bed) -> Result<()> {
    lb_source_ranges(bed).context("from outside")?;
    let lb_ip = "203.0.113.61";
    let s = Svc {
        kind: "LoadBalancer",
        lb_ips: &[lb_ip],
        spec: &[&format!(
            "loadBalancerSourceRanges: [\"{}/32\", \"{OUTSIDE_SUBNET}\"]",
            bed.pods[0].ipv4
        )],
        ..svc("lb-ranges-pods", "10.96.1.98")
    };
    apply_service(bed, &s, false, &three_pods_on_node1())?;
    let target = format!("{lb_ip}:80");
    let (inside, outside) = (bed.pods[0].clone(), bed.pods[1].clone());
    wait_until_served_from(
        bed,
        Some(&inside.netns),
        "tcp",
        &target,
        PROGRAMMED_WITHIN,
        CLIENT_TIMEOUT,
    )
    .with_context(|| format!("{} (inside the ranges)", inside.name))?;
    let r = request_from(bed, Some(&outside.netns), "tcp", &target, 5, DROP_TIMEOUT)?;
    ensure!(
        r.ok_count() == 0,
        "{target} from {} ({}, outside the ranges): {} of 5 answered, by {:?}",
        outside.name,
        outside.ipv4,
        r.ok_count(),
        r.pods()
    );
    Ok(())
}

/// From a pod to a cluster IP, TCP: spread over every endpoint, the
/// service address as the peer.
pub(super) fn pod_to_service_tcp(bed: &mut Bed) -> Result<()> {
    pod_to_service(bed, "tcp", "10.96.1.100:80")
}

/// From a pod to a cluster IP, UDP.
pub(super) fn pod_to_service_udp(bed: &mut Bed) -> Result<()> {
    pod_to_service(bed, "udp", "10.96.1.100:53")
}

fn pod_to_service(bed: &mut Bed, proto: &str, target: &str) -> Result<()> {
    ensure_daemon(bed)?;
    let s = Svc {
        ports: TCP_AND_UDP,
        ..svc("pod-service", "10.96.1.100")
    };
    apply_service(bed, &s, false, &three_pods())?;
    let client = exec_pod(bed);
    wait_until_served_from(
        bed,
        Some(&client),
        proto,
        target,
        PROGRAMMED_WITHIN,
        CLIENT_TIMEOUT,
    )?;
    let r = request_from(bed, Some(&client), proto, target, 150, CLIENT_TIMEOUT)?;
    assert_spread(&r, 150, &["pod1", "pod2", "pod3"], 0.15)?;
    assert_peer_is(&r, target)
}
