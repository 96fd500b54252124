//! The PodInfo gRPC server (SPEC §7.2, §7.3) on a unix socket.
//!
//! Every published [`PodSnapshot`] is converted once into a [`PodList`]
//! shared by all calls. Each call is admitted by the per-client
//! [`Limiter`] first, then refused with `UNAVAILABLE` until the source has
//! synced (never partial). A watch gets its own queue of [`WATCH_QUEUE`]
//! messages fed by a task; a watcher that lets it fill up loses its stream
//! (`RESOURCE_EXHAUSTED`) instead of holding memory or slowing the others.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use proto::podinfo::v1alpha1 as pb;
use proto::podinfo::v1alpha1::pod_info_service_server::{
    PodInfoService, PodInfoServiceServer, SERVICE_NAME,
};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tonic::{Request, Response, Status};

use super::convert::pod_info;
use super::limiter::{ClientKey, Limiter, RateLimit, Rejection, WatchSlot};
use super::metrics::{Method, PodInfoMetrics};
use crate::grpc_discovery::Discovery;
use crate::grpc_unix::{self, bind_unix, remove_socket};
use crate::snapshot::{Follower, PodSnapshot, PodSnapshotReceiver};

/// Message of every call before the source has synced.
pub const NOT_SYNCED: &str = "pod information not synced yet";
/// Message ending the stream of a watcher whose queue overflowed.
pub const WATCHER_TOO_SLOW: &str = "watcher too slow";
/// Message ending streams at shutdown.
pub const SHUTTING_DOWN: &str = "server shutting down";
/// Messages queued per watcher before it is dropped as too slow.
pub const WATCH_QUEUE: usize = 64;
/// After shutdown, how long clients get to read their final status before
/// their connections are closed under them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum PodInfoError {
    #[error("--podinfo-socket {path}: {source}")]
    Bind { path: PathBuf, source: io::Error },
    #[error("registering the PodInfo metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("PodInfo server: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// One revision of this node's pods in wire form.
#[derive(Debug, Default)]
struct PodList {
    synced: bool,
    revision: u64,
    /// Sorted by (namespace, name), as the snapshot is.
    pods: Vec<pb::PodInfo>,
}

impl PodList {
    fn of(s: &PodSnapshot) -> Self {
        PodList {
            synced: s.synced,
            revision: s.revision,
            pods: s.pods.iter().map(pod_info).collect(),
        }
    }

    fn by_uid(&self, uid: &str) -> Option<&pb::PodInfo> {
        self.pods.iter().find(|p| p.pod_uid == uid)
    }

    fn by_name(&self, namespace: &str, name: &str) -> Option<&pb::PodInfo> {
        self.pods
            .binary_search_by(|p| {
                (p.pod_namespace.as_str(), p.pod_name.as_str()).cmp(&(namespace, name))
            })
            .ok()
            .map(|i| &self.pods[i])
    }

    fn watch_response(&self) -> pb::WatchPodConditionsResponse {
        pb::WatchPodConditionsResponse {
            pods: self.pods.clone(),
            revision: self.revision,
        }
    }
}

/// The gRPC service.
#[derive(Clone)]
pub struct PodInfoApi {
    lists: watch::Receiver<Arc<PodList>>,
    limiter: Arc<Limiter>,
    metrics: PodInfoMetrics,
    shutdown: CancellationToken,
    discovery: Discovery,
    /// The snapshot → list task, owned by the API's clones.
    _converter: Arc<AbortOnDropHandle<()>>,
}

impl PodInfoApi {
    /// Starts converting pod snapshots into lists (a task that ends with
    /// the snapshot channel or `shutdown`, and is aborted when the last
    /// clone of the API goes).
    pub async fn new(
        pods: PodSnapshotReceiver,
        limit: RateLimit,
        metrics: PodInfoMetrics,
        shutdown: CancellationToken,
    ) -> Self {
        let (list_tx, lists) = watch::channel(Arc::new(PodList::default()));
        let discovery = Discovery::new(SERVICE_NAME).await;
        let health = discovery.clone();
        let mut follower = Follower::new(pods, shutdown.clone());
        let converter = tokio::spawn(async move {
            while let Some(snapshot) = follower.next().await {
                if snapshot.synced {
                    list_tx.send_replace(Arc::new(PodList::of(&snapshot)));
                    health.serving().await;
                }
            }
        });
        Self {
            lists,
            limiter: Limiter::new(limit),
            metrics,
            shutdown,
            discovery,
            _converter: Arc::new(AbortOnDropHandle::new(converter)),
        }
    }

