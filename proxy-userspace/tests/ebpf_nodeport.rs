//! The tc programs in the real kernel (root only, and only when the binary
//! embeds the eBPF object): node ports, external and load-balancer IPs
//! reached by packets from another network namespace.
//!
//! ```text
//!  client ns            node ns (datapath opened here)          pod ns
//!  c0 192.168.77.2 ──── n0 192.168.77.1  np 10.77.1.1 ─────── p0 10.77.1.10
//!     fd77::2              fd77::1          fd77:1::1             fd77:1::10
//!                          n1 192.168.78.1 ──── r0 192.168.78.2   remote ns
//!                                              lo 10.77.2.10 (a pod of another node)
//! ```
//! The echo servers answer with their name and the peer address they saw,
//! so the test sees which backend answered and whether the source was
//! kept (local backend) or SNATed to the node (remote backend). Every
//! reply crossed the receiving kernel's checksum validation. The test
//! thread enters the node namespace, so the datapath finds and attaches to
//! the node's interfaces there only. All namespaces, pins and the cgroup
//! are removed on drop.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use ebpf_kube_proxy::apply::Applier;
use ebpf_kube_proxy::datapath::ebpf::{self, loader, EbpfConfig, EbpfDatapath};
use ebpf_kube_proxy::model::{
    EndpointConditions, EndpointHints, EndpointPort, EndpointScopes, IpSet, LocalEndpoint,
    LocalService, LocalServiceType, LocalState, ObjectKey, PortMapping, Protocol, ServiceEndpoints,
    TrafficPolicy,
};
use serde_json::Value;
use test_support::netns::{self, Netns};

/// argv: NAME ADDR PORT. TCP and UDP echo: "NAME|PEER|DATA".
const SERVER: &str = r#"
import socket, sys, threading
name, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
t = socket.socket(fam); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind((addr, port)); t.listen(128)
u = socket.socket(fam, socket.SOCK_DGRAM); u.bind((addr, port))
def conn(c, peer):
    with c:
        while True:
            d = c.recv(100)
            if not d:
                return
            c.sendall(("%s|%s|" % (name, peer[0])).encode() + d)
def udp():
    while True:
        d, a = u.recvfrom(100)
        u.sendto(("%s|%s|" % (name, a[0])).encode() + d, a)
threading.Thread(target=udp, daemon=True).start()
print("ready", flush=True)
while True:
    c, a = t.accept()
    threading.Thread(target=conn, args=(c, a), daemon=True).start()
"#;

/// argv: MODE HOST PORT [N]. One JSON line.
const CLIENT: &str = r#"
import json, socket, sys
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
fam = socket.AF_INET6 if ":" in host else socket.AF_INET
out = {}
try:
    if mode == "tcp":
        s = socket.socket(fam); s.settimeout(1)
        s.connect((host, port))
        s.sendall(b"hello")
        out["reply"] = s.recv(100).decode()
    elif mode == "udp":
        s = socket.socket(fam, socket.SOCK_DGRAM); s.settimeout(1)
        s.sendto(b"hello", (host, port))
        d, frm = s.recvfrom(100)
        out["reply"] = d.decode(); out["from"] = [frm[0], frm[1]]
    elif mode == "conversation":
        s = socket.socket(fam); s.settimeout(1)
        s.connect((host, port))
        replies = []
        for i in range(int(sys.argv[4])):
            s.sendall(b"m%d" % i)
            replies.append(s.recv(100).decode())
        out["replies"] = replies
    elif mode == "many":
        replies = []
        for i in range(int(sys.argv[4])):
            s = socket.socket(fam); s.settimeout(1)
            s.connect((host, port)); s.sendall(b"x")
            replies.append(s.recv(100).decode()); s.close()
        out["replies"] = replies
except OSError as e:
    out["error"] = str(e)
print(json.dumps(out), flush=True)
"#;

const CLIENT_NS: &str = "client";
const NODE_NS: &str = "node";
const POD_NS: &str = "pod";
const REMOTE_NS: &str = "remote";

struct Env {
    netns: Netns,
    prefix: String,
    bpffs: PathBuf,
    cgroup: PathBuf,
    children: Vec<Child>,
}

impl Drop for Env {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Err(e) = ebpf::cleanup(&self.bpffs) {
            eprintln!("cleanup of {}: {e}", self.bpffs.display());
        }
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

impl Env {
    fn ns(&self, short: &str) -> String {
        format!("{}-{short}", self.prefix)
    }

    fn ip(&self, short: &str, args: &[&str]) {
        self.netns.ip(&self.ns(short), args).unwrap();
    }

