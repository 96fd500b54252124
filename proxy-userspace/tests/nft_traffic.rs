//! The nftables datapath with real traffic: a node namespace programmed by
//! the datapath, routing between a client outside the cluster, a pod on
//! the node and a pod on another node (root, `ip`, `nsenter` and `python3`
//! needed). Each test builds its own namespaces and removes them, also
//! after a failed assertion.
//!
//! ```text
//!   client  eth0 10.0.1.2 ── c0 10.0.1.1    node    p0 10.244.1.1 ── eth0 10.244.1.11  pod
//!                                                   r0 10.244.2.1 ── eth0 10.244.2.12  remote
//! ```

use std::io::{BufRead, BufReader};

use ebpf_kube_proxy::datapath::nft;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebpf_kube_proxy::apply::Applier;
use ebpf_kube_proxy::datapath::nft::NftDatapath;
use ebpf_kube_proxy::model::{testing, LocalState, Protocol, ServiceEndpoints};
use test_support::netns::{self, Netns};

const NODE_IP: &str = "10.0.1.1";
const POD: &str = "10.244.1.11";
const REMOTE_POD: &str = "10.244.2.12";

/// UDP server: argv PORT...; answers every datagram with the port it came
/// in on.
const UDP_PORTS: &str = r#"
import select, socket, sys
socks = []
for p in sys.argv[1:]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", int(p)))
    socks.append(s)
print("ready", flush=True)
while True:
    for s in select.select(socks, [], [])[0]:
        d, a = s.recvfrom(100)
        s.sendto(str(s.getsockname()[1]).encode(), a)
"#;

/// UDP client: argv DST PORT SPORT; one datagram from SPORT, prints the
/// answer or "timeout".
const UDP_ASK: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[3])))
s.settimeout(0.3)
s.sendto(b"x", (sys.argv[1], int(sys.argv[2])))
try:
    print(s.recv(100).decode())
except OSError as e:
    print("timeout" if isinstance(e, socket.timeout) else "error " + str(e))
"#;

/// TCP server: argv NAME PORT; sends NAME to every connection.
const TCP_NAME: &str = r#"
import socket, sys
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("0.0.0.0", int(sys.argv[2])))
l.listen(16)
print("ready", flush=True)
while True:
    c, _ = l.accept()
    c.sendall(sys.argv[1].encode())
    c.close()
"#;

/// TCP client: argv DST PORT; prints what the server sent, "refused" or
/// "timeout" (1 s).
const TCP_ASK: &str = r#"
import socket, sys
try:
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1)
    print(c.recv(100).decode())
except ConnectionRefusedError:
    print("refused")
except OSError as e:
    print("timeout" if isinstance(e, socket.timeout) else "error " + str(e))
"#;

/// TCP client with a fixed source port: argv DST PORT SPORT TIMEOUT;
/// prints what the server sent, "refused", "timeout" or the error.
const TCP_ASK_FROM: &str = r#"
import socket, sys
c = socket.socket()
c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
c.bind(("0.0.0.0", int(sys.argv[3])))
c.settimeout(float(sys.argv[4]))
try:
    c.connect((sys.argv[1], int(sys.argv[2])))
    print(c.recv(100).decode())
except ConnectionRefusedError:
    print("refused")
except OSError as e:
    print("timeout" if isinstance(e, socket.timeout) else "error " + str(e))
"#;

/// The upstream test's boom-server: argv PORT. For every connection it
/// accepts, it sends the client one TCP segment from the connection's own
/// address and port but with a sequence number 1 GiB past the window
/// (read off the client's handshake ACK), then prints "sent".
const BOOM_SERVER: &str = r#"
import socket, struct, sys
port = int(sys.argv[1])
raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("0.0.0.0", port))
l.listen(16)
print("ready", flush=True)
def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xffff) + (s >> 16)
    return ~s & 0xffff
