//! API objects (k8s-openapi types, or raw JSON/YAML documents) into the
//! validated model types. This is the one place where objects are checked;
//! an object that fails here never reaches the model.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::field::{field_path, Field};
use super::wire::{self, text, Meta, Obj, Text, ANNOTATION_LAST_CHANGE_TRIGGER_TIME};
use super::RejectReason;
use crate::model::intern::{intern, intern_opt, ArcStr};
use crate::model::{
    AddressType, ConditionStatus, Endpoint, EndpointHints, EndpointSlice, EndpointSlicePort,
    Labels, LoadBalancerIngress, Node, Object, ObjectKey, ObjectKind, ObjectRef, Pod, PodCondition,
    Protocol, Service, ServicePort, ServiceType, TargetPort, TargetRef, Timestamp, TrafficPolicy,
    Uid, DEFAULT_AFFINITY_TIMEOUT_SECONDS,
};
use crate::net::{parse_ip_sloppy, Cidr};

/// Annotation marking the mirror pod of a static pod.
pub const ANNOTATION_CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";

/// Why an object was rejected: the offending field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ObjectError {
    pub field: String,
    pub reason: String,
    /// The object does not even have the shape of its kind (a field of the
    /// wrong JSON type, which no API server would store), as opposed to a
    /// well-formed object with a value the proxy refuses.
    pub undecodable: bool,
}

impl ObjectError {
    /// The `reason` this rejection counts under on `/metrics`.
    pub fn reject_reason(&self) -> RejectReason {
        if self.undecodable {
            RejectReason::Undecodable
        } else {
            RejectReason::InvalidObject
        }
    }
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ObjectError {
    ObjectError {
        field: field.into(),
        reason: reason.into(),
        undecodable: false,
    }
}

/// Outcome of decoding one document.
#[derive(Debug)]
pub enum Decoded {
    Object(Box<Object>),
    /// A kind the proxy does not consume (Deployment, ConfigMap, ...).
    Ignored {
        api_version: String,
        kind: String,
    },
}

/// A kind the proxy reads, and how: what its JSON decodes into (`Wire`:
/// [`wire`]'s lean types for Services and EndpointSlices, k8s-openapi's
/// for Nodes and Pods) and how that becomes the model's object.
pub trait Project {
    type Wire<'de>: serde::Deserialize<'de>;

    /// The name, namespace and resourceVersion of a decoded object.
    fn head<'w>(wire: &'w Self::Wire<'_>) -> Head<'w>;

    /// The model's object, validated ([`service`], [`endpoint_slice`],
    /// [`node`], [`pod`]).
    fn project(wire: Self::Wire<'_>) -> Result<Object, ObjectError>;
}

/// A decoded object's `metadata.name`, `.namespace` and
/// `.resourceVersion`, as given.
pub struct Head<'w> {
    pub name: Option<&'w str>,
    pub namespace: Option<&'w str>,
    pub resource_version: Option<&'w str>,
}

impl Head<'_> {
    fn of_meta(m: &ObjectMeta) -> Head<'_> {
        Head {
            name: m.name.as_deref(),
            namespace: m.namespace.as_deref(),
            resource_version: m.resource_version.as_deref(),
        }
    }

    fn of_wire<'w>(m: Option<&'w Obj<Meta<'_>>>) -> Head<'w> {
        let m = m.map(|Obj(m)| m);
        Head {
            name: m.and_then(|m| m.name.as_deref()),
            namespace: m.and_then(|m| m.namespace.as_deref()),
            resource_version: m.and_then(|m| m.resource_version.as_deref()),
        }
    }
}

impl Project for core::Service {
    type Wire<'de> = wire::Service<'de>;

    fn head<'w>(w: &'w wire::Service<'_>) -> Head<'w> {
        Head::of_wire(w.metadata.as_ref())
    }

    fn project(w: wire::Service<'_>) -> Result<Object, ObjectError> {
        service(w).map(|s| Object::Service(Box::new(s)))
    }
}

