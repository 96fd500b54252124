//! Typed view of the API objects the proxy consumes. Sources parse and
//! validate manifests / watch events into these types once, at the edge;
//! nothing downstream re-validates.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use super::intern::ArcStr;
use super::target_ref::TargetRef;

/// Namespace and name of a namespaced object; orders like kube-proxy's
/// `NamespacedName` (namespace first).
///
/// Both are shared strings: a key is copied into every index that names
/// its object (the cluster state, the Service's slices, the published
/// state, the claims), and each copy is two pointers.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ObjectKey {
    pub namespace: ArcStr,
    pub name: ArcStr,
}

impl ObjectKey {
    /// The namespace is interned: a few namespaces hold many objects.
    pub fn new(namespace: impl AsRef<str>, name: impl Into<ArcStr>) -> Self {
        Self {
            namespace: super::intern::intern(namespace.as_ref()),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The Kubernetes spelling (`TCP`, `UDP`, `SCTP`).
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }

    /// The IANA protocol number the kernel uses.
    pub fn ip_number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }

    pub fn from_ip_number(n: u8) -> Option<Self> {
        [Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
            .into_iter()
            .find(|p| p.ip_number() == n)
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub fn of(ip: &IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    /// kube-proxy's label value (`IPv4`, `IPv6`).
    pub fn as_str(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServiceType {
    ClusterIp,
    NodePort,
    LoadBalancer,
    ExternalName,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum TrafficPolicy {
    #[default]
    Cluster,
    Local,
}

/// `spec.ports[].targetPort`: a number, or a name resolved through the
/// EndpointSlice port names.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TargetPort {
    Number(u16),
    Name(ArcStr),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServicePort {
    /// `""` for a single unnamed port.
    pub name: ArcStr,
    pub protocol: Protocol,
    pub port: u16,
    /// 0 = none.
    pub node_port: u16,
    pub target_port: TargetPort,
    pub app_protocol: Option<ArcStr>,
}

/// One `status.loadBalancer.ingress[]` entry that carries an IP.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LoadBalancerIngress {
    pub ip: IpAddr,
    /// `ipMode: Proxy`: the load balancer delivers to the node itself, so
    /// the proxy must not capture the IP (SPEC §8.1).
    pub ip_mode_proxy: bool,
}

/// Label that hands a Service to another proxy (SPEC §8.1).
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Label set on EndpointSlices of headless Services.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Labels that take a Service or an EndpointSlice away from this proxy,
/// whatever their value: kube-proxy's informers list both kinds with the
/// selector `!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless`.
/// The kube source sends that selector ([`proxy_label_selector`]); the
/// model drops what any other source gives ([`Labels::proxy_selects`]).
pub const PROXY_EXCLUDING_LABELS: [&str; 2] = [LABEL_SERVICE_PROXY_NAME, LABEL_HEADLESS];

/// kube-proxy's label selector for Services and EndpointSlices, as the API
/// server reads it.
pub fn proxy_label_selector() -> String {
    PROXY_EXCLUDING_LABELS
        .iter()
        .map(|l| format!("!{l}"))
        .collect::<Vec<_>>()
        .join(",")
}
/// Label linking an EndpointSlice to its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Node label carrying the zone.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Default `sessionAffinityConfig.clientIP.timeoutSeconds`.
pub const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10800;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Service {
    pub key: ObjectKey,
    pub uid: ArcStr,
    pub labels: Labels,
    /// `metadata.creationTimestamp` in Unix seconds: decides which service
    /// owns an address two claim (see [`super::claims`]).
    pub created: Option<i64>,
    pub service_type: ServiceType,
    /// `spec.clusterIPs` (or `spec.clusterIP`); empty when headless
    /// (`None`) or not allocated.
    pub cluster_ips: Vec<IpAddr>,
    pub external_ips: Vec<IpAddr>,
    pub load_balancer_ingress: Vec<LoadBalancerIngress>,
    pub ports: Vec<ServicePort>,
    pub internal_traffic_policy: TrafficPolicy,
    pub external_traffic_policy: TrafficPolicy,
    /// `Some(timeout_seconds)` for `sessionAffinity: ClientIP`.
    pub session_affinity_timeout: Option<u32>,
    /// 0 = none.
    pub health_check_node_port: u16,
    /// `spec.trafficDistribution` as given.
    pub traffic_distribution: Option<ArcStr>,
    /// CIDRs as given (validated by the source).
    pub load_balancer_source_ranges: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AddressType {
    Ipv4,
    Ipv6,
    Fqdn,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EndpointSlicePort {
    /// `""` when unnamed.
    pub name: ArcStr,
    pub protocol: Protocol,
    /// `None` = the slice does not say (such a port backs nothing).
    pub port: Option<u16>,
    pub app_protocol: Option<String>,
}

/// `endpoints[].hints`, also as published per endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct EndpointHints {
    pub for_zones: Vec<ArcStr>,
    pub for_nodes: Vec<ArcStr>,
}

/// One endpoint of a slice. Kept small (a quarter of a million of them
/// is a large cluster): the repeated strings are shared (see
/// [`super::intern`]), what most endpoints lack is boxed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// `addresses[0]`; FQDN slices carry no endpoints in this model.
    pub ip: IpAddr,
    /// Conditions as given; `None` = absent (defaulted by SPEC §8.2).
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
    pub hostname: Option<ArcStr>,
    pub node_name: Option<ArcStr>,
    pub zone: Option<ArcStr>,
    /// `None` when the slice gives none; shared with the published
    /// endpoint.
    pub hints: Option<Arc<EndpointHints>>,
    /// Shared with the published endpoints.
    pub target_ref: Option<TargetRef>,
}

impl Endpoint {
    pub fn hints_for_zones(&self) -> &[ArcStr] {
        self.hints.as_deref().map_or(&[], |h| &h.for_zones)
    }

    pub fn hints_for_nodes(&self) -> &[ArcStr] {
        self.hints.as_deref().map_or(&[], |h| &h.for_nodes)
    }
}

/// Object labels: few per object, so a sorted list rather than a map (a
/// map's first node is half a kilobyte), keys and values shared.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Labels(Box<[(ArcStr, ArcStr)]>);

impl Labels {
    fn find(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(key))
    }

    pub fn get(&self, key: &str) -> Option<&ArcStr> {
        self.find(key).ok().map(|i| &self.0[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_ok()
    }

    /// Whether kube-proxy's label selector ([`proxy_label_selector`])
    /// keeps an object carrying these labels.
    pub fn proxy_selects(&self) -> bool {
        !PROXY_EXCLUDING_LABELS
            .iter()
            .any(|label| self.contains_key(label))
    }

    /// Sets `key` to `value`, replacing an earlier value.
    pub fn insert(&mut self, key: impl Into<ArcStr>, value: impl Into<ArcStr>) {
        let (key, value) = (key.into(), value.into());
        match self.find(&key) {
            Ok(i) => self.0[i].1 = value,
            Err(i) => {
                let mut all = std::mem::take(&mut self.0).into_vec();
                all.insert(i, (key, value));
                self.0 = all.into_boxed_slice();
            }
        }
    }

    pub fn remove(&mut self, key: &str) {
        if let Ok(i) = self.find(key) {
            let mut all = std::mem::take(&mut self.0).into_vec();
            all.remove(i);
            self.0 = all.into_boxed_slice();
        }
    }

    /// In key order.
    pub fn iter(&self) -> impl Iterator<Item = (&ArcStr, &ArcStr)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl<K: Into<ArcStr>, V: Into<ArcStr>> FromIterator<(K, V)> for Labels {
    /// A key given twice keeps its last value, as in a map.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut all: Vec<(ArcStr, ArcStr)> = iter
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        // Stable: equal keys stay in the order given, the last one kept.
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all.reverse();
        all.dedup_by(|later, first| later.0 == first.0);
        all.reverse();
        Labels(all.into_boxed_slice())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EndpointSlice {
    pub key: ObjectKey,
    pub labels: Labels,
    pub address_type: AddressType,
    pub ports: Vec<EndpointSlicePort>,
    pub endpoints: Vec<Endpoint>,
    /// `endpoints.kubernetes.io/last-change-trigger-time`.
    pub last_change_trigger_time: Option<Timestamp>,
}

impl EndpointSlice {
    /// The owning Service from the `kubernetes.io/service-name` label.
    pub fn service_key(&self) -> Option<ObjectKey> {
        self.labels
            .get(LABEL_SERVICE_NAME)
            .map(|name| ObjectKey::new(&self.key.namespace, name.clone()))
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    pub name: String,
    pub labels: Labels,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    pub taint_keys: Vec<String>,
    pub addresses: Vec<IpAddr>,
}

/// The taint the cluster autoscaler puts on a node it is about to delete.
pub const TAINT_TO_BE_DELETED: &str = "ToBeDeletedByClusterAutoscaler";

impl Node {
    pub fn zone(&self) -> Option<&str> {
        self.labels.get(LABEL_ZONE).map(ArcStr::as_str)
    }

    /// kube-proxy's node eligibility (SPEC §4.1): false once this node is
    /// being deleted or the autoscaler marked it; true when the Node is
    /// unknown.
    pub fn eligible(node: Option<&Node>) -> bool {
        node.is_none_or(|n| !n.deleting && !n.taint_keys.iter().any(|k| k == TAINT_TO_BE_DELETED))
    }
}

/// Time as seconds and nanoseconds since the Unix epoch (UTC).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    pub seconds: i64,
    pub nanos: i32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodCondition {
    pub condition_type: String,
    pub status: ConditionStatus,
    pub last_probe_time: Option<Timestamp>,
    pub last_transition_time: Option<Timestamp>,
    pub reason: String,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pod {
    pub key: ObjectKey,
    pub uid: String,
    pub node_name: Option<String>,
    /// Mirror pod of a static pod (`kubernetes.io/config.mirror`).
    pub static_pod: bool,
    pub conditions: Vec<PodCondition>,
    pub deletion_timestamp: Option<Timestamp>,
}

/// Everything the sources know, keyed for stable iteration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterState {
    /// Boxed: a B-tree node holds eleven values, often half of them unused,
    /// and at 50k Services the unused room of inline values was ~12 MB.
    pub services: BTreeMap<ObjectKey, Box<Service>>,
    pub endpoint_slices: BTreeMap<ObjectKey, Box<EndpointSlice>>,
    pub nodes: BTreeMap<String, Node>,
    pub pods: BTreeMap<ObjectKey, Pod>,
}

/// The kinds of object the proxy consumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    Service,
    EndpointSlice,
    Node,
    Pod,
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ObjectKind::Service => "Service",
            ObjectKind::EndpointSlice => "EndpointSlice",
            ObjectKind::Node => "Node",
            ObjectKind::Pod => "Pod",
        })
    }
}

/// Identity of an object: its kind and key (Nodes have an empty namespace).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    pub kind: ObjectKind,
    pub key: ObjectKey,
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.key.name)
        } else {
            write!(f, "{} {}", self.kind, self.key)
        }
    }
}

/// One validated object of any consumed kind.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Object {
    // Boxed: a Service is several times larger than the other objects.
    Service(Box<Service>),
    EndpointSlice(EndpointSlice),
    Node(Node),
    Pod(Pod),
}

