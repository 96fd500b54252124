//! The node-local state: every Service this node proxies with its endpoints
//! and the selection results (scopes) per service port and IP family.
//! Sorted and canonical; it maps one to one onto localnet.v1 (SPEC §6).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use triomphe::ThinArc;

use super::cluster::{EndpointHints, Labels, ObjectKey, Protocol, TrafficPolicy};
use super::intern::ArcStr;
use super::target_ref::TargetRef;

/// Service type as programmed (ExternalName never reaches LocalState).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LocalServiceType {
    ClusterIp,
    NodePort,
    LoadBalancer,
}

/// Addresses of one kind, split by family, each list sorted and deduplicated.
///
/// 16 bytes: up to two IPv4 addresses are kept inline (a service's cluster
/// IP; no address at all, as for most services' external and
/// load-balancer addresses), anything else in one heap block. A service
/// holds three of these, 50,000 services 150,000: an inline small vector
/// for IPv4 beside a boxed slice for IPv6 took 40 bytes each.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct IpSet(Repr);

/// One form per set (a set that fits inline is never on the heap, unused
/// inline slots are unspecified addresses), so the derived equality and
/// hash are the set's.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    Inline { len: u8, v4: [Ipv4Addr; 2] },
    Heap(Box<Lists>),
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Lists {
    v4: Box<[Ipv4Addr]>,
    v6: Box<[Ipv6Addr]>,
}

impl Default for Repr {
    fn default() -> Self {
        Repr::Inline {
            len: 0,
            v4: [Ipv4Addr::UNSPECIFIED; 2],
        }
    }
}

impl IpSet {
    pub fn from_ips<'a, I>(ips: I) -> Self
    where
        I: IntoIterator<Item = &'a IpAddr>,
        I::IntoIter: Clone,
    {
        let ips = ips.into_iter();
        if let Some(inline) = Self::inline_of(ips.clone()) {
            return inline;
        }
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for ip in ips {
            match ip {
                IpAddr::V4(a) => v4.push(*a),
                IpAddr::V6(a) => v6.push(*a),
            }
        }
        v4.sort_unstable();
        v4.dedup();
        v6.sort_unstable();
        v6.dedup();
        IpSet(Repr::Heap(Box::new(Lists {
            v4: v4.into(),
            v6: v6.into(),
        })))
    }

    /// The inline form of `ips` when they are at most two distinct IPv4
    /// addresses (nearly every set), built without a heap list.
    fn inline_of<'a>(ips: impl Iterator<Item = &'a IpAddr>) -> Option<Self> {
        let mut v4 = [Ipv4Addr::UNSPECIFIED; 2];
        let mut len = 0;
        for ip in ips {
            let IpAddr::V4(a) = ip else { return None };
            if v4[..len].contains(a) {
                continue;
            }
            *v4.get_mut(len)? = *a;
            len += 1;
        }
        if v4[1] < v4[0] && len == 2 {
            v4.swap(0, 1);
        }
        Some(IpSet(Repr::Inline { len: len as u8, v4 }))
    }

    /// The IPv4 addresses, sorted.
    pub fn v4(&self) -> &[Ipv4Addr] {
        match &self.0 {
            Repr::Inline { len, v4 } => &v4[..usize::from(*len)],
            Repr::Heap(lists) => &lists.v4,
        }
    }

    /// The IPv6 addresses, sorted.
    pub fn v6(&self) -> &[Ipv6Addr] {
        match &self.0 {
            Repr::Inline { .. } => &[],
            Repr::Heap(lists) => &lists.v6,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.v4().is_empty() && self.v6().is_empty()
    }

    /// All addresses, IPv4 first.
    pub fn iter(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.v4()
            .iter()
            .map(|a| IpAddr::V4(*a))
            .chain(self.v6().iter().map(|a| IpAddr::V6(*a)))
    }
}

