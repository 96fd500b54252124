//! Traffic from outside the node: NodePorts, externalIPs, LoadBalancer
//! IPs, source ranges, externalTrafficPolicy, and the datapath fallback
//! and cleanup.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use super::*;

/// A client outside the node reaches a NodePort on the node's address,
/// spread over the endpoints (eTP=Cluster).
pub(super) fn nodeport_outside(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let svc = Svc {
        kind: "NodePort",
        node_ports: &[30080],
        ..svc("np", "10.96.0.80")
    };
    bed.apply_manifests(&docs(&[
        svc.yaml(),
        slice_yaml(bed, &svc, false, &three_pods_on_node1()),
    ]))?;
    let target = format!("{}:30080", crate::e2e::bed::NODE_EXTERNAL_IP);
    let outside = bed.outside_netns.clone();
    let started = Instant::now();
    loop {
        let lines = bed.client(
            Some(&outside),
            &["--proto", "tcp", "--target", &target, "--count", "1"],
        )?;
        if Results::parse(&lines).ok_count() == 1 {
            break;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(5),
            "{target} not served from outside within 5 s: {lines:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let lines = bed.client(
        Some(&outside),
        &["--proto", "tcp", "--target", &target, "--count", "90"],
    )?;
    assert_spread(&Results::parse(&lines), 90, &["pod1", "pod2", "pod3"], 0.1)
}

/// `--nodeport-addresses`: with the node's outside subnet listed, the node
/// port answers there; with only another subnet listed, the same request
/// reaches no service (the node itself refuses it), while cluster IPs
/// keep working.
pub(super) fn nodeport_addresses(bed: &mut Bed) -> Result<()> {
    let svc = Svc {
        kind: "NodePort",
        node_ports: &[30150],
        ..svc("npa", "10.96.0.150")
    };
    let service = svc.yaml();
    let target = format!("{}:30150", crate::e2e::bed::NODE_EXTERNAL_IP);
    let outside = bed.outside_netns.clone();
    // A service only the second daemon knows: once it answers, that
    // daemon has replaced the first one's rules.
    let marker = super::svc("npa-marker", "10.96.0.151");
    let run = |bed: &mut Bed, cidr: &str, with_marker: bool| -> Result<()> {
        if bed.daemon_running() {
            bed.stop_daemon()?;
        }
        bed.daemon_args = vec!["--nodeport-addresses".into(), cidr.into()];
        let mut manifests = vec![
            service.clone(),
            slice_yaml(bed, &svc, false, &three_pods_on_node1()),
        ];
        if with_marker {
            manifests.push(service_yaml(&marker));
            manifests.push(slice_yaml(bed, &marker, false, &three_pods_on_node1()));
        }
        bed.apply_manifests(&docs(&manifests))?;
        bed.start_daemon()
    };
    let result = (|| -> Result<()> {
        run(bed, "192.168.100.0/24", false)?;
        wait_until_served_from(
            bed,
            Some(&outside),
            "tcp",
            &target,
            Duration::from_secs(5),
            Duration::from_millis(300),
        )?;
        let r = request_from(bed, Some(&outside), "tcp", &target, 30, CLIENT_TIMEOUT)?;
        assert_spread(&r, 30, &["pod1", "pod2", "pod3"], 0.1)?;

        run(bed, "10.123.0.0/16", true)?;
        wait_until_served(bed, "tcp", "10.96.0.151:80", Duration::from_secs(5))?;
        // Cluster IPs are not affected.
        let r = request(bed, "tcp", "10.96.0.150:80", 10)?;
        ensure!(r.ok_count() == 10, "cluster IP failed: {:?}", r.errors);
        let r = request_from(
            bed,
            Some(&outside),
            "tcp",
            &target,
            10,
            Duration::from_millis(500),
        )?;
        ensure!(
            r.ok_count() == 0,
            "node port answered outside --nodeport-addresses: {:?}",
            r.pods()
        );
        Ok(())
    })();
    let _ = bed.stop_daemon();
    bed.daemon_args.clear();
    result
}

/// A client outside the node reaches an IPv6 NodePort on the node's IPv6
/// address, spread over the endpoints' IPv6 addresses.
pub(super) fn ipv6_nodeport_outside(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let svc = Svc {
        kind: "NodePort",
        node_ports: &[30130],
        spec: &["ipFamilies: [IPv6]"],
        ..svc("np6", "fd00:96::130")
    };
    bed.apply_manifests(&docs(&[
        svc.yaml(),
        slice_yaml(bed, &svc, true, &three_pods_on_node1()),
    ]))?;
    let target = format!("[{}]:30130", crate::e2e::bed::NODE_EXTERNAL_IPV6);
    let outside = bed.outside_netns.clone();
    wait_served_from_outside(bed, &target)
        .with_context(|| format!("from {} outside the node", crate::e2e::bed::OUTSIDE_IPV6))?;
    let r = request_from(bed, Some(&outside), "tcp", &target, 90, CLIENT_TIMEOUT)?;
    assert_spread(&r, 90, &["pod1", "pod2", "pod3"], 0.1)
        .with_context(|| format!("from {} to {target}", crate::e2e::bed::OUTSIDE_IPV6))
}

/// How long a request from outside gets before it counts as dropped: the
/// bed's veths answer in well under a millisecond.
pub(super) const DROP_TIMEOUT: Duration = Duration::from_millis(300);

/// A LoadBalancer service `name` on `cluster_ip`, TCP 80 → 8080, with
/// `external_ips` and `lb_ips` (status.loadBalancer.ingress). The
/// addresses are in the prefixes the bed's router sends to node 1
/// ([`crate::e2e::bed::EXTERNAL_V4_PREFIX`]), as a router in front of a
/// cluster would.
fn load_balancer<'a>(
    name: &'a str,
    cluster_ip: &'a str,
    external_ips: &'a [&'a str],
    lb_ips: &'a [&'a str],
) -> Svc<'a> {
    Svc {
        kind: "LoadBalancer",
        external_ips,
        lb_ips,
        ..svc(name, cluster_ip)
    }
}