conns = []
while True:
    c, peer = l.accept()
    conns.append(c)
    local = c.getsockname()
    while True:
        pkt = raw.recv(65535)
        ihl = (pkt[0] & 15) * 4
        sport, dport, seq, ack, offflags = struct.unpack("!HHIIH", pkt[ihl:ihl + 14])
        if (socket.inet_ntoa(pkt[12:16]), sport) == peer and offflags & 0x12 == 0x10:
            break
    data = b"boom"
    hdr = struct.pack("!HHIIHHHH", port, peer[1], (ack + (1 << 30)) % (1 << 32), seq,
                      (5 << 12) | 0x18, 502, 0, 0)
    pseudo = socket.inet_aton(local[0]) + socket.inet_aton(peer[0]) + struct.pack("!BBH", 0, 6, len(hdr) + len(data))
    hdr = hdr[:16] + struct.pack("!H", csum(pseudo + hdr + data)) + hdr[18:]
    raw.sendto(hdr + data, (peer[0], 0))
    print("sent", flush=True)
"#;

/// The client of the boom-server: argv DST PORT POD. Connects, then for
/// 1.5 s counts the TCP segments its namespace receives: from POD's own
/// address (un-NATed), and carrying "boom" from DST (reverse-NATed).
const BOOM_CLIENT: &str = r#"
import socket, sys, time
dst, port, pod = sys.argv[1], int(sys.argv[2]), sys.argv[3]
raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
raw.settimeout(0.1)
c = socket.create_connection((dst, port), timeout=2)
unnated = natted = 0
deadline = time.time() + 1.5
while time.time() < deadline:
    try:
        pkt = raw.recv(65535)
    except socket.timeout:
        continue
    src = socket.inet_ntoa(pkt[12:16])
    if src == pod:
        unnated += 1
    elif src == dst and pkt.endswith(b"boom"):
        natted += 1
print("unnated=%d natted=%d" % (unnated, natted))
"#;

/// The namespaces of one test and the processes it started, all removed
/// on drop.
struct Bed {
    netns: Netns,
    prefix: String,
    children: Vec<Child>,
}

impl Bed {
    /// The bed of test `tag` (unique among this file's tests), or `None`
    /// (after a SKIP line) where it cannot run.
    fn new(tag: &str) -> Option<Bed> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIP {tag}: needs root");
            return None;
        }
        for cmd in ["ip", "nsenter", "python3"] {
            let found = Command::new("sh")
                .args(["-c", &format!("command -v {cmd}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !found {
                eprintln!("SKIP {tag}: `{cmd}` is not installed");
                return None;
            }
        }
        let mut bed = Bed {
            netns: Netns::default(),
            prefix: format!("ekp-nt{tag}-{}", std::process::id()),
            children: Vec::new(),
        };
        for short in ["node", "client", "pod", "remote"] {
            let name = bed.ns(short);
            bed.netns.add(&name).unwrap();
        }
        let node = bed.ns("node");
        bed.netns.sysctl(&node, "net.ipv4.ip_forward", "1").unwrap();
        for (short, dev, node_addr, addr) in [
            ("client", "c0", "10.0.1.1/24", "10.0.1.2/24"),
            ("pod", "p0", "10.244.1.1/24", "10.244.1.11/24"),
            ("remote", "r0", "10.244.2.1/24", "10.244.2.12/24"),
        ] {
            let ns = bed.ns(short);
            bed.netns.veth(&node, dev, &ns, "eth0").unwrap();
            bed.netns
                .ip(&node, &["addr", "add", node_addr, "dev", dev])
                .unwrap();
            bed.netns
                .ip(&ns, &["addr", "add", addr, "dev", "eth0"])
                .unwrap();
            let gw = node_addr.split('/').next().unwrap();
            bed.netns
                .ip(&ns, &["route", "add", "default", "via", gw])
                .unwrap();
        }
        Some(bed)
    }

    fn ns(&self, short: &str) -> String {
        format!("{}-{short}", self.prefix)
    }

    /// `python3 -c script args...` in namespace `short`.
    fn python(&self, short: &str, script: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.ns(short)))
            .args(["python3", "-c", script])
            .args(args);
        cmd
    }

    /// Runs a client script in `short` to its end; its output, trimmed.
    fn ask(&self, short: &str, script: &str, args: &[&str]) -> String {
        let out = self.python(short, script, args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Starts a server script in `short` and waits for its "ready" line;
    /// it is killed on drop. Its further output is its stdout.
    fn serve(
        &mut self,
        short: &str,
        script: &str,
        args: &[&str],
    ) -> BufReader<std::process::ChildStdout> {
        let mut child = self
            .python(short, script, args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        self.children.push(child);
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "server {args:?} in {short}");
        out
    }

    /// Runs `f` on a thread inside the node's namespace: the datapath it
    /// opens programs that namespace (its conntrack cleanup too).
    fn on_node<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let node = self.ns("node");
        std::thread::scope(|s| {
            s.spawn(move || {
                netns::enter(&node).unwrap();
                f()
            })
            .join()
            .unwrap()
        })
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        // `netns` drops after this: the namespaces go last.
    }
}

