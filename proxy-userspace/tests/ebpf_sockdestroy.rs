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

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebpf_kube_proxy::apply::Applier;
use ebpf_kube_proxy::datapath::ebpf::{self, loader, EbpfConfig, EbpfDatapath};
use ebpf_kube_proxy::model::{
    EndpointConditions, EndpointHints, EndpointPort, EndpointScopes, IpSet, LocalEndpoint,
    LocalService, LocalServiceType, LocalState, ObjectKey, PortMapping, Protocol, ServiceEndpoints,
    TrafficPolicy,
};
use serde_json::Value;

const SERVER: &str = r#"
import socket, sys, threading
name, port = sys.argv[1], int(sys.argv[2])
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("127.0.0.1", port)); t.listen(16)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("127.0.0.1", port))
t6 = socket.socket(socket.AF_INET6); t6.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t6.bind(("::1", port)); t6.listen(16)
def conn(c):
    with c:
        while True:
            try:
                d = c.recv(100)
            except OSError:
                return
            if not d:
                return
            c.sendall(name.encode() + b":" + d)
def udp():
    while True:
        d, a = u.recvfrom(100)
        u.sendto(name.encode() + b":" + d, a)
def accept(l):
    while True:
        c, _ = l.accept()
        threading.Thread(target=conn, args=(c,), daemon=True).start()
