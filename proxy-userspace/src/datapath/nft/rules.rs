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

/// `<namespace>/<name>/<protocol>/<port name or number>`: names a service
/// port in chain and set names, so `nft list table` reads like the service.
fn port_id(svc: &LocalService, name: &str, protocol: Protocol, port: u16) -> String {
    let port_name = if name.is_empty() {
        port.to_string()
    } else {
        name.to_owned()
    };
    format!(
        "{}/{}/{}/{}",
        svc.key.namespace,
        svc.key.name,
        l4(protocol),
        port_name
    )
}

/// The service key a chain or set name belongs to (`namespace/name`), for
/// `dump`.
pub fn service_of(object_name: &str) -> Option<String> {
    let rest = ["svc-", "ext-", "fw-", "aff-"]
        .iter()
        .find_map(|p| object_name.strip_prefix(p))?;
    let mut parts = rest.splitn(3, '/');
    let ns = parts.next()?;
    let name = parts.next()?;
    parts.next()?;
    Some(format!("{ns}/{name}"))
}

struct Target<'a> {
    ep: &'a LocalEndpoint,
    port: u16,
    scopes: EndpointScopes,
}

/// What one service needs in family `f`.
/// Traffic to a ClusterIP from outside `cluster_cidrs` is masqueraded;
/// with `masquerade_all` (kube-proxy's `--masquerade-all`) all of it is.
pub fn service_objects(
    se: &ServiceEndpoints,
    f: Family,
    cluster_cidrs: &[Cidr],
    masquerade_all: bool,
) -> ServiceObjects {
    let ServiceEndpoints {
        service: svc,
        endpoints,
        ..
    } = se;
    let mut out = ServiceObjects::default();
    let family_ips = |set: &crate::model::IpSet| -> Vec<IpAddr> {
        set.iter().filter(|ip| Family::of(ip) == f).collect()
    };
    let cluster_ips = family_ips(&svc.cluster_ips);
    let lb_ips = family_ips(&svc.load_balancer_ips);
    let mut external_ips = family_ips(&svc.external_ips);
    external_ips.extend(lb_ips.iter().copied());
    let cidrs: Vec<Cidr> = cluster_cidrs
        .iter()
        .filter(|c| Family::of(&c.addr) == f)
        .copied()
        .collect();
    let source_ranges: Vec<Cidr> = svc
        .load_balancer_source_ranges
        .iter()
        .filter_map(|r| r.parse::<Cidr>().ok())
        .filter(|c| Family::of(&c.addr) == f)
        .collect();
    for pm in &svc.ports {
        let id = port_id(svc, &pm.name, pm.protocol, pm.port);
        let targets: Vec<Target<'_>> = endpoints
            .iter()
            .filter(|ep| Family::of(&ep.ip) == f)
            .filter_map(|ep| {
                let p = ep
                    .ports
                    .iter()
                    .find(|p| p.name == pm.name && p.protocol == pm.protocol)?;
                Some(Target {
                    ep,
                    port: p.port,
                    scopes: p.scopes,
                })
            })
            .collect();
        let proto = pm.protocol.ip_number();
        // nft's parser does not take ':' in names; IPv6 addresses are
        // written with '-' instead.
        let aff_set = |t: &Target<'_>| {
            format!(
                "aff-{id}/{}/{}",
                t.ep.ip.to_string().replace(':', "-"),
                t.port
            )
        };
        let internal: Vec<&Target<'_>> = targets.iter().filter(|t| t.scopes.internal).collect();
        let external: Vec<&Target<'_>> = targets.iter().filter(|t| t.scopes.external).collect();
        let exposed = !external_ips.is_empty() || pm.node_port != 0;

        // The endpoint choice: affinity first, then a random pick, one
        // rule per endpoint.
        let pick = |chosen: &[&Target<'_>], out: &mut ServiceObjects| -> Vec<Rule> {
            let mut rules = Vec::new();
            let affinity = svc.session_affinity_timeout;
            let dnat = |t: &Target<'_>| Stmt::Dnat(t.ep.ip, t.port);
            if let Some(timeout) = affinity {
                for t in chosen {
                    let set = aff_set(t);
                    out.sets.insert(set.clone(), timeout);
                    rules.push(Rule::new(
                        vec![Match::SaddrIn(set.clone()), Match::L4Proto(proto)],
                        vec![Stmt::UpdateSaddr(set), dnat(t)],
                    ));
                }
            }
            let n = chosen.len();
            for (i, t) in chosen.iter().enumerate() {
                let mut matches = Vec::new();
                if n - i > 1 {
                    matches.push(Match::OneIn((n - i) as u32));
                }
                matches.push(Match::L4Proto(proto));
                let mut stmts = Vec::new();
                if affinity.is_some() {
                    stmts.push(Stmt::UpdateSaddr(aff_set(t)));
                }
                stmts.push(dnat(t));
                rules.push(Rule::new(matches, stmts));
                out.hairpin.insert(t.ep.ip);
            }
            rules
        };

        let svc_chain = format!("svc-{id}");
        let key_of = |ip: &IpAddr| {
            vec![
                KeyPart::Addr(*ip),
                KeyPart::Proto(proto),
                KeyPart::Port(pm.port),
            ]
        };
        if internal.is_empty() {
            for ip in &cluster_ips {
                out.elements.insert(
                    (NO_ENDPOINT_SERVICES, key_of(ip)),
                    Verdict::Goto(REJECT_CHAIN.to_owned()),
                );
            }
        } else if !cluster_ips.is_empty() {
            let mut rules = Vec::new();
            // Traffic from outside the pod network gets the node's
            // address, so replies come back through this node.
            if masquerade_all {
                rules.push(Rule::new(vec![], vec![jump(MARK_FOR_MASQUERADE)]));
            }
            for c in cidrs.iter().filter(|_| !masquerade_all) {
                rules.push(Rule::new(
                    vec![addr_match(Field::Saddr, true, *c)],
                    vec![jump(MARK_FOR_MASQUERADE)],
                ));
            }
            rules.extend(pick(&internal, &mut out));
            out.chains.insert(svc_chain.clone(), rules);
            for ip in &cluster_ips {
                out.elements
                    .insert((SERVICE_IPS, key_of(ip)), Verdict::Goto(svc_chain.clone()));
            }
        }

        if !exposed {
            continue;
        }
        let node_port_key = vec![KeyPart::Proto(proto), KeyPart::Port(pm.node_port)];
        if external.is_empty() {
            // SPEC §8.6: with eTP=Local and endpoints elsewhere, drop (the
            // load balancer's health check steers traffic away); else reject.
            let verdict = if svc.external_traffic_policy == TrafficPolicy::Local
                && targets.iter().any(|t| t.scopes.cluster)
            {
                Verdict::Drop
            } else {
                Verdict::Goto(REJECT_CHAIN.to_owned())
            };
            for ip in &external_ips {
                out.elements
                    .insert((NO_ENDPOINT_SERVICES, key_of(ip)), verdict.clone());
            }
            if pm.node_port != 0 {
                out.elements
                    .insert((NO_ENDPOINT_NODEPORTS, node_port_key), verdict);
            }
            continue;
        }
        let ext_chain = format!("ext-{id}");
        let mut rules = Vec::new();
        // Only load-balancer IPs are filtered by loadBalancerSourceRanges;
        // node ports and external IPs are not (as kube-proxy).
        if !source_ranges.is_empty() && !lb_ips.is_empty() {
            let fw_chain = format!("fw-{id}");
            let mut fw = Vec::new();
            for range in &source_ranges {
                fw.push(Rule::new(
                    vec![addr_match(Field::Saddr, false, *range)],
                    vec![Stmt::Verdict(Verdict::Return)],
                ));
            }
            fw.push(Rule::new(vec![], vec![Stmt::Verdict(Verdict::Drop)]));
            out.chains.insert(fw_chain.clone(), fw);
            for ip in &lb_ips {
                rules.push(Rule::new(
                    vec![addr_match(Field::Daddr, false, host(*ip))],
                    vec![jump(&fw_chain)],
                ));
            }
        }
        if svc.external_traffic_policy == TrafficPolicy::Cluster {
            rules.push(Rule::new(vec![], vec![jump(MARK_FOR_MASQUERADE)]));
        } else if out.chains.contains_key(&svc_chain) {
            // SPEC §8.6 short-circuit: pods and the node itself use the
            // cluster chain even with eTP=Local (the node's own traffic is
            // masqueraded so replies come back through it).
            for c in &cidrs {
                rules.push(Rule::new(
                    vec![addr_match(Field::Saddr, false, *c)],
                    vec![goto(&svc_chain)],
                ));
            }
            rules.push(Rule::new(
                vec![Match::FibLocal(Field::Saddr)],
                vec![jump(MARK_FOR_MASQUERADE)],
            ));
            rules.push(Rule::new(
                vec![Match::FibLocal(Field::Saddr)],
                vec![goto(&svc_chain)],
            ));
        }
        rules.extend(pick(&external, &mut out));
        out.chains.insert(ext_chain.clone(), rules);
        for ip in &external_ips {
            out.elements
                .insert((SERVICE_IPS, key_of(ip)), Verdict::Goto(ext_chain.clone()));
        }
        if pm.node_port != 0 {
            out.elements
                .insert((SERVICE_NODEPORTS, node_port_key), Verdict::Goto(ext_chain));
        }
    }
    out
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::model::IpSet;

    pub(in crate::datapath::nft) fn endpoint(ip: &str, internal: bool) -> LocalEndpoint {
        let scopes = EndpointScopes {
            cluster: true,
            local: internal,
            internal,
            external: true,
        };
        let mut ep = crate::model::testing::endpoint(ip, 8080, scopes);
        ep.node_name = "n1".into();
        ep.local = internal;
        ep
    }

    pub(in crate::datapath::nft) fn web(
        endpoints: Vec<LocalEndpoint>,
        affinity: Option<u32>,
    ) -> ServiceEndpoints {
        let mut se = crate::model::testing::service("default", "web", &["10.96.0.10"])
            .with_endpoints(endpoints);
        se.service.uid = String::new();
        se.service.session_affinity_timeout = affinity;
        se
    }

    fn chain_text(objs: &ServiceObjects, chain: &str) -> Vec<String> {
        objs.chains[chain]
            .iter()
            .map(|r| r.text(Family::V4))
            .collect()
    }

    fn key(ip: &str, port: u16) -> Vec<KeyPart> {
        vec![
            KeyPart::Addr(ip.parse().unwrap()),
            KeyPart::Proto(6),
            KeyPart::Port(port),
        ]
    }

    #[test]
    fn cluster_ip_picks_each_endpoint_with_equal_chance() {
        let se = web(
            vec![
                endpoint("10.244.1.11", true),
                endpoint("10.244.1.12", true),
                endpoint("10.244.1.13", true),
            ],
            None,
        );
        let objs = service_objects(&se, Family::V4, &[], false);
        assert_eq!(
            objs.elements[&(SERVICE_IPS, key("10.96.0.10", 80))],
            Verdict::Goto("svc-default/web/tcp/http".into())
        );
        // 1/3, then 1/2 of the rest, then the rest: 1/3 each.
        assert_eq!(
            chain_text(&objs, "svc-default/web/tcp/http"),
            [
                "numgen random mod 3 0 meta l4proto tcp dnat to 10.244.1.11:8080",
                "numgen random mod 2 0 meta l4proto tcp dnat to 10.244.1.12:8080",
                "meta l4proto tcp dnat to 10.244.1.13:8080",
            ]
        );
        assert_eq!(objs.hairpin.len(), 3);
        assert!(service_objects(&se, Family::V6, &[], false)
            .elements
            .is_empty());
    }

    #[test]
    fn internal_traffic_policy_local_uses_only_the_internal_scope() {
        let se = web(
            vec![
                endpoint("10.244.1.11", true),
                endpoint("10.244.2.12", false),
            ],
            None,
        );
        let objs = service_objects(&se, Family::V4, &[], false);
        assert_eq!(
            chain_text(&objs, "svc-default/web/tcp/http"),
            ["meta l4proto tcp dnat to 10.244.1.11:8080"]
        );
        assert!(!objs.hairpin.contains(&"10.244.2.12".parse().unwrap()));
    }

    #[test]
    fn service_without_endpoints_is_rejected_not_dispatched() {
        let objs = service_objects(&web(vec![], None), Family::V4, &[], false);
        assert!(objs.chains.is_empty());
        assert_eq!(
            objs.elements[&(NO_ENDPOINT_SERVICES, key("10.96.0.10", 80))],
            Verdict::Goto("reject-chain".into())
        );
    }

    #[test]
    fn session_affinity_checks_per_endpoint_sets_before_the_random_pick() {
        let se = web(
            vec![endpoint("10.244.1.11", true), endpoint("10.244.1.12", true)],
            Some(10800),
        );
        let objs = service_objects(&se, Family::V4, &[], false);
        let set = "aff-default/web/tcp/http/10.244.1.11/8080";
        assert_eq!(objs.sets[set], 10800);
        let rules = chain_text(&objs, "svc-default/web/tcp/http");
        assert_eq!(
            rules[0],
            format!("ip saddr @{set} meta l4proto tcp update @{set} {{ ip saddr }} dnat to 10.244.1.11:8080")
        );
        assert_eq!(
            rules[2],
            format!("numgen random mod 2 0 meta l4proto tcp update @{set} {{ ip saddr }} dnat to 10.244.1.11:8080")
        );
        assert_eq!(affinity_set(Family::V4, set, 10800).timeout_ms, 10_800_000);
    }

    #[test]
    fn traffic_from_outside_the_cluster_cidr_is_marked_for_masquerade() {
        let se = web(vec![endpoint("10.244.1.11", true)], None);
        let cidr: Cidr = "10.244.0.0/16".parse().unwrap();
        let objs = service_objects(&se, Family::V4, &[cidr], false);
        assert_eq!(
            chain_text(&objs, "svc-default/web/tcp/http")[0],
            "ip saddr != 10.244.0.0/16 jump mark-for-masquerade"
        );
    }

    #[test]
    fn masquerade_all_marks_every_connection_whatever_the_cluster_cidr() {
        let se = web(vec![endpoint("10.244.1.11", true)], None);
        let cidr: Cidr = "10.244.0.0/16".parse().unwrap();
        let objs = service_objects(&se, Family::V4, &[cidr], true);
        let chain = chain_text(&objs, "svc-default/web/tcp/http");
        assert_eq!(chain[0], "jump mark-for-masquerade");
        assert!(!chain.iter().any(|r| r.contains("saddr")), "{chain:?}");
    }

    #[test]
    fn node_port_goes_through_the_external_chain() {
        let mut se = web(vec![endpoint("10.244.1.11", true)], None);
        se.service.ports[0].node_port = 30080;
        let objs = service_objects(&se, Family::V4, &[], false);
        assert_eq!(
            objs.elements[&(
                SERVICE_NODEPORTS,
                vec![KeyPart::Proto(6), KeyPart::Port(30080)]
            )],
            Verdict::Goto("ext-default/web/tcp/http".into())
        );
        assert_eq!(
            chain_text(&objs, "ext-default/web/tcp/http"),
            [
                "jump mark-for-masquerade",
                "meta l4proto tcp dnat to 10.244.1.11:8080"
            ]
        );
    }

    #[test]
    fn load_balancer_source_ranges_filter_only_load_balancer_ips() {
        let mut se = web(vec![endpoint("10.244.1.11", true)], None);
        se.service.load_balancer_ips = IpSet::from_ips(&["192.0.2.10".parse().unwrap()]);
        se.service.external_ips = IpSet::from_ips(&["192.0.2.20".parse().unwrap()]);
        se.service.load_balancer_source_ranges = vec!["198.51.100.0/24".into()];
        let objs = service_objects(&se, Family::V4, &[], false);
        assert_eq!(
            chain_text(&objs, "fw-default/web/tcp/http"),
            ["ip saddr 198.51.100.0/24 return", "drop"]
        );
        assert_eq!(
            chain_text(&objs, "ext-default/web/tcp/http")[0],
            "ip daddr 192.0.2.10 jump fw-default/web/tcp/http"
        );
        for ip in ["192.0.2.10", "192.0.2.20"] {
            assert_eq!(
                objs.elements[&(SERVICE_IPS, key(ip, 80))],
                Verdict::Goto("ext-default/web/tcp/http".into())
            );
        }
    }

    #[test]
    fn external_traffic_policy_local_short_circuits_pods_and_the_node() {
        let mut se = web(vec![endpoint("10.244.1.11", true)], None);
        se.service.ports[0].node_port = 30080;
        se.service.external_traffic_policy = TrafficPolicy::Local;
        let cidr: Cidr = "10.244.0.0/16".parse().unwrap();
        let objs = service_objects(&se, Family::V4, &[cidr], false);
        assert_eq!(
            chain_text(&objs, "ext-default/web/tcp/http"),
            [
                "ip saddr 10.244.0.0/16 goto svc-default/web/tcp/http",
                "fib saddr type local jump mark-for-masquerade",
                "fib saddr type local goto svc-default/web/tcp/http",
                "meta l4proto tcp dnat to 10.244.1.11:8080",
            ]
        );
    }

    #[test]
    fn external_traffic_policy_local_without_local_endpoints_drops_node_port_traffic() {
        let mut se = web(vec![endpoint("10.244.2.12", true)], None);
        se.service.ports[0].node_port = 30080;
        se.service.external_traffic_policy = TrafficPolicy::Local;
        se.endpoints[0].ports[0].scopes.external = false;
        let objs = service_objects(&se, Family::V4, &[], false);
        assert_eq!(
            objs.elements[&(
                NO_ENDPOINT_NODEPORTS,
                vec![KeyPart::Proto(6), KeyPart::Port(30080)]
            )],
            Verdict::Drop
        );
    }

    #[test]
    fn nodeport_addresses_narrow_the_node_port_dispatch() {
        let text = |f: Family, cidrs: &[Cidr]| -> Vec<String> {
            base_rules(f, cidrs)
                .into_iter()
                .filter(|(chain, _)| *chain == "services")
                .map(|(_, r)| r.text(f))
                .collect()
        };
        assert_eq!(
            text(Family::V4, &[])[1],
            "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports"
        );
        let cidrs: Vec<Cidr> = vec!["192.168.100.0/24".parse().unwrap()];
        assert_eq!(
            text(Family::V4, &cidrs)[1],
            "fib daddr type local ip daddr != 127.0.0.0/8 ip daddr 192.168.100.0/24 meta l4proto . th dport vmap @service-nodeports"
        );
        // Only IPv4 CIDRs given: no IPv6 node ports.
        assert_eq!(text(Family::V6, &cidrs).len(), 1);
    }

    #[test]
    fn ipv6_names_avoid_colons() {
        let mut se = web(vec![endpoint("fd00:10:244::11", true)], Some(60));
        se.service.cluster_ips = IpSet::from_ips(&["fd00:10:96::10".parse().unwrap()]);
        let objs = service_objects(&se, Family::V6, &[], false);
        assert!(objs
            .sets
            .contains_key("aff-default/web/tcp/http/fd00-10-244--11/8080"));
        assert_eq!(
            objs.chains["svc-default/web/tcp/http"][1].text(Family::V6),
            "meta l4proto tcp update @aff-default/web/tcp/http/fd00-10-244--11/8080 { ip6 saddr } dnat to [fd00:10:244::11]:8080"
        );
    }

    #[test]
    fn object_names_decode_to_their_service() {
        assert_eq!(
            service_of("aff-default/web/tcp/http/10.244.1.11/8080").as_deref(),
            Some("default/web")
        );
        assert_eq!(service_of("services"), None);
    }
}
