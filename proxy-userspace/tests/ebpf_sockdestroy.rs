//! Socket destruction in the real kernel (root only, and only when the
//! binary embeds the eBPF object and the kernel has `bpf_sock_destroy`;
//! otherwise the test says why and passes).
//!
//! A client in the test cgroup, in a private network namespace, holds a
//! TCP and a connected UDP socket to an IPv4 ClusterIP and a TCP socket to
//! an IPv6 one (all balanced to backend `a`), and a TCP socket straight to
//! `a`'s address. The service then moves
//! from `a` to `b`: the three balanced sockets are destroyed (the TCP ones
//! fail at once, the UDP one is disconnected and reaches `b` once the
//! application connects again), the direct one keeps working, and
//! `ebpf_kube_proxy_sockets_destroyed_total` counts 3. An unconnected UDP
//! socket that sent to the VIP is not destroyed.
//!
//! What the application sees (kernel 6.18): TCP `send` fails with
//! ECONNABORTED at once, later reads return end of file; connected UDP is
//! disconnected: `send` fails with EDESTADDRREQ, the next `recv` with
//! ECONNABORTED, `getpeername` with ENOTCONN, and `connect` to the VIP
//! again picks a live backend.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebpf_kube_proxy::apply::Applier;
use ebpf_kube_proxy::datapath::ebpf::{self, EbpfDatapath};
use ebpf_kube_proxy::model::testing;
use ebpf_kube_proxy::model::{LocalState, Protocol};

mod common;
use common::kernel::{Env, LOOPBACK_ECHO};

/// The test's one namespace.
const NS: &str = "ns";

/// argv: CGROUP_DIR VIP VIP6 DIRECT_PORT. Joins the cgroup, opens the three
/// sockets, prints their first replies, waits for a line on stdin, then
/// uses each socket again and prints what happened.
const CLIENT: &str = r#"
import json, os, socket, sys, time
cg, vip, vip6, direct = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with open(cg + "/cgroup.procs", "w") as f:
    f.write(str(os.getpid()))
t = socket.create_connection((vip, 80), timeout=3)
t.sendall(b"t1")
t6 = socket.create_connection((vip6, 80), timeout=3)
t6.sendall(b"s1")
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(3)
u.connect((vip, 53))
u.send(b"u1")
d = socket.create_connection(("127.0.0.1", direct), timeout=3)
d.sendall(b"d1")
n = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
n.settimeout(3)
n.sendto(b"n1", (vip, 53))
print(json.dumps({"tcp": t.recv(100).decode(), "tcp6": t6.recv(100).decode(), "udp": u.recv(100).decode(),
                  "direct": d.recv(100).decode(), "unconnected": n.recv(100).decode()}),
      flush=True)
sys.stdin.readline()
out = {}
def attempt(name, f):
    t0 = time.monotonic()
    try:
        out[name] = f()
    except OSError as e:
        out[name + "_errno"] = e.errno
        out[name + "_error"] = str(e)
    out[name + "_elapsed"] = time.monotonic() - t0
attempt("tcp", lambda: (t.sendall(b"t2"), t.recv(100).decode())[1])
attempt("tcp_recv", lambda: t.recv(100).decode())
attempt("tcp6", lambda: (t6.sendall(b"s2"), t6.recv(100).decode())[1])
attempt("udp_send", lambda: u.send(b"u2"))
attempt("udp_recv", lambda: u.recv(100).decode())
attempt("udp_peer", lambda: list(u.getpeername()))
attempt("udp_again", lambda: (u.connect((vip, 53)), u.send(b"u3"), u.recv(100).decode())[2])
attempt("direct", lambda: (d.sendall(b"d2"), d.recv(100).decode())[1])
attempt("unconnected", lambda: (n.sendto(b"n2", (vip, 53)), n.recv(100).decode())[1])
print(json.dumps(out), flush=True)
"#;

/// The services when `port` is the backend's: ClusterIP 10.96.0.10 (TCP
/// 80, UDP 53) to 127.0.0.1, and fd00:96::10 (TCP 80) to ::1.
fn state(port: u16) -> LocalState {
    LocalState::new(vec![
        testing::service("test", "echo", &["10.96.0.10"])
            .with_ports(&[("tcp", Protocol::Tcp, 80), ("dns", Protocol::Udp, 53)])
            .with_ready_endpoint("127.0.0.1", port, true),
        testing::service("test", "echo6", &["fd00:96::10"])
            .with_ports(&[("tcp", Protocol::Tcp, 80)])
            .with_ready_endpoint("::1", port, true),
    ])
}