/// `default/<name>`: ClusterIP `vip`, port 80 of `protocol`, node port
/// `node_port`, served by `endpoints` (address, target port, on this
/// node).
fn service(
    name: &str,
    vip: &str,
    protocol: Protocol,
    node_port: u16,
    endpoints: &[(&str, u16, bool)],
) -> ServiceEndpoints {
    let mut se = testing::service("default", name, &[vip]).with_node_port(node_port);
    se.service.ports[0].protocol = protocol;
    for (ip, port, local) in endpoints {
        se = se.with_ready_endpoint(ip, *port, *local);
    }
    se
}

/// Asks `dst:port` from the client's `sport` until it answers `want`,
/// for at most `within`; every answer seen.
fn udp_until(
    bed: &Bed,
    dst: &str,
    port: u16,
    sport: u16,
    want: &str,
    within: Duration,
) -> Vec<String> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        let answer = bed.ask(
            "client",
            UDP_ASK,
            &[dst, &port.to_string(), &sport.to_string()],
        );
        let done = answer == want;
        seen.push(answer);
        if done || Instant::now() >= deadline {
            return seen;
        }
    }
}

/// "Conntrack should be able to cleanup conntrack entries when UDP service
/// target port changes for a NodePort service": the pod serves both
/// ports; once the service's targetPort moves, a client that keeps its
/// source port reaches the new port within a second, through the
/// ClusterIP and through the node port (before, the old conntrack entry
/// kept the flow on the old port: the cleanup compared addresses only).
#[test]
fn a_udp_flow_follows_a_target_port_change() {
    let Some(mut bed) = Bed::new("tp") else {
        return;
    };
    bed.serve("pod", UDP_PORTS, &["8080", "8081"]);
    let before = LocalState::new([service(
        "dns",
        "10.96.0.10",
        Protocol::Udp,
        30053,
        &[(POD, 8080, true)],
    )]);
    let after = LocalState::new([service(
        "dns",
        "10.96.0.10",
        Protocol::Udp,
        30053,
        &[(POD, 8081, true)],
    )]);
    bed.on_node(|| {
        let mut dp = Applier::new(Box::new(NftDatapath::open(Vec::new()).unwrap()));
        dp.apply(&Arc::new(before)).unwrap();
        let frontends = [("10.96.0.10", 80, 40000), (NODE_IP, 30053, 40001)];
        for (dst, port, sport) in frontends {
            let seen = udp_until(&bed, dst, port, sport, "8080", Duration::from_secs(3));
            assert_eq!(seen.last().unwrap(), "8080", "{dst}:{port}: {seen:?}");
        }
        dp.apply(&Arc::new(after)).unwrap();
        for (dst, port, sport) in frontends {
            let seen = udp_until(&bed, dst, port, sport, "8081", Duration::from_secs(1));
            assert_eq!(
                seen.last().unwrap(),
                "8081",
                "{dst}:{port} from the same source port after the targetPort change: {seen:?}"
            );
        }
    });
}

