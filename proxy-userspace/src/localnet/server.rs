//! The localnet `Endpoints` gRPC server (SPEC §6) on TCP and a unix socket.
//!
//! Every published [`Snapshot`] is converted and encoded once into a
//! [`Frame`] shared by all clients. `Next` long-polls on the frame
//! channel; `Watch` streams one complete frame per revision, or after the
//! first only the changes to clients that ask for deltas.
//!
//! Frames are made only while someone reads them: a call that waits for a
//! frame or watches registers its [`Interest`], the first one has the
//! current state encoded (one full conversion), and once no call has been
//! open for [`IDLE_FRAMES_KEPT`] the encoded state is dropped (at 50k
//! services / 250k endpoints it is ~15 MB the node does not otherwise
//! need).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_util::StreamExt;
use proto::localnet::v1 as pb;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tonic::{Request, Response, Status};

use super::delta::Delta;
pub use super::frame::Frame;
use super::metrics::{LocalnetMetrics, OpenCall};
use super::wire::{Encoded, EncodedStream, Endpoints, EndpointsServer, SERVICE_NAME};
use crate::grpc_discovery::Discovery;
use crate::grpc_unix::limits::{self as grpc_limits, GrpcLimits};
use crate::grpc_unix::{self, bind_unix, remove_socket};
use crate::snapshot::{Follower, SnapshotReceiver};

#[derive(Debug, thiserror::Error)]
pub enum LocalnetError {
    #[error("--localnet-bind-address {addr}: {source}")]
    BindTcp {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("--localnet-socket {path}: {source}")]
    BindUnix {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("localnet server: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// Draws the per-process instance id: random, never 0 (SPEC §6.1).
pub fn new_instance_id() -> u64 {
    loop {
        // getrandom only fails without an OS RNG; then fall back to time+pid,
        // which is still unique per start in practice.
        let id = getrandom::u64().unwrap_or_else(|_| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1);
            nanos ^ (u64::from(std::process::id()) << 32)
        });
        if id != 0 {
            return id;
        }
    }
}

/// How long encoded frames are kept after the last call that read them
/// ended: a client polling with `Next` reconnects well within it.
const IDLE_FRAMES_KEPT: std::time::Duration = std::time::Duration::from_secs(60);

/// The calls that wait for or read frames.
#[derive(Default)]
struct Demand {
    calls: std::sync::atomic::AtomicUsize,
    changed: tokio::sync::Notify,
}

/// One call's interest in frames, for as long as it lives.
struct Interest(Arc<Demand>);

impl Interest {
    fn new(demand: &Arc<Demand>) -> Self {
        demand
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        demand.changed.notify_one();
        Interest(demand.clone())
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        self.0
            .calls
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.0.changed.notify_one();
    }
}

impl Demand {
    fn wanted(&self) -> bool {
        self.calls.load(std::sync::atomic::Ordering::SeqCst) > 0
    }
}

/// The gRPC service: shared by the TCP and unix listeners.
#[derive(Clone)]
pub struct LocalnetService {
    instance_id: u64,
    frames: watch::Receiver<Arc<Frame>>,
    /// The published snapshots: a call starts from the newest one, not
    /// from whatever frame was last encoded (it may be older, as frames
    /// are made only while calls want them).
    published: SnapshotReceiver,
    demand: Arc<Demand>,
    shutdown: CancellationToken,
    metrics: Option<LocalnetMetrics>,
    discovery: Discovery,
    /// The snapshot → frame task, owned by the service's clones.
    _converter: Arc<AbortOnDropHandle<()>>,
}

impl LocalnetService {
    /// Starts converting snapshots into frames while calls want them (a
    /// task that ends with the snapshot channel or `shutdown`, and is
    /// aborted when the last clone of the service goes). gRPC health turns
    /// `SERVING` with the first synced state.
    pub async fn new(
        instance_id: u64,
        snapshots: SnapshotReceiver,
        shutdown: CancellationToken,
    ) -> Self {
        let (frame_tx, frames) = watch::channel(Arc::new(Frame::default()));
        let discovery = Discovery::new(SERVICE_NAME).await;
        let health = discovery.clone();
        let published = snapshots.clone();
        let follower = Follower::new(snapshots, shutdown.clone());
        let demand = Arc::new(Demand::default());
        let converter = tokio::spawn(convert(
            follower,
            demand.clone(),
            frame_tx,
            health,
            IDLE_FRAMES_KEPT,
        ));
        Self {
            instance_id,
            frames,
            published,
            demand,
            shutdown,
            metrics: None,
            discovery,
            _converter: Arc::new(AbortOnDropHandle::new(converter)),
        }
    }