fn counter(registry: &prometheus::Registry, name: &str) -> Option<f64> {
    registry
        .gather()
        .iter()
        .find(|f| f.name() == name)
        .map(|f| f.get_metric()[0].get_counter().get_value())
}

fn destroyed(registry: &prometheus::Registry) -> Option<f64> {
    counter(registry, "ebpf_kube_proxy_sockets_destroyed_total")
}

#[test]
fn sockets_balanced_to_a_removed_backend_are_destroyed_and_direct_ones_kept() {
    let Some(mut env) = Env::new("ebpf_sockdestroy", "sockd") else {
        return;
    };
    if !std::fs::read_to_string("/proc/kallsyms").is_ok_and(|k| k.contains(" bpf_sock_destroy")) {
        eprintln!(
            "SKIP ebpf_sockdestroy: the kernel has no bpf_sock_destroy (6.5 or newer is needed)"
        );
        return;
    }

    // The datapath's warnings (a verifier log, say) in the test output.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("warn")
        .with_test_writer()
        .try_init();
    env.add_ns(NS);
    env.serve(NS, LOOPBACK_ECHO, &["a", "8081"]);
    env.serve(NS, LOOPBACK_ECHO, &["b", "8082"]);

    // No node address is in 0.0.0.0/32: no tc program on the machine's
    // interfaces (this test is about the socket hooks only).
    let config = env.config(ebpf::generation::DEFAULT_MAP_SIZE, &["0.0.0.0/32"]);
    let mut dp = Applier::new(Box::new(
        EbpfDatapath::open(&config).expect("loading the eBPF datapath"),
    ));
    let registry = prometheus::Registry::new();
    dp.datapath_mut()
        .register_metrics(&registry)
        .expect("registering metrics");
    dp.apply(&Arc::new(state(8081)))
        .expect("apply with backend a");

    let mut cmd = env.python(NS, CLIENT);
    cmd.arg(&env.cgroup)
        .args(["10.96.0.10", "fd00:96::10", "8081"]);
    let mut client = env.spawn(cmd);
    let first = client.json();
    assert_eq!(first["tcp"], "a:t1", "{first}");
    assert_eq!(first["tcp6"], "a:s1", "{first}");
    assert_eq!(first["udp"], "a:u1", "{first}");
    assert_eq!(first["direct"], "a:d1", "{first}");
    assert_eq!(first["unconnected"], "a:n1", "{first}");
    assert_eq!(destroyed(&registry), Some(0.0));

    // The service moves to b: a's balanced sockets go, in the background.
    dp.apply(&Arc::new(state(8082)))
        .expect("apply with backend b");
    let deadline = Instant::now() + Duration::from_secs(5);
    while destroyed(&registry) != Some(3.0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(destroyed(&registry), Some(3.0), "sockets destroyed");
    assert_eq!(
        counter(&registry, "ebpf_kube_proxy_socket_destroy_errors_total"),
        Some(0.0)
    );

    writeln!(client.stdin, "go").expect("waking the client");
    let after = client.json();
    eprintln!("after the move: {after}");
    // TCP: an error at once, not a hang until the 3 s timeout.
    assert!(after["tcp_errno"].is_i64(), "{after}");
    assert!(after["tcp_elapsed"].as_f64().unwrap() < 1.0, "{after}");
    assert!(after["tcp6_errno"].is_i64(), "{after}");
    // Connected UDP: disconnected by the kernel; the next send without an
    // address fails at once, and connecting again reaches b.
    assert!(after["udp_send_errno"].is_i64(), "{after}");
    assert!(after["udp_send_elapsed"].as_f64().unwrap() < 1.0, "{after}");
    assert_eq!(after["udp_again"], "b:u3", "{after}");
    // Connected straight to a's address: untouched.
    assert_eq!(after["direct"], "a:d2", "{after}");
    // Unconnected UDP that sent to the VIP: balanced per datagram, so left
    // alone (not counted above) and its next datagram goes to b.
    assert_eq!(after["unconnected"], "b:n2", "{after}");
    assert_eq!(destroyed(&registry), Some(3.0), "sockets destroyed");
}
