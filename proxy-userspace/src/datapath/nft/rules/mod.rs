//! Pure builders: a [`ServiceEndpoints`] in, the nftables objects it needs
//! out (chains with their [`Rule`]s, affinity sets, verdict-map elements,
//! hairpin addresses). No I/O here.
//!
//! Layout per family (`ip`/`ip6`), table [`TABLE`], shaped like
//! kube-proxy's nftables mode:
//!
//! * base chains `nat-prerouting`/`nat-output` jump to `services`, which
//!   dispatches `daddr . l4proto . dport` through the `service-ips` verdict
//!   map, and `l4proto . dport` to local addresses through
//!   `service-nodeports`;
//! * `filter-*` chains look new connections up in `no-endpoint-services` /
//!   `no-endpoint-nodeports` and reject them (TCP reset, else ICMP port
//!   unreachable) before any NAT happens;
//! * per service port a cluster chain `svc-…` (traffic to cluster IPs,
//!   the `internal` scope) and an external chain `ext-…` (node ports,
//!   external and load-balancer IPs, the `external` scope) pick an
//!   endpoint and DNAT to it in one rule per endpoint: rule *i* of *N*
//!   matches `numgen random mod (N - i) 0`, which gives every endpoint
//!   1/N; ClientIP affinity rules come first;
//! * `nat-postrouting` masquerades hairpin connections (a pod sent to
//!   itself: `saddr . daddr` in the `hairpin` set) and what was marked
//!   with [`MASQ_MARK`].
//!
//! No per-endpoint chains and no anonymous sets: the kernel looks named
//! sets up by a list walk and binds anonymous ones by walking the whole
//! transaction, so both grow quadratically with the table; chains and
//! rules do not.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

pub use super::batch::Family;
use super::batch::{SetSpec, NFT_SET_EVAL, NFT_SET_MAP, NFT_SET_TIMEOUT};
use super::expr::{Field, KeyPart, Match, Rule, Stmt, Verdict};
use crate::model::{
    EndpointScopes, LocalEndpoint, LocalService, Protocol, ServiceEndpoints, TrafficPolicy,
};
use crate::net::Cidr;

/// The table the proxy owns, one per family.
pub const TABLE: &str = "ebpf-kube-proxy";
/// The packet mark that asks `nat-postrouting` to masquerade (kube-proxy's).
pub const MASQ_MARK: u32 = 0x4000;

pub const SERVICE_IPS: &str = "service-ips";
pub const SERVICE_NODEPORTS: &str = "service-nodeports";
pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
pub const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
pub const HAIRPIN: &str = "hairpin";
/// The maps and sets every table has.
pub const BASE_SETS: [&str; 5] = [
    SERVICE_IPS,
    SERVICE_NODEPORTS,
    NO_ENDPOINT_SERVICES,
    NO_ENDPOINT_NODEPORTS,
    HAIRPIN,
];
/// A rule-less chain whose comment says which mode runs and why
/// (`dump` shows it).
pub const INFO_CHAIN: &str = "datapath-info";
const MARK_FOR_MASQUERADE: &str = "mark-for-masquerade";
const REJECT_CHAIN: &str = "reject-chain";

// nft's datatype numbers, for set key types (concatenations shift each
// part in by 6 bits, as nft does).
const TYPE_INET_PROTO: u32 = 12;
const TYPE_INET_SERVICE: u32 = 13;

fn concat_type(parts: &[u32]) -> u32 {
    parts.iter().fold(0, |acc, t| (acc << 6) | t)
}

/// A map element's identity: the map and its key.
pub type ElementKey = (&'static str, Vec<KeyPart>);

/// Everything one service owns in one family's table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceObjects {
    /// Chain name → its rules.
    pub chains: BTreeMap<String, Vec<Rule>>,
    /// Affinity set name → timeout in seconds.
    pub sets: BTreeMap<String, u32>,
    /// (map, key) → verdict.
    pub elements: BTreeMap<ElementKey, Verdict>,
    /// Endpoint addresses this service DNATs to: `addr . addr` goes in the
    /// `hairpin` set while some service uses the address.
    pub hairpin: BTreeSet<IpAddr>,
}

pub fn l4(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

fn jump(target: &str) -> Stmt {
    Stmt::Verdict(Verdict::Jump(target.to_owned()))
}

fn goto(target: &str) -> Stmt {
    Stmt::Verdict(Verdict::Goto(target.to_owned()))
}

fn addr_match(field: Field, negate: bool, net: Cidr) -> Match {
    Match::Addr { field, negate, net }
}

fn host(ip: IpAddr) -> Cidr {
    Cidr {
        addr: ip,
        prefix_len: if ip.is_ipv4() { 32 } else { 128 },
    }
}

fn not_loopback(f: Family) -> Match {
    let net = match f {
        Family::V4 => Cidr {
            addr: IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 0)),
            prefix_len: 8,
        },
        Family::V6 => host(IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)),
    };
    addr_match(Field::Daddr, true, net)
}

