//! `compute()`: kube-proxy's endpoint selection (SPEC §8) as one pure function.
//!
//! It picks the Services and EndpointSlices this node proxies (§8.1), merges
//! every endpoint IP of a Service into one [`LocalEndpoint`] (§8.2), and
//! categorises each endpoint per (service port, IP family) into the Cluster
//! and Local sets with topology and terminating fallbacks (§8.3–§8.5). The
//! result is canonical: services, endpoints and ports come out sorted and no
//! hash-map order reaches the output.

use std::collections::HashMap;
use std::net::IpAddr;

use super::cluster::{
    AddressType, ClusterState, Endpoint, EndpointSlice, IpFamily, Node, Service, ServicePort,
    ServiceType, TargetPort, TrafficPolicy, LABEL_HEADLESS, LABEL_SERVICE_NAME,
    LABEL_SERVICE_PROXY_NAME,
};
use super::local::{
    EndpointConditions, EndpointHints, EndpointPort, EndpointScopes, IpSet, LocalEndpoint,
    LocalService, LocalServiceType, LocalState, PortMapping, ServiceEndpoints,
};

/// Facts about this node that the selection needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeContext {
    /// This node's name (`--hostname-override` or the hostname).
    pub node_name: String,
    /// Synthesise topology hints for Services with `trafficDistribution`
    /// whose endpoints carry none (SPEC §8.4 extension; file source only,
    /// where no EndpointSlice controller runs).
    pub synthesize_hints: bool,
}

/// The `trafficDistribution` value for which the EndpointSlice controller
/// also writes node hints.
const TRAFFIC_DISTRIBUTION_PREFER_SAME_NODE: &str = "PreferSameNode";

/// Computes what this node must program from the cluster state.
pub fn compute(cluster: &ClusterState, node: &NodeContext) -> LocalState {
    let env = Env {
        node_name: non_empty(Some(node.node_name.as_str())),
        // An empty label value is treated like a missing one so that an
        // empty zone hint can never select endpoints (SPEC §8.4 step 3).
        zone: non_empty(cluster.nodes.get(&node.node_name).and_then(Node::zone)),
    };
    let slices_by_service = index_slices(cluster);
    let services = cluster
        .services
        .values()
        .filter(|svc| is_proxied(svc))
        .filter_map(|svc| {
            let slices = slices_by_service
                .get(&(svc.key.namespace.as_str(), svc.key.name.as_str()))
                .map(Vec::as_slice)
                .unwrap_or_default();
            service_endpoints(svc, slices, &env, node.synthesize_hints)
        })
        .collect();
    LocalState { services }
}

/// Per-call view of this node.
struct Env<'a> {
    node_name: Option<&'a str>,
    zone: Option<&'a str>,
}

fn non_empty(s: Option<&str>) -> Option<&str> {
    s.filter(|s| !s.is_empty())
}

fn is_proxied(svc: &Service) -> bool {
    svc.service_type != ServiceType::ExternalName
        && !svc.cluster_ips.is_empty()
        && !svc.labels.contains_key(LABEL_SERVICE_PROXY_NAME)
}

/// Groups the usable slices by owning Service in one pass. Because
/// `endpoint_slices` iterates in (namespace, name) order and a slice only
/// ever belongs to a Service of its own namespace, every group ends up in
/// slice-name order, which the duplicate rule (SPEC §8.2) relies on.
///
/// The key is the owner [`EndpointSlice::service_key`] names, borrowed
/// rather than allocated: this runs for every slice on every recompute.
/// Groups of unknown or skipped Services are simply never looked up.
fn index_slices(cluster: &ClusterState) -> HashMap<(&str, &str), Vec<&EndpointSlice>> {
    let mut index: HashMap<(&str, &str), Vec<&EndpointSlice>> =
        HashMap::with_capacity(cluster.services.len());
    for slice in cluster.endpoint_slices.values() {
        if slice.address_type == AddressType::Fqdn || slice.labels.contains_key(LABEL_HEADLESS) {
            continue;
        }
        let Some(service) = slice.labels.get(LABEL_SERVICE_NAME) else {
            continue;
        };
        index
            .entry((slice.key.namespace.as_str(), service.as_str()))
            .or_default()
            .push(slice);
    }
    index
}

/// Which hints are synthesised for a Service (SPEC §8.4 extension).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Synthesis {
    /// Use the hints the slices carry.
    Off,
    Zone,
    ZoneAndNode,
}

fn synthesis_for(svc: &Service, slices: &[&EndpointSlice], enabled: bool) -> Synthesis {
    let Some(distribution) = non_empty(svc.traffic_distribution.as_deref()) else {
        return Synthesis::Off;
    };
    // A single real hint means a controller is at work; mixing its hints
    // with invented ones would change what it decided.
    let any_hint = slices
        .iter()
        .flat_map(|s| &s.endpoints)
        .any(|e| !e.hints_for_zones.is_empty() || !e.hints_for_nodes.is_empty());
    if !enabled || any_hint {
        Synthesis::Off
    } else if distribution == TRAFFIC_DISTRIBUTION_PREFER_SAME_NODE {
        Synthesis::ZoneAndNode
    } else {
        Synthesis::Zone
    }
}

/// One copy of an endpoint (one slice entry) with its defaulted facts.
#[derive(Clone, Copy)]
struct Candidate<'a> {
    ep: &'a Endpoint,
    ready: bool,
    serving: bool,
    terminating: bool,
    local: bool,
}

impl<'a> Candidate<'a> {
    fn new(ep: &'a Endpoint, env: &Env) -> Self {
        let ready = ep.ready.unwrap_or(true);
        Candidate {
            ep,
            ready,
            serving: ep.serving.unwrap_or(ready),
            terminating: ep.terminating.unwrap_or(false),
            local: env.node_name.is_some() && ep.node_name.as_deref() == env.node_name,
        }
    }

    fn serving_terminating(&self) -> bool {
        self.serving && self.terminating
    }

    /// Effective zone hints; synthesised ones borrow the endpoint's own zone
    /// so no allocation is needed on the hot path.
    fn zone_hints(&self, synth: Synthesis) -> &'a [String] {
        match synth {
            Synthesis::Off => &self.ep.hints_for_zones,
            Synthesis::Zone | Synthesis::ZoneAndNode => own(&self.ep.zone),
        }
    }

    fn node_hints(&self, synth: Synthesis) -> &'a [String] {
        match synth {
            Synthesis::Off => &self.ep.hints_for_nodes,
            Synthesis::Zone => &[],
            Synthesis::ZoneAndNode => own(&self.ep.node_name),
        }
    }

    fn hints(&self, synth: Synthesis) -> EndpointHints {
        EndpointHints {
            for_zones: self.zone_hints(synth).to_vec(),
            for_nodes: self.node_hints(synth).to_vec(),
        }
    }
}

fn own(value: &Option<String>) -> &[String] {
    match value {
        Some(v) if !v.is_empty() => std::slice::from_ref(v),
        _ => &[],
    }
}

/// The copy backing one service port of one IP, with its port number.
type Backing<'a> = Option<(Candidate<'a>, u16)>;

/// Every endpoint IP of a Service, sorted by IP, with per-port data kept in
/// flat row-major tables (row = IP, column = sorted service port) so that a
/// large Service costs a handful of allocations, not several per endpoint.
struct Entries<'a> {
    width: usize,
    ips: Vec<IpAddr>,
    /// The copy that describes each IP as a whole.
    best: Vec<Candidate<'a>>,
    backing: Vec<Backing<'a>>,
    scopes: Vec<EndpointScopes>,
}

impl<'a> Entries<'a> {
    fn backing_of(&self, row: usize) -> &[Backing<'a>] {
        &self.backing[row * self.width..(row + 1) * self.width]
    }

    fn scopes_of(&self, row: usize) -> &[EndpointScopes] {
        &self.scopes[row * self.width..(row + 1) * self.width]
    }
}

/// A ready copy replaces a non-ready one; otherwise the first copy stays.
fn prefer(current: &Candidate, new: &Candidate) -> bool {
    new.ready && !current.ready
}

fn service_endpoints(
    svc: &Service,
    slices: &[&EndpointSlice],
    env: &Env,
    synthesize_hints: bool,
) -> Option<ServiceEndpoints> {
    let service_type = match svc.service_type {
        ServiceType::ClusterIp => LocalServiceType::ClusterIp,
        ServiceType::NodePort => LocalServiceType::NodePort,
        ServiceType::LoadBalancer => LocalServiceType::LoadBalancer,
        ServiceType::ExternalName => return None,
    };
    let ports = sorted_ports(svc);
    let synth = synthesis_for(svc, slices, synthesize_hints);
    let mut entries = collect_entries(&ports, slices, env);

    for (column, port) in ports.iter().enumerate() {
        for family in [IpFamily::V4, IpFamily::V6] {
            if svc.cluster_ips.iter().any(|ip| IpFamily::of(ip) == family) {
                categorise(svc, port, column, family, &mut entries, env, synth);
            }
        }
    }

    let mut local_ready = [0u32; 2];
    for (row, ip) in entries.ips.iter().enumerate() {
        let counts = entries
            .backing_of(row)
            .iter()
            .flatten()
            .any(|(c, _)| c.local && c.ready && !c.terminating);
        if counts {
            local_ready[usize::from(IpFamily::of(ip) == IpFamily::V6)] += 1;
        }
    }

    let endpoints = (0..entries.ips.len())
        .map(|row| local_endpoint(&entries, row, &ports, synth))
        .collect();
    Some(ServiceEndpoints {
        service: local_service(svc, service_type, &ports),
        endpoints,
        local_ready_endpoints_v4: local_ready[0],
        local_ready_endpoints_v6: local_ready[1],
    })
}

