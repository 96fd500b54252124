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

use std::sync::Arc;

use ebpf_kube_proxy::apply::Applier;
use ebpf_kube_proxy::datapath::ebpf::{self, EbpfDatapath};
use ebpf_kube_proxy::model::testing;
use ebpf_kube_proxy::model::{LocalState, Protocol, ServiceEndpoints};
use serde_json::Value;
use test_support::netns;

mod common;
use common::kernel::Env;
use common::tc_bed::{self, CLIENT_NS, NODE_NS, POD_NS};

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

const REMOTE_NS: &str = "remote";

/// The namespaces of the picture above, wired and addressed.
fn build(env: &mut Env) {
    tc_bed::build(env, 77, REMOTE_NS);
    env.ip_all(&[
        (REMOTE_NS, "addr add 10.77.2.10/32 dev lo"),
        (NODE_NS, "route add 10.77.2.0/24 via 192.168.78.2"),
    ]);
}

/// A client in the client namespace.
fn client(env: &Env, args: &[&str]) -> Value {
    env.python_json(CLIENT_NS, CLIENT, args)
}

struct Ep {
    ip: &'static str,
    port: u16,
    local: bool,
}

/// A NodePort service with one port `p` (TCP or UDP) 80, node port
/// `node_port`; every endpoint serves on its own port.
fn service(name: &str, proto: Protocol, node_port: u16, endpoints: &[Ep]) -> ServiceEndpoints {
    let se = testing::service("test", name, &[])
        .with_ports(&[("p", proto, 80)])
        .with_node_port(node_port);
    endpoints
        .iter()
        .fold(se, |se, e| se.with_ready_endpoint(e.ip, e.port, e.local))
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

#[test]
fn node_external_traffic_is_translated_by_the_tc_programs() {
    let Some(mut env) = Env::new("ebpf_nodeport", "np") else {
        return;
    };
    build(&mut env);
    env.serve(POD_NS, SERVER, &["pod", "10.77.1.10", "8080"]);
    env.serve(POD_NS, SERVER, &["pod6", "fd77:1::10", "8080"]);
    env.serve(REMOTE_NS, SERVER, &["remote", "10.77.2.10", "8080"]);
    env.serve(NODE_NS, SERVER, &["node", "192.168.77.1", "9000"]);

    // Everything below reads and attaches in the node namespace only.
    netns::enter(&env.ns(NODE_NS)).unwrap();
    let config = env.config(ebpf::generation::DEFAULT_MAP_SIZE, &[]);
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
        service("etp-local", Protocol::Tcp, 30082, &[remote()]).with_external_policy_local(),
        service("both", Protocol::Tcp, 30083, &[local(), remote()]),
        service("v6", Protocol::Tcp, 30084, &[local6]),
        service("sticky", Protocol::Tcp, 30087, &[local(), remote()]).with_affinity(60),
        service("fw", Protocol::Tcp, 30085, &[local()])
            .with_load_balancer_ips(&["203.0.113.10"])
            .with_source_ranges(&["198.51.100.0/24"]),
        service("open", Protocol::Tcp, 30086, &[local()])
            .with_load_balancer_ips(&["203.0.113.11"])
            .with_source_ranges(&["192.168.77.0/24"]),
    ]);
    dp.apply(&Arc::new(state)).expect("apply");
    env.ip(
        CLIENT_NS,
        &["route", "add", "203.0.113.0/24", "via", "192.168.77.1"],
    );

    // DNAT to a local pod: the client's address is kept.
    let r = client(&env, &["tcp", "192.168.77.1", "30080"]);
    assert_eq!(reply(&r), ("pod".into(), "192.168.77.2".into()), "{r}");
    // The node port answers on every node address, here the pod-facing one.
    let r = client(&env, &["tcp", "10.77.1.1", "30080"]);
    assert_eq!(reply(&r), ("pod".into(), "192.168.77.2".into()), "{r}");
    let r = client(&env, &["udp", "192.168.77.1", "30053"]);
    assert_eq!(reply(&r), ("pod".into(), "192.168.77.2".into()), "{r}");
    assert_eq!(
        r["from"][1], 30053,
        "the reply comes from the node port: {r}"
    );

    // A backend on another node: SNAT to the node's address towards it,
    // reverse NAT of the replies.
    let r = client(&env, &["tcp", "192.168.77.1", "30081"]);
    assert_eq!(reply(&r), ("remote".into(), "192.168.78.1".into()), "{r}");
    let r = client(&env, &["udp", "192.168.77.1", "30054"]);
    assert_eq!(reply(&r), ("remote".into(), "192.168.78.1".into()), "{r}");
    assert_eq!(r["from"][0], "192.168.77.1", "{r}");

    // eTP=Local without a local endpoint: dropped (the client times out).
    let r = client(&env, &["tcp", "192.168.77.1", "30082"]);
    assert!(
        r["error"].as_str().is_some_and(|e| e.contains("timed out")),
        "{r}"
    );

    // Conntrack: every packet of a connection goes to the backend its
    // first packet picked, while new connections spread.
    let r = client(&env, &["conversation", "192.168.77.1", "30083", "20"]);
    let replies: Vec<&str> = r["replies"]
        .as_array()
        .unwrap_or_else(|| panic!("{r}"))
        .iter()
        .map(|v| v.as_str().unwrap().split('|').next().unwrap())
        .collect();
    assert_eq!(replies.len(), 20, "{r}");
    assert!(replies.iter().all(|b| *b == replies[0]), "{r}");
    let r = client(&env, &["many", "192.168.77.1", "30083", "40"]);
    let mut seen: Vec<&str> = r["replies"]
        .as_array()
        .unwrap_or_else(|| panic!("{r}"))
        .iter()
        .map(|v| v.as_str().unwrap().split('|').next().unwrap())
        .collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen, ["pod", "remote"], "{r}");

    // ClientIP affinity: every new connection of this client goes to the
    // backend its first one picked.
    let r = client(&env, &["many", "192.168.77.1", "30087", "20"]);
    let mut sticky: Vec<&str> = r["replies"]
        .as_array()
        .unwrap_or_else(|| panic!("{r}"))
        .iter()
        .map(|v| v.as_str().unwrap().split('|').next().unwrap())
        .collect();
    assert_eq!(sticky.len(), 20, "{r}");
    sticky.dedup();
    assert_eq!(sticky.len(), 1, "{r}");

    // IPv6.
    let r = client(&env, &["tcp", "fd77::1", "30084"]);
    assert_eq!(reply(&r), ("pod6".into(), "fd77::2".into()), "{r}");

    // loadBalancerSourceRanges on the LB IP.
    let r = client(&env, &["tcp", "203.0.113.10", "80"]);
    assert!(r["error"].as_str().is_some(), "outside the ranges: {r}");
    let r = client(&env, &["tcp", "203.0.113.11", "80"]);
    assert_eq!(reply(&r), ("pod".into(), "192.168.77.2".into()), "{r}");
    // The node port of the same service has no ranges (as kube-proxy).
    let r = client(&env, &["tcp", "192.168.77.1", "30085"]);
    assert_eq!(reply(&r), ("pod".into(), "192.168.77.2".into()), "{r}");

    // Not a service: untouched.
    let r = client(&env, &["tcp", "192.168.77.1", "9000"]);
    assert_eq!(reply(&r), ("node".into(), "192.168.77.2".into()), "{r}");

    // `dump` reads it all back from the kernel.
    let d = ebpf::dump::read(&env.bpffs).expect("dump");
    let mut tc: Vec<String> =
        d.tc.iter()
            .map(|t| format!("{}/{}", t.interface, t.direction))
            .collect();
    tc.sort();
    assert_eq!(
        tc,
        [
            "n0/egress",
            "n0/ingress",
            "n1/egress",
            "n1/ingress",
            "np/egress",
            "np/ingress"
        ],
        "{d:?}"
    );
    let c = &d.conntrack;
    assert!(c.flows >= 40 && c.entries == 2 * c.flows, "{c:?}");
    assert!(c.snat_flows >= 2 && c.tcp_flows < c.flows, "{c:?}");
    for (stat, at_least) in [
        ("external_translated", 100),
        ("external_no_local_endpoint", 1),
        ("external_source_range_denied", 1),
    ] {
        assert!(d.stats[stat] >= at_least, "{stat}: {:?}", d.stats);
    }
    assert_eq!(d.stats["external_unroutable"], 0, "{:?}", d.stats);
    let text = ebpf::dump::text(&d);
    assert!(text.contains("n0/ingress=ekp_tc_ingress"), "{text}");
    assert!(
        text.contains("192.168.77.1:30082/TCP") && text.contains("(no endpoints: packets dropped)"),
        "{text}"
    );

    // cleanup detaches the tc programs too: the node port is gone.
    drop(dp);
    let report = ebpf::cleanup(&env.bpffs).expect("cleanup");
    assert_eq!(
        report
            .links
            .iter()
            .filter(|l| l.starts_with("ekp_tc_"))
            .count(),
        6,
        "{report:?}"
    );
    let r = client(&env, &["tcp", "192.168.77.1", "30080"]);
    assert!(r["error"].as_str().is_some(), "served after cleanup: {r}");
}
