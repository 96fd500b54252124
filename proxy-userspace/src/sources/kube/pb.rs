//! Objects read from the API server's protobuf encoding
//! (`--kube-api-content-type application/vnd.kubernetes.protobuf`, the
//! default, as kube-proxy's) into the SAME wire types the JSON path reads
//! ([`super::super::wire`] for Services and EndpointSlices, k8s-openapi's
//! for Nodes and Pods), so that [`super::super::objects`] checks both
//! alike. Services and EndpointSlices (the lists that grow with the
//! cluster) are read in place ([`proto::k8s::read`]): each field straight
//! into the wire type, strings borrowed from the message, labels interned
//! as the JSON path interns them, nothing else allocated but the wire
//! type's vectors. Nodes and Pods (one node, its pods) are decoded into
//! the messages of [`proto::k8s`] first. Field numbers are the upstream
//! `generated.proto` ones, as in [`proto::k8s`]; the property tests
//! (`pb_tests.rs`) hold both to the JSON path.
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
use proto::k8s::read::{self, Field, ReadError};
use smallvec::SmallVec;

use super::super::objects::{Head, ObjectError, Project};
use super::super::wire::{
    self, Meta, Obj, Text, TriggerTime, WireLabels, ANNOTATION_LAST_CHANGE_TRIGGER_TIME,
};
use crate::model::intern::intern;

/// A kind read from protobuf into its wire type.
pub(crate) trait FromPb: Project + kube::Resource<DynamicType = ()> {
    /// The wire type of the object's message, strings borrowed from it.
    fn wire(message: &[u8]) -> Result<Self::Wire<'_>, ObjectError>;
}

fn undecodable(field: &str, reason: impl Into<String>) -> ObjectError {
    ObjectError {
        field: field.to_owned(),
        reason: reason.into(),
        undecodable: true,
    }
}

impl From<ReadError> for ObjectError {
    fn from(e: ReadError) -> ObjectError {
        undecodable("object", format!("protobuf: {e}"))
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

/// A message decoded by prost.
fn decode<M: Message + Default>(message: &[u8]) -> Result<M, ObjectError> {
    M::decode(message).map_err(|e| undecodable("object", format!("protobuf: {e}")))
}

/// The name, namespace and resourceVersion of an object's message, read
/// without the rest; `None` when its framing is broken.
pub(crate) fn head(message: &[u8]) -> Option<Head<'_>> {
    let mut head = Head {
        name: None,
        namespace: None,
        resource_version: None,
    };
    for f in read::fields(message) {
        let f = f.ok()?;
        if f.number != 1 {
            continue;
        }
        for f in read::fields(f.bytes("metadata").ok()?) {
            let f = f.ok()?;
            let slot = match f.number {
                1 => &mut head.name,
                3 => &mut head.namespace,
                6 => &mut head.resource_version,
                _ => continue,
            };
            *slot = Some(f.str("metadata").ok()?);
        }
    }
    Some(head)
}

type R<T> = Result<T, ObjectError>;

fn text<'a>(f: Field<'a>, field: &'static str) -> Result<Option<Text<'a>>, ReadError> {
    f.str(field).map(|s| Some(Text(Cow::Borrowed(s))))
}

fn push_text<'a>(
    v: &mut Vec<Text<'a>>,
    f: Field<'a>,
    field: &'static str,
) -> Result<(), ReadError> {
    v.push(Text(Cow::Borrowed(f.str(field)?)));
    Ok(())
}

/// Repeated strings as the JSON path has them: absent when empty.
fn texts(v: Vec<Text<'_>>) -> Option<Vec<Text<'_>>> {
    (!v.is_empty()).then_some(v)
}

fn time(field: &'static str, message: &[u8]) -> R<Time> {
    let (mut seconds, mut nanos) = (0, 0);
    for f in read::fields(message) {
        let f = f?;
        match f.number {
            1 => seconds = f.int64(field)?,
            2 => nanos = f.int32(field)?,
            _ => {}
        }
    }
    pb_time(field, seconds, nanos)
}

fn pb_time(field: &str, seconds: i64, nanos: i32) -> R<Time> {
    jiff::Timestamp::new(seconds, nanos)
        .map(Time)
        .map_err(|e| undecodable(field, format!("{seconds}s {nanos}ns is not a time: {e}")))
}

fn opt_time(field: &str, t: &Option<pb::Time>) -> R<Option<Time>> {
    t.as_ref()
        .map(|t| pb_time(field, t.seconds.unwrap_or(0), t.nanos.unwrap_or(0)))
        .transpose()
}

/// A `map<string, string>` entry: key and value.
fn entry<'a>(message: &'a [u8], field: &'static str) -> Result<(&'a str, &'a str), ReadError> {
    let (mut key, mut value) = ("", "");
    for f in read::fields(message) {
        let f = f?;
        match f.number {
            1 => key = f.str(field)?,
            2 => value = f.str(field)?,
            _ => {}
        }
    }
    Ok((key, value))
}

