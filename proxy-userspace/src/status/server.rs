//! The two HTTP servers: status (`--metrics-bind-address`, 10249) and
//! kube-proxy health (`--healthz-bind-address`, 10256). Handlers read the
//! shared [`Status`] and hand the rendering to the pure modules.
//!
//! Both listeners are bound before anything is served, so a bad or busy
//! address fails start-up with the flag's name.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::Response;
use axum::routing::{any, MethodRouter};
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::checks::{self, HealthEndpoint, Outcome};
use super::health::ProxyEndpoint;
use super::metrics::TEXT_CONTENT_TYPE;
use super::negotiate::{negotiate, Format, Structured, Version};
use super::zpages::{self, Page, StatuszInfo};
use super::Status;

const TEXT_PLAIN: &str = "text/plain; charset=utf-8";
const NOSNIFF: (&str, &str) = ("x-content-type-options", "nosniff");

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("--metrics-bind-address {addr}: {source}")]
    BindMetrics {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("--healthz-bind-address {addr}: {source}")]
    BindHealthz {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("status server on {addr}: {source}")]
    Serve {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// Bound listeners; `None` disables one.
pub struct StatusServers {
    metrics: Option<(SocketAddr, TcpListener)>,
    healthz: Option<(SocketAddr, TcpListener)>,
}

async fn bind(
    addr: Option<SocketAddr>,
    wrap: fn(SocketAddr, std::io::Error) -> StatusError,
) -> Result<Option<(SocketAddr, TcpListener)>, StatusError> {
    let Some(addr) = addr else { return Ok(None) };
    let l = TcpListener::bind(addr).await.map_err(|e| wrap(addr, e))?;
    let local = l.local_addr().map_err(|e| wrap(addr, e))?;
    Ok(Some((local, l)))
}

impl StatusServers {
    pub async fn bind(
        metrics: Option<SocketAddr>,
        healthz: Option<SocketAddr>,
    ) -> Result<Self, StatusError> {
        Ok(StatusServers {
            metrics: bind(metrics, |addr, source| StatusError::BindMetrics {
                addr,
                source,
            })
            .await?,
            healthz: bind(healthz, |addr, source| StatusError::BindHealthz {
                addr,
                source,
            })
            .await?,
        })
    }

    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|(a, _)| *a)
    }

    pub fn healthz_addr(&self) -> Option<SocketAddr> {
        self.healthz.as_ref().map(|(a, _)| *a)
    }

    /// Serves until `shutdown`, letting requests in flight finish.
    pub async fn serve(
        self,
        status: Arc<Status>,
        limits: super::HttpLimits,
        shutdown: CancellationToken,
    ) -> Result<(), StatusError> {
        let mut tasks = tokio::task::JoinSet::new();
        let servers = [
            (self.metrics, status_router(status.clone()), "status server"),
            (self.healthz, health_router(status), "health server"),
        ];
        for (listener, router, what) in servers {
            let Some((addr, l)) = listener else { continue };
            let stop = shutdown.clone();
            tracing::info!(%addr, "{what} listening");
            tasks.spawn(async move {
                super::http_serve::serve(l, addr, router, limits, stop).await;
                Ok::<(), StatusError>(())
            });
        }
        let mut result = Ok(());
        while let Some(r) = tasks.join_next().await {
            match r {
                Ok(Err(e)) if result.is_ok() => {
                    shutdown.cancel();
                    result = Err(e);
                }
                Err(e) => tracing::error!(error = %e, "status server task failed"),
                _ => {}
            }
        }
        result
    }
}

#[derive(Clone)]
struct App {
    status: Arc<Status>,
    /// statusz `Paths`: top-level segments of the routes, sorted.
    paths: Arc<Vec<String>>,
}

fn response(
    code: u16,
    content_type: &str,
    headers: &[(&str, &str)],
    body: impl Into<Body>,
) -> Response {
    let mut r = Response::new(body.into());
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(content_type) {
        h.insert(header::CONTENT_TYPE, v);
    }
    for (name, value) in headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            h.append(n, v);
        }
    }
    r
}

fn text(code: u16, body: impl Into<Body>) -> Response {
    response(code, TEXT_PLAIN, &[NOSNIFF], body)
}

