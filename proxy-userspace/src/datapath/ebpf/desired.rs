//! What the maps should hold: one [`DesiredService`] per service address
//! a service owns (see [`crate::model::claims`]), from a [`LocalState`].

use proxy_common::SVC_FLAG_AFFINITY;

use super::codec::{BackendAddr, Vip};
use crate::model::claims::{Claims, Frontend, FrontendIp};
use crate::model::{LocalState, ObjectKey, ServiceEndpoints};

/// What one VIP should translate to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredService {
    pub vip: Vip,
    pub owner: ObjectKey,
    /// `Some(seconds)` for ClientIP session affinity.
    pub affinity_timeout: Option<u32>,
    /// Sorted, no duplicates; empty = refuse connections.
    pub backends: Vec<BackendAddr>,
}

impl DesiredService {
    pub(super) fn flags(&self) -> u16 {
        if self.affinity_timeout.is_some() {
            SVC_FLAG_AFFINITY
        } else {
            0
        }
    }
}

/// The VIPs of one service and their backends.
///
/// Cluster IPs use the endpoints whose port scope `internal` is set (that
/// already encodes internalTrafficPolicy and topology); external IPs and
/// load-balancer IPs reached from inside the node use the `cluster` scope.
/// Node ports are not handled by the socket hooks.
pub fn desired_services(se: &ServiceEndpoints, claims: &Claims) -> Vec<DesiredService> {
    let svc = &se.service;
    let mut out = Vec::new();
    for pm in &svc.ports {
        let proto = pm.protocol.ip_number();
        let backends = |family_v4: bool, internal: bool| -> Vec<BackendAddr> {
            let mut b: Vec<BackendAddr> = se
                .endpoints
                .iter()
                .filter(|e| e.ip.is_ipv4() == family_v4)
                .flat_map(|e| {
                    e.ports
                        .iter()
                        .filter(|p| p.name == pm.name && p.protocol == pm.protocol)
                        .filter(|p| {
                            if internal {
                                p.scopes.internal
                            } else {
                                p.scopes.cluster
                            }
                        })
                        .map(|p| BackendAddr {
                            ip: e.ip,
                            port: p.port,
                        })
                })
                .collect();
            b.sort_unstable();
            b.dedup();
            b
        };
        let vips = svc
            .cluster_ips
            .iter()
            .map(|ip| (ip, true))
            .chain(svc.external_ips.iter().map(|ip| (ip, false)))
            .chain(svc.load_balancer_ips.iter().map(|ip| (ip, false)));
        for (ip, internal) in vips {
            let frontend = Frontend {
                ip: FrontendIp::Ip(ip),
                protocol: pm.protocol,
                port: pm.port,
            };
            if !claims.owns(&svc.key, &frontend) {
                continue;
            }
            out.push(DesiredService {
                vip: Vip {
                    ip,
                    port: pm.port,
                    proto,
                },
                owner: svc.key.clone(),
                affinity_timeout: svc.session_affinity_timeout,
                backends: backends(ip.is_ipv4(), internal),
            });
        }
    }
    out
}

/// Every VIP of a state that its service owns.
pub fn desired_state(state: &LocalState, claims: &Claims) -> Vec<DesiredService> {
    state
        .services
        .iter()
        .flat_map(|se| desired_services(se, claims))
        .collect()
}
