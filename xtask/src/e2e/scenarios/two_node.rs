//! Scenarios on two nodes behind a router (see `bed.rs`): NodePorts,
//! external and load-balancer IPs reached from the outside client, with
//! backends on the node the packet arrived at and on the other one;
//! externalTrafficPolicy Local, the health-check node port, hairpin, a
//! long-lived flow across a daemon crash, a connected UDP client whose
//! backend goes away, and which nftables tables exist.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use test_support::manifests::Endpoint;

use super::*;
use crate::e2e::bed::{self, Pod, NODE1, NODE2, OUTSIDE_IP, OUTSIDE_IPV6};

pub(super) const READY: &str = "{ready: true}";
pub(super) const TERMINATING: &str = "{ready: false, serving: true, terminating: true}";

/// The EndpointSlice of `svc` with `members`: (pod, its node, conditions).
pub(super) fn slice(svc: &Svc, v6: bool, members: &[(&Pod, &str, &str)]) -> String {
    let endpoints: Vec<Endpoint> = members
        .iter()
        .map(|(pod, node, conditions)| Endpoint {
            pod: Some(pod.name.clone()),
            conditions: (*conditions).to_owned(),
            ..Endpoint::ready(if v6 { &pod.ipv6 } else { &pod.ipv4 }, node)
        })
        .collect();
    test_support::manifests::slice_yaml(svc, if v6 { "v6" } else { "v4" }, v6, &endpoints)
}

/// Node 2 up, and a pod on each node: (node 1's pod1, node 2's n2pod1).
pub(super) fn two_nodes(bed: &mut Bed) -> Result<(Pod, Pod)> {
    ensure_daemon(bed)?;
    let remote = bed.node2()?.pods[0].clone();
    Ok((bed.pods[0].clone(), remote))
}

