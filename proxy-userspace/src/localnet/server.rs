//! The localnet `Endpoints` gRPC server (SPEC §6) on TCP and a unix socket.
//!
//! Every published [`Snapshot`] is converted and encoded once into a
//! [`Frame`] shared by all clients. `Next` long-polls on the frame
//! channel; `Watch` streams one complete frame per revision, or after the
//! first only the changes to clients that ask for deltas.

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

/// The gRPC service: shared by the TCP and unix listeners.
#[derive(Clone)]
pub struct LocalnetService {
    instance_id: u64,
    frames: watch::Receiver<Arc<Frame>>,
    shutdown: CancellationToken,
    metrics: Option<LocalnetMetrics>,
    discovery: Discovery,
    /// The snapshot → frame task, owned by the service's clones.
    _converter: Arc<AbortOnDropHandle<()>>,
}

impl LocalnetService {
    /// Starts converting snapshots into frames (a task that ends with the
    /// snapshot channel or `shutdown`, and is aborted when the last clone
    /// of the service goes). gRPC health turns `SERVING` with the first
    /// frame.
    pub async fn new(
        instance_id: u64,
        snapshots: SnapshotReceiver,
        shutdown: CancellationToken,
    ) -> Self {
        let (frame_tx, frames) = watch::channel(Arc::new(Frame::default()));
        let discovery = Discovery::new(SERVICE_NAME).await;
        let health = discovery.clone();
        let mut follower = Follower::new(snapshots, shutdown.clone());
        let converter = tokio::spawn(async move {
            let mut previous: Option<Arc<Frame>> = None;
            while let Some(snapshot) = follower.next().await {
                if !snapshot.is_synced() {
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
                        health.serving().await;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "converting the state for localnet failed")
                    }
                }
            }
        });
        Self {
            instance_id,
            frames,
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

    /// Waits for a synced frame other than the one the client holds.
    async fn wait_for_frame(&self, instance_id: u64, rev: u64) -> Result<Arc<Frame>, Status> {
        let mut frames = self.frames.clone();
        let holds_current = |f: &Frame| instance_id == self.instance_id && rev == f.rev;
        tokio::select! {
            r = frames.wait_for(|f| f.rev >= 1 && !holds_current(f)) => match r {
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

/// One `Watch` call: what the client holds, and how the call ended (a
/// dropped stream, the client gone, counts as CANCELLED).
struct WatchCall {
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