    fn build() -> Env {
        let pid = std::process::id();
        let prefix = format!("ekpnp{pid}");
        let cg_root = test_support::cgroup2_root().expect("a cgroup v2 mount");
        let mut env = Env {
            netns: Netns::default(),
            bpffs: PathBuf::from(format!("/sys/fs/bpf/ebpf-kube-proxy-nodeport-{pid}")),
            cgroup: cg_root.join(format!("ebpf-kube-proxy-nodeport-{pid}")),
            prefix,
            children: vec![],
        };
        std::fs::create_dir(&env.cgroup).expect("creating the test cgroup");
        for short in [CLIENT_NS, NODE_NS, POD_NS, REMOTE_NS] {
            let name = env.ns(short);
            env.netns.add(&name).unwrap();
        }
        let (c, n, p, r) = (
            env.ns(CLIENT_NS),
            env.ns(NODE_NS),
            env.ns(POD_NS),
            env.ns(REMOTE_NS),
        );
        env.netns.veth(&c, "c0", &n, "n0").unwrap();
        env.netns.veth(&p, "p0", &n, "np").unwrap();
        env.netns.veth(&r, "r0", &n, "n1").unwrap();
        for key in ["net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"] {
            env.netns.sysctl(&n, key, "1").unwrap();
        }
        env.ip(CLIENT_NS, &["addr", "add", "192.168.77.2/24", "dev", "c0"]);
        env.ip(
            CLIENT_NS,
            &["addr", "add", "fd77::2/64", "dev", "c0", "nodad"],
        );
        env.ip(
            CLIENT_NS,
            &["route", "add", "default", "via", "192.168.77.1"],
        );
        env.ip(
            CLIENT_NS,
            &["-6", "route", "add", "default", "via", "fd77::1"],
        );
        env.ip(NODE_NS, &["addr", "add", "192.168.77.1/24", "dev", "n0"]);
        env.ip(
            NODE_NS,
            &["addr", "add", "fd77::1/64", "dev", "n0", "nodad"],
        );
        env.ip(NODE_NS, &["addr", "add", "10.77.1.1/24", "dev", "np"]);
        env.ip(
            NODE_NS,
            &["addr", "add", "fd77:1::1/64", "dev", "np", "nodad"],
        );
        env.ip(NODE_NS, &["addr", "add", "192.168.78.1/24", "dev", "n1"]);
        env.ip(
            NODE_NS,
            &["route", "add", "10.77.2.0/24", "via", "192.168.78.2"],
        );
        env.ip(POD_NS, &["addr", "add", "10.77.1.10/24", "dev", "p0"]);
        env.ip(
            POD_NS,
            &["addr", "add", "fd77:1::10/64", "dev", "p0", "nodad"],
        );
        env.ip(POD_NS, &["route", "add", "default", "via", "10.77.1.1"]);
        env.ip(
            POD_NS,
            &["-6", "route", "add", "default", "via", "fd77:1::1"],
        );
        env.ip(REMOTE_NS, &["addr", "add", "192.168.78.2/24", "dev", "r0"]);
        env.ip(REMOTE_NS, &["addr", "add", "10.77.2.10/32", "dev", "lo"]);
        env.ip(
            REMOTE_NS,
            &["route", "add", "default", "via", "192.168.78.1"],
        );
        env
    }

    fn server(&mut self, short: &str, name: &str, addr: &str, port: u16) {
        let mut child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.ns(short)))
            .args(["python3", "-c", SERVER, name, addr, &port.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting an echo server");
        let stdout = child.stdout.take().expect("piped stdout");
        self.children.push(child);
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "echo server {name}");
    }

    /// A client in the client namespace.
    fn client(&self, args: &[&str]) -> Value {
        let out = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.ns(CLIENT_NS)))
            .args(["python3", "-c", CLIENT])
            .args(args)
            .output()
            .expect("running a client");
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "client {args:?}: {e}: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }
}

struct Ep {
    ip: &'static str,
    port: u16,
    local: bool,
}