impl std::fmt::Debug for IpSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpSet")
            .field("v4", &self.v4())
            .field("v6", &self.v6())
            .finish()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PortMapping {
    pub name: ArcStr,
    pub protocol: Protocol,
    pub port: u16,
    pub node_port: u16,
    /// Numeric targetPort, 0 if named.
    pub target_port: u16,
    /// Named targetPort, `""` if numeric.
    pub target_port_name: ArcStr,
    pub app_protocol: ArcStr,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LocalService {
    pub key: ObjectKey,
    pub uid: ArcStr,
    pub service_type: LocalServiceType,
    pub labels: Labels,
    /// `metadata.creationTimestamp` in Unix seconds (not published on
    /// localnet): the older service owns a contested address.
    pub created: Option<i64>,
    pub cluster_ips: IpSet,
    pub external_ips: IpSet,
    /// Ingress IPs with ipMode unset or `VIP`.
    pub load_balancer_ips: IpSet,
    /// Sorted by (name, protocol).
    pub ports: Vec<PortMapping>,
    pub internal_traffic_policy: TrafficPolicy,
    /// `Local` only when the service is externally accessible (SPEC §8.3).
    pub external_traffic_policy: TrafficPolicy,
    /// `Some(timeout_seconds)` for ClientIP affinity (default filled in).
    pub session_affinity_timeout: Option<u32>,
    pub health_check_node_port: u16,
    /// `""` when unset.
    pub traffic_distribution: ArcStr,
    /// Sorted.
    pub load_balancer_source_ranges: Vec<String>,
}

/// Effective conditions after SPEC §8.2 defaulting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EndpointConditions {
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

/// Selection results for one (service port, IP family) (SPEC §8.5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EndpointScopes {
    pub cluster: bool,
    pub local: bool,
    /// Use for traffic to cluster IPs.
    pub internal: bool,
    /// Use for traffic from outside to node ports, external and LB IPs.
    pub external: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EndpointPort {
    /// Matches [`PortMapping::name`].
    pub name: ArcStr,
    pub protocol: Protocol,
    /// Port number on the endpoint.
    pub port: u16,
    pub scopes: EndpointScopes,
}

/// The ports one endpoint backs, shared by the endpoints of a service
/// whose ports and scopes are the same (most of them): one heap block
/// behind a thin pointer (triomphe's `ThinArc`). An `Arc<[_]>` is a pointer
/// and a length, 8 bytes more in each of a quarter of a million endpoints.
#[derive(Clone)]
pub struct EndpointPorts(ThinArc<(), EndpointPort>);

impl EndpointPorts {
    /// Changes the ports of this endpoint alone (a copy when shared).
    pub fn modify(&mut self, f: impl FnOnce(&mut [EndpointPort])) {
        let mut ports = self.to_vec();
        f(&mut ports);
        *self = ports.into();
    }
}

impl std::ops::Deref for EndpointPorts {
    type Target = [EndpointPort];

    fn deref(&self) -> &[EndpointPort] {
        &self.0.slice
    }
}

impl From<&[EndpointPort]> for EndpointPorts {
    fn from(ports: &[EndpointPort]) -> Self {
        EndpointPorts(ThinArc::from_header_and_iter((), ports.iter().cloned()))
    }
}

impl From<Vec<EndpointPort>> for EndpointPorts {
    fn from(ports: Vec<EndpointPort>) -> Self {
        EndpointPorts(ThinArc::from_header_and_iter((), ports.into_iter()))
    }
}

impl<const N: usize> From<[EndpointPort; N]> for EndpointPorts {
    fn from(ports: [EndpointPort; N]) -> Self {
        EndpointPorts(ThinArc::from_header_and_iter((), ports.into_iter()))
    }
}

impl FromIterator<EndpointPort> for EndpointPorts {
    fn from_iter<I: IntoIterator<Item = EndpointPort>>(ports: I) -> Self {
        ports.into_iter().collect::<Vec<_>>().into()
    }
}

impl<'a> IntoIterator for &'a EndpointPorts {
    type Item = &'a EndpointPort;
    type IntoIter = std::slice::Iter<'a, EndpointPort>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl PartialEq for EndpointPorts {
    fn eq(&self, other: &Self) -> bool {
        self.0.ptr() == other.0.ptr() || self[..] == other[..]
    }
}

impl Eq for EndpointPorts {}

impl std::hash::Hash for EndpointPorts {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self[..].hash(state);
    }
}

impl std::fmt::Debug for EndpointPorts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// One endpoint as published; its strings are the model's (shared, not
/// copied).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LocalEndpoint {
    pub ip: IpAddr,
    pub hostname: ArcStr,
    pub node_name: ArcStr,
    pub zone: ArcStr,
    /// `node_name` is this node.
    pub local: bool,
    pub conditions: EndpointConditions,
    /// Effective hints (synthesised ones included, SPEC §8.4); the
    /// slice's own are shared with the model, and endpoints without any
    /// share one empty value.
    pub hints: Arc<EndpointHints>,
    /// One entry per service port this endpoint backs, sorted (name, protocol).
    /// Endpoints of a service with the same ports and scopes share one
    /// slice (most of them do).
    pub ports: EndpointPorts,
    pub target_ref: Option<TargetRef>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServiceEndpoints {
    pub service: LocalService,
    /// Sorted by IP: IPv4 before IPv6, then numerically. One entry per IP.
    pub endpoints: Vec<LocalEndpoint>,
    /// Distinct local, ready, non-terminating endpoint IPs per family (SPEC §4.3).
    pub local_ready_endpoints_v4: u32,
    pub local_ready_endpoints_v6: u32,
}

