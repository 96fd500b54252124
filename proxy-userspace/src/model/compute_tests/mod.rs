//! The endpoint-selection rules (SPEC §8) as a table of cases, with the
//! fixtures and the machinery that runs it.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use super::super::cluster::{
    EndpointHints, EndpointSlicePort, Labels, LoadBalancerIngress, ObjectKey, Protocol,
    DEFAULT_AFFINITY_TIMEOUT_SECONDS, LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME, LABEL_ZONE,
};
use super::super::target_ref::TargetRef;
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
        uid: format!("uid-{name}").into(),
        labels: Labels::default(),
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
            s.labels.insert(k, v);
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
        labels: Labels::from_iter([(LABEL_SERVICE_NAME, service)]),
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
            s.labels.insert(k, v);
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
        hints: None,
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
        self.with(|e| hints(e).for_zones = zones.iter().map(|&z| z.into()).collect())
    }
    fn hn(self, nodes: &[&str]) -> Self {
        self.with(|e| hints(e).for_nodes = nodes.iter().map(|&n| n.into()).collect())
    }
}

fn hints(e: &mut Endpoint) -> &mut EndpointHints {
    Arc::make_mut(e.hints.get_or_insert_with(Default::default))
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
            .map(|z| Labels::from_iter([(LABEL_ZONE, z)]))
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
            .map(|s| (s.key.clone(), Box::new(s.clone())))
            .collect(),
        endpoint_slices: slices
            .iter()
            .map(|s| (s.key.clone(), Box::new(s.clone())))
            .collect(),
        nodes: nodes.iter().map(|n| (n.name.clone(), n.clone())).collect(),
        pods: BTreeMap::new(),
    }
}

/// Services and a slice the cases of both case files start from.
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
    for p in e.ports.iter() {
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
                let got: Vec<String> = get(&out, service).endpoints.iter().map(render).collect();
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
    let mut cases = cases::cases();
    cases.extend(cases_more::cases());
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

mod cases;
mod cases_more;

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
