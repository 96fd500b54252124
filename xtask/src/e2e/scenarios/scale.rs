//! Scale (issue 17): a cluster of 50,000 Services and 250,000 endpoints
//! programmed whole, and a sample of its Services served by real pods.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};

use super::*;

const SERVICES: usize = 50_000;
const ENDPOINTS_PER_SERVICE: usize = 5;
/// Services whose endpoints are the bed's three pods; every other one has
/// addresses that nothing answers on (they are programmed, never dialled).
const SAMPLED: [usize; 3] = [0, 24_999, SERVICES - 1];
/// Start to whole state programmed, with room for a loaded CI machine
/// (the goal, measured by `cargo xtask bench`, is seconds).
const PROGRAMMED_WITHIN: Duration = Duration::from_secs(180);

fn cluster_ip(i: usize) -> String {
    format!("10.100.{}.{}", i / 250, i % 250 + 1)
}

/// The whole cluster as one manifest file (about 40 MB).
fn manifests(bed: &Bed) -> String {
    let mut out = String::with_capacity(SERVICES * 800);
    for i in 0..SERVICES {
        let _ = write!(
            out,
            "apiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: scale}}\n\
             spec: {{clusterIP: {}, ports: [{{name: http, port: 80, targetPort: 8080}}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: s{i}-1, namespace: scale, labels: {{kubernetes.io/service-name: s{i}}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints:\n",
            cluster_ip(i)
        );
        if SAMPLED.contains(&i) {
            for pod in &bed.pods {
                let _ = writeln!(out, "- {{addresses: [\"{}\"], nodeName: node-2}}", pod.ipv4);
            }
        } else {
            for e in 0..ENDPOINTS_PER_SERVICE {
                let n = i * ENDPOINTS_PER_SERVICE + e;
                let _ = writeln!(
                    out,
                    "- {{addresses: [\"10.{}.{}.{}\"], nodeName: node-2}}",
                    200 + n / 65_536,
                    n / 256 % 256,
                    n % 256
                );
            }
        }
        out.push_str("---\n");
    }
    out
}

fn metric(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// 50k Services / 250k endpoints: the daemon publishes and programs all
/// of them, and the sampled Services answer from the bed's pods.
pub(super) fn fifty_thousand_services_programmed_and_served(bed: &mut Bed) -> Result<()> {
    // One daemon's cost is measured: node 2's (when a scenario started it)
    // would program the same 50k services on the same cores.
    bed.stop_node2_daemon();
    ensure_daemon(bed)?;
    let started = Instant::now();
    bed.apply_manifests(&manifests(bed))?;
    let last = cluster_ip(SAMPLED[2]);
    let waited = wait_until_served(bed, "tcp", &format!("{last}:80"), PROGRAMMED_WITHIN)?;
    println!(
        "    50,000 services / ~250,000 endpoints: the last sampled service served {:.1}s after the manifests were written",
        waited.as_secs_f64()
    );
    let page = bed.metrics()?;
    let services = metric(&page, "ebpf_kube_proxy_localstate_services");
    let endpoints = metric(&page, "ebpf_kube_proxy_localstate_endpoints");
    ensure!(
        services == Some(SERVICES as f64),
        "localstate services {services:?}, want {SERVICES}"
    );
    ensure!(
        endpoints.is_some_and(|e| e >= ((SERVICES - SAMPLED.len()) * ENDPOINTS_PER_SERVICE) as f64),
        "localstate endpoints {endpoints:?}"
    );
    for i in SAMPLED {
        let target = format!("{}:80", cluster_ip(i));
        let r = request(bed, "tcp", &target, 30)?;
        ensure!(
            r.ok_count() == 30,
            "{target}: {} of 30 answered: {:?}",
            r.ok_count(),
            r.errors
        );
        let pods: Vec<String> = r.pods().into_keys().collect();
        ensure!(
            pods.iter().all(|p| bed.pods.iter().any(|b| &b.name == p)),
            "{target} answered by {pods:?}"
        );
    }
    println!("    scenario took {:.1}s", started.elapsed().as_secs_f64());
    // The next scenario starts from an empty cluster.
    bed.apply_manifests("")?;
    Ok(())
}
