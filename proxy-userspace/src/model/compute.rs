//! `compute()`: kube-proxy's endpoint selection (SPEC §8) as one pure function.
//!
//! It picks the Services and EndpointSlices this node proxies (§8.1), merges
//! every endpoint IP of a Service into one [`LocalEndpoint`] (§8.2), and
//! categorises each endpoint per (service port, IP family) into the Cluster
//! and Local sets with topology and terminating fallbacks (§8.3–§8.5). The
//! result is canonical: services, endpoints and ports come out sorted and no
//! hash-map order reaches the output.

use std::net::IpAddr;
use std::sync::Arc;

// foldhash (randomly seeded), not SipHash: these tables take every
// object of a large cluster and their keys are short.
use hashbrown::HashMap;

use super::cluster::{
    AddressType, ClusterState, Endpoint, EndpointHints, EndpointSlice, IpFamily, Node, Service,
    ServicePort, ServiceType, TargetPort, TrafficPolicy, LABEL_SERVICE_NAME,
};
use super::intern::ArcStr;
use super::local::{
    EndpointConditions, EndpointPort, EndpointPorts, EndpointScopes, IpSet, LocalEndpoint,
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

/// Computes what this node must program from the cluster state. The entry
/// fuzz/ drives, and the reference the incremental model
/// ([`super::incremental`]) is tested against.
pub fn compute(cluster: &ClusterState, node: &NodeContext) -> LocalState {
    let env = Env::new(cluster, node);
    let slices_by_service = index_slices(cluster);
    let services = cluster
        .services
        .values()
        .filter_map(|svc| {
            let slices = slices_by_service
                .get(&(svc.key.namespace.as_str(), svc.key.name.as_str()))
                .map(Vec::as_slice)
                .unwrap_or_default();
            service_view(svc, slices, &env).map(Arc::new)
        })
        .collect();
    LocalState { services }
}

/// One Service as [`compute`] sees it: `None` when this node does not
/// proxy it. `slices` are the slices naming the Service, in slice-name
/// order; unusable ones (FQDN, headless) are skipped here.
pub(super) fn service_view(
    svc: &Service,
    slices: &[&EndpointSlice],
    env: &Env,
) -> Option<ServiceEndpoints> {
    if !is_proxied(svc) {
        return None;
    }
    if slices.iter().all(|s| usable(s)) {
        return service_endpoints(svc, slices, env);
    }
    let usable: Vec<&EndpointSlice> = slices.iter().copied().filter(|s| usable(s)).collect();
    service_endpoints(svc, &usable, env)
}

/// Per-call view of this node.
pub(super) struct Env<'a> {
    node_name: Option<&'a str>,
    zone: Option<&'a str>,
    synthesize_hints: bool,
}

impl<'a> Env<'a> {
    pub(super) fn new(cluster: &'a ClusterState, node: &'a NodeContext) -> Self {
        Env {
            node_name: non_empty(Some(node.node_name.as_str())),
            // An empty label value is treated like a missing one so that an
            // empty zone hint can never select endpoints (SPEC §8.4 step 3).
            zone: non_empty(cluster.nodes.get(&node.node_name).and_then(Node::zone)),
            synthesize_hints: node.synthesize_hints,
        }
    }
}

fn non_empty(s: Option<&str>) -> Option<&str> {
    s.filter(|s| !s.is_empty())
}

fn is_proxied(svc: &Service) -> bool {
    svc.service_type != ServiceType::ExternalName
        && !svc.cluster_ips.is_empty()
        && svc.labels.proxy_selects()
}

/// Whether a slice's endpoints can back its Service at all.
fn usable(slice: &EndpointSlice) -> bool {
    slice.address_type != AddressType::Fqdn && slice.labels.proxy_selects()
}

