//! A fake Kubernetes API server speaking the real list/watch protocol for
//! Services, EndpointSlices, Nodes and Pods (there is no kube-apiserver
//! binary to be had on these machines).
//!
//! * `GET <collection>` lists (label and field selectors, a list
//!   `resourceVersion`, pages of `limit` objects with a `continue` token,
//!   as kube-rs' watchers ask for: 500); `?watch=true&resourceVersion=R` streams
//!   newline-delimited ADDED/MODIFIED/DELETED events after R, BOOKMARKs when
//!   asked, and an ERROR event with a 410 `Expired` Status when R is older
//!   than the retained history.
//! * `GET /version` answers as a v1.33 server would; `POST`/`PATCH` of
//!   `events.k8s.io/v1` Events are recorded for [`FakeApiServer::events`]
//!   to read.
//! * Tests drive it: [`FakeApiServer::apply`], [`FakeApiServer::delete`],
//!   [`FakeApiServer::drop_watches`], [`FakeApiServer::compact`] (older
//!   resource versions become 410), [`FakeApiServer::set_down`] (every
//!   connection is closed at once), [`FakeApiServer::set_failing`] (every
//!   request answered with an HTTP error such as 500) and
//!   [`FakeApiServer::restart`] (a new resourceVersion history);
//!   [`FakeApiServer::objects`] reads back what it holds.
//! * Every answer but `/version` comes in protobuf when the request's
//!   `Accept` asks for it first, as an API server answers (lists, watch
//!   frames, `Status`; [`pb`]), else in JSON. [`FakeApiServer::set_json_only`]
//!   makes it answer JSON whatever is asked, as a server without protobuf
//!   support would.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

pub mod pb;
mod request;

use request::{fields_match, labels_match, parse_continue, query};

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// (collection path, list kind, item kind, apiVersion)
const COLLECTIONS: &[(&str, &str, &str, &str)] = &[
    ("/api/v1/services", "ServiceList", "Service", "v1"),
    (
        "/apis/discovery.k8s.io/v1/endpointslices",
        "EndpointSliceList",
        "EndpointSlice",
        "discovery.k8s.io/v1",
    ),
    ("/api/v1/nodes", "NodeList", "Node", "v1"),
    ("/api/v1/pods", "PodList", "Pod", "v1"),
];

#[derive(Clone, Debug)]
struct WatchEvent {
    rv: u64,
    kind: String,
    /// ADDED, MODIFIED, DELETED, or what [`FakeApiServer::send_event`] was given.
    event: String,
    object: Value,
}

/// An object and its JSON text, serialized once when written so that a
/// list of 100,000 objects is a concatenation, not 100,000 encodings (an
/// API server answers lists from its cache the same way).
struct Stored {
    value: Value,
    json: Bytes,
    /// Its protobuf message, made when first asked for.
    pb: std::sync::OnceLock<Bytes>,
}

impl Stored {
    fn new(value: Value) -> Stored {
        let json = Bytes::from(value.to_string());
        Stored {
            value,
            json,
            pb: std::sync::OnceLock::new(),
        }
    }

    fn pb(&self) -> Bytes {
        self.pb
            .get_or_init(|| {
                let kind = self.value["kind"].as_str().unwrap_or("");
                Bytes::from(pb::object_message(kind, &self.value))
            })
            .clone()
    }
}

#[derive(Default)]
struct State {
    rv: u64,
    /// kind → (namespace, name) → object.
    objects: HashMap<String, BTreeMap<(String, String), Stored>>,
    /// In resourceVersion order (each write appends the next one).
    events: Vec<WatchEvent>,
    /// Watches resuming from an older resource version get 410.
    oldest_rv: u64,
    down: bool,
    /// Set: every request is answered with this HTTP status.
    failing: Option<u16>,
    /// Bumped to end every open watch.
    generation: u64,
    requests: u64,
    /// Events posted (or patched), in arrival order.
    posted_events: Vec<Value>,
    /// See [`FakeApiServer::expire_continue`].
    expire_continue: Option<(u64, (String, String, String))>,
    continue_requests: u64,
    /// See [`FakeApiServer::set_unpaged`].
    unpaged: bool,
    /// See [`FakeApiServer::set_json_only`].
    json_only: bool,
    /// Lists and watches answered in protobuf, and in JSON.
    answers: (u64, u64),
}

