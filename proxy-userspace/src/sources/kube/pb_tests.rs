//! The protobuf path against the JSON path: for random objects of the
//! shapes the fake API server serves, the object the fake server encodes
//! in protobuf (test-support's encoder, with the messages of
//! [`proto::k8s`]) and carries as [`super::super::pb_body`] does, once
//! checked, is the object its JSON gives: the same model object, or the
//! same refusal naming the same field.

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use test_support::fake_apiserver::pb as fake_pb;

use super::super::raw::{Checked, RawObject, Watched};

/// What a check gives, comparable: the object, or the refusal's field
/// and reason.
fn outcome(c: Checked) -> (Result<crate::model::Object, String>, Option<u64>, String) {
    let version = c.version();
    let reference = format!("{:?}", c.reference.map_err(|e| e.to_string()));
    let decoded = c.decoded.map_err(|r| r.error.to_string());
    (decoded, version, reference)
}

/// Checks `object` both ways; whether it was accepted.
fn both<K: Watched>(kind: &str, object: &Value) -> bool {
    let json: RawObject<K> = serde_json::from_str(&object.to_string()).expect("reads");
    let message = fake_pb::object_message(kind, object);
    let mut carried = Vec::new();
    super::super::pb_body::push_object(&mut carried, &message);
    let pb: RawObject<K> = serde_json::from_slice(&carried).expect("reads");
    assert_eq!(json.version(), pb.version(), "{object}");
    let (json, pb) = (outcome(json.check()), outcome(pb.check()));
    assert_eq!(json, pb, "{object}");
    json.0.is_ok()
}

/// [`both`] over 400 objects of `strategy`; a good share of them must be
/// accepted and some refused, or the property says little.
fn property<K: Watched>(kind: &str, strategy: impl Strategy<Value = Value>) {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 400,
        ..ProptestConfig::default()
    });
    let seen = std::cell::Cell::new((0, 0));
    runner
        .run(&strategy, |object| {
            let accepted = both::<K>(kind, &object);
            let (n, ok) = seen.get();
            seen.set((n + 1, ok + usize::from(accepted)));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{kind}: {e}"));
    let (n, ok) = seen.get();
    assert!(
        ok * 5 >= n && (n - ok) * 100 >= n,
        "{kind}: {ok} of {n} accepted"
    );
}

/// `value` under `key` when there is one.
fn put(m: &mut Map<String, Value>, key: &str, value: Option<Value>) {
    if let Some(v) = value {
        m.insert(key.to_owned(), v);
    }
}

fn obj(pairs: Vec<(&str, Option<Value>)>) -> Value {
    let mut m = Map::new();
    for (k, v) in pairs {
        put(&mut m, k, v);
    }
    Value::Object(m)
}

fn name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,6}"
}

fn one_of(options: &'static [&'static str]) -> impl Strategy<Value = String> {
    proptest::sample::select(options).prop_map(str::to_owned)
}

/// One of `valid`, now and then `invalid` (so that most objects are
/// accepted and some refused).
fn pick(valid: &'static [&'static str], invalid: &'static str) -> impl Strategy<Value = String> {
    prop_oneof![12 => one_of(valid), 1 => Just(invalid.to_owned())]
}

/// Mostly valid addresses, some with leading zeros, some not addresses.
fn ip() -> impl Strategy<Value = String> {
    prop_oneof![
        20 => (0u8..=255, 1u8..=254).prop_map(|(a, b)| format!("10.{a}.0.{b}")),
        3 => (0u8..=9).prop_map(|a| format!("10.96.0.0{a}")),
        1 => Just("fd00::1".to_owned()),
        1 => Just("not-an-ip".to_owned()),
    ]
}

fn time() -> impl Strategy<Value = String> {
    (0i64..2_000_000_000).prop_map(|s| {
        jiff::Timestamp::from_second(s)
            .expect("in range")
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    })
}

fn labels() -> impl Strategy<Value = Option<Value>> {
    proptest::option::of(
        proptest::collection::btree_map(name(), name(), 0..3).prop_map(|m| json!(m)),
    )
}