/// Groups the slices by owning Service in one pass. Because
/// `endpoint_slices` iterates in (namespace, name) order and a slice only
/// ever belongs to a Service of its own namespace, every group ends up in
/// slice-name order, which the duplicate rule (SPEC §8.2) relies on.
///
/// The key is the owner [`EndpointSlice::service_key`] names, borrowed
/// rather than allocated: this runs for every slice on every full
/// recompute. Groups of unknown or skipped Services are simply never
/// looked up.
fn index_slices(cluster: &ClusterState) -> HashMap<(&str, &str), Vec<&EndpointSlice>> {
    let mut index: HashMap<(&str, &str), Vec<&EndpointSlice>> =
        HashMap::with_capacity(cluster.services.len());
    for slice in cluster.endpoint_slices.values().filter(|s| usable(s)) {
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
        .any(|e| !e.hints_for_zones().is_empty() || !e.hints_for_nodes().is_empty());
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
    fn zone_hints(&self, synth: Synthesis) -> &'a [ArcStr] {
        match synth {
            Synthesis::Off => self.ep.hints_for_zones(),
            Synthesis::Zone | Synthesis::ZoneAndNode => own(&self.ep.zone),
        }
    }

    fn node_hints(&self, synth: Synthesis) -> &'a [ArcStr] {
        match synth {
            Synthesis::Off => self.ep.hints_for_nodes(),
            Synthesis::Zone => &[],
            Synthesis::ZoneAndNode => own(&self.ep.node_name),
        }
    }

    /// Effective hints: the slice's own (shared), `none` when there are
    /// none, else made.
    fn hints(&self, synth: Synthesis, none: &Arc<EndpointHints>) -> Arc<EndpointHints> {
        let (zones, nodes) = (self.zone_hints(synth), self.node_hints(synth));
        match (synth, &self.ep.hints) {
            _ if zones.is_empty() && nodes.is_empty() => none.clone(),
            (Synthesis::Off, Some(own)) => own.clone(),
            _ => Arc::new(EndpointHints {
                for_zones: zones.to_vec(),
                for_nodes: nodes.to_vec(),
            }),
        }
    }
}

fn own(value: &Option<ArcStr>) -> &[ArcStr] {
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
) -> Option<ServiceEndpoints> {
    let service_type = match svc.service_type {
        ServiceType::ClusterIp => LocalServiceType::ClusterIp,
        ServiceType::NodePort => LocalServiceType::NodePort,
        ServiceType::LoadBalancer => LocalServiceType::LoadBalancer,
        ServiceType::ExternalName => return None,
    };
    let ports = sorted_ports(svc);
    let synth = synthesis_for(svc, slices, env.synthesize_hints);
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

    // One allocation for the hints of every endpoint that has none.
    let no_hints = Arc::new(EndpointHints::default());
    let mut shared = SharedPorts::default();
    let mut endpoints = Vec::with_capacity(entries.ips.len());
    endpoints.extend(
        (0..entries.ips.len())
            .map(|row| local_endpoint(&entries, row, &ports, synth, &no_hints, &mut shared)),
    );
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
    let hinted = |hints: &[ArcStr], target: Option<&str>| {
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
    no_hints: &Arc<EndpointHints>,
    shared: &mut SharedPorts,
) -> LocalEndpoint {
    let best = &entries.best[row];
    let backing = entries.backing_of(row);
    shared.scratch.clear();
    shared.scratch.extend(
        ports
            .iter()
            .zip(backing)
            .zip(entries.scopes_of(row))
            .filter_map(|((port, backing), scopes)| {
                backing.map(|(_, number)| EndpointPort {
                    name: port.name.clone(),
                    protocol: port.protocol,
                    port: number,
                    scopes: *scopes,
                })
            }),
    );
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
        hints: best.hints(synth, no_hints),
        ports: shared.take(),
        target_ref: best.ep.target_ref.clone(),
    }
}

/// The port lists of one service's endpoints: an endpoint whose ports
/// and scopes equal those of an earlier one shares its slice, so a
/// quarter of a million endpoints do not each keep a copy.
#[derive(Default)]
struct SharedPorts {
    scratch: Vec<EndpointPort>,
    /// The distinct lists seen so far; a service has few.
    seen: Vec<EndpointPorts>,
}

impl SharedPorts {
    /// The shared slice equal to `scratch`.
    fn take(&mut self) -> EndpointPorts {
        if let Some(p) = self.seen.iter().find(|p| p[..] == self.scratch[..]) {
            return p.clone();
        }
        let p = EndpointPorts::from(self.scratch.as_slice());
        // Bounded: a pathological service does not get a quadratic scan.
        if self.seen.len() < 8 {
            self.seen.push(p.clone());
        }
        p
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
        TargetPort::Number(n) => (*n, ArcStr::default()),
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
#[path = "compute_tests/mod.rs"]
mod tests;
