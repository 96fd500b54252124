//! The Kubernetes API's protobuf encoding (`application/vnd.kubernetes.protobuf`),
//! for the objects the proxy reads: Services, EndpointSlices, Nodes and
//! Pods, their lists, watch events and `Status`.
//!
//! Written by hand, and only the fields the proxy reads, with the field
//! numbers of the upstream `generated.proto` files (k8s.io/api core/v1 and
//! discovery/v1, k8s.io/apimachinery meta/v1, runtime and util/intstr).
//! Every other field of the upstream messages is skipped when decoding
//! (prost skips unknown fields), so an API server of any version decodes.
//! The upstream messages are proto2: a scalar field is `optional` (its
//! presence is kept), as in the JSON, where a field may be missing.
//!
//! Why not the k8s-pb crate (0.8.0, the kube-rs organisation's, prost 0.14
//! as here)? Measured on this 2-core machine (2026-11-28, a scratch crate,
//! niced beside other builds): k8s-pb alone, one unit that cannot be
//! split across cores, took 39 s to compile in dev and 74 s in release
//! (37k lines of generated messages for every API group), on every clean
//! build of the daemon, its tests and its benches. And decoding into its
//! complete messages allocates every field of an object (managed fields,
//! annotations, container specs, status) that the proxy then drops. These
//! messages add about a second to the build and decode only what is read.
//! The kube source reads the two kinds that grow with the cluster,
//! Services and EndpointSlices, in place with [`read`] (no allocation per
//! string); these messages encode them (the fake API server) and decode
//! the rest (Nodes, Pods, lists, watch events, `Status`).
//!
//! Wire format of a response (`k8s.io/apimachinery/pkg/runtime/serializer/protobuf`):
//! the four bytes [`MAGIC`] and then a [`Unknown`] whose `raw` is the
//! object (or list) message and whose `type_meta` names its kind. A watch
//! (`application/vnd.kubernetes.protobuf;stream=watch`) is a sequence of
//! frames, each a 4-byte big-endian length and a [`WatchEvent`] without
//! the envelope; the event's object is itself enveloped.

use std::collections::BTreeMap;

use prost::bytes::Bytes;

pub mod read;

/// The content type of the protobuf encoding.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The first four bytes of every enveloped message: `k8s\0`.
pub const MAGIC: [u8; 4] = *b"k8s\0";

/// A message of optional strings only: `field = "tag"`.
macro_rules! strings {
    ($(#[$doc:meta])* $name:ident { $($field:ident = $tag:tt),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct $name {
            $(
                #[prost(string, optional, tag = $tag)]
                pub $field: Option<String>,
            )*
        }
    };
}

/// `runtime.Unknown`: the envelope.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Unknown {
    #[prost(message, optional, tag = "1")]
    pub type_meta: Option<TypeMeta>,
    #[prost(bytes = "bytes", optional, tag = "2")]
    pub raw: Option<Bytes>,
    #[prost(string, optional, tag = "3")]
    pub content_encoding: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub content_type: Option<String>,
}

strings!(
    /// `runtime.TypeMeta`.
    TypeMeta {
        api_version = "1",
        kind = "2",
    }
);

/// Why an envelope could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvelopeError {
    /// The bytes do not start with [`MAGIC`].
    NoMagic,
    /// The envelope is not a `runtime.Unknown`.
    Decode(String),
    /// The envelope has no `raw`.
    Empty,
    /// A `contentEncoding` (such as gzip) no client asks for.
    Encoded(String),
}

impl std::fmt::Display for EnvelopeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvelopeError::NoMagic => f.write_str("does not start with the protobuf magic k8s\\0"),
            EnvelopeError::Decode(e) => write!(f, "envelope: {e}"),
            EnvelopeError::Empty => f.write_str("envelope holds no object"),
            EnvelopeError::Encoded(e) => {
                write!(f, "envelope content encoding {e:?} is not supported")
            }
        }
    }
}

impl std::error::Error for EnvelopeError {}

/// An envelope opened: the kind it names and the message it holds.
#[derive(Debug, Clone)]
pub struct Opened {
    pub api_version: String,
    pub kind: String,
    pub raw: Bytes,
}

/// Opens an envelope (`raw` borrows from `bytes`).
pub fn open(bytes: &Bytes) -> Result<Opened, EnvelopeError> {
    let rest = bytes
        .strip_prefix(&MAGIC[..])
        .ok_or(EnvelopeError::NoMagic)?;
    let body = bytes.slice(bytes.len() - rest.len()..);
    let u = <Unknown as prost::Message>::decode(body)
        .map_err(|e| EnvelopeError::Decode(e.to_string()))?;
    if let Some(enc) = u.content_encoding.filter(|e| !e.is_empty()) {
        return Err(EnvelopeError::Encoded(enc));
    }
    let tm = u.type_meta.unwrap_or_default();
    Ok(Opened {
        api_version: tm.api_version.unwrap_or_default(),
        kind: tm.kind.unwrap_or_default(),
        raw: u.raw.ok_or(EnvelopeError::Empty)?,
    })
}

