//! The tc programs refuse a new flow from outside the node to a service
//! without any usable endpoint, as kube-proxy's REJECT rule does: a TCP
//! client's connect() fails with ECONNREFUSED (a RST), a connected UDP
//! socket's recv() with ECONNREFUSED (an ICMP / ICMPv6 port unreachable),
//! at once, IPv4 and IPv6, counted as `result="rejected"`. A service
//! whose only endpoints run elsewhere, with externalTrafficPolicy Local,
//! still drops (the client times out). Root only.
//!
//! ```text
//!  client ns                    node ns (datapath opened here)
//!  c0 192.168.79.2 ───────────── n0 192.168.79.1
//!     fd79::2                       fd79::1
//! ```

use std::sync::Arc;

use ebpf_kube_proxy::apply::Applier;
use ebpf_kube_proxy::datapath::ebpf::{self, counters, EbpfDatapath};
use ebpf_kube_proxy::model::testing;
use ebpf_kube_proxy::model::{LocalState, Protocol, ServiceEndpoints};
use prometheus::core::Collector;
use serde_json::Value;
use test_support::netns;

mod common;
use common::kernel::Env;

/// argv: MODE HOST PORT. One JSON line: the error's errno (or what
/// arrived) and how long it took.
const CLIENT: &str = r#"
import json, socket, struct, sys, time
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
fam = socket.AF_INET6 if ":" in host else socket.AF_INET
cap = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
cap.bind(("c0", 0))
out = {}
t0 = time.monotonic()
try:
    if mode == "flood":
        s = socket.socket(fam, socket.SOCK_DGRAM)
        for i in range(200):
            s.sendto(b"x", (host, port))
    elif mode == "tcp":
        s = socket.socket(fam); s.settimeout(2)
        s.connect((host, port))
        out["connected"] = True
    else:
        s = socket.socket(fam, socket.SOCK_DGRAM); s.settimeout(2)
        s.connect((host, port))
        s.send(b"hello")
        out["reply"] = s.recv(100).decode()
except socket.timeout:
    out["error"] = "timeout"
except OSError as e:
    out["error"] = e.errno
out["ms"] = (time.monotonic() - t0) * 1000
def csum(b):
    if len(b) % 2:
        b += b"\0"
    x = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while x >> 16:
        x = (x & 0xffff) + (x >> 16)
    return x == 0xffff
# The refusal as it arrived: its protocol and whether every checksum in
# it is right (the receiving kernel may have trusted it unchecked).
cap.settimeout(0.2)
out["answers"] = 0
try:
    while mode == "flood" or "answer" not in out:
        f, a = cap.recvfrom(2000)
        if a[2] == socket.PACKET_OUTGOING:
            continue
        ethertype, ip = struct.unpack("!H", f[12:14])[0], f[14:]
        if ethertype == 0x0800:
            ihl, proto = (ip[0] & 15) * 4, ip[9]
            l4 = ip[ihl:struct.unpack("!H", ip[2:4])[0]]
            pseudo = ip[12:20] + struct.pack("!BBH", 0, proto, len(l4)) if proto == 6 else b""
            ok = csum(ip[:ihl]) and csum(pseudo + l4)
        elif ethertype == 0x86dd:
            proto = ip[6]
            l4 = ip[40:40 + struct.unpack("!H", ip[4:6])[0]]
            ok = csum(ip[8:40] + struct.pack("!IxxxB", len(l4), proto) + l4)
        else:
            continue
        if proto == 6 and l4[13] & 4 or (proto, l4[0]) in ((1, 3), (58, 1)):
            out["answer"] = {6: "rst", 1: "icmp", 58: "icmp6"}[proto]
            out["checksums_ok"] = ok
            out["answers"] += 1
except socket.timeout:
    pass
print(json.dumps(out), flush=True)
"#;

const CLIENT_NS: &str = "client";
const NODE_NS: &str = "node";
const ECONNREFUSED: i64 = 111;

fn build(env: &mut Env) {
    for short in [CLIENT_NS, NODE_NS] {
        env.add_ns(short);
    }
    let (c, n) = (env.ns(CLIENT_NS), env.ns(NODE_NS));
    env.netns.veth(&c, "c0", &n, "n0").unwrap();
    let config = [
        (CLIENT_NS, "addr add 192.168.79.2/24 dev c0"),
        (CLIENT_NS, "addr add fd79::2/64 dev c0 nodad"),
        (NODE_NS, "addr add 192.168.79.1/24 dev n0"),
        (NODE_NS, "addr add fd79::1/64 dev n0 nodad"),
    ];
    env.ip_all(&config);
}

/// A client in the client namespace.
fn client(env: &Env, args: &[&str]) -> Value {
    env.python_json(CLIENT_NS, CLIENT, args)
}

/// A NodePort service with one port (TCP or UDP) 80, node port `node_port`.
fn service(name: &str, proto: Protocol, node_port: u16) -> ServiceEndpoints {
    testing::service("test", name, &[])
        .with_ports(&[("p", proto, 80)])
        .with_node_port(node_port)
}