    pub fn into_server(self) -> PodInfoServiceServer<Self> {
        PodInfoServiceServer::new(self)
    }

    /// gRPC health of this API, for SIGTERM to turn `NOT_SERVING`.
    pub fn discovery(&self) -> &Discovery {
        &self.discovery
    }

    /// The synced list, or `UNAVAILABLE`.
    fn current(&self) -> Result<Arc<PodList>, Status> {
        let list = self.lists.borrow().clone();
        if list.synced {
            Ok(list)
        } else {
            Err(Status::unavailable(NOT_SYNCED))
        }
    }

    fn rejected(&self, client: ClientKey, why: Rejection) -> Status {
        self.metrics.rate_limited();
        tracing::debug!(%client, reason = %why, "PodInfo call rejected");
        Status::resource_exhausted(why.to_string())
    }

    /// Counts the outcome of a call.
    fn finish<T>(&self, method: Method, result: Result<T, Status>) -> Result<T, Status> {
        if result.is_err() {
            self.metrics.failed(method);
        }
        result
    }

    fn list(&self, client: ClientKey) -> Result<pb::ListPodConditionsResponse, Status> {
        self.limiter
            .admit(client, Instant::now())
            .map_err(|why| self.rejected(client, why))?;
        let list = self.current()?;
        Ok(pb::ListPodConditionsResponse {
            pods: list.pods.clone(),
            revision: list.revision,
        })
    }

    fn get(
        &self,
        client: ClientKey,
        request: pb::GetPodConditionsRequest,
    ) -> Result<pb::GetPodConditionsResponse, Status> {
        self.limiter
            .admit(client, Instant::now())
            .map_err(|why| self.rejected(client, why))?;
        let list = self.current()?;
        check_get_request(&request)?;
        let pb::GetPodConditionsRequest {
            pod_uid,
            pod_namespace,
            pod_name,
        } = request;
        let pod = if !pod_uid.is_empty() {
            let pod = list.by_uid(&pod_uid).ok_or_else(|| {
                Status::not_found(format!("no pod with uid {pod_uid} on this node"))
            })?;
            let differs = |given: &str, actual: &str| !given.is_empty() && given != actual;
            if differs(&pod_namespace, &pod.pod_namespace) || differs(&pod_name, &pod.pod_name) {
                return Err(Status::not_found(format!(
                    "the pod with uid {pod_uid} is {}/{}, not {pod_namespace}/{pod_name}",
                    pod.pod_namespace, pod.pod_name
                )));
            }
            pod
        } else if pod_namespace.is_empty() || pod_name.is_empty() {
            return Err(Status::invalid_argument(
                "set pod_uid, or both pod_namespace and pod_name",
            ));
        } else {
            list.by_name(&pod_namespace, &pod_name).ok_or_else(|| {
                Status::not_found(format!("no pod {pod_namespace}/{pod_name} on this node"))
            })?
        };
        Ok(pb::GetPodConditionsResponse {
            pod: Some(pod.clone()),
        })
    }

    fn watch(&self, client: ClientKey) -> Result<WatchStream, Status> {
        let slot = self
            .limiter
            .open_watch(client, Instant::now())
            .map_err(|why| self.rejected(client, why))?;
        let first = self.current()?;
        // One slot more than the queue: the final status always fits.
        let (tx, rx) = mpsc::channel(WATCH_QUEUE + 1);
        // Cannot fail: the channel is new and empty.
        let _ = tx.try_send(Ok(first.watch_response()));
        tokio::spawn(forward(
            self.lists.clone(),
            first.revision,
            tx,
            self.shutdown.clone(),
            self.metrics.clone(),
            client,
        ));
        self.metrics.watch_opened();
        tracing::debug!(%client, revision = first.revision, "PodInfo watch opened");
        Ok(WatchStream {
            rx,
            _slot: slot,
            metrics: self.metrics.clone(),
        })
    }
}