impl Project for discovery::EndpointSlice {
    type Wire<'de> = wire::EndpointSlice<'de>;

    fn head<'w>(w: &'w wire::EndpointSlice<'_>) -> Head<'w> {
        Head::of_wire(w.metadata.as_ref())
    }

    fn project(w: wire::EndpointSlice<'_>) -> Result<Object, ObjectError> {
        endpoint_slice(w).map(Object::EndpointSlice)
    }
}

impl Project for core::Node {
    type Wire<'de> = core::Node;

    fn head<'w>(n: &'w core::Node) -> Head<'w> {
        Head::of_meta(&n.metadata)
    }

    fn project(n: core::Node) -> Result<Object, ObjectError> {
        node(n).map(Object::Node)
    }
}

impl Project for core::Pod {
    type Wire<'de> = core::Pod;

    fn head<'w>(p: &'w core::Pod) -> Head<'w> {
        Head::of_meta(&p.metadata)
    }

    fn project(p: core::Pod) -> Result<Object, ObjectError> {
        pod(p).map(Object::Pod)
    }
}

/// A `P` read from JSON (any deserializer: the text, a `Value`); an error
/// when it does not have the shape of `P`'s kind.
pub fn decode_wire<'de, P: Project, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<P::Wire<'de>, D::Error> {
    <Obj<P::Wire<'de>> as serde::Deserialize>::deserialize(d).map(|Obj(w)| w)
}

/// Decodes one JSON value holding a Service, EndpointSlice, Node or Pod.
/// `List` documents are expanded by the caller. The entry fuzz/ drives.
pub fn decode_object(value: serde_json::Value) -> Result<Decoded, ObjectError> {
    let api_version = str_field(&value, "apiVersion")?;
    let kind = str_field(&value, "kind")?;
    fn typed<P: Project>(v: &serde_json::Value) -> Result<Object, ObjectError> {
        let mut track = serde_path_to_error::Track::new();
        let wire = decode_wire::<P, _>(serde_path_to_error::Deserializer::new(v, &mut track))
            .map_err(|e| {
                // The field of the wrong type (`spec.ports[0].port`); the
                // object itself when it is not one.
                let path = field_path(&track.path());
                let field = if path.is_empty() {
                    "object".to_owned()
                } else {
                    path
                };
                ObjectError {
                    undecodable: true,
                    ..invalid(field, e.to_string())
                }
            })?;
        P::project(wire)
    }
    struct FromValue<'v>(&'v serde_json::Value);
    impl ForKind for FromValue<'_> {
        type Out = Result<Object, ObjectError>;
        fn run<P: Project>(self) -> Self::Out {
            typed::<P>(self.0)
        }
    }
    match for_kind(&api_version, &kind, FromValue(&value)) {
        Some(object) => Ok(Decoded::Object(Box::new(object?))),
        None if matches!(kind.as_str(), "Service" | "EndpointSlice" | "Node" | "Pod") => {
            Err(invalid(
                "apiVersion",
                format!("{api_version:?} is not supported for kind {kind}"),
            ))
        }
        None => Ok(Decoded::Ignored { api_version, kind }),
    }
}

/// Something done with the [`Project`] type of an object's kind: what
/// [`for_kind`] runs once it knows the type.
pub trait ForKind {
    type Out;
    fn run<P: Project>(self) -> Self::Out;
}

/// `f` run with the [`Project`] type that `apiVersion` and `kind` name;
/// `None` for a kind, or a version of it, that the proxy does not read.
/// The one place that maps the two strings to a type.
pub fn for_kind<F: ForKind>(api_version: &str, kind: &str, f: F) -> Option<F::Out> {
    Some(match (api_version, kind) {
        ("v1", "Service") => f.run::<core::Service>(),
        ("discovery.k8s.io/v1", "EndpointSlice") => f.run::<discovery::EndpointSlice>(),
        ("v1", "Node") => f.run::<core::Node>(),
        ("v1", "Pod") => f.run::<core::Pod>(),
        _ => return None,
    })
}

