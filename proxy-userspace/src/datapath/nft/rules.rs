//! Pure builders: a [`ServiceEndpoints`] in, the nftables objects it needs
//! out (chains with their rules, affinity sets, verdict-map elements), as
//! nft JSON (`nft -j`, schema version 1). No I/O here.
//!
//! Concatenated map keys, verdict maps and `numgen` have no typed form in
//! the `nftables` crate, so the JSON is written out deliberately; the tests
//! below pin the exact shapes `nft` 1.0 accepts.
//!
//! Layout per family (`ip`/`ip6`), table [`TABLE`], like kube-proxy's
//! nftables mode:
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
//!   external and load-balancer IPs, the `external` scope) choose an
//!   endpoint chain with `numgen random mod N`, after the ClientIP
//!   affinity sets; endpoint chains `ep-…` mark hairpin traffic and DNAT;
//! * `nat-postrouting` masquerades what was marked with [`MASQ_MARK`].

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde_json::{json, Value};

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
const MARK_FOR_MASQUERADE: &str = "mark-for-masquerade";
const REJECT_CHAIN: &str = "reject-chain";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    /// The nftables family name.
    pub fn nft(self) -> &'static str {
        match self {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        }
    }

    /// The `ip_family` metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    fn addr_type(self) -> &'static str {
        match self {
            Family::V4 => "ipv4_addr",
            Family::V6 => "ipv6_addr",
        }
    }

    fn of(ip: &IpAddr) -> Family {
        if ip.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }
}

/// Everything one service owns in one family's table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceObjects {
    /// Chain name → its rules (each rule an `expr` array).
    pub chains: BTreeMap<String, Vec<Value>>,
    /// Affinity set name → timeout in seconds.
    pub sets: BTreeMap<String, u32>,
    /// (map, key) → (key JSON, verdict JSON); the string key orders and
    /// identifies an element across syncs.
    pub elements: BTreeMap<(&'static str, String), (Value, Value)>,
}

