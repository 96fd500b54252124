//! Services and EndpointSlices as they are read off the wire: only the
//! fields the proxy reads ([`super::objects`] checks them), strings
//! borrowed from the text being read wherever serde_json can lend them,
//! labels interned as they are read and of the annotations only the one
//! the model keeps. A cluster has these two kinds by the ten thousand.
//! k8s-openapi's types hold every field of them as owned strings and maps
//! (managed fields, owner references, selectors, every annotation), and
//! decoding 50,000 slices into those types and dropping them took about
//! twice as long as reading these. Nodes and Pods (one, and the node's
//! hundred or so) keep k8s-openapi's types.
//!
//! The rules are k8s-openapi's, for the fields read here: any field may be
//! missing or null (its kind's default), an object must be a JSON object
//! ([`Obj`]), a string a string, a label or annotation value a string,
//! numbers in range of their type; timestamps and int-or-string ports are
//! k8s-openapi's own types. Fields the proxy does not read are skipped,
//! whatever their shape; `apiVersion` and `kind` are checked by the
//! callers (a manifest's head, the watched resource).

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::{value::MapAccessDeserializer, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use smallvec::SmallVec;

use crate::model::intern::intern;
use crate::model::Labels;

/// Annotation with the time of the change that triggered an EndpointSlice
/// update (used for network programming latency).
pub const ANNOTATION_LAST_CHANGE_TRIGGER_TIME: &str =
    "endpoints.kubernetes.io/last-change-trigger-time";

/// A string, borrowed from the text being read when the deserializer can
/// lend it (serde_json reading a `&str` with no escapes in the string),
/// owned otherwise. (`Cow<str>`'s own `Deserialize` always copies.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text<'a>(pub Cow<'a, str>);

impl Deref for Text<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);

        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Text<'a>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Borrowed(s)))
            }

            fn visit_str<E>(self, s: &str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(s.to_owned())))
            }

            fn visit_string<E>(self, s: String) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(s)))
            }
        }

        d.deserialize_str(V(PhantomData))
    }
}

/// `T` read from a JSON object only. serde's derived structs also take an
/// array, its items as the fields in order; k8s-openapi's types take an
/// object or refuse, and so do these.
#[derive(Debug, Default)]
pub struct Obj<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<fn() -> T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Obj<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Obj<T>, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map)).map(Obj)
            }
        }

        d.deserialize_map(V(PhantomData))
    }
}

/// `metadata`, as far as a Service or an EndpointSlice is read.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta<'a> {
    #[serde(borrow)]
    pub name: Option<Text<'a>>,
    #[serde(borrow)]
    pub namespace: Option<Text<'a>>,
    #[serde(borrow)]
    pub uid: Option<Text<'a>>,
    #[serde(borrow)]
    pub resource_version: Option<Text<'a>>,
    pub creation_timestamp: Option<Time>,
    pub labels: Option<WireLabels>,
    #[serde(borrow)]
    pub annotations: Option<TriggerTime<'a>>,
}

/// `metadata.labels`, interned as read (keys and values repeat across
/// objects). A key given twice keeps its last value.
#[derive(Debug, Default)]
pub struct WireLabels(pub Labels);

impl<'de> Deserialize<'de> for WireLabels {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;

        impl<'de> Visitor<'de> for V {
            type Value = WireLabels;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of strings")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<WireLabels, A::Error> {
                let mut pairs: SmallVec<[_; 8]> = SmallVec::new();
                while let Some(key) = map.next_key::<Text<'de>>()? {
                    let value = map.next_value::<Text<'de>>()?;
                    pairs.push((intern(&key), intern(&value)));
                }
                Ok(WireLabels(pairs.into_iter().collect()))
            }
        }

        d.deserialize_map(V)
    }
}

/// `metadata.annotations`, of which only
/// [`ANNOTATION_LAST_CHANGE_TRIGGER_TIME`] is kept; every value must
/// still be a string.
#[derive(Debug, Default)]
pub struct TriggerTime<'a>(pub Option<Text<'a>>);

impl<'de: 'a, 'a> Deserialize<'de> for TriggerTime<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);

        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = TriggerTime<'a>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of strings")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TriggerTime<'a>, A::Error> {
                let mut time = None;
                while let Some(key) = map.next_key::<Text<'de>>()? {
                    let value = map.next_value::<Text<'a>>()?;
                    if *key == *ANNOTATION_LAST_CHANGE_TRIGGER_TIME {
                        time = Some(value);
                    }
                }
                Ok(TriggerTime(time))
            }
        }

        d.deserialize_map(V(PhantomData))
    }
}

