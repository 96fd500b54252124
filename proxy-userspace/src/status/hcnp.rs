//! Health-check node ports (SPEC §4.3): for every LoadBalancer Service with
//! `externalTrafficPolicy: Local` and a `healthCheckNodePort`, an HTTP
//! listener that tells cloud load balancers whether this node has local
//! ready endpoints, so they steer traffic only to nodes that can serve it.
//!
//! Listeners follow the published LocalState: opened when a service starts
//! to qualify, answers updated in place, closed when it stops. They listen
//! on the wildcard addresses, or, with `--nodeport-addresses`, on each
//! local address inside those CIDRs (as kube-proxy). A listener that cannot
//! bind is reported once as a `FailedToStartServiceHealthcheck` Warning
//! Event on the Service ([`ServiceEvents`]); the other addresses and ports
//! are unaffected, and the port is tried again with the next state.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::Status;
use crate::events::{ServiceEvents, ServiceRef};
use crate::model::{LocalServiceType, ObjectKey, TrafficPolicy};
use crate::net::Cidr;
use crate::snapshot::{Follower, SnapshotReceiver};

/// The reason of the Event a listener that cannot bind posts.
pub const FAILED_TO_START: &str = "FailedToStartServiceHealthcheck";

/// What the health-check node ports need besides the state.
#[derive(Clone)]
pub struct HcnpConfig {
    /// This node's name, for Event notes.
    pub node_name: String,
    /// `--nodeport-addresses` (empty: the wildcard addresses).
    pub nodeport_addresses: Vec<Cidr>,
    pub events: ServiceEvents,
}

impl HcnpConfig {
    /// The addresses each health-check node port listens on.
    fn listen_ips(&self) -> Vec<IpAddr> {
        if self.nodeport_addresses.is_empty() {
            return vec![
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            ];
        }
        // Not node_addrs::select: kube-proxy binds any local address the
        // CIDRs hold, loopback included (`--nodeport-addresses=127.0.0.1/32`).
        let local = match crate::node_addrs::list() {
            Ok(addrs) => addrs.into_iter().map(|a| a.addr).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "listing the node's addresses for --nodeport-addresses");
                Vec::new()
            }
        };
        select_ips(local, &self.nodeport_addresses)
    }
}

/// The local addresses inside `cidrs`, sorted, without duplicates.
fn select_ips(local: Vec<IpAddr>, cidrs: &[Cidr]) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = local
        .into_iter()
        .filter(|ip| cidrs.iter().any(|c| c.contains(ip)))
        .collect();
    ips.sort_unstable();
    ips.dedup();
    ips
}

/// What one health-check port answers.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Answer {
    service: ObjectKey,
    uid: String,
    local_v4: u32,
    local_v6: u32,
}

/// The body of SPEC §4.3, byte for byte (tab-indented, no final newline).
fn body(service: &ObjectKey, local_endpoints: u32, healthy: bool) -> String {
    let quote = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {local_endpoints},\n\t\"serviceProxyHealthy\": {healthy}\n}}",
        quote(&service.namespace),
        quote(&service.name)
    )
}

#[derive(Clone)]
struct PortState {
    answer: Arc<Mutex<Answer>>,
    status: Arc<Status>,
    v6: bool,
}

async fn respond(State(st): State<PortState>) -> Response {
    let answer = st.answer.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let n = if st.v6 {
        answer.local_v6
    } else {
        answer.local_v4
    };
    let healthy = st.status.healthy();
    let code = if n > 0 && healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut r = (code, body(&answer.service, n, healthy)).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("x-load-balancing-endpoint-weight", HeaderValue::from(n));
    r
}

struct Open {
    answer: Arc<Mutex<Answer>>,
    stop: CancellationToken,
    /// One server per listen address; aborted if still running when the
    /// port is dropped.
    _servers: Vec<AbortOnDropHandle<()>>,
}

/// Binds `addr`; IPv6 listeners are v6-only so the two families stay apart
/// (N is counted per family of the address a request arrives on).
fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let domain = if addr.is_ipv6() {
        socket2::Domain::IPV6
    } else {
        socket2::Domain::IPV4
    };
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_reuse_address(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(128)?;
    TcpListener::from_std(s.into())
}

