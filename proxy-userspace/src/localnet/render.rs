//! Output formats of `localnet watch` and `dump`: a human text view, and
//! JSON / YAML in the proto3 JSON mapping of localnet.v1.

use std::fmt::Write as _;

use proto::localnet::v1 as pb;

use super::client::State;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
    Yaml,
}

#[derive(Debug, thiserror::Error)]
#[error("encoding the state: {0}")]
pub struct RenderError(String);

/// Renders one state; the result ends with a newline.
pub fn render(state: &State, format: OutputFormat) -> Result<String, RenderError> {
    match format {
        OutputFormat::Text => Ok(text(state)),
        OutputFormat::Json => {
            let mut s = serde_json::to_string(&structured(state)?)
                .map_err(|e| RenderError(e.to_string()))?;
            s.push('\n');
            Ok(s)
        }
        OutputFormat::Yaml => {
            let body = crate::yaml::to_string(&structured(state)?)
                .map_err(|e| RenderError(e.to_string()))?;
            Ok(format!("---\n{body}"))
        }
    }
}

fn structured(state: &State) -> Result<serde_json::Value, RenderError> {
    let services = serde_json::to_value(&state.services).map_err(|e| RenderError(e.to_string()))?;
    // uint64 as decimal strings, as the proto3 JSON mapping does.
    Ok(serde_json::json!({
        "instance_id": state.instance_id.to_string(),
        "rev": state.rev.to_string(),
        "services": services,
    }))
}

fn protocol(p: i32) -> &'static str {
    match pb::Protocol::try_from(p) {
        Ok(pb::Protocol::Tcp) => "TCP",
        Ok(pb::Protocol::Udp) => "UDP",
        Ok(pb::Protocol::Sctp) => "SCTP",
        _ => "?",
    }
}

fn policy(p: i32) -> &'static str {
    match pb::TrafficPolicy::try_from(p) {
        Ok(pb::TrafficPolicy::Local) => "Local",
        _ => "Cluster",
    }
}

fn ips(set: Option<&pb::IpSet>) -> Vec<String> {
    set.map(|s| s.v4.iter().chain(&s.v6).cloned().collect())
        .unwrap_or_default()
}