#[derive(Debug, Deserialize)]
pub struct Service<'a> {
    #[serde(borrow)]
    pub metadata: Option<Obj<Meta<'a>>>,
    #[serde(borrow)]
    pub spec: Option<Obj<ServiceSpec<'a>>>,
    #[serde(borrow)]
    pub status: Option<Obj<ServiceStatus<'a>>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec<'a> {
    #[serde(borrow, rename = "type")]
    pub type_: Option<Text<'a>>,
    #[serde(borrow, rename = "clusterIP")]
    pub cluster_ip: Option<Text<'a>>,
    #[serde(borrow, rename = "clusterIPs")]
    pub cluster_ips: Option<Vec<Text<'a>>>,
    #[serde(borrow)]
    pub ip_families: Option<Vec<Text<'a>>>,
    #[serde(borrow)]
    pub ports: Option<Vec<Obj<ServicePort<'a>>>>,
    #[serde(borrow, rename = "externalIPs")]
    pub external_ips: Option<Vec<Text<'a>>>,
    #[serde(borrow)]
    pub session_affinity: Option<Text<'a>>,
    pub session_affinity_config: Option<Obj<SessionAffinityConfig>>,
    #[serde(borrow)]
    pub load_balancer_source_ranges: Option<Vec<Text<'a>>>,
    #[serde(borrow)]
    pub internal_traffic_policy: Option<Text<'a>>,
    #[serde(borrow)]
    pub external_traffic_policy: Option<Text<'a>>,
    pub health_check_node_port: Option<i32>,
    #[serde(borrow)]
    pub traffic_distribution: Option<Text<'a>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort<'a> {
    #[serde(borrow)]
    pub name: Option<Text<'a>>,
    #[serde(borrow)]
    pub protocol: Option<Text<'a>>,
    pub port: Option<i32>,
    pub node_port: Option<i32>,
    pub target_port: Option<IntOrString>,
    #[serde(borrow)]
    pub app_protocol: Option<Text<'a>>,
}

#[derive(Debug, Deserialize)]
pub struct SessionAffinityConfig {
    #[serde(rename = "clientIP")]
    pub client_ip: Option<Obj<ClientIpConfig>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientIpConfig {
    pub timeout_seconds: Option<i32>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStatus<'a> {
    #[serde(borrow)]
    pub load_balancer: Option<Obj<LoadBalancerStatus<'a>>>,
}

#[derive(Debug, Deserialize)]
pub struct LoadBalancerStatus<'a> {
    #[serde(borrow)]
    pub ingress: Option<Vec<Obj<LoadBalancerIngress<'a>>>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerIngress<'a> {
    #[serde(borrow)]
    pub ip: Option<Text<'a>>,
    #[serde(borrow)]
    pub ip_mode: Option<Text<'a>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSlice<'a> {
    #[serde(borrow)]
    pub metadata: Option<Obj<Meta<'a>>>,
    #[serde(borrow)]
    pub address_type: Option<Text<'a>>,
    #[serde(borrow)]
    pub ports: Option<Vec<Obj<EndpointPort<'a>>>>,
    #[serde(borrow)]
    pub endpoints: Option<Vec<Obj<Endpoint<'a>>>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPort<'a> {
    #[serde(borrow)]
    pub name: Option<Text<'a>>,
    #[serde(borrow)]
    pub protocol: Option<Text<'a>>,
    pub port: Option<i32>,
    #[serde(borrow)]
    pub app_protocol: Option<Text<'a>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint<'a> {
    #[serde(borrow)]
    pub addresses: Option<Vec<Text<'a>>>,
    pub conditions: Option<Obj<EndpointConditions>>,
    #[serde(borrow)]
    pub hints: Option<Obj<EndpointHints<'a>>>,
    #[serde(borrow)]
    pub hostname: Option<Text<'a>>,
    #[serde(borrow)]
    pub node_name: Option<Text<'a>>,
    #[serde(borrow)]
    pub zone: Option<Text<'a>>,
    #[serde(borrow)]
    pub target_ref: Option<Obj<ObjectReference<'a>>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct EndpointConditions {
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointHints<'a> {
    #[serde(borrow)]
    pub for_zones: Option<Vec<Obj<Named<'a>>>>,
    #[serde(borrow)]
    pub for_nodes: Option<Vec<Obj<Named<'a>>>>,
}

/// A hint's zone or node.
#[derive(Debug, Deserialize)]
pub struct Named<'a> {
    #[serde(borrow)]
    pub name: Option<Text<'a>>,
}

#[derive(Debug, Deserialize)]
pub struct ObjectReference<'a> {
    #[serde(borrow)]
    pub kind: Option<Text<'a>>,
    #[serde(borrow)]
    pub namespace: Option<Text<'a>>,
    #[serde(borrow)]
    pub name: Option<Text<'a>>,
    #[serde(borrow)]
    pub uid: Option<Text<'a>>,
}

/// The text of an optional string field, `""` when it is missing.
pub fn text<'t>(t: &'t Option<Text<'_>>) -> &'t str {
    t.as_deref().unwrap_or_default()
}

impl<'a> Meta<'a> {
    /// The object's metadata, empty when it has none.
    pub fn of(metadata: Option<Obj<Meta<'a>>>) -> Meta<'a> {
        metadata.map(|Obj(m)| m).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1 as core;
    use k8s_openapi::api::discovery::v1 as discovery;
    use serde_json::{json, Value};

    use super::*;

    /// A k8s-openapi type and the wire type that stands for it.
    trait WireOf: serde::de::DeserializeOwned {
        /// Whether `doc` reads as the wire type.
        fn reads(doc: &Value) -> Result<(), serde_json::Error>;
    }

    impl WireOf for core::Service {
        fn reads(doc: &Value) -> Result<(), serde_json::Error> {
            Obj::<Service<'_>>::deserialize(doc).map(|_| ())
        }
    }

    impl WireOf for discovery::EndpointSlice {
        fn reads(doc: &Value) -> Result<(), serde_json::Error> {
            Obj::<EndpointSlice<'_>>::deserialize(doc).map(|_| ())
        }
    }

    /// Whether `doc` reads as `P`'s wire type, and whether k8s-openapi's
    /// own type reads it: the same, for every field the proxy reads.
    /// Counts the verdicts in `seen` (refused, read).
    fn same_verdict<P: WireOf>(seen: &mut [usize; 2], doc: Value) {
        let ours = P::reads(&doc);
        let theirs = serde_json::from_value::<P>(doc.clone()).map(|_| ());
        assert_eq!(ours.is_ok(), theirs.is_ok(), "{doc}: {ours:?} / {theirs:?}");
        seen[usize::from(ours.is_ok())] += 1;
    }

    fn with(mut doc: Value, pointer: &str, value: Value) -> Value {
        let (parent, last) = pointer.rsplit_once('/').expect("a pointer");
        let parent = doc.pointer_mut(parent).expect("the parent exists");
        match parent {
            Value::Array(items) => items[last.parse::<usize>().expect("an index")] = value,
            _ => parent[last] = value,
        }
        doc
    }

    fn service() -> Value {
        json!({"metadata": {"name": "web", "namespace": "a", "uid": "u", "resourceVersion": "1",
                            "creationTimestamp": "2026-11-01T00:00:00Z",
                            "labels": {"app": "web"}, "annotations": {"x": "y"}},
               "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"],
                        "ipFamilies": ["IPv4"], "externalIPs": ["192.0.2.1"],
                        "sessionAffinity": "ClientIP",
                        "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
                        "loadBalancerSourceRanges": ["10.0.0.0/8"], "healthCheckNodePort": 30001,
                        "ports": [{"name": "http", "port": 80, "nodePort": 30080,
                                   "targetPort": "web", "appProtocol": "http", "protocol": "TCP"}]},
               "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.9", "ipMode": "VIP"}]}}})
    }

    fn slice() -> Value {
        json!({"metadata": {"name": "web-1", "namespace": "a",
                            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-01T00:00:00Z"}},
               "addressType": "IPv4",
               "ports": [{"name": "http", "port": 8080, "protocol": "TCP", "appProtocol": "http"}],
               "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true},
                              "hints": {"forZones": [{"name": "z"}], "forNodes": [{"name": "n"}]},
                              "nodeName": "n", "zone": "z", "hostname": "h",
                              "targetRef": {"kind": "Pod", "namespace": "a", "name": "p", "uid": "u"}}]})
    }

    #[test]
    fn a_wire_type_reads_what_k8s_openapi_reads_and_refuses_what_it_refuses() {
        let mut seen = [0, 0];
        let bad = [
            json!("x"),
            json!(5),
            json!(true),
            json!(["x"]),
            json!({"a": 1}),
        ];
        for pointer in [
            "/metadata",
            "/metadata/name",
            "/metadata/creationTimestamp",
            "/metadata/labels",
            "/metadata/labels/app",
            "/metadata/annotations/x",
            "/spec",
            "/spec/clusterIPs",
            "/spec/clusterIPs/0",
            "/spec/ports",
            "/spec/ports/0",
            "/spec/ports/0/port",
            "/spec/ports/0/targetPort",
            "/spec/sessionAffinityConfig/clientIP",
            "/spec/sessionAffinityConfig/clientIP/timeoutSeconds",
            "/spec/healthCheckNodePort",
            "/status/loadBalancer/ingress/0",
            "/status/loadBalancer/ingress/0/ipMode",
        ] {
            same_verdict::<core::Service>(&mut seen, with(service(), pointer, Value::Null));
            for value in &bad {
                same_verdict::<core::Service>(&mut seen, with(service(), pointer, value.clone()));
            }
        }
        for pointer in [
            "/metadata/annotations/endpoints.kubernetes.io~1last-change-trigger-time",
            "/addressType",
            "/ports/0",
            "/ports/0/port",
            "/endpoints",
            "/endpoints/0",
            "/endpoints/0/addresses",
            "/endpoints/0/addresses/0",
            "/endpoints/0/conditions",
            "/endpoints/0/conditions/ready",
            "/endpoints/0/hints/forZones/0",
            "/endpoints/0/hints/forNodes/0/name",
            "/endpoints/0/targetRef",
            "/endpoints/0/targetRef/uid",
        ] {
            same_verdict::<discovery::EndpointSlice>(
                &mut seen,
                with(slice(), pointer, Value::Null),
            );
            for value in &bad {
                same_verdict::<discovery::EndpointSlice>(
                    &mut seen,
                    with(slice(), pointer, value.clone()),
                );
            }
        }
        // Out of range for the field's integer type.
        same_verdict::<core::Service>(
            &mut seen,
            with(service(), "/spec/ports/0/port", json!(1u64 << 40)),
        );
        same_verdict::<core::Service>(
            &mut seen,
            with(service(), "/spec/ports/0/port", json!(80.5)),
        );
        // An object given as an array of its fields in order, as serde's
        // derived structs would read it.
        for (pointer, fields) in [
            ("/endpoints/0/conditions", json!([true, true, false])),
            ("/endpoints/0/targetRef", json!(["Pod", "a", "p", "u"])),
            ("/endpoints/0/hints/forZones/0", json!(["z"])),
        ] {
            same_verdict::<discovery::EndpointSlice>(&mut seen, with(slice(), pointer, fields));
        }
        same_verdict::<core::Service>(
            &mut seen,
            with(
                service(),
                "/spec/sessionAffinityConfig/clientIP",
                json!([60]),
            ),
        );
        // A whole document that is not an object.
        same_verdict::<core::Service>(&mut seen, json!([service()]));
        let [refused, read] = seen;
        assert!(refused > 100 && read > 40, "{refused} refused, {read} read");
    }

    #[test]
    fn fields_not_read_are_skipped_whatever_their_shape() {
        // k8s-openapi would refuse these; the proxy reads none of them.
        for (pointer, value) in [
            ("/spec/selector", json!(5)),
            ("/metadata/ownerReferences", json!("x")),
        ] {
            let svc = with(service(), pointer, value);
            assert!(serde_json::from_value::<core::Service>(svc.clone()).is_err());
            assert!(core::Service::reads(&svc).is_ok(), "{svc}");
        }
    }

    #[test]
    fn strings_are_borrowed_from_text_and_unescaped_when_they_must_be() {
        let text = r#"{"metadata": {"name": "w\u0065b", "namespace": "a"}, "addressType": "IPv4"}"#;
        let mut de = serde_json::Deserializer::from_str(text);
        let Obj(slice) = Obj::<EndpointSlice<'_>>::deserialize(&mut de).expect("decodes");
        let meta = Meta::of(slice.metadata);
        assert_eq!(
            (meta.name.as_deref(), meta.namespace.as_deref()),
            (Some("web"), Some("a"))
        );
        let name = meta.name.as_ref().expect("has a name");
        let namespace = meta.namespace.as_ref().expect("has a namespace");
        assert!(
            matches!(name.0, std::borrow::Cow::Owned(_)),
            "escaped: copied"
        );
        assert!(
            matches!(namespace.0, std::borrow::Cow::Borrowed(_)),
            "plain: borrowed"
        );
    }
}