threading.Thread(target=udp, daemon=True).start()
threading.Thread(target=accept, args=(t6,), daemon=True).start()
print("ready", flush=True)
accept(t)
"#;

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

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Everything the test creates; removed on drop, also after a failure.
struct Env {
    netns: String,
    cgroup: PathBuf,
    bpffs: PathBuf,
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
        for _ in 0..50 {
            match std::fs::remove_dir(&self.cgroup) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}

impl Env {
    fn nsenter(&self) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.netns));
        cmd
    }

    fn server(&mut self, name: &str, port: u16) {
        let mut child = self
            .nsenter()
            .args(["python3", "-c", SERVER, name, &port.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting an echo server");
        let stdout = child.stdout.take().expect("piped stdout");
        self.children.push(child);
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("reading from the echo server");
        assert_eq!(line.trim(), "ready", "echo server {name}");
    }
}

/// The services when `port` is the backend's: ClusterIP 10.96.0.10 (TCP
/// 80, UDP 53) to 127.0.0.1, and fd00:96::10 (TCP 80) to ::1.
fn state(port: u16) -> LocalState {
    LocalState::new(vec![
        service(
            "echo",
            "10.96.0.10",
            &[("tcp", Protocol::Tcp, 80), ("dns", Protocol::Udp, 53)],
            "127.0.0.1",
            port,
        ),
        service(
            "echo6",
            "fd00:96::10",
            &[("tcp", Protocol::Tcp, 80)],
            "::1",
            port,
        ),
    ])
}

fn service(
    name: &str,
    cluster_ip: &str,
    ports: &[(&str, Protocol, u16)],
    endpoint: &str,
    port: u16,
) -> ServiceEndpoints {
    let scopes = EndpointScopes {
        cluster: true,
        local: true,
        internal: true,
        external: true,
    };
    let ip: IpAddr = cluster_ip.parse().unwrap();
    let v4 = u32::from(ip.is_ipv4());
    ServiceEndpoints {
        service: LocalService {
            key: ObjectKey::new("test", name),
            uid: String::new(),
            service_type: LocalServiceType::ClusterIp,
            labels: BTreeMap::new(),
            created: None,
            cluster_ips: IpSet::from_ips([ip].iter()),
            external_ips: IpSet::default(),
            load_balancer_ips: IpSet::default(),
            ports: ports
                .iter()
                .map(|(n, protocol, port)| PortMapping {
                    name: (*n).to_owned(),
                    protocol: *protocol,
                    port: *port,
                    node_port: 0,
                    target_port: 0,
                    target_port_name: String::new(),
                    app_protocol: String::new(),
                })
                .collect(),
            internal_traffic_policy: TrafficPolicy::Cluster,
            external_traffic_policy: TrafficPolicy::Cluster,
            session_affinity_timeout: None,
            health_check_node_port: 0,
            traffic_distribution: String::new(),
            load_balancer_source_ranges: vec![],
        },
        endpoints: vec![LocalEndpoint {
            ip: endpoint.parse().unwrap(),
            hostname: String::new(),
            node_name: "n1".to_owned(),
            zone: String::new(),
            local: true,
            conditions: EndpointConditions {
                ready: true,
                serving: true,
                terminating: false,
            },
            hints: EndpointHints::default(),
            ports: ports
                .iter()
                .map(|(n, protocol, _)| EndpointPort {
                    name: (*n).to_owned(),
                    protocol: *protocol,
                    port,
                    scopes,
                })
                .collect(),
            target_ref: None,
        }],
        local_ready_endpoints_v4: v4,
        local_ready_endpoints_v6: 1 - v4,
    }
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

fn skip(why: &str) {
    eprintln!("SKIP ebpf_sockdestroy: {why}");
}

#[test]
fn sockets_balanced_to_a_removed_backend_are_destroyed_and_direct_ones_kept() {
    if !is_root() {
        return skip("needs root (cgroups, network namespaces, BPF)");
    }
    if !ebpf::object_embedded() {
        return skip("this build has no eBPF object; run `cargo xtask build-ebpf --release`, then the tests again");
    }
    if !std::fs::read_to_string("/proc/kallsyms").is_ok_and(|k| k.contains(" bpf_sock_destroy")) {
        return skip("the kernel has no bpf_sock_destroy (6.5 or newer is needed)");
    }
    for cmd in ["ip", "nsenter", "python3"] {
        if !have(cmd) {
            return skip(&format!("`{cmd}` is not installed"));
        }
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let Some(cg_root) = loader::cgroup2_root(&loader::parse_mountinfo(&mountinfo)) else {
        return skip("no cgroup v2 mount");
    };

    // The datapath's warnings (a verifier log, say) in the test output.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("warn")
        .with_test_writer()
        .try_init();
    let pid = std::process::id();
    let mut env = Env {
        netns: format!("ekp-sockd-{pid}"),
        cgroup: cg_root.join(format!("ebpf-kube-proxy-sockd-{pid}")),
        bpffs: PathBuf::from(format!("/sys/fs/bpf/ebpf-kube-proxy-sockd-{pid}")),
        children: vec![],
    };
    assert_ne!(env.cgroup, cg_root, "never the root cgroup");
    run(Command::new("ip").args(["netns", "add", &env.netns]));
    run(Command::new("ip").args(["-n", &env.netns, "link", "set", "lo", "up"]));
    std::fs::create_dir(&env.cgroup).expect("creating the test cgroup");
    env.server("a", 8081);
    env.server("b", 8082);

    let config = EbpfConfig {
        bpffs_root: env.bpffs.clone(),
        cgroup_path: Some(env.cgroup.clone()),
        map_size: ebpf::generation::DEFAULT_MAP_SIZE,
        // An address no interface has: no tc program on the host's
        // interfaces (this test is about the socket hooks only).
        nodeport_addresses: vec!["192.0.2.254/32".parse().unwrap()],
    };
    let mut dp = Applier::new(Box::new(
        EbpfDatapath::open(&config).expect("loading the eBPF datapath"),
    ));
    let registry = prometheus::Registry::new();
    dp.datapath_mut()
        .register_metrics(&registry)
        .expect("registering metrics");
    dp.apply(&Arc::new(state(8081)))
        .expect("apply with backend a");

    let mut child = env
        .nsenter()
        .args(["python3", "-c", CLIENT])
        .arg(&env.cgroup)
        .args(["10.96.0.10", "fd00:96::10", "8081"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the client");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    env.children.push(child);
    let mut read = || {
        let mut line = String::new();
        stdout.read_line(&mut line).expect("reading the client");
        serde_json::from_str::<Value>(&line).unwrap_or_else(|e| panic!("client said {line:?}: {e}"))
    };
    let first = read();
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

    writeln!(stdin, "go").expect("waking the client");
    let after = read();
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