/// Queues every new list for one watcher until it goes away, the queue
/// overflows or the server shuts down. Only this task sends, so checking
/// the free capacity before `try_send` is exact.
async fn forward(
    mut lists: watch::Receiver<Arc<PodList>>,
    mut sent: u64,
    tx: mpsc::Sender<Result<pb::WatchPodConditionsResponse, Status>>,
    shutdown: CancellationToken,
    metrics: PodInfoMetrics,
    client: ClientKey,
) {
    loop {
        let next = tokio::select! {
            () = shutdown.cancelled() => None,
            () = tx.closed() => return,
            r = lists.wait_for(|l| l.revision != sent) => r.ok().map(|l| Arc::clone(&l)),
        };
        let Some(list) = next else {
            metrics.failed(Method::Watch);
            let _ = tx.try_send(Err(Status::unavailable(SHUTTING_DOWN)));
            return;
        };
        if tx.capacity() <= 1 {
            tracing::warn!(%client, queued = WATCH_QUEUE, revision = list.revision, "PodInfo watcher too slow; ending its stream");
            metrics.failed(Method::Watch);
            let _ = tx.try_send(Err(Status::resource_exhausted(WATCHER_TOO_SLOW)));
            return;
        }
        sent = list.revision;
        let _ = tx.try_send(Ok(list.watch_response()));
    }
}

/// The response stream of one watch; holds the client's watch slot and
/// the open-streams gauge until tonic drops it.
pub struct WatchStream {
    rx: mpsc::Receiver<Result<pb::WatchPodConditionsResponse, Status>>,
    _slot: WatchSlot,
    metrics: PodInfoMetrics,
}

impl Stream for WatchStream {
    type Item = Result<pb::WatchPodConditionsResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        self.metrics.watch_closed();
    }
}

/// The checks of a `GetPodConditions` request that need no pod list: a
/// name no Kubernetes object can have is a bad request, not an unknown
/// pod. The entry fuzz/ drives.
pub fn check_get_request(request: &pb::GetPodConditionsRequest) -> Result<(), Status> {
    let (namespace, name) = (&request.pod_namespace, &request.pod_name);
    if !namespace.is_empty() && !is_dns1123_label(namespace) {
        return Err(Status::invalid_argument(format!(
            "pod_namespace {namespace:?} is not a valid namespace (a DNS-1123 label)"
        )));
    }
    if !name.is_empty() && !is_dns1123_subdomain(name) {
        return Err(Status::invalid_argument(format!(
            "pod_name {name:?} is not a valid pod name (a DNS-1123 subdomain)"
        )));
    }
    Ok(())
}

/// Kubernetes' DNS-1123 label: at most 63 of `a-z`, `0-9` and `-`,
/// starting and ending with a letter or digit (namespace names).
fn is_dns1123_label(s: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && alnum(b[0])
        && alnum(b[b.len() - 1])
        && b.iter().all(|&c| alnum(c) || c == b'-')
}

/// Kubernetes' DNS-1123 subdomain: at most 253 characters of dot-separated
/// DNS-1123 labels (pod names).
fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// The caller, as the connection layer recorded it.
fn client_of<T>(request: &Request<T>) -> ClientKey {
    // Always present on connections accepted by `PodInfoListener`.
    request
        .extensions()
        .get::<ClientKey>()
        .copied()
        .unwrap_or(ClientKey::Connection(0))
}

#[tonic::async_trait]
impl PodInfoService for PodInfoApi {
    type WatchPodConditionsStream = WatchStream;

    async fn list_pod_conditions(
        &self,
        request: Request<pb::ListPodConditionsRequest>,
    ) -> Result<Response<pb::ListPodConditionsResponse>, Status> {
        self.metrics.requested(Method::List);
        let result = self.list(client_of(&request));
        self.finish(Method::List, result).map(Response::new)
    }

    async fn get_pod_conditions(
        &self,
        request: Request<pb::GetPodConditionsRequest>,
    ) -> Result<Response<pb::GetPodConditionsResponse>, Status> {
        self.metrics.requested(Method::Get);
        let client = client_of(&request);
        let result = self.get(client, request.into_inner());
        self.finish(Method::Get, result).map(Response::new)
    }

    async fn watch_pod_conditions(
        &self,
        request: Request<pb::WatchPodConditionsRequest>,
    ) -> Result<Response<Self::WatchPodConditionsStream>, Status> {
        self.metrics.requested(Method::Watch);
        let result = self.watch(client_of(&request));
        self.finish(Method::Watch, result).map(Response::new)
    }
}

/// The bound socket; binding happens before anything is served, so a bad
/// path fails start-up naming the flag.
pub struct PodInfoListener {
    path: PathBuf,
    listener: UnixListener,
}

