//! Pure builders: a [`ServiceEndpoints`] in, the nftables objects it needs
//! out (chains with their [`Rule`]s, affinity sets, map elements, the
//! endpoint counts in use, hairpin addresses). No I/O here.
//!
//! Layout per family (`ip`/`ip6`), table [`TABLE`], shaped like
//! kube-proxy's nftables mode:
//!
//! * base chains `nat-prerouting`/`nat-output` jump to `services`, which
//!   dispatches `daddr . l4proto . dport` through the `service-ips` verdict
//!   map, and `l4proto . dport` to local addresses through
//!   `service-nodeports`;
//! * `filter-*` chains look new connections up in `no-endpoint-services`
//!   (`endpoints-check`) and, on the input hook only,
//!   `no-endpoint-nodeports` (`nodeport-endpoints-check`), and reject them
//!   (TCP reset, else ICMP port unreachable) or drop them (eTP=Local
//!   without local endpoints) before any NAT happens;
//! * per service port a cluster chain `svc-…` (traffic to cluster IPs,
//!   the `internal` scope) and an external chain `ext-…` (node ports,
//!   external and load-balancer IPs, the `external` scope) hold the
//!   masquerade marks, the load-balancer firewall and the eTP=Local
//!   short-circuit, and end in `goto pick-internal` / `goto pick-external`
//!   (an eTP=Local external chain without local endpoints has only the
//!   short-circuit: outside traffic leaves it un-NATed and is dropped);
//! * the endpoints are map elements, per scope and per frontend (a
//!   service address `daddr . l4proto . dport`, or a node port `l4proto .
//!   dport`): `internal-counts` holds a frontend's number of endpoints,
//!   `internal-endpoints` its endpoints by slot (`daddr . l4proto . dport
//!   . slot` → `addr . port`), `internal-nodeport-counts` and
//!   `internal-nodeport-endpoints` the same by node port, and `external-…`
//!   likewise. The internal maps also hold the external addresses and
//!   node ports of eTP=Local services, whose pods and node short-circuit
//!   to the cluster chain;
//! * `pick-internal` and `pick-external` hold, per endpoint count *k* (see
//!   [`pick_counts`]), one rule per kind of frontend: when the packet's
//!   frontend has *k* endpoints, DNAT to `frontend . (numgen random mod
//!   k)` in the endpoints map ([`FrontendPick`]). Address rules come
//!   before node-port rules, so a service address whose port equals a
//!   node port is not taken for it. Each rule derives the frontend from
//!   the packet: a register does not outlive its chain, numgen's modulus
//!   is a constant, and `nft` cannot list a rule that looks a map up by
//!   another map's result (so no group ids in between);
//! * a service with ClientIP affinity keeps one rule per endpoint in its
//!   chains instead (rule *i* of *N* matches `numgen random mod (N - i)
//!   0`, which gives every endpoint 1/N), after its per-endpoint affinity
//!   rules;
//! * `nat-postrouting` masquerades hairpin connections (a pod sent to
//!   itself: `saddr . daddr` in the `hairpin` set) and what was marked
//!   with [`MASQ_MARK`].
//!
//! Why maps: the kernel validates the whole table (about 95 ms at 50,000
//! services) when a transaction adds a rule with a jump, NAT, fib or
//! lookup, or a verdict element with a jump or goto; data-map elements
//! cost microseconds. An endpoint change of a service without affinity
//! (its count staying at least 1) is elements of the count and endpoint
//! maps and of `hairpin` only. The number of rules that read the data
//! maps stays fixed whatever the number of services: the kernel checks
//! every new map element against every rule that reads the map, and
//! walks the map for every new such rule.
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
pub use super::expr::{FrontendKey, FrontendPick};
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
/// Per scope, by `daddr . l4proto . dport` and by `l4proto . dport`:
/// a frontend's number of endpoints, and its endpoints by slot
/// (`frontend . slot` → `addr . port`).
pub const INTERNAL_COUNTS: &str = "internal-counts";
pub const INTERNAL_NODEPORT_COUNTS: &str = "internal-nodeport-counts";
pub const EXTERNAL_COUNTS: &str = "external-counts";
pub const EXTERNAL_NODEPORT_COUNTS: &str = "external-nodeport-counts";
pub const INTERNAL_ENDPOINTS: &str = "internal-endpoints";
pub const INTERNAL_NODEPORT_ENDPOINTS: &str = "internal-nodeport-endpoints";
pub const EXTERNAL_ENDPOINTS: &str = "external-endpoints";
pub const EXTERNAL_NODEPORT_ENDPOINTS: &str = "external-nodeport-endpoints";
/// (pick chain, key, counts map, endpoints map) of each scope and key.
pub const PICKS: [(&str, FrontendKey, &str, &str); 4] = [
    (
        PICK_INTERNAL,
        FrontendKey::Service,
        INTERNAL_COUNTS,
        INTERNAL_ENDPOINTS,
    ),
    (
        PICK_INTERNAL,
        FrontendKey::NodePort,
        INTERNAL_NODEPORT_COUNTS,
        INTERNAL_NODEPORT_ENDPOINTS,
    ),
    (
        PICK_EXTERNAL,
        FrontendKey::Service,
        EXTERNAL_COUNTS,
        EXTERNAL_ENDPOINTS,
    ),
    (
        PICK_EXTERNAL,
        FrontendKey::NodePort,
        EXTERNAL_NODEPORT_COUNTS,
        EXTERNAL_NODEPORT_ENDPOINTS,
    ),
];
/// The maps and sets every table has.
pub const BASE_SETS: [&str; 13] = [
    SERVICE_IPS,
    SERVICE_NODEPORTS,
    NO_ENDPOINT_SERVICES,
    NO_ENDPOINT_NODEPORTS,
    HAIRPIN,
    INTERNAL_COUNTS,
    INTERNAL_NODEPORT_COUNTS,
    EXTERNAL_COUNTS,
    EXTERNAL_NODEPORT_COUNTS,
    INTERNAL_ENDPOINTS,
    INTERNAL_NODEPORT_ENDPOINTS,
    EXTERNAL_ENDPOINTS,
    EXTERNAL_NODEPORT_ENDPOINTS,
];
/// The chains that pick an endpoint of the internal and the external
/// scope.
pub const PICK_INTERNAL: &str = "pick-internal";
pub const PICK_EXTERNAL: &str = "pick-external";
/// A rule-less chain whose comment says which mode runs and why
/// (`dump` shows it).
pub const INFO_CHAIN: &str = "datapath-info";
const MARK_FOR_MASQUERADE: &str = "mark-for-masquerade";
/// Where `filter-input` looks node ports up in `no-endpoint-nodeports`.
const NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";
const REJECT_CHAIN: &str = "reject-chain";

