//! The nftables datapath against the real kernel, each test in a fresh
//! network namespace of its own (root and `nft` needed): what the kernel
//! holds after full and partial syncs, restarts, refusals and the UDP
//! conntrack cleanup.

use std::collections::BTreeMap;
use std::sync::Arc;

use ebpf_kube_proxy::apply::{Applied, Applier};
use ebpf_kube_proxy::datapath::nft::batch::{Batch, Family};
use ebpf_kube_proxy::datapath::nft::expr::{self, Verdict};
use ebpf_kube_proxy::datapath::nft::rules::{self, TABLE};
use ebpf_kube_proxy::datapath::nft::{self, NftDatapath};
use ebpf_kube_proxy::datapath::{Datapath, DatapathError, ServiceChange};
use ebpf_kube_proxy::model::claims::Claims;
use ebpf_kube_proxy::model::testing;
use ebpf_kube_proxy::model::{EndpointScopes, LocalEndpoint, LocalState, ServiceEndpoints};
use ebpf_kube_proxy::net::Cidr;

mod common;
use common::netns::in_private_netns;

/// `default/web` (10.96.0.10, port http 80 → 8080) with `endpoints` and
/// ClientIP affinity for `affinity` seconds.
fn web(endpoints: Vec<LocalEndpoint>, affinity: Option<u32>) -> ServiceEndpoints {
    let mut se = testing::service("default", "web", &["10.96.0.10"]).with_endpoints(endpoints);
    se.service.uid = Default::default();
    se.service.session_affinity_timeout = affinity;
    se
}

/// A ready endpoint on 8080; `internal`: on this node (n1), so usable
/// for cluster-IP traffic with internalTrafficPolicy Local.
fn endpoint(ip: &str, internal: bool) -> LocalEndpoint {
    let mut ep = testing::endpoint(
        ip,
        8080,
        EndpointScopes {
            cluster: true,
            local: internal,
            internal,
            external: true,
        },
    );
    ep.node_name = "n1".into();
    ep.local = internal;
    ep
}

/// A fresh datapath (a restarted daemon) programming `next`.
trait ProgramOnce {
    fn program(self, next: &LocalState) -> Result<Applied, DatapathError>;
}

impl ProgramOnce for NftDatapath {
    fn program(self, next: &LocalState) -> Result<Applied, DatapathError> {
        Applier::new(Box::new(self)).apply(&Arc::new(next.clone()))
    }
}

fn listing() -> String {
    nft::nft_output(&["list", "table", "ip", rules::TABLE])
        .unwrap()
        .unwrap_or_default()
}

