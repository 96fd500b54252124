use std::collections::BTreeSet;

use super::*;
use crate::model::testing::{service, state};
use crate::model::ServiceEndpoints;

fn key(name: &str) -> ObjectKey {
    ObjectKey::new("default", name)
}

fn ip(addr: &str, port: u16) -> Frontend {
    Frontend {
        ip: FrontendIp::Ip(addr.parse().unwrap()),
        protocol: Protocol::Tcp,
        port,
    }
}

fn node_port(port: u16) -> Frontend {
    Frontend {
        ip: FrontendIp::NodePort,
        protocol: Protocol::Tcp,
        port,
    }
}

/// The table: services, a frontend, who owns it, who loses it.
struct Case {
    name: &'static str,
    services: Vec<ServiceEndpoints>,
    frontend: Frontend,
    owner: Option<&'static str>,
    losers: &'static [&'static str],
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "an uncontested ClusterIP belongs to its service",
            services: vec![service("default", "a", &["10.96.0.1"])],
            frontend: ip("10.96.0.1", 80),
            owner: Some("a"),
            losers: &[],
        },
        Case {
            name: "nobody owns an address nobody claims",
            services: vec![service("default", "a", &["10.96.0.1"])],
            frontend: ip("10.96.0.2", 80),
            owner: None,
            losers: &[],
        },
        Case {
            name: "the same IP on another port is another frontend",
            services: vec![
                service("default", "a", &["10.96.0.1"]),
                service("default", "b", &["10.96.0.2"])
                    .with_external_ips(&["10.96.0.1"])
                    .with_port(443),
            ],
            frontend: ip("10.96.0.1", 443),
            owner: Some("b"),
            losers: &[],
        },
        Case {
            name: "externalIP on another's ClusterIP: the older service wins",
            services: vec![
                service("default", "a", &["10.96.0.1"]).created_at(200),
                service("default", "b", &["10.96.0.2"])
                    .with_external_ips(&["10.96.0.1"])
                    .created_at(100),
            ],
            frontend: ip("10.96.0.1", 80),
            owner: Some("b"),
            losers: &["a"],
        },
        Case {
            name: "two externalIPs: oldest first",
            services: vec![
                service("default", "a", &["10.96.0.1"])
                    .with_external_ips(&["192.0.2.1"])
                    .created_at(300),
                service("default", "b", &["10.96.0.2"])
                    .with_external_ips(&["192.0.2.1"])
                    .created_at(100),
                service("default", "c", &["10.96.0.3"])
                    .with_external_ips(&["192.0.2.1"])
                    .created_at(200),
            ],
            frontend: ip("192.0.2.1", 80),
            owner: Some("b"),
            losers: &["c", "a"],
        },
        Case {
            name: "same age: namespace/name order",
            services: vec![
                service("default", "b", &["10.96.0.2"])
                    .with_load_balancer_ips(&["203.0.113.9"])
                    .created_at(100),
                service("default", "a", &["10.96.0.1"])
                    .with_load_balancer_ips(&["203.0.113.9"])
                    .created_at(100),
            ],
            frontend: ip("203.0.113.9", 80),
            owner: Some("a"),
            losers: &["b"],
        },
        Case {
            name: "a service without creationTimestamp counts as newest",
            services: vec![
                service("default", "a", &["10.96.0.1"]).with_load_balancer_ips(&["203.0.113.9"]),
                service("default", "z", &["10.96.0.2"])
                    .with_load_balancer_ips(&["203.0.113.9"])
                    .created_at(900),
            ],
            frontend: ip("203.0.113.9", 80),
            owner: Some("z"),
            losers: &["a"],
        },
        Case {
            name: "externalIP against LoadBalancer IP",
            services: vec![
                service("default", "ext", &["10.96.0.1"])
                    .with_external_ips(&["203.0.113.9"])
                    .created_at(50),
                service("default", "lb", &["10.96.0.2"])
                    .with_load_balancer_ips(&["203.0.113.9"])
                    .created_at(10),
            ],
            frontend: ip("203.0.113.9", 80),
            owner: Some("lb"),
            losers: &["ext"],
        },
        Case {
            name: "NodePort collision (two objects from manifests): oldest",
            services: vec![
                service("default", "a", &["10.96.0.1"])
                    .with_node_port(30080)
                    .created_at(20),
                service("default", "b", &["10.96.0.2"])
                    .with_node_port(30080)
                    .created_at(10),
            ],
            frontend: node_port(30080),
            owner: Some("b"),
            losers: &["a"],
        },
        Case {
            name: "a NodePort number equal to another's port on an IP is no collision",
            services: vec![
                service("default", "a", &["10.96.0.1"]).with_node_port(30080),
                service("default", "b", &["10.96.0.2"]).with_port(30080),
            ],
            frontend: node_port(30080),
            owner: Some("a"),
            losers: &[],
        },
        Case {
            name: "dual-stack: the families are separate frontends",
            services: vec![
                service("default", "a", &["10.96.0.1", "fd00::1"]).created_at(5),
                service("default", "b", &["10.96.0.2"])
                    .with_external_ips(&["fd00::1"])
                    .created_at(1),
            ],
            frontend: ip("10.96.0.1", 80),
            owner: Some("a"),
            losers: &[],
        },
        Case {
            name: "dual-stack: the v6 ClusterIP is lost to the older externalIP",
            services: vec![
                service("default", "a", &["10.96.0.1", "fd00::1"]).created_at(5),
                service("default", "b", &["10.96.0.2"])
                    .with_external_ips(&["fd00::1"])
                    .created_at(1),
            ],
            frontend: ip("fd00::1", 80),
            owner: Some("b"),
            losers: &["a"],
        },
    ]
}

