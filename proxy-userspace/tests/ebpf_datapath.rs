//! The eBPF datapath in the real kernel (root only, and only when the
//! binary embeds the eBPF object; otherwise the test says why and passes).
//!
//! Everything is private to the test: a cgroup v2 directory
//! (`<cgroup2 root>/ebpf-kube-proxy-test-<pid>`, the hooks attach there and
//! never to the root cgroup), a bpffs directory, and a network namespace
//! with only loopback, where echo servers on 127.0.0.1 are the backends and
//! clients (moved into the test cgroup) dial service addresses that have no
//! route: only the hooks make them reachable. A Drop guard removes it all.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebpf_kube_proxy::apply::Applier;
use ebpf_kube_proxy::datapath::ebpf::{self, loader, EbpfDatapath};
use ebpf_kube_proxy::model::testing::{self, state};
use ebpf_kube_proxy::model::{Protocol, ServiceEndpoints};
use serde_json::Value;

mod common;
use common::kernel::{Env, LOOPBACK_ECHO};

/// The test's one namespace.
const NS: &str = "ns";

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

/// A client in the test's namespace, in the test cgroup or not; add its
/// mode and arguments.
fn client_cmd(env: &Env, in_cgroup: bool, args: &[&str]) -> Command {
    let cg = if in_cgroup {
        env.cgroup.display().to_string()
    } else {
        "-".to_owned()
    };
    let mut cmd = env.python(NS, CLIENT);
    cmd.arg(cg).args(args);
    cmd
}

