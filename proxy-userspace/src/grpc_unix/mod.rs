//! gRPC on unix sockets, shared by the localnet (SPEC §6) and PodInfo
//! (SPEC §7) servers and clients: the client channel, binding the socket file (mode 0660, a stale file
//! replaced), removing it at exit, and accepted connections that know
//! their peer process and accept any client's `:authority` (SPEC §10.1,
//! see [`authority`]).

/// `AsyncWrite` for a wrapper type that passes writes to its field `$io`
/// unchanged (the wrappers here only act on reads or on drop).
macro_rules! delegate_async_write {
    ($ty:ty, $io:ident $(, $($gen:tt)*)?) => {
        impl$(<$($gen)*>)? tokio::io::AsyncWrite for $ty {
            fn poll_write(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                tokio::io::AsyncWrite::poll_write(std::pin::Pin::new(&mut self.$io), cx, buf)
            }

            fn poll_write_vectored(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                tokio::io::AsyncWrite::poll_write_vectored(std::pin::Pin::new(&mut self.$io), cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                tokio::io::AsyncWrite::is_write_vectored(&self.$io)
            }

            fn poll_flush(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                tokio::io::AsyncWrite::poll_flush(std::pin::Pin::new(&mut self.$io), cx)
            }

            fn poll_shutdown(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                tokio::io::AsyncWrite::poll_shutdown(std::pin::Pin::new(&mut self.$io), cx)
            }
        }
    };
}

pub mod authority;
pub mod limits;
mod streams;

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint, Uri};

use authority::Rewriter;

/// Largest message the servers send and the clients accept (SPEC §6.2).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// A gRPC channel over the unix socket at `path` (shared by the localnet
/// and PodInfo clients).
pub async fn channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    // The URI is required by the API but unused by the connector.
    channel_with(Endpoint::from_static("http://unix.invalid"), path).await
}

/// [`channel`] with `endpoint`'s settings (its URI is not used).
pub async fn channel_with(
    endpoint: Endpoint,
    path: &Path,
) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_owned();
    endpoint
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
}

/// Who is at the other end of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Peer {
    /// The peer process, from `SO_PEERCRED`.
    Process { uid: u32, pid: i32 },
    /// One connection (no peer credentials available).
    Connection(u64),
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Process { uid, pid } => write!(f, "uid={uid} pid={pid}"),
            Peer::Connection(id) => write!(f, "connection={id}"),
        }
    }
}

/// Binds `path`: parent directory created, a stale socket file replaced,
/// mode 0660.
pub fn bind_unix(path: &Path) -> io::Result<UnixListener> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => tracing::debug!(path = %path.display(), "replaced a stale socket file"),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    Ok(l)
}

/// Gives the socket file to group `gid` (`--socket-group`); its mode stays
/// 0660, so the group's members may connect and nobody else may.
pub fn set_group(path: &Path, gid: u32) -> io::Result<()> {
    std::os::unix::fs::chown(path, None, Some(gid))
}

/// Removes the socket file at exit; a file already gone is fine.
pub fn remove_socket(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), error = %e, "could not remove socket file");
        }
    }
}

/// The connections accepted on `listener`, ready for
/// `tonic::transport::Server::serve_with_incoming*`.
pub fn incoming(listener: UnixListener) -> impl Stream<Item = io::Result<UnixConn>> {
    let mut connection = 0u64;
    UnixListenerStream::new(listener).map(move |accepted| {
        connection += 1;
        accepted.map(|io| UnixConn::new(io, connection))
    })
}

/// An accepted connection: its peer (tonic puts it into every request's
/// extensions) and the `:authority` fix on what the server reads.
pub struct UnixConn {
    io: UnixStream,
    peer: Peer,
    rewriter: Rewriter,
    /// Rewritten bytes not yet handed to the server.
    ready: Vec<u8>,
    /// How much of `ready` the server has read.
    offset: usize,
}

/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 16 * 1024;

impl UnixConn {
    fn new(io: UnixStream, connection: u64) -> Self {
        let peer = match io.peer_cred() {
            Ok(cred) => match cred.pid() {
                Some(pid) => Peer::Process {
                    uid: cred.uid(),
                    pid,
                },
                None => Peer::Connection(connection),
            },
            Err(e) => {
                tracing::debug!(error = %e, "no peer credentials; identifying the connection");
                Peer::Connection(connection)
            }
        };
        Self {
            io,
            peer,
            rewriter: Rewriter::default(),
            ready: Vec::new(),
            offset: 0,
        }
    }
}

impl Connected for UnixConn {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.peer
    }
}

impl AsyncRead for UnixConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        // Reads until the rewriter has output or the socket has no more
        // for now; each pass consumes input, so this ends.
        while this.offset == this.ready.len() {
            this.ready.clear();
            this.offset = 0;
            let mut chunk = [0u8; READ_CHUNK];
            let mut raw = ReadBuf::new(&mut chunk);
            std::task::ready!(Pin::new(&mut this.io).poll_read(cx, &mut raw))?;
            if raw.filled().is_empty() {
                return Poll::Ready(Ok(())); // end of stream
            }
            if let Err(e) = this.rewriter.push(raw.filled(), &mut this.ready) {
                tracing::debug!(peer = %this.peer, error = %e, "closing a gRPC connection");
                return Poll::Ready(Err(e.into()));
            }
        }
        let n = buf.remaining().min(this.ready.len() - this.offset);
        buf.put_slice(&this.ready[this.offset..this.offset + n]);
        this.offset += n;
        Poll::Ready(Ok(()))
    }
}

delegate_async_write!(UnixConn, io);
