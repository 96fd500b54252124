//! Tracked node-external flows whose backend stopped being one of its
//! service's are not sent to it any more: a UDP client that keeps its
//! source port reaches the new backend with its next datagram after an
//! apply that removed its backend or changed the target port, and a TCP
//! connection to a removed backend is reset. A backend that terminates
//! but still serves keeps its connections. Root only.
//!
//! ```text
//!  client ns            node ns (datapath opened here)     pod ns
//!  c0 192.168.80.2 ──── n0 192.168.80.1   np 10.80.1.1 ──── p0 10.80.1.10 (a)
//!                                                              10.80.1.11 (b, b2 on 8081)
//! ```
//! Every server is still running when its endpoint goes away, so a packet
//! translated by the flow's old entry would be answered by the old one.

use std::io::Write;
use std::sync::Arc;

use ebpf_kube_proxy::apply::Applier;
use ebpf_kube_proxy::datapath::ebpf::{self, EbpfDatapath};
use ebpf_kube_proxy::model::testing;
use ebpf_kube_proxy::model::{LocalState, Protocol, ServiceEndpoints};
use serde_json::Value;
use test_support::netns;

mod common;
use common::kernel::{Env, Piped};

/// argv: NAME ADDR PORT. TCP and UDP: answers "NAME".
const SERVER: &str = r#"
import socket, sys, threading
name, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind((addr, port)); t.listen(16)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((addr, port))
def conn(c):
    with c:
        while c.recv(100):
            c.sendall(name.encode())
def udp():
    while True:
        d, a = u.recvfrom(100)
        u.sendto(name.encode(), a)
threading.Thread(target=udp, daemon=True).start()
print("ready", flush=True)
while True:
    c, _ = t.accept()
    threading.Thread(target=conn, args=(c,), daemon=True).start()
"#;

/// argv: MODE HOST PORT. UDP from source port 40000, or one TCP
/// connection; one exchange per line read, one JSON line each.
const CLIENT: &str = r#"
import json, socket, sys
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "udp":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", 40000)); s.settimeout(0.5)
else:
    s = socket.socket(); s.settimeout(1)
    s.connect((host, port))
print("ready", flush=True)
for line in sys.stdin:
    out = {}
    try:
        if mode == "udp":
            s.sendto(b"x", (host, port))
            out["reply"] = s.recvfrom(100)[0].decode()
        else:
            s.sendall(b"x")
            d = s.recv(100)
            out["reply"] = d.decode() if d else None
    except socket.timeout:
        out["error"] = "timeout"
    except OSError as e:
        out["error"] = e.errno
    print(json.dumps(out), flush=True)
"#;

const CLIENT_NS: &str = "client";
const NODE_NS: &str = "node";
const POD_NS: &str = "pod";
const ECONNRESET: i64 = 104;

fn build(env: &mut Env) {
    for short in [CLIENT_NS, NODE_NS, POD_NS] {
        env.add_ns(short);
    }
    let (c, n, p) = (env.ns(CLIENT_NS), env.ns(NODE_NS), env.ns(POD_NS));
    env.netns.veth(&c, "c0", &n, "n0").unwrap();
    env.netns.veth(&p, "p0", &n, "np").unwrap();
    env.netns.sysctl(&n, "net.ipv4.ip_forward", "1").unwrap();
    let config = [
        (CLIENT_NS, "addr add 192.168.80.2/24 dev c0"),
        (CLIENT_NS, "route add default via 192.168.80.1"),
        (NODE_NS, "addr add 192.168.80.1/24 dev n0"),
        (NODE_NS, "addr add 10.80.1.1/24 dev np"),
        (POD_NS, "addr add 10.80.1.10/24 dev p0"),
        (POD_NS, "addr add 10.80.1.11/24 dev p0"),
        (POD_NS, "route add default via 10.80.1.1"),
    ];
    env.ip_all(&config);
}

/// A NodePort service, port 80 (TCP or UDP), node port `node_port`, with
/// ready local endpoints (address, port).
fn service(name: &str, proto: Protocol, node_port: u16, eps: &[(&str, u16)]) -> ServiceEndpoints {
    let se = testing::service("test", name, &[])
        .with_ports(&[("p", proto, 80)])
        .with_node_port(node_port);
    eps.iter()
        .fold(se, |se, (ip, port)| se.with_ready_endpoint(ip, *port, true))
}

