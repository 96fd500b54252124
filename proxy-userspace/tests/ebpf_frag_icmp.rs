//! What the tc programs' fast path does not parse, in the real kernel (root
//! only): the later fragments of a translated datagram (no ports in them)
//! and ICMP errors about a translated flow (the flow is in their quote).
//!
//! ```text
//!  client ns            node ns (datapath opened here)          pod ns
//!  c0 192.168.85.2 ──── n0 192.168.85.1  np 10.85.1.1 ─────── p0 10.85.1.10
//!     fd85::2              fd85::1          fd85:1::1             fd85:1::10
//!                          n1 192.168.86.1 ──── r0 192.168.86.2   router ns (another node)
//!                             fd86::1              fd86::2
//!                                                  r1 10.85.2.1 ──── b0 10.85.2.10, .11   backend ns
//!                                                     fd85:2::1         fd85:2::10, ::11
//! ```
//! Every link has an MTU of 1,500 bytes, but the router reaches
//! 10.85.2.10 and fd85:2::10 by routes of MTU 1,280: a packet bigger than
//! that, sent with "don't fragment" (all TCP segments, all IPv6 packets),
//! is answered with an ICMP fragmentation needed (packet too big) to its
//! source, the node's address (SNAT). The backend's own interface has
//! 1,500 bytes, so its TCP MSS does not keep the client's segments small.
//! The receiving kernels validate every checksum of what arrives (IP, UDP,
//! ICMP); a connected UDP socket reports a port unreachable only when its
//! quote is the socket's own flow, a TCP socket lowers its MSS only for a
//! quote of its own connection.

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

/// argv: NAME ADDR PORT. UDP: echo "NAME|PEER|DATA" (any size). TCP:
/// reads to the end, answers "NAME|PEER|<bytes read>".
const SERVER: &str = r#"
import socket, sys, threading
name, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
t = socket.socket(fam); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind((addr, port)); t.listen(16)
u = socket.socket(fam, socket.SOCK_DGRAM); u.bind((addr, port))
def conn(c, peer):
    with c:
        n = 0
        while True:
            d = c.recv(65536)
            if not d:
                break
            n += len(d)
        c.sendall(("%s|%s|%d" % (name, peer[0], n)).encode())
def udp():
    while True:
        d, a = u.recvfrom(65536)
        u.sendto(("%s|%s|" % (name, a[0])).encode() + d, a)
threading.Thread(target=udp, daemon=True).start()
print("ready", flush=True)
while True:
    c, a = t.accept()
    threading.Thread(target=conn, args=(c, a), daemon=True).start()
"#;

/// argv: MODE HOST PORT [SIZE]. One JSON line.
/// * udp: one datagram of SIZE bytes; the answer's name, peer and whether
///   the data came back whole;
/// * upload: a TCP connection sends SIZE bytes; the server's count;
/// * refused: a connected UDP socket sends one datagram; the errno of its
///   recv (111: the socket's own flow was refused).
const CLIENT: &str = r#"
import json, socket, sys, time
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
size = int(sys.argv[4]) if len(sys.argv) > 4 else 0
fam = socket.AF_INET6 if ":" in host else socket.AF_INET
data = bytes((i * 7) % 251 for i in range(size))
out = {}
t0 = time.monotonic()
try:
    if mode == "udp":
        s = socket.socket(fam, socket.SOCK_DGRAM); s.settimeout(2)
        s.sendto(data, (host, port))
        d, frm = s.recvfrom(65536)
        name, peer, echo = d.split(b"|", 2)
        out["name"], out["peer"] = name.decode(), peer.decode()
        out["whole"] = echo == data
        out["from"] = [frm[0], frm[1]]
    elif mode == "upload":
        s = socket.socket(fam); s.settimeout(5)
        s.connect((host, port))
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        r = b""
        while True:
            d = s.recv(100)
            if not d:
                break
            r += d
        name, peer, n = r.decode().split("|")
        out["name"], out["peer"], out["bytes"] = name, peer, int(n)
    else:
        s = socket.socket(fam, socket.SOCK_DGRAM); s.settimeout(2)
        s.connect((host, port))
        s.send(b"x")
        out["reply"] = s.recv(100).decode()
