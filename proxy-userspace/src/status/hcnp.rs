//! Health-check node ports (SPEC §4.3): for every LoadBalancer Service with
//! `externalTrafficPolicy: Local` and a `healthCheckNodePort`, an HTTP
//! listener that tells cloud load balancers whether this node has local
//! ready endpoints, so they steer traffic only to nodes that can serve it.
//!
//! Listeners follow the published LocalState: opened when a service starts
//! to qualify, answers updated in place, closed when it stops.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::Status;
use crate::model::{LocalServiceType, ObjectKey, TrafficPolicy};
use crate::snapshot::SnapshotReceiver;

/// What one health-check port answers.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Answer {
    service: ObjectKey,
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

fn open_port(
    port: u16,
    answer: Answer,
    status: &Arc<Status>,
    shutdown: &CancellationToken,
) -> Option<Open> {
    let answer = Arc::new(Mutex::new(answer));
    let stop = shutdown.child_token();
    let mut bound = 0;
    for ip in [
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    ] {
        let listener = match bind(SocketAddr::new(ip, port)) {
            Ok(l) => l,
            Err(e) => {
                // Kubernetes would also record a FailedToStartServiceHealthcheck
                // event; other ports are unaffected.
                let svc = answer
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .service
                    .clone();
                tracing::warn!(service = %svc, port, family = if ip.is_ipv6() { "IPv6" } else { "IPv4" }, error = %e, "FailedToStartServiceHealthcheck");
                continue;
            }
        };
        bound += 1;
        let state = PortState {
            answer: answer.clone(),
            status: status.clone(),
            v6: ip.is_ipv6(),
        };
        let router = Router::new().fallback(respond).with_state(state);
        let stop = stop.clone();
        tokio::spawn(async move {
            let served = axum::serve(listener, router)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await;
            if let Err(e) = served {
                tracing::warn!(port, error = %e, "health check node port server ended");
            }
        });
    }
    (bound > 0).then_some(Open { answer, stop })
}

/// Keeps one listener per qualifying Service port until `shutdown`.
/// Listeners bind the wildcard addresses of both families;
/// `--nodeport-addresses` does not narrow them yet.
pub async fn run(
    status: Arc<Status>,
    mut snapshots: SnapshotReceiver,
    shutdown: CancellationToken,
) {
    let mut open: BTreeMap<u16, Open> = BTreeMap::new();
    loop {
        let snapshot = snapshots.borrow_and_update().clone();
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
            for (port, answer) in wanted {
                match open.get(&port) {
                    Some(o) => *o.answer.lock().unwrap_or_else(|e| e.into_inner()) = answer,
                    None => {
                        tracing::info!(port, service = %answer.service, "opening health check node port");
                        if let Some(o) = open_port(port, answer, &status, &shutdown) {
                            open.insert(port, o);
                        }
                    }
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = snapshots.changed() => if changed.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_is_byte_exact() {
        assert_eq!(
            body(&ObjectKey::new("default", "web"), 2, true),
            "{\n\t\"service\": {\n\t\t\"namespace\": \"default\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
    }
}
