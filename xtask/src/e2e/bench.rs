//! Datapath benchmarks on the mini node (root): the connect rate to a
//! ClusterIP through the eBPF datapath against the same connects made to the
//! pod IP directly, measured in the same run.

use std::path::Path;
use std::time::Instant;

use anyhow::{ensure, Result};

use super::bed::Bed;

const CONNECTS: usize = 3000;
const ROUNDS: usize = 3;

fn rate(bed: &Bed, target: &str) -> Result<f64> {
    let started = Instant::now();
    let lines = bed.client(
        None,
        &[
            "--proto",
            "tcp",
            "--target",
            target,
            "--count",
            &CONNECTS.to_string(),
        ],
    )?;
    let elapsed = started.elapsed().as_secs_f64();
    let ok = lines.iter().filter(|l| l.starts_with("ok ")).count();
    ensure!(
        ok == CONNECTS,
        "{target}: only {ok} of {CONNECTS} requests answered"
    );
    Ok(CONNECTS as f64 / elapsed)
}

pub fn connect_rate(root: &Path) -> Result<()> {
    let mut bed = Bed::new("ebpf", crate::paths::daemon_bin(root))?;
    let pod = bed.pods[0].ipv4.clone();
    bed.apply_manifests(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: bench, namespace: bench}}\n\
         spec: {{clusterIP: 10.96.0.90, ports: [{{name: http, port: 80, targetPort: 8080}}]}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: bench-1, namespace: bench, labels: {{kubernetes.io/service-name: bench}}}}\n\
         addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\n\
         endpoints: [{{addresses: [\"{pod}\"], nodeName: node-1}}]\n"
    ))?;
    bed.start_daemon()?;
    // Alternate the two so that machine noise hits both alike; best of N.
    let (mut direct, mut via_vip) = (0f64, 0f64);
    for _ in 0..ROUNDS {
        direct = direct.max(rate(&bed, &format!("{pod}:8080"))?);
        via_vip = via_vip.max(rate(&bed, "10.96.0.90:80")?);
    }
    let ratio = via_vip / direct;
    println!(
        "{:<44} {:>9.0} conn/s   {:>6.3}x direct to the pod IP ({:.0} conn/s)   target >= 0.98: {}",
        "ClusterIP connect+request (eBPF socket-LB)",
        via_vip,
        ratio,
        direct,
        if ratio >= 0.98 { "met" } else { "MISSED" }
    );
    bed.stop_daemon()
}
