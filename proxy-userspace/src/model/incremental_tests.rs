//! The incremental model against the full recompute: random sequences of
//! object changes over a small universe (so that objects collide, move and
//! come back) must give exactly the state [`compute`] gives, and the
//! changed keys must be exactly the services that differ.

use std::net::IpAddr;

use proptest::prelude::*;

use super::*;
use crate::model::cluster::*;
use crate::model::{compute, for_each_changed, ArcStr};

const OWN_NODE: &str = "node-1";

/// One random step; small integers pick from fixed pools.
#[derive(Clone, Debug)]
enum Op {
    Service {
        ns: u8,
        name: u8,
        variant: u16,
    },
    DeleteService {
        ns: u8,
        name: u8,
    },
    Slice {
        ns: u8,
        name: u8,
        owner: Option<u8>,
        kind: u8,
        ports: u8,
        endpoints: Vec<(u8, u8, u8)>,
    },
    DeleteSlice {
        ns: u8,
        name: u8,
    },
    Node {
        own: bool,
        zone: u8,
    },
    DeleteNode {
        own: bool,
    },
    Pod {
        name: u8,
        own: bool,
    },
    /// Recompute and compare now (the syncer recomputes after a batch).
    Check,
}

fn ns(n: u8) -> &'static str {
    ["a", "b"][usize::from(n % 2)]
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an IP address")
}

fn port(name: &str, protocol: Protocol, port: u16, target: TargetPort) -> ServicePort {
    ServicePort {
        name: name.into(),
        protocol,
        port,
        node_port: if port == 80 { 30080 } else { 0 },
        target_port: target,
        app_protocol: None,
    }
}

fn service(n: u8, name: u8, v: u16) -> Service {
    let service_type = [
        ServiceType::ClusterIp,
        ServiceType::NodePort,
        ServiceType::LoadBalancer,
        ServiceType::ExternalName,
    ][usize::from(v % 4)];
    let cluster_ips = match (v >> 2) % 4 {
        0 => vec![],
        1 => vec![ip("10.96.0.1")],
        2 => vec![ip("fd00::1")],
        _ => vec![ip("10.96.0.1"), ip("fd00::1")],
    };
    let ports = match (v >> 4) % 3 {
        0 => vec![port("", Protocol::Tcp, 80, TargetPort::Number(8080))],
        1 => vec![port(
            "http",
            Protocol::Tcp,
            80,
            TargetPort::Name("web".into()),
        )],
        _ => vec![
            port("http", Protocol::Tcp, 80, TargetPort::Number(8080)),
            port("dns", Protocol::Udp, 53, TargetPort::Number(53)),
        ],
    };
    let mut labels = Labels::default();
    if (v >> 6).is_multiple_of(8) {
        labels.insert(LABEL_SERVICE_PROXY_NAME, "other");
    }
    let local = |bit: u16| {
        if v & bit != 0 {
            TrafficPolicy::Local
        } else {
            TrafficPolicy::Cluster
        }
    };
    Service {
        key: ObjectKey::new(ns(n), format!("s{}", name % 3)),
        uid: format!("uid-{v}").into(),
        labels,
        created: Some(i64::from(v % 5)),
        service_type,
        cluster_ips,
        external_ips: if v & 0x200 != 0 {
            vec![ip("192.0.2.1")]
        } else {
            vec![]
        },
        load_balancer_ingress: vec![],
        ports,
        internal_traffic_policy: local(0x400),
        external_traffic_policy: local(0x800),
        session_affinity_timeout: (v & 0x1000 != 0).then_some(30),
        health_check_node_port: 0,
        traffic_distribution: match (v >> 13) % 3 {
            0 => None,
            1 => Some("PreferClose".into()),
            _ => Some("PreferSameNode".into()),
        },
        load_balancer_source_ranges: vec![],
    }
}

