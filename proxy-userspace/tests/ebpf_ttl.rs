//! The tc programs forward node-external traffic to a backend on another
//! node themselves (`bpf_redirect_neigh`), so they act as the router the
//! stack would be: the TTL (hop limit) of a packet they forward drops by
//! one, and a packet arriving with TTL 1 is not forwarded (the stack gets
//! it untranslated). Root only.
//!
//! ```text
//!  client ns            node ns (datapath opened here)     remote ns
//!  c0 192.168.81.2 ──── n0 192.168.81.1   n1 192.168.82.1 ──── r0 192.168.82.2
//!     fd81::2              fd81::1           fd82::1              fd82::2
//!                                                               lo 10.81.2.10, fd81:2::10
//! ```
//! The backend answers each datagram with the TTL (hop limit) it arrived
//! with: the client's packets leave it with 64, and the remote namespace
//! receives them on its own address (no hop there).

use std::sync::Arc;

use ebpf_kube_proxy::apply::Applier;
use ebpf_kube_proxy::datapath::ebpf::{self, EbpfDatapath};
use ebpf_kube_proxy::model::testing;
use ebpf_kube_proxy::model::{LocalState, Protocol, ServiceEndpoints};
use serde_json::Value;
use test_support::netns;

mod common;
use common::kernel::Env;

/// argv: ADDR PORT. UDP: answers "TTL" of each datagram.
const SERVER: &str = r#"
import socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
if ":" in addr:
    u = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    u.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVHOPLIMIT, 1)
else:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.setsockopt(socket.IPPROTO_IP, getattr(socket, "IP_RECVTTL", 12), 1)
u.bind((addr, port))
print("ready", flush=True)
while True:
    d, anc, _, a = u.recvmsg(100, socket.CMSG_SPACE(4))
    ttl = [int.from_bytes(c[2][:4], sys.byteorder) for c in anc]
    u.sendto(str(ttl[0] if ttl else -1).encode(), a)
"#;

/// argv: HOST PORT TTL. One datagram with that TTL (hop limit) on a
/// connected socket; the answer, or the error.
const CLIENT: &str = r#"
import json, socket, sys
host, port, ttl = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if ":" in host:
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, ttl)
else:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
s.settimeout(1)
out = {}
try:
    s.connect((host, port))
    s.send(b"x")
    out["ttl"] = int(s.recv(100))
except socket.timeout:
    out["error"] = "timeout"
except OSError as e:
    out["error"] = e.errno
print(json.dumps(out), flush=True)
"#;

const CLIENT_NS: &str = "client";
const NODE_NS: &str = "node";
const REMOTE_NS: &str = "remote";

fn build(env: &mut Env) {
    for short in [CLIENT_NS, NODE_NS, REMOTE_NS] {
        env.add_ns(short);
    }
    let (c, n, r) = (env.ns(CLIENT_NS), env.ns(NODE_NS), env.ns(REMOTE_NS));
    env.netns.veth(&c, "c0", &n, "n0").unwrap();
    env.netns.veth(&r, "r0", &n, "n1").unwrap();
    for key in ["net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"] {
        env.netns.sysctl(&n, key, "1").unwrap();
    }
    let config = [
        (CLIENT_NS, "addr add 192.168.81.2/24 dev c0"),
        (CLIENT_NS, "addr add fd81::2/64 dev c0 nodad"),
        (NODE_NS, "addr add 192.168.81.1/24 dev n0"),
        (NODE_NS, "addr add fd81::1/64 dev n0 nodad"),
        (NODE_NS, "addr add 192.168.82.1/24 dev n1"),
        (NODE_NS, "addr add fd82::1/64 dev n1 nodad"),
        (NODE_NS, "route add 10.81.2.0/24 via 192.168.82.2"),
        (NODE_NS, "-6 route add fd81:2::/64 via fd82::2"),
        (REMOTE_NS, "addr add 192.168.82.2/24 dev r0"),
        (REMOTE_NS, "addr add fd82::2/64 dev r0 nodad"),
        (REMOTE_NS, "addr add 10.81.2.10/32 dev lo"),
        (REMOTE_NS, "addr add fd81:2::10/128 dev lo"),
        (REMOTE_NS, "route add default via 192.168.82.1"),
        (REMOTE_NS, "-6 route add default via fd82::1"),
    ];
    env.ip_all(&config);
}

/// A UDP NodePort service whose one endpoint runs on another node.
fn service(name: &str, node_port: u16, backend: &str) -> ServiceEndpoints {
    testing::service("test", name, &[])
        .with_ports(&[("p", Protocol::Udp, 80)])
        .with_node_port(node_port)
        .with_ready_endpoint(backend, 8080, false)
}

/// A client in the client namespace.
fn client(env: &Env, args: &[&str]) -> Value {
    env.python_json(CLIENT_NS, CLIENT, args)
}

#[test]
fn forwarded_packets_lose_one_ttl_and_expiring_ones_are_not_forwarded() {
    let Some(mut env) = Env::new("ebpf_ttl", "tt") else {
        return;
    };
    build(&mut env);
    env.serve(REMOTE_NS, SERVER, &["10.81.2.10", "8080"]);
    env.serve(REMOTE_NS, SERVER, &["fd81:2::10", "8080"]);
    netns::enter(&env.ns(NODE_NS)).unwrap();
    let config = env.config(ebpf::generation::DEFAULT_MAP_SIZE, &[]);
    let mut dp = Applier::new(Box::new(
        EbpfDatapath::open(&config).expect("loading the eBPF datapath"),
    ));
    let state = LocalState::new(vec![
        service("v4", 30110, "10.81.2.10"),
        service("v6", 30111, "fd81:2::10"),
    ]);
    dp.apply(&Arc::new(state)).expect("apply");

    for (host, port) in [("192.168.81.1", "30110"), ("fd81::1", "30111")] {
        // One hop, the node's: 64 leaves the client, 63 reaches the backend.
        let r = client(&env, &[host, port, "64"]);
        assert_eq!(r["ttl"], 63, "{host}: {r}");
        // TTL 1 would expire at the node: the backend never sees it.
        let r = client(&env, &[host, port, "1"]);
        assert!(r["ttl"].is_null(), "{host}: forwarded with TTL 1: {r}");
    }
    let d = ebpf::dump::read(&env.bpffs).expect("dump");
    assert!(d.stats["external_ttl_exceeded"] >= 2, "{:?}", d.stats);
    drop(dp);
}