#[test]
fn syncs_replace_then_update_only_what_changed_and_recover_after_a_failure() {
    in_private_netns(|| {
        let two = LocalState::new([web(
            vec![endpoint("10.244.1.11", true), endpoint("10.244.1.12", true)],
            Some(30),
        )]);
        let one = LocalState::new([web(vec![endpoint("10.244.1.11", true)], Some(30))]);
        let mut dp = Applier::new(Box::new(NftDatapath::open(Vec::new()).unwrap()));
        dp.apply(&Arc::new(two.clone())).unwrap();
        let entries = dp.datapath().map_entries();
        assert!(entries.contains(&("service-ips", 1)), "{entries:?}");
        assert!(entries.contains(&("hairpin", 2)), "{entries:?}");
        assert!(
            entries.contains(&("no-endpoint-services", 0)),
            "{entries:?}"
        );
        let text = listing();
        assert!(
            text.contains("10.96.0.10 . tcp . 80 : goto svc-default/web/tcp/http"),
            "{text}"
        );
        assert!(text.contains("dnat to 10.244.1.12:8080"), "{text}");
        assert!(text.contains("numgen random mod 2"), "{text}");

        // One endpoint goes: its chain and affinity set go with it.
        assert_eq!(
            dp.apply(&Arc::new(one.clone()))
                .unwrap()
                .stats
                .services_changed,
            1
        );
        let text = listing();
        assert!(!text.contains("10.244.1.12"), "{text}");
        assert!(text.contains("dnat to 10.244.1.11:8080"), "{text}");

        // Someone deletes the table: the partial sync is rejected with
        // the reason, the next one rebuilds everything.
        nft::nft_output(&["delete", "table", "ip", rules::TABLE]).unwrap();
        let err = dp.apply(&Arc::new(two.clone())).unwrap_err().to_string();
        assert!(
            err.contains("nf_tables rejected the transaction (ip)")
                && err.contains("No such file or directory"),
            "{err}"
        );
        dp.apply(&Arc::new(two.clone())).unwrap();
        assert!(listing().contains("dnat to 10.244.1.12:8080"));

        // No endpoints: rejected early, not dispatched.
        let none = LocalState::new([web(vec![], None)]);
        dp.apply(&Arc::new(none.clone())).unwrap();
        let text = listing();
        assert!(
            text.contains("10.96.0.10 . tcp . 80 : goto reject-chain"),
            "{text}"
        );
        assert!(!text.contains("svc-default/web"), "{text}");

        // A restarted daemon refills the table in place and drops what
        // the state no longer has.
        NftDatapath::open(Vec::new())
            .unwrap()
            .program(&two)
            .unwrap();
        NftDatapath::open(Vec::new())
            .unwrap()
            .with_note("proxy-mode auto fell back to nftables: no BTF".into())
            .program(&one)
            .unwrap();
        let text = listing();
        assert!(text.contains("dnat to 10.244.1.11:8080"), "{text}");
        assert!(!text.contains("10.244.1.12"), "{text}");
        assert!(!text.contains("reject-chain\n"), "{text}");

        let dump = nft::dump_text().unwrap();
        assert!(
            dump.starts_with("table ip ebpf-kube-proxy\ndatapath: proxy-mode auto fell back to nftables: no BTF\n"),
            "{dump}"
        );
        assert!(
            dump.contains("service default/web\n  service-ips: 10.96.0.10 . tcp . 80 -> svc-default/web/tcp/http"),
            "{dump}"
        );
        assert!(
            dump.contains("  chain svc-default/web/tcp/http\n    ip saddr @aff-default/web/tcp/http/10.244.1.11/8080 meta l4proto tcp update"),
            "{dump}"
        );

        assert_eq!(nft::cleanup().unwrap(), ["ip", "ip6"]);
        assert!(!nft::is_programmed());
    });
}

