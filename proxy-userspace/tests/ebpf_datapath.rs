//! The eBPF datapath in the real kernel (root only, and only when the
//! binary embeds the eBPF object; otherwise the test says why and passes).
//!
//! Everything is private to the test: a cgroup v2 directory
//! (`<cgroup2 root>/ebpf-kube-proxy-test-<pid>`, the hooks attach there and
//! never to the root cgroup), a bpffs directory, and a network namespace
//! with only loopback, where echo servers on 127.0.0.1 are the backends and
//! clients (moved into the test cgroup) dial service addresses that have no
//! route: only the hooks make them reachable. A Drop guard removes it all.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
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
t.bind(("127.0.0.1", port)); t.listen(128)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("127.0.0.1", port))
t6 = socket.socket(socket.AF_INET6); t6.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
t6.bind(("::1", port)); t6.listen(128)
def conn(c):
    with c:
        while True:
            d = c.recv(100)
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

/// argv: CGROUP_DIR|- MODE HOST PORT [N]. Joins the cgroup first, then
/// prints one JSON object per result.
const CLIENT: &str = r#"
import json, os, socket, sys, time
cg, mode, host, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if cg != "-":
    with open(cg + "/cgroup.procs", "w") as f:
        f.write(str(os.getpid()))
out = {}
t0 = time.monotonic()
try:
    if mode == "tcp":
        s = socket.create_connection((host, port), timeout=3)
        out["peer"] = list(s.getpeername())
        out["local"] = list(s.getsockname())
        s.sendall(b"hello")
        out["reply"] = s.recv(100).decode()
    elif mode == "udp":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(3)
        s.sendto(b"hello", (host, port))
        data, frm = s.recvfrom(100)
        out["reply"] = data.decode()
        out["from"] = list(frm)
    elif mode == "many":
        replies = []
        for _ in range(int(sys.argv[5])):
            s = socket.create_connection((host, port), timeout=3)
            s.sendall(b"x")
            replies.append(s.recv(100).decode())
            s.close()
        out["replies"] = replies
    elif mode == "hold":
        s = socket.create_connection((host, port), timeout=3)
        s.sendall(b"one")
        print(json.dumps({"first": s.recv(100).decode()}), flush=True)
        sys.stdin.readline()
        s.sendall(b"two")
        out["second"] = s.recv(100).decode()
        out["peer"] = list(s.getpeername())
except OSError as e:
    out["errno"] = e.errno
    out["error"] = str(e)
out["elapsed"] = time.monotonic() - t0
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
        // Clients have exited; the cgroup is empty (retry briefly while
        // the kernel reaps them).
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
    fn netns_arg(&self) -> String {
        format!("--net=/run/netns/{}", self.netns)
    }

    /// Starts an echo server (TCP and UDP) on 127.0.0.1:port in the netns.
    fn server(&mut self, name: &str, port: u16) {
        let mut child = Command::new("nsenter")
            .arg(self.netns_arg())
            .args(["python3", "-c", SERVER, name, &port.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting an echo server");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped stdout");
        self.children.push(child);
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("reading from the echo server");
        assert_eq!(line.trim(), "ready", "echo server {name}");
    }

    fn client_cmd(&self, in_cgroup: bool, args: &[&str]) -> Command {
        let mut cmd = Command::new("nsenter");
        let cg = if in_cgroup {
            self.cgroup.display().to_string()
        } else {
            "-".to_owned()
        };
        cmd.arg(self.netns_arg())
            .args(["python3", "-c", CLIENT, &cg])
            .args(args);
        cmd
    }

    /// Runs a client to completion; its JSON result.
    fn client(&self, in_cgroup: bool, args: &[&str]) -> Value {
        let out = self
            .client_cmd(in_cgroup, args)
            .output()
            .expect("running a client");
        assert!(
            out.status.success(),
            "client {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "client {args:?} printed {:?}: {e}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }
}

struct Held {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Held {
    fn line(&mut self) -> Value {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("reading a client");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("client printed {line:?}: {e}"))
    }
}

fn tcp_port(name: &str, port: u16) -> PortMapping {
    PortMapping {
        name: name.to_owned(),
        protocol: Protocol::Tcp,
        port,
        node_port: 0,
        target_port: 0,
        target_port_name: String::new(),
        app_protocol: String::new(),
    }
}

/// A ClusterIP service; `ports` are (name, protocol, port), every endpoint
/// backs each port on `backend_port`.
fn service(
    name: &str,
    cluster_ip: &str,
    ports: &[(&str, Protocol, u16)],
    endpoints: &[(&str, u16)],
    affinity: Option<u32>,
) -> ServiceEndpoints {
    let ip: IpAddr = cluster_ip.parse().unwrap();
    let scopes = EndpointScopes {
        cluster: true,
        local: true,
        internal: true,
        external: true,
    };
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
                .map(|(n, proto, port)| PortMapping {
                    protocol: *proto,
                    ..tcp_port(n, *port)
                })
                .collect(),
            internal_traffic_policy: TrafficPolicy::Cluster,
            external_traffic_policy: TrafficPolicy::Cluster,
            session_affinity_timeout: affinity,
            health_check_node_port: 0,
            traffic_distribution: String::new(),
            load_balancer_source_ranges: vec![],
        },
        endpoints: endpoints
            .iter()
            .map(|(ip, port)| LocalEndpoint {
                ip: ip.parse().unwrap(),
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
                    .map(|(n, proto, _)| EndpointPort {
                        name: (*n).to_owned(),
                        protocol: *proto,
                        port: *port,
                        scopes,
                    })
                    .collect(),
                target_ref: None,
            })
            .collect(),
        local_ready_endpoints_v4: endpoints.len() as u32,
        local_ready_endpoints_v6: 0,
    }
}

