//! The traffic half of `cargo xtask demo`: the e2e mini node, the daemon on
//! the eBPF datapath, and requests to a ClusterIP answered by different pods.

use std::path::Path;

use anyhow::Result;

use super::bed::Bed;

/// Runs the mini-node demo; needs root.
pub fn traffic(root: &Path) -> Result<()> {
    let mut bed = Bed::new("ebpf", crate::paths::daemon_bin(root))?;
    println!("==> mini node: {}", super::bed::describe(&bed));
    for p in &bed.pods {
        println!(
            "    {} in netns {}: {} / {} (netexec on tcp 8080)",
            p.name, p.netns, p.ipv4, p.ipv6
        );
    }
    let mut yaml = String::from(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\n\
         spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80, targetPort: 8080}]}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {name: web-1, namespace: demo, labels: {kubernetes.io/service-name: web}}\n\
         addressType: IPv4\nports: [{name: http, port: 8080, protocol: TCP}]\nendpoints:\n",
    );
    for (i, p) in bed.pods.iter().enumerate() {
        yaml.push_str(&format!(
            "- {{addresses: [\"{}\"], nodeName: node-{}, targetRef: {{kind: Pod, namespace: demo, name: {}}}}}\n",
            p.ipv4,
            i + 1,
            p.name
        ));
    }
    bed.apply_manifests(&yaml)?;
    println!("\n==> ebpf-kube-proxy --proxy-mode ebpf --source file (service demo/web 10.96.0.10:80 -> 3 pods)");
    bed.start_daemon()?;
    std::thread::sleep(std::time::Duration::from_millis(300));
    println!(
        "\n==> 9 requests from a process on the node to 10.96.0.10:80 (each a new connection):"
    );
    for line in bed.client(
        None,
        &[
            "--proto",
            "tcp",
            "--target",
            "10.96.0.10:80",
            "--count",
            "9",
        ],
    )? {
        println!("    {line}");
    }
    println!("\n==> ebpf-kube-proxy dump (the programmed eBPF maps)");
    let out = std::process::Command::new(&bed.daemon_bin)
        .arg("dump")
        .arg("--bpffs-root")
        .arg(&bed.bpffs)
        .output()?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    bed.stop_daemon()?;
    println!("\n==> cleaning up the mini node");
    Ok(())
}