/// Service ports in output order. Ports are identified by (name, protocol)
/// everywhere downstream, so should a source let a repeated pair through,
/// only the first one in spec order is kept.
fn sorted_ports(svc: &Service) -> Vec<&ServicePort> {
    let mut ports: Vec<&ServicePort> = svc.ports.iter().collect();
    ports.sort_by(|a, b| (&a.name, a.protocol).cmp(&(&b.name, b.protocol)));
    ports.dedup_by(|later, first| later.name == first.name && later.protocol == first.protocol);
    ports
}

/// Merges all slice entries into one row per IP, sorted by IP.
fn collect_entries<'a>(
    ports: &[&ServicePort],
    slices: &[&'a EndpointSlice],
    env: &Env,
) -> Entries<'a> {
    let width = ports.len();
    // Row-major (slice, service port) -> endpoint port number.
    let mut numbers: Vec<Option<u16>> = Vec::with_capacity(slices.len() * width);
    // (ip, slice index, endpoint), pushed in slice order.
    let mut copies: Vec<(IpAddr, usize, &'a Endpoint)> = Vec::new();
    for slice in slices {
        let row = numbers.len() / width.max(1);
        numbers.extend(ports.iter().map(|p| {
            slice
                .ports
                .iter()
                .find(|sp| sp.name == p.name && sp.protocol == p.protocol && sp.port.is_some())
                .and_then(|sp| sp.port)
        }));
        if numbers[row * width..].iter().all(Option::is_none) {
            continue;
        }
        copies.extend(slice.endpoints.iter().map(|ep| (ep.ip, row, ep)));
    }
    // A stable sort keeps copies of one IP in slice order for the duplicate
    // rule; IpAddr orders every IPv4 address before every IPv6 address.
    copies.sort_by_key(|&(ip, _, _)| ip);

    let mut entries = Entries {
        width,
        ips: Vec::with_capacity(copies.len()),
        best: Vec::with_capacity(copies.len()),
        backing: Vec::with_capacity(copies.len() * width),
        scopes: Vec::new(),
    };
    for group in copies.chunk_by(|a, b| a.0 == b.0) {
        let (ip, _, first) = group[0];
        let mut best = Candidate::new(first, env);
        let start = entries.backing.len();
        entries.backing.resize(start + width, None);
        let row = &mut entries.backing[start..];
        for &(_, slice_row, ep) in group {
            let cand = Candidate::new(ep, env);
            if prefer(&best, &cand) {
                best = cand;
            }
            let slice_numbers = &numbers[slice_row * width..(slice_row + 1) * width];
            for (slot, number) in row.iter_mut().zip(slice_numbers) {
                let Some(number) = *number else { continue };
                match slot {
                    Some((current, _)) if !prefer(current, &cand) => {}
                    _ => *slot = Some((cand, number)),
                }
            }
        }
        entries.ips.push(ip);
        entries.best.push(best);
    }
    entries.scopes = vec![EndpointScopes::default(); entries.backing.len()];
    entries
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Topology {
    None,
    PreferSameNode,
    PreferSameZone,
}

fn topology_mode<'a>(
    ready: impl Iterator<Item = Candidate<'a>>,
    env: &Env,
    synth: Synthesis,
) -> Topology {
    let mut all_node_hinted = true;
    let mut any_for_node = false;
    let mut all_zone_hinted = true;
    let mut any_for_zone = false;
    for cand in ready {
        let nodes = cand.node_hints(synth);
        if nodes.is_empty() {
            all_node_hinted = false;
        } else if env.node_name.is_some_and(|n| nodes.iter().any(|h| h == n)) {
            any_for_node = true;
        }
        let zones = cand.zone_hints(synth);
        if zones.is_empty() {
            all_zone_hinted = false;
        } else if env.zone.is_some_and(|z| zones.iter().any(|h| h == z)) {
            any_for_zone = true;
        }
    }
    // `any_for_*` stays false without ready endpoints, giving mode "".
    if all_node_hinted && any_for_node {
        Topology::PreferSameNode
    } else if all_zone_hinted && any_for_zone {
        Topology::PreferSameZone
    } else {
        Topology::None
    }
}

fn topology_admits(mode: Topology, cand: &Candidate, env: &Env, synth: Synthesis) -> bool {
    let hinted = |hints: &[String], target: Option<&str>| {
        target.is_some_and(|t| hints.iter().any(|h| h == t))
    };
    match mode {
        Topology::None => true,
        Topology::PreferSameNode => hinted(cand.node_hints(synth), env.node_name),
        Topology::PreferSameZone => hinted(cand.zone_hints(synth), env.zone),
    }
}

/// Fills the scopes of service port `column` for the endpoints of `family`
/// (SPEC §8.3–§8.5).
fn categorise(
    svc: &Service,
    port: &ServicePort,
    column: usize,
    family: IpFamily,
    entries: &mut Entries,
    env: &Env,
    synth: Synthesis,
) {
    let externally_accessible = port.node_port != 0
        || svc.external_ips.iter().any(|ip| IpFamily::of(ip) == family)
        || svc
            .load_balancer_ingress
            .iter()
            .any(|ing| !ing.ip_mode_proxy && IpFamily::of(&ing.ip) == family);
    let internal_local = svc.internal_traffic_policy == TrafficPolicy::Local;
    let external_local =
        svc.external_traffic_policy == TrafficPolicy::Local && externally_accessible;
    let uses_cluster = !internal_local || externally_accessible;
    let uses_local = internal_local || external_local;

    // (cell index, copy) of every endpoint of this family backing the port.
    let members: Vec<(usize, Candidate)> = entries
        .ips
        .iter()
        .enumerate()
        .filter(|(_, ip)| IpFamily::of(ip) == family)
        .filter_map(|(row, _)| {
            let cell = row * entries.width + column;
            entries.backing[cell].map(|(c, _)| (cell, c))
        })
        .collect();
    let scopes = &mut entries.scopes;

    if uses_cluster {
        let mode = topology_mode(
            members.iter().map(|&(_, c)| c).filter(|c| c.ready),
            env,
            synth,
        );
        let mut any = false;
        for (cell, c) in &members {
            scopes[*cell].cluster = c.ready && topology_admits(mode, c, env, synth);
            any |= scopes[*cell].cluster;
        }
        if !any {
            for (cell, c) in &members {
                scopes[*cell].cluster = c.serving_terminating();
            }
        }
    }
    if uses_local {
        let mut any = false;
        for (cell, c) in &members {
            scopes[*cell].local = c.local && c.ready;
            any |= scopes[*cell].local;
        }
        if !any {
            for (cell, c) in &members {
                scopes[*cell].local = c.local && c.serving_terminating();
            }
        }
    }
    for (cell, _) in &members {
        let s = &mut scopes[*cell];
        s.internal = if internal_local { s.local } else { s.cluster };
        s.external = if external_local { s.local } else { s.cluster };
    }
}

fn local_endpoint(
    entries: &Entries,
    row: usize,
    ports: &[&ServicePort],
    synth: Synthesis,
) -> LocalEndpoint {
    let best = &entries.best[row];
    let ports = ports
        .iter()
        .zip(entries.backing_of(row))
        .zip(entries.scopes_of(row))
        .filter_map(|((port, backing), scopes)| {
            backing.map(|(_, number)| EndpointPort {
                name: port.name.clone(),
                protocol: port.protocol,
                port: number,
                scopes: *scopes,
            })
        })
        .collect();
    LocalEndpoint {
        ip: entries.ips[row],
        hostname: best.ep.hostname.clone().unwrap_or_default(),
        node_name: best.ep.node_name.clone().unwrap_or_default(),
        zone: best.ep.zone.clone().unwrap_or_default(),
        local: best.local,
        conditions: EndpointConditions {
            ready: best.ready,
            serving: best.serving,
            terminating: best.terminating,
        },
        hints: best.hints(synth),
        ports,
        target_ref: best.ep.target_ref.clone(),
    }
}

fn local_service(
    svc: &Service,
    service_type: LocalServiceType,
    ports: &[&ServicePort],
) -> LocalService {
    let vip_ingress = || {
        svc.load_balancer_ingress
            .iter()
            .filter(|ing| !ing.ip_mode_proxy)
            .map(|ing| &ing.ip)
    };
    // Mirrors kube-proxy, which only honours eTP=Local when there is an
    // external way in; otherwise the policy has no effect and reporting it
    // would make consumers open a useless health-check port.
    let externally_accessible = svc.ports.iter().any(|p| p.node_port != 0)
        || !svc.external_ips.is_empty()
        || vip_ingress().next().is_some();
    let external_traffic_policy =
        if svc.external_traffic_policy == TrafficPolicy::Local && externally_accessible {
            TrafficPolicy::Local
        } else {
            TrafficPolicy::Cluster
        };
    let mut source_ranges = svc.load_balancer_source_ranges.clone();
    source_ranges.sort();
    source_ranges.dedup();
    LocalService {
        key: svc.key.clone(),
        uid: svc.uid.clone(),
        service_type,
        labels: svc.labels.clone(),
        created: svc.created,
        cluster_ips: IpSet::from_ips(&svc.cluster_ips),
        external_ips: IpSet::from_ips(&svc.external_ips),
        load_balancer_ips: IpSet::from_ips(vip_ingress()),
        ports: ports.iter().map(|p| port_mapping(p)).collect(),
        internal_traffic_policy: svc.internal_traffic_policy,
        external_traffic_policy,
        session_affinity_timeout: svc.session_affinity_timeout,
        health_check_node_port: svc.health_check_node_port,
        traffic_distribution: svc.traffic_distribution.clone().unwrap_or_default(),
        load_balancer_source_ranges: source_ranges,
    }
}

