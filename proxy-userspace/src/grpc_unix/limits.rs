//! What one gRPC client may hold of the daemon, for both servers (localnet
//! on TCP and its unix socket, PodInfo): a cap on open connections (a new
//! connection over it is closed at once, logged once per burst), a cap on
//! concurrent streams per connection (HTTP/2 SETTINGS, so clients queue
//! rather than fail), HTTP/2 keep-alive pings that drop a peer which
//! stopped answering, and the message size cap of SPEC §6.2. Each stream's
//! send queue is bounded where the stream is produced (see the Watch
//! handlers).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::Connected;

/// `--grpc-max-connections`, `--grpc-max-streams`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrpcLimits {
    /// Open connections per listener.
    pub max_connections: usize,
    /// Concurrent streams (calls) per connection.
    pub max_streams: u32,
}

impl Default for GrpcLimits {
    fn default() -> Self {
        GrpcLimits {
            max_connections: 256,
            max_streams: 64,
        }
    }
}

/// A peer that does not answer a keep-alive ping within this is dropped.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// A tonic server builder with these limits.
pub fn server(limits: GrpcLimits) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_concurrent_streams(limits.max_streams)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .tcp_keepalive(Some(KEEPALIVE_INTERVAL))
}

/// `incoming` with at most `max` connections open at once; a connection
/// over the cap is closed as it is accepted. `what` names the listener in
/// the log.
pub fn limit<S, IO>(
    incoming: S,
    max: usize,
    what: String,
) -> impl Stream<Item = io::Result<Limited<IO>>>
where
    S: Stream<Item = io::Result<IO>>,
{
    let permits = Arc::new(Semaphore::new(max));
    let refused = AtomicU64::new(0);
    incoming.filter_map(move |accepted| match accepted {
        Err(e) => Some(Err(e)),
        Ok(io) => match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                refused.store(0, Ordering::Relaxed);
                Some(Ok(Limited {
                    io,
                    _permit: permit,
                }))
            }
            Err(_) => {
                if refused.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(listener = %what, max, "gRPC connection limit reached; closing new connections until some end");
                }
                None
            }
        },
    })
}

/// A connection that holds one of its listener's slots while open.
pub struct Limited<IO> {
    io: IO,
    _permit: OwnedSemaphorePermit,
}

impl<IO: Connected> Connected for Limited<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Limited<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

delegate_async_write!(Limited<IO>, io, IO: AsyncWrite + Unpin);