    /// gRPC health of this API, for SIGTERM to turn `NOT_SERVING`.
    pub fn discovery(&self) -> &Discovery {
        &self.discovery
    }

    /// Counts calls in the `ebpf_kube_proxy_localnet_*` families.
    pub fn with_metrics(mut self, metrics: LocalnetMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn open(&self, rpc: &'static str) -> Option<OpenCall> {
        self.metrics.as_ref().map(|m| m.open(rpc))
    }

    fn finished(&self, rpc: &'static str, code: tonic::Code) {
        if let Some(m) = &self.metrics {
            m.finished(rpc, code);
        }
    }

    pub fn instance_id(&self) -> u64 {
        self.instance_id
    }

    /// Waits for a synced frame other than the one the client holds, at
    /// least as new as the state published when the call came in.
    ///
    /// The current frame alone does not say what is current: with no call
    /// open, the converter does not encode new revisions and the last
    /// frame stays (for [`IDLE_FRAMES_KEPT`]), so a call that took it
    /// would be answered a revision that is no longer the state; this
    /// call's interest has the newest one encoded, and the call waits for
    /// it.
    async fn wait_for_frame(&self, instance_id: u64, rev: u64) -> Result<Arc<Frame>, Status> {
        let _interest = Interest::new(&self.demand);
        let mut frames = self.frames.clone();
        let published = self.published.borrow().rev;
        let holds_current = |f: &Frame| instance_id == self.instance_id && rev == f.rev;
        tokio::select! {
            r = frames.wait_for(|f| f.rev >= published.max(1) && !holds_current(f)) => match r {
                Ok(f) => Ok(f.clone()),
                Err(_) => Err(Status::unavailable("server shutting down")),
            },
            _ = self.shutdown.cancelled() => Err(Status::unavailable("server shutting down")),
        }
    }

    pub fn into_server(self) -> EndpointsServer<Self> {
        EndpointsServer::new(self)
    }

    /// The API with gRPC health and reflection beside it.
    fn routes(&self) -> tonic::service::Routes {
        self.discovery.routes(self.clone().into_server())
    }
}

#[tonic::async_trait]
impl Endpoints for LocalnetService {
    async fn next(
        &self,
        request: Request<pb::NextFilter>,
    ) -> Result<Response<EncodedStream>, Status> {
        let open = self.open("Next");
        let deadline = grpc_timeout(request.metadata());
        let pb::NextFilter { instance_id, rev } = request.into_inner();
        let waited = match deadline {
            None => self.wait_for_frame(instance_id, rev).await,
            Some(d) => tokio::time::timeout(d, self.wait_for_frame(instance_id, rev))
                .await
                .unwrap_or_else(|_| {
                    Err(Status::deadline_exceeded(
                        "no new state before the deadline",
                    ))
                }),
        };
        let frame = match waited {
            Ok(f) => f,
            Err(status) => {
                self.finished("Next", status.code());
                return Err(status);
            }
        };
        self.finished("Next", tonic::Code::Ok);
        // The call stays open until the client has the whole state (or
        // went away): the guard lives in the stream.
        let items = frame.next_items(self.instance_id).inspect(move |_| {
            let _ = &open;
        });
        Ok(Response::new(Box::pin(tokio_stream::iter(items))))
    }