async fn not_found() -> Response {
    text(404, "404 page not found\n")
}

/// The 10249 routes. The statusz `Paths` line is derived from this list.
fn status_routes() -> Vec<(&'static str, MethodRouter<App>)> {
    let mut routes: Vec<(&'static str, MethodRouter<App>)> = vec![
        ("/statusz", any(statusz)),
        ("/flagz", any(flagz)),
        ("/metrics", any(metrics)),
        ("/metrics/slis", any(metrics_slis)),
        ("/proxyMode", any(proxy_mode)),
    ];
    for endpoint in HealthEndpoint::ALL {
        let (root, single) = match endpoint {
            HealthEndpoint::Livez => ("/livez", "/livez/{check}"),
            HealthEndpoint::Readyz => ("/readyz", "/readyz/{check}"),
            HealthEndpoint::Healthz => ("/healthz", "/healthz/{check}"),
        };
        routes.push((
            root,
            any(
                move |State(app): State<App>, RawQuery(q): RawQuery| async move {
                    health_root(&app, endpoint, q.as_deref())
                },
            ),
        ));
        routes.push((
            single,
            any(
                move |State(app): State<App>, Path(check): Path<String>| async move {
                    health_single(&app, endpoint, &check)
                },
            ),
        ));
    }
    routes
}