/// What this node programs; `services` sorted by (namespace, name).
///
/// Each service sits behind an `Arc`: a state derived from an earlier one
/// shares every service that did not change (the incremental model makes
/// new states that way), so a new revision costs one pointer per service
/// and "unchanged" is a pointer comparison.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LocalState {
    pub services: Vec<Arc<ServiceEndpoints>>,
}

impl LocalState {
    /// A state of `services` in any order (sorted here).
    pub fn new(services: impl IntoIterator<Item = ServiceEndpoints>) -> Self {
        let mut services: Vec<Arc<ServiceEndpoints>> = services.into_iter().map(Arc::new).collect();
        services.sort_by(|a, b| a.service.key.cmp(&b.service.key));
        LocalState { services }
    }

    pub fn endpoint_count(&self) -> usize {
        self.services.iter().map(|s| s.endpoints.len()).sum()
    }

    pub fn service(&self, key: &ObjectKey) -> Option<&ServiceEndpoints> {
        self.services
            .binary_search_by(|s| s.service.key.cmp(key))
            .ok()
            .map(|i| &*self.services[i])
    }
}

/// Calls `f(key, next_version)` for every service that differs between two
/// sorted states (`None`: the service is gone).
pub fn for_each_changed<'a>(
    prev: &'a LocalState,
    next: &'a LocalState,
    mut f: impl FnMut(&'a ObjectKey, Option<&'a ServiceEndpoints>),
) {
    use std::cmp::Ordering;
    let (mut a, mut b) = (
        prev.services.iter().peekable(),
        next.services.iter().peekable(),
    );
    loop {
        match (a.peek(), b.peek()) {
            (None, None) => return,
            (Some(x), None) => {
                f(&x.service.key, None);
                a.next();
            }
            (None, Some(y)) => {
                f(&y.service.key, Some(&**y));
                b.next();
            }
            (Some(x), Some(y)) => match x.service.key.cmp(&y.service.key) {
                Ordering::Less => {
                    f(&x.service.key, None);
                    a.next();
                }
                Ordering::Greater => {
                    f(&y.service.key, Some(&**y));
                    b.next();
                }
                Ordering::Equal => {
                    if !Arc::ptr_eq(x, y) && x != y {
                        f(&y.service.key, Some(&**y));
                    }
                    a.next();
                    b.next();
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(addrs: &[&str]) -> IpSet {
        let ips: Vec<IpAddr> = addrs.iter().map(|a| a.parse().unwrap()).collect();
        IpSet::from_ips(&ips)
    }

    #[test]
    fn an_ip_set_reads_back_sorted_and_deduplicated_in_either_form() {
        assert_eq!(std::mem::size_of::<IpSet>(), 16);
        let empty = set(&[]);
        assert!(empty.is_empty() && empty == IpSet::default());
        for addrs in [
            &["10.0.0.2", "10.0.0.1", "10.0.0.2"][..],
            &["10.0.0.2", "10.0.0.2", "10.0.0.1", "10.0.0.1", "10.0.0.2"],
            &["10.0.0.1", "10.0.0.1", "10.0.0.1"],
            &["0.0.0.0", "10.0.0.1"],
            &["10.0.0.3", "10.0.0.1", "10.0.0.2"],
            &["fd00::2", "10.0.0.1", "fd00::1", "fd00::2"],
            &["fd00::1"],
        ] {
            let s = set(addrs);
            let mut want: Vec<IpAddr> = addrs.iter().map(|a| a.parse().unwrap()).collect();
            want.sort_by_key(|ip| (ip.is_ipv6(), *ip));
            want.dedup();
            assert_eq!(s.iter().collect::<Vec<_>>(), want, "{addrs:?}");
            assert_eq!(s.v4().len() + s.v6().len(), want.len());
            // The same set given in another order is equal, hash and all.
            let mut reversed = addrs.to_vec();
            reversed.reverse();
            let r = set(&reversed);
            assert_eq!(r, s);
            let hash = |x: &IpSet| {
                use std::hash::{BuildHasher, BuildHasherDefault};
                BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
                    .hash_one(x)
            };
            assert_eq!(hash(&r), hash(&s));
        }
        assert_ne!(set(&["10.0.0.1"]), set(&["10.0.0.1", "10.0.0.2"]));
        assert_ne!(set(&["10.0.0.1"]), set(&["10.0.0.1", "fd00::1"]));
        assert_ne!(set(&["0.0.0.0"]), set(&[]));
        // One form per set, however many duplicates it was given.
        assert_eq!(
            set(&["10.0.0.2", "10.0.0.1", "10.0.0.2", "10.0.0.1"]),
            set(&["10.0.0.1", "10.0.0.2"])
        );
        assert_eq!(
            format!("{:?}", set(&["10.0.0.1", "fd00::1"])),
            "IpSet { v4: [10.0.0.1], v6: [fd00::1] }"
        );
    }
}
