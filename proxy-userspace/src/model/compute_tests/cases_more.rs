//! The endpoint-selection cases continued: families, topology, hint
//! synthesis, local ready counts, and the LocalService / LocalEndpoint
//! fields (the first part is in `cases.rs`; `mod.rs` runs both).

use super::*;

pub(super) fn cases() -> Vec<Case> {
    vec![
        // -- families --
        case(
            "dual_stack_topology_decided_per_family",
            vec![dual_stack()],
            vec![
                slice("web-v4", "web")
                    .eps(vec![ep("10.1.0.1").hz(&["a"]), ep("10.1.0.2").hz(&["b"])]),
                slice("web-v6", "web")
                    .v6()
                    .eps(vec![ep("fd00:1::1").hz(&["b"]), ep("fd00:1::2")]),
            ],
            vec![Eps(
                "web",
                &[
                    "10.1.0.1 /TCP=8080:C-IE",
                    "10.1.0.2 /TCP=8080:----",
                    "fd00:1::1 /TCP=8080:C-IE",
                    "fd00:1::2 /TCP=8080:C-IE",
                ],
            )],
        ),
        case(
            "v6_endpoints_of_v4_only_service_get_no_scopes",
            vec![svc("web")],
            vec![
                slice("web-v4", "web").eps(vec![ep("10.1.0.1")]),
                slice("web-v6", "web")
                    .v6()
                    .eps(vec![ep("fd00:1::1").on("n1")]),
            ],
            vec![
                Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-IE", "fd00:1::1 /TCP=8080:----"],
                ),
                LocalReady("web", 0, 1),
            ],
        ),
        case(
            "v4_endpoints_of_v6_only_service_get_no_scopes",
            vec![svc("web").ips(&["fd00:96::1"])],
            vec![
                slice("web-v4", "web").eps(vec![ep("10.1.0.1")]),
                slice("web-v6", "web").v6().eps(vec![ep("fd00:1::1")]),
            ],
            vec![Eps(
                "web",
                &["10.1.0.1 /TCP=8080:----", "fd00:1::1 /TCP=8080:C-IE"],
            )],
        ),
        // -- §8.4 topology --
        case(
            "topology_looks_at_ready_endpoints_only",
            vec![svc("web")],
            vec![slice("web-a", "web").eps(vec![
                ep("10.1.0.1").hz(&["a"]),
                ep("10.1.0.2").not_ready(),
                ep("10.1.0.3").hz(&["b"]),
            ])],
            vec![Eps(
                "web",
                &[
                    "10.1.0.1 /TCP=8080:C-IE",
                    "10.1.0.2 /TCP=8080:----",
                    "10.1.0.3 /TCP=8080:----",
                ],
            )],
        ),
        case(
            "endpoint_hinted_for_several_zones_matches_any",
            vec![svc("web")],
            vec![slice("web-a", "web").eps(vec![
                ep("10.1.0.1").hz(&["b", "a"]),
                ep("10.1.0.2").hz(&["b"]),
            ])],
            vec![Eps(
                "web",
                &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:----"],
            )],
        ),
        case(
            "node_hints_without_this_node_fall_through_to_zone",
            vec![svc("web")],
            vec![slice("web-a", "web").eps(vec![
                ep("10.1.0.1").hn(&["n3"]).hz(&["a"]),
                ep("10.1.0.2").hn(&["n2"]).hz(&["b"]),
            ])],
            vec![Eps(
                "web",
                &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:----"],
            )],
        ),
        case(
            "partly_node_hinted_falls_through_to_zone",
            vec![svc("web")],
            vec![slice("web-a", "web").eps(vec![
                ep("10.1.0.1").hn(&["n1"]).hz(&["a"]),
                ep("10.1.0.2").hz(&["a"]),
                ep("10.1.0.3").hn(&["n2"]).hz(&["b"]),
            ])],
            vec![Eps(
                "web",
                &[
                    "10.1.0.1 /TCP=8080:C-IE",
                    "10.1.0.2 /TCP=8080:C-IE",
                    "10.1.0.3 /TCP=8080:----",
                ],
            )],
        ),
        case(
            "node_without_zone_label_never_prefers_zone",
            vec![svc("web")],
            vec![slice("web-a", "web")
                .eps(vec![ep("10.1.0.1").hz(&["a"]), ep("10.1.0.2").hz(&["b"])])],
            vec![Eps(
                "web",
                &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:C-IE"],
            )],
        )
        .on_node("n9"),
        case(
            "local_set_ignores_topology",
            vec![lb_etp_local()],
            vec![slice("web-a", "web").eps(vec![
                ep("10.1.0.1").on("n1").hz(&["b"]),
                ep("10.1.0.2").on("n3").hz(&["a"]),
            ])],
            vec![Eps(
                "web",
                &["10.1.0.1 /TCP=8080:-L-E", "10.1.0.2 /TCP=8080:C-I-"],
            )],
        ),
        // -- hint synthesis --
        case(
            "hint_synthesis_off_ignores_traffic_distribution",
            vec![svc("web").td("PreferClose")],
            vec![slice("web-a", "web").eps(vec![
                ep("10.1.0.1").on("n3").zone("a"),
                ep("10.1.0.2").on("n2").zone("b"),
            ])],
            vec![
                Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:C-IE"],
                ),
                Check(|s| {
                    assert!(get(s, "web")
                        .endpoints
                        .iter()
                        .all(|e| *e.hints == EndpointHints::default()))
                }),
            ],
        ),
        case(
            "hint_synthesis_on_prefers_same_zone",
            vec![svc("web").td("PreferClose")],
            vec![slice("web-a", "web").eps(vec![
                ep("10.1.0.1").on("n3").zone("a"),
                ep("10.1.0.2").on("n2").zone("b"),
            ])],
            vec![
                Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:----"],
                ),
                Check(|s| {
                    let e = endpoint(s, "web", "10.1.0.2");
                    assert_eq!(e.hints.for_zones, ["b"]);
                    assert!(e.hints.for_nodes.is_empty());
                }),
            ],
        )
        .synth(),
        case(
            "hint_synthesis_skipped_when_any_endpoint_has_hints",
            vec![svc("web").td("PreferSameZone")],
            vec![
                slice("web-a", "web").eps(vec![ep("10.1.0.1").on("n3").zone("a")]),
                slice("web-b", "web").eps(vec![ep("10.1.0.2").on("n2").zone("b").hz(&["b"])]),
            ],
            vec![
                Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:C-IE"],
                ),
                Check(|s| assert!(endpoint(s, "web", "10.1.0.1").hints.for_zones.is_empty())),
            ],
        )
        .synth(),
        case(
            "hint_synthesis_needs_traffic_distribution",
            vec![svc("web")],
            vec![slice("web-a", "web").eps(vec![
                ep("10.1.0.1").on("n3").zone("a"),
                ep("10.1.0.2").on("n2").zone("b"),
            ])],
            vec![Eps(
                "web",
                &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:C-IE"],
            )],
        )
        .synth(),
        case(
            "hint_synthesis_prefer_same_node_adds_node_hints",
            vec![svc("web").td("PreferSameNode")],
            vec![slice("web-a", "web").eps(vec![
                ep("10.1.0.1").on("n1").zone("a"),
                ep("10.1.0.2").on("n3").zone("a"),
                ep("10.1.0.3").on("n2").zone("b"),
            ])],
            vec![
                Eps(
                    "web",
                    &[
                        "10.1.0.1 /TCP=8080:C-IE",
                        "10.1.0.2 /TCP=8080:----",
                        "10.1.0.3 /TCP=8080:----",
                    ],
                ),
                Check(|s| {
                    let e = endpoint(s, "web", "10.1.0.1");
                    assert_eq!(e.hints.for_zones, ["a"]);
                    assert_eq!(e.hints.for_nodes, ["n1"]);
                }),
            ],
        )
        .synth(),
        case(
            "hint_synthesis_prefer_same_node_falls_back_to_zone",
            vec![svc("web").td("PreferSameNode")],
            vec![slice("web-a", "web").eps(vec![
                ep("10.1.0.2").on("n3").zone("a"),
                ep("10.1.0.3").on("n2").zone("b"),
            ])],
            vec![Eps(
                "web",
                &["10.1.0.2 /TCP=8080:C-IE", "10.1.0.3 /TCP=8080:----"],
            )],
        )
        .synth(),
        case(
            "hint_synthesis_skips_endpoints_without_zone",
            vec![svc("web").td("PreferClose")],
            vec![slice("web-a", "web").eps(vec![
                ep("10.1.0.1").on("n3").zone("a"),
                ep("10.1.0.2").on("n2"),
            ])],
            vec![
                Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:C-IE"],
                ),
                Check(|s| {
                    assert_eq!(
                        *endpoint(s, "web", "10.1.0.2").hints,
                        EndpointHints::default()
                    )
                }),
            ],
        )
        .synth(),
        // -- local ready counts --
        case(
            "local_ready_counts_distinct_ips_and_excludes_terminating",
            vec![two_ports().ips(&["10.96.0.1", "fd00:96::1"])],
            vec![
                two_port_slice("web-v4").eps(vec![
                    ep("10.1.0.1").on("n1"),
                    ep("10.1.0.2").on("n1").st(),
                    ep("10.1.0.3").on("n1").ready(true).term(true),
                    ep("10.1.0.4").on("n2"),
                    ep("10.1.0.5").on("n1"),
                ]),
                two_port_slice("web-v6")
                    .v6()
                    .eps(vec![ep("fd00:1::1").on("n1")]),
            ],
            vec![LocalReady("web", 2, 1)],
        ),
        // -- LocalService / LocalEndpoint fields and ordering --
        case(
            "session_affinity_timeout_carried",
            vec![
                svc("default-timeout").affinity(DEFAULT_AFFINITY_TIMEOUT_SECONDS),
                svc("short").affinity(60),
                svc("none"),
            ],
            vec![],
            vec![Check(|s| {
                assert_eq!(
                    get(s, "default-timeout").service.session_affinity_timeout,
                    Some(10800)
                );
                assert_eq!(get(s, "short").service.session_affinity_timeout, Some(60));
                assert_eq!(get(s, "none").service.session_affinity_timeout, None);
            })],
        ),
        case(
            "service_fields_mapped",
            vec![svc("web")
                .kind(ServiceType::LoadBalancer)
                .ips(&["fd00:96::1", "10.96.0.1"])
                .ext_ip("198.51.100.2")
                .ext_ip("198.51.100.1")
                .ext_ip("198.51.100.2")
                .lb("192.0.2.10")
                .label("app", "web")
                .td("PreferClose")
                .with(|s| {
                    s.health_check_node_port = 32000;
                    s.load_balancer_source_ranges = vec![
                        "10.0.0.0/8".into(),
                        "192.168.0.0/16".into(),
                        "10.0.0.0/8".into(),
                    ];
                    s.ports[0].app_protocol = Some("http".into());
                    s.ports[0].node_port = 30080;
                })],
            vec![],
            vec![Check(|s| {
                let svc = &get(s, "web").service;
                assert_eq!(svc.uid, "uid-web");
                assert_eq!(svc.service_type, LocalServiceType::LoadBalancer);
                assert_eq!(svc.labels.get("app").map(ArcStr::as_str), Some("web"));
                assert_eq!(
                    svc.cluster_ips
                        .iter()
                        .map(|a| a.to_string())
                        .collect::<Vec<_>>(),
                    ["10.96.0.1", "fd00:96::1"]
                );
                assert_eq!(
                    svc.external_ips
                        .iter()
                        .map(|a| a.to_string())
                        .collect::<Vec<_>>(),
                    ["198.51.100.1", "198.51.100.2"]
                );
                assert_eq!(
                    svc.load_balancer_source_ranges,
                    ["10.0.0.0/8", "192.168.0.0/16"]
                );
                assert_eq!(svc.health_check_node_port, 32000);
                assert_eq!(svc.traffic_distribution, "PreferClose");
                assert_eq!(svc.internal_traffic_policy, TrafficPolicy::Cluster);
                let p = &svc.ports[0];
                assert_eq!(
                    (p.port, p.node_port, p.app_protocol.as_str()),
                    (80, 30080, "http")
                );
            })],
        ),
        case(
            "service_types_mapped_and_defaults_empty",
            vec![svc("cip"), svc("np").kind(ServiceType::NodePort)],
            vec![],
            vec![Check(|s| {
                assert_eq!(
                    get(s, "cip").service.service_type,
                    LocalServiceType::ClusterIp
                );
                assert_eq!(
                    get(s, "np").service.service_type,
                    LocalServiceType::NodePort
                );
                let cip = &get(s, "cip").service;
                assert_eq!(
                    (
                        cip.traffic_distribution.as_str(),
                        cip.ports[0].app_protocol.as_str()
                    ),
                    ("", "")
                );
            })],
        ),
        case(
            "endpoint_metadata_copied_and_missing_strings_empty",
            vec![svc("web")],
            vec![slice("web-a", "web").eps(vec![
                ep("10.1.0.1")
                    .on("n2")
                    .zone("b")
                    .host("pod-1")
                    .hz(&["b"])
                    .with(|e| {
                        e.target_ref = Some(TargetRef::new(
                            "Pod".into(),
                            NS.into(),
                            "pod-1",
                            crate::model::Uid::new("u1"),
                        ))
                    }),
                ep("10.1.0.2"),
            ])],
            vec![Check(|s| {
                let e = endpoint(s, "web", "10.1.0.1");
                assert_eq!(
                    (e.hostname.as_str(), e.node_name.as_str(), e.zone.as_str()),
                    ("pod-1", "n2", "b")
                );
                assert_eq!(e.hints.for_zones, ["b"]);
                assert_eq!(e.target_ref.as_ref().map(TargetRef::name), Some("pod-1"));
                let e = endpoint(s, "web", "10.1.0.2");
                assert_eq!(
                    (e.hostname.as_str(), e.node_name.as_str(), e.zone.as_str()),
                    ("", "", "")
                );
                assert_eq!(e.target_ref, None);
            })],
        ),
        case(
            "services_sorted_by_namespace_then_name",
            vec![
                svc("a").ns("b"),
                svc("z").ns("a"),
                svc("b").ns("a"),
                svc("web"),
            ],
            vec![],
            vec![Svcs(&["a/b", "a/z", "b/a", "ns/web"])],
        ),
        case(
            "endpoints_sorted_v4_before_v6_numerically",
            vec![dual_stack()],
            vec![
                slice("web-v6", "web")
                    .v6()
                    .eps(vec![ep("fd00:1::10"), ep("fd00:1::9")]),
                slice("web-v4", "web").eps(vec![ep("10.1.0.10"), ep("10.1.0.9"), ep("9.1.0.1")]),
            ],
            vec![Eps(
                "web",
                &[
                    "9.1.0.1 /TCP=8080:C-IE",
                    "10.1.0.9 /TCP=8080:C-IE",
                    "10.1.0.10 /TCP=8080:C-IE",
                    "fd00:1::9 /TCP=8080:C-IE",
                    "fd00:1::10 /TCP=8080:C-IE",
                ],
            )],
        ),
        case(
            "ports_sorted_by_name_then_protocol",
            vec![svc("web").ports(vec![sp("z", Tcp, 1), sp("a", Udp, 2), sp("a", Tcp, 3)])],
            vec![slice("web-a", "web")
                .ports(vec![
                    esp("a", Udp, 12),
                    esp("z", Tcp, 11),
                    esp("a", Tcp, 13),
                ])
                .eps(vec![ep("10.1.0.1")])],
            vec![
                Eps(
                    "web",
                    &["10.1.0.1 a/TCP=13:C-IE a/UDP=12:C-IE z/TCP=11:C-IE"],
                ),
                Check(|s| {
                    let ports: Vec<u16> =
                        get(s, "web").service.ports.iter().map(|p| p.port).collect();
                    assert_eq!(ports, [3, 2, 1]);
                }),
            ],
        ),
    ]
}