fn text(state: &State) -> String {
    let endpoints: usize = state.services.iter().map(|s| s.endpoints.len()).sum();
    let mut out = format!(
        "# localnet instance={} rev={} services={} endpoints={}\n",
        state.instance_id,
        state.rev,
        state.services.len(),
        endpoints
    );
    for se in &state.services {
        let Some(svc) = &se.service else { continue };
        let kind = match pb::ServiceType::try_from(svc.r#type) {
            Ok(pb::ServiceType::NodePort) => "NodePort",
            Ok(pb::ServiceType::LoadBalancer) => "LoadBalancer",
            _ => "ClusterIP",
        };
        let addrs = svc.ips.as_ref();
        let mut line = format!(
            "{}/{} {} {}",
            svc.namespace,
            svc.name,
            kind,
            ips(addrs.and_then(|i| i.cluster_ips.as_ref())).join(",")
        );
        let ports: Vec<String> = svc
            .ports
            .iter()
            .map(|p| {
                let mut s = String::new();
                if !p.name.is_empty() {
                    let _ = write!(s, "{} ", p.name);
                }
                let _ = write!(s, "{}/{}", p.port, protocol(p.protocol));
                if p.node_port != 0 {
                    let _ = write!(s, " nodePort={}", p.node_port);
                }
                match (&p.target_port_name, p.target_port) {
                    (n, _) if !n.is_empty() => {
                        let _ = write!(s, "->{n}");
                    }
                    (_, t) if t != 0 => {
                        let _ = write!(s, "->{t}");
                    }
                    _ => {}
                }
                s
            })
            .collect();
        let _ = write!(line, " [{}]", ports.join(", "));
        for (label, set) in [
            ("externalIPs", addrs.and_then(|i| i.external_ips.as_ref())),
            (
                "loadBalancerIPs",
                addrs.and_then(|i| i.load_balancer_ips.as_ref()),
            ),
        ] {
            let list = ips(set);
            if !list.is_empty() {
                let _ = write!(line, " {label}={}", list.join(","));
            }
        }
        let _ = write!(
            line,
            " iTP={} eTP={}",
            policy(svc.internal_traffic_policy),
            policy(svc.external_traffic_policy)
        );
        if let Some(pb::session_affinity::Affinity::ClientIp(a)) = svc
            .session_affinity
            .as_ref()
            .and_then(|a| a.affinity.as_ref())
        {
            let _ = write!(line, " affinity=ClientIP/{}s", a.timeout_seconds);
        }
        if !svc.traffic_distribution.is_empty() {
            let _ = write!(line, " trafficDistribution={}", svc.traffic_distribution);
        }
        if svc.health_check_node_port != 0 {
            let _ = write!(line, " healthCheckNodePort={}", svc.health_check_node_port);
        }
        if se.endpoints.is_empty() {
            line.push_str(" (no endpoints)");
        }
        out.push_str(&line);
        out.push('\n');
        for ep in &se.endpoints {
            let c = ep.conditions.unwrap_or_default();
            let condition = if c.ready {
                "ready"
            } else if c.serving && c.terminating {
                "serving,terminating"
            } else if c.terminating {
                "terminating"
            } else {
                "not-ready"
            };
            let mut l = format!("    {} {}", ep.ip, condition);
            if !ep.node_name.is_empty() {
                let _ = write!(l, " node={}", ep.node_name);
            }
            if ep.local {
                l.push_str(" (local)");
            }
            if !ep.zone.is_empty() {
                let _ = write!(l, " zone={}", ep.zone);
            }
            for p in &ep.ports {
                let s = p.scopes.unwrap_or_default();
                let scopes: Vec<&str> = [
                    (s.cluster, "cluster"),
                    (s.local, "local"),
                    (s.internal, "internal"),
                    (s.external, "external"),
                ]
                .into_iter()
                .filter_map(|(on, name)| on.then_some(name))
                .collect();
                let name = if p.name.is_empty() {
                    String::new()
                } else {
                    format!("{} ", p.name)
                };
                let scopes = if scopes.is_empty() {
                    "-".to_owned()
                } else {
                    scopes.join(",")
                };
                let _ = write!(l, " | {name}{}/{} {scopes}", p.port, protocol(p.protocol));
            }
            out.push_str(&l);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> State {
        State {
            instance_id: 0xabc,
            rev: 2,
            services: vec![pb::ServiceEndpoints {
                service: Some(pb::Service {
                    namespace: "default".into(),
                    name: "web".into(),
                    r#type: pb::ServiceType::ClusterIp.into(),
                    ips: Some(pb::ServiceIPs {
                        cluster_ips: Some(pb::IpSet {
                            v4: vec!["10.96.0.10".into()],
                            v6: vec![],
                        }),
                        ..Default::default()
                    }),
                    ports: vec![pb::PortMapping {
                        name: "http".into(),
                        protocol: pb::Protocol::Tcp.into(),
                        port: 80,
                        target_port: 8080,
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                endpoints: vec![pb::Endpoint {
                    ip: "10.244.1.2".into(),
                    node_name: "n1".into(),
                    local: true,
                    conditions: Some(pb::EndpointConditions {
                        ready: true,
                        serving: true,
                        terminating: false,
                    }),
                    ports: vec![pb::EndpointPort {
                        name: "http".into(),
                        protocol: pb::Protocol::Tcp.into(),
                        port: 8080,
                        scopes: Some(pb::EndpointScopes {
                            cluster: true,
                            internal: true,
                            ..Default::default()
                        }),
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn text_shows_service_ports_and_endpoint_scopes() {
        let t = render(&sample(), OutputFormat::Text).unwrap();
        assert_eq!(
            t,
            "# localnet instance=2748 rev=2 services=1 endpoints=1\n\
             default/web ClusterIP 10.96.0.10 [http 80/TCP->8080] iTP=Cluster eTP=Cluster\n    \
             10.244.1.2 ready node=n1 (local) | http 8080/TCP cluster,internal\n"
        );
    }

    #[test]
    fn json_uses_proto_field_names_and_string_u64() {
        let j = render(&sample(), OutputFormat::Json).unwrap();
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["rev"], "2");
        assert_eq!(v["services"][0]["service"]["name"], "web");
        assert_eq!(v["services"][0]["endpoints"][0]["node_name"], "n1");
        let y = render(&sample(), OutputFormat::Yaml).unwrap();
        assert!(y.starts_with("---\n"), "{y}");
        assert!(y.contains("name: web"), "{y}");
    }
}