/// "should implement NodePort and HealthCheckNodePort correctly when
/// ExternalTrafficPolicy changes", the short-circuit part: a node port of
/// an eTP=Local service whose only endpoint is on another node answers
/// the node's own clients and its pods (they use the cluster endpoints,
/// as with kube-proxy), and drops what comes from outside. Before, the
/// drop was consulted from the output hook too, and pods met it for want
/// of a short-circuit: both timed out. The service loses its local
/// endpoint in a partial sync. A node port without endpoints still
/// refuses the node's own client.
#[test]
fn the_node_and_its_pods_reach_an_etp_local_node_port_without_local_endpoints() {
    let Some(mut bed) = Bed::new("etp") else {
        return;
    };
    bed.serve("remote", TCP_NAME, &["remote", "8080"]);
    bed.serve("pod", TCP_NAME, &["pod", "8080"]);
    let state = |endpoints: &[(&str, u16, bool)]| {
        LocalState::new([
            service("empty", "10.96.0.31", Protocol::Tcp, 30082, &[]),
            service("local", "10.96.0.30", Protocol::Tcp, 30081, endpoints)
                .with_external_policy_local(),
        ])
    };
    bed.on_node(|| {
        let cidrs = vec!["10.244.0.0/16".parse().unwrap()];
        let mut dp = Applier::new(Box::new(NftDatapath::open(cidrs).unwrap()));
        // First with a local endpoint, which outside clients get; then
        // (a partial sync) with the remote one only.
        dp.apply(&Arc::new(state(&[
            (POD, 8080, true),
            (REMOTE_POD, 8080, false),
        ])))
        .unwrap();
        assert_eq!(bed.ask("client", TCP_ASK, &[NODE_IP, "30081"]), "pod");
        let applied = dp
            .apply(&Arc::new(state(&[(REMOTE_POD, 8080, false)])))
            .unwrap();
        assert!(!applied.full);
        assert_eq!(dp.verify().unwrap(), vec![], "drift after the sync");
        for from in ["node", "pod"] {
            assert_eq!(
                bed.ask(from, TCP_ASK, &[NODE_IP, "30081"]),
                "remote",
                "from the {from}"
            );
        }
        assert_eq!(
            bed.ask("client", TCP_ASK, &[NODE_IP, "30081"]),
            "timeout",
            "from outside the node: dropped, not answered or refused"
        );
        // A node port without any endpoint still refuses the node's own
        // client (checked on the input hook, after the loopback).
        for from in ["node", "client"] {
            assert_eq!(
                bed.ask(from, TCP_ASK, &[NODE_IP, "30082"]),
                "refused",
                "no endpoints, from the {from}"
            );
        }
    });
}

/// "Conntrack should drop INVALID conntrack entries" / "proxy
/// implementation should not be vulnerable to the invalid conntrack state
/// bug": the backend of a ClusterIP sends its client a segment outside the
/// TCP window. Conntrack calls it invalid and does not reverse-NAT it;
/// without the `ct state invalid drop` in `filter-forward` the client
/// receives it from the pod's own address (and would reset the
/// connection). With `nf_conntrack_tcp_be_liberal=1` the segment is not
/// invalid: the datapath leaves the rule out and the client receives it
/// reverse-NATed, from the ClusterIP.
#[test]
fn an_out_of_window_segment_from_a_backend_never_reaches_the_client_un_natted() {
    let Some(mut bed) = Bed::new("inv") else {
        return;
    };
    let mut server = bed.serve("pod", BOOM_SERVER, &["9000"]);
    let state = LocalState::new([service(
        "boom",
        "10.96.0.40",
        Protocol::Tcp,
        30090,
        &[(POD, 9000, true)],
    )]);
    let node = bed.ns("node");
    let mut boom = |liberal: &str| {
        bed.netns
            .sysctl(&node, "net.netfilter.nf_conntrack_tcp_be_liberal", liberal)
            .unwrap();
        // A full sync (a start) reads the setting.
        let listing = bed.on_node(|| {
            let mut dp = Applier::new(Box::new(NftDatapath::open(Vec::new()).unwrap()));
            dp.apply(&Arc::new(state.clone())).unwrap();
            assert_eq!(dp.verify().unwrap(), vec![], "drift after the sync");
            nft::nft_output(&["list", "chain", "ip", nft::rules::TABLE, "filter-forward"])
                .unwrap()
                .unwrap_or_default()
        });
        let seen = bed.ask("client", BOOM_CLIENT, &["10.96.0.40", "80", POD]);
        let mut line = String::new();
        server.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "sent", "the boom-server sent its segment");
        (listing, seen)
    };
    let (listing, seen) = boom("0");
    assert!(listing.contains("ct state invalid drop"), "{listing}");
    assert_eq!(seen, "unnated=0 natted=0", "strict conntrack: dropped");
    let (listing, seen) = boom("1");
    assert!(!listing.contains("ct state invalid"), "{listing}");
    assert_eq!(
        seen, "unnated=0 natted=1",
        "liberal conntrack: reverse-NATed"
    );
}

