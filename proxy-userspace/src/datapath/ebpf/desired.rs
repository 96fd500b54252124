//! What the maps should hold: one [`DesiredService`] per service address
//! a service owns (see [`crate::model::claims`]), from a [`LocalState`].

use std::borrow::Borrow;
use std::net::IpAddr;

use proxy_common::{SVC_FLAG_AFFINITY, SVC_FLAG_REJECT, SVC_FLAG_SOURCE_RANGES};

use super::codec::{BackendAddr, Scope, Vip};
use crate::model::claims::{Claims, Frontend, FrontendIp};
use crate::model::{EndpointScopes, LocalState, ObjectKey, ServiceEndpoints};
use crate::net::Cidr;

/// What one VIP should translate to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredService {
    pub vip: Vip,
    pub owner: ObjectKey,
    /// `Some(seconds)` for ClientIP session affinity.
    pub affinity_timeout: Option<u32>,
    /// loadBalancerSourceRanges of the VIP's family (external scope, LB
    /// IPs): `Some` restricts the sources, also when empty.
    pub source_ranges: Option<Vec<Cidr>>,
    /// Sorted, no duplicates; empty = refuse connections.
    pub backends: Vec<BackendAddr>,
    /// Endpoints of the VIP that terminate but still serve and are not
    /// picked any more: their TCP connections (socket scope) and tracked
    /// flows (external scope) drain.
    pub draining: Vec<BackendAddr>,
    /// External scope without backends because the service port has no
    /// usable endpoint at all (not because of externalTrafficPolicy
    /// Local): new flows are rejected, as kube-proxy does, not dropped.
    pub reject: bool,
}

impl DesiredService {
    pub(super) fn flags(&self) -> u16 {
        let mut flags = 0;
        if self.affinity_timeout.is_some() {
            flags |= SVC_FLAG_AFFINITY;
        }
        if self.source_ranges.is_some() {
            flags |= SVC_FLAG_SOURCE_RANGES;
        }
        if self.reject {
            flags |= SVC_FLAG_REJECT;
        }
        flags
    }
}