/// `ip:port`, bracketed for IPv6.
pub(super) fn at(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// Every request to `target` from outside was answered, by exactly
/// `pods`, and each pod in `sources` saw only the given source address.
fn assert_from_outside(
    bed: &Bed,
    proto: &str,
    target: &str,
    count: usize,
    pods: &[&str],
    sources: &[(&str, &str)],
) -> Result<()> {
    let r = request_from(
        bed,
        Some(&bed.outside_netns),
        proto,
        target,
        count,
        CLIENT_TIMEOUT,
    )?;
    let what = || format!("{target}/{proto} from the outside client");
    let mut pods = pods.to_vec();
    pods.sort_unstable();
    assert_spread(&r, count, &pods, 0.0).with_context(what)?;
    for (pod, source) in sources {
        let seen: Vec<&String> = r
            .seen
            .get(*pod)
            .map(|s| s.iter().collect())
            .unwrap_or_default();
        ensure!(
            seen == [source],
            "{}: {pod} saw the requests come from {seen:?}, expected {source}",
            what()
        );
    }
    Ok(())
}

/// eTP=Cluster, from outside, IPv4 and IPv6, TCP and UDP: node 1's
/// NodePort, the external IP and the load-balancer IP (routed to node 1),
/// and node 2's NodePort, each spread over a pod on node 1 and one on
/// node 2. A pod on the other node than the one the packet arrived at
/// sees that node's address as the source (the node SNATs so that the
/// reply comes back through it).
pub(super) fn cluster_policy_local_and_remote(bed: &mut Bed) -> Result<()> {
    let (local, remote) = two_nodes(bed)?;
    let families = [
        (
            false,
            "10.96.0.160",
            ["203.0.113.30"],
            ["203.0.113.31"],
            [30160, 30161],
        ),
        (
            true,
            "fd00:96::160",
            ["fd00:203::30"],
            ["fd00:203::31"],
            [30162, 30163],
        ),
    ];
    let mut manifests = Vec::new();
    for (v6, cluster_ip, external, lb, node_ports) in &families {
        let spec: &[&str] = if *v6 { &["ipFamilies: [IPv6]"] } else { &[] };
        let svc = Svc {
            kind: "LoadBalancer",
            ports: TCP_AND_UDP,
            node_ports,
            external_ips: external,
            lb_ips: lb,
            spec,
            ..svc(if *v6 { "cluster6" } else { "cluster4" }, cluster_ip)
        };
        manifests.push(svc.yaml());
        manifests.push(slice(
            &svc,
            *v6,
            &[(&local, NODE1.name, READY), (&remote, NODE2.name, READY)],
        ));
    }
    bed.apply_manifests(&docs(&manifests))?;
    let both = [local.name.as_str(), remote.name.as_str()];
    for &(v6, _, external, lb, [tcp_np, udp_np]) in &families {
        let (node1, node2) = if v6 {
            (NODE1.ipv6, NODE2.ipv6)
        } else {
            (NODE1.ip, NODE2.ip)
        };
        for (node, node_port, backend_elsewhere) in
            [(node1, tcp_np, &remote.name), (node2, tcp_np, &local.name)]
        {
            wait_until_served_from(
                bed,
                Some(&bed.outside_netns),
                "tcp",
                &at(node, node_port),
                Duration::from_secs(5),
                DROP_TIMEOUT,
            )?;
            let snat = [(backend_elsewhere.as_str(), node)];
            assert_from_outside(bed, "tcp", &at(node, tcp_np), 20, &both, &snat)?;
            assert_from_outside(bed, "udp", &at(node, udp_np), 20, &both, &snat)?;
        }
        // External and LB IPs arrive at node 1.
        let snat = [(remote.name.as_str(), node1)];
        for ip in [external[0], lb[0]] {
            assert_from_outside(bed, "tcp", &at(ip, 80), 20, &both, &snat)?;
            assert_from_outside(bed, "udp", &at(ip, 53), 20, &both, &snat)?;
        }
    }
    Ok(())
}

/// eTP=Local, IPv4 and IPv6, TCP and UDP: node 1, which has the service's
/// endpoints, serves its NodePort and the LB IP with the client's own
/// address as the source the pods see; node 2, which has none, drops
/// (neither answers nor refuses).
pub(super) fn local_policy_keeps_client_address(bed: &mut Bed) -> Result<()> {
    let (local, _) = two_nodes(bed)?;
    let other_local = bed.pods[1].clone();
    let families = [
        (
            false,
            "10.96.0.170",
            ["203.0.113.40"],
            [30170, 30171],
            32170,
        ),
        (
            true,
            "fd00:96::170",
            ["fd00:203::40"],
            [30172, 30173],
            32171,
        ),
    ];
    let hcnp: Vec<String> = families
        .iter()
        .map(|f| format!("healthCheckNodePort: {}", f.4))
        .collect();
    let mut manifests = Vec::new();
    for (i, (v6, cluster_ip, lb, node_ports, _)) in families.iter().enumerate() {
        let spec = [
            "externalTrafficPolicy: Local",
            hcnp[i].as_str(),
            if *v6 {
                "ipFamilies: [IPv6]"
            } else {
                "ipFamilies: [IPv4]"
            },
        ];
        let svc = Svc {
            kind: "LoadBalancer",
            ports: TCP_AND_UDP,
            node_ports,
            lb_ips: lb,
            spec: &spec,
            ..svc(if *v6 { "local6" } else { "local4" }, cluster_ip)
        };
        manifests.push(svc.yaml());
        manifests.push(slice(
            &svc,
            *v6,
            &[
                (&local, NODE1.name, READY),
                (&other_local, NODE1.name, READY),
            ],
        ));
    }
    bed.apply_manifests(&docs(&manifests))?;
    let pods = [local.name.as_str(), other_local.name.as_str()];
    for &(v6, _, lb, [tcp_np, udp_np], _) in &families {
        let (node1, node2, client) = if v6 {
            (NODE1.ipv6, NODE2.ipv6, OUTSIDE_IPV6)
        } else {
            (NODE1.ip, NODE2.ip, OUTSIDE_IP)
        };
        wait_until_served_from(
            bed,
            Some(&bed.outside_netns),
            "tcp",
            &at(node1, tcp_np),
            Duration::from_secs(5),
            DROP_TIMEOUT,
        )?;
        let kept = [(pods[0], client), (pods[1], client)];
        for (proto, target) in [
            ("tcp", at(node1, tcp_np)),
            ("udp", at(node1, udp_np)),
            ("tcp", at(lb[0], 80)),
            ("udp", at(lb[0], 53)),
        ] {
            assert_from_outside(bed, proto, &target, 20, &pods, &kept)?;
        }
        for (proto, target) in [("tcp", at(node2, tcp_np)), ("udp", at(node2, udp_np))] {
            let r = request_from(
                bed,
                Some(&bed.outside_netns),
                proto,
                &target,
                2,
                DROP_TIMEOUT,
            )?;
            assert_dropped(
                &r,
                &format!("{target}/{proto} on node 2, no local endpoint"),
            )?;
        }
    }
    Ok(())
}

/// An HTTP GET from the outside client: (status code, body).
pub(super) fn http_get(bed: &Bed, addr: SocketAddr) -> Result<(u16, String)> {
    bed::in_netns(&bed.outside_netns, move || -> Result<(u16, String)> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))
            .with_context(|| format!("connecting to {addr}"))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        write!(
            s,
            "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )?;
        let mut page = String::new();
        s.read_to_string(&mut page)?;
        let status = page
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .with_context(|| format!("no status line from {addr}: {page:?}"))?;
        let body = page.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        Ok((status, body.to_owned()))
    })?
}