/// A client outside the node reaches the service on its external IP and
/// on its load-balancer IP (eTP=Cluster), spread over the endpoints.
pub(super) fn external_and_lb_ips(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let (external_ip, lb_ip) = ("203.0.113.20", "203.0.113.10");
    let addresses = ([external_ip], [lb_ip]);
    let lb = load_balancer("lb", "10.96.0.100", &addresses.0, &addresses.1);
    bed.apply_manifests(&docs(&[
        lb.yaml(),
        slice_yaml(bed, &lb, false, &three_pods_on_node1()),
    ]))?;
    let outside = bed.outside_netns.clone();
    for ip in [external_ip, lb_ip] {
        let target = format!("{ip}:80");
        wait_served_from_outside(bed, &target)?;
        let r = request_from(bed, Some(&outside), "tcp", &target, 90, CLIENT_TIMEOUT)?;
        assert_spread(&r, 90, &["pod1", "pod2", "pod3"], 0.1)
            .with_context(|| format!("from outside to {target}"))?;
    }
    Ok(())
}

/// loadBalancerSourceRanges: a source outside the ranges is dropped on the
/// load-balancer IP (while the external IP, which the ranges do not cover,
/// still serves it); once the ranges include it, it is served.
pub(super) fn lb_source_ranges(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let (external_ip, lb_ip) = ("203.0.113.21", "203.0.113.11");
    let addresses = ([external_ip], [lb_ip]);
    let fw = load_balancer("fw", "10.96.0.110", &addresses.0, &addresses.1);
    let manifests = |ranges: &str| {
        docs(&[
            Svc {
                spec: &[&format!("loadBalancerSourceRanges: [{ranges}]")],
                ..fw
            }
            .yaml(),
            slice_yaml(bed, &fw, false, &three_pods_on_node1()),
        ])
    };
    // The outside client is in OUTSIDE_SUBNET, behind the router.
    bed.apply_manifests(&manifests("\"198.51.100.0/24\""))?;
    let outside = bed.outside_netns.clone();
    // Served on the external IP: the service is programmed.
    wait_until_served_from(
        bed,
        Some(&outside),
        "tcp",
        &format!("{external_ip}:80"),
        Duration::from_secs(5),
        DROP_TIMEOUT,
    )?;
    let lb_target = format!("{lb_ip}:80");
    let r = request_from(bed, Some(&outside), "tcp", &lb_target, 5, DROP_TIMEOUT)?;
    assert_dropped(&r, &format!("{lb_target} from a source outside the ranges"))?;

    let applied = Instant::now();
    bed.apply_manifests(&manifests(&format!(
        "\"198.51.100.0/24\", \"{}\"",
        crate::e2e::bed::OUTSIDE_SUBNET
    )))?;
    wait_until_served_from(
        bed,
        Some(&outside),
        "tcp",
        &lb_target,
        Duration::from_secs(2),
        DROP_TIMEOUT,
    )
    .context("after adding the client's range")?;
    let took = applied.elapsed();
    ensure!(
        took <= Duration::from_secs(2),
        "served {took:?} after the ranges changed"
    );
    let r = request_from(bed, Some(&outside), "tcp", &lb_target, 30, CLIENT_TIMEOUT)?;
    assert_spread(&r, 30, &["pod1", "pod2", "pod3"], 0.0)
        .with_context(|| format!("{lb_target} from a source inside the ranges"))
}

