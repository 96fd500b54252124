//! The routed network of the bed: each node's uplink to the router and
//! the routes between nodes, pods and the outside client, a node's pods
//! behind routed veths, and the helpers that create links and addresses.

use anyhow::Result;

use super::{ip, Bed, Pod};

/// What a node sends to the router.
const UNDERLAY_V4: &str = "192.168.0.0/16";
const UNDERLAY_V6: &str = "fd00:192:168::/48";
const PODS_V4: &str = "10.244.0.0/16";
const PODS_V6: &str = "fd00:244::/32";

/// A node's place in the routed network.
pub struct NodeNet {
    /// `--hostname-override`, and the `nodeName` of its endpoints.
    pub name: &'static str,
    /// The node's address on its uplink.
    pub ip: &'static str,
    pub ipv6: &'static str,
    /// The router's side of the uplink (its interface name and addresses).
    router_link: &'static str,
    router_ip: &'static str,
    router_ipv6: &'static str,
    pub pod_cidr: &'static str,
    pub pod_cidr_v6: &'static str,
}

pub const NODE1: NodeNet = NodeNet {
    name: "node-1",
    ip: "192.168.100.1",
    ipv6: "fd00:192:168:100::1",
    router_link: "n1",
    router_ip: "192.168.100.254",
    router_ipv6: "fd00:192:168:100::fe",
    pod_cidr: "10.244.1.0/24",
    // node 1's pods are fd00:244::11..13, from before there were two nodes.
    pod_cidr_v6: "fd00:244::/64",
};

pub const NODE2: NodeNet = NodeNet {
    name: "node-2",
    ip: "192.168.101.1",
    ipv6: "fd00:192:168:101::1",
    router_link: "n2",
    router_ip: "192.168.101.254",
    router_ipv6: "fd00:192:168:101::fe",
    pod_cidr: "10.244.2.0/24",
    pod_cidr_v6: "fd00:244:2::/64",
};

/// A veth pair: `a` in netns `a_ns`, `b` in `b_ns`, both up.
pub(super) fn veth(a_ns: &str, a: &str, b_ns: &str, b: &str) -> Result<()> {
    ip(&[
        "-n", a_ns, "link", "add", a, "type", "veth", "peer", "name", b, "netns", b_ns,
    ])?;
    ip(&["-n", a_ns, "link", "set", a, "up"])?;
    ip(&["-n", b_ns, "link", "set", b, "up"])
}

/// One address of each family on `dev` (no duplicate address detection:
/// the address is usable at once).
pub(super) fn address(
    netns: &str,
    dev: &str,
    v4: &str,
    len4: u8,
    v6: &str,
    len6: u8,
) -> Result<()> {
    ip(&[
        "-n",
        netns,
        "addr",
        "add",
        &format!("{v4}/{len4}"),
        "dev",
        dev,
    ])?;
    ip(&[
        "-n",
        netns,
        "-6",
        "addr",
        "add",
        &format!("{v6}/{len6}"),
        "dev",
        dev,
        "nodad",
    ])
}

/// A route to `prefix` via the gateway of its family.
pub(super) fn route_via(netns: &str, prefix: &str, gw4: &str, gw6: &str) -> Result<()> {
    let (family, gw) = if prefix.contains(':') {
        ("-6", gw6)
    } else {
        ("-4", gw4)
    };
    ip(&["-n", netns, family, "route", "add", prefix, "via", gw])
}

impl Bed {
    /// The node's link to the router, its addresses on it, and the routes
    /// between the node's pods and the rest of the network: the node sends
    /// everything of the underlay and every other node's pods to the
    /// router, the router sends this node's pod CIDR to the node.
    pub(super) fn uplink(&mut self, node: &str, name: &str, n: &NodeNet) -> Result<()> {
        let router = self.router_netns.clone();
        veth(node, name, &router, n.router_link)?;
        address(node, name, n.ip, 24, n.ipv6, 64)?;
        address(&router, n.router_link, n.router_ip, 24, n.router_ipv6, 64)?;
        for (v4, v6) in [(UNDERLAY_V4, UNDERLAY_V6), (PODS_V4, PODS_V6)] {
            route_via(node, v4, n.router_ip, n.router_ipv6)?;
            route_via(node, v6, n.router_ip, n.router_ipv6)?;
        }
        route_via(&router, n.pod_cidr, n.ip, n.ipv6)?;
        route_via(&router, n.pod_cidr_v6, n.ip, n.ipv6)
    }

    pub(super) fn forwarding(&self, netns: &str) -> Result<()> {
        self.sysctl(netns, "net.ipv4.ip_forward", "1")?;
        self.sysctl(netns, "net.ipv6.conf.all.forwarding", "1")
    }

    /// Service addresses are routed nowhere; a real node has a default
    /// route, so connect() gets as far as the nftables output hook (which
    /// DNATs and reroutes) instead of failing with "network unreachable".
    /// Socket-LB rewrites before the route lookup and needs none. A veth
    /// whose peer stays down takes the route: packets sent on it go nowhere
    /// (no dummy module needed).
    pub(crate) fn add_void_default_route(&self, netns: &str) -> Result<()> {
        let dummy = format!("{}dflt", self.prefix);
        let peer = format!("{}dpeer", self.prefix);
        ip(&[
            "-n", netns, "link", "add", &dummy, "type", "veth", "peer", "name", &peer,
        ])?;
        ip(&["-n", netns, "link", "set", &dummy, "up"])?;
        ip(&["-n", netns, "route", "add", "default", "dev", &dummy])?;
        ip(&["-n", netns, "-6", "route", "add", "default", "dev", &dummy])
    }

    /// Removes node 1's [`Bed::add_void_default_route`].
    pub(crate) fn remove_void_default_route(&self) -> Result<()> {
        let dummy = format!("{}dflt", self.prefix);
        ip(&["-n", &self.node_netns, "link", "del", &dummy])
    }

    /// A pod behind a routed veth (`veth` on the node side) of `node`.
    pub(super) fn add_pod(&mut self, node: &str, veth: &str, pod: &Pod) -> Result<()> {
        self.add_netns(&pod.netns)?;
        ip(&[
            "-n", node, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns",
            &pod.netns,
        ])?;
        ip(&["-n", node, "link", "set", veth, "up"])?;
        ip(&[
            "-n",
            node,
            "-6",
            "addr",
            "add",
            "fe80::1/64",
            "dev",
            veth,
            "nodad",
        ])?;
        let (host4, host6) = (format!("{}/32", pod.ipv4), format!("{}/128", pod.ipv6));
        ip(&["-n", node, "route", "add", &host4, "dev", veth])?;
        ip(&["-n", node, "-6", "route", "add", &host6, "dev", veth])?;
        let ns = pod.netns.as_str();
        ip(&["-n", ns, "addr", "add", &host4, "dev", "eth0"])?;
        ip(&[
            "-n", ns, "-6", "addr", "add", &host6, "dev", "eth0", "nodad",
        ])?;
        ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        ip(&[
            "-n",
            ns,
            "route",
            "add",
            "169.254.1.1",
            "dev",
            "eth0",
            "scope",
            "link",
        ])?;
        ip(&[
            "-n",
            ns,
            "route",
            "add",
            "default",
            "via",
            "169.254.1.1",
            "dev",
            "eth0",
        ])?;
        ip(&[
            "-n", ns, "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0",
        ])
    }
}