/// The health-check node port of an eTP=Local LoadBalancer, as a cloud
/// load balancer probes it from outside: 200 with one local endpoint on
/// node 1, 503 on node 2 (none there), and 503 on node 1 within 2 s of
/// its endpoint turning terminating.
pub(super) fn health_check_node_port_flips(bed: &mut Bed) -> Result<()> {
    let (local, _) = two_nodes(bed)?;
    let svc = Svc {
        kind: "LoadBalancer",
        node_ports: &[30175],
        lb_ips: &["203.0.113.45"],
        spec: &["externalTrafficPolicy: Local", "healthCheckNodePort: 32175"],
        ..svc("hcnp", "10.96.0.175")
    };
    let manifests = |conditions: &str| {
        docs(&[
            svc.yaml(),
            slice(&svc, false, &[(&local, NODE1.name, conditions)]),
        ])
    };
    bed.apply_manifests(&manifests(READY))?;
    let node1: SocketAddr = at(NODE1.ip, 32175).parse()?;
    let node2: SocketAddr = at(NODE2.ip, 32175).parse()?;
    let expect = |bed: &Bed, addr, code: u16, endpoints: u32, within: Duration| -> Result<()> {
        let started = Instant::now();
        loop {
            let got = http_get(bed, addr);
            let wanted = format!("\"localEndpoints\": {endpoints},");
            match &got {
                Ok((c, body)) if *c == code && body.contains(&wanted) => return Ok(()),
                _ if started.elapsed() > within => {
                    bail!("{addr}: expected {code} with {wanted} within {within:?}, got {got:?}")
                }
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    };
    expect(bed, node1, 200, 1, Duration::from_secs(5)).context("node 1, endpoint ready")?;
    expect(bed, node2, 503, 0, Duration::from_secs(5)).context("node 2, no endpoint")?;
    bed.apply_manifests(&manifests(TERMINATING))?;
    expect(bed, node1, 503, 0, Duration::from_secs(2)).context("node 1, endpoint terminating")
}

/// A pod reaches its own node's NodePort and LB IP, and the other node's
/// NodePort, and is picked as the backend: the reply finds its way back
/// to the very pod that sent the request.
pub(super) fn hairpin_nodeport(bed: &mut Bed) -> Result<()> {
    let (local, _) = two_nodes(bed)?;
    let svc = Svc {
        kind: "LoadBalancer",
        node_ports: &[30180],
        lb_ips: &["203.0.113.50"],
        ..svc("hairpin-np", "10.96.0.180")
    };
    bed.apply_manifests(&docs(&[
        svc.yaml(),
        slice(&svc, false, &[(&local, NODE1.name, READY)]),
    ]))?;
    for target in [
        at(NODE1.ip, 30180),
        at("203.0.113.50", 80),
        at(NODE2.ip, 30180),
    ] {
        wait_until_served_from(
            bed,
            Some(&local.netns),
            "tcp",
            &target,
            Duration::from_secs(5),
            DROP_TIMEOUT,
        )
        .with_context(|| format!("{} to {target}", local.name))?;
        let r = request_from(bed, Some(&local.netns), "tcp", &target, 5, CLIENT_TIMEOUT)?;
        assert_spread(&r, 5, &[local.name.as_str()], 1.0)
            .with_context(|| format!("{} to {target}", local.name))?;
    }
    Ok(())
}

/// One TCP connection from outside through node 1's NodePort to a pod on
/// node 2 (DNAT and SNAT on node 1) keeps working while node 1's daemon is
/// SIGKILLed and started again: no request on it fails, none reconnects.
pub(super) fn nodeport_flow_survives_restart(bed: &mut Bed) -> Result<()> {
    let (_, remote) = two_nodes(bed)?;
    let svc = Svc {
        kind: "NodePort",
        node_ports: &[30190],
        ..svc("long-flow", "10.96.0.190")
    };
    bed.apply_manifests(&docs(&[
        svc.yaml(),
        slice(&svc, false, &[(&remote, NODE2.name, READY)]),
    ]))?;
    let target = at(NODE1.ip, 30190);
    let outside = bed.outside_netns.clone();
    wait_served_from_outside(bed, &target)?;
    let lines = super::restart::lines_across_sigkill(
        bed,
        Some(&outside),
        &[
            "--proto",
            "tcp",
            "--target",
            &target,
            "--hold",
            "--duration-ms",
            "4000",
            "--interval-ms",
            "20",
        ],
        Duration::from_millis(1000),
        Duration::from_millis(500),
    )?;
    let r = Results::parse(&lines);
    ensure!(
        r.errors.is_empty(),
        "{} of {} requests on the held connection failed, e.g. {:?}",
        r.errors.len(),
        lines.len(),
        r.errors.first()
    );
    ensure!(
        r.ok_count() > 100,
        "too few requests made ({}) to prove anything",
        r.ok_count()
    );
    assert_spread(&r, r.ok_count(), &[remote.name.as_str()], 1.0)?;
    let seen: Vec<&String> = r.seen.values().flatten().collect();
    ensure!(
        seen == [NODE1.ip],
        "node 2's pod saw {seen:?}, expected node 1's SNAT address {}",
        NODE1.ip
    );
    Ok(())
}

/// A UDP client in node 1's netns (inside the test cgroup) connect()s one
/// socket to a ClusterIP and keeps sending on it. Its backend leaves the
/// slice; within 1 s its sends reach the remaining backend. eBPF: the
/// socket is destroyed, its next send fails at once (EDESTADDRREQ, no
/// black hole) and the client connects again, as a resolver does, to a
/// live backend. nftables: the conntrack entry is flushed and the same
/// socket's next send goes to a live backend.
pub(super) fn connected_udp_follows_removed_backend(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let (a, b) = (bed.pods[0].clone(), bed.pods[1].clone());
    let svc = Svc {
        ports: &[("dns", "UDP", 53, 5353)],
        ..svc("connected-udp", "10.96.0.200")
    };
    let manifests =
        |members: &[(&Pod, &str, &str)]| docs(&[svc.yaml(), slice(&svc, false, members)]);
    bed.apply_manifests(&manifests(&[
        (&a, NODE1.name, READY),
        (&b, NODE1.name, READY),
    ]))?;
    let target = "10.96.0.200:53";
    wait_until_served(bed, "udp", target, Duration::from_secs(5))?;
    let mut client = bed.spawn_client(
        None,
        &[
            "--proto",
            "udp",
            "--target",
            target,
            "--reuse",
            "--connect",
            "--duration-ms",
            "3000",
            "--interval-ms",
            "20",
            "--timeout-ms",
            "200",
        ],
    )?;
    let stdout = client.stdout.take().context("client stdout")?;
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, String)>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    // The socket sticks to one backend: ten answers in a row from the same
    // pod name it (a cleanup of the service's fresh conntrack entries may
    // still move it once right after the service appeared).
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut run: (String, usize) = (String::new(), 0);
    while run.1 < 10 {
        let left = deadline.saturating_duration_since(Instant::now());
        let (_, line) = rx
            .recv_timeout(left)
            .context("the connected client gave no 10 answers in a row from one pod in 2 s")?;
        let pod = Results::parse(&[line]).pods().into_keys().next();
        run = match pod {
            Some(p) if p == run.0 => (p, run.1 + 1),
            Some(p) => (p, 1),
            None => (String::new(), 0),
        };
    }
    let (gone, live) = if run.0 == a.name { (&a, &b) } else { (&b, &a) };
    let removed = Instant::now();
    bed.apply_manifests(&manifests(&[(live, NODE1.name, READY)]))?;
    let status = client.wait()?;
    let _ = reader.join();
    ensure!(status.success(), "client exited with {status}");
    let after: Vec<String> = rx
        .try_iter()
        .filter(|(at, _)| *at > removed + Duration::from_secs(1))
        .map(|(_, line)| line)
        .collect();
    let after = Results::parse(&after);
    ensure!(
        after.ok_count() >= 20,
        "{} answers more than 1 s after the removal (errors: {:?})",
        after.ok_count(),
        after.errors.first()
    );
    assert_spread(&after, after.ok_count(), &[live.name.as_str()], 1.0)
        .with_context(|| format!("1 s after {} left the service", gone.name))
}

/// The node's `nft list tables`.
fn nft_tables(netns: &str) -> Result<String> {
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net=/run/netns/{netns}"))
        .args(["nft", "list", "tables"])
        .output()?;
    ensure!(
        out.status.success(),
        "nft list tables in {netns}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// With a NodePort/LB service with eTP=Local programmed and served from
/// outside on both nodes' daemons, the eBPF datapath has created no
/// nftables table in either node; the nftables datapath has its own (the
/// check reads the tables the way it would find them).
pub(super) fn nft_tables_only_in_nftables_mode(bed: &mut Bed) -> Result<()> {
    let (local, remote) = two_nodes(bed)?;
    let svc = Svc {
        kind: "LoadBalancer",
        ports: TCP_AND_UDP,
        node_ports: &[30195, 30196],
        lb_ips: &["203.0.113.55"],
        spec: &["loadBalancerSourceRanges: [\"192.168.0.0/16\"]"],
        ..svc("tables", "10.96.0.195")
    };
    bed.apply_manifests(&docs(&[
        svc.yaml(),
        slice(
            &svc,
            false,
            &[(&local, NODE1.name, READY), (&remote, NODE2.name, READY)],
        ),
    ]))?;
    for target in [
        at(NODE1.ip, 30195),
        at(NODE2.ip, 30195),
        at("203.0.113.55", 80),
    ] {
        wait_until_served_from(
            bed,
            Some(&bed.outside_netns),
            "tcp",
            &target,
            Duration::from_secs(5),
            DROP_TIMEOUT,
        )?;
    }
    let node2 = bed.node2()?.netns.clone();
    for netns in [bed.node_netns.clone(), node2] {
        let tables = nft_tables(&netns)?;
        let ours: Vec<&str> = tables
            .lines()
            .filter(|l| l.contains(proxy_table_name()))
            .collect();
        if bed.proxy_mode == "ebpf" {
            ensure!(
                ours.is_empty(),
                "eBPF mode, yet {netns} has nftables tables: {ours:?}"
            );
        } else {
            ensure!(
                !ours.is_empty(),
                "nftables mode, yet {netns} has no table of ours: {tables:?}"
            );
        }
    }
    Ok(())
}

/// The name of the nftables tables the daemon owns (one per family).
const fn proxy_table_name() -> &'static str {
    "ebpf-kube-proxy"
}