fn meta(message: &[u8]) -> R<Meta<'_>> {
    let mut m = Meta {
        annotations: Some(TriggerTime(None)),
        ..Meta::default()
    };
    let mut labels: SmallVec<[_; 8]> = SmallVec::new();
    for f in read::fields(message) {
        let f = f?;
        match f.number {
            1 => m.name = text(f, "metadata.name")?,
            3 => m.namespace = text(f, "metadata.namespace")?,
            5 => m.uid = text(f, "metadata.uid")?,
            6 => m.resource_version = text(f, "metadata.resourceVersion")?,
            8 => {
                m.creation_timestamp = Some(time(
                    "metadata.creationTimestamp",
                    f.bytes("metadata.creationTimestamp")?,
                )?)
            }
            11 => {
                let (k, v) = entry(f.bytes("metadata.labels")?, "metadata.labels")?;
                labels.push((intern(k), intern(v)));
            }
            12 => {
                let (k, v) = entry(f.bytes("metadata.annotations")?, "metadata.annotations")?;
                if k == ANNOTATION_LAST_CHANGE_TRIGGER_TIME {
                    m.annotations = Some(TriggerTime(Some(Text(Cow::Borrowed(v)))));
                }
            }
            _ => {}
        }
    }
    if !labels.is_empty() {
        m.labels = Some(WireLabels(labels.into_iter().collect()));
    }
    Ok(m)
}

impl FromPb for core::Service {
    fn wire(message: &[u8]) -> R<wire::Service<'_>> {
        let mut s = wire::Service {
            metadata: None,
            spec: None,
            status: None,
        };
        for f in read::fields(message) {
            let f = f?;
            match f.number {
                1 => s.metadata = Some(Obj(meta(f.bytes("metadata")?)?)),
                2 => s.spec = Some(Obj(service_spec(f.bytes("spec")?)?)),
                3 => s.status = Some(Obj(service_status(f.bytes("status")?)?)),
                _ => {}
            }
        }
        Ok(s)
    }
}

fn service_spec(message: &[u8]) -> R<wire::ServiceSpec<'_>> {
    let mut s = wire::ServiceSpec {
        type_: None,
        cluster_ip: None,
        cluster_ips: None,
        ip_families: None,
        ports: None,
        external_ips: None,
        session_affinity: None,
        session_affinity_config: None,
        load_balancer_source_ranges: None,
        internal_traffic_policy: None,
        external_traffic_policy: None,
        health_check_node_port: None,
        traffic_distribution: None,
    };
    let (mut ports, mut cluster_ips, mut ip_families) = (Vec::new(), Vec::new(), Vec::new());
    let (mut external_ips, mut ranges) = (Vec::new(), Vec::new());
    for f in read::fields(message) {
        let f = f?;
        match f.number {
            1 => ports.push(Obj(service_port(f.bytes("spec.ports")?)?)),
            3 => s.cluster_ip = text(f, "spec.clusterIP")?,
            4 => s.type_ = text(f, "spec.type")?,
            5 => push_text(&mut external_ips, f, "spec.externalIPs")?,
            7 => s.session_affinity = text(f, "spec.sessionAffinity")?,
            9 => push_text(&mut ranges, f, "spec.loadBalancerSourceRanges")?,
            11 => s.external_traffic_policy = text(f, "spec.externalTrafficPolicy")?,
            12 => s.health_check_node_port = Some(f.int32("spec.healthCheckNodePort")?),
            14 => {
                let mut client_ip = None;
                for f in read::fields(f.bytes("spec.sessionAffinityConfig")?) {
                    let f = f?;
                    if f.number != 1 {
                        continue;
                    }
                    let mut timeout_seconds = None;
                    for f in read::fields(f.bytes("spec.sessionAffinityConfig.clientIP")?) {
                        let f = f?;
                        if f.number == 1 {
                            timeout_seconds = Some(
                                f.int32("spec.sessionAffinityConfig.clientIP.timeoutSeconds")?,
                            );
                        }
                    }
                    client_ip = Some(Obj(wire::ClientIpConfig { timeout_seconds }));
                }
                s.session_affinity_config = Some(Obj(wire::SessionAffinityConfig { client_ip }));
            }
            18 => push_text(&mut cluster_ips, f, "spec.clusterIPs")?,
            19 => push_text(&mut ip_families, f, "spec.ipFamilies")?,
            22 => s.internal_traffic_policy = text(f, "spec.internalTrafficPolicy")?,
            23 => s.traffic_distribution = text(f, "spec.trafficDistribution")?,
            _ => {}
        }
    }
    s.ports = Some(ports);
    s.cluster_ips = texts(cluster_ips);
    s.ip_families = texts(ip_families);
    s.external_ips = texts(external_ips);
    s.load_balancer_source_ranges = texts(ranges);
    Ok(s)
}