/// Every rule as the kernel holds it, printed by `nft`, reads exactly
/// like our own text for it: the netlink encoding means what the text
/// says.
#[test]
fn the_kernel_holds_the_rules_we_wrote() {
    in_private_netns(|| {
        let mut v4 = web(
            vec![
                endpoint("10.244.1.11", true),
                endpoint("10.244.2.12", false),
            ],
            Some(60),
        );
        v4.service.ports[0].node_port = 30080;
        v4.service.external_traffic_policy = ebpf_kube_proxy::model::TrafficPolicy::Local;
        v4.service.load_balancer_ips =
            ebpf_kube_proxy::model::IpSet::from_ips(&["192.0.2.10".parse().unwrap()]);
        v4.service.load_balancer_source_ranges = vec!["198.51.100.0/24".into()];
        let mut v6 = web(vec![endpoint("fd00:10:244::11", true)], None);
        v6.service.key.name = "web6".into();
        v6.service.cluster_ips =
            ebpf_kube_proxy::model::IpSet::from_ips(&["fd00:10:96::10".parse().unwrap()]);
        v6.endpoints[0]
            .ports
            .modify(|p| p[0].protocol = ebpf_kube_proxy::model::Protocol::Udp);
        v6.service.ports[0].protocol = ebpf_kube_proxy::model::Protocol::Udp;
        let state = LocalState::new([v4, v6]);
        let cidrs: Vec<Cidr> = vec!["10.244.0.0/16".parse().unwrap()];
        let nodeport_addresses: Vec<Cidr> = vec!["192.168.100.0/24".parse().unwrap()];
        let dp = NftDatapath::open(cidrs.clone())
            .unwrap()
            .with_nodeport_addresses(nodeport_addresses.clone());
        dp.program(&state).unwrap();
        for f in Family::ALL {
            let listing = nft::nft_output(&["list", "table", f.nft(), TABLE])
                .unwrap()
                .unwrap();
            let held: BTreeMap<String, Vec<String>> =
                nft::chains_of_listing(&listing).into_iter().collect();
            let mut expected: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (chain, rule) in rules::base_rules(f, &nodeport_addresses, true) {
                expected
                    .entry(chain.to_owned())
                    .or_default()
                    .push(rule.text(f));
            }
            let mut counts = Vec::new();
            for se in &state.services {
                let objs = rules::service_objects(se, f, &cidrs, false);
                for (chain, rs) in objs.chains {
                    expected.insert(chain, rs.iter().map(|r| r.text(f)).collect());
                }
                counts.extend(objs.counts);
            }
            for (chain, rule) in rules::pick_rules(&rules::pick_counts(counts)) {
                expected
                    .entry(chain.to_owned())
                    .or_default()
                    .push(rule.text(f));
            }
            let held_nonempty: BTreeMap<String, Vec<String>> =
                held.into_iter().filter(|(_, r)| !r.is_empty()).collect();
            assert_eq!(held_nonempty, expected, "{listing}");
        }
        let v4_listing = listing();
        for text in [
            "10.96.0.10 . tcp . 80 : goto svc-default/web/tcp/http",
            "192.0.2.10 . tcp . 80 : goto ext-default/web/tcp/http",
            "tcp . 30080 : goto ext-default/web/tcp/http",
            "10.244.1.11 . 10.244.1.11",
            "timeout 1m",
        ] {
            assert!(v4_listing.contains(text), "{text} missing: {v4_listing}");
        }
        nft::cleanup().unwrap();
    });
}

/// A restarted daemon keeps the affinity entries of sets that still
/// apply, and a transaction the kernel refuses names its failing part.
#[test]
fn affinity_survives_a_restart_and_a_refusal_names_the_command() {
    in_private_netns(|| {
        let state = LocalState::new([web(vec![endpoint("10.244.1.11", true)], Some(600))]);
        NftDatapath::open(Vec::new())
            .unwrap()
            .program(&state)
            .unwrap();
        let set = "aff-default/web/tcp/http/10.244.1.11/8080";
        nft::nft_output(&["add", "element", "ip", TABLE, set, "{ 10.0.0.7 }"])
            .unwrap()
            .unwrap();
        NftDatapath::open(Vec::new())
            .unwrap()
            .program(&state)
            .unwrap();
        let text = nft::nft_output(&["list", "set", "ip", TABLE, set])
            .unwrap()
            .unwrap();
        assert!(text.contains("10.0.0.7"), "{text}");

        let mut b = Batch::new();
        let f = Family::V4;
        let bad = expr::Rule::new(
            vec![],
            vec![expr::Stmt::Verdict(Verdict::Jump("no-such-chain".into()))],
        );
        b.add_rule(f.nfproto_u8(), TABLE, "services", &bad.encode(f), || {
            bad.text(f)
        });
        let err = nft::commit(f, b).unwrap_err().to_string();
        assert!(
            err.contains("add rule services jump no-such-chain"),
            "{err}"
        );
        nft::cleanup().unwrap();
    });
}

