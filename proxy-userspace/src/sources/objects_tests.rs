use super::*;
use serde_json::json;

fn decode(v: serde_json::Value) -> Result<Object, ObjectError> {
    match decode_object(v)? {
        Decoded::Object(o) => Ok(*o),
        Decoded::Ignored { kind, .. } => panic!("ignored {kind}"),
    }
}

#[test]
fn a_cluster_ip_of_the_wrong_family_for_ip_families_is_rejected() {
    let svc = |ips: serde_json::Value, families: serde_json::Value| {
        decode(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"clusterIPs": ips, "ipFamilies": families, "ports": [{"port": 80}]}
        }))
    };
    let err = svc(json!(["fd00::1"]), json!(["IPv4"])).unwrap_err();
    assert_eq!(err.field, "spec.clusterIPs[0]", "{err}");
    let err = svc(json!(["10.96.0.1", "10.96.0.2"]), json!(["IPv4", "IPv6"]));
    assert!(err.is_err());
    let err = svc(json!(["10.96.0.1"]), json!(["IPv5"])).unwrap_err();
    assert_eq!(err.field, "spec.ipFamilies[0]", "{err}");
    let Object::Service(ok) =
        svc(json!(["10.96.0.1", "fd00::1"]), json!(["IPv4", "IPv6"])).unwrap()
    else {
        panic!("not a service")
    };
    assert_eq!(ok.cluster_ips.len(), 2);
}

#[test]
fn service_defaults_are_filled_in() {
    let o = decode(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"clusterIP": "10.96.0.10", "sessionAffinity": "ClientIP",
                 "ports": [{"port": 80}]}
    }))
    .unwrap();
    let Object::Service(s) = o else { panic!() };
    assert_eq!(s.key, ObjectKey::new("default", "web"));
    assert_eq!(s.service_type, ServiceType::ClusterIp);
    assert_eq!(s.ports[0].protocol, Protocol::Tcp);
    assert_eq!(s.ports[0].target_port, TargetPort::Number(80));
    assert_eq!(s.session_affinity_timeout, Some(10800));
}

#[test]
fn invalid_objects_name_the_field() {
    let cases = [
        (
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"},
                "spec": {"clusterIP": "10.0.0.300"}}),
            "spec.clusterIPs[0]",
        ),
        (
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"},
                "spec": {"ports": [{"port": 70000}]}}),
            "spec.ports[0].port",
        ),
        (
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"},
                "spec": {"ports": [{"port": 80, "protocol": "ICMP"}]}}),
            "spec.ports[0].protocol",
        ),
        (
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {},
                "spec": {}}),
            "metadata.name",
        ),
        (
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "s"}, "addressType": "IPv4",
                "endpoints": [{"addresses": ["fd00::1"]}]}),
            "endpoints[0].addresses[0]",
        ),
        (
            json!({"apiVersion": "discovery.k8s.io/v1beta1", "kind": "EndpointSlice",
                "metadata": {"name": "s"}}),
            "apiVersion",
        ),
        (json!({"kind": "Service"}), "apiVersion"),
    ];
    for (doc, field) in cases {
        let err = decode(doc.clone()).unwrap_err();
        assert_eq!(err.field, field, "{doc}: {err}");
    }
}

#[test]
fn a_field_of_the_wrong_type_is_undecodable_and_a_bad_value_invalid() {
    let svc = |port: serde_json::Value| {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"},
               "spec": {"ports": [{"port": port}]}})
    };
    let err = decode(svc(json!("eighty"))).unwrap_err();
    assert_eq!(err.reject_reason(), RejectReason::Undecodable, "{err}");
    // Named by where it is, as an operator would look for it.
    assert_eq!(err.field, "spec.ports[0].port", "{err}");
    let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                       "metadata": {"name": "s"}, "addressType": "IPv4",
                       "endpoints": [{"addresses": ["10.0.0.1"]},
                                     {"addresses": ["10.0.0.2"], "conditions": [true]}]});
    let err = decode(slice).unwrap_err();
    assert_eq!(err.field, "endpoints[1].conditions", "{err}");
    // A map key that is not a field name is bracketed, as the API server
    // names it.
    let label = json!({"apiVersion": "v1", "kind": "Service",
                       "metadata": {"name": "a", "labels": {"app.kubernetes.io/name": 7}},
                       "spec": {}});
    let err = decode(label).unwrap_err();
    assert_eq!(
        err.field, "metadata.labels[app.kubernetes.io/name]",
        "{err}"
    );
    let not_an_object = json!({"apiVersion": "v1", "kind": "Service", "metadata": "a"});
    assert_eq!(decode(not_an_object).unwrap_err().field, "metadata");
    let err = decode(svc(json!(0))).unwrap_err();
    assert_eq!(err.reject_reason(), RejectReason::InvalidObject, "{err}");
}

#[test]
fn the_ref_of_a_raw_object_is_the_ref_of_the_decoded_one() {
    let objects = [
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}, "spec": {}}),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "a", "namespace": "prod"}, "spec": {}}),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": "s", "namespace": "prod"}, "addressType": "IPv4"}),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "x"}}),
    ];
    for v in objects {
        let decoded = decode(v.clone()).unwrap().object_ref();
        assert_eq!(object_ref(decoded.kind, &v).unwrap(), decoded, "{v}");
    }
    // Whatever else the object holds.
    let bad = json!({"metadata": {"name": "a", "namespace": "prod"}, "spec": "x"});
    assert_eq!(
        object_ref(ObjectKind::Service, &bad).unwrap().to_string(),
        "Service prod/a"
    );
    let err = object_ref(ObjectKind::Service, &json!({"metadata": {}})).unwrap_err();
    assert_eq!(err.field, "metadata.name");
}

#[test]
fn other_kinds_are_ignored() {
    let d = decode_object(json!({"apiVersion": "apps/v1", "kind": "Deployment"})).unwrap();
    assert!(matches!(d, Decoded::Ignored { .. }));
}

#[test]
fn slice_conditions_and_hints_are_kept_as_given() {
    let o = decode(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "namespace": "prod",
                     "labels": {"kubernetes.io/service-name": "web"},
                     "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2024-09-06T06:19:51Z"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080}],
        "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"serving": true},
                       "hints": {"forZones": [{"name": "a"}]}, "nodeName": "n1"}]
    }))
    .unwrap();
    let Object::EndpointSlice(s) = o else {
        panic!()
    };
    assert_eq!(s.service_key(), Some(ObjectKey::new("prod", "web")));
    assert_eq!(s.endpoints[0].ready, None);
    assert_eq!(s.endpoints[0].serving, Some(true));
    assert_eq!(s.endpoints[0].hints_for_zones(), ["a"]);
    assert_eq!(
        s.last_change_trigger_time,
        Some(Timestamp {
            seconds: 1725603591,
            nanos: 0
        })
    );
}
