//! The cases of the endpoint-selection table (SPEC §8.7 worked cases and
//! the rules around them).

use super::*;

// ---- cases ----------------------------------------------------------

pub(super) fn cases() -> Vec<Case> {
    vec![
        // -- SPEC §8.7 worked cases (node n1, zone a) --
        case(
            "row1_cluster_policies_use_every_ready_endpoint",
            vec![svc("web")],
            vec![slice("web-a", "web").eps(vec![ep("10.1.0.1").on("n1"), ep("10.1.0.2").on("n2")])],
            vec![Eps(
                "web",
                &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:C-IE"],
            )],
        ),
        case(
            "row2_itp_local_cluster_ip_only_uses_no_cluster_set",
            vec![svc("web").itp_local()],
            vec![slice("web-a", "web").eps(vec![ep("10.1.0.1").on("n2")])],
            vec![Eps("web", &["10.1.0.1 /TCP=8080:----"])],
        ),
        case(
            "row3_lb_etp_local_external_uses_local_ready",
            vec![lb_etp_local()],
            vec![slice("web-a", "web").eps(vec![ep("10.1.0.1").on("n2"), ep("10.1.0.2").on("n1")])],
            vec![
                Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-I-", "10.1.0.2 /TCP=8080:CLIE"],
                ),
                LocalReady("web", 1, 0),
            ],
        ),
        case(
            "row4_lb_etp_local_falls_back_to_local_terminating",
            vec![lb_etp_local()],
            vec![slice("web-a", "web")
                .eps(vec![ep("10.1.0.1").on("n2"), ep("10.1.0.2").on("n1").st()])],
            vec![
                Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-I-", "10.1.0.2 /TCP=8080:-L-E"],
                ),
                LocalReady("web", 0, 0),
            ],
        ),
        case(
            "row5_cluster_falls_back_to_serving_terminating",
            vec![svc("web")],
            vec![slice("web-a", "web").eps(vec![
                ep("10.1.0.1").on("n2").st(),
                ep("10.1.0.2").on("n2").not_ready(),
            ])],
            vec![Eps(
                "web",
                &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:----"],
            )],
        ),
        case(
            "row6_terminating_but_not_serving_is_never_used",
            vec![svc("web")],
            vec![slice("web-a", "web").eps(vec![ep("10.1.0.1")
                .on("n1")
                .ready(false)
                .serving(false)
                .term(true)])],
            vec![Eps("web", &["10.1.0.1 /TCP=8080:----"])],
        ),
        case(
            "row7_all_zone_hinted_prefers_same_zone",
            vec![svc("web")],
            vec![slice("web-a", "web").eps(vec![
                ep("10.1.0.1").on("n3").hz(&["a"]),
                ep("10.1.0.2").on("n2").hz(&["b"]),
            ])],
            vec![Eps(
                "web",
                &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:----"],
            )],
        ),
        case(
            "row8_partly_zone_hinted_disables_topology",
            vec![svc("web")],
            vec![slice("web-a", "web").eps(vec![
                ep("10.1.0.1").on("n3"),
                ep("10.1.0.2").on("n2").hz(&["b"]),
            ])],
            vec![Eps(
                "web",
                &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:C-IE"],
            )],
        ),
        case(
            "row9_no_hint_for_own_zone_disables_topology",
            vec![svc("web")],
            vec![slice("web-a", "web").eps(vec![
                ep("10.1.0.1").on("n3").hz(&["b"]),
                ep("10.1.0.2").on("n2").hz(&["b"]),
            ])],
            vec![Eps(
                "web",
                &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:C-IE"],
            )],
        ),
        case(
            "row10_all_node_hinted_prefers_same_node",
            vec![svc("web")],
            vec![slice("web-a", "web").eps(vec![
                ep("10.1.0.1").on("n1").hn(&["n1"]).hz(&["a"]),
                ep("10.1.0.2").on("n3").hn(&["n3"]).hz(&["a"]),
            ])],
            vec![Eps(
                "web",
                &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:----"],
            )],
        ),
        case(
            "row11_dual_stack_families_fall_back_independently",
            vec![dual_stack()],
            vec![
                slice("web-v4", "web").eps(vec![
                    ep("10.1.0.1").on("n2").st(),
                    ep("10.1.0.2").on("n2").not_ready(),
                ]),
                slice("web-v6", "web").v6().eps(vec![
                    ep("fd00:1::1").on("n2"),
                    ep("fd00:1::2").on("n2").st(),
                ]),
            ],
            vec![Eps(
                "web",
                &[
                    "10.1.0.1 /TCP=8080:C-IE",
                    "10.1.0.2 /TCP=8080:----",
                    "fd00:1::1 /TCP=8080:C-IE",
                    "fd00:1::2 /TCP=8080:----",
                ],
            )],
        ),
        // -- §8.1 objects considered --
        case(
            "externalname_service_and_its_slices_skipped",
            vec![svc("ext").kind(ServiceType::ExternalName), svc("web")],
            vec![slice("ext-a", "ext").eps(vec![ep("10.1.0.1")])],
            vec![Svcs(&["ns/web"])],
        ),
        case(
            "headless_service_skipped",
            vec![svc("hl").ips(&[]), svc("web")],
            vec![slice("hl-a", "hl").eps(vec![ep("10.1.0.1")])],
            vec![Svcs(&["ns/web"])],
        ),
        case(
            "service_proxy_name_label_skips_service_whatever_its_value",
            vec![
                svc("other").label(LABEL_SERVICE_PROXY_NAME, "other-proxy"),
                svc("empty-value").label(LABEL_SERVICE_PROXY_NAME, ""),
                svc("web"),
            ],
            vec![slice("other-a", "other").eps(vec![ep("10.1.0.1")])],
            vec![Svcs(&["ns/web"])],
        ),
        case(
            "headless_label_skips_service_with_a_cluster_ip_whatever_its_value",
            vec![
                svc("labelled").label(LABEL_HEADLESS, "true"),
                svc("empty-value").label(LABEL_HEADLESS, ""),
                svc("web"),
            ],
            vec![slice("labelled-a", "labelled").eps(vec![ep("10.1.0.1")])],
            vec![Svcs(&["ns/web"])],
        ),
        case(
            "service_proxy_name_labelled_slice_ignored",
            vec![svc("web")],
            vec![
                slice("web-a", "web")
                    .label(LABEL_SERVICE_PROXY_NAME, "other")
                    .eps(vec![ep("10.1.0.9")]),
                slice("web-b", "web").eps(vec![ep("10.1.0.1")]),
            ],
            vec![Eps("web", &["10.1.0.1 /TCP=8080:C-IE"])],
        ),
        case(
            "fqdn_slice_ignored",
            vec![svc("web")],
            vec![
                slice("web-a", "web").fqdn().eps(vec![ep("10.1.0.9")]),
                slice("web-b", "web").eps(vec![ep("10.1.0.1")]),
            ],
            vec![Eps("web", &["10.1.0.1 /TCP=8080:C-IE"])],
        ),
        case(
            "slice_without_service_name_label_ignored",
            vec![svc("web")],
            vec![slice("web-a", "web")
                .unlabel(LABEL_SERVICE_NAME)
                .eps(vec![ep("10.1.0.1")])],
            vec![Eps("web", &[])],
        ),
        case(
            "headless_labelled_slice_ignored",
            vec![svc("web")],
            vec![
                slice("web-a", "web")
                    .label(LABEL_HEADLESS, "")
                    .eps(vec![ep("10.1.0.9")]),
                slice("web-b", "web").eps(vec![ep("10.1.0.1")]),
            ],
            vec![Eps("web", &["10.1.0.1 /TCP=8080:C-IE"])],
        ),
        case(
            "slice_of_unknown_service_ignored",
            vec![svc("web")],
            vec![slice("nope-a", "nope").eps(vec![ep("10.1.0.1")])],
            vec![Svcs(&["ns/web"]), Eps("web", &[])],
        ),
        case(
            "slice_in_other_namespace_does_not_back_service",
            vec![svc("web")],
            vec![slice("web-a", "web").ns("other").eps(vec![ep("10.1.0.1")])],
            vec![Eps("web", &[])],
        ),
        case(
            "services_without_endpoints_included",
            vec![svc("empty"), svc("web")],
            vec![slice("web-a", "web").eps(vec![ep("10.1.0.1")])],
            vec![
                Svcs(&["ns/empty", "ns/web"]),
                Eps("empty", &[]),
                LocalReady("empty", 0, 0),
            ],
        ),
        // -- §8.2 endpoint facts --
        case(
            "missing_conditions_mean_ready_serving_not_terminating",
            vec![svc("web")],
            vec![slice("web-a", "web").eps(vec![ep("10.1.0.1").on("n1")])],
            vec![
                Eps("web", &["10.1.0.1 /TCP=8080:C-IE"]),
                Check(|s| {
                    let c = endpoint(s, "web", "10.1.0.1").conditions;
                    assert_eq!((c.ready, c.serving, c.terminating), (true, true, false));
                }),
            ],
        ),
        case(
            "missing_serving_defaults_to_ready",
            vec![svc("web")],
            vec![slice("web-a", "web").eps(vec![ep("10.1.0.1").not_ready().term(true)])],
            vec![
                Eps("web", &["10.1.0.1 /TCP=8080:----"]),
                Check(|s| {
                    let c = endpoint(s, "web", "10.1.0.1").conditions;
                    assert_eq!((c.ready, c.serving, c.terminating), (false, false, true));
                }),
            ],
        ),
        case(
            "local_means_node_name_equals_this_node",
            vec![svc("web").itp_local()],
            vec![slice("web-a", "web").eps(vec![
                ep("10.1.0.1").on("n1"),
                ep("10.1.0.2").on("n2"),
                ep("10.1.0.3"),
            ])],
            vec![
                Eps(
                    "web",
                    &[
                        "10.1.0.1 /TCP=8080:-LI-",
                        "10.1.0.2 /TCP=8080:----",
                        "10.1.0.3 /TCP=8080:----",
                    ],
                ),
                Check(|s| {
                    let local: Vec<bool> =
                        get(s, "web").endpoints.iter().map(|e| e.local).collect();
                    assert_eq!(local, [true, false, false]);
                }),
            ],
        ),
        case(
            "duplicate_ip_ready_copy_wins",
            vec![svc("web")],
            vec![
                slice("web-a", "web").eps(vec![ep("10.1.0.1").on("n2").host("a").not_ready()]),
                slice("web-b", "web").eps(vec![ep("10.1.0.1").on("n1").host("b")]),
            ],
            vec![
                Eps("web", &["10.1.0.1 /TCP=8080:C-IE"]),
                Check(|s| {
                    let e = endpoint(s, "web", "10.1.0.1");
                    assert_eq!(
                        (e.hostname.as_str(), e.local, e.conditions.ready),
                        ("b", true, true)
                    );
                }),
                LocalReady("web", 1, 0),
            ],
        ),
        case(
            "duplicate_ip_without_ready_copy_keeps_first_in_slice_order",
            vec![svc("web")],
            // Listed out of order on purpose: slice-name order decides.
            vec![
                slice("web-b", "web").eps(vec![ep("10.1.0.1").host("b").not_ready()]),
                slice("web-a", "web").eps(vec![ep("10.1.0.1").host("a").st()]),
            ],
            vec![
                Eps("web", &["10.1.0.1 /TCP=8080:C-IE"]),
                Check(|s| assert_eq!(endpoint(s, "web", "10.1.0.1").hostname, "a")),
            ],
        ),
        case(
            "duplicate_ip_takes_port_number_of_winning_copy",
            vec![svc("web")],
            vec![
                slice("web-a", "web").eps(vec![ep("10.1.0.1").not_ready()]),
                slice("web-b", "web")
                    .ports(vec![esp("", Tcp, 9090)])
                    .eps(vec![ep("10.1.0.1")]),
            ],
            vec![Eps("web", &["10.1.0.1 /TCP=9090:C-IE"])],
        ),
        case(
            "ip_in_slices_for_different_ports_is_one_endpoint",
            vec![two_ports()],
            vec![
                slice("web-a", "web")
                    .ports(vec![esp("http", Tcp, 8080)])
                    .eps(vec![ep("10.1.0.1")]),
                slice("web-b", "web")
                    .ports(vec![esp("metrics", Tcp, 9100)])
                    .eps(vec![ep("10.1.0.1")]),
            ],
            vec![Eps(
                "web",
                &["10.1.0.1 http/TCP=8080:C-IE metrics/TCP=9100:C-IE"],
            )],
        ),
        case(
            "slices_of_one_service_are_merged",
            vec![svc("web")],
            vec![
                slice("web-a", "web").eps(vec![ep("10.1.0.2")]),
                slice("web-b", "web").eps(vec![ep("10.1.0.1")]),
            ],
            vec![Eps(
                "web",
                &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:C-IE"],
            )],
        ),
        // -- service port <-> slice port --
        case(
            "named_target_port_resolved_via_slice_port_name",
            vec![svc("web").ports(vec![ServicePort {
                target_port: TargetPort::Name("web-https".into()),
                ..sp("https", Tcp, 443)
            }])],
            vec![slice("web-a", "web")
                .ports(vec![esp("https", Tcp, 8443)])
                .eps(vec![ep("10.1.0.1")])],
            vec![
                Eps("web", &["10.1.0.1 https/TCP=8443:C-IE"]),
                Check(|s| {
                    let p = &get(s, "web").service.ports[0];
                    assert_eq!(
                        (p.port, p.target_port, p.target_port_name.as_str()),
                        (443, 0, "web-https")
                    );
                }),
            ],
        ),
        case(
            "numeric_target_port_is_informational",
            vec![svc("web")],
            vec![slice("web-a", "web")
                .ports(vec![esp("", Tcp, 9999)])
                .eps(vec![ep("10.1.0.1")])],
            vec![
                Eps("web", &["10.1.0.1 /TCP=9999:C-IE"]),
                Check(|s| {
                    let p = &get(s, "web").service.ports[0];
                    assert_eq!((p.target_port, p.target_port_name.as_str()), (8080, ""));
                }),
            ],
        ),
        case(
            "port_missing_in_slice_backs_nothing",
            vec![two_ports()],
            vec![slice("web-a", "web")
                .ports(vec![esp("http", Tcp, 8080)])
                .eps(vec![ep("10.1.0.1")])],
            vec![Eps("web", &["10.1.0.1 http/TCP=8080:C-IE"])],
        ),
        case(
            "slice_port_without_number_backs_nothing",
            vec![svc("web")],
            vec![slice("web-a", "web")
                .ports(vec![EndpointSlicePort {
                    port: None,
                    ..esp("", Tcp, 0)
                }])
                .eps(vec![ep("10.1.0.1")])],
            vec![Eps("web", &[])],
        ),
        case(
            "slice_port_protocol_must_match",
            vec![svc("web")],
            vec![slice("web-a", "web")
                .ports(vec![esp("", Udp, 8080)])
                .eps(vec![ep("10.1.0.1")])],
            vec![Eps("web", &[])],
        ),
        case(
            "slice_port_name_must_match",
            vec![svc("web")],
            vec![slice("web-a", "web")
                .ports(vec![esp("http", Tcp, 8080)])
                .eps(vec![ep("10.1.0.1")])],
            vec![Eps("web", &[])],
        ),
        case(
            "same_port_number_on_tcp_and_udp_kept_apart",
            vec![svc("dns").ports(vec![sp("dns", Udp, 53), sp("dns", Tcp, 53)])],
            vec![slice("dns-a", "dns")
                .ports(vec![esp("dns", Udp, 53), esp("dns", Tcp, 5353)])
                .eps(vec![ep("10.1.0.1")])],
            vec![
                Eps("dns", &["10.1.0.1 dns/TCP=5353:C-IE dns/UDP=53:C-IE"]),
                Check(|s| assert_eq!(get(s, "dns").service.ports.len(), 2)),
            ],
        ),
        case(
            "tcp_and_udp_ports_categorised_separately",
            vec![svc("dns").ports(vec![sp("dns", Tcp, 53), sp("dns", Udp, 53)])],
            vec![
                slice("dns-tcp", "dns")
                    .ports(vec![esp("dns", Tcp, 53)])
                    .eps(vec![ep("10.1.0.1")]),
                slice("dns-udp", "dns")
                    .ports(vec![esp("dns", Udp, 53)])
                    .eps(vec![ep("10.1.0.1").not_ready(), ep("10.1.0.2")]),
            ],
            vec![Eps(
                "dns",
                &[
                    "10.1.0.1 dns/TCP=53:C-IE dns/UDP=53:----",
                    "10.1.0.2 dns/UDP=53:C-IE",
                ],
            )],
        ),
        // -- §8.3 policy predicates --
        case(
            "ip_mode_proxy_lb_ip_neither_programmed_nor_external_access",
            vec![svc("web")
                .kind(ServiceType::LoadBalancer)
                .lb_proxy("192.0.2.10")
                .etp_local()],
            vec![slice("web-a", "web").eps(vec![ep("10.1.0.1").on("n2")])],
            vec![
                Eps("web", &["10.1.0.1 /TCP=8080:C-IE"]),
                Check(|s| {
                    let svc = &get(s, "web").service;
                    assert!(svc.load_balancer_ips.is_empty());
                    assert_eq!(svc.external_traffic_policy, TrafficPolicy::Cluster);
                }),
            ],
        ),
        case(
            "vip_lb_ip_makes_service_externally_accessible",
            vec![svc("web")
                .kind(ServiceType::LoadBalancer)
                .lb("192.0.2.10")
                .lb_proxy("192.0.2.11")
                .etp_local()],
            vec![slice("web-a", "web").eps(vec![ep("10.1.0.1").on("n2"), ep("10.1.0.2").on("n1")])],
            vec![
                Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-I-", "10.1.0.2 /TCP=8080:CLIE"],
                ),
                Check(|s| {
                    let svc = &get(s, "web").service;
                    assert_eq!(
                        svc.load_balancer_ips.v4(),
                        [std::net::Ipv4Addr::new(192, 0, 2, 10)].as_slice()
                    );
                    assert_eq!(svc.external_traffic_policy, TrafficPolicy::Local);
                }),
            ],
        ),
        case(
            "etp_local_without_external_access_reported_cluster",
            vec![svc("web").etp_local()],
            vec![slice("web-a", "web").eps(vec![ep("10.1.0.1").on("n2")])],
            vec![
                Eps("web", &["10.1.0.1 /TCP=8080:C-IE"]),
                Check(|s| {
                    assert_eq!(
                        get(s, "web").service.external_traffic_policy,
                        TrafficPolicy::Cluster
                    )
                }),
            ],
        ),
        case(
            "etp_local_with_external_ip_reported_local",
            vec![svc("web").ext_ip("198.51.100.1").etp_local()],
            vec![slice("web-a", "web").eps(vec![ep("10.1.0.1").on("n2"), ep("10.1.0.2").on("n1")])],
            vec![
                Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-I-", "10.1.0.2 /TCP=8080:CLIE"],
                ),
                Check(|s| {
                    assert_eq!(
                        get(s, "web").service.external_traffic_policy,
                        TrafficPolicy::Local
                    )
                }),
            ],
        ),
        case(
            "etp_local_node_port_only_on_some_ports",
            vec![svc("web")
                .ports(vec![
                    ServicePort {
                        node_port: 30080,
                        ..sp("http", Tcp, 80)
                    },
                    sp("metrics", Tcp, 9100),
                ])
                .etp_local()],
            vec![two_port_slice("web-a").eps(vec![ep("10.1.0.1").on("n2")])],
            vec![
                Eps(
                    "web",
                    &["10.1.0.1 http/TCP=8080:C-I- metrics/TCP=9100:C-IE"],
                ),
                Check(|s| {
                    assert_eq!(
                        get(s, "web").service.external_traffic_policy,
                        TrafficPolicy::Local
                    )
                }),
            ],
        ),
        case(
            "itp_local_uses_local_ready_for_internal",
            vec![svc("web").itp_local()],
            vec![slice("web-a", "web").eps(vec![ep("10.1.0.1").on("n1"), ep("10.1.0.2").on("n2")])],
            vec![Eps(
                "web",
                &["10.1.0.1 /TCP=8080:-LI-", "10.1.0.2 /TCP=8080:----"],
            )],
        ),
        case(
            "itp_local_falls_back_to_local_serving_terminating",
            vec![svc("web").itp_local()],
            vec![slice("web-a", "web")
                .eps(vec![ep("10.1.0.1").on("n1").st(), ep("10.1.0.2").on("n2")])],
            vec![Eps(
                "web",
                &["10.1.0.1 /TCP=8080:-LI-", "10.1.0.2 /TCP=8080:----"],
            )],
        ),
        case(
            "itp_local_with_node_port_keeps_cluster_set",
            vec![svc("web")
                .kind(ServiceType::NodePort)
                .node_port(30080)
                .itp_local()],
            vec![slice("web-a", "web").eps(vec![ep("10.1.0.1").on("n2"), ep("10.1.0.2").on("n1")])],
            vec![Eps(
                "web",
                &["10.1.0.1 /TCP=8080:C--E", "10.1.0.2 /TCP=8080:CLIE"],
            )],
        ),
        case(
            "itp_and_etp_local_with_node_port",
            vec![svc("web")
                .kind(ServiceType::NodePort)
                .node_port(30080)
                .itp_local()
                .etp_local()],
            vec![slice("web-a", "web").eps(vec![ep("10.1.0.1").on("n2"), ep("10.1.0.2").on("n1")])],
            vec![Eps(
                "web",
                &["10.1.0.1 /TCP=8080:C---", "10.1.0.2 /TCP=8080:CLIE"],
            )],
        ),
        case(
            "external_access_judged_per_family",
            vec![dual_stack().ext_ip("2001:db8::1").etp_local()],
            vec![
                slice("web-v4", "web").eps(vec![ep("10.1.0.1").on("n2")]),
                slice("web-v6", "web")
                    .v6()
                    .eps(vec![ep("fd00:1::1").on("n2")]),
            ],
            vec![
                Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-IE", "fd00:1::1 /TCP=8080:C-I-"],
                ),
                Check(|s| {
                    assert_eq!(
                        get(s, "web").service.external_traffic_policy,
                        TrafficPolicy::Local
                    )
                }),
            ],
        ),
        case(
            "local_set_prefers_ready_over_terminating",
            vec![lb_etp_local()],
            vec![slice("web-a", "web")
                .eps(vec![ep("10.1.0.1").on("n1"), ep("10.1.0.2").on("n1").st()])],
            vec![Eps(
                "web",
                &["10.1.0.1 /TCP=8080:CLIE", "10.1.0.2 /TCP=8080:----"],
            )],
        ),
    ]
}