/// The e2e flake of `drift-flushed-or-deleted-nft-table-repaired`: while
/// the table is flushed or deleted by hand, a connect from the node to a
/// ClusterIP leaves its SYN un-NATed (out the node's default route, here
/// as on the e2e bed a veth whose peer stays down) and conntrack keeps that flow, un-NATed,
/// in SYN_SENT for 120 s. A later connect that happens to get the same
/// source port after the repair is a retransmission of that flow to
/// conntrack: no NAT lookup, out the dead route again. The repair (a
/// full sync) deletes the un-NATed TCP entries to service addresses, so
/// the same source port reaches the endpoint at once.
#[test]
fn a_repaired_table_serves_a_source_port_used_while_it_was_missing() {
    let Some(mut bed) = Bed::new("rep") else {
        return;
    };
    bed.serve("pod", TCP_NAME, &["pod", "8080"]);
    let node = bed.ns("node");
    bed.netns
        .ip(
            &node,
            &[
                "link", "add", "dead0", "type", "veth", "peer", "name", "dead1",
            ],
        )
        .unwrap();
    bed.netns
        .ip(&node, &["link", "set", "dead0", "up"])
        .unwrap();
    bed.netns
        .ip(&node, &["route", "add", "default", "dev", "dead0"])
        .unwrap();
    let state = Arc::new(LocalState::new([service(
        "web",
        "10.96.0.50",
        Protocol::Tcp,
        30095,
        &[(POD, 8080, true)],
    )]));
    bed.on_node(|| {
        // Something else on the node uses conntrack (as a CNI's or a
        // firewall's rules do), so it tracks the SYNs sent while our table
        // is missing. On the e2e bed, where nothing else does, such
        // entries come from the repair itself: SYNs sent while its
        // transaction is applied are tracked but not yet NATed (seen with
        // `conntrack -E`: 1 to 98 per repair under a stream of connects).
        let out = Command::new("nft")
            .arg("add table ip ekp-test-ct; add chain ip ekp-test-ct out { type filter hook output priority 0; ct state new counter; }")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let mut dp = Applier::new(Box::new(NftDatapath::open(Vec::new()).unwrap()));
        dp.apply(&state).unwrap();
        assert_eq!(
            bed.ask("node", TCP_ASK_FROM, &["10.96.0.50", "80", "41001", "1"]),
            "pod"
        );
        for (undo, sport) in [("flush", "41010"), ("delete", "41020")] {
            let out = Command::new("nft")
                .args([undo, "table", "ip", nft::rules::TABLE])
                .output()
                .unwrap();
            assert!(out.status.success(), "nft {undo} table: {out:?}");
            assert_eq!(
                bed.ask("node", TCP_ASK_FROM, &["10.96.0.50", "80", sport, "0.3"]),
                "timeout",
                "table {undo}ed: the SYN leaves un-NATed and is lost"
            );
            eprintln!(
                "DBG {undo}: {}",
                String::from_utf8_lossy(
                    &Command::new("sh")
                        .args([
                            "-c",
                            "conntrack -L -p tcp 2>&1; ip neigh; nft list ruleset | head -30"
                        ])
                        .output()
                        .unwrap()
                        .stdout
                )
            );
            assert!(!dp.verify().unwrap().is_empty(), "table {undo}ed: no drift");
            assert!(dp.apply(&state).unwrap().full, "the repair is a full sync");
            assert_eq!(
                bed.ask("node", TCP_ASK_FROM, &["10.96.0.50", "80", sport, "1"]),
                "pod",
                "table {undo}ed and repaired: the source port used meanwhile"
            );
        }
    });
}
