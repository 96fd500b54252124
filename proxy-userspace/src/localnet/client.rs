//! Client side of the localnet API, used by `ebpf-kube-proxy localnet watch`
//! and `dump`: connect over TCP or a unix socket, long-poll `Next`, resume
//! with the (instance id, rev) received, like KPNG's client library; or
//! follow a delta `Watch` stream and rebuild the state from its frames.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use proto::localnet::v1 as pb;
use proto::localnet::v1::endpoints_client::EndpointsClient;
use tokio_stream::StreamExt;
use tonic::transport::{Channel, Endpoint};

use crate::grpc_unix::{self, MAX_MESSAGE_BYTES};

/// Where the localnet API is: `HOST:PORT` or `unix:PATH`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Tcp(String),
    Unix(PathBuf),
}

impl FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix:") {
            let path = path.trim_start_matches("//");
            if path.is_empty() {
                return Err("unix: needs a socket path".to_owned());
            }
            return Ok(Target::Unix(PathBuf::from(path)));
        }
        let hostport = s.strip_prefix("http://").unwrap_or(s);
        match hostport.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                Ok(Target::Tcp(hostport.to_owned()))
            }
            _ => Err(format!("{s:?} is neither HOST:PORT nor unix:PATH")),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Tcp(a) => f.write_str(a),
            Target::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connecting to {target}: {source}")]
    Connect {
        target: Target,
        source: tonic::transport::Error,
    },
    #[error("{0}")]
    Status(#[from] tonic::Status),
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Every address tried refused: each with its whole cause chain.
    #[error("{0}")]
    Unreachable(String),
}

/// The largest HTTP/2 frame the client takes (SETTINGS_MAX_FRAME_SIZE):
/// the server sends a 25 MB state in frames of this size, not 16 KiB
/// ones (one write and one read each).
pub const MAX_FRAME_BYTES: u32 = 256 * 1024;
/// The client's HTTP/2 receive windows: how much the server may send
/// ahead of what the client has read, per stream and per connection.
pub const STREAM_WINDOW_BYTES: u32 = 4 * 1024 * 1024;
pub const CONNECTION_WINDOW_BYTES: u32 = 8 * 1024 * 1024;

/// A channel to the target with the client's HTTP/2 settings (lazily
/// reconnecting for unix sockets).
pub async fn channel(target: &Target) -> Result<Channel, ClientError> {
    let err = |source| ClientError::Connect {
        target: target.clone(),
        source,
    };
    let settings = |e: Endpoint| {
        e.max_frame_size(MAX_FRAME_BYTES)
            .initial_stream_window_size(STREAM_WINDOW_BYTES)
            .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
    };
    Ok(match target {
        Target::Tcp(addr) => {
            settings(Endpoint::from_shared(format!("http://{addr}")).map_err(err)?)
                .connect_timeout(Duration::from_secs(5))
                .connect()
                .await
                .map_err(err)?
        }
        Target::Unix(path) => {
            grpc_unix::channel_with(settings(Endpoint::from_static("http://unix.invalid")), path)
                .await
                .map_err(err)?
        }
    })
}

/// Opens a channel to the target (lazily for unix sockets' reconnects).
pub async fn connect(target: &Target) -> Result<EndpointsClient<Channel>, ClientError> {
    let channel = channel(target).await?;
    Ok(EndpointsClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES))
}

/// Connects to the first of `targets` that answers, in order; returns it
/// with the client. One target fails as [`connect`] does; several with an
/// error that names each one tried and why it failed.
pub async fn connect_first(
    targets: &[Target],
) -> Result<(EndpointsClient<Channel>, &Target), ClientError> {
    let mut failures = Vec::new();
    for target in targets {
        match connect(target).await {
            Ok(c) => return Ok((c, target)),
            Err(e) if targets.len() == 1 => return Err(e),
            Err(e) => failures.push(cause_chain(&e)),
        }
    }
    Err(ClientError::Unreachable(if failures.is_empty() {
        "no address to dial".to_owned()
    } else {
        failures.join("; ")
    }))
}