fn slice(
    n: u8,
    name: u8,
    owner: Option<u8>,
    kind: u8,
    ports: u8,
    eps: &[(u8, u8, u8)],
) -> EndpointSlice {
    let mut labels = Labels::default();
    if let Some(o) = owner {
        labels.insert(LABEL_SERVICE_NAME, format!("s{}", o % 3));
    }
    let address_type = match kind % 4 {
        1 => AddressType::Ipv6,
        2 => AddressType::Fqdn,
        _ => AddressType::Ipv4,
    };
    if kind % 4 == 3 {
        labels.insert(LABEL_HEADLESS, "");
    }
    let esp = |name: &str, protocol, port| EndpointSlicePort {
        name: name.into(),
        protocol,
        port,
        app_protocol: None,
    };
    let ports = match ports % 4 {
        0 => vec![esp("", Protocol::Tcp, Some(8080))],
        1 => vec![esp("http", Protocol::Tcp, Some(8080))],
        2 => vec![
            esp("http", Protocol::Tcp, Some(8080)),
            esp("dns", Protocol::Udp, Some(53)),
        ],
        _ => vec![esp("http", Protocol::Tcp, None)],
    };
    let endpoints = eps
        .iter()
        .map(|&(addr, node, cond)| {
            let host = addr % 4 + 1;
            let ip = if address_type == AddressType::Ipv6 {
                ip(&format!("fd00:10::{host}"))
            } else {
                ip(&format!("10.0.0.{host}"))
            };
            let flag = |shift: u8| match (cond >> shift) % 3 {
                0 => None,
                1 => Some(true),
                _ => Some(false),
            };
            Endpoint {
                ip,
                hostname: None,
                node_name: [None, Some(OWN_NODE), Some("node-2")][usize::from(node % 3)]
                    .map(ArcStr::from),
                zone: [None, Some("z1"), Some("z2")][usize::from((node / 3) % 3)].map(ArcStr::from),
                ready: flag(0),
                serving: flag(2),
                terminating: flag(4),
                hints: (cond & 0xc0 != 0).then(|| {
                    std::sync::Arc::new(EndpointHints {
                        for_zones: (cond & 0x40 != 0)
                            .then(|| "z1".into())
                            .into_iter()
                            .collect(),
                        for_nodes: (cond & 0x80 != 0)
                            .then(|| OWN_NODE.into())
                            .into_iter()
                            .collect(),
                    })
                }),
                target_ref: None,
            }
        })
        .collect();
    EndpointSlice {
        key: ObjectKey::new(ns(n), format!("e{}", name % 5)),
        labels,
        address_type,
        ports,
        endpoints,
        last_change_trigger_time: None,
    }
}

fn node(own: bool, zone: u8) -> Node {
    let mut labels = Labels::default();
    if let Some(z) = [None, Some("z1"), Some("z2"), Some("")][usize::from(zone % 4)] {
        labels.insert(LABEL_ZONE, z);
    }
    Node {
        name: if own { OWN_NODE } else { "node-2" }.to_owned(),
        labels,
        deleting: false,
        taint_keys: vec![],
        addresses: vec![],
    }
}

fn change(op: &Op) -> Option<Change> {
    let delete = |kind, namespace: &str, name: String| {
        Change::Delete(ObjectRef {
            kind,
            key: ObjectKey::new(namespace, name),
        })
    };
    Some(match op {
        Op::Service {
            ns: n,
            name,
            variant,
        } => Change::Upsert(Object::Service(Box::new(service(*n, *name, *variant)))),
        Op::DeleteService { ns: n, name } => {
            delete(ObjectKind::Service, ns(*n), format!("s{}", name % 3))
        }
        Op::Slice {
            ns: n,
            name,
            owner,
            kind,
            ports,
            endpoints,
        } => Change::Upsert(Object::EndpointSlice(slice(
            *n, *name, *owner, *kind, *ports, endpoints,
        ))),
        Op::DeleteSlice { ns: n, name } => {
            delete(ObjectKind::EndpointSlice, ns(*n), format!("e{}", name % 5))
        }
        Op::Node { own, zone } => Change::Upsert(Object::Node(node(*own, *zone))),
        Op::DeleteNode { own } => delete(
            ObjectKind::Node,
            "",
            if *own { OWN_NODE } else { "node-2" }.to_owned(),
        ),
        Op::Pod { name, own } => Change::Upsert(Object::Pod(Pod {
            key: ObjectKey::new("a", format!("p{}", name % 3)),
            uid: String::new(),
            node_name: Some(if *own { OWN_NODE } else { "node-2" }.to_owned()),
            static_pod: false,
            conditions: vec![],
            deletion_timestamp: None,
        })),
        Op::Check => return None,
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<u8>(), any::<u8>(), any::<u16>())
            .prop_map(|(ns, name, variant)| Op::Service { ns, name, variant }),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(ns, name)| Op::DeleteService { ns, name }),
        6 => (
            any::<u8>(),
            any::<u8>(),
            proptest::option::weighted(0.9, any::<u8>()),
            any::<u8>(),
            any::<u8>(),
            proptest::collection::vec(any::<(u8, u8, u8)>(), 0..5),
        )
            .prop_map(|(ns, name, owner, kind, ports, endpoints)| Op::Slice {
                ns,
                name,
                owner,
                kind,
                ports,
                endpoints,
            }),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(ns, name)| Op::DeleteSlice { ns, name }),
        1 => (any::<bool>(), any::<u8>()).prop_map(|(own, zone)| Op::Node { own, zone }),
        1 => any::<bool>().prop_map(|own| Op::DeleteNode { own }),
        1 => (any::<u8>(), any::<bool>()).prop_map(|(name, own)| Op::Pod { name, own }),
        3 => Just(Op::Check),
    ]
}