/// The sets and maps of a family's table.
pub fn base_sets(f: Family) -> Vec<SetSpec> {
    let ip_key = concat_type(&[f.addr_type(), TYPE_INET_PROTO, TYPE_INET_SERVICE]);
    let port_key = concat_type(&[TYPE_INET_PROTO, TYPE_INET_SERVICE]);
    let map = |name: &str, key_type: u32, key_len: u32| SetSpec {
        name: name.to_owned(),
        flags: NFT_SET_MAP,
        key_type,
        key_len,
        timeout_ms: 0,
    };
    vec![
        map(SERVICE_IPS, ip_key, f.addr_len() + 8),
        map(SERVICE_NODEPORTS, port_key, 8),
        map(NO_ENDPOINT_SERVICES, ip_key, f.addr_len() + 8),
        map(NO_ENDPOINT_NODEPORTS, port_key, 8),
        SetSpec {
            name: HAIRPIN.to_owned(),
            flags: 0,
            key_type: concat_type(&[f.addr_type(), f.addr_type()]),
            key_len: 2 * f.addr_len(),
            timeout_ms: 0,
        },
    ]
}

/// An affinity set: source addresses with a timeout, updated by rules.
pub fn affinity_set(f: Family, name: &str, timeout_secs: u32) -> SetSpec {
    SetSpec {
        name: name.to_owned(),
        flags: NFT_SET_TIMEOUT | NFT_SET_EVAL,
        key_type: f.addr_type(),
        key_len: f.addr_len(),
        timeout_ms: u64::from(timeout_secs) * 1000,
    }
}

/// A base chain: (name, type, hook number, priority).
pub type BaseChain = (&'static str, &'static str, u32, i32);

/// The hooked chains (netfilter hook numbers: prerouting 0, input 1,
/// forward 2, output 3, postrouting 4).
pub const BASE_CHAINS: [BaseChain; 6] = [
    // dstnat priority, as kube-proxy.
    ("nat-prerouting", "nat", 0, -100),
    ("nat-output", "nat", 3, -100),
    ("nat-postrouting", "nat", 4, 100),
    // Before the usual filter chains (priority 0), so a connection to a
    // service without endpoints is refused whatever else is there.
    ("filter-input", "filter", 1, -110),
    ("filter-forward", "filter", 2, -110),
    ("filter-output", "filter", 3, -110),
];

/// The regular chains every table has.
pub const HELPER_CHAINS: [&str; 5] = [
    "services",
    "endpoints-check",
    "masquerading",
    MARK_FOR_MASQUERADE,
    REJECT_CHAIN,
];

/// The rules of the base and helper chains. Node ports answer on every
/// local address but loopback, or, with `nodeport_addresses`
/// (`--nodeport-addresses`), on the local addresses inside those CIDRs
/// (none of this family: no node ports in it).
pub fn base_rules(f: Family, nodeport_addresses: &[Cidr]) -> Vec<(&'static str, Rule)> {
    let r = Rule::new;
    let mut rules = vec![
        ("nat-prerouting", r(vec![], vec![jump("services")])),
        ("nat-output", r(vec![], vec![jump("services")])),
        ("nat-postrouting", r(vec![], vec![jump("masquerading")])),
    ];
    for chain in ["filter-input", "filter-forward", "filter-output"] {
        rules.push((
            chain,
            r(vec![Match::CtStateNew], vec![jump("endpoints-check")]),
        ));
    }
    // The local destinations node ports answer on.
    let mut node_dests: Vec<Vec<Match>> = Vec::new();
    if nodeport_addresses.is_empty() {
        node_dests.push(vec![Match::FibLocal(Field::Daddr), not_loopback(f)]);
    }
    for c in nodeport_addresses
        .iter()
        .filter(|c| Family::of(&c.addr) == f)
    {
        node_dests.push(vec![
            Match::FibLocal(Field::Daddr),
            not_loopback(f),
            addr_match(Field::Daddr, false, *c),
        ]);
    }
    rules.push((
        "services",
        r(vec![], vec![Stmt::ServiceVmap(SERVICE_IPS.to_owned())]),
    ));
    for m in &node_dests {
        rules.push((
            "services",
            r(
                m.clone(),
                vec![Stmt::NodePortVmap(SERVICE_NODEPORTS.to_owned())],
            ),
        ));
    }
    rules.push((
        "endpoints-check",
        r(
            vec![],
            vec![Stmt::ServiceVmap(NO_ENDPOINT_SERVICES.to_owned())],
        ),
    ));
    for m in node_dests {
        rules.push((
            "endpoints-check",
            r(
                m,
                vec![Stmt::NodePortVmap(NO_ENDPOINT_NODEPORTS.to_owned())],
            ),
        ));
    }
    rules.extend([
        // A pod that reached itself through a service: its replies would
        // skip the reverse NAT without the node's address as source.
        (
            "masquerading",
            r(
                vec![Match::CtStatusDnat, Match::SaddrDaddrIn(HAIRPIN.to_owned())],
                vec![Stmt::Masquerade],
            ),
        ),
        (
            "masquerading",
            r(
                vec![Match::MarkClear(MASQ_MARK)],
                vec![Stmt::Verdict(Verdict::Return)],
            ),
        ),
        // Clear the mark so a packet that leaves and comes back (through
        // another hop) is not masqueraded twice.
        (
            "masquerading",
            r(vec![], vec![Stmt::MarkFlip(MASQ_MARK), Stmt::Masquerade]),
        ),
        (
            MARK_FOR_MASQUERADE,
            r(vec![], vec![Stmt::MarkSet(MASQ_MARK)]),
        ),
        (REJECT_CHAIN, r(vec![], vec![Stmt::RejectTcpReset])),
        (REJECT_CHAIN, r(vec![], vec![Stmt::Reject])),
    ]);
    rules
}

pub(in crate::datapath::nft) mod service;

pub use service::{service_objects, service_of};