/// A service with one port `p` (TCP or UDP) `port`, node port
/// `node_port`; every endpoint serves on its own port; `external` says
/// which endpoints carry the external scope (eTP).
fn service(name: &str, proto: Protocol, node_port: u16, endpoints: &[Ep]) -> ServiceEndpoints {
    ServiceEndpoints {
        service: LocalService {
            key: ObjectKey::new("test", name),
            uid: String::new(),
            service_type: LocalServiceType::NodePort,
            labels: BTreeMap::new(),
            created: None,
            cluster_ips: IpSet::default(),
            external_ips: IpSet::default(),
            load_balancer_ips: IpSet::default(),
            ports: vec![PortMapping {
                name: "p".to_owned(),
                protocol: proto,
                port: 80,
                node_port,
                target_port: 0,
                target_port_name: String::new(),
                app_protocol: String::new(),
            }],
            internal_traffic_policy: TrafficPolicy::Cluster,
            external_traffic_policy: TrafficPolicy::Cluster,
            session_affinity_timeout: None,
            health_check_node_port: 0,
            traffic_distribution: String::new(),
            load_balancer_source_ranges: vec![],
        },
        endpoints: endpoints
            .iter()
            .map(|e| LocalEndpoint {
                ip: e.ip.parse().unwrap(),
                hostname: String::new(),
                node_name: if e.local { "n1" } else { "n2" }.to_owned(),
                zone: String::new(),
                local: e.local,
                conditions: EndpointConditions {
                    ready: true,
                    serving: true,
                    terminating: false,
                },
                hints: EndpointHints::default(),
                ports: vec![EndpointPort {
                    name: "p".to_owned(),
                    protocol: proto,
                    port: e.port,
                    scopes: EndpointScopes {
                        cluster: true,
                        local: e.local,
                        internal: true,
                        external: true,
                    },
                }],
                target_ref: None,
            })
            .collect(),
        local_ready_endpoints_v4: 0,
        local_ready_endpoints_v6: 0,
    }
}

/// eTP=Local: the external scope holds only the local endpoints.
fn etp_local(mut se: ServiceEndpoints) -> ServiceEndpoints {
    se.service.external_traffic_policy = TrafficPolicy::Local;
    for e in &mut se.endpoints {
        for p in &mut e.ports {
            p.scopes.external = e.local;
        }
    }
    se
}

fn load_balancer(mut se: ServiceEndpoints, lb_ip: &str, ranges: &[&str]) -> ServiceEndpoints {
    se.service.service_type = LocalServiceType::LoadBalancer;
    let ip: IpAddr = lb_ip.parse().unwrap();
    se.service.load_balancer_ips = IpSet::from_ips([ip].iter());
    se.service.load_balancer_source_ranges = ranges.iter().map(|r| (*r).to_owned()).collect();
    se
}

fn reply(v: &Value) -> (String, String) {
    let r = v["reply"]
        .as_str()
        .unwrap_or_else(|| panic!("no reply: {v}"));
    let mut parts = r.splitn(3, '|');
    let name = parts.next().unwrap_or_default().to_owned();
    let peer = parts.next().unwrap_or_default().to_owned();
    (name, peer)
}

fn skip_reason() -> Option<&'static str> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces, BPF)");
    }
    if !ebpf::object_embedded() {
        return Some("this build has no eBPF object; run `cargo xtask build-ebpf --release`");
    }
    None
}