/// Recomputes and checks the state and the changed keys against the full
/// recompute and a comparison of the two states.
fn check(model: &mut Model, before: &LocalState, ctx: &NodeContext) -> LocalState {
    let recomputed = model.recompute();
    let after = model.state();
    assert_eq!(after, compute(model.cluster(), ctx), "incremental != full");
    let mut differ = Vec::new();
    for_each_changed(before, &after, |k, _| differ.push(k.clone()));
    assert_eq!(recomputed.changed, differ, "changed keys");
    after
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn incremental_changes_give_the_full_recompute(
        ops in proptest::collection::vec(op(), 1..40),
        synthesize_hints in any::<bool>(),
    ) {
        let ctx = NodeContext { node_name: OWN_NODE.to_owned(), synthesize_hints };
        let mut model = Model::new(ctx.clone());
        let mut before = LocalState::default();
        for op in &ops {
            match change(op) {
                Some(c) => {
                    model.apply(c);
                }
                None => before = check(&mut model, &before, &ctx),
            }
        }
        check(&mut model, &before, &ctx);
    }
}

#[test]
fn an_unchanged_service_is_shared_between_states() {
    let ctx = NodeContext {
        node_name: OWN_NODE.to_owned(),
        synthesize_hints: false,
    };
    let mut model = Model::new(ctx);
    for name in 0..3 {
        model.apply(Change::Upsert(Object::Service(Box::new(service(
            0, name, 68,
        )))));
        model.apply(Change::Upsert(Object::EndpointSlice(slice(
            0,
            name,
            Some(name),
            0,
            1,
            &[(name, 1, 0)],
        ))));
    }
    assert_eq!(model.recompute().changed.len(), 3);
    let first = model.state();
    model.apply(Change::Upsert(Object::EndpointSlice(slice(
        0,
        1,
        Some(1),
        0,
        1,
        &[(1, 1, 0), (3, 2, 0)],
    ))));
    let changed = model.recompute().changed;
    assert_eq!(changed, vec![ObjectKey::new("a", "s1")]);
    let second = model.state();
    assert!(Arc::ptr_eq(&first.services[0], &second.services[0]));
    assert!(!Arc::ptr_eq(&first.services[1], &second.services[1]));
    assert!(Arc::ptr_eq(&first.services[2], &second.services[2]));
    assert_eq!(second.services[1].endpoints.len(), 2);
}

/// A first sync of more Services than one thread computes: the views
/// computed on several threads come back in order, each for its own key.
#[test]
fn a_large_first_sync_computed_on_several_threads_is_the_full_recompute() {
    let ctx = NodeContext {
        node_name: OWN_NODE.to_owned(),
        synthesize_hints: false,
    };
    let mut model = Model::new(ctx.clone());
    let count = 3 * super::PARALLEL_VIEWS / 2;
    for i in 0..count {
        let name = format!("big{i:05}");
        // ClusterIP services: IPv4, IPv6, dual-stack, two ports.
        let mut svc = service(0, 0, [68, 72, 76, 132][i % 4]);
        svc.key = ObjectKey::new(ns(0), name.clone());
        model.apply(Change::Upsert(Object::Service(Box::new(svc))));
        let eps = [((i % 200) as u8, 1, 0), ((i % 7) as u8 + 1, 2, 0)];
        let mut sl = slice(0, 0, Some(0), 0, 1, &eps[..1 + i % 2]);
        sl.key = ObjectKey::new(ns(0), format!("{name}-x"));
        sl.labels.insert(LABEL_SERVICE_NAME, name);
        model.apply(Change::Upsert(Object::EndpointSlice(sl)));
    }
    let after = check(&mut model, &LocalState::default(), &ctx);
    assert_eq!(after.services.len(), count);
    assert!(
        after.endpoint_count() >= count,
        "every service has endpoints"
    );
}
