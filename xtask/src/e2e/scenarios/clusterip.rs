//! ClusterIP scenarios: spreading, ports, churn, affinity, policies, IPv6.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};

use super::*;

/// The bed itself: every pod answers on its own addresses, both families,
/// TCP and UDP, without any service involved.
pub(super) fn pods_reachable(bed: &mut Bed) -> Result<()> {
    for pod in &bed.pods {
        for (proto, target) in [
            ("tcp", format!("{}:8080", pod.ipv4)),
            ("udp", format!("{}:5353", pod.ipv4)),
            ("tcp", format!("[{}]:8080", pod.ipv6)),
        ] {
            let r = request(bed, proto, &target, 1)?;
            let pods: Vec<String> = r.pods().into_keys().collect();
            ensure!(
                pods == [pod.name.clone()],
                "{target}/{proto}: {:?} {:?}",
                r.pods(),
                r.errors
            );
        }
    }
    Ok(())
}

pub(super) fn clusterip_tcp(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    apply_service(bed, &WEB, false, &three_pods())?;
    wait_until_served(bed, "tcp", "10.96.0.10:80", Duration::from_secs(5))?;
    let before = datapath_counter(bed, "load_balanced")?;
    let r = request(bed, "tcp", "10.96.0.10:80", 300)?;
    assert_spread(&r, 300, &["pod1", "pod2", "pod3"], 0.15)?;
    assert_peer_is(&r, "10.96.0.10:80")?;
    if let (Some(before), Some(after)) = (before, datapath_counter(bed, "load_balanced")?) {
        ensure!(
            after >= before + 300,
            "load_balanced went from {before} to {after} over 300 connections"
        );
    }
    Ok(())
}

/// `ebpf_kube_proxy_datapath_connections_total{result}` on the daemon's
/// `/metrics`: the eBPF programs' own counters. `None` on nftables, which
/// has none; on eBPF the family must be there.
pub(super) fn datapath_counter(bed: &Bed, result: &str) -> Result<Option<u64>> {
    let page = bed.metrics()?;
    let prefix = format!("ebpf_kube_proxy_datapath_connections_total{{result=\"{result}\"}} ");
    let value = page
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse::<u64>())
        .transpose()?;
    if bed.proxy_mode == "ebpf" {
        ensure!(value.is_some(), "no {prefix}on /metrics:\n{page}");
    } else {
        ensure!(value.is_none(), "{prefix}on the nftables datapath");
    }
    Ok(value)
}

pub(super) fn clusterip_udp(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let dns = Svc {
        ports: &[("dns", "UDP", 53, 5353)],
        ..svc("dns", "10.96.0.53")
    };
    apply_service(bed, &dns, false, &three_pods())?;
    wait_until_served(bed, "udp", "10.96.0.53:53", Duration::from_secs(5))?;
    let r = request(bed, "udp", "10.96.0.53:53", 300)?;
    assert_spread(&r, 300, &["pod1", "pod2", "pod3"], 0.15)?;
    // recvmsg rev-NAT: the reply comes from the service address.
    assert_peer_is(&r, "10.96.0.53:53")
}

pub(super) fn multi_port(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let svc = Svc {
        ports: &[
            ("http", "TCP", 80, 8080),
            ("admin", "TCP", 81, 8081),
            ("stream", "TCP", 53, 8082),
            ("dns", "UDP", 53, 5353),
        ],
        ..svc("multi", "10.96.0.20")
    };
    apply_service(bed, &svc, false, &three_pods())?;
    wait_until_served(bed, "tcp", "10.96.0.20:80", Duration::from_secs(5))?;
    for (proto, target, backend_port) in [
        ("tcp", "10.96.0.20:80", 8080),
        ("tcp", "10.96.0.20:81", 8081),
        ("tcp", "10.96.0.20:53", 8082),
        ("udp", "10.96.0.20:53", 5353),
    ] {
        let r = request(bed, proto, target, 30)?;
        ensure!(r.errors.is_empty(), "{target}/{proto}: {:?}", r.errors);
        for answer in r.answers.keys() {
            ensure!(
                answer.ends_with(&format!("port={backend_port}")),
                "{target}/{proto} must reach backend port {backend_port}, got {answer}"
            );
        }
    }
    Ok(())
}

pub(super) fn endpoint_churn(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let all = three_pods();
    apply_service(bed, &WEB, false, &all)?;
    wait_until_served(bed, "tcp", "10.96.0.10:80", Duration::from_secs(5))?;

    apply_service(bed, &WEB, false, &all[..2])?;
    std::thread::sleep(Duration::from_secs(1));
    let r = request(bed, "tcp", "10.96.0.10:80", 100)?;
    ensure!(r.errors.is_empty(), "{:?}", r.errors.first());
    ensure!(
        !r.pods().contains_key("pod3"),
        "removed endpoint still reached 1 s later: {:?}",
        r.pods()
    );

    let added = Instant::now();
    apply_service(bed, &WEB, false, &all)?;
    loop {
        let r = request(bed, "tcp", "10.96.0.10:80", 10)?;
        if r.pods().contains_key("pod3") {
            break;
        }
        ensure!(
            added.elapsed() < Duration::from_secs(1),
            "added endpoint not reached within 1 s"
        );
    }
    Ok(())
}

