//! The e2e scenarios. Each writes its manifests, lets the daemon program
//! them, and asserts on what the client receives.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use super::bed::Bed;

/// A scenario that does not apply to this datapath: reported as SKIP and
/// counted apart, never as a pass.
#[derive(Debug)]
pub struct Skip(pub &'static str);

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Skip {}

pub struct Scenario {
    pub name: &'static str,
    pub run: fn(&mut Bed) -> Result<()>,
}

pub fn all() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "test-bed-pods-reachable-directly",
            run: pods_reachable,
        },
        Scenario {
            name: "clusterip-tcp-spreads-over-endpoints",
            run: clusterip_tcp,
        },
        Scenario {
            name: "clusterip-udp-spreads-over-endpoints",
            run: clusterip_udp,
        },
        Scenario {
            name: "multi-port-and-same-port-tcp-udp",
            run: multi_port,
        },
        Scenario {
            name: "endpoint-removed-and-added",
            run: endpoint_churn,
        },
        Scenario {
            name: "no-endpoints-refused-at-once",
            run: no_endpoints,
        },
        Scenario {
            name: "session-affinity-client-ip",
            run: session_affinity,
        },
        Scenario {
            name: "internal-traffic-policy-local",
            run: itp_local,
        },
        Scenario {
            name: "hairpin-pod-reaches-itself-through-its-service",
            run: hairpin,
        },
        Scenario {
            name: "ipv6-clusterip",
            run: ipv6,
        },
        Scenario {
            name: "daemon-sigkill-restart-no-failed-requests",
            run: restart,
        },
        Scenario {
            name: "session-affinity-survives-daemon-restart",
            run: affinity_restart,
        },
        Scenario {
            name: "kube-source-drives-the-datapath",
            run: kube_source,
        },
        Scenario {
            name: "udp-endpoint-replaced-long-lived-client-follows",
            run: udp_endpoint_replaced,
        },
        Scenario {
            name: "nodeport-from-outside-the-node",
            run: nodeport_outside,
        },
        Scenario {
            name: "ipv6-nodeport-from-outside",
            run: ipv6_nodeport_outside,
        },
        Scenario {
            name: "nodeport-addresses-narrow-node-ports",
            run: nodeport_addresses,
        },
        Scenario {
            name: "external-and-load-balancer-ips-from-outside",
            run: external_and_lb_ips,
        },
        Scenario {
            name: "load-balancer-source-ranges-filter",
            run: lb_source_ranges,
        },
        Scenario {
            name: "external-traffic-policy-local-nodeport",
            run: etp_local_nodeport,
        },
        Scenario {
            name: "auto-falls-back-to-nftables",
            run: auto_fallback,
        },
        Scenario {
            name: "cleanup-leaves-nothing-behind",
            run: cleanup,
        },
        Scenario {
            name: "contested-address-owned-by-the-older-service",
            run: claims::contested_address_goes_to_the_older_then_the_next,
        },
    ]
}

mod claims;

// ---- manifests ----

/// (name, protocol, port, targetPort).
type PortSpec = (&'static str, &'static str, u16, u16);

struct Svc<'a> {
    name: &'a str,
    cluster_ip: &'a str,
    ports: &'a [PortSpec],
    extra_spec: &'a str,
}

fn service_yaml(s: &Svc) -> String {
    let mut y = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {}, namespace: e2e}}\nspec:\n  clusterIP: {}\n{}  ports:\n",
        s.name, s.cluster_ip, s.extra_spec
    );
    for (name, proto, port, target) in s.ports {
        y.push_str(&format!(
            "  - {{name: {name:?}, protocol: {proto}, port: {port}, targetPort: {target}}}\n"
        ));
    }
    y
}