/// A table left by something else, with a `hairpin` of another type,
/// is re-created rather than failing every sync.
#[test]
fn an_incompatible_leftover_table_is_recreated() {
    in_private_netns(|| {
        for cmd in [
            vec!["add", "table", "ip", TABLE],
            vec!["add", "set", "ip", TABLE, "hairpin", "{ type ipv4_addr ; }"],
            vec!["add", "chain", "ip", TABLE, "stale-chain"],
        ] {
            nft::nft_output(&cmd).unwrap().unwrap();
        }
        let state = LocalState::new([web(vec![endpoint("10.244.1.11", true)], None)]);
        NftDatapath::open(Vec::new())
            .unwrap()
            .program(&state)
            .unwrap();
        let text = listing();
        assert!(
            text.contains("10.96.0.10 . tcp . 80 . 0x00000000 : 10.244.1.11 . 8080"),
            "{text}"
        );
        assert!(!text.contains("stale-chain"), "{text}");
        assert!(text.contains("type ipv4_addr . ipv4_addr"), "{text}");
        nft::cleanup().unwrap();
    });
}

/// UDP entries to a removed endpoint go over ctnetlink, the others
/// stay; at start-up, entries not reaching a current endpoint go.
#[test]
fn udp_conntrack_entries_of_gone_endpoints_are_deleted() {
    if std::process::Command::new("conntrack")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: needs the conntrack tool to create entries");
        return;
    }
    in_private_netns(|| {
        let udp = |eps: Vec<ebpf_kube_proxy::model::LocalEndpoint>| {
            let mut se = web(eps, None);
            se.service.ports[0].protocol = ebpf_kube_proxy::model::Protocol::Udp;
            for ep in &mut se.endpoints {
                ep.ports
                    .modify(|p| p[0].protocol = ebpf_kube_proxy::model::Protocol::Udp);
            }
            LocalState::new([se])
        };
        let two = udp(vec![
            endpoint("10.244.1.11", true),
            endpoint("10.244.1.12", true),
        ]);
        let one = udp(vec![endpoint("10.244.1.11", true)]);
        let mut dp = Applier::new(Box::new(NftDatapath::open(Vec::new()).unwrap()));
        dp.apply(&Arc::new(two.clone())).unwrap();
        let insert = |client: &str, sport: &str, backend: &str| {
            let out = std::process::Command::new("conntrack")
                .args([
                    "-I",
                    "-p",
                    "udp",
                    "-s",
                    client,
                    "-d",
                    "10.96.0.10",
                    "--sport",
                    sport,
                    "--dport",
                    "80",
                    "--reply-src",
                    backend,
                    "--reply-dst",
                    client,
                    "--reply-port-src",
                    "8080",
                    "--reply-port-dst",
                    sport,
                    "-t",
                    "100",
                ])
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
        };
        let backends = || -> Vec<String> {
            let mut v: Vec<String> = nft::conntrack::ct::list(nft::nlsock::NFPROTO_IPV4, 17)
                .unwrap()
                .iter()
                .map(|e| e.reply.src.to_string())
                .collect();
            v.sort();
            v
        };
        insert("10.244.2.5", "40000", "10.244.1.12");
        insert("10.244.2.6", "40001", "10.244.1.11");
        assert_eq!(backends(), ["10.244.1.11", "10.244.1.12"]);
        dp.apply(&Arc::new(one.clone())).unwrap();
        assert_eq!(backends(), ["10.244.1.11"]);

        // A restart finds an entry that was never NATed (no rules at
        // the time): it goes, the good one stays.
        insert("10.244.2.7", "40002", "10.96.0.10");
        NftDatapath::open(Vec::new())
            .unwrap()
            .program(&one)
            .unwrap();
        assert_eq!(backends(), ["10.244.1.11"]);
        nft::cleanup().unwrap();
    });
}

/// `services` services `ns/svc-<i>` (10.96.x.y:80), each with five
/// endpoints; service 7 has `svc7` of them.
fn many(services: usize, svc7: usize) -> LocalState {
    // Sorted by key, as every state is (the datapath looks services up).
    LocalState::new((0..services).map(|i| {
        let n = if i == 7 { svc7 } else { 5 };
        let vip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
        let mut se = testing::service("ns", &format!("svc-{i}"), &[&vip]).with_endpoints(
            (0..n).map(|j| endpoint(&format!("10.{}.{}.{}", 100 + i / 250, i % 250, j + 1), true)),
        );
        se.service.uid = Default::default();
        se
    }))
}