impl State {
    fn delete(&mut self, kind: &str, namespace: &str, name: &str) {
        let removed = self
            .objects
            .get_mut(kind)
            .and_then(|m| m.remove(&(namespace.to_owned(), name.to_owned())));
        if let Some(Stored {
            value: mut object, ..
        }) = removed
        {
            self.rv += 1;
            let rv = self.rv;
            object["metadata"]["resourceVersion"] = json!(rv.to_string());
            self.events.push(WatchEvent {
                rv,
                kind: kind.to_owned(),
                event: "DELETED".to_owned(),
                object,
            });
        }
    }

    /// Whether this continued list request is the one to expire (and does
    /// the delete that goes with it).
    fn expires_continue(&mut self) -> bool {
        self.continue_requests += 1;
        match self.expire_continue.take() {
            Some((nth, (kind, ns, name))) if nth == self.continue_requests => {
                self.delete(&kind, &ns, &name);
                true
            }
            other => {
                self.expire_continue = other;
                false
            }
        }
    }
}

pub struct FakeApiServer {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    changed: watch::Sender<u64>,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl FakeApiServer {
    pub async fn start() -> FakeApiServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            rv: 1000,
            oldest_rv: 1000,
            ..State::default()
        }));
        let (changed, _) = watch::channel(0u64);
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let st = state.clone();
        let ch = changed.clone();
        tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = &mut stopped => return,
                    r = listener.accept() => match r { Ok((s, _)) => s, Err(_) => continue },
                };
                if st.lock().unwrap().down {
                    drop(stream); // an outage: the connection dies at once
                    continue;
                }
                let st = st.clone();
                let ch = ch.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let st = st.clone();
                        let ch = ch.clone();
                        async move { Ok::<_, Infallible>(route(req, st, ch).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FakeApiServer {
            addr,
            state,
            changed,
            stop,
        }
    }

    /// A kubeconfig file pointing at this server (plain HTTP, no auth).
    pub fn write_kubeconfig(&self, path: &Path) {
        let cfg = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"http://{}\"}}\n\
             users:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: fake}}\n\
             current-context: fake\n",
            self.addr
        );
        std::fs::write(path, cfg).unwrap();
    }

    fn notify(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// Creates or updates an object (it must carry `kind` and `metadata`).
    pub fn apply(&self, mut object: Value) {
        {
            let mut st = self.state.lock().unwrap();
            st.rv += 1;
            let rv = st.rv;
            let kind = object["kind"].as_str().expect("kind").to_owned();
            let key = object_key(&object);
            object["metadata"]["resourceVersion"] = json!(rv.to_string());
            if object["metadata"]["uid"].is_null() {
                object["metadata"]["uid"] = json!(format!("uid-{}-{}", key.0, key.1));
            }
            let existed = st
                .objects
                .entry(kind.clone())
                .or_default()
                .insert(key, Stored::new(object.clone()))
                .is_some();
            let event = if existed { "MODIFIED" } else { "ADDED" }.to_owned();
            st.events.push(WatchEvent {
                rv,
                kind,
                event,
                object,
            });
        }
        self.notify();
    }

    /// Sends `object` (it must carry `kind`) to the watches of its kind as
    /// an event of type `event_type`, which may be one the API does not
    /// define; nothing is stored and lists do not change.
    pub fn send_event(&self, event_type: &str, mut object: Value) {
        {
            let mut st = self.state.lock().unwrap();
            st.rv += 1;
            let rv = st.rv;
            object["metadata"]["resourceVersion"] = json!(rv.to_string());
            st.events.push(WatchEvent {
                rv,
                kind: object["kind"].as_str().expect("kind").to_owned(),
                event: event_type.to_owned(),
                object,
            });
        }
        self.notify();
    }

    pub fn delete(&self, kind: &str, namespace: &str, name: &str) {
        self.state.lock().unwrap().delete(kind, namespace, name);
        self.notify();
    }

    /// The `nth` (from 1) list request that carries a `continue` token is
    /// answered 410 Expired, as when the list's revision was compacted
    /// between two pages, and `deleted` (kind, namespace, name) is deleted
    /// just before: the client must list again and drop what it no longer
    /// finds.
    pub fn expire_continue(&self, nth: u64, deleted: (&str, &str, &str)) {
        let (kind, ns, name) = deleted;
        self.state.lock().unwrap().expire_continue =
            Some((nth, (kind.to_owned(), ns.to_owned(), name.to_owned())));
    }

    /// While set, lists ignore `limit` and come in one piece, as an API
    /// server answers a list from its watch cache.
    pub fn set_unpaged(&self, unpaged: bool) {
        self.state.lock().unwrap().unpaged = unpaged;
    }

    /// While set, every answer is JSON, whatever the request accepts.
    pub fn set_json_only(&self, json_only: bool) {
        self.state.lock().unwrap().json_only = json_only;
    }

    /// Ends every open watch stream (clients re-watch from their last rv).
    pub fn drop_watches(&self) {
        self.state.lock().unwrap().generation += 1;
        self.notify();
    }

    /// Forgets the event history: a watch from any earlier resource version
    /// now gets 410 Gone and must relist.
    pub fn compact(&self) {
        let mut st = self.state.lock().unwrap();
        // As if other writes happened meanwhile: whatever a client holds is
        // now older than the retained history.
        st.rv += 1;
        st.oldest_rv = st.rv;
        st.events.clear();
    }

    /// While down, every connection is closed at once and open watches end.
    pub fn set_down(&self, down: bool) {
        let mut st = self.state.lock().unwrap();
        st.down = down;
        st.generation += 1;
        drop(st);
        self.notify();
    }

    /// While `Some(code)`, every request is answered with that HTTP status
    /// and a Status body (an API server failing behind a load balancer that
    /// still accepts connections); open watches end.
    pub fn set_failing(&self, code: Option<u16>) {
        let mut st = self.state.lock().unwrap();
        st.failing = code;
        st.generation += 1;
        drop(st);
        self.notify();
    }

    /// The objects of `kind` (`Service`, `EndpointSlice`, ...) held now.
    pub fn objects(&self, kind: &str) -> Vec<Value> {
        let st = self.state.lock().unwrap();
        st.objects
            .get(kind)
            .map(|m| m.values().map(|o| o.value.clone()).collect())
            .unwrap_or_default()
    }

    /// The newest resourceVersion (one more per write).
    pub fn resource_version(&self) -> u64 {
        self.state.lock().unwrap().rv
    }

    /// A restarted API server with a new resourceVersion history: old
    /// versions are gone, all watches end.
    pub fn restart(&self) {
        let mut st = self.state.lock().unwrap();
        st.rv += 100_000;
        st.oldest_rv = st.rv;
        st.events.clear();
        st.generation += 1;
        drop(st);
        self.notify();
    }

    /// The Events posted or patched so far.
    pub fn events(&self) -> Vec<Value> {
        self.state.lock().unwrap().posted_events.clone()
    }

    /// The lists and watches answered so far in protobuf, and in JSON.
    pub fn answers(&self) -> (u64, u64) {
        self.state.lock().unwrap().answers
    }

    pub fn requests(&self) -> u64 {
        self.state.lock().unwrap().requests
    }

    pub fn stop(self) {
        let _ = self.stop.send(());
    }
}