/// One slice of `svc` with the given pods (index into bed.pods, node name).
fn slice_yaml(bed: &Bed, svc: &Svc, v6: bool, members: &[(usize, &str)]) -> String {
    let mut y = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: {}-{}, namespace: e2e, labels: {{kubernetes.io/service-name: {}}}}}\n\
         addressType: {}\nports:\n",
        svc.name,
        if v6 { "v6" } else { "v4" },
        svc.name,
        if v6 { "IPv6" } else { "IPv4" }
    );
    for (name, proto, _, target) in svc.ports {
        y.push_str(&format!(
            "- {{name: {name:?}, protocol: {proto}, port: {target}}}\n"
        ));
    }
    y.push_str(if members.is_empty() {
        "endpoints: []\n"
    } else {
        "endpoints:\n"
    });
    for (i, node) in members {
        let pod = &bed.pods[*i];
        let addr = if v6 { &pod.ipv6 } else { &pod.ipv4 };
        y.push_str(&format!(
            "- {{addresses: [\"{addr}\"], nodeName: {node}, conditions: {{ready: true}}, targetRef: {{kind: Pod, namespace: e2e, name: {}}}}}\n",
            pod.name
        ));
    }
    y
}

/// Writes `svc` and one EndpointSlice of it with `members` as the
/// scenario's manifests.
fn apply_service(bed: &Bed, svc: &Svc, v6: bool, members: &[(usize, &str)]) -> Result<()> {
    bed.apply_manifests(&docs(&[
        service_yaml(svc),
        slice_yaml(bed, svc, v6, members),
    ]))
}

fn docs(parts: &[String]) -> String {
    parts.join("---\n")
}

const WEB: Svc = Svc {
    name: "web",
    cluster_ip: "10.96.0.10",
    ports: &[("http", "TCP", 80, 8080)],
    extra_spec: "",
};

fn three_pods() -> [(usize, &'static str); 3] {
    [(0, "node-1"), (1, "node-2"), (2, "node-3")]
}

// ---- client output ----

#[derive(Debug, Default)]
struct Results {
    /// "pod port=N" → count.
    answers: BTreeMap<String, usize>,
    peers: BTreeMap<String, usize>,
    errors: Vec<String>,
    /// Slowest error in ms.
    max_error_ms: u128,
}

impl Results {
    fn parse(lines: &[String]) -> Results {
        let mut r = Results::default();
        for l in lines {
            let ms: u128 = l
                .rsplit_once("ms=")
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0);
            if let Some(rest) = l.strip_prefix("ok ") {
                let mut words = rest.split_whitespace();
                let pod = words.next().unwrap_or("").to_owned();
                let port = words.next().unwrap_or("").to_owned();
                let peer = words
                    .next()
                    .and_then(|p| p.strip_prefix("peer="))
                    .unwrap_or("")
                    .to_owned();
                *r.answers.entry(format!("{pod} {port}")).or_default() += 1;
                *r.peers.entry(peer).or_default() += 1;
            } else {
                r.errors.push(l.clone());
                r.max_error_ms = r.max_error_ms.max(ms);
            }
        }
        r
    }

    fn pods(&self) -> BTreeMap<String, usize> {
        let mut pods = BTreeMap::new();
        for (k, v) in &self.answers {
            let pod = k.split_whitespace().next().unwrap_or("").to_owned();
            *pods.entry(pod).or_default() += v;
        }
        pods
    }

    fn ok_count(&self) -> usize {
        self.answers.values().sum()
    }
}

/// The client's own default timeout per request.
const CLIENT_TIMEOUT: Duration = Duration::from_millis(1000);

fn request(bed: &Bed, proto: &str, target: &str, count: usize) -> Result<Results> {
    request_from(bed, None, proto, target, count, CLIENT_TIMEOUT)
}

/// `count` requests from a client in `netns` (the node's when `None`),
/// each given `timeout` to connect and be answered.
fn request_from(
    bed: &Bed,
    netns: Option<&str>,
    proto: &str,
    target: &str,
    count: usize,
    timeout: Duration,
) -> Result<Results> {
    let lines = bed.client(
        netns,
        &[
            "--proto",
            proto,
            "--target",
            target,
            "--count",
            &count.to_string(),
            "--timeout-ms",
            &timeout.as_millis().to_string(),
        ],
    )?;
    Ok(Results::parse(&lines))
}

/// Retries single requests until one is answered (the daemon programs a
/// change asynchronously), up to `within`.
fn wait_until_served(bed: &Bed, proto: &str, target: &str, within: Duration) -> Result<Duration> {
    wait_until_served_from(bed, None, proto, target, within, CLIENT_TIMEOUT)
}