/// The elements of map `name` in the IPv4 table, as `nft -j` prints
/// them: (key parts, value).
fn json_elements(name: &str) -> Vec<(serde_json::Value, serde_json::Value)> {
    let text = nft::nft_output(&["-j", "list", "map", "ip", TABLE, name])
        .unwrap()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    doc["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o.get("map"))
        .flat_map(|m| m["elem"].as_array().cloned().unwrap_or_default())
        .map(|e| (e[0]["concat"].clone(), e[1].clone()))
        .collect()
}

/// `dp` programs service 7's change from `prev` to `next` (a partial
/// sync).
fn change_svc7(dp: &mut NftDatapath, prev: &LocalState, next: &LocalState) {
    let svc7 = next
        .services
        .iter()
        .find(|s| s.service.key.name == "svc-7")
        .expect("service 7");
    let changed = [ServiceChange {
        key: &svc7.service.key,
        next: Some(svc7),
    }];
    dp.program_changes(prev, next, &changed, &Claims::of(next))
        .unwrap();
}

/// A count or a slot from `nft -j`, which prints the host-order bytes of
/// a `mark` as a big-endian number.
fn mark(v: &serde_json::Value) -> u32 {
    u32::from_ne_bytes((v.as_u64().unwrap() as u32).to_be_bytes())
}

/// The endpoints the kernel holds for 10.96.0.8:80 (service 7), by slot.
fn endpoints_of_svc7() -> Vec<String> {
    let mut v: Vec<(u32, String)> = json_elements(rules::INTERNAL_ENDPOINTS)
        .into_iter()
        .filter(|(k, _)| k[0] == "10.96.0.8")
        .map(|(k, v)| (mark(&k[3]), v["concat"].to_string()))
        .collect();
    v.sort();
    v.into_iter().map(|(_, e)| e).collect()
}

/// Removing and re-adding one endpoint of a service without affinity
/// sends the same few element messages at 300 services as at 3,000 (no
/// rule, no chain, no verdict element: nothing that makes the kernel
/// validate the whole table), and the kernel then holds the service's
/// endpoints.
#[test]
fn one_endpoint_change_is_map_elements_only_whatever_the_service_count() {
    in_private_netns(|| {
        let mut sizes = Vec::new();
        for services in [300, 3000] {
            let (full, one_less) = (many(services, 5), many(services, 4));
            let mut dp = NftDatapath::open(Vec::new()).unwrap();
            dp.program_all(&full, &Claims::of(&full)).unwrap();
            let mut size = Vec::new();
            for (prev, next) in [(&full, &one_less), (&one_less, &full)] {
                change_svc7(&mut dp, prev, next);
                let (n, commands) = dp.last_transaction(Family::V4).unwrap().clone();
                for c in &commands {
                    let map = c
                        .strip_prefix("add element ")
                        .or_else(|| c.strip_prefix("delete element "))
                        .and_then(|rest| rest.split(' ').next());
                    assert!(
                        matches!(
                            map,
                            Some(
                                rules::INTERNAL_COUNTS | rules::INTERNAL_ENDPOINTS | rules::HAIRPIN
                            )
                        ),
                        "{commands:#?}"
                    );
                }
                size.push(n);
                if next == &one_less {
                    assert_eq!(
                        endpoints_of_svc7(),
                        [
                            r#"["10.100.7.1",8080]"#,
                            r#"["10.100.7.2",8080]"#,
                            r#"["10.100.7.3",8080]"#,
                            r#"["10.100.7.4",8080]"#
                        ]
                    );
                    let count: Vec<u32> = json_elements(rules::INTERNAL_COUNTS)
                        .into_iter()
                        .filter(|(k, _)| k[0] == "10.96.0.8")
                        .map(|(_, v)| mark(&v))
                        .collect();
                    assert_eq!(count, [4]);
                }
            }
            assert_eq!(endpoints_of_svc7().len(), 5);
            sizes.push(size);
            nft::cleanup().unwrap();
        }
        assert_eq!(sizes[0], sizes[1], "commands at 300 and 3,000 services");
        // Count out and in, endpoint out; hairpin element out.
        assert!(sizes[0][0] <= 4, "{sizes:?}");
    });
}

/// A change of most services (every pod rotated, a tenth of the services
/// deleted) refills the table in one transaction instead of deleting and
/// adding most of it, and the kernel then holds exactly the new state.
#[test]
fn a_change_of_most_services_refills_the_table_with_the_new_state() {
    in_private_netns(|| {
        let services = 5000;
        let prev = many(services, 5);
        let mut dp = NftDatapath::open(Vec::new()).unwrap();
        dp.program_all(&prev, &Claims::of(&prev)).unwrap();
        // Endpoints from 10.200.0.0 on instead of 10.100.0.0; services
        // 4500.. gone.
        let next = LocalState::new(prev.services.iter().take(4500).map(|se| {
            let mut se = ServiceEndpoints::clone(se);
            for ep in &mut se.endpoints {
                let [a, b, c, d] = match ep.ip {
                    std::net::IpAddr::V4(v4) => v4.octets(),
                    other => panic!("{other}"),
                };
                ep.ip = std::net::Ipv4Addr::new(a, b + 100, c, d).into();
            }
            se
        }));
        let changed: Vec<ServiceChange<'_>> = prev
            .services
            .iter()
            .map(|se| ServiceChange {
                key: &se.service.key,
                next: next.service(&se.service.key),
            })
            .collect();
        let claims = Claims::of(&next);
        dp.program_changes(&prev, &next, &changed, &claims).unwrap();
        let (_, commands) = dp.last_transaction(Family::V4).unwrap().clone();
        assert!(
            commands[0].starts_with("add table"),
            "not a refill: {:#?}",
            &commands[..5]
        );
        let endpoints = json_elements(rules::INTERNAL_ENDPOINTS);
        assert_eq!(endpoints.len(), 4500 * 5);
        let old: Vec<_> = endpoints
            .iter()
            .filter(|(_, v)| v["concat"][0].as_str().unwrap_or("").starts_with("10.1"))
            .take(3)
            .collect();
        assert!(old.is_empty(), "endpoints of the old state: {old:?}");
        let drifts = dp.verify(&next, &claims).unwrap();
        assert!(drifts.is_empty(), "{:?}", &drifts[..drifts.len().min(3)]);
        nft::cleanup().unwrap();
    });
}

/// A table written by the earlier layout (endpoints as DNAT rules in the
/// service chains) is refilled in one transaction: the service chain
/// then picks from the maps, and no rule of the earlier layout is left.
#[test]
fn a_table_of_the_earlier_layout_is_refilled_in_place() {
    in_private_netns(|| {
        let chain = "svc-default/web/tcp/http";
        for cmd in [
            vec!["add", "table", "ip", TABLE],
            vec![
                "add",
                "map",
                "ip",
                TABLE,
                "service-ips",
                "{ type ipv4_addr . inet_proto . inet_service : verdict ; }",
            ],
            vec!["add", "chain", "ip", TABLE, chain],
            vec![
                "add",
                "rule",
                "ip",
                TABLE,
                chain,
                "numgen random mod 2 0 meta l4proto tcp dnat to 10.244.1.11:8080",
            ],
            vec![
                "add",
                "rule",
                "ip",
                TABLE,
                chain,
                "meta l4proto tcp dnat to 10.244.1.12:8080",
            ],
            vec![
                "add",
                "element",
                "ip",
                TABLE,
                "service-ips",
                "{ 10.96.0.10 . tcp . 80 : goto svc-default/web/tcp/http }",
            ],
        ] {
            nft::nft_output(&cmd).unwrap().unwrap();
        }
        let state = LocalState::new([web(
            vec![endpoint("10.244.1.11", true), endpoint("10.244.1.12", true)],
            None,
        )]);
        NftDatapath::open(Vec::new())
            .unwrap()
            .program(&state)
            .unwrap();
        let text = listing();
        let chains: BTreeMap<String, Vec<String>> =
            nft::chains_of_listing(&text).into_iter().collect();
        assert_eq!(chains[chain], ["goto pick-internal"], "{text}");
        assert!(!text.contains("dnat to 10.244.1.1"), "{text}");
        assert!(
            text.contains("10.96.0.10 . tcp . 80 . 0x00000001 : 10.244.1.12 . 8080"),
            "{text}"
        );
        let dump = nft::dump_text().unwrap();
        assert!(
            dump.contains("service default/web\n  service-ips: 10.96.0.10 . tcp . 80 -> svc-default/web/tcp/http\n  internal-endpoints: 10.96.0.10 . tcp . 80 -> 10.244.1.11 . 8080, 10.244.1.12 . 8080\n"),
            "{dump}"
        );
        nft::cleanup().unwrap();
    });
}

/// A service that grows to an endpoint count the pick chains have no
/// rule for gets the rules in the same transaction as its endpoints, and
/// the table then reads as programmed (no drift).
#[test]
fn a_new_endpoint_count_gets_its_pick_rules_in_the_same_transaction() {
    in_private_netns(|| {
        let (one, eight) = (many(10, 1), many(10, 8));
        let mut dp = NftDatapath::open(Vec::new()).unwrap();
        dp.program_all(&one, &Claims::of(&one)).unwrap();
        assert!(!listing().contains("numgen random mod 8"));
        change_svc7(&mut dp, &one, &eight);
        let (_, commands) = dp.last_transaction(Family::V4).unwrap();
        assert!(
            commands.contains(&"flush chain pick-internal".to_owned()),
            "{commands:#?}"
        );
        assert!(listing().contains("numgen random mod 8"));
        assert_eq!(endpoints_of_svc7().len(), 8);
        assert_eq!(
            nft::drift::verify(&dp, &eight, &Claims::of(&eight)).unwrap(),
            vec![]
        );
        nft::cleanup().unwrap();
    });
}

/// Two services claim 10.96.0.10:80; the older (`default/a`) owns it.
/// The loser's endpoint change must not touch the owner's element (what
/// the loser had is rebuilt without the address it did not own), and
/// when the owner goes, the loser takes the address over; the table
/// reads as programmed (no drift) after each step.
#[test]
fn a_loser_of_a_contested_address_changes_without_touching_the_owner() {
    in_private_netns(|| {
        let svc = |name: &str, eps: &[&str]| {
            let mut se = testing::service("default", name, &["10.96.0.10"])
                .with_endpoints(eps.iter().map(|ip| endpoint(ip, true)));
            se.service.uid = Default::default();
            se
        };
        let both = LocalState::new([
            svc("a", &["10.244.1.11"]),
            svc("b", &["10.244.2.11", "10.244.2.12"]),
        ]);
        let b_changed = LocalState::new([svc("a", &["10.244.1.11"]), svc("b", &["10.244.2.11"])]);
        let b_alone = LocalState::new([svc("b", &["10.244.2.11"])]);
        let target = || {
            json_elements(rules::SERVICE_IPS)
                .into_iter()
                .map(|(_, v)| v.to_string())
                .collect::<Vec<_>>()
        };
        let mut dp = Applier::new(Box::new(NftDatapath::open(Vec::new()).unwrap()));
        for (state, full, owner) in [
            (&both, true, "svc-default/a/tcp/http"),
            (&b_changed, false, "svc-default/a/tcp/http"),
            (&b_alone, false, "svc-default/b/tcp/http"),
        ] {
            let applied = dp.apply(&Arc::new(state.clone())).unwrap();
            assert_eq!(applied.full, full);
            let targets = target();
            assert_eq!(targets.len(), 1, "{targets:?}");
            assert!(targets[0].contains(owner), "{targets:?}");
            assert_eq!(dp.verify().unwrap(), vec![]);
        }
        nft::cleanup().unwrap();
    });
}