#[test]
fn node_external_traffic_is_translated_by_the_tc_programs() {
    if let Some(why) = skip_reason() {
        eprintln!("SKIP ebpf_nodeport: {why}");
        return;
    }
    let mut env = Env::build();
    env.server(POD_NS, "pod", "10.77.1.10", 8080);
    env.server(POD_NS, "pod6", "fd77:1::10", 8080);
    env.server(REMOTE_NS, "remote", "10.77.2.10", 8080);
    env.server(NODE_NS, "node", "192.168.77.1", 9000);

    // Everything below reads and attaches in the node namespace only.
    netns::enter(&env.ns(NODE_NS)).unwrap();
    let config = EbpfConfig {
        bpffs_root: env.bpffs.clone(),
        cgroup_path: Some(env.cgroup.clone()),
        map_size: ebpf::generation::DEFAULT_MAP_SIZE,
        nodeport_addresses: Vec::new(),
    };
    let mut dp = Applier::new(Box::new(
        EbpfDatapath::open(&config).expect("loading the eBPF datapath"),
    ));
    let local = || Ep {
        ip: "10.77.1.10",
        port: 8080,
        local: true,
    };
    let remote = || Ep {
        ip: "10.77.2.10",
        port: 8080,
        local: false,
    };
    let local6 = Ep {
        ip: "fd77:1::10",
        port: 8080,
        local: true,
    };
    let state = LocalState::new(vec![
        service("local-tcp", Protocol::Tcp, 30080, &[local()]),
        service("local-udp", Protocol::Udp, 30053, &[local()]),
        service("remote-tcp", Protocol::Tcp, 30081, &[remote()]),
        service("remote-udp", Protocol::Udp, 30054, &[remote()]),
        etp_local(service("etp-local", Protocol::Tcp, 30082, &[remote()])),
        service("both", Protocol::Tcp, 30083, &[local(), remote()]),
        service("v6", Protocol::Tcp, 30084, &[local6]),
        load_balancer(
            service("fw", Protocol::Tcp, 30085, &[local()]),
            "203.0.113.10",
            &["198.51.100.0/24"],
        ),
        load_balancer(
            service("open", Protocol::Tcp, 30086, &[local()]),
            "203.0.113.11",
            &["192.168.77.0/24"],
        ),
    ]);
    dp.apply(&Arc::new(state)).expect("apply");
    env.ip(
        CLIENT_NS,
        &["route", "add", "203.0.113.0/24", "via", "192.168.77.1"],
    );

    // DNAT to a local pod: the client's address is kept.
    let r = env.client(&["tcp", "192.168.77.1", "30080"]);
    assert_eq!(reply(&r), ("pod".into(), "192.168.77.2".into()), "{r}");
    // The node port answers on every node address, here the pod-facing one.
    let r = env.client(&["tcp", "10.77.1.1", "30080"]);
    assert_eq!(reply(&r), ("pod".into(), "192.168.77.2".into()), "{r}");
    let r = env.client(&["udp", "192.168.77.1", "30053"]);
    assert_eq!(reply(&r), ("pod".into(), "192.168.77.2".into()), "{r}");
    assert_eq!(
        r["from"][1], 30053,
        "the reply comes from the node port: {r}"
    );

    // A backend on another node: SNAT to the node's address towards it,
    // reverse NAT of the replies.
    let r = env.client(&["tcp", "192.168.77.1", "30081"]);
    assert_eq!(reply(&r), ("remote".into(), "192.168.78.1".into()), "{r}");
    let r = env.client(&["udp", "192.168.77.1", "30054"]);
    assert_eq!(reply(&r), ("remote".into(), "192.168.78.1".into()), "{r}");
    assert_eq!(r["from"][0], "192.168.77.1", "{r}");

    // eTP=Local without a local endpoint: dropped (the client times out).
    let r = env.client(&["tcp", "192.168.77.1", "30082"]);
    assert!(
        r["error"].as_str().is_some_and(|e| e.contains("timed out")),
        "{r}"
    );

    // Conntrack: every packet of a connection goes to the backend its
    // first packet picked, while new connections spread.
    let r = env.client(&["conversation", "192.168.77.1", "30083", "20"]);
    let replies: Vec<&str> = r["replies"]
        .as_array()
        .unwrap_or_else(|| panic!("{r}"))
        .iter()
        .map(|v| v.as_str().unwrap().split('|').next().unwrap())
        .collect();
    assert_eq!(replies.len(), 20, "{r}");
    assert!(replies.iter().all(|b| *b == replies[0]), "{r}");
    let r = env.client(&["many", "192.168.77.1", "30083", "40"]);
    let mut seen: Vec<&str> = r["replies"]
        .as_array()
        .unwrap_or_else(|| panic!("{r}"))
        .iter()
        .map(|v| v.as_str().unwrap().split('|').next().unwrap())
        .collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen, ["pod", "remote"], "{r}");

    // IPv6.
    let r = env.client(&["tcp", "fd77::1", "30084"]);
    assert_eq!(reply(&r), ("pod6".into(), "fd77::2".into()), "{r}");

    // loadBalancerSourceRanges on the LB IP.
    let r = env.client(&["tcp", "203.0.113.10", "80"]);
    assert!(r["error"].as_str().is_some(), "outside the ranges: {r}");
    let r = env.client(&["tcp", "203.0.113.11", "80"]);
    assert_eq!(reply(&r), ("pod".into(), "192.168.77.2".into()), "{r}");
    // The node port of the same service has no ranges (as kube-proxy).
    let r = env.client(&["tcp", "192.168.77.1", "30085"]);
    assert_eq!(reply(&r), ("pod".into(), "192.168.77.2".into()), "{r}");

    // Not a service: untouched.
    let r = env.client(&["tcp", "192.168.77.1", "9000"]);
    assert_eq!(reply(&r), ("node".into(), "192.168.77.2".into()), "{r}");

    // Both directions of every flow are tracked.
    let links = std::fs::read_dir(env.bpffs.join(loader::LINKS_DIR))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("ekp_tc_"))
        .count();
    assert_eq!(links, 6, "ingress and egress on n0, np and n1");
    drop(dp);
}
