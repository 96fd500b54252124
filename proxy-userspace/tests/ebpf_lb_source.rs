//! loadBalancerSourceRanges for clients on the node (issue 36 item 4,
//! upstream "LoadBalancers should only allow access from service
//! loadbalancer source ranges"): a pod whose address is outside the ranges
//! does not reach the service through its load-balancer IP, one inside
//! does; the cluster IP stays open to both (the ranges are the LB IP's).
//! The socket hooks translate before the source is known; the
//! `cgroup_skb/egress` check of the first packet decides. Root only.
//!
//! ```text
//!  pod "a" ns                node ns                        pod "b" ns
//!  a0 10.83.1.2 ─────── n0 10.83.1.1   n1 10.83.2.1 ─────── b0 10.83.2.2
//!     fd83:1::2            fd83:1::1      fd83:2::1            fd83:2::2
//!                       echo server on [::]:8080 (the service's endpoint)
//! ```

use std::sync::Arc;

use ebpf_kube_proxy::apply::Applier;
use ebpf_kube_proxy::datapath::ebpf::{generation, EbpfDatapath};
use ebpf_kube_proxy::model::testing;
use ebpf_kube_proxy::model::{LocalState, Protocol};
use serde_json::Value;

mod common;
use common::kernel::Env;

/// Echo server, TCP on every address, UDP on the endpoint addresses (an
/// unbound UDP socket would answer a pod on the other link from that
/// link's address, which its connected socket drops). argv: PORT ADDR...
/// Answers "ok:DATA".
const SERVER: &str = r#"
import socket, sys, threading
port = int(sys.argv[1])
t = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
t.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("::", port))
t.listen(64)
def conn(c):
    with c:
        d = c.recv(100)
        c.sendall(b"ok:" + d)
def udp(addr):
    u = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_DGRAM)
    u.bind((addr, port))
    def serve():
        while True:
            d, a = u.recvfrom(100)
            u.sendto(b"ok:" + d, a)
    threading.Thread(target=serve, daemon=True).start()
for addr in sys.argv[2:]:
    udp(addr)
print("ready", flush=True)
while True:
    c, _ = t.accept()
    threading.Thread(target=conn, args=(c,), daemon=True).start()
"#;

/// argv: CGROUP MODE(tcp|udp) HOST PORT. Joins the cgroup (where the
/// hooks are), then one exchange; the reply or the error.
const CLIENT: &str = r#"
import json, os, socket, sys
cg, mode, host, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with open(cg + "/cgroup.procs", "w") as f:
    f.write(str(os.getpid()))
family = socket.AF_INET6 if ":" in host else socket.AF_INET
out = {}
try:
    if mode == "tcp":
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(1.5)
        s.connect((host, port))
        s.sendall(b"hi")
    else:
        s = socket.socket(family, socket.SOCK_DGRAM)
        s.settimeout(1.5)
        s.connect((host, port))
        s.send(b"hi")
    out["reply"] = s.recv(100).decode()
except socket.timeout:
    out["error"] = "timeout"
except OSError as e:
    out["error"] = e.errno
print(json.dumps(out), flush=True)
"#;

const POD_A: &str = "a";
const POD_B: &str = "b";
const NODE: &str = "node";

fn build(env: &mut Env) {
    for short in [POD_A, POD_B, NODE] {
        env.add_ns(short);
    }
    let (a, b, n) = (env.ns(POD_A), env.ns(POD_B), env.ns(NODE));
    env.netns.veth(&a, "a0", &n, "n0").unwrap();
    env.netns.veth(&b, "b0", &n, "n1").unwrap();
    env.ip_all(&[
        (POD_A, "addr add 10.83.1.2/24 dev a0"),
        (POD_A, "addr add fd83:1::2/64 dev a0 nodad"),
        (POD_A, "route add default via 10.83.1.1"),
        (POD_A, "-6 route add default via fd83:1::1"),
        (POD_B, "addr add 10.83.2.2/24 dev b0"),
        (POD_B, "addr add fd83:2::2/64 dev b0 nodad"),
        (POD_B, "route add default via 10.83.2.1"),
        (POD_B, "-6 route add default via fd83:2::1"),
        (NODE, "addr add 10.83.1.1/24 dev n0"),
        (NODE, "addr add fd83:1::1/64 dev n0 nodad"),
        (NODE, "addr add 10.83.2.1/24 dev n1"),
        (NODE, "addr add fd83:2::1/64 dev n1 nodad"),
    ]);
}

fn client(env: &Env, pod: &str, mode: &str, host: &str) -> Value {
    let cg = env.cgroup.display().to_string();
    env.python_json(pod, CLIENT, &[&cg, mode, host, "80"])
}

#[test]
fn pods_outside_the_source_ranges_do_not_reach_the_load_balancer_ip() {
    let Some(mut env) = Env::new("ebpf_lb_source", "lbs") else {
        return;
    };
    build(&mut env);
    env.serve(NODE, SERVER, &["8080", "10.83.1.1", "fd83:1::1"]);
    // No tc programs: only the node's own sockets are under test.
    let config = env.config(generation::DEFAULT_MAP_SIZE, &["0.0.0.0/32"]);
    let mut dp = Applier::new(Box::new(
        EbpfDatapath::open(&config).expect("loading the eBPF datapath"),
    ));
    let lb = |name: &str, cluster_ip: &str, lb_ip: &str, endpoint: &str| {
        testing::service("test", name, &[cluster_ip])
            .with_ports(&[("t", Protocol::Tcp, 80), ("u", Protocol::Udp, 80)])
            .with_load_balancer_ips(&[lb_ip])
            .with_source_ranges(&["10.83.1.2/32", "fd83:1::2/128"])
            .with_ready_endpoint(endpoint, 8080, true)
    };
    let state = LocalState::new(vec![
        lb("v4", "10.96.83.10", "203.0.113.83", "10.83.1.1"),
        lb("v6", "fd00:96::83", "2001:db8::83", "fd83:1::1"),
    ]);
    dp.apply(&Arc::new(state)).expect("apply");

    for (lb_ip, cluster_ip) in [
        ("203.0.113.83", "10.96.83.10"),
        ("2001:db8::83", "fd00:96::83"),
    ] {
        for mode in ["tcp", "udp"] {
            let r = client(&env, POD_A, mode, lb_ip);
            assert_eq!(
                r["reply"], "ok:hi",
                "pod a (in the ranges), {mode} {lb_ip}: {r}"
            );
            let r = client(&env, POD_B, mode, lb_ip);
            assert!(
                r["reply"].is_null(),
                "pod b (outside the ranges) reached {mode} {lb_ip}: {r}"
            );
            // The ranges restrict the load-balancer IP only.
            let r = client(&env, POD_B, mode, cluster_ip);
            assert_eq!(r["reply"], "ok:hi", "pod b, {mode} {cluster_ip}: {r}");
        }
    }
    drop(dp);
}