/// The kind, namespace and name of a raw object of `kind`, keyed as the
/// model keys the validated object (a missing namespace is `default`, a
/// Node has none): all a delete needs, whatever the rest of the object
/// holds.
pub fn object_ref(kind: ObjectKind, value: &serde_json::Value) -> Result<ObjectRef, ObjectError> {
    let text = |p: &str| value.pointer(p).and_then(serde_json::Value::as_str);
    object_ref_of(kind, text("/metadata/name"), text("/metadata/namespace"))
}

/// [`object_ref`] of a typed object's name and namespace.
pub fn object_ref_of(
    kind: ObjectKind,
    name: Option<&str>,
    namespace: Option<&str>,
) -> Result<ObjectRef, ObjectError> {
    fn present(s: Option<&str>) -> Option<&str> {
        s.filter(|s| !s.is_empty())
    }
    let name = present(name).ok_or_else(|| invalid("metadata.name", "is required"))?;
    let namespace = match kind {
        ObjectKind::Node => "",
        ObjectKind::Service | ObjectKind::EndpointSlice | ObjectKind::Pod => {
            present(namespace).unwrap_or("default")
        }
    };
    Ok(ObjectRef {
        kind,
        key: ObjectKey::new(namespace, name),
    })
}

fn str_field(value: &serde_json::Value, name: &str) -> Result<String, ObjectError> {
    match value.get(name) {
        Some(serde_json::Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(_) => Err(invalid(name, "must be a non-empty string")),
        None => Err(invalid(name, "is required")),
    }
}

fn key(name: Option<&str>, namespace: Option<&str>) -> Result<ObjectKey, ObjectError> {
    let name = name
        .filter(|n| !n.is_empty())
        .ok_or_else(|| invalid("metadata.name", "is required"))?;
    let namespace = namespace.filter(|n| !n.is_empty()).unwrap_or("default");
    Ok(ObjectKey::new(namespace, name))
}

fn parse_ip(field: Field, s: &str) -> Result<IpAddr, ObjectError> {
    ip_or_reason(s).map_err(|reason| invalid(field, reason))
}

/// Read as kube-proxy reads it (leading zeros are decimal), in canonical
/// form from here on.
fn ip_or_reason(s: &str) -> Result<IpAddr, String> {
    parse_ip_sloppy(s.trim()).ok_or_else(|| format!("{s:?} is not a valid IP address"))
}

/// `prev` when it holds `s` (the pods of a slice share their kind and
/// namespace: one comparison instead of a pool lookup), else `s` interned.
fn intern_like(prev: Option<&ArcStr>, s: &str) -> ArcStr {
    match prev {
        Some(p) if p.as_str() == s => p.clone(),
        _ => intern(s),
    }
}

fn protocol(field: Field, p: Option<&str>) -> Result<Protocol, ObjectError> {
    match p.unwrap_or("TCP") {
        "TCP" => Ok(Protocol::Tcp),
        "UDP" => Ok(Protocol::Udp),
        "SCTP" => Ok(Protocol::Sctp),
        other => Err(invalid(
            field,
            format!("unsupported protocol {other:?} (TCP, UDP or SCTP)"),
        )),
    }
}

fn port_number(field: Field, n: i32, allow_zero: bool) -> Result<u16, ObjectError> {
    let min = if allow_zero { 0 } else { 1 };
    if (min..=65535).contains(&n) {
        // In range, so the conversion cannot fail.
        Ok(u16::try_from(n).unwrap_or_default())
    } else {
        Err(invalid(field, format!("{n} is not a valid port number")))
    }
}

fn traffic_policy(field: Field, p: Option<&str>) -> Result<TrafficPolicy, ObjectError> {
    match p {
        None | Some("") | Some("Cluster") => Ok(TrafficPolicy::Cluster),
        Some("Local") => Ok(TrafficPolicy::Local),
        Some(other) => Err(invalid(
            field,
            format!("{other:?} is not a traffic policy (Cluster or Local)"),
        )),
    }
}

/// The CIDR in canonical form (`010.0.0.0/8` is `10.0.0.0/8`, as
/// kube-proxy reads it).
fn validate_cidr(field: Field, cidr: &str) -> Result<String, ObjectError> {
    cidr.parse::<Cidr>()
        .map(|c| c.to_string())
        .map_err(|reason| invalid(field, reason))
}

/// Labels with their keys and values shared (both repeat across objects).
fn labels_of(labels: Option<BTreeMap<String, String>>) -> Labels {
    labels
        .into_iter()
        .flatten()
        .map(|(k, v)| (intern(&k), intern(&v)))
        .collect()
}

fn timestamp(t: &Time) -> Timestamp {
    Timestamp {
        seconds: t.0.as_second(),
        nanos: t.0.subsec_nanosecond(),
    }
}

/// The labels read with an object's metadata.
fn labels(labels: Option<wire::WireLabels>) -> Labels {
    labels.map(|l| l.0).unwrap_or_default()
}

pub fn service(svc: wire::Service<'_>) -> Result<Service, ObjectError> {
    let meta = Meta::of(svc.metadata);
    let key = key(meta.name.as_deref(), meta.namespace.as_deref())?;
    let Obj(spec) = svc
        .spec
        .ok_or_else(|| invalid("spec", "is required for a Service"))?;
    let service_type = match spec.type_.as_deref() {
        None | Some("") | Some("ClusterIP") => ServiceType::ClusterIp,
        Some("NodePort") => ServiceType::NodePort,
        Some("LoadBalancer") => ServiceType::LoadBalancer,
        Some("ExternalName") => ServiceType::ExternalName,
        Some(other) => {
            return Err(invalid(
                "spec.type",
                format!("unknown service type {other:?}"),
            ))
        }
    };

    let raw_cluster_ips: &[Text<'_>] = match (&spec.cluster_ips, &spec.cluster_ip) {
        (Some(ips), _) if !ips.is_empty() => ips,
        (_, Some(ip)) => std::slice::from_ref(ip),
        _ => &[],
    };
    // Sized as given: one or two addresses, not the four a first push
    // reserves (50,000 services).
    let mut cluster_ips = Vec::with_capacity(raw_cluster_ips.len());
    for (i, ip) in raw_cluster_ips.iter().enumerate() {
        if ip.is_empty() || &**ip == "None" {
            continue;
        }
        cluster_ips.push(parse_ip(Field::item("spec.clusterIPs", i, ""), ip)?);
    }
    if cluster_ips.len() > 2
        || (cluster_ips.len() == 2 && cluster_ips[0].is_ipv4() == cluster_ips[1].is_ipv4())
    {
        return Err(invalid(
            "spec.clusterIPs",
            "at most one address per IP family",
        ));
    }
    // As the API server checks: clusterIPs[i] is of family ipFamilies[i].
    for (i, family) in spec.ip_families.iter().flatten().enumerate() {
        let family: &str = family;
        let v4 = match family {
            "IPv4" => true,
            "IPv6" => false,
            other => {
                return Err(invalid(
                    Field::item("spec.ipFamilies", i, ""),
                    format!("{other:?} is not IPv4 or IPv6"),
                ))
            }
        };
        if let Some(ip) = cluster_ips.get(i).filter(|ip| ip.is_ipv4() != v4) {
            return Err(invalid(
                format!("spec.clusterIPs[{i}]"),
                format!("{ip} is not of family {family} (spec.ipFamilies[{i}])"),
            ));
        }
    }

    let spec_ports = spec.ports.unwrap_or_default();
    let mut ports = Vec::with_capacity(spec_ports.len());
    let mut seen = std::collections::BTreeSet::new();
    for (i, Obj(p)) in spec_ports.into_iter().enumerate() {
        let field = |rest| Field::item("spec.ports", i, rest);
        let protocol = protocol(field(".protocol"), p.protocol.as_deref())?;
        let port = port_number(field(".port"), p.port.unwrap_or(0), false)?;
        let node_port = port_number(field(".nodePort"), p.node_port.unwrap_or(0), true)?;
        let target_port = match p.target_port {
            None => TargetPort::Number(port),
            Some(IntOrString::Int(n)) => {
                TargetPort::Number(port_number(field(".targetPort"), n, false)?)
            }
            Some(IntOrString::String(s)) => match s.parse::<i32>() {
                Ok(n) => TargetPort::Number(port_number(field(".targetPort"), n, false)?),
                Err(_) if !s.is_empty() => TargetPort::Name(intern(&s)),
                Err(_) => TargetPort::Number(port),
            },
        };
        let name = intern(text(&p.name));
        if !seen.insert((name.clone(), protocol)) {
            return Err(invalid(
                field(".name"),
                format!("duplicate port {name:?}/{protocol}"),
            ));
        }
        ports.push(ServicePort {
            name,
            protocol,
            port,
            node_port,
            target_port,
            app_protocol: p.app_protocol.as_deref().map(intern),
        });
    }

    let mut external_ips = Vec::new();
    for (i, ip) in spec.external_ips.unwrap_or_default().iter().enumerate() {
        external_ips.push(parse_ip(Field::item("spec.externalIPs", i, ""), ip)?);
    }

    let mut load_balancer_ingress = Vec::new();
    let ingress = svc
        .status
        .and_then(|Obj(s)| s.load_balancer)
        .and_then(|Obj(lb)| lb.ingress)
        .unwrap_or_default();
    for (i, Obj(ing)) in ingress.iter().enumerate() {
        let Some(ip) = ing.ip.as_deref().filter(|s| !s.is_empty()) else {
            continue; // hostname-only ingress: nothing to program
        };
        let field = |rest| Field::item("status.loadBalancer.ingress", i, rest);
        let ip_mode_proxy = match ing.ip_mode.as_deref() {
            None | Some("") | Some("VIP") => false,
            Some("Proxy") => true,
            Some(other) => {
                return Err(invalid(
                    field(".ipMode"),
                    format!("{other:?} is not VIP or Proxy"),
                ))
            }
        };
        load_balancer_ingress.push(LoadBalancerIngress {
            ip: parse_ip(field(".ip"), ip)?,
            ip_mode_proxy,
        });
    }

    let session_affinity_timeout = match spec.session_affinity.as_deref() {
        None | Some("") | Some("None") => None,
        Some("ClientIP") => {
            let timeout = spec
                .session_affinity_config
                .and_then(|Obj(c)| c.client_ip)
                .and_then(|Obj(c)| c.timeout_seconds);
            match timeout {
                None => Some(DEFAULT_AFFINITY_TIMEOUT_SECONDS),
                Some(t) if (1..=86400).contains(&t) => Some(t.unsigned_abs()),
                Some(t) => {
                    return Err(invalid(
                        "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                        format!("{t} is outside 1..=86400"),
                    ))
                }
            }
        }
        Some(other) => {
            return Err(invalid(
                "spec.sessionAffinity",
                format!("{other:?} is not None or ClientIP"),
            ))
        }
    };

    let mut load_balancer_source_ranges = Vec::new();
    for (i, c) in spec
        .load_balancer_source_ranges
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        load_balancer_source_ranges.push(validate_cidr(
            Field::item("spec.loadBalancerSourceRanges", i, ""),
            c,
        )?);
    }

    Ok(Service {
        key,
        uid: meta.uid.as_deref().map(ArcStr::from).unwrap_or_default(),
        labels: labels(meta.labels),
        created: meta.creation_timestamp.as_ref().map(|t| t.0.as_second()),
        service_type,
        cluster_ips,
        external_ips,
        load_balancer_ingress,
        ports,
        internal_traffic_policy: traffic_policy(
            Field::Path("spec.internalTrafficPolicy"),
            spec.internal_traffic_policy.as_deref(),
        )?,
        external_traffic_policy: traffic_policy(
            Field::Path("spec.externalTrafficPolicy"),
            spec.external_traffic_policy.as_deref(),
        )?,
        session_affinity_timeout,
        health_check_node_port: port_number(
            Field::Path("spec.healthCheckNodePort"),
            spec.health_check_node_port.unwrap_or(0),
            true,
        )?,
        traffic_distribution: spec
            .traffic_distribution
            .filter(|s| !s.is_empty())
            .map(|s| intern(&s)),
        load_balancer_source_ranges,
    })
}

