//! Restarts and the kube source: traffic and affinity across a daemon
//! restart, the API server driving the datapath, long-lived UDP clients.

use std::io::{BufRead, BufReader};
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use super::*;

/// Runs a client (`args`, in `netns`) to its end while the daemon is
/// SIGKILLed after `before_kill` and started again `down` later; the
/// client's output lines. The client is waited for before a failed restart
/// is reported, so none is left running.
pub(super) fn lines_across_sigkill(
    bed: &mut Bed,
    netns: Option<&str>,
    args: &[&str],
    before_kill: Duration,
    down: Duration,
) -> Result<Vec<String>> {
    let mut client = bed.spawn_client(netns, args)?;
    let stdout = client.stdout.take().context("client stdout")?;
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    std::thread::sleep(before_kill);
    bed.kill_daemon();
    std::thread::sleep(down);
    let restarted = bed.start_daemon();
    let status = client.wait()?;
    let lines = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))?;
    restarted?;
    ensure!(status.success(), "client exited with {status}");
    Ok(lines)
}

pub(super) fn restart(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    apply_service(bed, &WEB, false, &three_pods())?;
    wait_until_served(bed, "tcp", "10.96.0.10:80", Duration::from_secs(5))?;
    let lines = lines_across_sigkill(
        bed,
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
        Duration::from_millis(1500),
        Duration::from_millis(1000),
    )?;
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
pub(super) fn affinity_restart(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let services: Vec<Svc> = [
        ("sticky-a", "10.96.0.140"),
        ("sticky-b", "10.96.0.141"),
        ("sticky-c", "10.96.0.142"),
    ]
    .into_iter()
    .map(|(name, cluster_ip)| Svc {
        spec: &[
            "sessionAffinity: ClientIP",
            "sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}",
        ],
        ..svc(name, cluster_ip)
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
    let marker = svc("sticky-marker", "10.96.0.143");
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
pub(super) fn kube_source(bed: &mut Bed) -> Result<()> {
    use serde_json::json;
    bed.stop_daemon()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    // The daemon runs in the node namespace: the API server listens there.
    let api =
        bed.in_node_netns(|| rt.block_on(crate::e2e::fake_apiserver::FakeApiServer::start()))?;
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
pub(super) fn udp_endpoint_replaced(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let svc = Svc {
        ports: &[("dns", "UDP", 53, 5353)],
        ..svc("resolver", "10.96.0.70")
    };
    apply_service(bed, &svc, false, &[(0, "node-1")])?;
    wait_until_served(bed, "udp", "10.96.0.70:53", Duration::from_secs(5))?;
    let client = udp_client(bed, None, "10.96.0.70:53", 4000)?;
    std::thread::sleep(Duration::from_millis(1000));
    apply_service(bed, &svc, false, &[(1, "node-1")])?;
    let tail = tail_of(client)?;
    let pods: Vec<String> = tail.pods().into_keys().collect();
    ensure!(
        pods == ["pod2"],
        "the last answers must come from the new endpoint: {:?} {:?}",
        tail.pods(),
        tail.errors.first()
    );
    Ok(())
}