    /// Headers go out at once; a frame follows whenever there is one the
    /// client does not hold yet.
    ///
    /// The stream is polled only when the client's HTTP/2 window has room,
    /// and it finishes the frame in progress before taking the newest one:
    /// a watcher that does not read holds one shared frame and what tonic
    /// and its window buffer, and when it reads again it skips to the
    /// newest revision instead of being replayed every one it missed.
    ///
    /// A client that asks for deltas gets, after its first frame, the
    /// newest frame's shared delta when it holds the frame before it, and
    /// otherwise (it skipped revisions) a delta of its own from the frame
    /// it last received, which its call keeps for that purpose.
    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<EncodedStream>, Status> {
        let pb::WatchRequest {
            instance_id,
            rev,
            deltas,
        } = request.into_inner();
        // A delta client resuming at the current revision is sent no full
        // frame (SPEC §6.3): its first frame is a delta from that one.
        let held = Some(self.frames.borrow().clone())
            .filter(|f| deltas && instance_id == self.instance_id && f.rev == rev && rev >= 1);
        let call = WatchCall {
            _interest: Interest::new(&self.demand),
            api: self.clone(),
            frames: self.frames.clone(),
            client: Some((instance_id, rev)),
            sent_rev: None,
            deltas,
            held,
            code: tonic::Code::Cancelled,
            _open: self.open("Watch"),
        };
        let frames = futures_util::stream::unfold(Some(call), |call| async move {
            let mut call = call?;
            match call.next_frame().await {
                Ok(frame) => {
                    let items = call.items(frame);
                    Some((items, Some(call)))
                }
                Err(status) => {
                    call.code = status.code();
                    Some((Box::new(std::iter::once(Err(status))) as FrameItems, None))
                }
            }
        });
        let events = frames.flat_map(futures_util::stream::iter);
        Ok(Response::new(Box::pin(events)))
    }
}

type FrameItems = Box<dyn Iterator<Item = Result<Encoded, Status>> + Send>;

/// The converter: the newest synced snapshot becomes the current frame
/// whenever a call wants frames (reusing the previous frame's bytes for
/// every service it shares), and the frames go once no call wanted them
/// for `keep` ([`IDLE_FRAMES_KEPT`]).
async fn convert(
    mut follower: Follower<crate::snapshot::Snapshot>,
    demand: Arc<Demand>,
    frame_tx: watch::Sender<Arc<Frame>>,
    health: Discovery,
    keep: std::time::Duration,
) {
    let mut latest: Option<Arc<crate::snapshot::Snapshot>> = None;
    let mut previous: Option<Arc<Frame>> = None;
    let mut idle_since: Option<tokio::time::Instant> = None;
    loop {
        // Armed only while there are frames to drop.
        let drop_at = idle_since.filter(|_| previous.is_some()).map(|t| t + keep);
        tokio::select! {
            next = follower.next() => match next {
                None => return,
                Some(s) if s.is_synced() => {
                    if latest.is_none() {
                        health.serving().await;
                    }
                    latest = Some(s);
                }
                Some(_) => continue,
            },
            () = demand.changed.notified() => {}
            () = async {
                match drop_at {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
        if !demand.wanted() {
            let now = tokio::time::Instant::now();
            let since = *idle_since.get_or_insert(now);
            if previous.is_some() && now >= since + keep {
                previous = None;
                frame_tx.send_replace(Arc::new(Frame::default()));
            }
            continue;
        }
        idle_since = None;
        let Some(snapshot) = latest.clone() else {
            continue;
        };
        if previous.as_ref().is_some_and(|p| p.rev == snapshot.rev) {
            continue;
        }
        // Conversion is CPU work proportional to what changed.
        let held = previous.take();
        let convert = move || Frame::from_snapshot(&snapshot, held.as_deref());
        match tokio::task::spawn_blocking(convert).await {
            Ok(f) => {
                let f = Arc::new(f);
                previous = Some(f.clone());
                frame_tx.send_replace(f);
            }
            Err(e) => tracing::error!(error = %e, "converting the state for localnet failed"),
        }
    }
}

/// One `Watch` call: what the client holds, and how the call ended (a
/// dropped stream, the client gone, counts as CANCELLED).
struct WatchCall {
    _interest: Interest,
    api: LocalnetService,
    frames: watch::Receiver<Arc<Frame>>,
    /// The (instance id, rev) the client said it holds, until the first
    /// frame is sent.
    client: Option<(u64, u64)>,
    sent_rev: Option<u64>,
    /// The client asked for delta frames.
    deltas: bool,
    /// Delta clients: the frame the client holds, the base of its next
    /// delta.
    held: Option<Arc<Frame>>,
    code: tonic::Code,
    _open: Option<OpenCall>,
}

impl WatchCall {
    async fn next_frame(&mut self) -> Result<Arc<Frame>, Status> {
        let frame = match (self.client.take(), self.sent_rev) {
            (Some((instance_id, rev)), _) => self.api.wait_for_frame(instance_id, rev).await?,
            (None, sent) => {
                let changed = tokio::select! {
                    _ = self.api.shutdown.cancelled() => None,
                    r = self.frames.wait_for(|f| Some(f.rev) != sent && f.rev >= 1) => {
                        r.ok().map(|f| f.clone())
                    }
                };
                changed.ok_or_else(|| Status::unavailable("server shutting down"))?
            }
        };
        self.sent_rev = Some(frame.rev);
        Ok(frame)
    }

    /// The events that bring the client to `frame`.
    fn items(&mut self, frame: Arc<Frame>) -> FrameItems {
        let id = self.api.instance_id;
        if !self.deltas {
            return Box::new(frame.watch_items(id));
        }
        let held = self.held.replace(frame.clone());
        match held {
            None => Box::new(frame.watch_items(id)),
            Some(h) => Box::new(Delta::for_watcher(&h, &frame).watch_items(id)),
        }
    }
}

impl Drop for WatchCall {
    fn drop(&mut self) {
        self.api.finished("Watch", self.code);
    }
}

/// The client's deadline from the `grpc-timeout` header, shortened a little.
///
/// tonic's transport also enforces that header but answers CANCELLED; a
/// long poll that simply found nothing new within the deadline is
/// DEADLINE_EXCEEDED in gRPC's status semantics, so the handler ends the
/// wait itself just before the transport would.
fn grpc_timeout(metadata: &tonic::metadata::MetadataMap) -> Option<std::time::Duration> {
    use std::time::Duration;
    let v = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    let d = match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    };
    Some(d.saturating_sub((d / 50).max(Duration::from_millis(2))))
}

/// Bound listeners; binding happens before anything is served, so a bad
/// address fails start-up with the flag's name.
pub struct Listeners {
    tcp: Option<(SocketAddr, TcpListener)>,
    unix: Option<(PathBuf, UnixListener)>,
}

impl Listeners {
    /// Binds the TCP address and the unix socket (mode 0660, parent
    /// directory created, a stale socket file replaced). `None` disables one.
    pub async fn bind(
        tcp: Option<SocketAddr>,
        socket: Option<&Path>,
    ) -> Result<Self, LocalnetError> {
        let tcp = match tcp {
            Some(addr) => {
                let l = TcpListener::bind(addr)
                    .await
                    .map_err(|source| LocalnetError::BindTcp { addr, source })?;
                let local = l
                    .local_addr()
                    .map_err(|source| LocalnetError::BindTcp { addr, source })?;
                Some((local, l))
            }
            None => None,
        };
        let unix = match socket {
            Some(path) => Some((
                path.to_owned(),
                bind_unix(path).map_err(|source| LocalnetError::BindUnix {
                    path: path.to_owned(),
                    source,
                })?,
            )),
            None => None,
        };
        Ok(Self { tcp, unix })
    }

    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp.as_ref().map(|(a, _)| *a)
    }

    /// Serves until `shutdown`; removes the unix socket file afterwards.
    pub async fn serve(
        self,
        service: LocalnetService,
        limits: GrpcLimits,
        shutdown: CancellationToken,
    ) -> Result<(), LocalnetError> {
        let mut tasks = tokio::task::JoinSet::new();
        if let Some((addr, l)) = self.tcp {
            let router = grpc_limits::server(limits).add_routes(service.routes());
            let stop = shutdown.clone();
            tracing::info!(%addr, "localnet API listening");
            tasks.spawn(async move {
                router
                    .serve_with_incoming_shutdown(
                        grpc_limits::limit(
                            TcpListenerStream::new(l),
                            limits.max_connections,
                            addr.to_string(),
                        ),
                        stop.cancelled_owned(),
                    )
                    .await
            });
        }
        let socket_path = self.unix.as_ref().map(|(p, _)| p.clone());
        if let Some((path, l)) = self.unix {
            let router = grpc_limits::server(limits).add_routes(service.routes());
            let stop = shutdown.clone();
            tracing::info!(path = %path.display(), "localnet API listening");
            tasks.spawn(async move {
                router
                    .serve_with_incoming_shutdown(
                        grpc_limits::limit(
                            grpc_unix::incoming(l),
                            limits.max_connections,
                            path.display().to_string(),
                        ),
                        stop.cancelled_owned(),
                    )
                    .await
            });
        }
        let mut result = Ok(());
        while let Some(r) = tasks.join_next().await {
            match r {
                Ok(Err(e)) if result.is_ok() => {
                    shutdown.cancel();
                    result = Err(e.into());
                }
                Err(e) => tracing::error!(error = %e, "localnet server task failed"),
                _ => {}
            }
        }
        if let Some(path) = socket_path {
            remove_socket(&path);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::model::testing;
    use crate::snapshot::{snapshot_channel, Snapshot};

    fn snapshot(rev: u64) -> Arc<Snapshot> {
        let svc = testing::service("default", "web", &["10.96.0.10"]);
        Arc::new(Snapshot {
            rev,
            state: Arc::new(testing::state(vec![svc])),
            changed: None,
        })
    }

    async fn frame_at(frames: &mut watch::Receiver<Arc<Frame>>, rev: u64) -> Arc<Frame> {
        tokio::time::timeout(Duration::from_secs(5), frames.wait_for(|f| f.rev == rev))
            .await
            .unwrap_or_else(|_| panic!("no frame of revision {rev}"))
            .expect("converter gone")
            .clone()
    }

    /// Nothing is encoded until a call wants frames; while one does, every
    /// revision is; once none has for the keep time, the encoded state
    /// goes, and the next call has it made again.
    #[tokio::test]
    async fn frames_are_made_while_calls_want_them_and_dropped_when_idle() {
        let (snapshots, rx) = snapshot_channel();
        let shutdown = CancellationToken::new();
        let demand = Arc::new(Demand::default());
        let (frame_tx, mut frames) = watch::channel(Arc::new(Frame::default()));
        let health = Discovery::new(SERVICE_NAME).await;
        let keep = Duration::from_millis(300);
        let follower = Follower::new(rx, shutdown.clone());
        let task = tokio::spawn(convert(follower, demand.clone(), frame_tx, health, keep));

        snapshots.send_replace(snapshot(1));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(frames.borrow().rev, 0, "no call: nothing encoded");

        let interest = Interest::new(&demand);
        assert_eq!(frame_at(&mut frames, 1).await.services.len(), 1);
        snapshots.send_replace(snapshot(2));
        frame_at(&mut frames, 2).await;

        drop(interest);
        tokio::time::sleep(keep / 3).await;
        assert_eq!(frames.borrow().rev, 2, "kept for a while after the call");
        let dropped = frame_at(&mut frames, 0).await;
        assert!(dropped.services.is_empty());

        let _again = Interest::new(&demand);
        assert_eq!(frame_at(&mut frames, 2).await.services.len(), 1);
        shutdown.cancel();
        task.await.expect("converter ends with the shutdown");
    }
}