pub fn endpoint_slice(slice: wire::EndpointSlice<'_>) -> Result<EndpointSlice, ObjectError> {
    let meta = Meta::of(slice.metadata);
    let key = key(meta.name.as_deref(), meta.namespace.as_deref())?;
    let address_type_text = text(&slice.address_type);
    let address_type = match address_type_text {
        "IPv4" => AddressType::Ipv4,
        "IPv6" => AddressType::Ipv6,
        "FQDN" => AddressType::Fqdn,
        other => {
            return Err(invalid(
                "addressType",
                format!("{other:?} is not IPv4, IPv6 or FQDN"),
            ))
        }
    };
    let slice_ports = slice.ports.unwrap_or_default();
    let mut ports = Vec::with_capacity(slice_ports.len());
    for (i, Obj(p)) in slice_ports.into_iter().enumerate() {
        let field = |rest| Field::item("ports", i, rest);
        ports.push(EndpointSlicePort {
            name: intern(text(&p.name)),
            protocol: protocol(field(".protocol"), p.protocol.as_deref())?,
            port: p
                .port
                .map(|n| port_number(field(".port"), n, false))
                .transpose()?,
            app_protocol: p.app_protocol.map(|t| t.0.into_owned()),
        });
    }
    let mut endpoints = Vec::new();
    if address_type != AddressType::Fqdn {
        let slice_endpoints = slice.endpoints.unwrap_or_default();
        endpoints.reserve_exact(slice_endpoints.len());
        // The previous endpoint's pod reference, whose strings the next
        // one most likely repeats.
        let mut prev_ref: Option<TargetRef> = None;
        for (i, Obj(ep)) in slice_endpoints.into_iter().enumerate() {
            let field = |rest| Field::item("endpoints", i, rest);
            let first = ep
                .addresses
                .as_deref()
                .unwrap_or_default()
                .first()
                .ok_or_else(|| invalid(field(".addresses"), "must not be empty"))?;
            let ip = ip_or_reason(first).map_err(|r| invalid(field(".addresses[0]"), r))?;
            if ip.is_ipv4() != (address_type == AddressType::Ipv4) {
                return Err(invalid(
                    field(".addresses[0]"),
                    format!("{ip} does not match addressType {address_type_text}"),
                ));
            }
            let conditions = ep.conditions.map(|Obj(c)| c).unwrap_or_default();
            let hints = ep.hints.map(|Obj(h)| EndpointHints {
                for_zones: h
                    .for_zones
                    .iter()
                    .flatten()
                    .map(|Obj(z)| intern(text(&z.name)))
                    .collect(),
                for_nodes: h
                    .for_nodes
                    .iter()
                    .flatten()
                    .map(|Obj(n)| intern(text(&n.name)))
                    .collect(),
            });
            endpoints.push(Endpoint {
                ip,
                ready: conditions.ready,
                serving: conditions.serving,
                terminating: conditions.terminating,
                hostname: intern_opt(ep.hostname.as_deref()),
                node_name: intern_opt(ep.node_name.as_deref()),
                zone: intern_opt(ep.zone.as_deref()),
                hints: hints
                    .filter(|h| !h.for_zones.is_empty() || !h.for_nodes.is_empty())
                    .map(Arc::new),
                target_ref: ep.target_ref.map(|Obj(r)| {
                    let prev = prev_ref.as_ref();
                    let r = TargetRef::new(
                        intern_like(prev.map(TargetRef::kind), text(&r.kind)),
                        intern_like(prev.map(TargetRef::namespace), text(&r.namespace)),
                        text(&r.name),
                        Uid::new(text(&r.uid)),
                    );
                    prev_ref = Some(r.clone());
                    r
                }),
            });
        }
    }
    let trigger_time = meta.annotations.and_then(|t| t.0);
    let last_change_trigger_time = match trigger_time.as_deref() {
        None => None,
        Some(t) => Some(parse_rfc3339(t).ok_or_else(|| {
            invalid(
                format!("metadata.annotations[{ANNOTATION_LAST_CHANGE_TRIGGER_TIME}]"),
                format!("{t:?} is not an RFC 3339 time"),
            )
        })?),
    };
    Ok(EndpointSlice {
        key,
        labels: labels(meta.labels),
        address_type,
        ports,
        endpoints,
        last_change_trigger_time,
    })
}