fn meta(namespaced: bool) -> impl Strategy<Value = Value> {
    (
        proptest::option::weighted(0.97, name()),
        proptest::option::of(name()),
        proptest::option::of(1u64..1_000_000),
        labels(),
        proptest::option::of(time()),
        proptest::option::of(prop_oneof![20 => time(), 1 => Just("soon".to_owned())]),
        proptest::option::of(time()),
    )
        .prop_map(move |(n, ns, rv, labels, created, trigger, deleted)| {
            let annotations = trigger.map(|t| {
                json!({"endpoints.kubernetes.io/last-change-trigger-time": t,
                       "kubernetes.io/config.mirror": "x", "other": "y"})
            });
            obj(vec![
                ("name", n.map(Value::from)),
                ("namespace", ns.filter(|_| namespaced).map(Value::from)),
                ("resourceVersion", rv.map(|v| json!(v.to_string()))),
                ("uid", Some(json!("u-1"))),
                ("labels", labels),
                ("annotations", annotations),
                ("creationTimestamp", created.map(Value::from)),
                ("deletionTimestamp", deleted.map(Value::from)),
            ])
        })
}

fn service_port() -> impl Strategy<Value = Value> {
    (
        proptest::option::of(one_of(&["http", "dns", ""])),
        proptest::option::of(pick(&["TCP", "UDP", "SCTP"], "ICMP")),
        proptest::option::of(prop_oneof![20 => 1i32..65_536, 1 => Just(70_000)]),
        proptest::option::of(0i32..33_000),
        proptest::option::of(prop_oneof![
            (0i32..70_000).prop_map(Value::from),
            one_of(&["web", "8080", ""]).prop_map(Value::from),
        ]),
        proptest::option::of(one_of(&["http", "h2c"])),
    )
        .prop_map(|(n, proto, port, node_port, target, app)| {
            obj(vec![
                ("name", n.map(Value::from)),
                ("protocol", proto.map(Value::from)),
                ("port", port.map(Value::from)),
                ("nodePort", node_port.map(Value::from)),
                ("targetPort", target),
                ("appProtocol", app.map(Value::from)),
            ])
        })
}

fn service() -> impl Strategy<Value = Value> {
    let spec = (
        proptest::option::of(pick(
            &["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"],
            "Bogus",
        )),
        proptest::option::of(ip()),
        proptest::collection::vec(ip(), 0..2),
        proptest::collection::vec(pick(&["IPv4"], "IPv5"), 0..2),
        proptest::collection::vec(service_port(), 0..2),
        proptest::collection::vec(ip(), 0..2),
        proptest::option::of(pick(&["None", "ClientIP"], "Sticky")),
        proptest::option::of(prop_oneof![20 => 1i32..86_400, 1 => Just(-1)]),
        proptest::collection::vec(pick(&["10.0.0.0/8", "010.0.0.0/08"], "nope"), 0..2),
        (
            proptest::option::of(pick(&["Cluster", "Local"], "Elsewhere")),
            proptest::option::of(one_of(&["Cluster", "Local"])),
            proptest::option::of(0i32..70_000),
            proptest::option::of(one_of(&["PreferClose", ""])),
        ),
    )
        .prop_map(
            |(t, ip, ips, families, ports, external, affinity, timeout, ranges, rest)| {
                let (itp, etp, hcnp, distribution) = rest;
                obj(vec![
                    ("type", t.map(Value::from)),
                    ("clusterIP", ip.map(Value::from)),
                    ("clusterIPs", Some(json!(ips))),
                    ("ipFamilies", Some(json!(families))),
                    ("ports", Some(json!(ports))),
                    ("externalIPs", Some(json!(external))),
                    ("sessionAffinity", affinity.map(Value::from)),
                    (
                        "sessionAffinityConfig",
                        timeout.map(|t| json!({"clientIP": {"timeoutSeconds": t}})),
                    ),
                    ("loadBalancerSourceRanges", Some(json!(ranges))),
                    ("internalTrafficPolicy", itp.map(Value::from)),
                    ("externalTrafficPolicy", etp.map(Value::from)),
                    ("healthCheckNodePort", hcnp.map(Value::from)),
                    ("trafficDistribution", distribution.map(Value::from)),
                ])
            },
        );
    let ingress = proptest::collection::vec(
        (
            proptest::option::of(ip()),
            proptest::option::of(pick(&["VIP", "Proxy"], "Other")),
        )
            .prop_map(|(ip, mode)| {
                obj(vec![
                    ("ip", ip.map(Value::from)),
                    ("ipMode", mode.map(Value::from)),
                ])
            }),
        0..2,
    );
    (meta(true), proptest::option::weighted(0.97, spec), ingress).prop_map(|(m, spec, ingress)| {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": m, "spec": spec,
               "status": {"loadBalancer": {"ingress": ingress}}})
    })
}