except socket.timeout:
    out["error"] = "timeout"
except OSError as e:
    out["error"] = e.errno
out["ms"] = (time.monotonic() - t0) * 1000
print(json.dumps(out), flush=True)
"#;

const ROUTER_NS: &str = "router";
const BACKEND_NS: &str = "backend";
const ECONNREFUSED: i64 = 111;

/// The five namespaces of the picture above, wired and addressed.
fn build(env: &mut Env) {
    tc_bed::build(env, 85, ROUTER_NS);
    env.add_ns(BACKEND_NS);
    let (r, b) = (env.ns(ROUTER_NS), env.ns(BACKEND_NS));
    env.netns.veth(&b, "b0", &r, "r1").unwrap();
    for key in ["net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"] {
        env.netns.sysctl(&r, key, "1").unwrap();
    }
    let config = [
        (NODE_NS, "addr add fd86::1/64 dev n1 nodad"),
        (NODE_NS, "route add 10.85.2.0/24 via 192.168.86.2"),
        (NODE_NS, "-6 route add fd85:2::/64 via fd86::2"),
        (ROUTER_NS, "addr add fd86::2/64 dev r0 nodad"),
        (ROUTER_NS, "addr add 10.85.2.1/24 dev r1"),
        (ROUTER_NS, "addr add fd85:2::1/64 dev r1 nodad"),
        (ROUTER_NS, "-6 route add default via fd86::1"),
        // The narrow path to the backend's first addresses.
        (ROUTER_NS, "route add 10.85.2.10/32 dev r1 mtu 1280"),
        (ROUTER_NS, "-6 route add fd85:2::10/128 dev r1 mtu 1280"),
        (BACKEND_NS, "addr add 10.85.2.10/24 dev b0"),
        (BACKEND_NS, "addr add 10.85.2.11/24 dev b0"),
        (BACKEND_NS, "addr add fd85:2::10/64 dev b0 nodad"),
        (BACKEND_NS, "addr add fd85:2::11/64 dev b0 nodad"),
        (BACKEND_NS, "route add default via 10.85.2.1"),
        (BACKEND_NS, "-6 route add default via fd85:2::1"),
    ];
    env.ip_all(&config);
}

/// A client in the client namespace.
fn client(env: &Env, args: &[&str]) -> Value {
    env.python_json(CLIENT_NS, CLIENT, args)
}

/// A NodePort service, port 80 of `proto`, on node port `node_port`, with
/// one ready endpoint.
fn service(name: &str, proto: Protocol, node_port: u16, ep: (&str, u16, bool)) -> ServiceEndpoints {
    testing::service("test", name, &[])
        .with_ports(&[("p", proto, 80)])
        .with_node_port(node_port)
        .with_ready_endpoint(ep.0, ep.1, ep.2)
}

/// Opens the datapath in the node namespace (the calling thread enters
/// it) and applies `services`.
fn datapath(env: &Env, services: Vec<ServiceEndpoints>) -> Applier {
    netns::enter(&env.ns(NODE_NS)).unwrap();
    let config = env.config(ebpf::generation::DEFAULT_MAP_SIZE, &[]);
    let mut dp = Applier::new(Box::new(
        EbpfDatapath::open(&config).expect("loading the eBPF datapath"),
    ));
    dp.apply(&Arc::new(LocalState::new(services)))
        .expect("apply");
    dp
}

