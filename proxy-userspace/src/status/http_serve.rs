//! The accept loop of the two HTTP servers, with the limits a node-wide
//! daemon needs against clients it does not control: at most
//! `max_connections` open at once, a deadline for a request's headers (a
//! silent or trickling connection is closed instead of holding a slot),
//! and caps on header count and size. At the limit a new connection is
//! not refused (that would let idle clients starve the kubelet's probe):
//! the oldest connection is told to close (at once when idle, after its
//! response otherwise) and the new one takes its place. `axum::serve` has
//! none of these knobs, so the loop drives hyper's connection builder.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Limits of one HTTP server (`--http-max-connections`,
/// `--http-read-timeout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    pub max_connections: usize,
    /// Time a client has to send a request's headers, also on an idle
    /// keep-alive connection.
    pub read_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_connections: 512,
            read_timeout: Duration::from_secs(10),
        }
    }
}

/// Header lines a request may have (kubelet probes and Prometheus send
/// fewer than ten).
const MAX_HEADERS: usize = 64;
/// Bytes of request head (request line and headers) buffered.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// How long in-flight requests may finish after shutdown.
const DRAIN: Duration = Duration::from_secs(5);
/// How long a new connection waits for an evicted one to let go.
const EVICT_WAIT: Duration = Duration::from_secs(2);

/// Serves `router` on `listener` until `stop`.
pub async fn serve(
    listener: TcpListener,
    addr: SocketAddr,
    router: Router,
    limits: HttpLimits,
    stop: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    // Open connections, oldest first: (alive while the task runs, close).
    let mut open: VecDeque<(Weak<()>, CancellationToken)> = VecDeque::new();
    let mut evicted = 0u64;
    let mut conns = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.cancelled() => break,
        };
        // Reap finished connections so the set and the queue stay small.
        while conns.try_join_next().is_some() {}
        open.retain(|(alive, _)| alive.strong_count() > 0);
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and friends: back off a moment rather than spin.
                tracing::warn!(%addr, error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                if let Some((_, close)) = open.pop_front() {
                    close.cancel();
                }
                evicted += 1;
                if evicted == 1 || evicted.is_power_of_two() {
                    tracing::warn!(%addr, max = limits.max_connections, evicted, "HTTP connection limit reached; closing the oldest connections for new ones");
                }
                match tokio::time::timeout(EVICT_WAIT, permits.clone().acquire_owned()).await {
                    Ok(Ok(p)) => p,
                    _ => continue,
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let close = stop.child_token();
        let alive = Arc::new(());
        open.push_back((Arc::downgrade(&alive), close.clone()));
        conns.spawn(async move {
            let _alive = alive;
            let _permit = permit;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.read_timeout)
                .max_headers(MAX_HEADERS)
                .max_buf_size(MAX_HEAD_BYTES);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = close.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(DRAIN, conn).await;
                }
            }
        });
    }
    let _ = tokio::time::timeout(DRAIN, async { while conns.join_next().await.is_some() {} }).await;
}
