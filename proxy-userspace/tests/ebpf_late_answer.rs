//! A backend that leaves its service while it still owes an answer: the
//! tc programs stop sending the client's packets to it, but the answer
//! to a request it has already acknowledged still reaches the client
//! (translated back to the node port), as with kube-proxy's conntrack.
//! Before, the flow's reply entry went with it, the answer left
//! untranslated and the client, whose request was acknowledged, waited
//! silently (the `sync-under-load` bench's hung NodePort connections).
//! Root only.
//!
//! ```text
//!  client ns            node ns (datapath opened here)     pod ns
//!  c0 192.168.82.2 ──── n0 192.168.82.1   np 10.82.1.1 ──── p0 10.82.1.10 (a)
//!                                                              10.82.1.11 (b)
//! ```

use std::io::Write;
use std::sync::Arc;

use ebpf_kube_proxy::apply::Applier;
use ebpf_kube_proxy::datapath::ebpf::{self, EbpfDatapath};
use ebpf_kube_proxy::model::testing;
use ebpf_kube_proxy::model::{LocalState, Protocol, ServiceEndpoints};
use test_support::netns;

mod common;
use common::kernel::Env;

/// argv: NAME ADDR PORT. For each connection: reads a request, says
/// "got" on stdout, waits for a line on stdin, then answers NAME.
const SERVER: &str = r#"
import socket, sys
name, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind((addr, port)); t.listen(16)
print("ready", flush=True)
while True:
    c, _ = t.accept()
    c.recv(100)
    print("got", flush=True)
    sys.stdin.readline()
    c.sendall(name.encode())
"#;

/// argv: HOST PORT. One connection, one request; then, for each line
/// read, the answer (2 s at most) as JSON.
const CLIENT: &str = r#"
import json, socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)
s.sendall(b"hello")
print("sent", flush=True)
sys.stdin.readline()
try:
    print(json.dumps({"reply": s.recv(100).decode()}), flush=True)
except socket.timeout:
    print(json.dumps({"error": "timeout"}), flush=True)
except OSError as e:
    print(json.dumps({"error": e.errno}), flush=True)
"#;

fn service(eps: &[&str]) -> ServiceEndpoints {
    let se = testing::service("test", "t", &[])
        .with_ports(&[("p", Protocol::Tcp, 80)])
        .with_node_port(30121);
    eps.iter()
        .fold(se, |se, ip| se.with_ready_endpoint(ip, 8080, true))
}

#[test]
fn a_backend_that_left_still_answers_what_it_acknowledged() {
    let Some(mut env) = Env::new("ebpf_late_answer", "la") else {
        return;
    };
    for short in ["client", "node", "pod"] {
        env.add_ns(short);
    }
    let (c, n, p) = (env.ns("client"), env.ns("node"), env.ns("pod"));
    env.netns.veth(&c, "c0", &n, "n0").unwrap();
    env.netns.veth(&p, "p0", &n, "np").unwrap();
    env.netns.sysctl(&n, "net.ipv4.ip_forward", "1").unwrap();
    env.ip_all(&[
        ("client", "addr add 192.168.82.2/24 dev c0"),
        ("client", "route add default via 192.168.82.1"),
        ("node", "addr add 192.168.82.1/24 dev n0"),
        ("node", "addr add 10.82.1.1/24 dev np"),
        ("pod", "addr add 10.82.1.10/24 dev p0"),
        ("pod", "addr add 10.82.1.11/24 dev p0"),
        ("pod", "route add default via 10.82.1.1"),
    ]);
    let (a, b) = ("10.82.1.10", "10.82.1.11");
    let mut server = {
        let mut cmd = env.python("pod", SERVER);
        cmd.args(["a", a, "8080"]);
        env.spawn(cmd)
    };
    assert_eq!(server.line().trim(), "ready");
    netns::enter(&env.ns("node")).unwrap();
    let config = env.config(ebpf::generation::DEFAULT_MAP_SIZE, &[]);
    let mut dp = Applier::new(Box::new(
        EbpfDatapath::open(&config).expect("loading the eBPF datapath"),
    ));
    dp.apply(&Arc::new(LocalState::new(vec![service(&[a])])))
        .unwrap();

    let mut client = {
        let mut cmd = env.python("client", CLIENT);
        cmd.args(["192.168.82.1", "30121"]);
        env.spawn(cmd)
    };
    assert_eq!(client.line().trim(), "sent");
    // a has the request (and has acknowledged it); then it leaves the
    // service, still running.
    assert_eq!(server.line().trim(), "got");
    dp.apply(&Arc::new(LocalState::new(vec![service(&[b])])))
        .unwrap();
    // It answers now; the client asks for what came.
    writeln!(server.stdin).unwrap();
    server.stdin.flush().unwrap();
    writeln!(client.stdin).unwrap();
    client.stdin.flush().unwrap();
    let r = client.json();
    assert_eq!(r["reply"], "a", "the answer of a after it left: {r}");
    drop(dp);
}
