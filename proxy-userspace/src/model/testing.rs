//! Fixtures for tests of the model's consumers (datapaths, localnet,
//! status): a [`ServiceEndpoints`] built in one line instead of forty.
//! Compiled for the crate's own tests and, with the `testing` feature, for
//! the integration tests and benches.

use std::net::IpAddr;

use super::cluster::{Labels, ObjectKey, Protocol, TrafficPolicy};
use super::intern::ArcStr;
use super::local::*;

/// A ClusterIP service `ns/name` with one TCP port `http` 80 → 8080, the
/// given ClusterIPs and no endpoints.
pub fn service(ns: &str, name: &str, cluster_ips: &[&str]) -> ServiceEndpoints {
    ServiceEndpoints {
        service: LocalService {
            key: ObjectKey::new(ns, name),
            uid: format!("uid-{name}").into(),
            service_type: LocalServiceType::ClusterIp,
            labels: Labels::default(),
            created: None,
            cluster_ips: ips(cluster_ips),
            external_ips: IpSet::default(),
            load_balancer_ips: IpSet::default(),
            ports: vec![PortMapping {
                name: "http".into(),
                protocol: Protocol::Tcp,
                port: 80,
                node_port: 0,
                target_port: 8080,
                target_port_name: ArcStr::default(),
                app_protocol: ArcStr::default(),
            }],
            internal_traffic_policy: TrafficPolicy::Cluster,
            external_traffic_policy: TrafficPolicy::Cluster,
            session_affinity_timeout: None,
            health_check_node_port: 0,
            traffic_distribution: ArcStr::default(),
            load_balancer_source_ranges: vec![],
        },
        endpoints: vec![],
        local_ready_endpoints_v4: 0,
        local_ready_endpoints_v6: 0,
    }
}

/// Parses addresses into an [`IpSet`].
pub fn ips(addrs: &[&str]) -> IpSet {
    let parsed: Vec<IpAddr> = addrs
        .iter()
        .map(|a| a.parse().expect("an IP address"))
        .collect();
    IpSet::from_ips(&parsed)
}

/// A ready endpoint at `ip` backing port `http` on `port` with `scopes`.
pub fn endpoint(ip: &str, port: u16, scopes: EndpointScopes) -> LocalEndpoint {
    endpoint_at(ip.parse().expect("an IP address"), port, scopes)
}

/// [`endpoint`] for an address already parsed.
pub fn endpoint_at(ip: IpAddr, port: u16, scopes: EndpointScopes) -> LocalEndpoint {
    LocalEndpoint {
        ip,
        hostname: Default::default(),
        node_name: Default::default(),
        zone: Default::default(),
        local: false,
        conditions: EndpointConditions {
            ready: true,
            serving: true,
            terminating: false,
        },
        hints: Default::default(),
        ports: [EndpointPort {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port,
            scopes,
        }]
        .into(),
        target_ref: None,
    }
}

/// Every scope set: an endpoint usable for all traffic.
pub const ALL_SCOPES: EndpointScopes = EndpointScopes {
    cluster: true,
    local: true,
    internal: true,
    external: true,
};

impl ServiceEndpoints {
    /// Sets the externalIPs.
    pub fn with_external_ips(mut self, addrs: &[&str]) -> Self {
        self.service.external_ips = ips(addrs);
        self
    }

    /// Sets the LoadBalancer ingress IPs (and the type).
    pub fn with_load_balancer_ips(mut self, addrs: &[&str]) -> Self {
        self.service.load_balancer_ips = ips(addrs);
        self.service.service_type = LocalServiceType::LoadBalancer;
        self
    }

    /// Gives every port a NodePort, `first` upwards (and the type, unless
    /// already LoadBalancer).
    pub fn with_node_port(mut self, first: u16) -> Self {
        for (i, p) in self.service.ports.iter_mut().enumerate() {
            p.node_port = first + i as u16;
        }
        if self.service.service_type == LocalServiceType::ClusterIp {
            self.service.service_type = LocalServiceType::NodePort;
        }
        self
    }

    /// Sets the creationTimestamp (Unix seconds).
    pub fn created_at(mut self, unix_seconds: i64) -> Self {
        self.service.created = Some(unix_seconds);
        self
    }

    /// Sets the service port number of every port.
    pub fn with_port(mut self, port: u16) -> Self {
        for p in &mut self.service.ports {
            p.port = port;
        }
        self
    }

    /// Appends endpoints.
    pub fn with_endpoints(mut self, endpoints: impl IntoIterator<Item = LocalEndpoint>) -> Self {
        self.endpoints.extend(endpoints);
        self
    }

    /// Replaces the ports with `(name, protocol, port)` each (no target
    /// port, no NodePort); add endpoints afterwards.
    pub fn with_ports(mut self, ports: &[(&str, Protocol, u16)]) -> Self {
        self.service.ports = ports
            .iter()
            .map(|(name, protocol, port)| PortMapping {
                name: (*name).into(),
                protocol: *protocol,
                port: *port,
                node_port: 0,
                target_port: 0,
                target_port_name: ArcStr::default(),
                app_protocol: ArcStr::default(),
            })
            .collect();
        self
    }

    /// Appends a ready endpoint at `ip` serving every port of the service
    /// on `port`. A `local` one runs on this node ("n1", counted as a local
    /// ready endpoint) and has every scope; another node's ("n2") lacks
    /// the local scope, as `compute` gives it.
    pub fn with_ready_endpoint(mut self, ip: &str, port: u16, local: bool) -> Self {
        let ip: IpAddr = ip.parse().expect("an IP address");
        let scopes = EndpointScopes {
            local,
            ..ALL_SCOPES
        };
        let ports = self
            .service
            .ports
            .iter()
            .map(|p| EndpointPort {
                name: p.name.clone(),
                protocol: p.protocol,
                port,
                scopes,
            })
            .collect();
        if local {
            match ip {
                IpAddr::V4(_) => self.local_ready_endpoints_v4 += 1,
                IpAddr::V6(_) => self.local_ready_endpoints_v6 += 1,
            }
        }
        self.endpoints.push(LocalEndpoint {
            ip,
            node_name: if local { "n1" } else { "n2" }.into(),
            local,
            ports,
            ..endpoint(&ip.to_string(), port, ALL_SCOPES)
        });
        self
    }

    /// Sets ClientIP session affinity with this timeout (seconds).
    pub fn with_affinity(mut self, timeout_seconds: u32) -> Self {
        self.service.session_affinity_timeout = Some(timeout_seconds);
        self
    }

    /// externalTrafficPolicy=Local: the external scope keeps only the
    /// endpoints of this node, as `compute` sets it.
    pub fn with_external_policy_local(mut self) -> Self {
        self.service.external_traffic_policy = TrafficPolicy::Local;
        for e in &mut self.endpoints {
            let mut ports = e.ports.to_vec();
            for p in &mut ports {
                p.scopes.external = e.local;
            }
            e.ports = ports.into();
        }
        self
    }

    /// Sets loadBalancerSourceRanges.
    pub fn with_source_ranges(mut self, ranges: &[&str]) -> Self {
        self.service.load_balancer_source_ranges = ranges.iter().map(|r| (*r).to_owned()).collect();
        self
    }
}

/// A state of `services`, sorted as `compute` sorts it.
pub fn state(services: Vec<ServiceEndpoints>) -> LocalState {
    LocalState::new(services)
}