#[test]
fn fragmented_datagrams_reach_local_and_remote_backends_and_come_back() {
    let Some(mut env) = Env::new("ebpf_frag_icmp", "fr") else {
        return;
    };
    build(&mut env);
    env.serve(POD_NS, SERVER, &["pod", "10.85.1.10", "8080"]);
    env.serve(POD_NS, SERVER, &["pod6", "fd85:1::10", "8080"]);
    env.serve(BACKEND_NS, SERVER, &["remote", "10.85.2.11", "8080"]);
    env.serve(BACKEND_NS, SERVER, &["remote6", "fd85:2::11", "8080"]);
    let dp = datapath(
        &env,
        vec![
            service("local", Protocol::Udp, 30110, ("10.85.1.10", 8080, true)),
            service("local6", Protocol::Udp, 30111, ("fd85:1::10", 8080, true)),
            service("remote", Protocol::Udp, 30112, ("10.85.2.11", 8080, false)),
            service("remote6", Protocol::Udp, 30113, ("fd85:2::11", 8080, false)),
        ],
    );
    // (node port, the node's address, backend, the source it sees).
    let cases = [
        ("30110", "192.168.85.1", "pod", "192.168.85.2"),
        ("30111", "fd85::1", "pod6", "fd85::2"),
        ("30112", "192.168.85.1", "remote", "192.168.86.1"),
        ("30113", "fd85::1", "remote6", "fd86::1"),
    ];
    for (port, host, name, peer) in cases {
        // Three fragments each way: the request and the echo.
        let r = client(&env, &["udp", host, port, "3000"]);
        assert_eq!(r["name"], name, "{host}:{port}: {r}");
        assert_eq!(r["peer"], peer, "{host}:{port}: {r}");
        assert_eq!(r["whole"], true, "{host}:{port}: {r}");
        assert_eq!(
            r["from"][0], host,
            "the answer comes from the node port: {r}"
        );
        assert_eq!(r["from"][1], port.parse::<u16>().unwrap(), "{r}");
    }
    // Small datagrams of the same flows still pass as before.
    let r = client(&env, &["udp", "192.168.85.1", "30112", "10"]);
    assert_eq!(r["whole"], true, "{r}");
    drop(dp);
}

#[test]
fn icmp_errors_of_translated_flows_reach_the_other_side_about_its_own_flow() {
    let Some(mut env) = Env::new("ebpf_frag_icmp", "ic") else {
        return;
    };
    build(&mut env);
    env.serve(BACKEND_NS, SERVER, &["remote", "10.85.2.10", "8080"]);
    env.serve(BACKEND_NS, SERVER, &["remote6", "fd85:2::10", "8080"]);
    // Nothing listens on port 9999: the backends answer port unreachable.
    let dp = datapath(
        &env,
        vec![
            service("pmtu", Protocol::Tcp, 30120, ("10.85.2.10", 8080, false)),
            service("pmtu6", Protocol::Tcp, 30121, ("fd85:2::10", 8080, false)),
            service("gone", Protocol::Udp, 30122, ("10.85.2.11", 9999, false)),
            service("gone6", Protocol::Udp, 30123, ("fd85:2::11", 9999, false)),
            service(
                "gone-local",
                Protocol::Udp,
                30124,
                ("10.85.1.10", 9999, true),
            ),
            service(
                "gone-local6",
                Protocol::Udp,
                30125,
                ("fd85:1::10", 9999, true),
            ),
        ],
    );

    // Path MTU discovery through the node port with SNAT: 200 kB in
    // segments of 1,448 bytes, which the router sends back as too big for
    // the narrow hop; the client learns the path's MTU and completes.
    for (host, port, name) in [
        ("192.168.85.1", "30120", "remote"),
        ("fd85::1", "30121", "remote6"),
    ] {
        let r = client(&env, &["upload", host, port, "200000"]);
        assert_eq!(r["name"], name, "{host}: {r}");
        assert_eq!(
            r["bytes"], 200_000,
            "{host}: the whole transfer arrived: {r}"
        );
    }

    // A backend that no longer serves the port: the client's own connected
    // socket learns it (ECONNREFUSED), from a backend on another node
    // (behind SNAT) and from one on this node.
    for (host, port) in [
        ("192.168.85.1", "30122"),
        ("fd85::1", "30123"),
        ("192.168.85.1", "30124"),
        ("fd85::1", "30125"),
    ] {
        let r = client(&env, &["refused", host, port]);
        assert_eq!(r["error"], ECONNREFUSED, "{host}:{port}: {r}");
    }
    drop(dp);
}