fn endpoint() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            20 => proptest::collection::vec(ip(), 1..3),
            1 => Just(Vec::new()),
        ],
        proptest::option::of((
            proptest::option::of(any::<bool>()),
            proptest::option::of(any::<bool>()),
            proptest::option::of(any::<bool>()),
        )),
        proptest::option::of((
            proptest::collection::vec(name(), 0..2),
            proptest::collection::vec(name(), 0..2),
        )),
        proptest::option::of(name()),
        proptest::option::of(name()),
        proptest::option::of(name()),
        proptest::option::of((name(), name())),
    )
        .prop_map(|(addresses, conditions, hints, host, node, zone, target)| {
            let named =
                |v: Vec<String>| json!(v.iter().map(|n| json!({"name": n})).collect::<Vec<_>>());
            obj(vec![
                ("addresses", Some(json!(addresses))),
                (
                    "conditions",
                    conditions.map(|(r, s, t)| {
                        obj(vec![
                            ("ready", r.map(Value::from)),
                            ("serving", s.map(Value::from)),
                            ("terminating", t.map(Value::from)),
                        ])
                    }),
                ),
                (
                    "hints",
                    hints.map(|(z, n)| json!({"forZones": named(z), "forNodes": named(n)})),
                ),
                ("hostname", host.map(Value::from)),
                ("nodeName", node.map(Value::from)),
                ("zone", zone.map(Value::from)),
                (
                    "targetRef",
                    target.map(
                        |(ns, n)| json!({"kind": "Pod", "namespace": ns, "name": n, "uid": "u"}),
                    ),
                ),
            ])
        })
}

fn slice() -> impl Strategy<Value = Value> {
    (
        meta(true),
        proptest::option::weighted(0.97, pick(&["IPv4", "IPv4", "FQDN"], "IPv7")),
        proptest::collection::vec(
            (
                proptest::option::of(one_of(&["http", ""])),
                proptest::option::of(pick(&["TCP", "UDP"], "ICMP")),
                proptest::option::of(0i32..70_000),
            )
                .prop_map(|(n, p, port)| {
                    obj(vec![
                        ("name", n.map(Value::from)),
                        ("protocol", p.map(Value::from)),
                        ("port", port.map(Value::from)),
                    ])
                }),
            0..2,
        ),
        proptest::collection::vec(endpoint(), 0..4),
    )
        .prop_map(|(m, address_type, ports, endpoints)| {
            let mut o = obj(vec![
                ("metadata", Some(m)),
                ("addressType", address_type.map(Value::from)),
                ("ports", Some(json!(ports))),
                ("endpoints", Some(json!(endpoints))),
            ]);
            o["apiVersion"] = json!("discovery.k8s.io/v1");
            o["kind"] = json!("EndpointSlice");
            o
        })
}

fn node() -> impl Strategy<Value = Value> {
    (
        meta(false),
        proptest::collection::vec(name(), 0..2),
        proptest::collection::vec(
            (one_of(&["InternalIP", "ExternalIP", "Hostname"]), ip()),
            0..3,
        ),
    )
        .prop_map(|(m, taints, addresses)| {
            let taints: Vec<Value> = taints
                .iter()
                .map(|k| json!({"key": k, "effect": "NoSchedule"}))
                .collect();
            let addresses: Vec<Value> = addresses
                .iter()
                .map(|(t, a)| json!({"type": t, "address": a}))
                .collect();
            json!({"apiVersion": "v1", "kind": "Node", "metadata": m,
                   "spec": {"taints": taints}, "status": {"addresses": addresses}})
        })
}

fn pod() -> impl Strategy<Value = Value> {
    (
        meta(true),
        proptest::option::of(name()),
        proptest::collection::vec(
            (
                one_of(&["Ready", "ContainersReady"]),
                pick(&["True", "False", "Unknown"], "Maybe"),
                proptest::option::of(time()),
                proptest::option::of(time()),
                proptest::option::of(name()),
            ),
            0..3,
        ),
    )
        .prop_map(|(m, node, conditions)| {
            let conditions: Vec<Value> = conditions
                .into_iter()
                .map(|(t, s, probe, transition, reason)| {
                    obj(vec![
                        ("type", Some(json!(t))),
                        ("status", Some(json!(s))),
                        ("lastProbeTime", probe.map(Value::from)),
                        ("lastTransitionTime", transition.map(Value::from)),
                        ("reason", reason.clone().map(Value::from)),
                        ("message", reason.map(Value::from)),
                    ])
                })
                .collect();
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": m,
                   "spec": {"nodeName": node, "containers": []},
                   "status": {"conditions": conditions}})
        })
}

