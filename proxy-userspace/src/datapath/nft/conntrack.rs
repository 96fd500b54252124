//! UDP conntrack cleanup after a sync. UDP has no connection end, so a
//! client that keeps its source port keeps its conntrack entry, and with it
//! the DNAT to an endpoint that is gone, or the reject cached while the
//! service had no endpoints. kube-proxy deletes those entries; so does
//! this, with the `conntrack` tool (Debian package `conntrack`).
//!
//! [`plan`] is pure: two versions of a service in, the deletions out.

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::model::{Protocol, ServiceEndpoints};

/// One `conntrack -D` filter.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Flush {
    /// Entries for `vip:port` DNATed to `endpoint` (the endpoint is gone).
    Endpoint {
        vip: IpAddr,
        port: u16,
        endpoint: IpAddr,
    },
    /// Node-port entries DNATed to `endpoint` (the endpoint is gone).
    NodePortEndpoint { port: u16, endpoint: IpAddr },
    /// Every entry for `vip:port` (the service got its first endpoint; the
    /// entries hold the earlier reject).
    Service { vip: IpAddr, port: u16 },
}

impl Flush {
    /// The `conntrack` arguments.
    pub fn args(&self) -> Vec<String> {
        let family = |ip: &IpAddr| if ip.is_ipv4() { "ipv4" } else { "ipv6" };
        let mut a: Vec<String> = vec!["-D".into()];
        match self {
            Flush::Endpoint {
                vip,
                port,
                endpoint,
            } => a.extend([
                "-f".into(),
                family(vip).into(),
                "-p".into(),
                "udp".into(),
                "--orig-dst".into(),
                vip.to_string(),
                "--orig-port-dst".into(),
                port.to_string(),
                "--reply-src".into(),
                endpoint.to_string(),
            ]),
            Flush::NodePortEndpoint { port, endpoint } => a.extend([
                "-f".into(),
                family(endpoint).into(),
                "-p".into(),
                "udp".into(),
                "--orig-port-dst".into(),
                port.to_string(),
                "--reply-src".into(),
                endpoint.to_string(),
            ]),
            Flush::Service { vip, port } => a.extend([
                "-f".into(),
                family(vip).into(),
                "-p".into(),
                "udp".into(),
                "--orig-dst".into(),
                vip.to_string(),
                "--orig-port-dst".into(),
                port.to_string(),
            ]),
        }
        a
    }
}

/// Endpoint IPs serving UDP port `name` in any scope.
fn udp_endpoints(se: Option<&ServiceEndpoints>, name: &str) -> BTreeSet<IpAddr> {
    se.into_iter()
        .flat_map(|se| &se.endpoints)
        .filter(|ep| {
            ep.ports.iter().any(|p| {
                p.name == name
                    && p.protocol == Protocol::Udp
                    && (p.scopes.internal || p.scopes.external)
            })
        })
        .map(|ep| ep.ip)
        .collect()
}

/// The deletions one service change calls for.
pub fn plan(old: Option<&ServiceEndpoints>, new: Option<&ServiceEndpoints>) -> Vec<Flush> {
    let mut out = BTreeSet::new();
    for se in old.iter().chain(new.iter()) {
        let svc = &se.service;
        let vips: Vec<IpAddr> = svc
            .cluster_ips
            .iter()
            .chain(svc.external_ips.iter())
            .chain(svc.load_balancer_ips.iter())
            .collect();
        for pm in svc.ports.iter().filter(|p| p.protocol == Protocol::Udp) {
            let before = udp_endpoints(old, &pm.name);
            let after = udp_endpoints(new, &pm.name);
            for endpoint in before.difference(&after) {
                for vip in vips.iter().filter(|v| v.is_ipv4() == endpoint.is_ipv4()) {
                    out.insert(Flush::Endpoint {
                        vip: *vip,
                        port: pm.port,
                        endpoint: *endpoint,
                    });
                }
                if pm.node_port != 0 {
                    out.insert(Flush::NodePortEndpoint {
                        port: pm.node_port,
                        endpoint: *endpoint,
                    });
                }
            }
            if before.is_empty() && !after.is_empty() {
                for vip in &vips {
                    out.insert(Flush::Service {
                        vip: *vip,
                        port: pm.port,
                    });
                }
            }
        }
    }
    out.into_iter().collect()
}

/// Runs the deletions. Failures are logged, never fatal: the rules are in
/// place, a stale entry only lasts until the flow idles out.
pub fn run(flushes: &[Flush]) {
    for f in flushes {
        let args = f.args();
        match std::process::Command::new("conntrack").args(&args).output() {
            // conntrack exits 1 when nothing matched: nothing to clean.
            Ok(out) if out.status.success() || out.status.code() == Some(1) => {
                tracing::debug!(args = %args.join(" "), "conntrack entries deleted");
            }
            Ok(out) => tracing::warn!(
                args = %args.join(" "),
                error = %String::from_utf8_lossy(&out.stderr).trim(),
                "UDP conntrack cleanup failed"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "UDP conntrack cleanup skipped: cannot run `conntrack` (Debian: apt-get install conntrack)");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::nft::rules::tests::{endpoint, web};
    use crate::model::Protocol;

    fn udp(mut se: ServiceEndpoints) -> ServiceEndpoints {
        se.service.ports[0].protocol = Protocol::Udp;
        for ep in &mut se.endpoints {
            ep.ports[0].protocol = Protocol::Udp;
        }
        se
    }

    #[test]
    fn a_removed_udp_endpoint_loses_its_conntrack_entries() {
        let old = udp(web(
            vec![endpoint("10.244.1.11", true), endpoint("10.244.1.12", true)],
            None,
        ));
        let new = udp(web(vec![endpoint("10.244.1.11", true)], None));
        let flushes = plan(Some(&old), Some(&new));
        assert_eq!(
            flushes,
            [Flush::Endpoint {
                vip: "10.96.0.10".parse().unwrap(),
                port: 80,
                endpoint: "10.244.1.12".parse().unwrap()
            }]
        );
        assert_eq!(
            flushes[0].args().join(" "),
            "-D -f ipv4 -p udp --orig-dst 10.96.0.10 --orig-port-dst 80 --reply-src 10.244.1.12"
        );
    }

    #[test]
    fn a_first_udp_endpoint_clears_the_cached_rejects() {
        let old = udp(web(vec![], None));
        let new = udp(web(vec![endpoint("10.244.1.11", true)], None));
        assert_eq!(
            plan(Some(&old), Some(&new)),
            [Flush::Service {
                vip: "10.96.0.10".parse().unwrap(),
                port: 80
            }]
        );
    }

    #[test]
    fn tcp_services_need_no_cleanup() {
        let old = web(vec![endpoint("10.244.1.12", true)], None);
        assert!(plan(Some(&old), None).is_empty());
    }
}