fn object_key(o: &Value) -> (String, String) {
    (
        o["metadata"]["namespace"].as_str().unwrap_or("").to_owned(),
        o["metadata"]["name"].as_str().unwrap_or("").to_owned(),
    )
}

fn full(status: StatusCode, body: Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .unwrap()
}

/// A `Status` answer, in protobuf when `protobuf`.
fn status_reply(protobuf: bool, status: StatusCode, body: Value) -> Response<Body> {
    if !protobuf {
        return full(status, body);
    }
    Response::builder()
        .status(status)
        .header("content-type", pb::CONTENT_TYPE)
        .body(Full::new(Bytes::from(pb::status(&body))).boxed())
        .unwrap()
}

/// `head` (kind, apiVersion, metadata) with `"items": [...]` spliced in
/// from the items' JSON texts.
fn list_response(head: Value, items: &[Bytes]) -> Response<Body> {
    let head = head.to_string();
    let mut body =
        Vec::with_capacity(head.len() + 16 + items.iter().map(|i| i.len() + 1).sum::<usize>());
    // `{...}` → `{...,"items":[a,b]}`
    body.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
    body.extend_from_slice(b",\"items\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(item);
    }
    body.extend_from_slice(b"]}");
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)).boxed())
        .unwrap()
}

fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

/// Events go to [`record_event`], everything else to [`handle`].
async fn route(
    req: Request<hyper::body::Incoming>,
    state: Arc<Mutex<State>>,
    changed: watch::Sender<u64>,
) -> Response<Body> {
    let is_event = req
        .uri()
        .path()
        .strip_prefix("/apis/events.k8s.io/v1/namespaces/")
        .is_some_and(|rest| rest.contains("/events"));
    let healthy = {
        let st = state.lock().unwrap();
        !st.down && st.failing.is_none()
    };
    if is_event && healthy {
        return record_event(req, state).await;
    }
    handle(req, state, changed)
}