impl Object {
    pub fn kind(&self) -> ObjectKind {
        match self {
            Object::Service(_) => ObjectKind::Service,
            Object::EndpointSlice(_) => ObjectKind::EndpointSlice,
            Object::Node(_) => ObjectKind::Node,
            Object::Pod(_) => ObjectKind::Pod,
        }
    }

    pub fn object_ref(&self) -> ObjectRef {
        let (kind, key) = match self {
            Object::Service(s) => (ObjectKind::Service, s.key.clone()),
            Object::EndpointSlice(s) => (ObjectKind::EndpointSlice, s.key.clone()),
            Object::Node(n) => (ObjectKind::Node, ObjectKey::new("", n.name.clone())),
            Object::Pod(p) => (ObjectKind::Pod, p.key.clone()),
        };
        ObjectRef { kind, key }
    }
}

/// A change reported by a source.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    Upsert(Object),
    Delete(ObjectRef),
}

impl Change {
    /// The kind of the object changed (no copy of its name).
    pub fn kind(&self) -> ObjectKind {
        match self {
            Change::Upsert(o) => o.kind(),
            Change::Delete(r) => r.kind,
        }
    }

    pub fn object_ref(&self) -> ObjectRef {
        match self {
            Change::Upsert(o) => o.object_ref(),
            Change::Delete(r) => r.clone(),
        }
    }
}