/// `message` in an envelope naming `api_version` and `kind`.
pub fn enveloped(api_version: &str, kind: &str, message: &[u8]) -> Vec<u8> {
    let u = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.to_owned()),
            kind: Some(kind.to_owned()),
        }),
        raw: Some(Bytes::copy_from_slice(message)),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut out = Vec::with_capacity(message.len() + 64);
    out.extend_from_slice(&MAGIC);
    prost::Message::encode(&u, &mut out).expect("a Vec grows as needed");
    out
}

/// Any list (`ServiceList`, `EndpointSliceList`, ...): its items kept as
/// the bytes of their messages, read later one by one.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawList {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ListMeta>,
    #[prost(bytes = "bytes", repeated, tag = "2")]
    pub items: Vec<Bytes>,
}

/// `meta.v1.ListMeta`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListMeta {
    #[prost(string, optional, tag = "2")]
    pub resource_version: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub r#continue: Option<String>,
    #[prost(int64, optional, tag = "4")]
    pub remaining_item_count: Option<i64>,
}

/// `meta.v1.WatchEvent` (a watch frame, not enveloped).
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchEvent {
    #[prost(string, optional, tag = "1")]
    pub r#type: Option<String>,
    #[prost(message, optional, tag = "2")]
    pub object: Option<RawExtension>,
}

/// `runtime.RawExtension`: an enveloped object.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawExtension {
    #[prost(bytes = "bytes", optional, tag = "1")]
    pub raw: Option<Bytes>,
}

/// `meta.v1.Status`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ListMeta>,
    #[prost(string, optional, tag = "2")]
    pub status: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub message: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub reason: Option<String>,
    #[prost(int32, optional, tag = "6")]
    pub code: Option<i32>,
}

/// An object's name, namespace and resourceVersion, read without the rest.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ObjectHead {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<MetaHead>,
}

strings!(
    MetaHead {
        name = "1",
        namespace = "3",
        resource_version = "6",
    }
);

/// `meta.v1.ObjectMeta`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ObjectMeta {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub namespace: Option<String>,
    #[prost(string, optional, tag = "5")]
    pub uid: Option<String>,
    #[prost(string, optional, tag = "6")]
    pub resource_version: Option<String>,
    #[prost(message, optional, tag = "8")]
    pub creation_timestamp: Option<Time>,
    #[prost(message, optional, tag = "9")]
    pub deletion_timestamp: Option<Time>,
    #[prost(btree_map = "string, string", tag = "11")]
    pub labels: BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    pub annotations: BTreeMap<String, String>,
}

/// `meta.v1.Time`: seconds and nanoseconds since the epoch.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Time {
    #[prost(int64, optional, tag = "1")]
    pub seconds: Option<i64>,
    #[prost(int32, optional, tag = "2")]
    pub nanos: Option<i32>,
}

/// `util.intstr.IntOrString`: `type` 0 is `int_val`, 1 is `str_val`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IntOrString {
    #[prost(int64, optional, tag = "1")]
    pub r#type: Option<i64>,
    #[prost(int32, optional, tag = "2")]
    pub int_val: Option<i32>,
    #[prost(string, optional, tag = "3")]
    pub str_val: Option<String>,
}

/// An API object of the shape metadata, spec, status (fields 1, 2, 3 of
/// `core.v1.Service`, `Node` and `Pod` alike).
macro_rules! object {
    ($(#[$doc:meta])* $name:ident, $spec:ident, $status:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct $name {
            #[prost(message, optional, tag = "1")]
            pub metadata: Option<ObjectMeta>,
            #[prost(message, optional, tag = "2")]
            pub spec: Option<$spec>,
            #[prost(message, optional, tag = "3")]
            pub status: Option<$status>,
        }
    };
}

object!(
    /// `core.v1.Service`.
    Service, ServiceSpec, ServiceStatus
);

