//! What one gRPC client may hold of the daemon, for both servers (localnet
//! on TCP and its unix socket, PodInfo): a cap on open connections (at the
//! cap, a new connection takes the slot of the oldest one that has no open
//! stream, which is closed; only when every connection has a stream open
//! is the new one closed instead; each logged once per burst), a cap on
//! concurrent streams per connection (HTTP/2 SETTINGS, so clients queue
//! rather than fail), HTTP/2 keep-alive pings that drop a peer which
//! stopped answering, and the message size cap of SPEC §6.2. Each stream's
//! send queue is bounded where the stream is produced (see the Watch
//! handlers).

use std::collections::BTreeMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::Connected;

use super::streams::StreamTracker;

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

/// `incoming` with at most `max` connections open at once. At the cap a
/// new connection closes the oldest open one that has no stream open (it
/// reads end-of-file, so the server drops it) and takes its slot; when
/// every open connection has a stream, the new one is closed as it is
/// accepted. `what` names the listener in the log.
pub fn limit<S, IO>(
    incoming: S,
    max: usize,
    what: String,
) -> impl Stream<Item = io::Result<Limited<IO>>>
where
    S: Stream<Item = io::Result<IO>>,
{
    let table = Arc::new(Table {
        max,
        what,
        state: Mutex::default(),
    });
    incoming.filter_map(move |accepted| match accepted {
        Err(e) => Some(Err(e)),
        Ok(io) => Table::admit(&table).map(|slot| {
            Ok(Limited {
                io,
                slot,
                streams: StreamTracker::default(),
            })
        }),
    })
}

/// One listener's open connections.
struct Table {
    max: usize,
    what: String,
    state: Mutex<TableState>,
}

#[derive(Default)]
struct TableState {
    next_id: u64,
    /// By accept order: the first is the oldest.
    open: BTreeMap<u64, Arc<Shared>>,
    /// Connections closed to make room since the last one admitted below
    /// the cap, and new ones refused since the last one admitted: each
    /// logged on the first of a burst.
    evicted: u64,
    refused: u64,
}

/// What the table and one connection both see.
#[derive(Default)]
struct Shared {
    /// Streams open on the connection.
    streams: AtomicUsize,
    /// The connection was chosen to make room: its next read is the end.
    closing: AtomicBool,
    /// The connection's reader, woken when it is chosen.
    reader: AtomicWaker,
}

impl Table {
    fn state(&self) -> MutexGuard<'_, TableState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a new connection, or `None` when every slot is held by
    /// a connection with an open stream.
    fn admit(table: &Arc<Table>) -> Option<Slot> {
        let mut st = table.state();
        if st.open.len() >= table.max {
            let idle = st
                .open
                .iter()
                .find(|(_, c)| c.streams.load(Ordering::SeqCst) == 0)
                .map(|(id, _)| *id);
            let Some(oldest) = idle else {
                if st.refused == 0 {
                    tracing::warn!(listener = %table.what, max = table.max, "gRPC connection limit reached and every connection has a call open; closing new connections until some end");
                }
                st.refused += 1;
                return None;
            };
            let evicted = st.open.remove(&oldest).expect("found above");
            evicted.closing.store(true, Ordering::SeqCst);
            evicted.reader.wake();
            if st.evicted == 0 {
                tracing::info!(listener = %table.what, max = table.max, "gRPC connection limit reached; closing the oldest idle connections to make room");
            }
            st.evicted += 1;
        } else {
            st.evicted = 0;
        }
        st.refused = 0;
        let id = st.next_id;
        st.next_id += 1;
        let shared = Arc::new(Shared::default());
        st.open.insert(id, shared.clone());
        Some(Slot {
            table: table.clone(),
            id,
            shared,
        })
    }
}

/// A connection's place in its listener's table, given back on drop.
struct Slot {
    table: Arc<Table>,
    id: u64,
    shared: Arc<Shared>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Gone already when it was closed to make room.
        self.table.state().open.remove(&self.id);
    }
}

/// A connection that holds one of its listener's slots while open, and
/// says whether it has streams open.
pub struct Limited<IO> {
    io: IO,
    slot: Slot,
    streams: StreamTracker,
}

impl<IO> Limited<IO> {
    fn count_streams(&self) {
        self.slot
            .shared
            .streams
            .store(self.streams.open(), Ordering::SeqCst);
    }
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
        let this = &mut *self;
        let shared = &this.slot.shared;
        shared.reader.register(cx.waker());
        if shared.closing.load(Ordering::SeqCst) {
            // End of stream: the server drops the connection.
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = read {
            this.streams.client_bytes(&buf.filled()[before..]);
            this.count_streams();
        }
        read
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Limited<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let written = Pin::new(&mut this.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            this.streams.server_bytes(&buf[..n]);
            this.count_streams();
        }
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let written = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = written {
            let mut left = n;
            for b in bufs {
                if left == 0 {
                    break;
                }
                let take = left.min(b.len());
                this.streams.server_bytes(&b[..take]);
                left -= take;
            }
            this.count_streams();
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