fn service_port(message: &[u8]) -> R<wire::ServicePort<'_>> {
    let mut p = wire::ServicePort {
        name: None,
        protocol: None,
        port: None,
        node_port: None,
        target_port: None,
        app_protocol: None,
    };
    for f in read::fields(message) {
        let f = f?;
        match f.number {
            1 => p.name = text(f, "spec.ports.name")?,
            2 => p.protocol = text(f, "spec.ports.protocol")?,
            3 => p.port = Some(f.int32("spec.ports.port")?),
            4 => p.target_port = Some(int_or_string(f.bytes("spec.ports.targetPort")?)?),
            5 => p.node_port = Some(f.int32("spec.ports.nodePort")?),
            6 => p.app_protocol = text(f, "spec.ports.appProtocol")?,
            _ => {}
        }
    }
    Ok(p)
}

/// `util.intstr.IntOrString`: `type` 1 is the string, else the number.
fn int_or_string(message: &[u8]) -> Result<IntOrString, ReadError> {
    const FIELD: &str = "spec.ports.targetPort";
    let (mut kind, mut int_val, mut str_val) = (0, 0, "");
    for f in read::fields(message) {
        let f = f?;
        match f.number {
            1 => kind = f.int64(FIELD)?,
            2 => int_val = f.int32(FIELD)?,
            3 => str_val = f.str(FIELD)?,
            _ => {}
        }
    }
    Ok(match kind {
        1 => IntOrString::String(str_val.to_owned()),
        _ => IntOrString::Int(int_val),
    })
}

fn service_status(message: &[u8]) -> R<wire::ServiceStatus<'_>> {
    let mut load_balancer = None;
    for f in read::fields(message) {
        let f = f?;
        if f.number != 1 {
            continue;
        }
        let mut ingress = Vec::new();
        for f in read::fields(f.bytes("status.loadBalancer")?) {
            let f = f?;
            if f.number != 1 {
                continue;
            }
            let mut i = wire::LoadBalancerIngress {
                ip: None,
                ip_mode: None,
            };
            for f in read::fields(f.bytes("status.loadBalancer.ingress")?) {
                let f = f?;
                match f.number {
                    1 => i.ip = text(f, "status.loadBalancer.ingress.ip")?,
                    3 => i.ip_mode = text(f, "status.loadBalancer.ingress.ipMode")?,
                    _ => {}
                }
            }
            ingress.push(Obj(i));
        }
        load_balancer = Some(Obj(wire::LoadBalancerStatus {
            ingress: Some(ingress),
        }));
    }
    Ok(wire::ServiceStatus { load_balancer })
}