#[derive(Clone, PartialEq, prost::Message)]
pub struct ServiceSpec {
    #[prost(message, repeated, tag = "1")]
    pub ports: Vec<ServicePort>,
    #[prost(string, optional, tag = "3")]
    pub cluster_ip: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub r#type: Option<String>,
    #[prost(string, repeated, tag = "5")]
    pub external_ips: Vec<String>,
    #[prost(string, optional, tag = "7")]
    pub session_affinity: Option<String>,
    #[prost(string, repeated, tag = "9")]
    pub load_balancer_source_ranges: Vec<String>,
    #[prost(string, optional, tag = "11")]
    pub external_traffic_policy: Option<String>,
    #[prost(int32, optional, tag = "12")]
    pub health_check_node_port: Option<i32>,
    #[prost(message, optional, tag = "14")]
    pub session_affinity_config: Option<SessionAffinityConfig>,
    #[prost(string, repeated, tag = "18")]
    pub cluster_ips: Vec<String>,
    #[prost(string, repeated, tag = "19")]
    pub ip_families: Vec<String>,
    #[prost(string, optional, tag = "22")]
    pub internal_traffic_policy: Option<String>,
    #[prost(string, optional, tag = "23")]
    pub traffic_distribution: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ServicePort {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub protocol: Option<String>,
    #[prost(int32, optional, tag = "3")]
    pub port: Option<i32>,
    #[prost(message, optional, tag = "4")]
    pub target_port: Option<IntOrString>,
    #[prost(int32, optional, tag = "5")]
    pub node_port: Option<i32>,
    #[prost(string, optional, tag = "6")]
    pub app_protocol: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SessionAffinityConfig {
    #[prost(message, optional, tag = "1")]
    pub client_ip: Option<ClientIpConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ClientIpConfig {
    #[prost(int32, optional, tag = "1")]
    pub timeout_seconds: Option<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ServiceStatus {
    #[prost(message, optional, tag = "1")]
    pub load_balancer: Option<LoadBalancerStatus>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LoadBalancerStatus {
    #[prost(message, repeated, tag = "1")]
    pub ingress: Vec<LoadBalancerIngress>,
}

strings!(
    LoadBalancerIngress {
        ip = "1",
        ip_mode = "3",
    }
);

/// `discovery.v1.EndpointSlice`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EndpointSlice {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    #[prost(message, repeated, tag = "2")]
    pub endpoints: Vec<Endpoint>,
    #[prost(message, repeated, tag = "3")]
    pub ports: Vec<EndpointPort>,
    #[prost(string, optional, tag = "4")]
    pub address_type: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Endpoint {
    #[prost(string, repeated, tag = "1")]
    pub addresses: Vec<String>,
    #[prost(message, optional, tag = "2")]
    pub conditions: Option<EndpointConditions>,
    #[prost(string, optional, tag = "3")]
    pub hostname: Option<String>,
    #[prost(message, optional, tag = "4")]
    pub target_ref: Option<ObjectReference>,
    #[prost(string, optional, tag = "6")]
    pub node_name: Option<String>,
    #[prost(string, optional, tag = "7")]
    pub zone: Option<String>,
    #[prost(message, optional, tag = "8")]
    pub hints: Option<EndpointHints>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct EndpointConditions {
    #[prost(bool, optional, tag = "1")]
    pub ready: Option<bool>,
    #[prost(bool, optional, tag = "2")]
    pub serving: Option<bool>,
    #[prost(bool, optional, tag = "3")]
    pub terminating: Option<bool>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct EndpointHints {
    #[prost(message, repeated, tag = "1")]
    pub for_zones: Vec<Named>,
    #[prost(message, repeated, tag = "2")]
    pub for_nodes: Vec<Named>,
}

strings!(
    /// `ForZone` and `ForNode`: a name.
    Named {
        name = "1",
    }
);

strings!(
    /// `core.v1.ObjectReference`.
    ObjectReference {
        kind = "1",
        namespace = "2",
        name = "3",
        uid = "4",
    }
);

#[derive(Clone, PartialEq, prost::Message)]
pub struct EndpointPort {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub protocol: Option<String>,
    #[prost(int32, optional, tag = "3")]
    pub port: Option<i32>,
    #[prost(string, optional, tag = "4")]
    pub app_protocol: Option<String>,
}

object!(
    /// `core.v1.Node`.
    Node, NodeSpec, NodeStatus
);

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeSpec {
    #[prost(message, repeated, tag = "5")]
    pub taints: Vec<Taint>,
}

strings!(
    Taint {
        key = "1",
        effect = "3",
    }
);

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeStatus {
    #[prost(message, repeated, tag = "5")]
    pub addresses: Vec<NodeAddress>,
}

strings!(
    NodeAddress {
        r#type = "1",
        address = "2",
    }
);

object!(
    /// `core.v1.Pod`.
    Pod, PodSpec, PodStatus
);

strings!(
    PodSpec {
        node_name = "10",
    }
);

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodStatus {
    #[prost(message, repeated, tag = "2")]
    pub conditions: Vec<PodCondition>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodCondition {
    #[prost(string, optional, tag = "1")]
    pub r#type: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub status: Option<String>,
    #[prost(message, optional, tag = "3")]
    pub last_probe_time: Option<Time>,
    #[prost(message, optional, tag = "4")]
    pub last_transition_time: Option<Time>,
    #[prost(string, optional, tag = "5")]
    pub reason: Option<String>,
    #[prost(string, optional, tag = "6")]
    pub message: Option<String>,
}