fn parse_rfc3339(s: &str) -> Option<Timestamp> {
    let t: jiff::Timestamp = s.parse().ok()?;
    Some(Timestamp {
        seconds: t.as_second(),
        nanos: t.subsec_nanosecond(),
    })
}

pub fn node(node: core::Node) -> Result<Node, ObjectError> {
    let name = node
        .metadata
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| invalid("metadata.name", "is required"))?;
    let mut addresses = Vec::new();
    let status_addresses = node.status.and_then(|s| s.addresses).unwrap_or_default();
    for (i, a) in status_addresses.iter().enumerate() {
        if a.type_ == "InternalIP" || a.type_ == "ExternalIP" {
            addresses.push(parse_ip(
                Field::item("status.addresses", i, ".address"),
                &a.address,
            )?);
        }
    }
    Ok(Node {
        name,
        labels: labels_of(node.metadata.labels),
        deleting: node.metadata.deletion_timestamp.is_some(),
        taint_keys: node
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .map(|t| t.key)
            .collect(),
        addresses,
    })
}

pub fn pod(pod: core::Pod) -> Result<Pod, ObjectError> {
    let key = key(
        pod.metadata.name.as_deref(),
        pod.metadata.namespace.as_deref(),
    )?;
    let annotations: BTreeMap<String, String> = pod.metadata.annotations.unwrap_or_default();
    let mut conditions = Vec::new();
    let status_conditions = pod.status.and_then(|s| s.conditions).unwrap_or_default();
    for (i, c) in status_conditions.into_iter().enumerate() {
        let status = match c.status.as_str() {
            "True" => ConditionStatus::True,
            "False" => ConditionStatus::False,
            "Unknown" => ConditionStatus::Unknown,
            other => {
                return Err(invalid(
                    format!("status.conditions[{i}].status"),
                    format!("{other:?} is not True, False or Unknown"),
                ))
            }
        };
        conditions.push(PodCondition {
            condition_type: c.type_,
            status,
            last_probe_time: c.last_probe_time.as_ref().map(timestamp),
            last_transition_time: c.last_transition_time.as_ref().map(timestamp),
            reason: c.reason.unwrap_or_default(),
            message: c.message.unwrap_or_default(),
        });
    }
    Ok(Pod {
        key,
        uid: pod.metadata.uid.unwrap_or_default(),
        node_name: pod.spec.and_then(|s| s.node_name).filter(|n| !n.is_empty()),
        static_pod: annotations.contains_key(ANNOTATION_CONFIG_MIRROR),
        conditions,
        deletion_timestamp: pod.metadata.deletion_timestamp.as_ref().map(timestamp),
    })
}

#[cfg(test)]
#[path = "objects_tests.rs"]
mod tests;