impl PodInfoListener {
    /// Binds `path` (mode 0660, parent directory created, a stale socket
    /// file replaced).
    pub fn bind(path: &Path) -> Result<Self, PodInfoError> {
        let listener = bind_unix(path).map_err(|source| PodInfoError::Bind {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self {
            path: path.to_owned(),
            listener,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves until `shutdown`, then removes the socket file.
    pub async fn serve(
        self,
        api: PodInfoApi,
        limits: grpc_unix::limits::GrpcLimits,
        shutdown: CancellationToken,
    ) -> Result<(), PodInfoError> {
        let Self { path, listener } = self;
        let incoming = grpc_unix::limits::limit(
            grpc_unix::incoming(listener),
            limits.max_connections,
            path.display().to_string(),
        );
        tracing::info!(path = %path.display(), "PodInfo API listening");
        let serve = grpc_unix::limits::server(limits)
            .add_routes(api.discovery.routes(api.clone().into_server()))
            .serve_with_incoming_shutdown(incoming, shutdown.clone().cancelled_owned());
        // Graceful shutdown waits for every stream to finish; a client that
        // never reads its last message would hold the daemon forever.
        let grace = async {
            shutdown.cancelled().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        };
        let result = tokio::select! {
            served = serve => served.map_err(PodInfoError::from),
            () = grace => {
                tracing::warn!(path = %path.display(), "PodInfo clients still connected after shutdown; closing");
                Ok(())
            }
        };
        remove_socket(&path);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ConditionStatus, ObjectKey, Pod, PodCondition};
    use crate::snapshot::{pod_snapshot_channel, PodSnapshotSender};
    use proto::podinfo::v1alpha1::pod_info_service_client::PodInfoServiceClient;
    use tonic::Code;

    fn pod(ns: &str, name: &str, ready: bool) -> Pod {
        Pod {
            key: ObjectKey::new(ns, name),
            uid: format!("uid-{ns}-{name}"),
            node_name: Some("n1".to_owned()),
            static_pod: false,
            conditions: vec![PodCondition {
                condition_type: "Ready".to_owned(),
                status: if ready {
                    ConditionStatus::True
                } else {
                    ConditionStatus::False
                },
                last_probe_time: None,
                last_transition_time: None,
                reason: String::new(),
                message: String::new(),
            }],
            deletion_timestamp: None,
        }
    }

    fn publish(tx: &PodSnapshotSender, revision: u64, pods: Vec<Pod>) {
        tx.send_replace(Arc::new(PodSnapshot {
            synced: true,
            revision,
            pods: Arc::new(pods),
        }));
    }

    struct Running {
        dir: tempfile::TempDir,
        shutdown: CancellationToken,
        server: tokio::task::JoinHandle<Result<(), PodInfoError>>,
    }

    impl Running {
        fn socket(&self) -> PathBuf {
            self.dir.path().join("podinfo.sock")
        }

        async fn client(&self) -> PodInfoServiceClient<tonic::transport::Channel> {
            super::super::client::connect(&self.socket()).await.unwrap()
        }
    }

    async fn serve(pods: PodSnapshotReceiver, limit: RateLimit) -> Running {
        let dir = tempfile::tempdir().unwrap();
        let shutdown = CancellationToken::new();
        let metrics = PodInfoMetrics::register(&prometheus::Registry::new()).unwrap();
        let api = PodInfoApi::new(pods, limit, metrics, shutdown.clone()).await;
        let listener = PodInfoListener::bind(&dir.path().join("podinfo.sock")).unwrap();
        let server = tokio::spawn(listener.serve(
            api,
            grpc_unix::limits::GrpcLimits::default(),
            shutdown.clone(),
        ));
        Running {
            dir,
            shutdown,
            server,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_rpc_is_unavailable_until_synced_then_served() {
        let (tx, rx) = pod_snapshot_channel();
        let r = serve(rx, RateLimit::default()).await;
        let mut c = r.client().await;
        let list = c.list_pod_conditions(pb::ListPodConditionsRequest {}).await;
        let get = c
            .get_pod_conditions(pb::GetPodConditionsRequest::default())
            .await;
        let watch = c
            .watch_pod_conditions(pb::WatchPodConditionsRequest {})
            .await;
        for status in [list.unwrap_err(), get.unwrap_err(), watch.err().unwrap()] {
            assert_eq!(
                (status.code(), status.message()),
                (Code::Unavailable, NOT_SYNCED)
            );
        }

        publish(&tx, 1, vec![pod("a", "p", true)]);
        let deadline = Instant::now() + Duration::from_secs(2);
        let list = loop {
            match c.list_pod_conditions(pb::ListPodConditionsRequest {}).await {
                Ok(l) => break l.into_inner(),
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(e) => panic!("still not served: {e}"),
            }
        };
        assert_eq!((list.revision, list.pods.len()), (1, 1));
        r.shutdown.cancel();
        r.server.await.unwrap().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn get_by_uid_must_agree_with_a_given_name() {
        let (tx, rx) = pod_snapshot_channel();
        publish(&tx, 3, vec![pod("a", "p", true), pod("b", "q", false)]);
        let r = serve(rx, RateLimit::default()).await;
        let mut c = r.client().await;
        let get = |uid: &str, ns: &str, name: &str| pb::GetPodConditionsRequest {
            pod_uid: uid.to_owned(),
            pod_namespace: ns.to_owned(),
            pod_name: name.to_owned(),
        };
        let found = c.get_pod_conditions(get("uid-b-q", "b", "")).await.unwrap();
        assert_eq!(found.into_inner().pod.unwrap().pod_name, "q");
        let err = c
            .get_pod_conditions(get("uid-b-q", "a", "p"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{err}");
        let err = c.get_pod_conditions(get("", "a", "")).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        // Names no Kubernetes object can have: a bad request, not unknown.
        for (ns, name) in [
            ("A", "p"),
            ("a", "P_q"),
            ("a", "-p"),
            ("a", &"x".repeat(254)),
        ] {
            let err = c.get_pod_conditions(get("", ns, name)).await.unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{ns}/{name}: {err}");
        }
        // A valid name that no pod has is unknown.
        let err = c
            .get_pod_conditions(get("", "a", "web-0.x"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{err}");
        r.shutdown.cancel();
        r.server.await.unwrap().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_ends_watches_unavailable_and_removes_the_socket() {
        let (tx, rx) = pod_snapshot_channel();
        publish(&tx, 1, vec![pod("a", "p", true)]);
        let r = serve(rx, RateLimit::default()).await;
        let mut c = r.client().await;
        let mut stream = c
            .watch_pod_conditions(pb::WatchPodConditionsRequest {})
            .await
            .unwrap()
            .into_inner();
        let first = stream.message().await.unwrap().unwrap();
        assert_eq!(first.revision, 1);
        r.shutdown.cancel();
        let end = tokio::time::timeout(Duration::from_secs(2), stream.message())
            .await
            .expect("the stream ends at shutdown")
            .unwrap_err();
        assert_eq!(
            (end.code(), end.message()),
            (Code::Unavailable, SHUTTING_DOWN)
        );
        drop(stream);
        drop(c);
        tokio::time::timeout(Duration::from_secs(5), r.server)
            .await
            .expect("server stops")
            .unwrap()
            .unwrap();
        assert!(!r.dir.path().join("podinfo.sock").exists());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watcher_that_does_not_read_loses_its_stream_after_a_full_queue() {
        // Drive the task directly: no transport buffers in between, so the
        // queue bound is exact.
        let (list_tx, lists) = watch::channel(Arc::new(PodList {
            synced: true,
            revision: 1,
            pods: vec![],
        }));
        let (tx, mut rx) = mpsc::channel(WATCH_QUEUE + 1);
        let metrics = PodInfoMetrics::register(&prometheus::Registry::new()).unwrap();
        let task = tokio::spawn(forward(
            lists,
            1,
            tx,
            CancellationToken::new(),
            metrics,
            ClientKey::Connection(1),
        ));
        for revision in 2..=(WATCH_QUEUE as u64 + 2) {
            list_tx.send_replace(Arc::new(PodList {
                synced: true,
                revision,
                pods: vec![],
            }));
            // Let the task queue it (watch channels keep only the latest).
            let deadline = Instant::now() + Duration::from_secs(2);
            while rx.len() < (revision - 1) as usize && !task.is_finished() {
                assert!(Instant::now() < deadline, "revision {revision} not queued");
                tokio::task::yield_now().await;
            }
        }
        tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .expect("the task ends")
            .unwrap();
        let mut revisions = Vec::new();
        let end = loop {
            match rx.recv().await.expect("a final status") {
                Ok(m) => revisions.push(m.revision),
                Err(status) => break status,
            }
        };
        assert_eq!(revisions, (2..=WATCH_QUEUE as u64 + 1).collect::<Vec<_>>());
        assert_eq!(
            (end.code(), end.message()),
            (Code::ResourceExhausted, WATCHER_TOO_SLOW)
        );
    }
}