impl ClusterState {
    /// Applies one change; returns whether the state differs afterwards.
    pub fn apply(&mut self, change: Change) -> bool {
        // One walk down the tree, not a lookup and then an insert.
        fn upsert<K: Ord, V: PartialEq>(map: &mut BTreeMap<K, V>, k: K, v: V) -> bool {
            match map.entry(k) {
                Entry::Occupied(e) if *e.get() == v => false,
                Entry::Occupied(mut e) => {
                    e.insert(v);
                    true
                }
                Entry::Vacant(e) => {
                    e.insert(v);
                    true
                }
            }
        }
        match change {
            Change::Upsert(Object::Service(s)) => upsert(&mut self.services, s.key.clone(), s),
            Change::Upsert(Object::EndpointSlice(s)) => {
                upsert(&mut self.endpoint_slices, s.key.clone(), Box::new(s))
            }
            Change::Upsert(Object::Node(n)) => upsert(&mut self.nodes, n.name.clone(), n),
            Change::Upsert(Object::Pod(p)) => upsert(&mut self.pods, p.key.clone(), p),
            Change::Delete(ObjectRef { kind, key }) => match kind {
                ObjectKind::Service => self.services.remove(&key).is_some(),
                ObjectKind::EndpointSlice => self.endpoint_slices.remove(&key).is_some(),
                ObjectKind::Node => self.nodes.remove(key.name.as_str()).is_some(),
                ObjectKind::Pod => self.pods.remove(&key).is_some(),
            },
        }
    }

    /// Every object, in kind then key order.
    pub fn objects(&self) -> impl Iterator<Item = Object> + '_ {
        let services = self.services.values().map(|s| Object::Service(s.clone()));
        let slices = self
            .endpoint_slices
            .values()
            .map(|s| Object::EndpointSlice((**s).clone()));
        let nodes = self.nodes.values().cloned().map(Object::Node);
        let pods = self.pods.values().cloned().map(Object::Pod);
        services.chain(slices).chain(nodes).chain(pods)
    }

    /// The changes that turn `self` into `next` (deletes first).
    pub fn diff(&self, next: &ClusterState) -> Vec<Change> {
        let mut changes = Vec::new();
        let old: BTreeMap<ObjectRef, Object> =
            self.objects().map(|o| (o.object_ref(), o)).collect();
        let new: BTreeMap<ObjectRef, Object> =
            next.objects().map(|o| (o.object_ref(), o)).collect();
        for r in old.keys().filter(|r| !new.contains_key(*r)) {
            changes.push(Change::Delete(r.clone()));
        }
        for (r, o) in new {
            if old.get(&r) != Some(&o) {
                changes.push(Change::Upsert(o));
            }
        }
        changes
    }
}