/// `e` and its causes on one line, each said once (tonic's transport error
/// alone says only "transport error").
fn cause_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out = format!("{out}: {text}");
        }
        cause = c.source();
    }
    out
}

/// One full state as received from `Next`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    pub instance_id: u64,
    pub rev: u64,
    pub services: Vec<pb::ServiceEndpoints>,
}

/// One `Next` call: blocks while the server holds exactly (instance_id, rev).
pub async fn next(
    client: &mut EndpointsClient<Channel>,
    instance_id: u64,
    rev: u64,
) -> Result<State, ClientError> {
    let mut stream = client
        .next(pb::NextFilter { instance_id, rev })
        .await?
        .into_inner();
    let mut state: Option<State> = None;
    while let Some(item) = stream.next().await {
        match (item?.item, state.as_mut()) {
            (Some(pb::next_item::Item::Next(n)), None) => {
                state = Some(State {
                    instance_id: n.instance_id,
                    rev: n.rev,
                    services: Vec::new(),
                })
            }
            (Some(pb::next_item::Item::Endpoints(e)), Some(s)) => s.services.push(e),
            (other, _) => {
                return Err(ClientError::Protocol(format!(
                    "unexpected item {other:?} (a stream must start with `next`, then `endpoints`)"
                )))
            }
        }
    }
    state.ok_or_else(|| ClientError::Protocol("stream ended without a `next` item".to_owned()))
}

/// Opens a `Watch` stream, resuming at (instance_id, rev); `deltas` asks
/// for delta frames after the first.
pub async fn watch(
    client: &mut EndpointsClient<Channel>,
    instance_id: u64,
    rev: u64,
    deltas: bool,
) -> Result<tonic::Streaming<pb::WatchEvent>, ClientError> {
    let request = pb::WatchRequest {
        instance_id,
        rev,
        deltas,
    };
    Ok(client.watch(request).await?.into_inner())
}

/// The state a `Watch` stream has brought, full or delta frames alike.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Watched {
    pub instance_id: u64,
    pub rev: u64,
    /// By (namespace, name): the §6.2 order.
    services: BTreeMap<(String, String), pb::ServiceEndpoints>,
}

fn key_of(s: &pb::ServiceEndpoints) -> (String, String) {
    s.service
        .as_ref()
        .map(|s| (s.namespace.clone(), s.name.clone()))
        .unwrap_or_default()
}

impl Watched {
    /// The whole state, as `Next` returns it.
    pub fn state(&self) -> State {
        State {
            instance_id: self.instance_id,
            rev: self.rev,
            services: self.services.values().cloned().collect(),
        }
    }

    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    /// Applies one frame: `begin` and the events up to (without) `end`.
    /// Nothing changes when the frame does not fit what is held (a delta
    /// on another revision, counts that do not match, a removal of a
    /// service not held).
    pub fn apply(
        &mut self,
        begin: &pb::StateBegin,
        events: impl IntoIterator<Item = pb::watch_event::Event>,
    ) -> Result<(), ClientError> {
        use pb::watch_event::Event;
        let full = begin.base_rev == 0;
        if !full && (begin.instance_id, begin.base_rev) != (self.instance_id, self.rev) {
            return Err(ClientError::Protocol(format!(
                "a delta on revision {} of instance {:#x}, holding revision {} of {:#x}",
                begin.base_rev, begin.instance_id, self.rev, self.instance_id
            )));
        }
        // Checked whole before anything changes: a delta is applied in
        // place (no copy of the state per frame), a full frame replaces.
        let (mut upserts, mut removed) = (Vec::new(), Vec::new());
        for event in events {
            match event {
                Event::Service(s) => upserts.push(s),
                Event::Removed(k) if !full => {
                    let key = (k.namespace, k.name);
                    if !self.services.contains_key(&key) {
                        return Err(ClientError::Protocol(format!(
                            "removed {}/{}, which is not held",
                            key.0, key.1
                        )));
                    }
                    removed.push(key);
                }
                other => {
                    return Err(ClientError::Protocol(format!(
                        "unexpected event {other:?} inside a frame"
                    )))
                }
            }
        }
        let counts = (upserts.len(), removed.len());
        if counts != (begin.service_count as usize, begin.removed_count as usize) {
            return Err(ClientError::Protocol(format!(
                "frame of revision {} announced {} services and {} removals, carried {} and {}",
                begin.rev, begin.service_count, begin.removed_count, counts.0, counts.1
            )));
        }
        if full {
            self.services.clear();
        }
        for key in &removed {
            self.services.remove(key);
        }
        for s in upserts {
            self.services.insert(key_of(&s), s);
        }
        self.instance_id = begin.instance_id;
        self.rev = begin.rev;
        Ok(())
    }

