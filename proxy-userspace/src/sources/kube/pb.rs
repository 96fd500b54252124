//! Objects read from the API server's protobuf encoding
//! (`--kube-api-content-type application/vnd.kubernetes.protobuf`, the
//! default, as kube-proxy's): the messages of [`proto::k8s`] (written for
//! the fields read, with the upstream field numbers; why not a crate of
//! every Kubernetes type is said there) turned into the SAME wire types
//! the JSON path reads ([`super::super::wire`] for Services and
//! EndpointSlices, k8s-openapi's for Nodes and Pods), so that
//! [`super::super::objects`] checks both alike. Strings are borrowed from
//! the decoded message.
//!
//! A message that does not decode (truncated, a field of the wrong wire
//! type, a string that is not UTF-8), an envelope that is not one or names
//! another kind, is refused as an `undecodable` object, as a JSON object
//! of the wrong shape is.

use std::borrow::Cow;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use prost::bytes::Bytes;
use prost::Message;
use proto::k8s as pb;

use super::super::objects::{ObjectError, Project};
use super::super::wire::{
    self, Meta, Obj, Text, TriggerTime, WireLabels, ANNOTATION_LAST_CHANGE_TRIGGER_TIME,
};

/// A kind read from protobuf: its message, and the wire type made of it.
pub(crate) trait FromPb: Project + kube::Resource<DynamicType = ()> {
    type Pb: Message + Default;

    /// The wire type, strings borrowed from `pb`.
    fn wire(pb: &Self::Pb) -> Result<Self::Wire<'_>, ObjectError>;
}

fn undecodable(field: &str, reason: impl Into<String>) -> ObjectError {
    ObjectError {
        field: field.to_owned(),
        reason: reason.into(),
        undecodable: true,
    }
}

/// The message of an object of `K`: `bytes` is either the message itself
/// (a list's item) or an envelope holding it (a watch event's object),
/// which must name `K`'s kind. A message never starts with the envelope's
/// magic (`k8s\0` reads as a group start of field 13, which no object
/// message has).
pub(crate) fn message_of<K: FromPb>(bytes: &Bytes) -> Result<Bytes, ObjectError> {
    if !bytes.starts_with(&pb::MAGIC) {
        return Ok(bytes.clone());
    }
    let opened = pb::open(bytes).map_err(|e| undecodable("object", format!("protobuf {e}")))?;
    let (api_version, kind) = (K::api_version(&()), K::kind(&()));
    if opened.kind != kind || opened.api_version != api_version {
        return Err(undecodable(
            "kind",
            format!(
                "{} {} is not a kind this resource holds",
                opened.api_version, opened.kind
            ),
        ));
    }
    Ok(opened.raw)
}

/// `K`'s message decoded from `message`.
pub(crate) fn decode<K: FromPb>(message: Bytes) -> Result<K::Pb, ObjectError> {
    K::Pb::decode(message).map_err(|e| undecodable("object", format!("protobuf: {e}")))
}

/// The name, namespace and resourceVersion of an object's message, read
/// without the rest (its other fields are skipped).
pub(crate) fn head(message: &Bytes) -> Option<pb::MetaHead> {
    pb::ObjectHead::decode(message.clone()).ok()?.metadata
}

fn text(s: &Option<String>) -> Option<Text<'_>> {
    s.as_deref().map(|s| Text(Cow::Borrowed(s)))
}

fn texts(v: &[String]) -> Option<Vec<Text<'_>>> {
    (!v.is_empty()).then(|| v.iter().map(|s| Text(Cow::Borrowed(s))).collect())
}

fn time(field: &str, t: &pb::Time) -> Result<Time, ObjectError> {
    let (seconds, nanos) = (t.seconds.unwrap_or(0), t.nanos.unwrap_or(0));
    jiff::Timestamp::new(seconds, nanos)
        .map(Time)
        .map_err(|e| undecodable(field, format!("{seconds}s {nanos}ns is not a time: {e}")))
}

fn opt_time(field: &str, t: &Option<pb::Time>) -> Result<Option<Time>, ObjectError> {
    t.as_ref().map(|t| time(field, t)).transpose()
}