/// Top-level segment of every path, unique and byte-sorted (SPEC §1.2).
fn top_level_paths<'a>(paths: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = paths
        .map(|p| {
            let rest = p.trim_start_matches('/');
            format!("/{}", rest.split('/').next().unwrap_or_default())
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

pub(crate) fn status_router(status: Arc<Status>) -> Router {
    let routes = status_routes();
    let paths = top_level_paths(routes.iter().map(|(p, _)| *p));
    let app = App {
        status,
        paths: Arc::new(paths),
    };
    routes
        .into_iter()
        .fold(Router::new(), |r, (path, route)| r.route(path, route))
        .fallback(not_found)
        .with_state(app)
}

pub(crate) fn health_router(status: Arc<Status>) -> Router {
    let proxy = |endpoint: ProxyEndpoint| {
        any(move |State(status): State<Arc<Status>>| async move {
            let (code, body) = status.proxy_health(endpoint);
            response(code, "application/json", &[NOSNIFF], body)
        })
    };
    Router::new()
        .route("/healthz", proxy(ProxyEndpoint::Healthz))
        .route("/livez", proxy(ProxyEndpoint::Livez))
        .fallback(not_found)
        .with_state(status)
}

/// `name=value` pairs of a query string, percent-decoded.
fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(&s.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned()
    };
    query
        .unwrap_or_default()
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn health_root(app: &App, endpoint: HealthEndpoint, query: Option<&str>) -> Response {
    let pairs = query_pairs(query);
    let verbose = pairs.iter().any(|(k, _)| k == "verbose");
    let mut unmatched: Vec<String> = pairs
        .into_iter()
        .filter(|(k, _)| k == "exclude")
        .map(|(_, v)| v)
        .collect();
    let metrics = app.status.metrics();
    let mut outcomes = Vec::new();
    for &check in endpoint.checks() {
        let before = unmatched.len();
        unmatched.retain(|n| n != check.name());
        if unmatched.len() != before {
            outcomes.push((check, Outcome::Excluded));
            continue;
        }
        let result = app.status.check(check);
        let labels = [check.name(), endpoint.name()];
        metrics
            .healthcheck
            .with_label_values(&labels)
            .set(i64::from(result.is_ok()));
        let status = if result.is_ok() { "success" } else { "error" };
        metrics
            .healthchecks_total
            .with_label_values(&[check.name(), status, endpoint.name()])
            .inc();
        outcomes.push(match result {
            Ok(()) => (check, Outcome::Passed),
            Err(reason) => {
                tracing::info!(check = check.name(), endpoint = endpoint.name(), %reason, "health check failed");
                (check, Outcome::Failed(reason))
            }
        });
    }
    let (code, body) = checks::render_root(endpoint, &outcomes, &unmatched, verbose);
    text(code, body)
}

fn health_single(app: &App, endpoint: HealthEndpoint, name: &str) -> Response {
    match endpoint.check(name) {
        Some(check) => {
            let (code, body) = checks::render_single(&app.status.check(check));
            text(code, body)
        }
        None => text(404, "404 page not found\n"),
    }
}

/// 405 unless GET or HEAD (SPEC §1.1).
fn method_not_allowed(method: &Method) -> Option<Response> {
    (method != Method::GET && method != Method::HEAD).then(|| {
        response(
            405,
            TEXT_PLAIN,
            &[NOSNIFF, ("allow", "GET, HEAD")],
            "405 method not allowed\n",
        )
    })
}

/// Every `Accept` header, joined as one list.
fn accept(headers: &HeaderMap) -> Option<String> {
    let values: Vec<&str> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    (!values.is_empty()).then(|| values.join(","))
}

/// Negotiates and answers a z-page with `text_body` or `structured`.
fn zpage(
    page: Page,
    method: &Method,
    headers: &HeaderMap,
    text_body: impl FnOnce() -> String,
    structured: impl FnOnce(Structured, Version) -> String,
) -> Response {
    if let Some(r) = method_not_allowed(method) {
        return r;
    }
    match negotiate(accept(headers).as_deref(), page.kind()) {
        None => response(
            406,
            "application/json",
            &[],
            zpages::not_acceptable_body(page),
        ),
        Some(Format::Text) => text(200, text_body()),
        Some(Format::Structured(format, version)) => {
            let warning = page.deprecation_warning();
            let extra: &[(&str, &str)] = if version.deprecated() {
                &[("warning", warning.as_str())]
            } else {
                &[]
            };
            response(200, format.media_type(), extra, structured(format, version))
        }
    }
}

fn statusz_info(app: &App) -> StatuszInfo {
    let started = app.status.started();
    StatuszInfo {
        started: started.wall,
        uptime: started.at.elapsed(),
        rust_version: env!("EKP_RUSTC_VERSION").to_owned(),
        binary_version: env!("CARGO_PKG_VERSION").to_owned(),
        emulation_version: None,
        paths: app.paths.as_ref().clone(),
    }
}

async fn statusz(State(app): State<App>, method: Method, headers: HeaderMap) -> Response {
    let info = statusz_info(&app);
    zpage(
        Page::Statusz,
        &method,
        &headers,
        || zpages::statusz_text(&info, zpages::random_delimiter()),
        |format, version| zpages::statusz_structured(&info, format, version),
    )
}

async fn flagz(State(app): State<App>, method: Method, headers: HeaderMap) -> Response {
    zpage(
        Page::Flagz,
        &method,
        &headers,
        || app.status.flagz_text().to_owned(),
        |format, version| zpages::flagz_structured(app.status.flags(), format, version),
    )
}

async fn metrics(State(app): State<App>) -> Response {
    response(
        200,
        TEXT_CONTENT_TYPE,
        &[],
        app.status.metrics().encode_all(),
    )
}

/// kube-proxy installs the resettable SLI handler: DELETE clears both
/// families.
async fn metrics_slis(State(app): State<App>, method: Method) -> Response {
    let metrics = app.status.metrics();
    if method == Method::DELETE {
        metrics.reset_slis();
        return text(200, "metrics reset\n");
    }
    response(200, TEXT_CONTENT_TYPE, &[], metrics.encode_slis())
}

async fn proxy_mode(State(app): State<App>) -> Response {
    text(200, app.status.active_mode().as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statusz_paths_fold_subpaths_into_their_top_level() {
        let routes = status_routes();
        assert_eq!(
            top_level_paths(routes.iter().map(|(p, _)| *p)),
            [
                "/flagz",
                "/healthz",
                "/livez",
                "/metrics",
                "/proxyMode",
                "/readyz",
                "/statusz"
            ]
        );
    }

    #[test]
    fn query_values_are_decoded_and_repeatable() {
        assert_eq!(
            query_pairs(Some("verbose&exclude=a%2Db&exclude=c+d")),
            [
                ("verbose".to_owned(), String::new()),
                ("exclude".to_owned(), "a-b".to_owned()),
                ("exclude".to_owned(), "c d".to_owned()),
            ]
        );
        assert!(query_pairs(None).is_empty());
    }
}