fn state(services: Vec<ServiceEndpoints>) -> LocalState {
    LocalState::new(services)
}

fn s(v: &Value, field: &str) -> String {
    v[field].as_str().unwrap_or_default().to_owned()
}

fn peer(v: &Value, field: &str) -> (String, u64) {
    (
        v[field][0].as_str().unwrap_or_default().to_owned(),
        v[field][1].as_u64().unwrap_or_default(),
    )
}

#[test]
fn cluster_ip_traffic_is_balanced_in_the_kernel_and_survives_a_restart() {
    if !is_root() {
        eprintln!("SKIP ebpf_datapath: needs root (cgroups, network namespaces, BPF)");
        return;
    }
    if !ebpf::object_embedded() {
        eprintln!("SKIP ebpf_datapath: this build has no eBPF object; run `cargo xtask build-ebpf --release`, then the tests again");
        return;
    }
    for cmd in ["ip", "nsenter", "python3"] {
        if !have(cmd) {
            eprintln!("SKIP ebpf_datapath: `{cmd}` is not installed");
            return;
        }
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let Some(cg_root) = loader::cgroup2_root(&loader::parse_mountinfo(&mountinfo)) else {
        eprintln!("SKIP ebpf_datapath: no cgroup v2 mount");
        return;
    };

    let pid = std::process::id();
    let mut env = Env {
        netns: format!("ekp-test-{pid}"),
        cgroup: cg_root.join(format!("ebpf-kube-proxy-test-{pid}")),
        bpffs: PathBuf::from(format!("/sys/fs/bpf/ebpf-kube-proxy-test-{pid}")),
        children: vec![],
    };
    assert_ne!(env.cgroup, cg_root, "never the root cgroup");
    run(Command::new("ip").args(["netns", "add", &env.netns]));
    run(Command::new("ip").args(["-n", &env.netns, "link", "set", "lo", "up"]));
    std::fs::create_dir(&env.cgroup).expect("creating the test cgroup");
    env.server("b1", 8081);
    env.server("b2", 8082);

    // The datapath reads the thread's network namespace for the node's
    // interfaces (the tc programs attach there): only the test's own.
    test_support::netns::enter(&env.netns).unwrap();
    let config = EbpfConfig {
        bpffs_root: env.bpffs.clone(),
        cgroup_path: Some(env.cgroup.clone()),
        map_size: ebpf::generation::DEFAULT_MAP_SIZE,
        nodeport_addresses: Vec::new(),
    };
    let mut dp = Applier::new(Box::new(
        EbpfDatapath::open(&config).expect("loading the eBPF datapath"),
    ));
    let echo_ports = [("tcp", Protocol::Tcp, 80), ("dns", Protocol::Udp, 53)];
    let s1 = state(vec![
        service(
            "echo",
            "10.96.0.10",
            &echo_ports,
            &[("127.0.0.1", 8081)],
            None,
        ),
        service(
            "empty",
            "10.96.0.11",
            &[("tcp", Protocol::Tcp, 80)],
            &[],
            None,
        ),
        service(
            "sticky",
            "10.96.0.12",
            &[("tcp", Protocol::Tcp, 80)],
            &[("127.0.0.1", 8081), ("127.0.0.1", 8082)],
            Some(60),
        ),
        service(
            "spread",
            "10.96.0.13",
            &[("tcp", Protocol::Tcp, 80)],
            &[("127.0.0.1", 8081), ("127.0.0.1", 8082)],
            None,
        ),
        service(
            "v6",
            "fd00:96::10",
            &[("tcp", Protocol::Tcp, 80)],
            &[("::1", 8081)],
            None,
        ),
    ]);
    dp.apply(&Arc::new(s1.clone())).expect("apply");
    assert_eq!(loader::attached_programs(&env.cgroup).unwrap(), 8);
    let entries = dp.datapath().map_entries();
    assert!(
        entries.iter().all(|(_, n)| *n > 0) && entries.len() == 2,
        "{entries:?}"
    );

    // TCP through connect4; the application sees the service address.
    let r = env.client(true, &["tcp", "10.96.0.10", "80"]);
    assert_eq!(s(&r, "reply"), "b1:hello", "{r}");
    assert_eq!(peer(&r, "peer"), ("10.96.0.10".to_owned(), 80), "{r}");
    assert_eq!(peer(&r, "local").0, "127.0.0.1", "{r}");

    // UDP through sendmsg4, the reply's source restored by recvmsg4.
    let r = env.client(true, &["udp", "10.96.0.10", "53"]);
    assert_eq!(s(&r, "reply"), "b1:hello", "{r}");
    assert_eq!(peer(&r, "from"), ("10.96.0.10".to_owned(), 53), "{r}");

    // IPv6 through connect6/getpeername6.
    let r = env.client(true, &["tcp", "fd00:96::10", "80"]);
    assert_eq!(s(&r, "reply"), "b1:hello", "{r}");
    assert_eq!(peer(&r, "peer"), ("fd00:96::10".to_owned(), 80), "{r}");
    // A dual-stack socket dialing an IPv4-mapped service address.
    let r = env.client(true, &["tcp", "::ffff:10.96.0.10", "80"]);
    assert_eq!(s(&r, "reply"), "b1:hello", "{r}");
    assert_eq!(
        peer(&r, "peer"),
        ("::ffff:10.96.0.10".to_owned(), 80),
        "{r}"
    );

    // No endpoints: refused at once with EPERM instead of hanging.
    let r = env.client(true, &["tcp", "10.96.0.11", "80"]);
    assert_eq!(r["errno"].as_i64(), Some(i64::from(libc::EPERM)), "{r}");
    assert!(r["elapsed"].as_f64().unwrap_or(9.0) < 1.0, "{r}");

    // Only the test cgroup is hooked: outside it the address has no route.
    let r = env.client(false, &["tcp", "10.96.0.10", "80"]);
    assert_eq!(
        r["errno"].as_i64(),
        Some(i64::from(libc::ENETUNREACH)),
        "{r}"
    );

    // ClientIP affinity: one backend for every connection of this client;
    // without it both backends get connections.
    let r = env.client(true, &["many", "10.96.0.12", "80", "12"]);
    let sticky: Vec<&str> = r["replies"]
        .as_array()
        .expect("replies")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(sticky.len(), 12, "{r}");
    assert!(sticky.iter().all(|x| *x == sticky[0]), "{r}");
    let r = env.client(true, &["many", "10.96.0.13", "80", "30"]);
    let spread = r["replies"].to_string();
    assert!(
        spread.contains("b1:x") && spread.contains("b2:x"),
        "random choice uses both backends: {r}"
    );

    // One endpoint change, applied incrementally.
    let s2 = state(vec![
        service(
            "echo",
            "10.96.0.10",
            &echo_ports,
            &[("127.0.0.1", 8082)],
            None,
        ),
        (*s1.services[1]).clone(),
        (*s1.services[2]).clone(),
        (*s1.services[3]).clone(),
        (*s1.services[4]).clone(),
    ]);
    let started = Instant::now();
    let stats = dp.apply(&Arc::new(s2.clone())).expect("apply");
    let took = started.elapsed();
    eprintln!("single-endpoint change programmed in {took:?} ({stats:?})");
    assert!(
        took < Duration::from_millis(100),
        "design target 10 ms, took {took:?}"
    );
    let r = env.client(true, &["tcp", "10.96.0.10", "80"]);
    assert_eq!(s(&r, "reply"), "b2:hello", "{r}");

    // A daemon restart: a connection made before it keeps working and
    // still sees the service address; the new datapath adopts the pinned
    // maps and replaces the links, and its first apply writes nothing.
    let mut hold_child = env
        .client_cmd(true, &["hold", "10.96.0.10", "80"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting a long client");
    let mut held = Held {
        stdin: hold_child.stdin.take().expect("stdin"),
        stdout: BufReader::new(hold_child.stdout.take().expect("stdout")),
        child: hold_child,
    };
    assert_eq!(s(&held.line(), "first"), "b2:one");
    drop(dp);
    let mut dp = Applier::new(Box::new(
        EbpfDatapath::open(&config).expect("re-opening (adopting) the datapath"),
    ));
    let r = env.client(true, &["tcp", "10.96.0.10", "80"]);
    assert_eq!(
        s(&r, "reply"),
        "b2:hello",
        "served before the first apply: {r}"
    );
    let stats = dp
        .apply(&Arc::new(s2.clone()))
        .expect("apply after restart");
    assert_eq!(
        stats.stats.services_changed, 0,
        "adopted maps already match"
    );
    held.stdin
        .write_all(b"go\n")
        .expect("signalling the client");
    let r = held.line();
    assert_eq!(s(&r, "second"), "b2:two", "{r}");
    assert_eq!(peer(&r, "peer"), ("10.96.0.10".to_owned(), 80), "{r}");
    let _ = held.child.wait();

    // dump decodes the pinned maps.
    let d = ebpf::dump::read(&env.bpffs).expect("dump");
    assert_eq!(d.links.len(), 8, "{d:?}");
    let text = ebpf::dump::text(&d);
    assert!(text.contains("10.96.0.10:80/TCP"), "{text}");
    assert!(text.contains("127.0.0.1:8082"), "{text}");
    assert!(
        text.contains("10.96.0.11:80/TCP") && text.contains("connect refused"),
        "{text}"
    );
    assert!(
        d.stats["translated"] > 0 && d.stats["no_backend"] > 0,
        "{text}"
    );
    assert!(!d.affinity.is_empty(), "{text}");

    // Removing a service: its address is no longer translated.
    let s3 = state(vec![(*s2.services[1]).clone()]);
    dp.apply(&Arc::new(s3.clone())).expect("apply");
    let r = env.client(true, &["tcp", "10.96.0.10", "80"]);
    assert_eq!(
        r["errno"].as_i64(),
        Some(i64::from(libc::ENETUNREACH)),
        "{r}"
    );
    let d = ebpf::dump::read(&env.bpffs).expect("dump");
    assert_eq!((d.services.len(), d.backends), (1, 0), "{d:?}");

    // cleanup detaches the programs and removes the pins.
    drop(dp);
    assert_eq!(
        loader::attached_programs(&env.cgroup).unwrap(),
        8,
        "the restart replaced the links instead of adding to them"
    );
    let report = ebpf::cleanup(&env.bpffs).expect("cleanup");
    assert_eq!(report.links.len(), 8, "{report:?}");
    assert_eq!(report.maps.len(), loader::MAPS.len(), "{report:?}");
    assert!(!Path::new(&env.bpffs).exists());
    // The kernel releases a link whose last reference went away
    // asynchronously; give it a bounded moment.
    let mut attached = loader::attached_programs(&env.cgroup).unwrap();
    for _ in 0..50 {
        if attached == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        attached = loader::attached_programs(&env.cgroup).unwrap();
    }
    assert_eq!(attached, 0, "programs still attached after cleanup");
    let r = env.client(true, &["tcp", "10.96.0.11", "80"]);
    assert_eq!(
        r["errno"].as_i64(),
        Some(i64::from(libc::ENETUNREACH)),
        "no hook refuses any more: {r}"
    );
}
