//! LocalState (model types) into localnet.v1 messages. Field for field;
//! ordering is already canonical in the model, so equal states encode to
//! identical bytes.

use proto::localnet::v1 as pb;

use crate::model::{self, IpSet, LocalServiceType, Protocol, ServiceEndpoints, TrafficPolicy};

pub fn service_endpoints(s: &ServiceEndpoints) -> pb::ServiceEndpoints {
    let ServiceEndpoints {
        service,
        endpoints,
        local_ready_endpoints_v4,
        local_ready_endpoints_v6,
    } = s;
    pb::ServiceEndpoints {
        service: Some(self::service(service)),
        endpoints: endpoints.iter().map(endpoint).collect(),
        local_ready_endpoints_v4: saturating_i32(*local_ready_endpoints_v4),
        local_ready_endpoints_v6: saturating_i32(*local_ready_endpoints_v6),
    }
}

fn strings(s: &[model::ArcStr]) -> Vec<String> {
    s.iter().map(ToString::to_string).collect()
}

fn saturating_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

pub fn protocol(p: Protocol) -> pb::Protocol {
    match p {
        Protocol::Tcp => pb::Protocol::Tcp,
        Protocol::Udp => pb::Protocol::Udp,
        Protocol::Sctp => pb::Protocol::Sctp,
    }
}

fn traffic_policy(p: TrafficPolicy) -> pb::TrafficPolicy {
    match p {
        TrafficPolicy::Cluster => pb::TrafficPolicy::Cluster,
        TrafficPolicy::Local => pb::TrafficPolicy::Local,
    }
}

fn ip_set(s: &IpSet) -> pb::IpSet {
    pb::IpSet {
        v4: s.v4().iter().map(ToString::to_string).collect(),
        v6: s.v6().iter().map(ToString::to_string).collect(),
    }
}

fn service(s: &model::LocalService) -> pb::Service {
    let model::LocalService {
        key,
        uid,
        service_type,
        labels,
        created: _,
        cluster_ips,
        external_ips,
        load_balancer_ips,
        ports,
        internal_traffic_policy,
        external_traffic_policy,
        session_affinity_timeout,
        health_check_node_port,
        traffic_distribution,
        load_balancer_source_ranges,
    } = s;
    let service_type = match service_type {
        LocalServiceType::ClusterIp => pb::ServiceType::ClusterIp,
        LocalServiceType::NodePort => pb::ServiceType::NodePort,
        LocalServiceType::LoadBalancer => pb::ServiceType::LoadBalancer,
    };
    pb::Service {
        namespace: key.namespace.to_string(),
        name: key.name.to_string(),
        r#type: service_type.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ips: Some(pb::ServiceIPs {
            cluster_ips: Some(ip_set(cluster_ips)),
            external_ips: Some(ip_set(external_ips)),
            load_balancer_ips: Some(ip_set(load_balancer_ips)),
        }),
        ports: ports
            .iter()
            .map(|p| pb::PortMapping {
                name: p.name.to_string(),
                protocol: protocol(p.protocol).into(),
                port: p.port.into(),
                node_port: p.node_port.into(),
                target_port: p.target_port.into(),
                target_port_name: p.target_port_name.to_string(),
                app_protocol: p.app_protocol.to_string(),
            })
            .collect(),
        internal_traffic_policy: traffic_policy(*internal_traffic_policy).into(),
        external_traffic_policy: traffic_policy(*external_traffic_policy).into(),
        session_affinity: session_affinity_timeout.map(|t| pb::SessionAffinity {
            affinity: Some(pb::session_affinity::Affinity::ClientIp(
                pb::ClientIpAffinity {
                    timeout_seconds: saturating_i32(t),
                },
            )),
        }),
        health_check_node_port: (*health_check_node_port).into(),
        traffic_distribution: traffic_distribution.to_string(),
        load_balancer_source_ranges: load_balancer_source_ranges.clone(),
        uid: uid.to_string(),
    }
}

fn endpoint(e: &model::LocalEndpoint) -> pb::Endpoint {
    let model::LocalEndpoint {
        ip,
        hostname,
        node_name,
        zone,
        local,
        conditions,
        hints,
        ports,
        target_ref,
    } = e;
    pb::Endpoint {
        ip: ip.to_string(),
        hostname: hostname.to_string(),
        node_name: node_name.to_string(),
        zone: zone.to_string(),
        local: *local,
        conditions: Some(pb::EndpointConditions {
            ready: conditions.ready,
            serving: conditions.serving,
            terminating: conditions.terminating,
        }),
        hints: Some(pb::EndpointHints {
            for_zones: strings(&hints.for_zones),
            for_nodes: strings(&hints.for_nodes),
        }),
        ports: ports
            .iter()
            .map(|p| pb::EndpointPort {
                name: p.name.to_string(),
                protocol: protocol(p.protocol).into(),
                port: p.port.into(),
                scopes: Some(pb::EndpointScopes {
                    cluster: p.scopes.cluster,
                    local: p.scopes.local,
                    internal: p.scopes.internal,
                    external: p.scopes.external,
                }),
            })
            .collect(),
        target_ref: target_ref.as_ref().map(|r| pb::TargetRef {
            kind: r.kind().to_string(),
            namespace: r.namespace().to_string(),
            name: r.name().to_owned(),
            uid: r.uid().to_string(),
        }),
    }
}