#[test]
fn the_claims_table() {
    for case in cases() {
        let claims = Claims::of(&state(case.services));
        assert_eq!(
            claims.owner(&case.frontend).map(|k| k.name.as_str()),
            case.owner,
            "{}",
            case.name
        );
        let losers: Vec<String> = claims
            .conflicts()
            .into_iter()
            .filter(|c| c.frontend == case.frontend)
            .flat_map(|c| c.losers)
            .map(|k| k.name.to_string())
            .collect();
        assert_eq!(losers, case.losers, "{}", case.name);
    }
}

#[test]
fn the_owner_going_away_hands_the_frontend_to_the_next_claimant() {
    let old = service("default", "old", &["10.96.0.1"])
        .with_external_ips(&["192.0.2.1"])
        .created_at(1);
    let mid = service("default", "mid", &["10.96.0.2"])
        .with_external_ips(&["192.0.2.1"])
        .created_at(2);
    let new = service("default", "new", &["10.96.0.3"])
        .with_external_ips(&["192.0.2.1"])
        .created_at(3);
    let mut claims = Claims::of(&state(vec![old.clone(), mid.clone(), new]));
    let contested = ip("192.0.2.1", 80);
    assert!(claims.owns(&key("old"), &contested));
    assert_eq!(claims.lost_claims(), 2);

    assert_eq!(claims.losses(&key("new")), [(contested, &key("old"))]);
    assert!(claims.losses(&key("old")).is_empty());

    let touched = claims.update(&key("old"), None);
    assert_eq!(touched, BTreeSet::from([key("mid")]), "only the new owner");
    assert!(claims.owns(&key("mid"), &contested));
    assert_eq!(claims.lost_claims(), 1);

    // The old service comes back: it is older, so it takes the address
    // back and `mid` must be reprogrammed without it.
    let touched = claims.update(&key("old"), Some(&old.service));
    assert_eq!(touched, BTreeSet::from([key("mid")]));
    assert!(claims.owns(&key("old"), &contested));

    // Dropping the address (not the service) hands it on too.
    let without = service("default", "old", &["10.96.0.1"]).created_at(1);
    let touched = claims.update(&key("old"), Some(&without.service));
    assert_eq!(touched, BTreeSet::from([key("mid")]));
    assert!(claims.owns(&key("mid"), &contested));
    assert!(claims.owns(&key("old"), &ip("10.96.0.1", 80)));
}

#[test]
fn uncontested_changes_touch_no_other_service() {
    let a = service("default", "a", &["10.96.0.1"]);
    let mut claims = Claims::of(&state(vec![a, service("default", "b", &["10.96.0.2"])]));
    let moved = service("default", "a", &["10.96.0.9"]);
    assert!(claims.update(&key("a"), Some(&moved.service)).is_empty());
    assert!(claims.update(&key("a"), None).is_empty());
    assert_eq!(claims.owner(&ip("10.96.0.1", 80)), None);
    assert!(claims.conflicts().is_empty());
}

#[test]
fn incremental_updates_agree_with_a_fresh_computation() {
    let services = [
        service("default", "a", &["10.96.0.1"])
            .with_external_ips(&["192.0.2.1"])
            .created_at(3),
        service("default", "b", &["10.96.0.2"])
            .with_external_ips(&["192.0.2.1", "10.96.0.1"])
            .created_at(1),
        service("default", "c", &["10.96.0.3"])
            .with_load_balancer_ips(&["192.0.2.1"])
            .created_at(2),
        service("default", "d", &["10.96.0.4"]).with_node_port(30001),
    ];
    // Every order of adding, then removing, the services.
    for rotation in 0..services.len() {
        let mut claims = Claims::default();
        let mut present = Vec::new();
        for i in 0..services.len() {
            let s = &services[(i + rotation) % services.len()];
            claims.update(&s.service.key, Some(&s.service));
            present.push(s.clone());
            let fresh = Claims::of(&state(present.clone()));
            assert_eq!(claims.conflicts(), fresh.conflicts());
            let lost: usize = fresh.conflicts().iter().map(|c| c.losers.len()).sum();
            assert_eq!(claims.lost_claims(), lost);
        }
        for s in &services[..2] {
            claims.update(&s.service.key, None);
            present.retain(|p| p.service.key != s.service.key);
            assert_eq!(
                claims.conflicts(),
                Claims::of(&state(present.clone())).conflicts()
            );
        }
    }
}

#[test]
fn frontends_cover_every_ip_kind_and_node_ports_once() {
    let s = service("default", "a", &["10.96.0.1", "10.96.0.1"])
        .with_external_ips(&["192.0.2.1"])
        .with_load_balancer_ips(&["203.0.113.1"])
        .with_node_port(30100);
    assert_eq!(
        frontends(&s.service),
        vec![
            ip("10.96.0.1", 80),
            ip("192.0.2.1", 80),
            ip("203.0.113.1", 80),
            node_port(30100)
        ]
    );
    assert_eq!(node_port(30100).to_string(), "nodePort 30100/TCP");
    assert_eq!(ip("fd00::1", 80).to_string(), "[fd00::1]:80/TCP");
}