impl FromPb for discovery::EndpointSlice {
    fn wire(message: &[u8]) -> R<wire::EndpointSlice<'_>> {
        let mut s = wire::EndpointSlice {
            metadata: None,
            address_type: None,
            ports: None,
            endpoints: None,
        };
        let (mut endpoints, mut ports) = (Vec::new(), Vec::new());
        for f in read::fields(message) {
            let f = f?;
            match f.number {
                1 => s.metadata = Some(Obj(meta(f.bytes("metadata")?)?)),
                2 => endpoints.push(Obj(endpoint(f.bytes("endpoints")?)?)),
                3 => ports.push(Obj(endpoint_port(f.bytes("ports")?)?)),
                4 => s.address_type = text(f, "addressType")?,
                _ => {}
            }
        }
        s.endpoints = Some(endpoints);
        s.ports = Some(ports);
        Ok(s)
    }
}

fn endpoint(message: &[u8]) -> Result<wire::Endpoint<'_>, ReadError> {
    let mut e = wire::Endpoint {
        addresses: None,
        conditions: None,
        hints: None,
        hostname: None,
        node_name: None,
        zone: None,
        target_ref: None,
    };
    let mut addresses = Vec::with_capacity(1);
    for f in read::fields(message) {
        let f = f?;
        match f.number {
            1 => push_text(&mut addresses, f, "endpoints.addresses")?,
            2 => {
                let mut c = wire::EndpointConditions::default();
                for f in read::fields(f.bytes("endpoints.conditions")?) {
                    let f = f?;
                    let slot = match f.number {
                        1 => &mut c.ready,
                        2 => &mut c.serving,
                        3 => &mut c.terminating,
                        _ => continue,
                    };
                    *slot = Some(f.bool("endpoints.conditions")?);
                }
                e.conditions = Some(Obj(c));
            }
            3 => e.hostname = text(f, "endpoints.hostname")?,
            4 => {
                let mut r = wire::ObjectReference {
                    kind: None,
                    namespace: None,
                    name: None,
                    uid: None,
                };
                for f in read::fields(f.bytes("endpoints.targetRef")?) {
                    let f = f?;
                    let slot = match f.number {
                        1 => &mut r.kind,
                        2 => &mut r.namespace,
                        3 => &mut r.name,
                        4 => &mut r.uid,
                        _ => continue,
                    };
                    *slot = text(f, "endpoints.targetRef")?;
                }
                e.target_ref = Some(Obj(r));
            }
            6 => e.node_name = text(f, "endpoints.nodeName")?,
            7 => e.zone = text(f, "endpoints.zone")?,
            8 => {
                let (mut for_zones, mut for_nodes) = (Vec::new(), Vec::new());
                for f in read::fields(f.bytes("endpoints.hints")?) {
                    let f = f?;
                    let list = match f.number {
                        1 => &mut for_zones,
                        2 => &mut for_nodes,
                        _ => continue,
                    };
                    let mut name = None;
                    for f in read::fields(f.bytes("endpoints.hints")?) {
                        let f = f?;
                        if f.number == 1 {
                            name = text(f, "endpoints.hints.name")?;
                        }
                    }
                    list.push(Obj(wire::Named { name }));
                }
                e.hints = Some(Obj(wire::EndpointHints {
                    for_zones: Some(for_zones),
                    for_nodes: Some(for_nodes),
                }));
            }
            _ => {}
        }
    }
    e.addresses = Some(addresses);
    Ok(e)
}

fn endpoint_port(message: &[u8]) -> Result<wire::EndpointPort<'_>, ReadError> {
    let mut p = wire::EndpointPort {
        name: None,
        protocol: None,
        port: None,
        app_protocol: None,
    };
    for f in read::fields(message) {
        let f = f?;
        match f.number {
            1 => p.name = text(f, "ports.name")?,
            2 => p.protocol = text(f, "ports.protocol")?,
            3 => p.port = Some(f.int32("ports.port")?),
            4 => p.app_protocol = text(f, "ports.appProtocol")?,
            _ => {}
        }
    }
    Ok(p)
}

/// k8s-openapi's metadata, with the fields a Node or Pod is read for.
fn object_meta(m: &Option<pb::ObjectMeta>) -> R<ObjectMeta> {
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
    fn wire(message: &[u8]) -> R<core::Node> {
        let n: pb::Node = decode(message)?;
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
    fn wire(message: &[u8]) -> R<core::Pod> {
        let p: pb::Pod = decode(message)?;
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