/// Runs a client to completion; its JSON result.
fn client(env: &Env, in_cgroup: bool, args: &[&str]) -> Value {
    let out = client_cmd(env, in_cgroup, args)
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

/// A ClusterIP service of namespace `test` on `cluster_ip` with `ports`,
/// its endpoints (this node's) serving each port on their own port.
fn service(
    name: &str,
    cluster_ip: &str,
    ports: &[(&str, Protocol, u16)],
    endpoints: &[(&str, u16)],
) -> ServiceEndpoints {
    endpoints.iter().fold(
        testing::service("test", name, &[cluster_ip]).with_ports(ports),
        |se, (ip, port)| se.with_ready_endpoint(ip, *port, true),
    )
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
    let Some(mut env) = Env::new("ebpf_datapath", "test") else {
        return;
    };
    env.add_ns(NS);
    env.serve(NS, LOOPBACK_ECHO, &["b1", "8081"]);
    env.serve(NS, LOOPBACK_ECHO, &["b2", "8082"]);

    // The datapath reads the thread's network namespace for the node's
    // interfaces (the tc programs attach there): only the test's own.
    test_support::netns::enter(&env.ns(NS)).unwrap();
    let config = env.config(ebpf::generation::DEFAULT_MAP_SIZE, &[]);
    let mut dp = Applier::new(Box::new(
        EbpfDatapath::open(&config).expect("loading the eBPF datapath"),
    ));
    let echo_ports = [("tcp", Protocol::Tcp, 80), ("dns", Protocol::Udp, 53)];
    let s1 = state(vec![
        service("echo", "10.96.0.10", &echo_ports, &[("127.0.0.1", 8081)]),
        service("empty", "10.96.0.11", &[("tcp", Protocol::Tcp, 80)], &[]),
        service(
            "sticky",
            "10.96.0.12",
            &[("tcp", Protocol::Tcp, 80)],
            &[("127.0.0.1", 8081), ("127.0.0.1", 8082)],
        )
        .with_affinity(60),
        service(
            "spread",
            "10.96.0.13",
            &[("tcp", Protocol::Tcp, 80)],
            &[("127.0.0.1", 8081), ("127.0.0.1", 8082)],
        ),
        service(
            "v6",
            "fd00:96::10",
            &[("tcp", Protocol::Tcp, 80)],
            &[("::1", 8081)],
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
    let r = client(&env, true, &["tcp", "10.96.0.10", "80"]);
    assert_eq!(s(&r, "reply"), "b1:hello", "{r}");
    assert_eq!(peer(&r, "peer"), ("10.96.0.10".to_owned(), 80), "{r}");
    assert_eq!(peer(&r, "local").0, "127.0.0.1", "{r}");

    // UDP through sendmsg4, the reply's source restored by recvmsg4.
    let r = client(&env, true, &["udp", "10.96.0.10", "53"]);
    assert_eq!(s(&r, "reply"), "b1:hello", "{r}");
    assert_eq!(peer(&r, "from"), ("10.96.0.10".to_owned(), 53), "{r}");

    // IPv6 through connect6/getpeername6.
    let r = client(&env, true, &["tcp", "fd00:96::10", "80"]);
    assert_eq!(s(&r, "reply"), "b1:hello", "{r}");
    assert_eq!(peer(&r, "peer"), ("fd00:96::10".to_owned(), 80), "{r}");
    // A dual-stack socket dialing an IPv4-mapped service address.
    let r = client(&env, true, &["tcp", "::ffff:10.96.0.10", "80"]);
    assert_eq!(s(&r, "reply"), "b1:hello", "{r}");
    assert_eq!(
        peer(&r, "peer"),
        ("::ffff:10.96.0.10".to_owned(), 80),
        "{r}"
    );

    // No endpoints: refused at once with EPERM instead of hanging.
    let r = client(&env, true, &["tcp", "10.96.0.11", "80"]);
    assert_eq!(r["errno"].as_i64(), Some(i64::from(libc::EPERM)), "{r}");
    assert!(r["elapsed"].as_f64().unwrap_or(9.0) < 1.0, "{r}");

    // Only the test cgroup is hooked: outside it the address has no route.
    let r = client(&env, false, &["tcp", "10.96.0.10", "80"]);
    assert_eq!(
        r["errno"].as_i64(),
        Some(i64::from(libc::ENETUNREACH)),
        "{r}"
    );

    // ClientIP affinity: one backend for every connection of this client;
    // without it both backends get connections.
    let r = client(&env, true, &["many", "10.96.0.12", "80", "12"]);
    let sticky: Vec<&str> = r["replies"]
        .as_array()
        .expect("replies")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(sticky.len(), 12, "{r}");
    assert!(sticky.iter().all(|x| *x == sticky[0]), "{r}");
    let r = client(&env, true, &["many", "10.96.0.13", "80", "30"]);
    let spread = r["replies"].to_string();
    assert!(
        spread.contains("b1:x") && spread.contains("b2:x"),
        "random choice uses both backends: {r}"
    );

    // One endpoint change, applied incrementally.
    let s2 = state(vec![
        service("echo", "10.96.0.10", &echo_ports, &[("127.0.0.1", 8082)]),
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
    let r = client(&env, true, &["tcp", "10.96.0.10", "80"]);
    assert_eq!(s(&r, "reply"), "b2:hello", "{r}");

    // A daemon restart: a connection made before it keeps working and
    // still sees the service address; the new datapath adopts the pinned
    // maps and replaces the links, and its first apply writes nothing.
    let mut held = env.spawn(client_cmd(&env, true, &["hold", "10.96.0.10", "80"]));
    assert_eq!(s(&held.json(), "first"), "b2:one");
    drop(dp);
    let mut dp = Applier::new(Box::new(
        EbpfDatapath::open(&config).expect("re-opening (adopting) the datapath"),
    ));
    let r = client(&env, true, &["tcp", "10.96.0.10", "80"]);
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
    let r = held.json();
    assert_eq!(s(&r, "second"), "b2:two", "{r}");
    assert_eq!(peer(&r, "peer"), ("10.96.0.10".to_owned(), 80), "{r}");

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
    let r = client(&env, true, &["tcp", "10.96.0.10", "80"]);
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
    // The socket hooks and the source-range egress check.
    assert_eq!(report.links.len(), 9, "{report:?}");
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
    let r = client(&env, true, &["tcp", "10.96.0.11", "80"]);
    assert_eq!(
        r["errno"].as_i64(),
        Some(i64::from(libc::ENETUNREACH)),
        "no hook refuses any more: {r}"
    );
}