pub(super) fn no_endpoints(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let empty = Svc {
        ports: &[("tcp", "TCP", 80, 8080), ("udp", "UDP", 53, 5353)],
        ..svc("empty", "10.96.0.30")
    };
    // Program it with an endpoint first, so "refused" is the datapath's
    // answer for an empty service and not a missing service.
    apply_service(bed, &empty, false, &[(0, "node-1")])?;
    wait_until_served(bed, "tcp", "10.96.0.30:80", Duration::from_secs(5))?;
    let refused_before = datapath_counter(bed, "no_backend")?;
    apply_service(bed, &empty, false, &[])?;
    let started = Instant::now();
    loop {
        let r = request(bed, "tcp", "10.96.0.30:80", 1)?;
        if r.ok_count() == 0 {
            ensure!(r.max_error_ms < 1000, "refusal took {} ms", r.max_error_ms);
            break;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(2),
            "still served 2 s after the last endpoint went away"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for (proto, target) in [("tcp", "10.96.0.30:80"), ("udp", "10.96.0.30:53")] {
        let r = request(bed, proto, target, 5)?;
        ensure!(
            r.ok_count() == 0,
            "{target}/{proto} answered without endpoints"
        );
        ensure!(
            r.max_error_ms < 1000,
            "{target}/{proto}: refusal took {} ms: {:?}",
            r.max_error_ms,
            r.errors
        );
    }
    if let (Some(before), Some(after)) = (refused_before, datapath_counter(bed, "no_backend")?) {
        ensure!(
            after > before,
            "no_backend stayed at {before} while connections were refused"
        );
    }
    Ok(())
}

pub(super) fn session_affinity(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let svc = Svc {
        spec: &[
            "sessionAffinity: ClientIP",
            "sessionAffinityConfig: {clientIP: {timeoutSeconds: 1}}",
        ],
        ..svc("sticky", "10.96.0.40")
    };
    apply_service(bed, &svc, false, &three_pods())?;
    wait_until_served(bed, "tcp", "10.96.0.40:80", Duration::from_secs(5))?;
    let r = request(bed, "tcp", "10.96.0.40:80", 50)?;
    ensure!(r.errors.is_empty(), "{:?}", r.errors.first());
    ensure!(
        r.pods().len() == 1,
        "50 requests from one client must hit one pod: {:?}",
        r.pods()
    );
    // After the timeout a new pick happens: over 8 idle periods at least two
    // different pods answer (a false failure needs 8 identical random picks
    // of 3: p = 1/3^7 ≈ 0.05%).
    let mut picked = std::collections::BTreeSet::new();
    picked.extend(r.pods().into_keys());
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(1600));
        let r = request(bed, "tcp", "10.96.0.40:80", 3)?;
        ensure!(
            r.pods().len() == 1,
            "within the timeout one pod answers: {:?}",
            r.pods()
        );
        picked.extend(r.pods().into_keys());
        if picked.len() > 1 {
            return Ok(());
        }
    }
    bail!("the same pod answered after every affinity timeout: {picked:?}")
}

pub(super) fn itp_local(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let svc = Svc {
        spec: &["internalTrafficPolicy: Local"],
        ..svc("local", "10.96.0.50")
    };
    apply_service(bed, &svc, false, &three_pods())?;
    wait_until_served(bed, "tcp", "10.96.0.50:80", Duration::from_secs(5))?;
    let r = request(bed, "tcp", "10.96.0.50:80", 100)?;
    ensure!(r.errors.is_empty(), "{:?}", r.errors.first());
    let pods: Vec<String> = r.pods().into_keys().collect();
    ensure!(
        pods == ["pod1"],
        "only the endpoint on node-1 may answer: {:?}",
        r.pods()
    );
    Ok(())
}

/// A pod reaches itself through its own service. In the nftables
/// datapath the DNATed packet goes back out the pod's own veth with the
/// pod's address as source and as destination: only the hairpin
/// masquerade (the node's address as source) lets the pod accept it and
/// its replies come back through the node's reverse NAT. The eBPF
/// datapath connects the socket straight to the endpoint.
pub(super) fn hairpin(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let svc = svc("self", "10.96.0.90");
    apply_service(bed, &svc, false, &[(0, "node-1")])?;
    let pod1 = bed.pods[0].netns.clone();
    wait_until_served_from(
        bed,
        Some(&pod1),
        "tcp",
        "10.96.0.90:80",
        Duration::from_secs(5),
        CLIENT_TIMEOUT,
    )?;
    let r = request_from(bed, Some(&pod1), "tcp", "10.96.0.90:80", 20, CLIENT_TIMEOUT)?;
    assert_spread(&r, 20, &["pod1"], 1.0)?;
    assert_peer_is(&r, "10.96.0.90:80")
}

pub(super) fn ipv6(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let svc = Svc {
        ports: &[("http", "TCP", 80, 8080), ("dns", "UDP", 53, 5353)],
        spec: &["ipFamilies: [IPv6]"],
        ..svc("web6", "fd00:96::10")
    };
    apply_service(bed, &svc, true, &three_pods())?;
    wait_until_served(bed, "tcp", "[fd00:96::10]:80", Duration::from_secs(5))?;
    let r = request(bed, "tcp", "[fd00:96::10]:80", 150)?;
    assert_spread(&r, 150, &["pod1", "pod2", "pod3"], 0.15)?;
    assert_peer_is(&r, "[fd00:96::10]:80")?;
    let r = request(bed, "udp", "[fd00:96::10]:53", 60)?;
    ensure!(r.errors.is_empty(), "{:?}", r.errors.first());
    assert_peer_is(&r, "[fd00:96::10]:53")
}
