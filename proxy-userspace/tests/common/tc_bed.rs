//! The bed of the tc programs' kernel tests (`ebpf_nodeport`,
//! `ebpf_frag_icmp`): a client outside the node, the node (where the
//! datapath is opened), a pod on the node and the node's link towards one
//! more namespace (another node, or a router to one), wired and addressed
//! with the third octet `net` (each test its own, so that they can run at
//! the same time):
//!
//! ```text
//!  client ns            node ns                                 pod ns
//!  c0 192.168.N.2 ───── n0 192.168.N.1   np 10.N.1.1 ─────────── p0 10.N.1.10
//!     fdN::2               fdN::1           fdN:1::1                fdN:1::10
//!                          n1 192.168.(N+1).1 ──── r0 192.168.(N+1).2   `other` ns
//! ```
//! The client and the pod route everything through the node, `other`
//! routes IPv4 through it; the node forwards. What lies behind `other` is
//! the test's own.

use super::kernel::Env;

pub const CLIENT_NS: &str = "client";
pub const NODE_NS: &str = "node";
pub const POD_NS: &str = "pod";

/// Creates, wires and addresses the namespaces of the picture (`other`
/// being the short name of the fourth).
pub fn build(env: &mut Env, net: u8, other: &str) {
    for short in [CLIENT_NS, NODE_NS, POD_NS, other] {
        env.add_ns(short);
    }
    let (c, n, p, r) = (
        env.ns(CLIENT_NS),
        env.ns(NODE_NS),
        env.ns(POD_NS),
        env.ns(other),
    );
    env.netns.veth(&c, "c0", &n, "n0").unwrap();
    env.netns.veth(&p, "p0", &n, "np").unwrap();
    env.netns.veth(&r, "r0", &n, "n1").unwrap();
    for key in ["net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"] {
        env.netns.sysctl(&n, key, "1").unwrap();
    }
    let next = u16::from(net) + 1;
    // (namespace, `ip` command): addresses (IPv6 without duplicate
    // address detection, usable at once) and routes.
    let config = [
        (CLIENT_NS, format!("addr add 192.168.{net}.2/24 dev c0")),
        (CLIENT_NS, format!("addr add fd{net}::2/64 dev c0 nodad")),
        (CLIENT_NS, format!("route add default via 192.168.{net}.1")),
        (CLIENT_NS, format!("-6 route add default via fd{net}::1")),
        (NODE_NS, format!("addr add 192.168.{net}.1/24 dev n0")),
        (NODE_NS, format!("addr add fd{net}::1/64 dev n0 nodad")),
        (NODE_NS, format!("addr add 10.{net}.1.1/24 dev np")),
        (NODE_NS, format!("addr add fd{net}:1::1/64 dev np nodad")),
        (NODE_NS, format!("addr add 192.168.{next}.1/24 dev n1")),
        (POD_NS, format!("addr add 10.{net}.1.10/24 dev p0")),
        (POD_NS, format!("addr add fd{net}:1::10/64 dev p0 nodad")),
        (POD_NS, format!("route add default via 10.{net}.1.1")),
        (POD_NS, format!("-6 route add default via fd{net}:1::1")),
        (other, format!("addr add 192.168.{next}.2/24 dev r0")),
        (other, format!("route add default via 192.168.{next}.1")),
    ];
    let config: Vec<(&str, &str)> = config.iter().map(|(ns, c)| (*ns, c.as_str())).collect();
    env.ip_all(&config);
}
