//! A kube-proxy DaemonSet moves over unchanged: the argument list kubeadm
//! v1.33 gives kube-proxy and the KubeProxyConfiguration it writes start
//! this daemon (nftables mode; the file source stands in for the API
//! server, the one addition). Runs as root in private network and mount
//! namespaces, so the host's nftables, ports and /run are never touched.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::BIN;

/// The config.conf kubeadm v1.33 writes into the kube-proxy ConfigMap,
/// with mode nftables and values an operator set (masqueradeAll under
/// nftables; conntrack.maxPerCore, applied as kube-proxy applies it;
/// oomScoreAdj, which does not apply here).
const KUBEADM_V1_33_CONFIG: &str = r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: 32768
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: nftables
nftables:
  masqueradeAll: true
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: -999
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
"#;

fn root() -> bool {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() == 0 }
}

#[test]
fn kubeadm_v1_33_arguments_and_config_start_the_daemon() {
    if !root() {
        eprintln!("skipped: needs root for private network and mount namespaces");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.conf");
    std::fs::write(&config, KUBEADM_V1_33_CONFIG).unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    std::fs::write(
        manifests.join("svc.yaml"),
        common::service("default", "web", "10.96.0.10"),
    )
    .unwrap();

    // kube-proxy's container command in kubeadm's DaemonSet, with
    // $(NODE_NAME) expanded as the kubelet would.
    let kube_proxy_args = [
        format!("--config={}", config.display()),
        "--hostname-override=node-1".to_owned(),
    ];
    let script = format!(
        "ip link set lo up && mount -t tmpfs none /run && exec {BIN} \"$@\" --source=file --manifests={}",
        manifests.display()
    );
    let mut child = Command::new("unshare")
        .args(["--net", "--mount", "--", "sh", "-c", &script, "sh"])
        .args(&kube_proxy_args)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut log = Vec::new();
    let synced = loop {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) => {
                let done = line.contains("datapath synced") && line.contains("full");
                log.push(line);
                if done {
                    break true;
                }
            }
            Err(_) => break false,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let log = log.join("\n");
    assert!(synced, "no full sync within 30 s:\n{log}");
    assert!(
        log.contains("nftables"),
        "the config's mode is used:\n{log}"
    );
    assert!(!log.contains("ERROR"), "{log}");
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("oomScoreAdj") && l.contains("ignored")),
        "a value set in a field that does not apply is named:\n{log}"
    );
    // conntrack applies: kube-proxy's defaults where the file says null.
    assert!(
        log.contains("set net.netfilter.nf_conntrack_tcp_timeout_established"),
        "conntrack is applied:\n{log}"
    );
    for quiet in ["ipvs", "winkernel", "detectLocal", "nftables", "conntrack"] {
        assert!(
            !log.lines().any(|l| l.contains("WARN") && l.contains(quiet)),
            "{quiet} holds only zero values or ones in use: no warning:\n{log}"
        );
    }
}

/// nftables.masqueradeAll from the file takes effect like the flag, and
/// the written configuration keeps it.
#[test]
fn masquerade_all_from_the_kubeadm_config_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.conf");
    std::fs::write(&config, KUBEADM_V1_33_CONFIG).unwrap();
    let out_file = dir.path().join("written.yaml");
    let out = Command::new(BIN)
        .arg(format!("--config={}", config.display()))
        .arg("--hostname-override=node-1")
        .arg(format!("--write-config-to={}", out_file.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&out_file).unwrap();
    let written: serde_json::Value = ebpf_kube_proxy::yaml::from_str(&text).unwrap();
    for (field, expected) in [
        ("masqueradeAll", serde_json::json!(true)),
        ("mode", serde_json::json!("nftables")),
        ("clusterCIDR", serde_json::json!("10.244.0.0/16")),
        ("bindAddress", serde_json::json!("0.0.0.0")),
    ] {
        assert_eq!(written[field], expected, "{field}:\n{text}");
    }
}