/// Keeps a posted (or patched) Event and echoes it back, as the API server
/// answers a create.
async fn record_event(
    req: Request<hyper::body::Incoming>,
    state: Arc<Mutex<State>>,
) -> Response<Body> {
    let created = req.method() == hyper::Method::POST;
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return full(
                StatusCode::BAD_REQUEST,
                status_body(400, "BadRequest", "body"),
            )
        }
    };
    let Ok(event) = serde_json::from_slice::<Value>(&body) else {
        return full(
            StatusCode::BAD_REQUEST,
            status_body(400, "BadRequest", "not JSON"),
        );
    };
    state.lock().unwrap().posted_events.push(event.clone());
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    full(code, event)
}

fn handle(
    req: Request<hyper::body::Incoming>,
    state: Arc<Mutex<State>>,
    changed: watch::Sender<u64>,
) -> Response<Body> {
    let (down, failing, json_only) = {
        let mut st = state.lock().unwrap();
        st.requests += 1;
        (st.down, st.failing, st.json_only)
    };
    let protobuf = !json_only
        && pb::wants_protobuf(
            req.headers()
                .get(hyper::header::ACCEPT)
                .and_then(|a| a.to_str().ok()),
        );
    if down {
        // A request on a connection opened before the outage: answer as a
        // failing API server would, and drop the connection.
        let mut r = status_reply(
            protobuf,
            StatusCode::SERVICE_UNAVAILABLE,
            status_body(503, "ServiceUnavailable", "down"),
        );
        r.headers_mut().insert(
            "connection",
            hyper::header::HeaderValue::from_static("close"),
        );
        return r;
    }
    if let Some(code) = failing {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return status_reply(
            protobuf,
            status,
            status_body(code, "InternalError", "failing"),
        );
    }
    let path = req.uri().path().to_owned();
    if path == "/version" {
        return full(
            StatusCode::OK,
            json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-fake", "gitCommit": "",
                   "gitTreeState": "clean", "buildDate": "", "goVersion": "", "compiler": "gc",
                   "platform": "linux/amd64"}),
        );
    }
    let Some(&(_, list_kind, kind, api_version)) = COLLECTIONS.iter().find(|c| c.0 == path) else {
        return status_reply(
            protobuf,
            StatusCode::NOT_FOUND,
            status_body(404, "NotFound", &format!("no route {path}")),
        );
    };
    {
        let mut st = state.lock().unwrap();
        if protobuf {
            st.answers.0 += 1;
        } else {
            st.answers.1 += 1;
        }
    }
    let q = query(&req);
    let labels = q.get("labelSelector").cloned().unwrap_or_default();
    let fields = q.get("fieldSelector").cloned().unwrap_or_default();
    let matches = move |o: &Value| labels_match(&labels, o) && fields_match(&fields, o);
    let is_watch = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
    if !is_watch {
        let limit: usize = q
            .get("limit")
            .and_then(|v| v.parse().ok())
            .filter(|&l| l > 0)
            .unwrap_or(usize::MAX);
        let (rv, after) = match q.get("continue").map(|t| parse_continue(t)) {
            None => (None, None),
            Some(Some((rv, key))) => (Some(rv), Some(key)),
            Some(None) => {
                return status_reply(
                    protobuf,
                    StatusCode::BAD_REQUEST,
                    status_body(400, "BadRequest", "invalid continue token"),
                );
            }
        };
        let mut st = state.lock().unwrap();
        if after.is_some() && st.expires_continue() {
            drop(st);
            changed.send_modify(|g| *g += 1);
            return status_reply(
                protobuf,
                StatusCode::GONE,
                status_body(410, "Expired", "the continue token has expired"),
            );
        }
        let rv = rv.unwrap_or(st.rv);
        let limit = if st.unpaged { usize::MAX } else { limit };
        // From after the last object sent, one more than a page (to know
        // whether another follows).
        let from = after
            .as_ref()
            .map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
        let mut page: Vec<(&(String, String), &Stored)> = st
            .objects
            .get(kind)
            .into_iter()
            .flat_map(|m| m.range::<(String, String), _>((from, std::ops::Bound::Unbounded)))
            .filter(|(_, o)| matches(&o.value))
            .take(limit.saturating_add(1))
            .collect();
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        let mut continue_token = None;
        if page.len() > limit {
            page.truncate(limit);
            let (ns, name) = page[limit - 1].0;
            let token = format!("{rv}/{ns}/{name}");
            metadata["continue"] = json!(token);
            continue_token = Some(token);
        }
        if protobuf {
            let items: Vec<Bytes> = page.iter().map(|(_, o)| o.pb()).collect();
            drop(st);
            let body = pb::list(
                api_version,
                list_kind,
                &rv.to_string(),
                continue_token.as_deref(),
                &items,
            );
            return Response::builder()
                .status(StatusCode::OK)
                .header("content-type", pb::CONTENT_TYPE)
                .body(Full::new(Bytes::from(body)).boxed())
                .unwrap();
        }
        let items: Vec<Bytes> = page.iter().map(|(_, o)| o.json.clone()).collect();
        drop(st);
        let head = json!({"kind": list_kind, "apiVersion": api_version, "metadata": metadata});
        return list_response(head, &items);
    }

    let from: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let timeout = Duration::from_secs(
        q.get("timeoutSeconds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(300),
    );
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
    let kind = kind.to_owned();
    let api_version = api_version.to_owned();
    tokio::spawn(async move {
        // One event, in the encoding asked for.
        let line = |v: Value| {
            if !protobuf {
                return Ok(Frame::data(Bytes::from(format!("{v}\n"))));
            }
            let event = v["type"].as_str().unwrap_or("");
            let object = &v["object"];
            // The collection's kind and version, as an API server's
            // envelope names them.
            let raw = match event {
                "ERROR" => pb::status(object),
                "BOOKMARK" => pb::bookmark(
                    &api_version,
                    &kind,
                    object["metadata"]["resourceVersion"].as_str().unwrap_or(""),
                ),
                _ => pb::enveloped_object(&api_version, &kind, object),
            };
            Ok(Frame::data(pb::watch_frame(event, raw)))
        };
        let (generation, expired) = {
            let st = state.lock().unwrap();
            (st.generation, from < st.oldest_rv)
        };
        if expired {
            let msg = format!("too old resource version: {from}");
            let _ = tx
                .send(line(
                    json!({"type": "ERROR", "object": status_body(410, "Expired", &msg)}),
                ))
                .await;
            return;
        }
        let mut sent = from;
        let mut changes = changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let pending: Vec<WatchEvent> = {
                let st = state.lock().unwrap();
                if st.generation != generation || st.down {
                    return;
                }
                let first = st.events.partition_point(|e| e.rv <= sent);
                st.events[first..]
                    .iter()
                    .filter(|e| e.kind == kind)
                    .cloned()
                    .collect()
            };
            for e in pending {
                sent = e.rv;
                if matches(&e.object)
                    && tx
                        .send(line(json!({"type": e.event, "object": e.object})))
                        .await
                        .is_err()
                {
                    return;
                }
            }
            tokio::select! {
                _ = changes.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(500)), if bookmarks => {
                    // A bookmark never names a version of another history
                    // (after `restart`): the stream ends instead.
                    let rv = {
                        let st = state.lock().unwrap();
                        if st.generation != generation || st.down {
                            return;
                        }
                        st.rv
                    };
                    let bookmark = json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version,
                        "metadata": {"resourceVersion": rv.to_string()}}});
                    if tx.send(line(bookmark)).await.is_err() {
                        return;
                    }
                }
                _ = tokio::time::sleep_until(deadline) => return,
                _ = tx.closed() => return,
            }
        }
    });
    let content_type = if protobuf {
        pb::WATCH_CONTENT_TYPE
    } else {
        "application/json"
    };
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", content_type)
        .body(BodyExt::boxed(StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
        .unwrap()
}

/// A ClusterIP Service object with one TCP port `http` 80 → 8080.
pub fn service_object(ns: &str, name: &str, ip: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name, "namespace": ns},
           "spec": {"clusterIP": ip, "clusterIPs": [ip], "type": "ClusterIP",
                    "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}})
}

/// An EndpointSlice of `svc` with ready endpoints at `ips` on node n2.
pub fn slice_object(ns: &str, svc: &str, ips: &[String]) -> Value {
    let endpoints: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"addresses": [ip], "nodeName": "n2", "conditions": {"ready": true}}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": format!("{svc}-abc"), "namespace": ns,
                        "labels": {"kubernetes.io/service-name": svc}},
           "addressType": "IPv4",
           "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
           "endpoints": endpoints})
}