// nft's datatype numbers, for set key types (concatenations shift each
// part in by 6 bits, as nft does).
const TYPE_INET_PROTO: u32 = 12;
const TYPE_INET_SERVICE: u32 = 13;
const TYPE_MARK: u32 = 19;

fn concat_type(parts: &[u32]) -> u32 {
    parts.iter().fold(0, |acc, t| (acc << 6) | t)
}

/// A map element's identity: the map and its key.
pub type ElementKey = (&'static str, Vec<KeyPart>);

/// A map element's value: a verdict, or data (a count, an endpoint's
/// `addr . port`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ElementValue {
    Verdict(Verdict),
    Data(Vec<KeyPart>),
}

impl std::fmt::Display for ElementValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ElementValue::Verdict(v) => v.fmt(f),
            ElementValue::Data(parts) => f.write_str(&super::expr::key_text(parts)),
        }
    }
}

/// An endpoint a frontend picks: `addr . port`.
pub type SlotTarget = (IpAddr, u16);

/// One frontend's endpoints by slot in an endpoints map: element
/// `frontend . slot` → `targets[slot]`. Kept as one list, not as
/// elements, so a change of a large service compares lists slot by slot
/// and frontends of one scope share the list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotList {
    /// The endpoints map (`internal-endpoints`, …).
    pub map: &'static str,
    /// `daddr . l4proto . dport` or `l4proto . dport`.
    pub frontend: Vec<KeyPart>,
    pub targets: std::sync::Arc<[SlotTarget]>,
}

impl SlotList {
    /// The map element of `slot`.
    pub fn element(&self, slot: usize) -> (ElementKey, ElementValue) {
        let mut k = self.frontend.clone();
        k.push(KeyPart::Mark(slot as u32));
        let (ip, port) = self.targets[slot];
        (
            (self.map, k),
            ElementValue::Data(vec![KeyPart::Addr(ip), KeyPart::Port(port)]),
        )
    }

    /// Every map element of the list, by slot.
    pub fn elements(&self) -> impl Iterator<Item = (ElementKey, ElementValue)> + '_ {
        (0..self.targets.len()).map(|i| self.element(i))
    }
}