/// loadBalancerSourceRanges on an IPv6 load-balancer IP, TCP and UDP: the
/// outside client (outside the ranges) is dropped on both protocols while
/// the external IP serves it; once its subnet is in the ranges, both
/// protocols are served.
pub(super) fn lb_source_ranges_ipv6_udp(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let (external_ip, lb_ip) = ("fd00:203::61", "fd00:203::60");
    let addresses = ([external_ip], [lb_ip]);
    let fw = load_balancer("fw6", "fd00:96::111", &addresses.0, &addresses.1);
    let manifests = |ranges: &str| {
        let ranges = format!("loadBalancerSourceRanges: [{ranges}]");
        let svc = Svc {
            ports: TCP_AND_UDP,
            spec: &["ipFamilies: [IPv6]", &ranges],
            ..fw
        };
        docs(&[
            svc.yaml(),
            slice_yaml(bed, &svc, true, &three_pods_on_node1()),
        ])
    };
    bed.apply_manifests(&manifests("\"fd00:198:51:100::/64\""))?;
    let outside = bed.outside_netns.clone();
    for proto in ["tcp", "udp"] {
        let port = if proto == "tcp" { 80 } else { 53 };
        wait_until_served_from(
            bed,
            Some(&outside),
            proto,
            &two_node::at(external_ip, port),
            Duration::from_secs(5),
            DROP_TIMEOUT,
        )?;
        let target = two_node::at(lb_ip, port);
        let r = request_from(bed, Some(&outside), proto, &target, 2, DROP_TIMEOUT)?;
        assert_dropped(&r, &format!("{target}/{proto} from outside the ranges"))?;
    }
    bed.apply_manifests(&manifests(&format!(
        "\"fd00:198:51:100::/64\", \"{}\"",
        crate::e2e::bed::OUTSIDE_SUBNET_V6
    )))?;
    for proto in ["tcp", "udp"] {
        let target = two_node::at(lb_ip, if proto == "tcp" { 80 } else { 53 });
        wait_until_served_from(
            bed,
            Some(&outside),
            proto,
            &target,
            Duration::from_secs(2),
            DROP_TIMEOUT,
        )
        .context("after adding the client's range")?;
        let r = request_from(bed, Some(&outside), proto, &target, 30, CLIENT_TIMEOUT)?;
        assert_spread(&r, 30, &["pod1", "pod2", "pod3"], 0.0)
            .with_context(|| format!("{target}/{proto} from a source inside the ranges"))?;
    }
    Ok(())
}

