//! One service's objects: its chains, affinity sets, map elements,
//! endpoint counts and hairpin addresses, from its [`ServiceEndpoints`].

use super::*;

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

/// The `addr . port` of `chosen`, in their order (by address).
fn slot_targets(chosen: &[&Target<'_>]) -> std::sync::Arc<[SlotTarget]> {
    chosen.iter().map(|t| (t.ep.ip, t.port)).collect()
}

/// The endpoints `targets` for frontend `key` (`daddr . l4proto . dport`
/// or `l4proto . dport`) in the maps of the internal or the external
/// scope: its count, its endpoints by slot.
fn frontend_endpoints(
    out: &mut ServiceObjects,
    pick_chain: &str,
    key: &[KeyPart],
    targets: &std::sync::Arc<[SlotTarget]>,
) {
    let by = if key.len() == 3 {
        FrontendKey::Service
    } else {
        FrontendKey::NodePort
    };
    let Some((_, _, counts, endpoints)) = PICKS.iter().find(|p| p.0 == pick_chain && p.1 == by)
    else {
        return;
    };
    let count = targets.len() as u32;
    out.counts.insert(count);
    out.elements.insert(
        (counts, key.to_vec()),
        ElementValue::Data(vec![KeyPart::Mark(count)]),
    );
    // A list another frontend has added its addresses already.
    let added = out
        .slots
        .iter()
        .any(|l| std::sync::Arc::ptr_eq(&l.targets, targets));
    out.slots.push(SlotList {
        map: endpoints,
        frontend: key.to_vec(),
        targets: targets.clone(),
    });
    if !added && out.hairpin.is_empty() {
        // In address order: built in one pass.
        out.hairpin = targets.iter().map(|t| t.0).collect();
    } else if !added {
        out.hairpin.extend(targets.iter().map(|t| t.0));
    }
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
        // Built once per scope, shared by its frontends' slot lists.
        let (internal_slots, external_slots) = (slot_targets(&internal), slot_targets(&external));
        let exposed = !external_ips.is_empty() || pm.node_port != 0;

        // With ClientIP affinity: the affinity rules, then a random pick,
        // one rule per endpoint.
        let affinity_pick = |timeout: u32, chosen: &[&Target<'_>], out: &mut ServiceObjects| {
            let mut rules = Vec::new();
            let dnat = |t: &Target<'_>| Stmt::Dnat(t.ep.ip, t.port);
            for t in chosen {
                let set = aff_set(t);
                out.sets.insert(set.clone(), timeout);
                rules.push(Rule::new(
                    vec![Match::SaddrIn(set.clone()), Match::L4Proto(proto)],
                    vec![Stmt::UpdateSaddr(set), dnat(t)],
                ));
            }
            let n = chosen.len();
            for (i, t) in chosen.iter().enumerate() {
                let mut matches = Vec::new();
                if n - i > 1 {
                    matches.push(Match::OneIn((n - i) as u32));
                }
                matches.push(Match::L4Proto(proto));
                rules.push(Rule::new(
                    matches,
                    vec![Stmt::UpdateSaddr(aff_set(t)), dnat(t)],
                ));
                out.hairpin.insert(t.ep.ip);
            }
            rules
        };
        let affinity = svc.session_affinity_timeout;

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
                    ElementValue::Verdict(Verdict::Goto(REJECT_CHAIN.to_owned())),
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
            match affinity {
                Some(timeout) => rules.extend(affinity_pick(timeout, &internal, &mut out)),
                None => {
                    for ip in &cluster_ips {
                        frontend_endpoints(&mut out, PICK_INTERNAL, &key_of(ip), &internal_slots);
                    }
                    rules.push(Rule::new(vec![], vec![goto(PICK_INTERNAL)]));
                }
            }
            out.chains.insert(svc_chain.clone(), rules);
            for ip in &cluster_ips {
                out.elements.insert(
                    (SERVICE_IPS, key_of(ip)),
                    ElementValue::Verdict(Verdict::Goto(svc_chain.clone())),
                );
            }
        }

        if !exposed {
            continue;
        }
        let node_port_key = vec![KeyPart::Proto(proto), KeyPart::Port(pm.node_port)];
        if external.is_empty() {
            // SPEC §8.6: with eTP=Local and endpoints elsewhere, drop (the
            // load balancer's health check steers traffic away); else reject.
            let local_policy = svc.external_traffic_policy == TrafficPolicy::Local
                && targets.iter().any(|t| t.scopes.cluster);
            let verdict = if local_policy {
                Verdict::Drop
            } else {
                Verdict::Goto(REJECT_CHAIN.to_owned())
            };
            for ip in &external_ips {
                out.elements.insert(
                    (NO_ENDPOINT_SERVICES, key_of(ip)),
                    ElementValue::Verdict(verdict.clone()),
                );
            }
            if pm.node_port != 0 {
                out.elements.insert(
                    (NO_ENDPOINT_NODEPORTS, node_port_key.clone()),
                    ElementValue::Verdict(verdict),
                );
            }
            // Pods and the node itself still short-circuit to the cluster
            // endpoints (the external chain below, without a pick: what
            // arrives from outside leaves it un-NATed and meets the drop,
            // which for node ports is consulted from the input hook only).
            if !(local_policy && out.chains.contains_key(&svc_chain)) {
                continue;
            }
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
            // masqueraded so replies come back through it). Its pick finds
            // the internal endpoints by the external address or node port.
            if affinity.is_none() {
                for ip in &external_ips {
                    frontend_endpoints(&mut out, PICK_INTERNAL, &key_of(ip), &internal_slots);
                }
                if pm.node_port != 0 {
                    frontend_endpoints(&mut out, PICK_INTERNAL, &node_port_key, &internal_slots);
                }
            }
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
        match affinity {
            _ if external.is_empty() => {}
            Some(timeout) => rules.extend(affinity_pick(timeout, &external, &mut out)),
            None => {
                for ip in &external_ips {
                    frontend_endpoints(&mut out, PICK_EXTERNAL, &key_of(ip), &external_slots);
                }
                if pm.node_port != 0 {
                    frontend_endpoints(&mut out, PICK_EXTERNAL, &node_port_key, &external_slots);
                }
                rules.push(Rule::new(vec![], vec![goto(PICK_EXTERNAL)]));
            }
        }
        out.chains.insert(ext_chain.clone(), rules);
        for ip in &external_ips {
            out.elements.insert(
                (SERVICE_IPS, key_of(ip)),
                ElementValue::Verdict(Verdict::Goto(ext_chain.clone())),
            );
        }
        if pm.node_port != 0 {
            out.elements.insert(
                (SERVICE_NODEPORTS, node_port_key),
                ElementValue::Verdict(Verdict::Goto(ext_chain)),
            );
        }
    }
    out
}