    /// Reads one whole frame from `stream` and applies it; its `begin`,
    /// or `None` when the stream ended before a frame began.
    pub async fn read_frame(
        &mut self,
        stream: &mut tonic::Streaming<pb::WatchEvent>,
    ) -> Result<Option<pb::StateBegin>, ClientError> {
        use pb::watch_event::Event;
        let begin = match stream.next().await {
            None => return Ok(None),
            Some(e) => match e?.event {
                Some(Event::Begin(b)) => b,
                other => {
                    return Err(ClientError::Protocol(format!(
                        "a frame must start with `begin`, got {other:?}"
                    )))
                }
            },
        };
        let mut events = Vec::new();
        loop {
            match stream.next().await.transpose()?.map(|e| e.event) {
                Some(Some(Event::End(_))) => break,
                Some(Some(e)) => events.push(e),
                Some(None) => return Err(ClientError::Protocol("an empty event".to_owned())),
                None => {
                    return Err(ClientError::Protocol(
                        "the stream ended inside a frame".to_owned(),
                    ))
                }
            }
        }
        self.apply(&begin, events)?;
        Ok(Some(begin))
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    /// What the client says in its first HTTP/2 frames: the SETTINGS
    /// (id, value) pairs and the connection window increment.
    async fn client_settings(
        target: Target,
        listener: tokio::net::UnixListener,
    ) -> (Vec<(u16, u32)>, u32) {
        let dial = tokio::spawn(async move { channel(&target).await });
        let (mut conn, _) = listener.accept().await.expect("the client connects");
        let mut preface = [0u8; 24];
        conn.read_exact(&mut preface).await.expect("preface");
        assert_eq!(&preface, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        let (mut settings, mut window) = (Vec::new(), 0);
        // SETTINGS, then WINDOW_UPDATE on the connection.
        for _ in 0..2 {
            let mut head = [0u8; 9];
            conn.read_exact(&mut head).await.expect("a frame header");
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let mut payload = vec![0u8; len];
            conn.read_exact(&mut payload).await.expect("a frame");
            match head[3] {
                0x4 => {
                    settings = payload
                        .chunks(6)
                        .map(|c| {
                            let id = u16::from_be_bytes([c[0], c[1]]);
                            (id, u32::from_be_bytes([c[2], c[3], c[4], c[5]]))
                        })
                        .collect()
                }
                0x8 => window = u32::from_be_bytes(payload[..4].try_into().expect("4 bytes")),
                other => panic!("frame type {other} before the window update"),
            }
        }
        dial.abort();
        (settings, window)
    }

    /// The server may send frames of 256 KiB and 4 MiB per stream ahead
    /// (8 MiB per connection), not HTTP/2's 16 KiB and 64 KiB: a 25 MB
    /// state goes out in 100 writes, not 1,600.
    #[tokio::test]
    async fn the_client_takes_large_frames_and_windows() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sock");
        let listener = tokio::net::UnixListener::bind(&path).expect("bind");
        let (settings, window) = tokio::time::timeout(
            Duration::from_secs(10),
            client_settings(Target::Unix(path), listener),
        )
        .await
        .expect("the client's settings within 10 s");
        // SETTINGS_INITIAL_WINDOW_SIZE (4) and SETTINGS_MAX_FRAME_SIZE (5).
        assert!(settings.contains(&(4, STREAM_WINDOW_BYTES)), "{settings:?}");
        assert!(settings.contains(&(5, MAX_FRAME_BYTES)), "{settings:?}");
        assert_eq!(window, CONNECTION_WINDOW_BYTES - 65_535);
    }
}