fn l4(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

fn payload(protocol: &str, field: &str) -> Value {
    json!({"payload": {"protocol": protocol, "field": field}})
}

fn meta(key: &str) -> Value {
    json!({"meta": {"key": key}})
}

fn matches(op: &str, left: Value, right: Value) -> Value {
    json!({"match": {"op": op, "left": left, "right": right}})
}

fn goto(target: &str) -> Value {
    json!({"goto": {"target": target}})
}

fn jump(target: &str) -> Value {
    json!({"jump": {"target": target}})
}

fn saddr(f: Family) -> Value {
    payload(f.nft(), "saddr")
}

fn daddr(f: Family) -> Value {
    payload(f.nft(), "daddr")
}

fn prefix(c: &Cidr) -> Value {
    json!({"prefix": {"addr": c.addr.to_string(), "len": c.prefix_len}})
}

fn fib_daddr_local() -> Value {
    matches(
        "==",
        json!({"fib": {"result": "type", "flags": ["daddr"]}}),
        json!("local"),
    )
}

/// `daddr . l4proto . dport`, the key of `service-ips`.
fn service_ip_key(f: Family) -> Value {
    json!({"concat": [daddr(f), meta("l4proto"), payload("th", "dport")]})
}

fn nodeport_key() -> Value {
    json!({"concat": [meta("l4proto"), payload("th", "dport")]})
}

fn not_loopback(f: Family) -> Value {
    let lo = match f {
        Family::V4 => json!({"prefix": {"addr": "127.0.0.0", "len": 8}}),
        Family::V6 => json!("::1"),
    };
    matches("!=", daddr(f), lo)
}

/// A table object (`{"table": {...}}` and friends) for commands.
pub fn table_obj(f: Family) -> Value {
    json!({"table": {"family": f.nft(), "name": TABLE}})
}

pub fn chain_obj(f: Family, name: &str) -> Value {
    json!({"chain": {"family": f.nft(), "table": TABLE, "name": name}})
}

pub fn rule_obj(f: Family, chain: &str, expr: &Value) -> Value {
    json!({"rule": {"family": f.nft(), "table": TABLE, "chain": chain, "expr": expr}})
}

/// A map to flush: only its name is needed.
pub fn map_ref(f: Family, name: &str) -> Value {
    json!({"map": {"family": f.nft(), "table": TABLE, "name": name}})
}

/// A set to delete: only its name is needed.
pub fn set_ref(f: Family, name: &str) -> Value {
    json!({"set": {"family": f.nft(), "table": TABLE, "name": name}})
}

pub fn set_obj(f: Family, name: &str, timeout: u32) -> Value {
    json!({"set": {"family": f.nft(), "table": TABLE, "name": name,
        "type": f.addr_type(), "flags": ["timeout"], "timeout": timeout}})
}

pub fn element_obj(f: Family, map: &str, elems: Vec<Value>) -> Value {
    json!({"element": {"family": f.nft(), "table": TABLE, "name": map, "elem": elems}})
}

/// The objects created once per table at a full sync: base chains, the
/// shared helper chains and the four verdict maps.
pub fn base_objects(f: Family) -> Vec<Value> {
    let fam = f.nft();
    let base = |name: &str, kind: &str, hook: &str, prio: i32| {
        json!({"chain": {"family": fam, "table": TABLE, "name": name,
            "type": kind, "hook": hook, "prio": prio, "policy": "accept"}})
    };
    let map = |name: &str, key: Value| json!({"map": {"family": fam, "table": TABLE, "name": name, "type": key, "map": "verdict"}});
    let ip_key = json!([f.addr_type(), "inet_proto", "inet_service"]);
    let port_key = json!(["inet_proto", "inet_service"]);
    let mut objs = vec![
        map(SERVICE_IPS, ip_key.clone()),
        map(SERVICE_NODEPORTS, port_key.clone()),
        map(NO_ENDPOINT_SERVICES, ip_key),
        map(NO_ENDPOINT_NODEPORTS, port_key),
        // dstnat priority, as kube-proxy.
        base("nat-prerouting", "nat", "prerouting", -100),
        base("nat-output", "nat", "output", -100),
        base("nat-postrouting", "nat", "postrouting", 100),
        // Before the usual filter chains (priority 0), so a connection to
        // a service without endpoints is refused whatever else is there.
        base("filter-input", "filter", "input", -110),
        base("filter-forward", "filter", "forward", -110),
        base("filter-output", "filter", "output", -110),
        chain_obj(f, "services"),
        chain_obj(f, "endpoints-check"),
        chain_obj(f, "masquerading"),
        chain_obj(f, MARK_FOR_MASQUERADE),
        chain_obj(f, REJECT_CHAIN),
    ];
    let mark = meta("mark");
    let mut rule = |chain: &str, expr: Value| objs.push(rule_obj(f, chain, &expr));
    rule("nat-prerouting", json!([jump("services")]));
    rule("nat-output", json!([jump("services")]));
    rule("nat-postrouting", json!([jump("masquerading")]));
    let ct_new = matches("in", json!({"ct": {"key": "state"}}), json!("new"));
    for chain in ["filter-input", "filter-forward", "filter-output"] {
        rule(chain, json!([ct_new, jump("endpoints-check")]));
    }
    rule(
        "services",
        json!([{"vmap": {"key": service_ip_key(f), "data": format!("@{SERVICE_IPS}")}}]),
    );
    rule(
        "services",
        json!([fib_daddr_local(), not_loopback(f),
            {"vmap": {"key": nodeport_key(), "data": format!("@{SERVICE_NODEPORTS}")}}]),
    );
    rule(
        "endpoints-check",
        json!([{"vmap": {"key": service_ip_key(f), "data": format!("@{NO_ENDPOINT_SERVICES}")}}]),
    );
    rule(
        "endpoints-check",
        json!([fib_daddr_local(), not_loopback(f),
            {"vmap": {"key": nodeport_key(), "data": format!("@{NO_ENDPOINT_NODEPORTS}")}}]),
    );
    rule(
        "masquerading",
        json!([matches("==", json!({"&": [mark, MASQ_MARK]}), json!(0)), {"return": null}]),
    );
    // Clear the mark so a packet that leaves and comes back (hairpin through
    // another hop) is not masqueraded twice.
    rule(
        "masquerading",
        json!([{"mangle": {"key": mark, "value": {"^": [mark, MASQ_MARK]}}}, {"masquerade": null}]),
    );
    rule(
        MARK_FOR_MASQUERADE,
        json!([{"mangle": {"key": mark, "value": {"|": [mark, MASQ_MARK]}}}]),
    );
    rule(
        REJECT_CHAIN,
        json!([matches("==", meta("l4proto"), json!("tcp")), {"reject": {"type": "tcp reset"}}]),
    );
    rule(REJECT_CHAIN, json!([{"reject": null}]));
    objs
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
    let rest = ["svc-", "ext-", "ep-", "aff-"]
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
pub fn service_objects(se: &ServiceEndpoints, f: Family, cluster_cidrs: &[Cidr]) -> ServiceObjects {
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
    let mut external_ips = family_ips(&svc.external_ips);
    external_ips.extend(family_ips(&svc.load_balancer_ips));
    let cidrs: Vec<&Cidr> = cluster_cidrs
        .iter()
        .filter(|c| Family::of(&c.addr) == f)
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
        let proto = l4(pm.protocol);
        let ep_chain = |t: &Target<'_>| match t.ep.ip {
            IpAddr::V4(a) => format!("ep-{id}/{a}:{}", t.port),
            IpAddr::V6(a) => format!("ep-{id}/[{a}]:{}", t.port),
        };
        let aff_set = |t: &Target<'_>| format!("aff-{}", &ep_chain(t)[3..]);
        let internal: Vec<&Target<'_>> = targets.iter().filter(|t| t.scopes.internal).collect();
        let external: Vec<&Target<'_>> = targets.iter().filter(|t| t.scopes.external).collect();
        let exposed = !external_ips.is_empty() || pm.node_port != 0;

        // Endpoint chains for every endpoint some scope uses.
        for t in targets
            .iter()
            .filter(|t| t.scopes.internal || (exposed && t.scopes.external))
        {
            let mut rules = vec![json!([
                matches("==", saddr(f), json!(t.ep.ip.to_string())),
                jump(MARK_FOR_MASQUERADE)
            ])];
            if let Some(timeout) = svc.session_affinity_timeout {
                let set = aff_set(t);
                rules.push(
                    json!([{"set": {"op": "update", "elem": saddr(f), "set": format!("@{set}")}}]),
                );
                out.sets.insert(set, timeout);
            }
            rules.push(json!([
                matches("==", meta("l4proto"), json!(proto)),
                {"dnat": {"addr": t.ep.ip.to_string(), "port": t.port}}
            ]));
            out.chains.insert(ep_chain(t), rules);
        }

        // The endpoint choice: affinity first, then a random pick.
        let pick = |chosen: &[&Target<'_>]| -> Vec<Value> {
            let mut rules = Vec::new();
            if svc.session_affinity_timeout.is_some() {
                for t in chosen {
                    rules.push(json!([
                        matches("==", saddr(f), json!(format!("@{}", aff_set(t)))),
                        goto(&ep_chain(t))
                    ]));
                }
            }
            let arms: Vec<Value> = chosen
                .iter()
                .enumerate()
                .map(|(i, t)| json!([i, goto(&ep_chain(t))]))
                .collect();
            rules.push(json!([{"vmap": {
                "key": {"numgen": {"mode": "random", "mod": chosen.len(), "offset": 0}},
                "data": {"set": arms}
            }}]));
            rules
        };

        let svc_chain = format!("svc-{id}");
        let key_of = |ip: &IpAddr| {
            (
                format!("{ip} . {proto} . {}", pm.port),
                json!({"concat": [ip.to_string(), proto, pm.port]}),
            )
        };
        if internal.is_empty() {
            for ip in &cluster_ips {
                let (k, key) = key_of(ip);
                out.elements
                    .insert((NO_ENDPOINT_SERVICES, k), (key, goto(REJECT_CHAIN)));
            }
        } else if !cluster_ips.is_empty() {
            let mut rules = Vec::new();
            // Traffic from outside the pod network gets the node's
            // address, so replies come back through this node.
            for c in &cidrs {
                rules.push(json!([
                    matches("!=", saddr(f), prefix(c)),
                    jump(MARK_FOR_MASQUERADE)
                ]));
            }
            rules.extend(pick(&internal));
            out.chains.insert(svc_chain.clone(), rules);
            for ip in &cluster_ips {
                let (k, key) = key_of(ip);
                out.elements
                    .insert((SERVICE_IPS, k), (key, goto(&svc_chain)));
            }
        }

        if !exposed {
            continue;
        }
        let ext_chain = format!("ext-{id}");
        if external.is_empty() {
            // SPEC §8.6: with eTP=Local and endpoints elsewhere, drop (the
            // load balancer's health check steers traffic away); else reject.
            let verdict = if svc.external_traffic_policy == TrafficPolicy::Local
                && targets.iter().any(|t| t.scopes.cluster)
            {
                json!({"drop": null})
            } else {
                goto(REJECT_CHAIN)
            };
            for ip in &external_ips {
                let (k, key) = key_of(ip);
                out.elements
                    .insert((NO_ENDPOINT_SERVICES, k), (key, verdict.clone()));
            }
            if pm.node_port != 0 {
                out.elements.insert(
                    (NO_ENDPOINT_NODEPORTS, format!("{proto} . {}", pm.node_port)),
                    (json!({"concat": [proto, pm.node_port]}), verdict),
                );
            }
            continue;
        }
        let mut rules = Vec::new();
        // Only load-balancer IPs are filtered by loadBalancerSourceRanges;
        // node ports and external IPs are not (as kube-proxy).
        if !source_ranges.is_empty() {
            let lb: Vec<String> = family_ips(&svc.load_balancer_ips)
                .iter()
                .map(ToString::to_string)
                .collect();
            let ranges: Vec<Value> = source_ranges.iter().map(prefix).collect();
            if !lb.is_empty() {
                rules.push(json!([
                    matches("==", daddr(f), json!({"set": lb})),
                    matches("!=", saddr(f), json!({"set": ranges})),
                    {"drop": null}
                ]));
            }
        }
        if svc.external_traffic_policy == TrafficPolicy::Cluster {
            rules.push(json!([jump(MARK_FOR_MASQUERADE)]));
        } else if out.chains.contains_key(&svc_chain) {
            // SPEC §8.6 short-circuit: pods and the node itself use the
            // cluster chain even with eTP=Local (the node's own traffic is
            // masqueraded so replies come back through it).
            for c in &cidrs {
                rules.push(json!([
                    matches("==", saddr(f), prefix(c)),
                    goto(&svc_chain)
                ]));
            }
            let fib_saddr_local = matches(
                "==",
                json!({"fib": {"result": "type", "flags": ["saddr"]}}),
                json!("local"),
            );
            rules.push(json!([fib_saddr_local, jump(MARK_FOR_MASQUERADE)]));
            rules.push(json!([fib_saddr_local, goto(&svc_chain)]));
        }
        rules.extend(pick(&external));
        out.chains.insert(ext_chain.clone(), rules);
        for ip in &external_ips {
            let (k, key) = key_of(ip);
            out.elements
                .insert((SERVICE_IPS, k), (key, goto(&ext_chain)));
        }
        if pm.node_port != 0 {
            out.elements.insert(
                (SERVICE_NODEPORTS, format!("{proto} . {}", pm.node_port)),
                (json!({"concat": [proto, pm.node_port]}), goto(&ext_chain)),
            );
        }
    }
    out
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::model::{
        EndpointConditions, EndpointHints, EndpointPort, IpSet, LocalServiceType, ObjectKey,
        PortMapping,
    };

    pub(in crate::datapath::nft) fn endpoint(ip: &str, internal: bool) -> LocalEndpoint {
        LocalEndpoint {
            ip: ip.parse().unwrap(),
            hostname: String::new(),
            node_name: "n1".into(),
            zone: String::new(),
            local: internal,
            conditions: EndpointConditions {
                ready: true,
                serving: true,
                terminating: false,
            },
            hints: EndpointHints::default(),
            ports: vec![EndpointPort {
                name: "http".into(),
                protocol: Protocol::Tcp,
                port: 8080,
                scopes: EndpointScopes {
                    cluster: true,
                    local: internal,
                    internal,
                    external: true,
                },
            }],
            target_ref: None,
        }
    }

    pub(in crate::datapath::nft) fn web(
        endpoints: Vec<LocalEndpoint>,
        affinity: Option<u32>,
    ) -> ServiceEndpoints {
        ServiceEndpoints {
            service: LocalService {
                key: ObjectKey {
                    namespace: "default".into(),
                    name: "web".into(),
                },
                uid: String::new(),
                service_type: LocalServiceType::ClusterIp,
                labels: Default::default(),
                cluster_ips: IpSet::from_ips(&["10.96.0.10".parse().unwrap()]),
                external_ips: IpSet::default(),
                load_balancer_ips: IpSet::default(),
                ports: vec![PortMapping {
                    name: "http".into(),
                    protocol: Protocol::Tcp,
                    port: 80,
                    node_port: 0,
                    target_port: 8080,
                    target_port_name: String::new(),
                    app_protocol: String::new(),
                }],
                internal_traffic_policy: TrafficPolicy::Cluster,
                external_traffic_policy: TrafficPolicy::Cluster,
                session_affinity_timeout: affinity,
                health_check_node_port: 0,
                traffic_distribution: String::new(),
                load_balancer_source_ranges: Vec::new(),
            },
            endpoints,
            local_ready_endpoints_v4: 0,
            local_ready_endpoints_v6: 0,
        }
    }

    #[test]
    fn cluster_ip_dispatches_to_a_random_endpoint_chain() {
        let se = web(
            vec![endpoint("10.244.1.11", true), endpoint("10.244.1.12", true)],
            None,
        );
        let objs = service_objects(&se, Family::V4, &[]);
        let key = (SERVICE_IPS, "10.96.0.10 . tcp . 80".to_owned());
        assert_eq!(
            objs.elements[&key],
            (
                json!({"concat": ["10.96.0.10", "tcp", 80]}),
                json!({"goto": {"target": "svc-default/web/tcp/http"}})
            )
        );
        assert_eq!(
            objs.chains["svc-default/web/tcp/http"],
            vec![json!([{"vmap": {
                "key": {"numgen": {"mode": "random", "mod": 2, "offset": 0}},
                "data": {"set": [
                    [0, {"goto": {"target": "ep-default/web/tcp/http/10.244.1.11:8080"}}],
                    [1, {"goto": {"target": "ep-default/web/tcp/http/10.244.1.12:8080"}}]
                ]}
            }}])]
        );
        assert_eq!(
            objs.chains["ep-default/web/tcp/http/10.244.1.12:8080"][1],
            json!([
                {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}},
                {"dnat": {"addr": "10.244.1.12", "port": 8080}}
            ])
        );
        assert!(service_objects(&se, Family::V6, &[]).elements.is_empty());
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
        let objs = service_objects(&se, Family::V4, &[]);
        let chain = &objs.chains["svc-default/web/tcp/http"];
        assert_eq!(chain.len(), 1);
        assert_eq!(
            chain[0][0]["vmap"]["key"]["numgen"]["mod"],
            json!(1),
            "{chain:?}"
        );
        assert!(!objs
            .chains
            .contains_key("ep-default/web/tcp/http/10.244.2.12:8080"));
    }

    #[test]
    fn service_without_endpoints_is_rejected_not_dispatched() {
        let objs = service_objects(&web(vec![], None), Family::V4, &[]);
        assert!(objs.chains.is_empty());
        let key = (NO_ENDPOINT_SERVICES, "10.96.0.10 . tcp . 80".to_owned());
        assert_eq!(
            objs.elements[&key].1,
            json!({"goto": {"target": "reject-chain"}})
        );
    }

    #[test]
    fn session_affinity_checks_per_endpoint_sets_before_the_random_pick() {
        let se = web(vec![endpoint("10.244.1.11", true)], Some(10800));
        let objs = service_objects(&se, Family::V4, &[]);
        let set = "aff-default/web/tcp/http/10.244.1.11:8080";
        assert_eq!(objs.sets[set], 10800);
        assert_eq!(
            objs.chains["svc-default/web/tcp/http"][0],
            json!([
                {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": format!("@{set}")}},
                {"goto": {"target": "ep-default/web/tcp/http/10.244.1.11:8080"}}
            ])
        );
        assert_eq!(
            objs.chains["ep-default/web/tcp/http/10.244.1.11:8080"][1],
            json!([{"set": {"op": "update", "elem": {"payload": {"protocol": "ip", "field": "saddr"}}, "set": format!("@{set}")}}])
        );
        assert_eq!(
            set_obj(Family::V4, set, 10800),
            json!({"set": {"family": "ip", "table": "ebpf-kube-proxy", "name": set,
                "type": "ipv4_addr", "flags": ["timeout"], "timeout": 10800}})
        );
    }

    #[test]
    fn traffic_from_outside_the_cluster_cidr_is_marked_for_masquerade() {
        let se = web(vec![endpoint("10.244.1.11", true)], None);
        let cidr: Cidr = "10.244.0.0/16".parse().unwrap();
        let objs = service_objects(&se, Family::V4, &[cidr]);
        assert_eq!(
            objs.chains["svc-default/web/tcp/http"][0],
            json!([
                {"match": {"op": "!=", "left": {"payload": {"protocol": "ip", "field": "saddr"}},
                    "right": {"prefix": {"addr": "10.244.0.0", "len": 16}}}},
                {"jump": {"target": "mark-for-masquerade"}}
            ])
        );
    }

    #[test]
    fn node_port_goes_through_the_external_chain() {
        let mut se = web(vec![endpoint("10.244.1.11", true)], None);
        se.service.ports[0].node_port = 30080;
        let objs = service_objects(&se, Family::V4, &[]);
        let key = (SERVICE_NODEPORTS, "tcp . 30080".to_owned());
        assert_eq!(
            objs.elements[&key],
            (
                json!({"concat": ["tcp", 30080]}),
                json!({"goto": {"target": "ext-default/web/tcp/http"}})
            )
        );
        assert_eq!(
            objs.chains["ext-default/web/tcp/http"][0],
            json!([{"jump": {"target": "mark-for-masquerade"}}])
        );
    }

    #[test]
    fn external_traffic_policy_local_without_local_endpoints_drops_node_port_traffic() {
        let mut se = web(vec![endpoint("10.244.2.12", true)], None);
        se.service.ports[0].node_port = 30080;
        se.service.external_traffic_policy = TrafficPolicy::Local;
        se.endpoints[0].ports[0].scopes.external = false;
        let objs = service_objects(&se, Family::V4, &[]);
        let key = (NO_ENDPOINT_NODEPORTS, "tcp . 30080".to_owned());
        assert_eq!(objs.elements[&key].1, json!({"drop": null}));
    }

    #[test]
    fn object_names_decode_to_their_service() {
        assert_eq!(
            service_of("ep-default/web/tcp/http/10.244.1.11:8080").as_deref(),
            Some("default/web")
        );
        assert_eq!(service_of("services"), None);
    }
}
