//! Client side of the localnet API, used by `ebpf-kube-proxy localnet watch`
//! and `dump`: connect over TCP or a unix socket, long-poll `Next`, resume
//! with the (instance id, rev) received, like KPNG's client library.

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
}

/// Opens a channel to the target (lazily for unix sockets' reconnects).
pub async fn connect(target: &Target) -> Result<EndpointsClient<Channel>, ClientError> {
    let err = |source| ClientError::Connect {
        target: target.clone(),
        source,
    };
    let channel = match target {
        Target::Tcp(addr) => Endpoint::from_shared(format!("http://{addr}"))
            .map_err(err)?
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(err)?,
        Target::Unix(path) => grpc_unix::channel(path).await.map_err(err)?,
    };
    Ok(EndpointsClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES))
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