#[test]
fn a_service_reads_the_same_in_protobuf_and_json() {
    property::<core::Service>("Service", service());
}

#[test]
fn an_endpoint_slice_reads_the_same_in_protobuf_and_json() {
    property::<discovery::EndpointSlice>("EndpointSlice", slice());
}

#[test]
fn a_node_reads_the_same_in_protobuf_and_json() {
    property::<core::Node>("Node", node());
}

#[test]
fn a_pod_reads_the_same_in_protobuf_and_json() {
    property::<core::Pod>("Pod", pod());
}

/// The objects the fake API server's helpers make, and the shapes the
/// wire-type test covers, read alike.
#[test]
fn the_fake_api_servers_objects_read_the_same_in_protobuf_and_json() {
    use test_support::fake_apiserver::{service_object, slice_object};
    both::<core::Service>("Service", &service_object("default", "web", "10.96.0.10"));
    both::<discovery::EndpointSlice>(
        "EndpointSlice",
        &slice_object(
            "default",
            "web",
            &["10.244.0.1".into(), "10.244.0.2".into()],
        ),
    );
    let full = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "a", "uid": "u", "resourceVersion": "1",
                     "creationTimestamp": "2026-11-01T00:00:00Z",
                     "labels": {"app": "web"}, "annotations": {"x": "y"}},
        "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"],
                 "ipFamilies": ["IPv4"], "externalIPs": ["192.0.2.1"],
                 "sessionAffinity": "ClientIP",
                 "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
                 "loadBalancerSourceRanges": ["10.0.0.0/8"], "healthCheckNodePort": 30001,
                 "ports": [{"name": "http", "port": 80, "nodePort": 30080,
                            "targetPort": "web", "appProtocol": "http", "protocol": "TCP"}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.9", "ipMode": "VIP"}]}}});
    both::<core::Service>("Service", &full);
    let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "namespace": "a",
                     "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-01T00:00:00Z"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP", "appProtocol": "http"}],
        "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true},
                       "hints": {"forZones": [{"name": "z"}], "forNodes": [{"name": "n"}]},
                       "nodeName": "n", "zone": "z", "hostname": "h",
                       "targetRef": {"kind": "Pod", "namespace": "a", "name": "p", "uid": "u"}}]});
    both::<discovery::EndpointSlice>("EndpointSlice", &slice);
}

/// A message that does not decode is refused as undecodable, named by
/// what of its metadata reads, and so is an envelope naming another kind.
#[test]
fn a_malformed_message_is_refused_as_undecodable_and_named() {
    use crate::sources::RejectReason;
    let mut bad = test_support::fake_apiserver::service_object("default", "bad", "10.96.0.20");
    bad["spec"]["ports"][0]["port"] = json!("eighty");
    let message = fake_pb::object_message("Service", &bad);
    let check = |bytes: &[u8]| {
        let mut carried = Vec::new();
        super::super::pb_body::push_object(&mut carried, bytes);
        let raw: RawObject<core::Service> = serde_json::from_slice(&carried).expect("reads");
        raw.check().decoded.expect_err("refused").update("services")
    };
    let super::super::Update::Rejected {
        reason, message: m, ..
    } = check(&message)
    else {
        panic!("not a rejection");
    };
    assert_eq!(reason, RejectReason::Undecodable);
    assert!(
        m.starts_with("Service default/bad: object: protobuf: "),
        "{m}"
    );

    // Truncated: nothing of it reads.
    let super::super::Update::Rejected {
        reason, message: m, ..
    } = check(&message[..3])
    else {
        panic!("not a rejection");
    };
    assert_eq!(reason, RejectReason::Undecodable);
    assert!(
        m.starts_with("an object without a name: object: protobuf: "),
        "{m}"
    );

    // An envelope of another kind.
    let node = proto::k8s::enveloped("v1", "Node", &message);
    let super::super::Update::Rejected {
        reason, message: m, ..
    } = check(&node)
    else {
        panic!("not a rejection");
    };
    assert_eq!(reason, RejectReason::Undecodable);
    assert!(
        m.contains("kind: v1 Node is not a kind this resource holds"),
        "{m}"
    );
}