fn meta(m: &Option<pb::ObjectMeta>) -> Result<Option<Obj<Meta<'_>>>, ObjectError> {
    let Some(m) = m else {
        return Ok(None);
    };
    Ok(Some(Obj(Meta {
        name: text(&m.name),
        namespace: text(&m.namespace),
        uid: text(&m.uid),
        resource_version: text(&m.resource_version),
        creation_timestamp: opt_time("metadata.creationTimestamp", &m.creation_timestamp)?,
        labels: (!m.labels.is_empty()).then(|| {
            use crate::model::intern::intern;
            WireLabels(
                m.labels
                    .iter()
                    .map(|(k, v)| (intern(k), intern(v)))
                    .collect(),
            )
        }),
        annotations: Some(TriggerTime(
            m.annotations
                .get(ANNOTATION_LAST_CHANGE_TRIGGER_TIME)
                .map(|t| Text(Cow::Borrowed(t.as_str()))),
        )),
    })))
}

impl FromPb for core::Service {
    type Pb = pb::Service;

    fn wire(s: &pb::Service) -> Result<wire::Service<'_>, ObjectError> {
        let spec = s.spec.as_ref().map(|spec| {
            Obj(wire::ServiceSpec {
                type_: text(&spec.r#type),
                cluster_ip: text(&spec.cluster_ip),
                cluster_ips: texts(&spec.cluster_ips),
                ip_families: texts(&spec.ip_families),
                ports: Some(
                    spec.ports
                        .iter()
                        .map(|p| {
                            Obj(wire::ServicePort {
                                name: text(&p.name),
                                protocol: text(&p.protocol),
                                port: p.port,
                                node_port: p.node_port,
                                target_port: p.target_port.as_ref().map(|t| match t.r#type {
                                    Some(1) => {
                                        IntOrString::String(t.str_val.clone().unwrap_or_default())
                                    }
                                    _ => IntOrString::Int(t.int_val.unwrap_or(0)),
                                }),
                                app_protocol: text(&p.app_protocol),
                            })
                        })
                        .collect(),
                ),
                external_ips: texts(&spec.external_ips),
                session_affinity: text(&spec.session_affinity),
                session_affinity_config: spec.session_affinity_config.as_ref().map(|c| {
                    Obj(wire::SessionAffinityConfig {
                        client_ip: c.client_ip.as_ref().map(|c| {
                            Obj(wire::ClientIpConfig {
                                timeout_seconds: c.timeout_seconds,
                            })
                        }),
                    })
                }),
                load_balancer_source_ranges: texts(&spec.load_balancer_source_ranges),
                internal_traffic_policy: text(&spec.internal_traffic_policy),
                external_traffic_policy: text(&spec.external_traffic_policy),
                health_check_node_port: spec.health_check_node_port,
                traffic_distribution: text(&spec.traffic_distribution),
            })
        });
        let status = s.status.as_ref().map(|st| {
            Obj(wire::ServiceStatus {
                load_balancer: st.load_balancer.as_ref().map(|lb| {
                    Obj(wire::LoadBalancerStatus {
                        ingress: Some(
                            lb.ingress
                                .iter()
                                .map(|i| {
                                    Obj(wire::LoadBalancerIngress {
                                        ip: text(&i.ip),
                                        ip_mode: text(&i.ip_mode),
                                    })
                                })
                                .collect(),
                        ),
                    })
                }),
            })
        });
        Ok(wire::Service {
            metadata: meta(&s.metadata)?,
            spec,
            status,
        })
    }
}

impl FromPb for discovery::EndpointSlice {
    type Pb = pb::EndpointSlice;

    fn wire(s: &pb::EndpointSlice) -> Result<wire::EndpointSlice<'_>, ObjectError> {
        let endpoints = s
            .endpoints
            .iter()
            .map(|e| {
                Obj(wire::Endpoint {
                    addresses: Some(
                        e.addresses
                            .iter()
                            .map(|a| Text(Cow::Borrowed(a.as_str())))
                            .collect(),
                    ),
                    conditions: e.conditions.as_ref().map(|c| {
                        Obj(wire::EndpointConditions {
                            ready: c.ready,
                            serving: c.serving,
                            terminating: c.terminating,
                        })
                    }),
                    hints: e.hints.as_ref().map(|h| {
                        Obj(wire::EndpointHints {
                            for_zones: named(&h.for_zones),
                            for_nodes: named(&h.for_nodes),
                        })
                    }),
                    hostname: text(&e.hostname),
                    node_name: text(&e.node_name),
                    zone: text(&e.zone),
                    target_ref: e.target_ref.as_ref().map(|r| {
                        Obj(wire::ObjectReference {
                            kind: text(&r.kind),
                            namespace: text(&r.namespace),
                            name: text(&r.name),
                            uid: text(&r.uid),
                        })
                    }),
                })
            })
            .collect();
        let ports = s
            .ports
            .iter()
            .map(|p| {
                Obj(wire::EndpointPort {
                    name: text(&p.name),
                    protocol: text(&p.protocol),
                    port: p.port,
                    app_protocol: text(&p.app_protocol),
                })
            })
            .collect();
        Ok(wire::EndpointSlice {
            metadata: meta(&s.metadata)?,
            address_type: text(&s.address_type),
            ports: Some(ports),
            endpoints: Some(endpoints),
        })
    }
}