/// `ebpf_kube_proxy_datapath_external_packets_total{result}` as /metrics
/// would show it now.
fn external_packets(env: &Env, result: &str) -> f64 {
    let c = counters::StatsCollector::new(env.bpffs.clone()).expect("collector");
    c.collect()
        .iter()
        .filter(|f| f.name() == counters::EXTERNAL_PACKETS_TOTAL)
        .flat_map(|f| f.get_metric().iter())
        .filter(|m| {
            m.get_label()
                .iter()
                .any(|l| l.name() == "result" && l.value() == result)
        })
        .map(|m| m.get_counter().get_value())
        .sum()
}

fn assert_refused_fast(r: &Value, answer: &str) {
    assert_eq!(r["error"], ECONNREFUSED, "refused: {r}");
    assert_eq!(r["answer"], answer, "{r}");
    assert_eq!(r["checksums_ok"], true, "{r}");
    let ms = r["ms"].as_f64().unwrap_or(f64::MAX);
    assert!(ms < 100.0, "refused within 100 ms: {r}");
}

#[test]
fn a_service_without_endpoints_refuses_new_flows_from_outside() {
    let Some(mut env) = Env::new("ebpf_reject", "rj") else {
        return;
    };
    build(&mut env);
    netns::enter(&env.ns(NODE_NS)).unwrap();
    let config = env.config(ebpf::generation::DEFAULT_MAP_SIZE, &[]);
    let mut dp = Applier::new(Box::new(
        EbpfDatapath::open(&config).expect("loading the eBPF datapath"),
    ));
    let state = LocalState::new(vec![
        service("none-tcp", Protocol::Tcp, 30090),
        service("none-udp", Protocol::Udp, 30091),
        // Endpoints, none on this node: eTP=Local drops.
        service("etp-local", Protocol::Tcp, 30092)
            .with_ready_endpoint("10.79.2.10", 8080, false)
            .with_external_policy_local(),
    ]);
    dp.apply(&Arc::new(state)).expect("apply");
    let rejected_before = external_packets(&env, "rejected");

    for host in ["192.168.79.1", "fd79::1"] {
        let r = client(&env, &["tcp", host, "30090"]);
        assert_refused_fast(&r, "rst");
        let r = client(&env, &["udp", host, "30091"]);
        let icmp = if host.contains(':') { "icmp6" } else { "icmp" };
        assert_refused_fast(&r, icmp);
    }
    let rejected = external_packets(&env, "rejected") - rejected_before;
    assert!(rejected >= 4.0, "4 flows rejected, counted {rejected}");

    // A burst from one source gets its bucket's worth of replies (50, plus
    // one per 10 ms the burst took), not one per datagram.
    let r = client(&env, &["flood", "fd79::1", "30091"]);
    let answers = r["answers"].as_u64().unwrap_or(0);
    assert!((40..=80).contains(&answers), "rate-limited: {r}");
    let rejected = external_packets(&env, "rejected") - rejected_before;

    // externalTrafficPolicy Local without a local endpoint: dropped, not
    // rejected (the load balancer's health check steers away).
    let dropped_before = external_packets(&env, "no_local_endpoint");
    let r = client(&env, &["tcp", "192.168.79.1", "30092"]);
    assert_eq!(r["error"], "timeout", "dropped: {r}");
    assert!(external_packets(&env, "no_local_endpoint") > dropped_before);
    assert_eq!(
        external_packets(&env, "rejected") - rejected_before,
        rejected,
        "not counted as rejected"
    );

    let d = ebpf::dump::read(&env.bpffs).expect("dump");
    let text = ebpf::dump::text(&d);
    assert!(
        text.lines().any(|l| l.contains("192.168.79.1:30090/TCP")
            && l.contains("(from outside the node)")
            && l.contains("(no endpoints: rejected)")),
        "{text}"
    );
    drop(dp);
}

/// A counters map pinned by an earlier version (4 counters, before
/// `rejected`) is replaced by one of this layout instead of refusing to
/// start.
#[test]
fn counters_pinned_with_an_earlier_layout_are_replaced() {
    use aya::maps::{HashMap, IterableMap, MapData};
    use proxy_common::{EXT_STAT_COUNT, MAP_EXT_STATS};

    let Some(mut env) = Env::new("ebpf_reject", "rl") else {
        return;
    };
    env.add_ns(NODE_NS);
    netns::enter(&env.ns(NODE_NS)).unwrap();
    std::fs::create_dir_all(&env.bpffs).unwrap();
    let old = HashMap::<MapData, u32, u64>::create(4, 0).expect("creating a map");
    old.map()
        .pin(env.bpffs.join(MAP_EXT_STATS))
        .expect("pinning it");
    let config = env.config(ebpf::generation::DEFAULT_MAP_SIZE, &[]);
    let dp = EbpfDatapath::open(&config).expect("loading over the old pin");
    let info = MapData::from_pin(env.bpffs.join(MAP_EXT_STATS))
        .and_then(|m| m.info())
        .expect("the pinned counters");
    assert_eq!(info.max_entries(), EXT_STAT_COUNT);
    drop(dp);
}
