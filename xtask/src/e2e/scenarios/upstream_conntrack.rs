//! Upstream Conntrack and KubeProxy tests: UDP flows that keep their
//! source port across backend changes, the INVALID-state remedy and the
//! conntrack timeouts kube-proxy sets.

use std::process::Command;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};

use super::*;
use crate::e2e::bed::NODE_EXTERNAL_IP;

/// From outside, a UDP client keeping its source port sends to node 1's
/// NodePort; its endpoint pod1 is replaced by pod2 (pod1 still answers,
/// as a pod that left the service but runs on): its last datagrams reach
/// pod2.
pub(super) fn udp_nodeport_server_cycles(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let s = Svc {
        kind: "NodePort",
        ports: &[("udp", "UDP", 80, 8080)],
        node_ports: &[30181],
        ..svc("svc-udp", "10.96.1.181")
    };
    let target = format!("{NODE_EXTERNAL_IP}:30181");
    apply_service(bed, &s, false, &[(0, "node-1")])?;
    let outside = bed.outside_netns.clone();
    wait_until_served_from(
        bed,
        Some(&outside),
        "udp",
        &target,
        Duration::from_secs(5),
        DROP_TIMEOUT,
    )?;
    let client = udp_client(bed, Some(&outside), &target, 5000)?;
    std::thread::sleep(Duration::from_millis(1000));
    apply_service(bed, &s, false, &[(1, "node-1")])?;
    let tail = tail_of(client)?;
    let pods: Vec<String> = tail.pods().into_keys().collect();
    ensure!(
        pods == ["pod2"],
        "4 s after pod1 left and pod2 joined, the client's last answers came from {:?} (errors {:?}), expected pod2 only",
        tail.pods(),
        tail.errors.first()
    );
    Ok(())
}

/// A UDP client keeping its source port sends to node 1's NodePort, from
/// a pod on the node and from outside; the service's target port changes
/// (same pod, 5353 → 8080): the last datagrams of both reach the new
/// port.
pub(super) fn udp_nodeport_target_port_changes(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let before = Svc {
        kind: "NodePort",
        ports: &[("udp", "UDP", 80, 5353)],
        node_ports: &[30182],
        ..svc("svc-udp-target", "10.96.1.182")
    };
    let after = Svc {
        ports: &[("udp", "UDP", 80, 8080)],
        ..before
    };
    let target = format!("{NODE_EXTERNAL_IP}:30182");
    apply_service(bed, &before, false, &[(0, "node-1")])?;
    let outside = bed.outside_netns.clone();
    let pod = bed.pods[1].netns.clone();
    for netns in [&outside, &pod] {
        wait_until_served_from(
            bed,
            Some(netns),
            "udp",
            &target,
            Duration::from_secs(5),
            DROP_TIMEOUT,
        )?;
    }
    let clients = [
        ("outside", udp_client(bed, Some(&outside), &target, 5000)?),
        ("pod2", udp_client(bed, Some(&pod), &target, 5000)?),
    ];
    std::thread::sleep(Duration::from_millis(1000));
    apply_service(bed, &after, false, &[(0, "node-1")])?;
    let mut wrong = Vec::new();
    for (who, client) in clients {
        let tail = tail_of(client)?;
        let answers: Vec<String> = tail.answers.keys().cloned().collect();
        if answers != ["pod1 port=8080"] {
            wrong.push(format!(
                "from {who}: {:?} (errors {:?})",
                tail.answers,
                tail.errors.first()
            ));
        }
    }
    ensure!(
        wrong.is_empty(),
        "4 s after the target port changed to 8080, the last answers were not all from pod1 port=8080: {}",
        wrong.join("; ")
    );
    Ok(())
}

/// A sysctl of the node's network namespace.
fn node_sysctl(bed: &Bed, key: &str) -> Result<String> {
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", bed.node_netns))
        .args(["sysctl", "-n", key])
        .output()?;
    ensure!(
        out.status.success(),
        "sysctl {key}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn set_node_sysctl(bed: &Bed, key: &str, value: &str) -> Result<()> {
    let st = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", bed.node_netns))
        .args(["sysctl", "-q", "-w", &format!("{key}={value}")])
        .status()?;
    ensure!(st.success(), "sysctl -w {key}={value} failed");
    Ok(())
}

/// A connection the backend has closed (CLOSE_WAIT) is kept by conntrack
/// for kube-proxy's default of one hour: the daemon sets
/// `nf_conntrack_tcp_timeout_close_wait` to 3600 in the node's network
/// namespace when it starts (the kernel default there is 60 s; the
/// scenario sets that first, then restarts the daemon).
pub(super) fn close_wait_timeout(bed: &mut Bed) -> Result<()> {
    const KEY: &str = "net.netfilter.nf_conntrack_tcp_timeout_close_wait";
    ensure_daemon(bed)?;
    set_node_sysctl(bed, KEY, "60")?;
    bed.stop_daemon()?;
    bed.start_daemon()?;
    let value = node_sysctl(bed, KEY)?;
    ensure!(
        value == "3600",
        "{KEY} in the node's network namespace is {value} after the daemon started, kube-proxy sets 3600"
    );
    Ok(())
}

/// kube-proxy's remedy for the INVALID conntrack state bug (an
/// out-of-window packet from a DNATed backend reaching the client
/// un-NATed): either a `ct state invalid drop` in a forward hook, or
/// `nf_conntrack_tcp_be_liberal=1`. Upstream accepts either; so does this
/// scenario, reading the node's ruleset and sysctl after the daemon has
/// programmed a service.
pub(super) fn invalid_state_not_forwarded(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    apply_service(
        bed,
        &svc("boom-server", "10.96.1.183"),
        false,
        &[(0, "node-1")],
    )?;
    wait_until_served(bed, "tcp", "10.96.1.183:80", Duration::from_secs(5))?;
    let liberal = node_sysctl(bed, "net.netfilter.nf_conntrack_tcp_be_liberal")?;
    if liberal == "1" {
        return Ok(());
    }
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", bed.node_netns))
        .args(["nft", "list", "ruleset"])
        .output()
        .context("nft list ruleset")?;
    let ruleset = String::from_utf8_lossy(&out.stdout);
    let drops_invalid_on_forward = ruleset.split("chain ").any(|chain| {
        chain.contains("hook forward")
            && chain
                .lines()
                .any(|l| l.contains("ct state invalid") && l.contains("drop"))
    });
    if !drops_invalid_on_forward {
        bail!(
            "nf_conntrack_tcp_be_liberal is {liberal} and no forward-hook chain drops `ct state invalid`: an out-of-window packet from a backend would reach its client un-NATed"
        );
    }
    Ok(())
}

/// For upstream tests that are N/A on every datapath (never called).
pub(super) fn not_run(_: &mut Bed) -> Result<()> {
    bail!("not applicable")
}