fn port_mapping(port: &ServicePort) -> PortMapping {
    let (target_port, target_port_name) = match &port.target_port {
        TargetPort::Number(n) => (*n, String::new()),
        TargetPort::Name(name) => (0, name.clone()),
    };
    PortMapping {
        name: port.name.clone(),
        protocol: port.protocol,
        port: port.port,
        node_port: port.node_port,
        target_port,
        target_port_name,
        app_protocol: port.app_protocol.clone().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::net::IpAddr;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    use super::super::cluster::{
        EndpointSlicePort, LoadBalancerIngress, ObjectKey, Protocol, TargetRef,
        DEFAULT_AFFINITY_TIMEOUT_SECONDS, LABEL_ZONE,
    };
    use super::*;

    use Protocol::{Tcp, Udp};

    const NS: &str = "ns";

    // ---- fixtures -------------------------------------------------------

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn sp(name: &str, protocol: Protocol, port: u16) -> ServicePort {
        ServicePort {
            name: name.into(),
            protocol,
            port,
            node_port: 0,
            target_port: TargetPort::Number(port),
            app_protocol: None,
        }
    }

    fn esp(name: &str, protocol: Protocol, port: u16) -> EndpointSlicePort {
        EndpointSlicePort {
            name: name.into(),
            protocol,
            port: Some(port),
            app_protocol: None,
        }
    }

    /// A ClusterIP Service `ns/<name>` with 10.96.0.1 and port ""/TCP/80→8080.
    fn svc(name: &str) -> Service {
        Service {
            key: ObjectKey::new(NS, name),
            uid: format!("uid-{name}"),
            labels: BTreeMap::new(),
            created: None,
            service_type: ServiceType::ClusterIp,
            cluster_ips: vec![ip("10.96.0.1")],
            external_ips: vec![],
            load_balancer_ingress: vec![],
            ports: vec![ServicePort {
                target_port: TargetPort::Number(8080),
                ..sp("", Tcp, 80)
            }],
            internal_traffic_policy: TrafficPolicy::Cluster,
            external_traffic_policy: TrafficPolicy::Cluster,
            session_affinity_timeout: None,
            health_check_node_port: 0,
            traffic_distribution: None,
            load_balancer_source_ranges: vec![],
        }
    }

    trait SvcB: Sized {
        fn with(self, f: impl FnOnce(&mut Service)) -> Self;
        fn ns(self, ns: &str) -> Self {
            self.with(|s| s.key.namespace = ns.into())
        }
        fn kind(self, t: ServiceType) -> Self {
            self.with(|s| s.service_type = t)
        }
        fn ips(self, ips: &[&str]) -> Self {
            self.with(|s| s.cluster_ips = ips.iter().map(|a| ip(a)).collect())
        }
        fn ports(self, ports: Vec<ServicePort>) -> Self {
            self.with(|s| s.ports = ports)
        }
        fn node_port(self, n: u16) -> Self {
            self.with(|s| s.ports.iter_mut().for_each(|p| p.node_port = n))
        }
        fn ext_ip(self, a: &str) -> Self {
            self.with(|s| s.external_ips.push(ip(a)))
        }
        fn lb(self, a: &str) -> Self {
            self.with(|s| {
                s.load_balancer_ingress.push(LoadBalancerIngress {
                    ip: ip(a),
                    ip_mode_proxy: false,
                })
            })
        }
        fn lb_proxy(self, a: &str) -> Self {
            self.with(|s| {
                s.load_balancer_ingress.push(LoadBalancerIngress {
                    ip: ip(a),
                    ip_mode_proxy: true,
                })
            })
        }
        fn itp_local(self) -> Self {
            self.with(|s| s.internal_traffic_policy = TrafficPolicy::Local)
        }
        fn etp_local(self) -> Self {
            self.with(|s| s.external_traffic_policy = TrafficPolicy::Local)
        }
        fn label(self, k: &str, v: &str) -> Self {
            self.with(|s| {
                s.labels.insert(k.into(), v.into());
            })
        }
        fn td(self, d: &str) -> Self {
            self.with(|s| s.traffic_distribution = Some(d.into()))
        }
        fn affinity(self, secs: u32) -> Self {
            self.with(|s| s.session_affinity_timeout = Some(secs))
        }
    }

    impl SvcB for Service {
        fn with(mut self, f: impl FnOnce(&mut Service)) -> Self {
            f(&mut self);
            self
        }
    }

    /// An IPv4 slice `ns/<name>` of `ns/<service>` with port ""/TCP/8080.
    fn slice(name: &str, service: &str) -> EndpointSlice {
        EndpointSlice {
            key: ObjectKey::new(NS, name),
            labels: BTreeMap::from([(LABEL_SERVICE_NAME.to_string(), service.to_string())]),
            address_type: AddressType::Ipv4,
            ports: vec![esp("", Tcp, 8080)],
            endpoints: vec![],
            last_change_trigger_time: None,
        }
    }

    trait SliceB: Sized {
        fn with(self, f: impl FnOnce(&mut EndpointSlice)) -> Self;
        fn eps(self, eps: Vec<Endpoint>) -> Self {
            self.with(|s| s.endpoints = eps)
        }
        fn ports(self, ports: Vec<EndpointSlicePort>) -> Self {
            self.with(|s| s.ports = ports)
        }
        fn v6(self) -> Self {
            self.with(|s| s.address_type = AddressType::Ipv6)
        }
        fn fqdn(self) -> Self {
            self.with(|s| s.address_type = AddressType::Fqdn)
        }
        fn ns(self, ns: &str) -> Self {
            self.with(|s| s.key.namespace = ns.into())
        }
        fn label(self, k: &str, v: &str) -> Self {
            self.with(|s| {
                s.labels.insert(k.into(), v.into());
            })
        }
        fn unlabel(self, k: &str) -> Self {
            self.with(|s| {
                s.labels.remove(k);
            })
        }
    }

    impl SliceB for EndpointSlice {
        fn with(mut self, f: impl FnOnce(&mut EndpointSlice)) -> Self {
            f(&mut self);
            self
        }
    }

    /// An endpoint with every condition absent and nothing else set.
    fn ep(a: &str) -> Endpoint {
        Endpoint {
            ip: ip(a),
            hostname: None,
            node_name: None,
            zone: None,
            ready: None,
            serving: None,
            terminating: None,
            hints_for_zones: vec![],
            hints_for_nodes: vec![],
            target_ref: None,
        }
    }

    trait EpB: Sized {
        fn with(self, f: impl FnOnce(&mut Endpoint)) -> Self;
        fn on(self, node: &str) -> Self {
            self.with(|e| e.node_name = Some(node.into()))
        }
        fn zone(self, z: &str) -> Self {
            self.with(|e| e.zone = Some(z.into()))
        }
        fn host(self, h: &str) -> Self {
            self.with(|e| e.hostname = Some(h.into()))
        }
        fn ready(self, b: bool) -> Self {
            self.with(|e| e.ready = Some(b))
        }
        fn serving(self, b: bool) -> Self {
            self.with(|e| e.serving = Some(b))
        }
        fn term(self, b: bool) -> Self {
            self.with(|e| e.terminating = Some(b))
        }
        fn not_ready(self) -> Self {
            self.ready(false)
        }
        /// Serving and terminating, not ready (a draining pod).
        fn st(self) -> Self {
            self.ready(false).serving(true).term(true)
        }
        fn hz(self, zones: &[&str]) -> Self {
            self.with(|e| e.hints_for_zones = zones.iter().map(|z| z.to_string()).collect())
        }
        fn hn(self, nodes: &[&str]) -> Self {
            self.with(|e| e.hints_for_nodes = nodes.iter().map(|n| n.to_string()).collect())
        }
    }

    impl EpB for Endpoint {
        fn with(mut self, f: impl FnOnce(&mut Endpoint)) -> Self {
            f(&mut self);
            self
        }
    }

    fn node(name: &str, zone: Option<&str>) -> Node {
        Node {
            name: name.into(),
            labels: zone
                .map(|z| BTreeMap::from([(LABEL_ZONE.to_string(), z.to_string())]))
                .unwrap_or_default(),
            deleting: false,
            taint_keys: vec![],
            addresses: vec![],
        }
    }

    /// n1 and n3 in zone a, n2 in zone b.
    fn default_nodes() -> Vec<Node> {
        vec![
            node("n1", Some("a")),
            node("n2", Some("b")),
            node("n3", Some("a")),
        ]
    }

    fn state(services: &[Service], slices: &[EndpointSlice], nodes: &[Node]) -> ClusterState {
        ClusterState {
            services: services
                .iter()
                .map(|s| (s.key.clone(), s.clone()))
                .collect(),
            endpoint_slices: slices.iter().map(|s| (s.key.clone(), s.clone())).collect(),
            nodes: nodes.iter().map(|n| (n.name.clone(), n.clone())).collect(),
            pods: BTreeMap::new(),
        }
    }

    // ---- table machinery ------------------------------------------------

    enum Exp {
        /// Endpoints of `ns/<service>`, each rendered by [`render`].
        Eps(&'static str, &'static [&'static str]),
        /// Keys of all output services, in order.
        Svcs(&'static [&'static str]),
        /// `local_ready_endpoints_v4` / `_v6` of `ns/<service>`.
        LocalReady(&'static str, u32, u32),
        /// Anything the renderings do not show.
        Check(fn(&LocalState)),
    }
    use Exp::{Check, Eps, LocalReady, Svcs};

    struct Case {
        name: &'static str,
        services: Vec<Service>,
        slices: Vec<EndpointSlice>,
        nodes: Vec<Node>,
        node: &'static str,
        synth: bool,
        expect: Vec<Exp>,
    }

    fn case(
        name: &'static str,
        services: Vec<Service>,
        slices: Vec<EndpointSlice>,
        expect: Vec<Exp>,
    ) -> Case {
        Case {
            name,
            services,
            slices,
            nodes: default_nodes(),
            node: "n1",
            synth: false,
            expect,
        }
    }

    impl Case {
        fn synth(mut self) -> Self {
            self.synth = true;
            self
        }
        fn on_node(mut self, node: &'static str) -> Self {
            self.node = node;
            self
        }
    }

    /// `C`luster, `L`ocal, `I`nternal, `E`xternal, `-` when unset.
    fn render_scopes(s: &EndpointScopes) -> String {
        [
            (s.cluster, 'C'),
            (s.local, 'L'),
            (s.internal, 'I'),
            (s.external, 'E'),
        ]
        .iter()
        .map(|&(on, c)| if on { c } else { '-' })
        .collect()
    }

    /// `ip name/PROTO=port:CLIE ...`
    fn render(e: &LocalEndpoint) -> String {
        let mut out = e.ip.to_string();
        for p in &e.ports {
            out.push_str(&format!(
                " {}/{}={}:{}",
                p.name,
                p.protocol,
                p.port,
                render_scopes(&p.scopes)
            ));
        }
        out
    }

    fn get<'a>(state: &'a LocalState, name: &str) -> &'a ServiceEndpoints {
        state
            .service(&ObjectKey::new(NS, name))
            .unwrap_or_else(|| panic!("service ns/{name} missing"))
    }

    fn endpoint<'a>(state: &'a LocalState, service: &str, a: &str) -> &'a LocalEndpoint {
        get(state, service)
            .endpoints
            .iter()
            .find(|e| e.ip == ip(a))
            .unwrap_or_else(|| panic!("endpoint {a} of ns/{service} missing"))
    }

    fn assert_canonical(state: &LocalState) {
        for w in state.services.windows(2) {
            assert!(w[0].service.key < w[1].service.key, "services not sorted");
        }
        for s in &state.services {
            let ports: Vec<_> = s
                .service
                .ports
                .iter()
                .map(|p| (&p.name, p.protocol))
                .collect();
            assert!(
                ports.windows(2).all(|w| w[0] < w[1]),
                "service ports not sorted"
            );
            assert!(
                s.endpoints.windows(2).all(|w| w[0].ip < w[1].ip),
                "endpoints not sorted"
            );
            for e in &s.endpoints {
                assert!(!e.ports.is_empty(), "endpoint {} backs no port", e.ip);
                let ports: Vec<_> = e.ports.iter().map(|p| (&p.name, p.protocol)).collect();
                assert!(
                    ports.windows(2).all(|w| w[0] < w[1]),
                    "endpoint ports not sorted"
                );
            }
        }
    }

    fn run(case: &Case) {
        let cluster = state(&case.services, &case.slices, &case.nodes);
        let ctx = NodeContext {
            node_name: case.node.into(),
            synthesize_hints: case.synth,
        };
        let out = compute(&cluster, &ctx);
        assert_eq!(out, compute(&cluster, &ctx), "compute is not deterministic");
        assert_canonical(&out);
        for exp in &case.expect {
            match exp {
                Eps(service, want) => {
                    let got: Vec<String> =
                        get(&out, service).endpoints.iter().map(render).collect();
                    assert_eq!(got, *want, "endpoints of ns/{service}");
                }
                Svcs(want) => {
                    let got: Vec<String> = out
                        .services
                        .iter()
                        .map(|s| s.service.key.to_string())
                        .collect();
                    assert_eq!(got, *want, "services");
                }
                LocalReady(service, v4, v6) => {
                    let s = get(&out, service);
                    assert_eq!(
                        (s.local_ready_endpoints_v4, s.local_ready_endpoints_v6),
                        (*v4, *v6),
                        "local ready counts of ns/{service}"
                    );
                }
                Check(f) => f(&out),
            }
        }
    }

    #[test]
    fn selection_table() {
        let cases = cases();
        assert!(cases.len() >= 45, "only {} cases", cases.len());
        let mut names: Vec<&str> = cases.iter().map(|c| c.name).collect();
        names.sort_unstable();
        assert!(
            names.windows(2).all(|w| w[0] != w[1]),
            "duplicate case names"
        );

        let failed: Vec<&str> = cases
            .iter()
            .filter(|c| catch_unwind(AssertUnwindSafe(|| run(c))).is_err())
            .map(|c| c.name)
            .collect();
        assert!(failed.is_empty(), "failed cases: {failed:#?}");
    }

    // ---- cases ----------------------------------------------------------

    fn lb_etp_local() -> Service {
        svc("web")
            .kind(ServiceType::LoadBalancer)
            .node_port(30080)
            .lb("192.0.2.10")
            .etp_local()
    }

    fn dual_stack() -> Service {
        svc("web").ips(&["10.96.0.1", "fd00:96::1"])
    }

    fn two_ports() -> Service {
        svc("web").ports(vec![sp("http", Tcp, 80), sp("metrics", Tcp, 9100)])
    }

    fn two_port_slice(name: &str) -> EndpointSlice {
        slice(name, "web").ports(vec![esp("http", Tcp, 8080), esp("metrics", Tcp, 9100)])
    }

    fn cases() -> Vec<Case> {
        vec![
            // -- SPEC §8.7 worked cases (node n1, zone a) --
            case(
                "row1_cluster_policies_use_every_ready_endpoint",
                vec![svc("web")],
                vec![slice("web-a", "web")
                    .eps(vec![ep("10.1.0.1").on("n1"), ep("10.1.0.2").on("n2")])],
                vec![Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:C-IE"],
                )],
            ),
            case(
                "row2_itp_local_cluster_ip_only_uses_no_cluster_set",
                vec![svc("web").itp_local()],
                vec![slice("web-a", "web").eps(vec![ep("10.1.0.1").on("n2")])],
                vec![Eps("web", &["10.1.0.1 /TCP=8080:----"])],
            ),
            case(
                "row3_lb_etp_local_external_uses_local_ready",
                vec![lb_etp_local()],
                vec![slice("web-a", "web")
                    .eps(vec![ep("10.1.0.1").on("n2"), ep("10.1.0.2").on("n1")])],
                vec![
                    Eps(
                        "web",
                        &["10.1.0.1 /TCP=8080:C-I-", "10.1.0.2 /TCP=8080:CLIE"],
                    ),
                    LocalReady("web", 1, 0),
                ],
            ),
            case(
                "row4_lb_etp_local_falls_back_to_local_terminating",
                vec![lb_etp_local()],
                vec![slice("web-a", "web")
                    .eps(vec![ep("10.1.0.1").on("n2"), ep("10.1.0.2").on("n1").st()])],
                vec![
                    Eps(
                        "web",
                        &["10.1.0.1 /TCP=8080:C-I-", "10.1.0.2 /TCP=8080:-L-E"],
                    ),
                    LocalReady("web", 0, 0),
                ],
            ),
            case(
                "row5_cluster_falls_back_to_serving_terminating",
                vec![svc("web")],
                vec![slice("web-a", "web").eps(vec![
                    ep("10.1.0.1").on("n2").st(),
                    ep("10.1.0.2").on("n2").not_ready(),
                ])],
                vec![Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:----"],
                )],
            ),
            case(
                "row6_terminating_but_not_serving_is_never_used",
                vec![svc("web")],
                vec![slice("web-a", "web").eps(vec![ep("10.1.0.1")
                    .on("n1")
                    .ready(false)
                    .serving(false)
                    .term(true)])],
                vec![Eps("web", &["10.1.0.1 /TCP=8080:----"])],
            ),
            case(
                "row7_all_zone_hinted_prefers_same_zone",
                vec![svc("web")],
                vec![slice("web-a", "web").eps(vec![
                    ep("10.1.0.1").on("n3").hz(&["a"]),
                    ep("10.1.0.2").on("n2").hz(&["b"]),
                ])],
                vec![Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:----"],
                )],
            ),
            case(
                "row8_partly_zone_hinted_disables_topology",
                vec![svc("web")],
                vec![slice("web-a", "web").eps(vec![
                    ep("10.1.0.1").on("n3"),
                    ep("10.1.0.2").on("n2").hz(&["b"]),
                ])],
                vec![Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:C-IE"],
                )],
            ),
            case(
                "row9_no_hint_for_own_zone_disables_topology",
                vec![svc("web")],
                vec![slice("web-a", "web").eps(vec![
                    ep("10.1.0.1").on("n3").hz(&["b"]),
                    ep("10.1.0.2").on("n2").hz(&["b"]),
                ])],
                vec![Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:C-IE"],
                )],
            ),
            case(
                "row10_all_node_hinted_prefers_same_node",
                vec![svc("web")],
                vec![slice("web-a", "web").eps(vec![
                    ep("10.1.0.1").on("n1").hn(&["n1"]).hz(&["a"]),
                    ep("10.1.0.2").on("n3").hn(&["n3"]).hz(&["a"]),
                ])],
                vec![Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:----"],
                )],
            ),
            case(
                "row11_dual_stack_families_fall_back_independently",
                vec![dual_stack()],
                vec![
                    slice("web-v4", "web").eps(vec![
                        ep("10.1.0.1").on("n2").st(),
                        ep("10.1.0.2").on("n2").not_ready(),
                    ]),
                    slice("web-v6", "web").v6().eps(vec![
                        ep("fd00:1::1").on("n2"),
                        ep("fd00:1::2").on("n2").st(),
                    ]),
                ],
                vec![Eps(
                    "web",
                    &[
                        "10.1.0.1 /TCP=8080:C-IE",
                        "10.1.0.2 /TCP=8080:----",
                        "fd00:1::1 /TCP=8080:C-IE",
                        "fd00:1::2 /TCP=8080:----",
                    ],
                )],
            ),
            // -- §8.1 objects considered --
            case(
                "externalname_service_and_its_slices_skipped",
                vec![svc("ext").kind(ServiceType::ExternalName), svc("web")],
                vec![slice("ext-a", "ext").eps(vec![ep("10.1.0.1")])],
                vec![Svcs(&["ns/web"])],
            ),
            case(
                "headless_service_skipped",
                vec![svc("hl").ips(&[]), svc("web")],
                vec![slice("hl-a", "hl").eps(vec![ep("10.1.0.1")])],
                vec![Svcs(&["ns/web"])],
            ),
            case(
                "service_proxy_name_label_skips_service_whatever_its_value",
                vec![
                    svc("other").label(LABEL_SERVICE_PROXY_NAME, "other-proxy"),
                    svc("empty-value").label(LABEL_SERVICE_PROXY_NAME, ""),
                    svc("web"),
                ],
                vec![slice("other-a", "other").eps(vec![ep("10.1.0.1")])],
                vec![Svcs(&["ns/web"])],
            ),
            case(
                "fqdn_slice_ignored",
                vec![svc("web")],
                vec![
                    slice("web-a", "web").fqdn().eps(vec![ep("10.1.0.9")]),
                    slice("web-b", "web").eps(vec![ep("10.1.0.1")]),
                ],
                vec![Eps("web", &["10.1.0.1 /TCP=8080:C-IE"])],
            ),
            case(
                "slice_without_service_name_label_ignored",
                vec![svc("web")],
                vec![slice("web-a", "web")
                    .unlabel(LABEL_SERVICE_NAME)
                    .eps(vec![ep("10.1.0.1")])],
                vec![Eps("web", &[])],
            ),
            case(
                "headless_labelled_slice_ignored",
                vec![svc("web")],
                vec![
                    slice("web-a", "web")
                        .label(LABEL_HEADLESS, "")
                        .eps(vec![ep("10.1.0.9")]),
                    slice("web-b", "web").eps(vec![ep("10.1.0.1")]),
                ],
                vec![Eps("web", &["10.1.0.1 /TCP=8080:C-IE"])],
            ),
            case(
                "slice_of_unknown_service_ignored",
                vec![svc("web")],
                vec![slice("nope-a", "nope").eps(vec![ep("10.1.0.1")])],
                vec![Svcs(&["ns/web"]), Eps("web", &[])],
            ),
            case(
                "slice_in_other_namespace_does_not_back_service",
                vec![svc("web")],
                vec![slice("web-a", "web").ns("other").eps(vec![ep("10.1.0.1")])],
                vec![Eps("web", &[])],
            ),
            case(
                "services_without_endpoints_included",
                vec![svc("empty"), svc("web")],
                vec![slice("web-a", "web").eps(vec![ep("10.1.0.1")])],
                vec![
                    Svcs(&["ns/empty", "ns/web"]),
                    Eps("empty", &[]),
                    LocalReady("empty", 0, 0),
                ],
            ),
            // -- §8.2 endpoint facts --
            case(
                "missing_conditions_mean_ready_serving_not_terminating",
                vec![svc("web")],
                vec![slice("web-a", "web").eps(vec![ep("10.1.0.1").on("n1")])],
                vec![
                    Eps("web", &["10.1.0.1 /TCP=8080:C-IE"]),
                    Check(|s| {
                        let c = endpoint(s, "web", "10.1.0.1").conditions;
                        assert_eq!((c.ready, c.serving, c.terminating), (true, true, false));
                    }),
                ],
            ),
            case(
                "missing_serving_defaults_to_ready",
                vec![svc("web")],
                vec![slice("web-a", "web").eps(vec![ep("10.1.0.1").not_ready().term(true)])],
                vec![
                    Eps("web", &["10.1.0.1 /TCP=8080:----"]),
                    Check(|s| {
                        let c = endpoint(s, "web", "10.1.0.1").conditions;
                        assert_eq!((c.ready, c.serving, c.terminating), (false, false, true));
                    }),
                ],
            ),
            case(
                "local_means_node_name_equals_this_node",
                vec![svc("web").itp_local()],
                vec![slice("web-a", "web").eps(vec![
                    ep("10.1.0.1").on("n1"),
                    ep("10.1.0.2").on("n2"),
                    ep("10.1.0.3"),
                ])],
                vec![
                    Eps(
                        "web",
                        &[
                            "10.1.0.1 /TCP=8080:-LI-",
                            "10.1.0.2 /TCP=8080:----",
                            "10.1.0.3 /TCP=8080:----",
                        ],
                    ),
                    Check(|s| {
                        let local: Vec<bool> =
                            get(s, "web").endpoints.iter().map(|e| e.local).collect();
                        assert_eq!(local, [true, false, false]);
                    }),
                ],
            ),
            case(
                "duplicate_ip_ready_copy_wins",
                vec![svc("web")],
                vec![
                    slice("web-a", "web").eps(vec![ep("10.1.0.1").on("n2").host("a").not_ready()]),
                    slice("web-b", "web").eps(vec![ep("10.1.0.1").on("n1").host("b")]),
                ],
                vec![
                    Eps("web", &["10.1.0.1 /TCP=8080:C-IE"]),
                    Check(|s| {
                        let e = endpoint(s, "web", "10.1.0.1");
                        assert_eq!(
                            (e.hostname.as_str(), e.local, e.conditions.ready),
                            ("b", true, true)
                        );
                    }),
                    LocalReady("web", 1, 0),
                ],
            ),
            case(
                "duplicate_ip_without_ready_copy_keeps_first_in_slice_order",
                vec![svc("web")],
                // Listed out of order on purpose: slice-name order decides.
                vec![
                    slice("web-b", "web").eps(vec![ep("10.1.0.1").host("b").not_ready()]),
                    slice("web-a", "web").eps(vec![ep("10.1.0.1").host("a").st()]),
                ],
                vec![
                    Eps("web", &["10.1.0.1 /TCP=8080:C-IE"]),
                    Check(|s| assert_eq!(endpoint(s, "web", "10.1.0.1").hostname, "a")),
                ],
            ),
            case(
                "duplicate_ip_takes_port_number_of_winning_copy",
                vec![svc("web")],
                vec![
                    slice("web-a", "web").eps(vec![ep("10.1.0.1").not_ready()]),
                    slice("web-b", "web")
                        .ports(vec![esp("", Tcp, 9090)])
                        .eps(vec![ep("10.1.0.1")]),
                ],
                vec![Eps("web", &["10.1.0.1 /TCP=9090:C-IE"])],
            ),
            case(
                "ip_in_slices_for_different_ports_is_one_endpoint",
                vec![two_ports()],
                vec![
                    slice("web-a", "web")
                        .ports(vec![esp("http", Tcp, 8080)])
                        .eps(vec![ep("10.1.0.1")]),
                    slice("web-b", "web")
                        .ports(vec![esp("metrics", Tcp, 9100)])
                        .eps(vec![ep("10.1.0.1")]),
                ],
                vec![Eps(
                    "web",
                    &["10.1.0.1 http/TCP=8080:C-IE metrics/TCP=9100:C-IE"],
                )],
            ),
            case(
                "slices_of_one_service_are_merged",
                vec![svc("web")],
                vec![
                    slice("web-a", "web").eps(vec![ep("10.1.0.2")]),
                    slice("web-b", "web").eps(vec![ep("10.1.0.1")]),
                ],
                vec![Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:C-IE"],
                )],
            ),
            // -- service port <-> slice port --
            case(
                "named_target_port_resolved_via_slice_port_name",
                vec![svc("web").ports(vec![ServicePort {
                    target_port: TargetPort::Name("web-https".into()),
                    ..sp("https", Tcp, 443)
                }])],
                vec![slice("web-a", "web")
                    .ports(vec![esp("https", Tcp, 8443)])
                    .eps(vec![ep("10.1.0.1")])],
                vec![
                    Eps("web", &["10.1.0.1 https/TCP=8443:C-IE"]),
                    Check(|s| {
                        let p = &get(s, "web").service.ports[0];
                        assert_eq!(
                            (p.port, p.target_port, p.target_port_name.as_str()),
                            (443, 0, "web-https")
                        );
                    }),
                ],
            ),
            case(
                "numeric_target_port_is_informational",
                vec![svc("web")],
                vec![slice("web-a", "web")
                    .ports(vec![esp("", Tcp, 9999)])
                    .eps(vec![ep("10.1.0.1")])],
                vec![
                    Eps("web", &["10.1.0.1 /TCP=9999:C-IE"]),
                    Check(|s| {
                        let p = &get(s, "web").service.ports[0];
                        assert_eq!((p.target_port, p.target_port_name.as_str()), (8080, ""));
                    }),
                ],
            ),
            case(
                "port_missing_in_slice_backs_nothing",
                vec![two_ports()],
                vec![slice("web-a", "web")
                    .ports(vec![esp("http", Tcp, 8080)])
                    .eps(vec![ep("10.1.0.1")])],
                vec![Eps("web", &["10.1.0.1 http/TCP=8080:C-IE"])],
            ),
            case(
                "slice_port_without_number_backs_nothing",
                vec![svc("web")],
                vec![slice("web-a", "web")
                    .ports(vec![EndpointSlicePort {
                        port: None,
                        ..esp("", Tcp, 0)
                    }])
                    .eps(vec![ep("10.1.0.1")])],
                vec![Eps("web", &[])],
            ),
            case(
                "slice_port_protocol_must_match",
                vec![svc("web")],
                vec![slice("web-a", "web")
                    .ports(vec![esp("", Udp, 8080)])
                    .eps(vec![ep("10.1.0.1")])],
                vec![Eps("web", &[])],
            ),
            case(
                "slice_port_name_must_match",
                vec![svc("web")],
                vec![slice("web-a", "web")
                    .ports(vec![esp("http", Tcp, 8080)])
                    .eps(vec![ep("10.1.0.1")])],
                vec![Eps("web", &[])],
            ),
            case(
                "same_port_number_on_tcp_and_udp_kept_apart",
                vec![svc("dns").ports(vec![sp("dns", Udp, 53), sp("dns", Tcp, 53)])],
                vec![slice("dns-a", "dns")
                    .ports(vec![esp("dns", Udp, 53), esp("dns", Tcp, 5353)])
                    .eps(vec![ep("10.1.0.1")])],
                vec![
                    Eps("dns", &["10.1.0.1 dns/TCP=5353:C-IE dns/UDP=53:C-IE"]),
                    Check(|s| assert_eq!(get(s, "dns").service.ports.len(), 2)),
                ],
            ),
            case(
                "tcp_and_udp_ports_categorised_separately",
                vec![svc("dns").ports(vec![sp("dns", Tcp, 53), sp("dns", Udp, 53)])],
                vec![
                    slice("dns-tcp", "dns")
                        .ports(vec![esp("dns", Tcp, 53)])
                        .eps(vec![ep("10.1.0.1")]),
                    slice("dns-udp", "dns")
                        .ports(vec![esp("dns", Udp, 53)])
                        .eps(vec![ep("10.1.0.1").not_ready(), ep("10.1.0.2")]),
                ],
                vec![Eps(
                    "dns",
                    &[
                        "10.1.0.1 dns/TCP=53:C-IE dns/UDP=53:----",
                        "10.1.0.2 dns/UDP=53:C-IE",
                    ],
                )],
            ),
            // -- §8.3 policy predicates --
            case(
                "ip_mode_proxy_lb_ip_neither_programmed_nor_external_access",
                vec![svc("web")
                    .kind(ServiceType::LoadBalancer)
                    .lb_proxy("192.0.2.10")
                    .etp_local()],
                vec![slice("web-a", "web").eps(vec![ep("10.1.0.1").on("n2")])],
                vec![
                    Eps("web", &["10.1.0.1 /TCP=8080:C-IE"]),
                    Check(|s| {
                        let svc = &get(s, "web").service;
                        assert!(svc.load_balancer_ips.is_empty());
                        assert_eq!(svc.external_traffic_policy, TrafficPolicy::Cluster);
                    }),
                ],
            ),
            case(
                "vip_lb_ip_makes_service_externally_accessible",
                vec![svc("web")
                    .kind(ServiceType::LoadBalancer)
                    .lb("192.0.2.10")
                    .lb_proxy("192.0.2.11")
                    .etp_local()],
                vec![slice("web-a", "web")
                    .eps(vec![ep("10.1.0.1").on("n2"), ep("10.1.0.2").on("n1")])],
                vec![
                    Eps(
                        "web",
                        &["10.1.0.1 /TCP=8080:C-I-", "10.1.0.2 /TCP=8080:CLIE"],
                    ),
                    Check(|s| {
                        let svc = &get(s, "web").service;
                        assert_eq!(
                            svc.load_balancer_ips.v4,
                            [std::net::Ipv4Addr::new(192, 0, 2, 10)]
                        );
                        assert_eq!(svc.external_traffic_policy, TrafficPolicy::Local);
                    }),
                ],
            ),
            case(
                "etp_local_without_external_access_reported_cluster",
                vec![svc("web").etp_local()],
                vec![slice("web-a", "web").eps(vec![ep("10.1.0.1").on("n2")])],
                vec![
                    Eps("web", &["10.1.0.1 /TCP=8080:C-IE"]),
                    Check(|s| {
                        assert_eq!(
                            get(s, "web").service.external_traffic_policy,
                            TrafficPolicy::Cluster
                        )
                    }),
                ],
            ),
            case(
                "etp_local_with_external_ip_reported_local",
                vec![svc("web").ext_ip("198.51.100.1").etp_local()],
                vec![slice("web-a", "web")
                    .eps(vec![ep("10.1.0.1").on("n2"), ep("10.1.0.2").on("n1")])],
                vec![
                    Eps(
                        "web",
                        &["10.1.0.1 /TCP=8080:C-I-", "10.1.0.2 /TCP=8080:CLIE"],
                    ),
                    Check(|s| {
                        assert_eq!(
                            get(s, "web").service.external_traffic_policy,
                            TrafficPolicy::Local
                        )
                    }),
                ],
            ),
            case(
                "etp_local_node_port_only_on_some_ports",
                vec![svc("web")
                    .ports(vec![
                        ServicePort {
                            node_port: 30080,
                            ..sp("http", Tcp, 80)
                        },
                        sp("metrics", Tcp, 9100),
                    ])
                    .etp_local()],
                vec![two_port_slice("web-a").eps(vec![ep("10.1.0.1").on("n2")])],
                vec![
                    Eps(
                        "web",
                        &["10.1.0.1 http/TCP=8080:C-I- metrics/TCP=9100:C-IE"],
                    ),
                    Check(|s| {
                        assert_eq!(
                            get(s, "web").service.external_traffic_policy,
                            TrafficPolicy::Local
                        )
                    }),
                ],
            ),
            case(
                "itp_local_uses_local_ready_for_internal",
                vec![svc("web").itp_local()],
                vec![slice("web-a", "web")
                    .eps(vec![ep("10.1.0.1").on("n1"), ep("10.1.0.2").on("n2")])],
                vec![Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:-LI-", "10.1.0.2 /TCP=8080:----"],
                )],
            ),
            case(
                "itp_local_falls_back_to_local_serving_terminating",
                vec![svc("web").itp_local()],
                vec![slice("web-a", "web")
                    .eps(vec![ep("10.1.0.1").on("n1").st(), ep("10.1.0.2").on("n2")])],
                vec![Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:-LI-", "10.1.0.2 /TCP=8080:----"],
                )],
            ),
            case(
                "itp_local_with_node_port_keeps_cluster_set",
                vec![svc("web")
                    .kind(ServiceType::NodePort)
                    .node_port(30080)
                    .itp_local()],
                vec![slice("web-a", "web")
                    .eps(vec![ep("10.1.0.1").on("n2"), ep("10.1.0.2").on("n1")])],
                vec![Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C--E", "10.1.0.2 /TCP=8080:CLIE"],
                )],
            ),
            case(
                "itp_and_etp_local_with_node_port",
                vec![svc("web")
                    .kind(ServiceType::NodePort)
                    .node_port(30080)
                    .itp_local()
                    .etp_local()],
                vec![slice("web-a", "web")
                    .eps(vec![ep("10.1.0.1").on("n2"), ep("10.1.0.2").on("n1")])],
                vec![Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C---", "10.1.0.2 /TCP=8080:CLIE"],
                )],
            ),
            case(
                "external_access_judged_per_family",
                vec![dual_stack().ext_ip("2001:db8::1").etp_local()],
                vec![
                    slice("web-v4", "web").eps(vec![ep("10.1.0.1").on("n2")]),
                    slice("web-v6", "web")
                        .v6()
                        .eps(vec![ep("fd00:1::1").on("n2")]),
                ],
                vec![
                    Eps(
                        "web",
                        &["10.1.0.1 /TCP=8080:C-IE", "fd00:1::1 /TCP=8080:C-I-"],
                    ),
                    Check(|s| {
                        assert_eq!(
                            get(s, "web").service.external_traffic_policy,
                            TrafficPolicy::Local
                        )
                    }),
                ],
            ),
            case(
                "local_set_prefers_ready_over_terminating",
                vec![lb_etp_local()],
                vec![slice("web-a", "web")
                    .eps(vec![ep("10.1.0.1").on("n1"), ep("10.1.0.2").on("n1").st()])],
                vec![Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:CLIE", "10.1.0.2 /TCP=8080:----"],
                )],
            ),
            // -- families --
            case(
                "dual_stack_topology_decided_per_family",
                vec![dual_stack()],
                vec![
                    slice("web-v4", "web")
                        .eps(vec![ep("10.1.0.1").hz(&["a"]), ep("10.1.0.2").hz(&["b"])]),
                    slice("web-v6", "web")
                        .v6()
                        .eps(vec![ep("fd00:1::1").hz(&["b"]), ep("fd00:1::2")]),
                ],
                vec![Eps(
                    "web",
                    &[
                        "10.1.0.1 /TCP=8080:C-IE",
                        "10.1.0.2 /TCP=8080:----",
                        "fd00:1::1 /TCP=8080:C-IE",
                        "fd00:1::2 /TCP=8080:C-IE",
                    ],
                )],
            ),
            case(
                "v6_endpoints_of_v4_only_service_get_no_scopes",
                vec![svc("web")],
                vec![
                    slice("web-v4", "web").eps(vec![ep("10.1.0.1")]),
                    slice("web-v6", "web")
                        .v6()
                        .eps(vec![ep("fd00:1::1").on("n1")]),
                ],
                vec![
                    Eps(
                        "web",
                        &["10.1.0.1 /TCP=8080:C-IE", "fd00:1::1 /TCP=8080:----"],
                    ),
                    LocalReady("web", 0, 1),
                ],
            ),
            case(
                "v4_endpoints_of_v6_only_service_get_no_scopes",
                vec![svc("web").ips(&["fd00:96::1"])],
                vec![
                    slice("web-v4", "web").eps(vec![ep("10.1.0.1")]),
                    slice("web-v6", "web").v6().eps(vec![ep("fd00:1::1")]),
                ],
                vec![Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:----", "fd00:1::1 /TCP=8080:C-IE"],
                )],
            ),
            // -- §8.4 topology --
            case(
                "topology_looks_at_ready_endpoints_only",
                vec![svc("web")],
                vec![slice("web-a", "web").eps(vec![
                    ep("10.1.0.1").hz(&["a"]),
                    ep("10.1.0.2").not_ready(),
                    ep("10.1.0.3").hz(&["b"]),
                ])],
                vec![Eps(
                    "web",
                    &[
                        "10.1.0.1 /TCP=8080:C-IE",
                        "10.1.0.2 /TCP=8080:----",
                        "10.1.0.3 /TCP=8080:----",
                    ],
                )],
            ),
            case(
                "endpoint_hinted_for_several_zones_matches_any",
                vec![svc("web")],
                vec![slice("web-a", "web").eps(vec![
                    ep("10.1.0.1").hz(&["b", "a"]),
                    ep("10.1.0.2").hz(&["b"]),
                ])],
                vec![Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:----"],
                )],
            ),
            case(
                "node_hints_without_this_node_fall_through_to_zone",
                vec![svc("web")],
                vec![slice("web-a", "web").eps(vec![
                    ep("10.1.0.1").hn(&["n3"]).hz(&["a"]),
                    ep("10.1.0.2").hn(&["n2"]).hz(&["b"]),
                ])],
                vec![Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:----"],
                )],
            ),
            case(
                "partly_node_hinted_falls_through_to_zone",
                vec![svc("web")],
                vec![slice("web-a", "web").eps(vec![
                    ep("10.1.0.1").hn(&["n1"]).hz(&["a"]),
                    ep("10.1.0.2").hz(&["a"]),
                    ep("10.1.0.3").hn(&["n2"]).hz(&["b"]),
                ])],
                vec![Eps(
                    "web",
                    &[
                        "10.1.0.1 /TCP=8080:C-IE",
                        "10.1.0.2 /TCP=8080:C-IE",
                        "10.1.0.3 /TCP=8080:----",
                    ],
                )],
            ),
            case(
                "node_without_zone_label_never_prefers_zone",
                vec![svc("web")],
                vec![slice("web-a", "web")
                    .eps(vec![ep("10.1.0.1").hz(&["a"]), ep("10.1.0.2").hz(&["b"])])],
                vec![Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:C-IE"],
                )],
            )
            .on_node("n9"),
            case(
                "local_set_ignores_topology",
                vec![lb_etp_local()],
                vec![slice("web-a", "web").eps(vec![
                    ep("10.1.0.1").on("n1").hz(&["b"]),
                    ep("10.1.0.2").on("n3").hz(&["a"]),
                ])],
                vec![Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:-L-E", "10.1.0.2 /TCP=8080:C-I-"],
                )],
            ),
            // -- hint synthesis --
            case(
                "hint_synthesis_off_ignores_traffic_distribution",
                vec![svc("web").td("PreferClose")],
                vec![slice("web-a", "web").eps(vec![
                    ep("10.1.0.1").on("n3").zone("a"),
                    ep("10.1.0.2").on("n2").zone("b"),
                ])],
                vec![
                    Eps(
                        "web",
                        &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:C-IE"],
                    ),
                    Check(|s| {
                        assert!(get(s, "web")
                            .endpoints
                            .iter()
                            .all(|e| e.hints == EndpointHints::default()))
                    }),
                ],
            ),
            case(
                "hint_synthesis_on_prefers_same_zone",
                vec![svc("web").td("PreferClose")],
                vec![slice("web-a", "web").eps(vec![
                    ep("10.1.0.1").on("n3").zone("a"),
                    ep("10.1.0.2").on("n2").zone("b"),
                ])],
                vec![
                    Eps(
                        "web",
                        &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:----"],
                    ),
                    Check(|s| {
                        let e = endpoint(s, "web", "10.1.0.2");
                        assert_eq!(e.hints.for_zones, ["b"]);
                        assert!(e.hints.for_nodes.is_empty());
                    }),
                ],
            )
            .synth(),
            case(
                "hint_synthesis_skipped_when_any_endpoint_has_hints",
                vec![svc("web").td("PreferSameZone")],
                vec![
                    slice("web-a", "web").eps(vec![ep("10.1.0.1").on("n3").zone("a")]),
                    slice("web-b", "web").eps(vec![ep("10.1.0.2").on("n2").zone("b").hz(&["b"])]),
                ],
                vec![
                    Eps(
                        "web",
                        &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:C-IE"],
                    ),
                    Check(|s| assert!(endpoint(s, "web", "10.1.0.1").hints.for_zones.is_empty())),
                ],
            )
            .synth(),
            case(
                "hint_synthesis_needs_traffic_distribution",
                vec![svc("web")],
                vec![slice("web-a", "web").eps(vec![
                    ep("10.1.0.1").on("n3").zone("a"),
                    ep("10.1.0.2").on("n2").zone("b"),
                ])],
                vec![Eps(
                    "web",
                    &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:C-IE"],
                )],
            )
            .synth(),
            case(
                "hint_synthesis_prefer_same_node_adds_node_hints",
                vec![svc("web").td("PreferSameNode")],
                vec![slice("web-a", "web").eps(vec![
                    ep("10.1.0.1").on("n1").zone("a"),
                    ep("10.1.0.2").on("n3").zone("a"),
                    ep("10.1.0.3").on("n2").zone("b"),
                ])],
                vec![
                    Eps(
                        "web",
                        &[
                            "10.1.0.1 /TCP=8080:C-IE",
                            "10.1.0.2 /TCP=8080:----",
                            "10.1.0.3 /TCP=8080:----",
                        ],
                    ),
                    Check(|s| {
                        let e = endpoint(s, "web", "10.1.0.1");
                        assert_eq!(
                            (e.hints.for_zones.as_slice(), e.hints.for_nodes.as_slice()),
                            (&["a".to_string()][..], &["n1".to_string()][..])
                        );
                    }),
                ],
            )
            .synth(),
            case(
                "hint_synthesis_prefer_same_node_falls_back_to_zone",
                vec![svc("web").td("PreferSameNode")],
                vec![slice("web-a", "web").eps(vec![
                    ep("10.1.0.2").on("n3").zone("a"),
                    ep("10.1.0.3").on("n2").zone("b"),
                ])],
                vec![Eps(
                    "web",
                    &["10.1.0.2 /TCP=8080:C-IE", "10.1.0.3 /TCP=8080:----"],
                )],
            )
            .synth(),
            case(
                "hint_synthesis_skips_endpoints_without_zone",
                vec![svc("web").td("PreferClose")],
                vec![slice("web-a", "web").eps(vec![
                    ep("10.1.0.1").on("n3").zone("a"),
                    ep("10.1.0.2").on("n2"),
                ])],
                vec![
                    Eps(
                        "web",
                        &["10.1.0.1 /TCP=8080:C-IE", "10.1.0.2 /TCP=8080:C-IE"],
                    ),
                    Check(|s| {
                        assert_eq!(
                            endpoint(s, "web", "10.1.0.2").hints,
                            EndpointHints::default()
                        )
                    }),
                ],
            )
            .synth(),
            // -- local ready counts --
            case(
                "local_ready_counts_distinct_ips_and_excludes_terminating",
                vec![two_ports().ips(&["10.96.0.1", "fd00:96::1"])],
                vec![
                    two_port_slice("web-v4").eps(vec![
                        ep("10.1.0.1").on("n1"),
                        ep("10.1.0.2").on("n1").st(),
                        ep("10.1.0.3").on("n1").ready(true).term(true),
                        ep("10.1.0.4").on("n2"),
                        ep("10.1.0.5").on("n1"),
                    ]),
                    two_port_slice("web-v6")
                        .v6()
                        .eps(vec![ep("fd00:1::1").on("n1")]),
                ],
                vec![LocalReady("web", 2, 1)],
            ),
            // -- LocalService / LocalEndpoint fields and ordering --
            case(
                "session_affinity_timeout_carried",
                vec![
                    svc("default-timeout").affinity(DEFAULT_AFFINITY_TIMEOUT_SECONDS),
                    svc("short").affinity(60),
                    svc("none"),
                ],
                vec![],
                vec![Check(|s| {
                    assert_eq!(
                        get(s, "default-timeout").service.session_affinity_timeout,
                        Some(10800)
                    );
                    assert_eq!(get(s, "short").service.session_affinity_timeout, Some(60));
                    assert_eq!(get(s, "none").service.session_affinity_timeout, None);
                })],
            ),
            case(
                "service_fields_mapped",
                vec![svc("web")
                    .kind(ServiceType::LoadBalancer)
                    .ips(&["fd00:96::1", "10.96.0.1"])
                    .ext_ip("198.51.100.2")
                    .ext_ip("198.51.100.1")
                    .ext_ip("198.51.100.2")
                    .lb("192.0.2.10")
                    .label("app", "web")
                    .td("PreferClose")
                    .with(|s| {
                        s.health_check_node_port = 32000;
                        s.load_balancer_source_ranges = vec![
                            "10.0.0.0/8".into(),
                            "192.168.0.0/16".into(),
                            "10.0.0.0/8".into(),
                        ];
                        s.ports[0].app_protocol = Some("http".into());
                        s.ports[0].node_port = 30080;
                    })],
                vec![],
                vec![Check(|s| {
                    let svc = &get(s, "web").service;
                    assert_eq!(svc.uid, "uid-web");
                    assert_eq!(svc.service_type, LocalServiceType::LoadBalancer);
                    assert_eq!(svc.labels.get("app").map(String::as_str), Some("web"));
                    assert_eq!(
                        svc.cluster_ips
                            .iter()
                            .map(|a| a.to_string())
                            .collect::<Vec<_>>(),
                        ["10.96.0.1", "fd00:96::1"]
                    );
                    assert_eq!(
                        svc.external_ips
                            .iter()
                            .map(|a| a.to_string())
                            .collect::<Vec<_>>(),
                        ["198.51.100.1", "198.51.100.2"]
                    );
                    assert_eq!(
                        svc.load_balancer_source_ranges,
                        ["10.0.0.0/8", "192.168.0.0/16"]
                    );
                    assert_eq!(svc.health_check_node_port, 32000);
                    assert_eq!(svc.traffic_distribution, "PreferClose");
                    assert_eq!(svc.internal_traffic_policy, TrafficPolicy::Cluster);
                    let p = &svc.ports[0];
                    assert_eq!(
                        (p.port, p.node_port, p.app_protocol.as_str()),
                        (80, 30080, "http")
                    );
                })],
            ),
            case(
                "service_types_mapped_and_defaults_empty",
                vec![svc("cip"), svc("np").kind(ServiceType::NodePort)],
                vec![],
                vec![Check(|s| {
                    assert_eq!(
                        get(s, "cip").service.service_type,
                        LocalServiceType::ClusterIp
                    );
                    assert_eq!(
                        get(s, "np").service.service_type,
                        LocalServiceType::NodePort
                    );
                    let cip = &get(s, "cip").service;
                    assert_eq!(
                        (
                            cip.traffic_distribution.as_str(),
                            cip.ports[0].app_protocol.as_str()
                        ),
                        ("", "")
                    );
                })],
            ),
            case(
                "endpoint_metadata_copied_and_missing_strings_empty",
                vec![svc("web")],
                vec![slice("web-a", "web").eps(vec![
                    ep("10.1.0.1")
                        .on("n2")
                        .zone("b")
                        .host("pod-1")
                        .hz(&["b"])
                        .with(|e| {
                            e.target_ref = Some(TargetRef {
                                kind: "Pod".into(),
                                namespace: NS.into(),
                                name: "pod-1".into(),
                                uid: "u1".into(),
                            })
                        }),
                    ep("10.1.0.2"),
                ])],
                vec![Check(|s| {
                    let e = endpoint(s, "web", "10.1.0.1");
                    assert_eq!(
                        (e.hostname.as_str(), e.node_name.as_str(), e.zone.as_str()),
                        ("pod-1", "n2", "b")
                    );
                    assert_eq!(e.hints.for_zones, ["b"]);
                    assert_eq!(
                        e.target_ref.as_ref().map(|t| t.name.as_str()),
                        Some("pod-1")
                    );
                    let e = endpoint(s, "web", "10.1.0.2");
                    assert_eq!(
                        (e.hostname.as_str(), e.node_name.as_str(), e.zone.as_str()),
                        ("", "", "")
                    );
                    assert_eq!(e.target_ref, None);
                })],
            ),
            case(
                "services_sorted_by_namespace_then_name",
                vec![
                    svc("a").ns("b"),
                    svc("z").ns("a"),
                    svc("b").ns("a"),
                    svc("web"),
                ],
                vec![],
                vec![Svcs(&["a/b", "a/z", "b/a", "ns/web"])],
            ),
            case(
                "endpoints_sorted_v4_before_v6_numerically",
                vec![dual_stack()],
                vec![
                    slice("web-v6", "web")
                        .v6()
                        .eps(vec![ep("fd00:1::10"), ep("fd00:1::9")]),
                    slice("web-v4", "web").eps(vec![
                        ep("10.1.0.10"),
                        ep("10.1.0.9"),
                        ep("9.1.0.1"),
                    ]),
                ],
                vec![Eps(
                    "web",
                    &[
                        "9.1.0.1 /TCP=8080:C-IE",
                        "10.1.0.9 /TCP=8080:C-IE",
                        "10.1.0.10 /TCP=8080:C-IE",
                        "fd00:1::9 /TCP=8080:C-IE",
                        "fd00:1::10 /TCP=8080:C-IE",
                    ],
                )],
            ),
            case(
                "ports_sorted_by_name_then_protocol",
                vec![svc("web").ports(vec![sp("z", Tcp, 1), sp("a", Udp, 2), sp("a", Tcp, 3)])],
                vec![slice("web-a", "web")
                    .ports(vec![
                        esp("a", Udp, 12),
                        esp("z", Tcp, 11),
                        esp("a", Tcp, 13),
                    ])
                    .eps(vec![ep("10.1.0.1")])],
                vec![
                    Eps(
                        "web",
                        &["10.1.0.1 a/TCP=13:C-IE a/UDP=12:C-IE z/TCP=11:C-IE"],
                    ),
                    Check(|s| {
                        let ports: Vec<u16> =
                            get(s, "web").service.ports.iter().map(|p| p.port).collect();
                        assert_eq!(ports, [3, 2, 1]);
                    }),
                ],
            ),
        ]
    }

    // ---- determinism ----------------------------------------------------

    fn rich_fixture() -> (Vec<Service>, Vec<EndpointSlice>) {
        let services = vec![
            svc("web")
                .ips(&["10.96.0.1", "fd00:96::1"])
                .ports(vec![
                    sp("http", Tcp, 80),
                    sp("dns", Udp, 53),
                    sp("dns", Tcp, 53),
                ])
                .ext_ip("198.51.100.1")
                .ext_ip("2001:db8::1")
                .etp_local()
                .td("PreferClose")
                .with(|s| s.load_balancer_source_ranges = vec!["b".into(), "a".into()]),
            svc("api").ns("kube-system").itp_local(),
            svc("empty"),
        ];
        let ports = vec![
            esp("http", Tcp, 8080),
            esp("dns", Udp, 53),
            esp("dns", Tcp, 53),
        ];
        let slices = vec![
            slice("web-a", "web").ports(ports.clone()).eps(vec![
                ep("10.1.0.3").on("n1").zone("a"),
                ep("10.1.0.1").on("n2").zone("b").st(),
                ep("10.1.0.2").on("n3").zone("a").not_ready(),
            ]),
            slice("web-b", "web").ports(ports.clone()).eps(vec![
                ep("10.1.0.1").on("n2").zone("b"),
                ep("10.1.0.4").on("n1"),
            ]),
            slice("web-c", "web").v6().ports(ports).eps(vec![
                ep("fd00:1::2").on("n1").zone("a"),
                ep("fd00:1::1").on("n2").zone("b"),
            ]),
            slice("api-a", "api")
                .ns("kube-system")
                .eps(vec![ep("10.2.0.1").on("n1"), ep("10.2.0.2")]),
        ];
        (services, slices)
    }

    #[test]
    fn shuffled_input_order_gives_identical_output() {
        let ctx = NodeContext {
            node_name: "n1".into(),
            synthesize_hints: true,
        };
        let (services, slices) = rich_fixture();
        let want = compute(&state(&services, &slices, &default_nodes()), &ctx);
        assert_eq!(want.services.len(), 3);
        assert!(want.endpoint_count() > 0);

        let mut services: Vec<Service> = services
            .into_iter()
            .rev()
            .map(|mut s| {
                s.ports.reverse();
                s.cluster_ips.reverse();
                s.external_ips.reverse();
                s.load_balancer_source_ranges.reverse();
                s
            })
            .collect();
        services.rotate_left(1);
        // Reordering endpoints within a slice is safe as long as no IP
        // repeats inside one slice; across slices the order is by name.
        let slices: Vec<EndpointSlice> = slices
            .into_iter()
            .rev()
            .map(|mut s| {
                s.endpoints.reverse();
                s.ports.reverse();
                s
            })
            .collect();
        let mut nodes = default_nodes();
        nodes.reverse();
        let got = compute(&state(&services, &slices, &nodes), &ctx);
        assert_eq!(got, want);
    }

    #[test]
    fn recompute_of_cloned_state_is_equal() {
        let (services, slices) = rich_fixture();
        let cluster = state(&services, &slices, &default_nodes());
        let ctx = NodeContext {
            node_name: "n1".into(),
            synthesize_hints: false,
        };
        let first = compute(&cluster, &ctx);
        let second = compute(&cluster.clone(), &ctx.clone());
        assert_eq!(first, second);
    }
}