/// externalTrafficPolicy: Local on a node port: traffic from outside only
/// reaches the endpoint on this node (node-1, the daemon's
/// --hostname-override), and is dropped once no endpoint is local.
pub(super) fn etp_local_nodeport(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let svc = Svc {
        kind: "NodePort",
        node_ports: &[30090],
        spec: &["externalTrafficPolicy: Local"],
        ..svc("etp", "10.96.0.120")
    };
    let manifests =
        |members: &[(usize, &str)]| docs(&[svc.yaml(), slice_yaml(bed, &svc, false, members)]);
    bed.apply_manifests(&manifests(&three_pods()))?;
    let target = format!("{}:30090", crate::e2e::bed::NODE_EXTERNAL_IP);
    let outside = bed.outside_netns.clone();
    wait_served_from_outside(bed, &target)?;
    let r = request_from(bed, Some(&outside), "tcp", &target, 30, CLIENT_TIMEOUT)?;
    assert_spread(&r, 30, &["pod1"], 1.0).context("only the endpoint on node-1 may answer")?;

    bed.apply_manifests(&manifests(&[(0, "node-2"), (1, "node-2"), (2, "node-3")]))?;
    let changed = Instant::now();
    loop {
        let r = request_from(bed, Some(&outside), "tcp", &target, 1, DROP_TIMEOUT)?;
        if r.ok_count() == 0 {
            break;
        }
        ensure!(
            changed.elapsed() < Duration::from_secs(2),
            "still served 2 s after the last local endpoint went away: {:?}",
            r.pods()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = request_from(bed, Some(&outside), "tcp", &target, 5, DROP_TIMEOUT)?;
    assert_dropped(&r, &format!("{target} without a local endpoint"))
}

/// `--proxy-mode auto` with eBPF made to fail (test hook): one log line
/// with the cause, and traffic flows through nftables. In the eBPF bed the
/// eBPF daemon's programs are cleaned up first (they would serve the
/// service themselves), and the node gets the default route nftables
/// needs for the time of the scenario; both are undone afterwards.
pub(super) fn auto_fallback(bed: &mut Bed) -> Result<()> {
    let bed_mode = bed.proxy_mode.clone();
    bed.stop_daemon()?;
    if bed_mode == "ebpf" {
        bed.cleanup_command()?;
        let node = bed.node_netns.clone();
        bed.add_void_default_route(&node)?;
    }
    bed.proxy_mode = "auto".to_owned();
    bed.daemon_env = vec![(
        "EBPF_KUBE_PROXY_TEST_FORCE_EBPF_FAILURE".to_owned(),
        "1".to_owned(),
    )];
    let result = (|| -> Result<()> {
        apply_service(bed, &WEB, false, &three_pods())?;
        bed.start_daemon()?;
        wait_until_served(bed, "tcp", "10.96.0.10:80", Duration::from_secs(5))?;
        let r = request(bed, "tcp", "10.96.0.10:80", 60)?;
        assert_spread(&r, 60, &["pod1", "pod2", "pod3"], 0.1)?;
        let log = bed.daemon_log();
        let fallbacks: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("falling back to nftables"))
            .collect();
        ensure!(
            fallbacks.len() == 1 && fallbacks[0].contains("forced by"),
            "expected one fallback line with the cause: {fallbacks:?}"
        );
        ensure!(
            log.contains("proxy_mode=nftables requested_proxy_mode=auto"),
            "the daemon does not report nftables as the active mode"
        );
        Ok(())
    })();
    let _ = bed.stop_daemon();
    bed.proxy_mode = bed_mode;
    bed.daemon_env.clear();
    if bed.proxy_mode == "ebpf" {
        bed.cleanup_command()?;
        bed.remove_void_default_route()?;
    }
    result
}