/// Opens `port` on every listen address; `None` when none could bind.
/// With `report`, every address that fails is reported through
/// `config.events`.
async fn open_port(
    port: u16,
    answer: Answer,
    config: &HcnpConfig,
    report: bool,
    status: &Arc<Status>,
    shutdown: &CancellationToken,
) -> Option<Open> {
    let service = ServiceRef {
        key: answer.service.clone(),
        uid: answer.uid.clone(),
    };
    let answer = Arc::new(Mutex::new(answer));
    let stop = shutdown.child_token();
    let mut servers = Vec::new();
    for ip in config.listen_ips() {
        let addr = SocketAddr::new(ip, port);
        let listener = match bind(addr) {
            Ok(l) => l,
            Err(e) => {
                let note = format!(
                    "node {} failed to start healthcheck \"{}/{}\" on {addr}: {e}",
                    config.node_name, service.key.namespace, service.key.name
                );
                if report {
                    config.events.warning(&service, FAILED_TO_START, note).await;
                } else {
                    tracing::debug!(port, "{note}");
                }
                continue;
            }
        };
        let state = PortState {
            answer: answer.clone(),
            status: status.clone(),
            v6: ip.is_ipv6(),
        };
        let router = Router::new().fallback(respond).with_state(state);
        let stop = stop.clone();
        servers.push(AbortOnDropHandle::new(tokio::spawn(async move {
            let served = axum::serve(listener, router)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await;
            if let Err(e) = served {
                tracing::warn!(port, error = %e, "health check node port server ended");
            }
        })));
    }
    (!servers.is_empty()).then_some(Open {
        answer,
        stop,
        _servers: servers,
    })
}

/// Keeps one listener per qualifying Service port until `shutdown`.
pub async fn run(
    config: HcnpConfig,
    status: Arc<Status>,
    snapshots: SnapshotReceiver,
    shutdown: CancellationToken,
) {
    let mut open: BTreeMap<u16, Open> = BTreeMap::new();
    // Ports whose listeners could not bind, and for which service: retried
    // with every state, reported once.
    let mut failed: BTreeMap<u16, ObjectKey> = BTreeMap::new();
    let mut follower = Follower::new(snapshots, shutdown.clone());
    while let Some(snapshot) = follower.next().await {
        if snapshot.is_synced() {
            let mut wanted: BTreeMap<u16, Answer> = BTreeMap::new();
            for s in &snapshot.state.services {
                let svc = &s.service;
                let qualifies = svc.service_type == LocalServiceType::LoadBalancer
                    && svc.external_traffic_policy == TrafficPolicy::Local
                    && svc.health_check_node_port != 0;
                if qualifies {
                    wanted.insert(
                        svc.health_check_node_port,
                        Answer {
                            service: svc.key.clone(),
                            uid: svc.uid.to_string(),
                            local_v4: s.local_ready_endpoints_v4,
                            local_v6: s.local_ready_endpoints_v6,
                        },
                    );
                }
            }
            open.retain(|port, o| {
                let keep = wanted.get(port).is_some_and(|a| {
                    a.service == o.answer.lock().unwrap_or_else(|e| e.into_inner()).service
                });
                if !keep {
                    tracing::info!(port, "closing health check node port");
                    o.stop.cancel();
                }
                keep
            });
            failed.retain(|port, svc| wanted.get(port).is_some_and(|a| a.service == *svc));
            for (port, answer) in wanted {
                match open.get(&port) {
                    Some(o) => *o.answer.lock().unwrap_or_else(|e| e.into_inner()) = answer,
                    None => {
                        let service = answer.service.clone();
                        // A port that failed for this service was reported
                        // already: retry quietly.
                        let report = failed.get(&port) != Some(&service);
                        if report {
                            tracing::info!(port, %service, "opening health check node port");
                        }
                        match open_port(port, answer, &config, report, &status, &shutdown).await {
                            Some(o) => {
                                failed.remove(&port);
                                open.insert(port, o);
                            }
                            None => {
                                failed.insert(port, service);
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodeport_addresses_select_the_local_addresses_inside_them() {
        let ips = |v: &[&str]| -> Vec<IpAddr> { v.iter().map(|s| s.parse().unwrap()).collect() };
        let local = ips(&[
            "127.0.0.1",
            "192.168.1.5",
            "10.0.0.7",
            "fd00::5",
            "192.168.1.5",
        ]);
        let cidrs = crate::net::parse_cidr_list("192.168.0.0/16,fd00::/8").unwrap();
        assert_eq!(
            select_ips(local.clone(), &cidrs),
            ips(&["192.168.1.5", "fd00::5"])
        );
        let none = crate::net::parse_cidr_list("172.16.0.0/12").unwrap();
        assert!(select_ips(local, &none).is_empty());
    }

    #[test]
    fn body_is_byte_exact() {
        assert_eq!(
            body(&ObjectKey::new("default", "web"), 2, true),
            "{\n\t\"service\": {\n\t\t\"namespace\": \"default\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
    }
}