/// [`wait_until_served`] for a client in `netns`, each attempt given
/// `attempt_timeout` (short where the datapath drops until programmed).
fn wait_until_served_from(
    bed: &Bed,
    netns: Option<&str>,
    proto: &str,
    target: &str,
    within: Duration,
    attempt_timeout: Duration,
) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let r = request_from(bed, netns, proto, target, 1, attempt_timeout)?;
        if r.ok_count() == 1 {
            return Ok(started.elapsed());
        }
        if started.elapsed() > within {
            bail!(
                "{target}/{proto} not served within {within:?}: {:?}",
                r.errors
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn assert_spread(r: &Results, total: usize, expected_pods: &[&str], min_share: f64) -> Result<()> {
    ensure!(
        r.errors.is_empty(),
        "{} failed requests, e.g. {:?}",
        r.errors.len(),
        r.errors.first()
    );
    let pods = r.pods();
    let names: Vec<&str> = pods.keys().map(String::as_str).collect();
    ensure!(
        names == expected_pods,
        "answered by {pods:?}, expected exactly {expected_pods:?}"
    );
    for (pod, n) in &pods {
        let share = *n as f64 / total as f64;
        ensure!(
            share >= min_share,
            "{pod} answered {n}/{total} ({:.0}%), below {:.0}%: {pods:?}",
            share * 100.0,
            min_share * 100.0
        );
    }
    Ok(())
}

fn assert_peer_is(r: &Results, vip: &str) -> Result<()> {
    let peers: Vec<&String> = r.peers.keys().collect();
    ensure!(
        peers == [vip],
        "the application must see the service address {vip} as its peer, saw {:?}",
        r.peers
    );
    Ok(())
}

/// No request was answered, and none was refused either: the datapath
/// dropped them (a refusal comes from a reject verdict or, on a node
/// address, from a port nothing was DNATed on).
fn assert_dropped(r: &Results, what: &str) -> Result<()> {
    ensure!(
        r.ok_count() == 0,
        "{what}: {} requests answered, by {:?}",
        r.ok_count(),
        r.pods()
    );
    let refused: Vec<&String> = r.errors.iter().filter(|e| e.contains("refused")).collect();
    ensure!(
        refused.is_empty(),
        "{what}: refused instead of dropped: {:?}",
        refused.first()
    );
    Ok(())
}

fn ensure_daemon(bed: &mut Bed) -> Result<()> {
    if !bed.daemon_running() {
        bed.start_daemon()?;
    }
    Ok(())
}

// ---- scenarios ----

/// The bed itself: every pod answers on its own addresses, both families,
/// TCP and UDP, without any service involved.
fn pods_reachable(bed: &mut Bed) -> Result<()> {
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

fn clusterip_tcp(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    apply_service(bed, &WEB, false, &three_pods())?;
    wait_until_served(bed, "tcp", "10.96.0.10:80", Duration::from_secs(5))?;
    let r = request(bed, "tcp", "10.96.0.10:80", 300)?;
    assert_spread(&r, 300, &["pod1", "pod2", "pod3"], 0.15)?;
    assert_peer_is(&r, "10.96.0.10:80")
}

fn clusterip_udp(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let dns = Svc {
        name: "dns",
        cluster_ip: "10.96.0.53",
        ports: &[("dns", "UDP", 53, 5353)],
        extra_spec: "",
    };
    apply_service(bed, &dns, false, &three_pods())?;
    wait_until_served(bed, "udp", "10.96.0.53:53", Duration::from_secs(5))?;
    let r = request(bed, "udp", "10.96.0.53:53", 300)?;
    assert_spread(&r, 300, &["pod1", "pod2", "pod3"], 0.15)?;
    // recvmsg rev-NAT: the reply comes from the service address.
    assert_peer_is(&r, "10.96.0.53:53")
}

fn multi_port(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let svc = Svc {
        name: "multi",
        cluster_ip: "10.96.0.20",
        ports: &[
            ("http", "TCP", 80, 8080),
            ("admin", "TCP", 81, 8081),
            ("stream", "TCP", 53, 8082),
            ("dns", "UDP", 53, 5353),
        ],
        extra_spec: "",
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

fn endpoint_churn(bed: &mut Bed) -> Result<()> {
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

fn no_endpoints(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let empty = Svc {
        name: "empty",
        cluster_ip: "10.96.0.30",
        ports: &[("tcp", "TCP", 80, 8080), ("udp", "UDP", 53, 5353)],
        extra_spec: "",
    };
    // Program it with an endpoint first, so "refused" is the datapath's
    // answer for an empty service and not a missing service.
    apply_service(bed, &empty, false, &[(0, "node-1")])?;
    wait_until_served(bed, "tcp", "10.96.0.30:80", Duration::from_secs(5))?;
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
    Ok(())
}

fn session_affinity(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let svc = Svc {
        name: "sticky",
        cluster_ip: "10.96.0.40",
        ports: &[("http", "TCP", 80, 8080)],
        extra_spec: "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 1}}\n",
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

fn itp_local(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let svc = Svc {
        name: "local",
        cluster_ip: "10.96.0.50",
        ports: &[("http", "TCP", 80, 8080)],
        extra_spec: "  internalTrafficPolicy: Local\n",
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
fn hairpin(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let svc = Svc {
        name: "self",
        cluster_ip: "10.96.0.90",
        ports: &[("http", "TCP", 80, 8080)],
        extra_spec: "",
    };
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

fn ipv6(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let svc = Svc {
        name: "web6",
        cluster_ip: "fd00:96::10",
        ports: &[("http", "TCP", 80, 8080), ("dns", "UDP", 53, 5353)],
        extra_spec: "  ipFamilies: [IPv6]\n",
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

fn restart(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    apply_service(bed, &WEB, false, &three_pods())?;
    wait_until_served(bed, "tcp", "10.96.0.10:80", Duration::from_secs(5))?;
    let mut client = bed.spawn_client(
        None,
        &[
            "--proto",
            "tcp",
            "--target",
            "10.96.0.10:80",
            "--duration-ms",
            "6000",
            "--interval-ms",
            "10",
        ],
    )?;
    let stdout = client.stdout.take().context("client stdout")?;
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    std::thread::sleep(Duration::from_millis(1500));
    bed.kill_daemon();
    std::thread::sleep(Duration::from_millis(1000));
    bed.start_daemon()?;
    let status = client.wait()?;
    let lines = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))?;
    ensure!(status.success(), "client exited with {status}");
    let r = Results::parse(&lines);
    ensure!(
        r.ok_count() > 100,
        "too few requests made ({}) to prove anything",
        r.ok_count()
    );
    ensure!(
        r.errors.is_empty(),
        "{} of {} requests failed across the restart, e.g. {:?}",
        r.errors.len(),
        lines.len(),
        r.errors.first()
    );
    Ok(())
}

/// ClientIP affinity outlives a graceful restart of the daemon: every
/// client keeps its pod (nftables: the affinity sets whose name and timeout
/// did not change are kept; eBPF: the pinned affinity map, keyed by the
/// client's network namespace). 4 clients (the node and the three pods) on
/// 3 services make 12 independent picks among 3 endpoints; with the
/// affinity entries lost, all 12 would come out the same again with
/// p = 1/3^12 (about 2e-6).
fn affinity_restart(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let services: Vec<Svc> = [
        ("sticky-a", "10.96.0.140"),
        ("sticky-b", "10.96.0.141"),
        ("sticky-c", "10.96.0.142"),
    ]
    .into_iter()
    .map(|(name, cluster_ip)| Svc {
        name,
        cluster_ip,
        ports: &[("http", "TCP", 80, 8080)],
        extra_spec: "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}\n",
    })
    .collect();
    let manifests = |extra: &[&Svc]| {
        let mut parts = Vec::new();
        for svc in services.iter().chain(extra.iter().copied()) {
            parts.push(service_yaml(svc));
            parts.push(slice_yaml(bed, svc, false, &three_pods()));
        }
        docs(&parts)
    };
    // A service the stopped daemon never saw: once it answers, the new
    // daemon has programmed its first state (the old rules stay in place
    // meanwhile and would answer with the old affinity entries).
    let marker = Svc {
        name: "sticky-marker",
        cluster_ip: "10.96.0.143",
        ports: &[("http", "TCP", 80, 8080)],
        extra_spec: "",
    };
    let with_marker = manifests(&[&marker]);
    bed.apply_manifests(&manifests(&[]))?;
    let clients: Vec<Option<String>> = std::iter::once(None)
        .chain(bed.pods.iter().map(|p| Some(p.netns.clone())))
        .collect();
    let client_name = |c: &Option<String>| c.clone().unwrap_or_else(|| "the node".to_owned());
    for svc in &services {
        wait_until_served(
            bed,
            "tcp",
            &format!("{}:80", svc.cluster_ip),
            Duration::from_secs(5),
        )?;
    }
    // (client, service) → the pod it sticks to.
    let mut chosen = BTreeMap::new();
    for client in &clients {
        for svc in &services {
            let target = format!("{}:80", svc.cluster_ip);
            let r = request_from(bed, client.as_deref(), "tcp", &target, 10, CLIENT_TIMEOUT)?;
            ensure!(
                r.errors.is_empty(),
                "{target} from {}: {:?}",
                client_name(client),
                r.errors.first()
            );
            let pods: Vec<String> = r.pods().into_keys().collect();
            ensure!(
                pods.len() == 1,
                "10 requests from {} to {target} must hit one pod: {:?}",
                client_name(client),
                r.pods()
            );
            chosen.insert((client_name(client), svc.name), pods[0].clone());
        }
    }

    bed.stop_daemon()?;
    bed.apply_manifests(&with_marker)?;
    bed.start_daemon()?;
    wait_until_served_from(
        bed,
        None,
        "tcp",
        "10.96.0.143:80",
        Duration::from_secs(5),
        DROP_TIMEOUT,
    )
    .context("the restarted daemon's first state")?;

    let mut moved = Vec::new();
    for client in &clients {
        for svc in &services {
            let target = format!("{}:80", svc.cluster_ip);
            let r = request_from(bed, client.as_deref(), "tcp", &target, 20, CLIENT_TIMEOUT)?;
            ensure!(
                r.errors.is_empty(),
                "{target} from {} after the restart: {:?}",
                client_name(client),
                r.errors.first()
            );
            let before = &chosen[&(client_name(client), svc.name)];
            let pods: Vec<String> = r.pods().into_keys().collect();
            if pods != [before.clone()] {
                moved.push(format!(
                    "{} → {target}: {before} before, {:?} after",
                    client_name(client),
                    r.pods()
                ));
            }
        }
    }
    ensure!(
        moved.is_empty(),
        "{} of {} clients lost their pod across the restart: {moved:#?}",
        moved.len(),
        chosen.len()
    );
    Ok(())
}

/// The datapath programmed from the kube source: objects served by the
/// fake API server over real list/watch.
fn kube_source(bed: &mut Bed) -> Result<()> {
    use serde_json::json;
    bed.stop_daemon()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    // The daemon runs in the node namespace: the API server listens there.
    let api = bed.in_node_netns(|| rt.block_on(super::fake_apiserver::FakeApiServer::start()))?;
    let kubeconfig = bed.dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let pod_ips: Vec<String> = bed.pods.iter().map(|p| p.ipv4.clone()).collect();
    let endpoints = |n: usize| -> Vec<serde_json::Value> {
        pod_ips[..n]
            .iter()
            .enumerate()
            .map(|(i, ip)| json!({"addresses": [ip], "nodeName": format!("node-{}", i + 1), "conditions": {"ready": true}}))
            .collect()
    };
    let slice = |n: usize| {
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": "kweb-1", "namespace": "e2e", "labels": {"kubernetes.io/service-name": "kweb"}},
               "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
               "endpoints": endpoints(n)})
    };
    api.apply(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kweb", "namespace": "e2e"},
                     "spec": {"clusterIP": "10.96.0.60", "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}));
    api.apply(slice(3));
    api.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}}));
    bed.kubeconfig = Some(kubeconfig);
    let result = (|| -> Result<()> {
        bed.start_daemon()?;
        wait_until_served(bed, "tcp", "10.96.0.60:80", Duration::from_secs(5))?;
        let r = request(bed, "tcp", "10.96.0.60:80", 150)?;
        assert_spread(&r, 150, &["pod1", "pod2", "pod3"], 0.15)?;
        // An endpoint removed through the API server stops receiving.
        api.apply(slice(2));
        std::thread::sleep(Duration::from_secs(1));
        let r = request(bed, "tcp", "10.96.0.60:80", 60)?;
        ensure!(r.errors.is_empty(), "{:?}", r.errors.first());
        ensure!(
            !r.pods().contains_key("pod3"),
            "removed endpoint still reached: {:?}",
            r.pods()
        );
        Ok(())
    })();
    let _ = bed.stop_daemon();
    bed.kubeconfig = None;
    api.stop();
    result
}

/// A UDP client that keeps its source port (a resolver) is moved to the
/// new endpoint when its endpoint is replaced, although the old pod still
/// answers: the datapath must not keep the old flow (nftables: conntrack
/// entries deleted; eBPF: per-send rewrite).
fn udp_endpoint_replaced(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let svc = Svc {
        name: "resolver",
        cluster_ip: "10.96.0.70",
        ports: &[("dns", "UDP", 53, 5353)],
        extra_spec: "",
    };
    apply_service(bed, &svc, false, &[(0, "node-1")])?;
    wait_until_served(bed, "udp", "10.96.0.70:53", Duration::from_secs(5))?;
    let client = bed.spawn_client(
        None,
        &[
            "--proto",
            "udp",
            "--target",
            "10.96.0.70:53",
            "--duration-ms",
            "4000",
            "--interval-ms",
            "50",
            "--timeout-ms",
            "200",
            "--reuse",
        ],
    )?;
    std::thread::sleep(Duration::from_millis(1000));
    apply_service(bed, &svc, false, &[(1, "node-1")])?;
    let out = client.wait_with_output()?;
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    let tail = Results::parse(&lines[lines.len().saturating_sub(10)..]);
    let pods: Vec<String> = tail.pods().into_keys().collect();
    ensure!(
        pods == ["pod2"],
        "the last answers must come from the new endpoint: {:?} {:?}",
        tail.pods(),
        tail.errors.first()
    );
    Ok(())
}

/// A client outside the node reaches a NodePort on the node's address,
/// spread over the endpoints (eTP=Cluster).
fn nodeport_outside(bed: &mut Bed) -> Result<()> {
    if bed.proxy_mode == "ebpf" {
        return Err(Skip(NO_EXTERNAL_DATAPATH).into());
    }
    ensure_daemon(bed)?;
    let svc = Svc {
        name: "np",
        cluster_ip: "10.96.0.80",
        ports: &[("http", "TCP", 80, 8080)],
        extra_spec: "",
    };
    let service = "apiVersion: v1\nkind: Service\nmetadata: {name: np, namespace: e2e}\nspec:\n  type: NodePort\n  clusterIP: 10.96.0.80\n  ports:\n  - {name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30080}\n".to_owned();
    bed.apply_manifests(&docs(&[
        service,
        slice_yaml(bed, &svc, false, &three_pods()),
    ]))?;
    let target = format!("{}:30080", super::bed::NODE_EXTERNAL_IP);
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
fn nodeport_addresses(bed: &mut Bed) -> Result<()> {
    if bed.proxy_mode == "ebpf" {
        return Err(Skip(NO_EXTERNAL_DATAPATH).into());
    }
    let svc = Svc {
        name: "npa",
        cluster_ip: "10.96.0.150",
        ports: &[("http", "TCP", 80, 8080)],
        extra_spec: "  type: NodePort\n",
    };
    let service =
        service_yaml(&svc).replace("targetPort: 8080}", "targetPort: 8080, nodePort: 30150}");
    let target = format!("{}:30150", super::bed::NODE_EXTERNAL_IP);
    let outside = bed.outside_netns.clone();
    // A service only the second daemon knows: once it answers, that
    // daemon has replaced the first one's rules.
    let marker = Svc {
        name: "npa-marker",
        cluster_ip: "10.96.0.151",
        ports: &[("http", "TCP", 80, 8080)],
        extra_spec: "",
    };
    let run = |bed: &mut Bed, cidr: &str, with_marker: bool| -> Result<()> {
        if bed.daemon_running() {
            bed.stop_daemon()?;
        }
        bed.daemon_args = vec!["--nodeport-addresses".into(), cidr.into()];
        let mut manifests = vec![service.clone(), slice_yaml(bed, &svc, false, &three_pods())];
        if with_marker {
            manifests.push(service_yaml(&marker));
            manifests.push(slice_yaml(bed, &marker, false, &three_pods()));
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
fn ipv6_nodeport_outside(bed: &mut Bed) -> Result<()> {
    if bed.proxy_mode == "ebpf" {
        return Err(Skip(NO_EXTERNAL_DATAPATH).into());
    }
    ensure_daemon(bed)?;
    let svc = Svc {
        name: "np6",
        cluster_ip: "fd00:96::130",
        ports: &[("http", "TCP", 80, 8080)],
        extra_spec: "",
    };
    let service = "apiVersion: v1\nkind: Service\nmetadata: {name: np6, namespace: e2e}\nspec:\n  type: NodePort\n  clusterIP: fd00:96::130\n  ipFamilies: [IPv6]\n  ports:\n  - {name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30130}\n".to_owned();
    bed.apply_manifests(&docs(&[
        service,
        slice_yaml(bed, &svc, true, &three_pods()),
    ]))?;
    let target = format!("[{}]:30130", super::bed::NODE_EXTERNAL_IPV6);
    let outside = bed.outside_netns.clone();
    wait_until_served_from(
        bed,
        Some(&outside),
        "tcp",
        &target,
        Duration::from_secs(5),
        DROP_TIMEOUT,
    )
    .with_context(|| format!("from {} outside the node", super::bed::OUTSIDE_IPV6))?;
    let r = request_from(bed, Some(&outside), "tcp", &target, 90, CLIENT_TIMEOUT)?;
    assert_spread(&r, 90, &["pod1", "pod2", "pod3"], 0.1)
        .with_context(|| format!("from {} to {target}", super::bed::OUTSIDE_IPV6))
}

/// How long a request from outside gets before it counts as dropped: the
/// bed's veths answer in well under a millisecond.
const DROP_TIMEOUT: Duration = Duration::from_millis(300);

const NO_EXTERNAL_DATAPATH: &str =
    "the eBPF datapath has no tc programs for node-external traffic yet";

/// A LoadBalancer service `name` on `cluster_ip`, TCP 80 → 8080, with
/// `external_ip` in spec.externalIPs, `lb_ip` in
/// status.loadBalancer.ingress and `extra_spec` (indented two spaces).
/// Both addresses are outside every subnet of the bed: the outside
/// namespace sends them to the node along its default route, as a router
/// in front of the node would.
fn load_balancer_yaml(
    name: &str,
    cluster_ip: &str,
    external_ip: &str,
    lb_ip: &str,
    extra_spec: &str,
) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: e2e}}\n\
         spec:\n  type: LoadBalancer\n  clusterIP: {cluster_ip}\n  externalIPs: [\"{external_ip}\"]\n\
         {extra_spec}  ports:\n  - {{name: http, protocol: TCP, port: 80, targetPort: 8080}}\n\
         status:\n  loadBalancer:\n    ingress:\n    - {{ip: \"{lb_ip}\"}}\n"
    )
}

/// The Svc matching [`load_balancer_yaml`], for its EndpointSlice.
fn http_svc<'a>(name: &'a str, cluster_ip: &'a str) -> Svc<'a> {
    Svc {
        name,
        cluster_ip,
        ports: &[("http", "TCP", 80, 8080)],
        extra_spec: "",
    }
}

/// A client outside the node reaches the service on its external IP and
/// on its load-balancer IP (eTP=Cluster), spread over the endpoints.
fn external_and_lb_ips(bed: &mut Bed) -> Result<()> {
    if bed.proxy_mode == "ebpf" {
        return Err(Skip(NO_EXTERNAL_DATAPATH).into());
    }
    ensure_daemon(bed)?;
    let (external_ip, lb_ip) = ("203.0.113.20", "203.0.113.10");
    bed.apply_manifests(&docs(&[
        load_balancer_yaml("lb", "10.96.0.100", external_ip, lb_ip, ""),
        slice_yaml(bed, &http_svc("lb", "10.96.0.100"), false, &three_pods()),
    ]))?;
    let outside = bed.outside_netns.clone();
    for ip in [external_ip, lb_ip] {
        let target = format!("{ip}:80");
        wait_until_served_from(
            bed,
            Some(&outside),
            "tcp",
            &target,
            Duration::from_secs(5),
            DROP_TIMEOUT,
        )?;
        let r = request_from(bed, Some(&outside), "tcp", &target, 90, CLIENT_TIMEOUT)?;
        assert_spread(&r, 90, &["pod1", "pod2", "pod3"], 0.1)
            .with_context(|| format!("from outside to {target}"))?;
    }
    Ok(())
}

/// loadBalancerSourceRanges: a source outside the ranges is dropped on the
/// load-balancer IP (while the external IP, which the ranges do not cover,
/// still serves it); once the ranges include it, it is served.
fn lb_source_ranges(bed: &mut Bed) -> Result<()> {
    if bed.proxy_mode == "ebpf" {
        return Err(Skip(NO_EXTERNAL_DATAPATH).into());
    }
    ensure_daemon(bed)?;
    let (external_ip, lb_ip) = ("203.0.113.21", "203.0.113.11");
    let manifests = |ranges: &str| {
        docs(&[
            load_balancer_yaml(
                "fw",
                "10.96.0.110",
                external_ip,
                lb_ip,
                &format!("  loadBalancerSourceRanges: [{ranges}]\n"),
            ),
            slice_yaml(bed, &http_svc("fw", "10.96.0.110"), false, &three_pods()),
        ])
    };
    // The outside client is 192.168.100.2.
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
    bed.apply_manifests(&manifests("\"198.51.100.0/24\", \"192.168.100.0/24\""))?;
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

/// externalTrafficPolicy: Local on a node port: traffic from outside only
/// reaches the endpoint on this node (node-1, the daemon's
/// --hostname-override), and is dropped once no endpoint is local.
fn etp_local_nodeport(bed: &mut Bed) -> Result<()> {
    if bed.proxy_mode == "ebpf" {
        return Err(Skip(NO_EXTERNAL_DATAPATH).into());
    }
    ensure_daemon(bed)?;
    let svc = http_svc("etp", "10.96.0.120");
    let service = "apiVersion: v1\nkind: Service\nmetadata: {name: etp, namespace: e2e}\nspec:\n  type: NodePort\n  clusterIP: 10.96.0.120\n  externalTrafficPolicy: Local\n  ports:\n  - {name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30090}\n";
    let manifests = |members: &[(usize, &str)]| {
        docs(&[service.to_owned(), slice_yaml(bed, &svc, false, members)])
    };
    bed.apply_manifests(&manifests(&three_pods()))?;
    let target = format!("{}:30090", super::bed::NODE_EXTERNAL_IP);
    let outside = bed.outside_netns.clone();
    wait_until_served_from(
        bed,
        Some(&outside),
        "tcp",
        &target,
        Duration::from_secs(5),
        DROP_TIMEOUT,
    )?;
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
/// with the cause, and traffic flows through nftables. Only in the
/// nftables bed, whose node has the default route nftables needs.
fn auto_fallback(bed: &mut Bed) -> Result<()> {
    if bed.proxy_mode != "nftables" {
        return Err(Skip("runs in the nftables bed").into());
    }
    bed.stop_daemon()?;
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
    bed.proxy_mode = "nftables".to_owned();
    bed.daemon_env.clear();
    result
}

fn cleanup(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    apply_service(bed, &WEB, false, &three_pods())?;
    wait_until_served(bed, "tcp", "10.96.0.10:80", Duration::from_secs(5))?;
    bed.stop_daemon()?;
    bed.cleanup_command()?;
    let leftovers: Vec<_> = match std::fs::read_dir(&bed.bpffs) {
        Ok(entries) => entries.flatten().map(|e| e.path()).collect(),
        Err(_) => Vec::new(),
    };
    ensure!(leftovers.is_empty(), "pins left behind: {leftovers:?}");
    // No hook any more: the service address is just an unroutable address.
    let r = request(bed, "tcp", "10.96.0.10:80", 1)?;
    ensure!(
        r.ok_count() == 0,
        "the service still answers after cleanup: programs are still attached"
    );
    Ok(())
}