/// `se` with its endpoint at `ip` terminating but still serving, as the
/// model gives it while other endpoints are ready: no scope picks it.
fn terminating(mut se: ServiceEndpoints, ip: &str) -> ServiceEndpoints {
    for e in se.endpoints.iter_mut().filter(|e| e.ip.to_string() == ip) {
        e.conditions.ready = false;
        e.conditions.terminating = true;
        let mut ports = e.ports.to_vec();
        for p in &mut ports {
            p.scopes = Default::default();
        }
        e.ports = ports.into();
    }
    se
}

fn start_client(env: &mut Env, args: &[&str]) -> Piped {
    let mut cmd = env.python(CLIENT_NS, CLIENT);
    cmd.args(args);
    let mut c = env.spawn(cmd);
    assert_eq!(c.line().trim(), "ready", "client {args:?}");
    c
}

fn exchange(c: &mut Piped) -> Value {
    writeln!(c.stdin).unwrap();
    c.stdin.flush().unwrap();
    c.json()
}

#[test]
fn flows_to_a_backend_that_left_its_service_are_not_translated_to_it() {
    let Some(mut env) = Env::new("ebpf_stale_flows", "sf") else {
        return;
    };
    build(&mut env);
    env.serve(POD_NS, SERVER, &["a", "10.80.1.10", "8080"]);
    env.serve(POD_NS, SERVER, &["b", "10.80.1.11", "8080"]);
    env.serve(POD_NS, SERVER, &["b2", "10.80.1.11", "8081"]);
    netns::enter(&env.ns(NODE_NS)).unwrap();
    let config = env.config(ebpf::generation::DEFAULT_MAP_SIZE, &[]);
    let mut dp = Applier::new(Box::new(
        EbpfDatapath::open(&config).expect("loading the eBPF datapath"),
    ));
    let a = ("10.80.1.10", 8080);
    let b = ("10.80.1.11", 8080);
    let b2 = ("10.80.1.11", 8081);
    let mut apply = |udp: &[(&str, u16)], tcp: ServiceEndpoints| {
        let state = LocalState::new(vec![service("u", Protocol::Udp, 30100, udp), tcp]);
        dp.apply(&Arc::new(state)).expect("apply");
    };
    let tcp = |eps: &[(&str, u16)]| service("t", Protocol::Tcp, 30101, eps);
    let drain = |eps: &[(&str, u16)]| service("d", Protocol::Tcp, 30102, eps);

    // One UDP flow (fixed source port) and two TCP connections, all to a.
    apply(&[a], tcp(&[a]));
    let mut u = start_client(&mut env, &["udp", "192.168.80.1", "30100"]);
    let mut t = start_client(&mut env, &["tcp", "192.168.80.1", "30101"]);
    assert_eq!(exchange(&mut u)["reply"], "a");
    assert_eq!(exchange(&mut t)["reply"], "a");

    // a leaves both services: the UDP flow's next datagram is b's, the TCP
    // connection is reset (its next segment reaches b, which has none).
    apply(&[b], tcp(&[b]));
    let r = exchange(&mut u);
    assert_eq!(r["reply"], "b", "the datagram after the update: {r}");
    let r = exchange(&mut t);
    assert_eq!(r["error"], ECONNRESET, "{r}");

    // The target port changes: the same flow moves on to b2.
    apply(&[b2], tcp(&[b]));
    let r = exchange(&mut u);
    assert_eq!(r["reply"], "b2", "after the target port changed: {r}");

    // A backend that terminates but still serves keeps its connection.
    let mut apply = |d: ServiceEndpoints| {
        let state = LocalState::new(vec![service("u", Protocol::Udp, 30100, &[b2]), d]);
        dp.apply(&Arc::new(state)).expect("apply");
    };
    apply(drain(&[a]));
    let mut d = start_client(&mut env, &["tcp", "192.168.80.1", "30102"]);
    assert_eq!(exchange(&mut d)["reply"], "a");
    apply(terminating(drain(&[a, b]), "10.80.1.10"));
    let r = exchange(&mut d);
    assert_eq!(
        r["reply"], "a",
        "a draining backend keeps its connection: {r}"
    );

    let flows = ebpf::dump::read(&env.bpffs).expect("dump").conntrack.flows;
    assert!(flows >= 1, "{flows}");
    drop(dp);
}