/// Everything one service owns in one family's table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceObjects {
    /// Chain name → its rules.
    pub chains: BTreeMap<String, Vec<Rule>>,
    /// Affinity set name → timeout in seconds.
    pub sets: BTreeMap<String, u32>,
    /// (map, key) → verdict or data, except the endpoints maps' elements
    /// (in `slots`).
    pub elements: BTreeMap<ElementKey, ElementValue>,
    /// The endpoints of each frontend that picks from the shared maps.
    pub slots: Vec<SlotList>,
    /// Endpoint addresses this service DNATs to: `addr . addr` goes in the
    /// `hairpin` set while some service uses the address.
    pub hairpin: BTreeSet<IpAddr>,
    /// The endpoint counts of its frontends that pick from the shared
    /// maps (the pick chains need rules for them).
    pub counts: BTreeSet<u32>,
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
        data: None,
    };
    let data_map = |name: &str, key_type: u32, key_len: u32, data: (u32, u32)| SetSpec {
        data: Some(data),
        ..map(name, key_type, key_len)
    };
    let count = (TYPE_MARK, 4);
    let endpoint = (
        concat_type(&[f.addr_type(), TYPE_INET_SERVICE]),
        f.addr_len() + 4,
    );
    let ip_slot = concat_type(&[f.addr_type(), TYPE_INET_PROTO, TYPE_INET_SERVICE, TYPE_MARK]);
    let port_slot = concat_type(&[TYPE_INET_PROTO, TYPE_INET_SERVICE, TYPE_MARK]);
    let mut sets = vec![
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
            data: None,
        },
    ];
    for (_, key, counts, endpoints) in PICKS {
        sets.extend(match key {
            FrontendKey::Service => [
                data_map(counts, ip_key, f.addr_len() + 8, count),
                data_map(endpoints, ip_slot, f.addr_len() + 12, endpoint),
            ],
            FrontendKey::NodePort => [
                data_map(counts, port_key, 8, count),
                data_map(endpoints, port_slot, 12, endpoint),
            ],
        });
    }
    sets
}

/// An affinity set: source addresses with a timeout, updated by rules.
pub fn affinity_set(f: Family, name: &str, timeout_secs: u32) -> SetSpec {
    SetSpec {
        name: name.to_owned(),
        flags: NFT_SET_TIMEOUT | NFT_SET_EVAL,
        key_type: f.addr_type(),
        key_len: f.addr_len(),
        timeout_ms: u64::from(timeout_secs) * 1000,
        data: None,
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
pub const HELPER_CHAINS: [&str; 8] = [
    "services",
    "endpoints-check",
    NODEPORT_ENDPOINTS_CHECK,
    "masquerading",
    MARK_FOR_MASQUERADE,
    REJECT_CHAIN,
    PICK_INTERNAL,
    PICK_EXTERNAL,
];

/// The endpoint counts the pick chains have rules for, given the counts
/// in use: each of them and its neighbours, so a frontend that gains or
/// loses one endpoint finds its rules already there (adding one means
/// validating the whole table).
pub fn pick_counts(in_use: impl IntoIterator<Item = u32>) -> BTreeSet<u32> {
    in_use
        .into_iter()
        .flat_map(|n| [n.saturating_sub(1), n, n.saturating_add(1)])
        .filter(|n| *n > 0)
        .collect()
}

/// The rules of the pick chains for endpoint counts `counts`: per chain
/// every address rule, then every node-port rule (a packet whose address
/// is a frontend must not be taken for a node port).
pub fn pick_rules(counts: &BTreeSet<u32>) -> Vec<(&'static str, Rule)> {
    let mut out = Vec::new();
    for (chain, key, counts_map, endpoints) in PICKS {
        for &count in counts {
            let pick = FrontendPick {
                key,
                counts: counts_map.to_owned(),
                endpoints: endpoints.to_owned(),
                count,
            };
            out.push((chain, Rule::new(vec![], vec![Stmt::PickEndpoint(pick)])));
        }
    }
    out
}

/// The rules of the base and helper chains. Node ports answer on every
/// local address but loopback, or, with `nodeport_addresses`
/// (`--nodeport-addresses`), on the local addresses inside those CIDRs
/// (none of this family: no node ports in it). With `drop_invalid`,
/// forwarded packets conntrack finds invalid are dropped (see
/// [`NftDatapath`](super::NftDatapath)'s full sync for when).
pub fn base_rules(
    f: Family,
    nodeport_addresses: &[Cidr],
    drop_invalid: bool,
) -> Vec<(&'static str, Rule)> {
    let r = Rule::new;
    let mut rules = vec![
        ("nat-prerouting", r(vec![], vec![jump("services")])),
        ("nat-output", r(vec![], vec![jump("services")])),
        ("nat-postrouting", r(vec![], vec![jump("masquerading")])),
    ];
    // kube-proxy's iptables mode does the same (KUBE-FORWARD): a reply
    // segment outside the TCP window is invalid to conntrack, so it is
    // not reverse-NATed, and would reach the client from the endpoint's
    // own address; the client answers with a reset that kills the
    // connection ("Conntrack should drop INVALID conntrack entries").
    if drop_invalid {
        rules.push((
            "filter-forward",
            r(
                vec![Match::CtStateInvalid],
                vec![Stmt::Verdict(Verdict::Drop)],
            ),
        ));
    }
    // Node ports without endpoints are checked on the input hook only
    // (as kube-proxy): a node port the node's own client dials is
    // short-circuited by `nat-output`, after the output hook's check
    // would have dropped it (eTP=Local without local endpoints).
    rules.push((
        "filter-input",
        r(
            vec![Match::CtStateNew],
            vec![jump(NODEPORT_ENDPOINTS_CHECK)],
        ),
    ));
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
            NODEPORT_ENDPOINTS_CHECK,
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