fn named(v: &[pb::Named]) -> Option<Vec<Obj<wire::Named<'_>>>> {
    Some(
        v.iter()
            .map(|n| {
                Obj(wire::Named {
                    name: text(&n.name),
                })
            })
            .collect(),
    )
}

/// k8s-openapi's metadata, with the fields a Node or Pod is read for.
fn object_meta(m: &Option<pb::ObjectMeta>) -> Result<ObjectMeta, ObjectError> {
    let Some(m) = m else {
        return Ok(ObjectMeta::default());
    };
    let map = |m: &std::collections::BTreeMap<String, String>| (!m.is_empty()).then(|| m.clone());
    Ok(ObjectMeta {
        name: m.name.clone(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone(),
        resource_version: m.resource_version.clone(),
        creation_timestamp: opt_time("metadata.creationTimestamp", &m.creation_timestamp)?,
        deletion_timestamp: opt_time("metadata.deletionTimestamp", &m.deletion_timestamp)?,
        labels: map(&m.labels),
        annotations: map(&m.annotations),
        ..ObjectMeta::default()
    })
}

impl FromPb for core::Node {
    type Pb = pb::Node;

    fn wire(n: &pb::Node) -> Result<core::Node, ObjectError> {
        Ok(core::Node {
            metadata: object_meta(&n.metadata)?,
            spec: n.spec.as_ref().map(|s| core::NodeSpec {
                taints: Some(
                    s.taints
                        .iter()
                        .map(|t| core::Taint {
                            key: t.key.clone().unwrap_or_default(),
                            effect: t.effect.clone().unwrap_or_default(),
                            ..core::Taint::default()
                        })
                        .collect(),
                ),
                ..core::NodeSpec::default()
            }),
            status: n.status.as_ref().map(|s| core::NodeStatus {
                addresses: Some(
                    s.addresses
                        .iter()
                        .map(|a| core::NodeAddress {
                            type_: a.r#type.clone().unwrap_or_default(),
                            address: a.address.clone().unwrap_or_default(),
                        })
                        .collect(),
                ),
                ..core::NodeStatus::default()
            }),
        })
    }
}

impl FromPb for core::Pod {
    type Pb = pb::Pod;

    fn wire(p: &pb::Pod) -> Result<core::Pod, ObjectError> {
        let mut conditions =
            Vec::with_capacity(p.status.as_ref().map_or(0, |s| s.conditions.len()));
        for c in p.status.iter().flat_map(|s| &s.conditions) {
            conditions.push(core::PodCondition {
                type_: c.r#type.clone().unwrap_or_default(),
                status: c.status.clone().unwrap_or_default(),
                last_probe_time: opt_time("status.conditions.lastProbeTime", &c.last_probe_time)?,
                last_transition_time: opt_time(
                    "status.conditions.lastTransitionTime",
                    &c.last_transition_time,
                )?,
                reason: c.reason.clone(),
                message: c.message.clone(),
                ..core::PodCondition::default()
            });
        }
        Ok(core::Pod {
            metadata: object_meta(&p.metadata)?,
            spec: p.spec.as_ref().map(|s| core::PodSpec {
                node_name: s.node_name.clone(),
                ..core::PodSpec::default()
            }),
            status: p.status.as_ref().map(|_| core::PodStatus {
                conditions: Some(conditions),
                ..core::PodStatus::default()
            }),
        })
    }
}

#[cfg(test)]
#[path = "pb_tests.rs"]
mod tests;