/// The VIPs of one service and their backends.
///
/// Socket scope (connections made on the node): cluster IPs use the
/// endpoints whose port scope `internal` is set (that already encodes
/// internalTrafficPolicy and topology); external IPs, load-balancer IPs and
/// node ports on `node_ips` use the `cluster` scope, as kube-proxy does for
/// traffic from the node itself.
///
/// External scope (packets arriving on a node interface, the tc
/// programs): external IPs, load-balancer IPs and node ports on
/// `node_ips`, with the `external` scope (externalTrafficPolicy); only
/// load-balancer IPs carry loadBalancerSourceRanges, as with kube-proxy.
pub fn desired_services(
    se: &ServiceEndpoints,
    claims: &Claims,
    node_ips: &[IpAddr],
) -> Vec<DesiredService> {
    let svc = &se.service;
    let mut out = Vec::new();
    let ranges: Vec<Cidr> = {
        let mut r: Vec<Cidr> = svc
            .load_balancer_source_ranges
            .iter()
            .filter_map(|c| c.parse().ok())
            .collect();
        r.sort_unstable();
        r.dedup();
        r
    };
    for pm in &svc.ports {
        let proto = pm.protocol.ip_number();
        let backends = |family_v4: bool,
                        pick: fn(&EndpointScopes) -> bool,
                        draining: bool|
         -> Vec<BackendAddr> {
            let mut b: Vec<BackendAddr> = se
                .endpoints
                .iter()
                .filter(|e| e.ip.is_ipv4() == family_v4)
                .filter(|e| !draining || (e.conditions.serving && e.conditions.terminating))
                .flat_map(|e| {
                    e.ports
                        .iter()
                        .filter(|p| p.name == pm.name && p.protocol == pm.protocol)
                        .filter(|p| pick(&p.scopes) != draining)
                        .map(|p| BackendAddr {
                            ip: e.ip,
                            port: p.port,
                            local: e.local,
                        })
                })
                .collect();
            b.sort_unstable();
            b.dedup();
            b
        };
        // kube-proxy's "has endpoints": any endpoint of the family that a
        // cluster- or node-local policy would use.
        let usable = |family_v4: bool| {
            se.endpoints
                .iter()
                .filter(|e| e.ip.is_ipv4() == family_v4)
                .flat_map(|e| e.ports.iter())
                .filter(|p| p.name == pm.name && p.protocol == pm.protocol)
                .any(|p| p.scopes.cluster || p.scopes.local)
        };
        let mut push = |ip: IpAddr,
                        port: u16,
                        scope: Scope,
                        pick: fn(&EndpointScopes) -> bool,
                        source_ranges: &[Cidr]| {
            let family: Vec<Cidr> = source_ranges
                .iter()
                .filter(|c| c.addr.is_ipv4() == ip.is_ipv4())
                .copied()
                .collect();
            out.push(DesiredService {
                vip: Vip {
                    ip,
                    port,
                    proto,
                    scope,
                },
                owner: svc.key.clone(),
                affinity_timeout: svc.session_affinity_timeout,
                // Ranges that leave out the VIP's whole family still
                // restrict it: no source of that family is listed.
                source_ranges: if source_ranges.is_empty() {
                    None
                } else {
                    Some(family)
                },
                backends: backends(ip.is_ipv4(), pick, false),
                draining: backends(ip.is_ipv4(), pick, true),
                reject: scope == Scope::External && !usable(ip.is_ipv4()),
            });
        };
        let owns = |ip: FrontendIp, port: u16| {
            claims.owns(
                &svc.key,
                &Frontend {
                    ip,
                    protocol: pm.protocol,
                    port,
                },
            )
        };
        let internal: fn(&EndpointScopes) -> bool = |s| s.internal;
        let cluster: fn(&EndpointScopes) -> bool = |s| s.cluster;
        let external: fn(&EndpointScopes) -> bool = |s| s.external;
        for ip in svc.cluster_ips.iter() {
            if owns(FrontendIp::Ip(ip), pm.port) {
                push(ip, pm.port, Scope::Socket, internal, &[]);
            }
        }
        for ip in svc.external_ips.iter() {
            if owns(FrontendIp::Ip(ip), pm.port) {
                push(ip, pm.port, Scope::Socket, cluster, &[]);
                push(ip, pm.port, Scope::External, external, &[]);
            }
        }
        for ip in svc.load_balancer_ips.iter() {
            if owns(FrontendIp::Ip(ip), pm.port) {
                // The ranges hold for the node's own sockets too (checked
                // on their first packet, see lb_source.rs); the trie holds
                // them once, for the external frontend.
                push(ip, pm.port, Scope::Socket, cluster, &ranges);
                push(ip, pm.port, Scope::External, external, &ranges);
            }
        }
        if pm.node_port != 0 && owns(FrontendIp::NodePort, pm.node_port) {
            for &ip in node_ips {
                push(ip, pm.node_port, Scope::Socket, cluster, &[]);
                push(ip, pm.node_port, Scope::External, external, &[]);
            }
        }
    }
    // Two frontends of one service may land on one VIP (a node port equal
    // to another port on a node address): the first wins.
    let mut seen = hashbrown::HashSet::new();
    out.retain(|d| seen.insert(d.vip));
    out
}

/// Every VIP of a state that its service owns.
pub fn desired_state(
    state: &LocalState,
    claims: &Claims,
    node_ips: &[IpAddr],
) -> Vec<DesiredService> {
    desired_of(&state.services, claims, node_ips)
}

/// Every VIP of these services that its service owns.
pub fn desired_of<S: Borrow<ServiceEndpoints>>(
    services: &[S],
    claims: &Claims,
    node_ips: &[IpAddr],
) -> Vec<DesiredService> {
    services
        .iter()
        .flat_map(|se| desired_services(se.borrow(), claims, node_ips))
        .collect()
}