#[cfg(test)]
pub(in crate::datapath::nft) mod tests {
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
        se.service.uid = Default::default();
        se.service.session_affinity_timeout = affinity;
        se
    }

    use service_objects as objects;

    fn goto(chain: &str) -> ElementValue {
        ElementValue::Verdict(Verdict::Goto(chain.into()))
    }

    /// The endpoints of `frontend` in `endpoints`, by slot, as `addr .
    /// port`, after checking their count in `counts`.
    fn endpoints_of(
        objs: &ServiceObjects,
        (counts, endpoints): (&str, &str),
        frontend: &[KeyPart],
    ) -> Vec<String> {
        let count = objs.elements[&(
            PICKS.iter().find(|p| p.2 == counts).unwrap().2,
            frontend.to_vec(),
        )]
            .to_string();
        let list: Vec<String> = objs
            .slots
            .iter()
            .flat_map(SlotList::elements)
            .filter(|((map, key), _)| *map == endpoints && key.starts_with(frontend))
            .map(|(_, v)| v.to_string())
            .collect();
        assert_eq!(count, list.len().to_string());
        list
    }

    const INTERNAL: (&str, &str) = (INTERNAL_COUNTS, INTERNAL_ENDPOINTS);
    const INTERNAL_NP: (&str, &str) = (INTERNAL_NODEPORT_COUNTS, INTERNAL_NODEPORT_ENDPOINTS);
    const EXTERNAL: (&str, &str) = (EXTERNAL_COUNTS, EXTERNAL_ENDPOINTS);
    const EXTERNAL_NP: (&str, &str) = (EXTERNAL_NODEPORT_COUNTS, EXTERNAL_NODEPORT_ENDPOINTS);

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
    fn cluster_ip_traffic_picks_from_the_frontends_endpoints() {
        let se = web(
            vec![
                endpoint("10.244.1.11", true),
                endpoint("10.244.1.12", true),
                endpoint("10.244.1.13", true),
            ],
            None,
        );
        let objs = objects(&se, Family::V4, &[], false);
        assert_eq!(
            objs.elements[&(SERVICE_IPS, key("10.96.0.10", 80))],
            goto("svc-default/web/tcp/http")
        );
        // The chain does not name the endpoints: the maps do.
        assert_eq!(
            chain_text(&objs, "svc-default/web/tcp/http"),
            ["goto pick-internal"]
        );
        assert_eq!(
            endpoints_of(&objs, INTERNAL, &key("10.96.0.10", 80)),
            [
                "10.244.1.11 . 8080",
                "10.244.1.12 . 8080",
                "10.244.1.13 . 8080"
            ]
        );
        assert_eq!(objs.hairpin.len(), 3);
        assert!(objects(&se, Family::V6, &[], false).elements.is_empty());
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
        let objs = objects(&se, Family::V4, &[], false);
        assert_eq!(
            endpoints_of(&objs, INTERNAL, &key("10.96.0.10", 80)),
            ["10.244.1.11 . 8080"]
        );
        assert!(!objs.hairpin.contains(&"10.244.2.12".parse().unwrap()));
    }

    #[test]
    fn service_without_endpoints_is_rejected_not_dispatched() {
        let objs = objects(&web(vec![], None), Family::V4, &[], false);
        assert!(objs.chains.is_empty() && objs.counts.is_empty());
        assert_eq!(
            objs.elements[&(NO_ENDPOINT_SERVICES, key("10.96.0.10", 80))],
            goto("reject-chain")
        );
    }

    #[test]
    fn session_affinity_checks_per_endpoint_sets_before_the_random_pick() {
        let se = web(
            vec![endpoint("10.244.1.11", true), endpoint("10.244.1.12", true)],
            Some(10800),
        );
        let objs = objects(&se, Family::V4, &[], false);
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
        // 1/2, then the rest: 1/2 each.
        assert_eq!(
            rules[3],
            "meta l4proto tcp update @aff-default/web/tcp/http/10.244.1.12/8080 { ip saddr } dnat to 10.244.1.12:8080"
        );
        assert!(objs.counts.is_empty());
        assert_eq!(affinity_set(Family::V4, set, 10800).timeout_ms, 10_800_000);
    }

    #[test]
    fn traffic_from_outside_the_cluster_cidr_is_marked_for_masquerade() {
        let se = web(vec![endpoint("10.244.1.11", true)], None);
        let cidr: Cidr = "10.244.0.0/16".parse().unwrap();
        let objs = objects(&se, Family::V4, &[cidr], false);
        assert_eq!(
            chain_text(&objs, "svc-default/web/tcp/http")[0],
            "ip saddr != 10.244.0.0/16 jump mark-for-masquerade"
        );
    }

    #[test]
    fn masquerade_all_marks_every_connection_whatever_the_cluster_cidr() {
        let se = web(vec![endpoint("10.244.1.11", true)], None);
        let cidr: Cidr = "10.244.0.0/16".parse().unwrap();
        let objs = objects(&se, Family::V4, &[cidr], true);
        let chain = chain_text(&objs, "svc-default/web/tcp/http");
        assert_eq!(chain[0], "jump mark-for-masquerade");
        assert!(!chain.iter().any(|r| r.contains("saddr")), "{chain:?}");
    }

    #[test]
    fn node_port_goes_through_the_external_chain() {
        let mut se = web(vec![endpoint("10.244.1.11", true)], None);
        se.service.ports[0].node_port = 30080;
        let objs = objects(&se, Family::V4, &[], false);
        let node_port = vec![KeyPart::Proto(6), KeyPart::Port(30080)];
        assert_eq!(
            objs.elements[&(SERVICE_NODEPORTS, node_port.clone())],
            goto("ext-default/web/tcp/http")
        );
        assert_eq!(
            chain_text(&objs, "ext-default/web/tcp/http"),
            ["jump mark-for-masquerade", "goto pick-external"]
        );
        assert_eq!(
            endpoints_of(&objs, EXTERNAL_NP, &node_port),
            ["10.244.1.11 . 8080"]
        );
        // eTP=Cluster: no short-circuit, nothing internal for the node port.
        assert!(!objs
            .elements
            .contains_key(&(INTERNAL_NODEPORT_COUNTS, node_port)));
    }

    #[test]
    fn load_balancer_source_ranges_filter_only_load_balancer_ips() {
        let mut se = web(vec![endpoint("10.244.1.11", true)], None);
        se.service.load_balancer_ips = IpSet::from_ips(&["192.0.2.10".parse().unwrap()]);
        se.service.external_ips = IpSet::from_ips(&["192.0.2.20".parse().unwrap()]);
        se.service.load_balancer_source_ranges = vec!["198.51.100.0/24".into()];
        let objs = objects(&se, Family::V4, &[], false);
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
                goto("ext-default/web/tcp/http")
            );
            assert_eq!(
                endpoints_of(&objs, EXTERNAL, &key(ip, 80)),
                ["10.244.1.11 . 8080"]
            );
        }
    }

    #[test]
    fn external_traffic_policy_local_short_circuits_pods_and_the_node() {
        let mut se = web(
            vec![endpoint("10.244.1.11", true), endpoint("10.244.2.12", true)],
            None,
        );
        // On another node: not for outside traffic with eTP=Local.
        se.endpoints[1]
            .ports
            .modify(|p| p[0].scopes.external = false);
        se.service.ports[0].node_port = 30080;
        se.service.external_traffic_policy = TrafficPolicy::Local;
        let cidr: Cidr = "10.244.0.0/16".parse().unwrap();
        let objs = objects(&se, Family::V4, &[cidr], false);
        assert_eq!(
            chain_text(&objs, "ext-default/web/tcp/http"),
            [
                "ip saddr 10.244.0.0/16 goto svc-default/web/tcp/http",
                "fib saddr type local jump mark-for-masquerade",
                "fib saddr type local goto svc-default/web/tcp/http",
                "goto pick-external",
            ]
        );
        // The short-circuit's pick finds both endpoints by node port;
        // outside traffic only the local one.
        let node_port = vec![KeyPart::Proto(6), KeyPart::Port(30080)];
        assert_eq!(
            endpoints_of(&objs, INTERNAL_NP, &node_port),
            ["10.244.1.11 . 8080", "10.244.2.12 . 8080"]
        );
        assert_eq!(
            endpoints_of(&objs, EXTERNAL_NP, &node_port),
            ["10.244.1.11 . 8080"]
        );
        assert_eq!(objs.counts, BTreeSet::from([1, 2]));
    }

    #[test]
    fn external_traffic_policy_local_without_local_endpoints_drops_node_port_traffic() {
        let mut se = web(vec![endpoint("10.244.2.12", true)], None);
        se.service.ports[0].node_port = 30080;
        se.service.external_traffic_policy = TrafficPolicy::Local;
        se.endpoints[0]
            .ports
            .modify(|p| p[0].scopes.external = false);
        let objs = objects(&se, Family::V4, &[], false);
        assert_eq!(
            objs.elements[&(
                NO_ENDPOINT_NODEPORTS,
                vec![KeyPart::Proto(6), KeyPart::Port(30080)]
            )],
            ElementValue::Verdict(Verdict::Drop)
        );
        // The node and pods short-circuit to the remote endpoint; what
        // comes from outside falls through the chain un-NATed.
        assert_eq!(
            chain_text(&objs, "ext-default/web/tcp/http"),
            [
                "fib saddr type local jump mark-for-masquerade",
                "fib saddr type local goto svc-default/web/tcp/http",
            ]
        );
        let node_port = vec![KeyPart::Proto(6), KeyPart::Port(30080)];
        assert_eq!(
            objs.elements[&(SERVICE_NODEPORTS, node_port.clone())],
            goto("ext-default/web/tcp/http")
        );
        assert_eq!(
            endpoints_of(&objs, INTERNAL_NP, &node_port),
            ["10.244.2.12 . 8080"]
        );
        assert!(!objs
            .elements
            .keys()
            .any(|(map, _)| *map == EXTERNAL_NODEPORT_COUNTS));
        assert_eq!(objs.counts, BTreeSet::from([1]));
    }

    #[test]
    fn nodeport_addresses_narrow_the_node_port_dispatch() {
        let text = |f: Family, cidrs: &[Cidr]| -> Vec<String> {
            base_rules(f, cidrs, true)
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
        let objs = objects(&se, Family::V6, &[], false);
        assert!(objs
            .sets
            .contains_key("aff-default/web/tcp/http/fd00-10-244--11/8080"));
        assert_eq!(
            objs.chains["svc-default/web/tcp/http"][1].text(Family::V6),
            "meta l4proto tcp update @aff-default/web/tcp/http/fd00-10-244--11/8080 { ip6 saddr } dnat to [fd00:10:244::11]:8080"
        );
    }

    #[test]
    fn pick_chains_have_address_rules_before_node_port_rules() {
        let rules: Vec<(&str, String)> = pick_rules(&pick_counts([3]))
            .into_iter()
            .map(|(c, r)| (c, r.text(Family::V4)))
            .collect();
        let internal: Vec<&str> = rules
            .iter()
            .filter(|(c, _)| *c == PICK_INTERNAL)
            .map(|(_, r)| r.as_str())
            .collect();
        assert_eq!(internal.len(), 6);
        assert!(
            internal[..3].iter().all(|r| r.starts_with("ip daddr")),
            "{internal:?}"
        );
        assert!(internal[1].contains("numgen random mod 3"), "{internal:?}");
        assert!(
            internal[5].starts_with("meta l4proto . th dport map @internal-nodeport-counts"),
            "{internal:?}"
        );
        assert_eq!(pick_counts([1, 5]), BTreeSet::from([1, 2, 4, 5, 6]));
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
