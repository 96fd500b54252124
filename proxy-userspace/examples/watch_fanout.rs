//! N localnet `Watch` clients on one daemon, for `cargo xtask bench`: how
//! long until every watcher holds a new revision.
//!
//! `watch_fanout --target unix:PATH|HOST:PORT [--clients N] [--deltas] [--decode]`
//!
//! Each client opens its own connection and reads whole frames (`begin`,
//! the services, `end`); with `--deltas` it asks for delta frames (the
//! first frame is still the whole state) and checks that each delta is on
//! the revision it holds. A client holds a frame when it has every event
//! of it: each event's kind read, `begin` decoded, the count of events
//! checked against it, each service's bytes taken as they came in (a
//! slice of the received buffer, to be decoded when the client looks at
//! it). That is what any client must do to hold a revision; decoding each
//! of 250,000 endpoints into objects is what one client may choose to do,
//! and `--decode` does it (prost, every service) for the CPU it costs.
//! Like the floor's readers (xtask's fanout_floor), clients keep none of
//! the bytes, so 100 of them fit in memory at 50k services.
//!
//! Prints `ready R B` once every client holds revision R (the first
//! frame), B the bytes that frame took on the wire (gRPC message prefixes
//! included), then `all R T` each time the revision every client holds
//! rises to R, with T the Unix time (seconds) the last of them finished
//! reading it.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use bytes::{Buf, Bytes};
use ebpf_kube_proxy::grpc_unix::MAX_MESSAGE_BYTES;
use ebpf_kube_proxy::localnet::client::{self, Target};
use prost::encoding::{decode_key, decode_varint, WireType};
use prost::Message;
use proto::localnet::v1 as pb;
use tokio_stream::StreamExt;
use tonic::codec::{Codec, DecodeBuf, Decoder};

struct Args {
    target: Target,
    clients: usize,
    deltas: bool,
    decode: bool,
}

fn parse_args() -> Result<Args> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut target, mut clients, mut deltas, mut decode) = (None, 100usize, false, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().context("flag needs a value");
        match a.as_str() {
            "--target" => {
                target = Some(
                    value()?
                        .parse()
                        .map_err(|e| anyhow::anyhow!("--target: {e}"))?,
                )
            }
            "--clients" => clients = value()?.parse().context("--clients")?,
            "--deltas" => deltas = true,
            "--decode" => decode = true,
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(Args {
        target: target.context("--target is required")?,
        clients,
        deltas,
        decode,
    })
}

/// A gRPC message's length prefix.
const GRPC_PREFIX: usize = 5;

/// A `WatchEvent` read as far as holding a frame needs.
enum Event {
    Begin(pb::StateBegin),
    /// A service's `ServiceEndpoints` bytes, not decoded.
    Service(Bytes),
    End,
    Removed,
}

impl Event {
    /// Reads the event's one field: its number says the kind.
    fn read(mut msg: Bytes) -> Result<Event, String> {
        let whole = msg.len();
        let (field, wire) = decode_key(&mut msg).map_err(|e| e.to_string())?;
        let len = decode_varint(&mut msg).map_err(|e| e.to_string())? as usize;
        if wire != WireType::LengthDelimited || len != msg.len() {
            return Err(format!(
                "a WatchEvent of {whole} bytes is not one field: field {field} of {len} bytes"
            ));
        }
        Ok(match field {
            1 => Event::Begin(pb::StateBegin::decode(msg).map_err(|e| e.to_string())?),
            2 => Event::Service(msg),
            3 => Event::End,
            4 => Event::Removed,
            other => return Err(format!("unknown WatchEvent field {other}")),
        })
    }
}

/// Encodes the request with prost, reads answers as [`Event`]s.
struct EventCodec;

impl Codec for EventCodec {
    type Encode = pb::WatchRequest;
    /// The message's length and what it is.
    type Decode = (usize, Event);
    type Encoder = tonic_prost::ProstEncoder<pb::WatchRequest>;
    type Decoder = EventDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        EventDecoder
    }
}

struct EventDecoder;

impl Decoder for EventDecoder {
    type Item = (usize, Event);
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, tonic::Status> {
        // A slice of the received buffer, not a copy.
        let msg = src.copy_to_bytes(src.remaining());
        let len = msg.len();
        Event::read(msg)
            .map(|e| Some((len, e)))
            .map_err(|e| tonic::Status::internal(format!("decoding a WatchEvent: {e}")))
    }
}

/// One watcher: sends `(index, rev, bytes)` after each complete frame.
async fn watcher(
    index: usize,
    args: std::sync::Arc<Args>,
    done: tokio::sync::mpsc::UnboundedSender<(usize, u64, usize)>,
) -> Result<()> {
    let channel = client::channel(&args.target).await?;
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
    grpc.ready().await.context("connecting")?;
    let request = pb::WatchRequest {
        instance_id: 0,
        rev: 0,
        deltas: args.deltas,
    };
    let path = "/localnet.v1.Endpoints/Watch".parse().expect("a path");
    let mut stream = grpc
        .server_streaming(tonic::Request::new(request), path, EventCodec)
        .await?
        .into_inner();
    let (mut rev, mut bytes) = (0, 0);
    // The frame being read: its begin and the events so far.
    let mut begin: Option<pb::StateBegin> = None;
    let mut events = 0u64;
    while let Some(event) = stream.next().await {
        let (len, event) = event?;
        bytes += GRPC_PREFIX + len;
        match event {
            Event::Begin(b) => {
                if begin.is_some() {
                    bail!("watcher {index}: a frame began inside a frame");
                }
                if b.base_rev != 0 && b.base_rev != rev {
                    bail!(
                        "watcher {index}: a delta on {} while holding {rev}",
                        b.base_rev
                    );
                }
                bytes = GRPC_PREFIX + len;
                begin = Some(b);
                events = 0;
            }
            Event::Service(s) => {
                events += 1;
                if args.decode {
                    pb::ServiceEndpoints::decode(s).context("decoding a service")?;
                }
            }
            Event::Removed => events += 1,
            Event::End => {
                let b = begin.take().context("an end without a begin")?;
                let announced = u64::from(b.service_count) + u64::from(b.removed_count);
                if events != announced {
                    bail!("watcher {index}: revision {} announced {announced} events, carried {events}", b.rev);
                }
                rev = b.rev;
                // The frame is held (the bench keeps none of it).
                if done.send((index, rev, bytes)).is_err() {
                    return Ok(());
                }
            }
        }
    }
    bail!("watcher {index}: the stream ended")
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = std::sync::Arc::new(parse_args()?);
    let clients = args.clients;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..clients {
        let (args, tx) = (args.clone(), tx.clone());
        tasks.spawn(async move { watcher(i, args, tx).await });
    }
    drop(tx);
    let mut held = vec![0u64; clients];
    let mut reported = 0u64;
    loop {
        tokio::select! {
            Some((i, rev, bytes)) = rx.recv() => {
                held[i] = rev;
                let min = held.iter().copied().min().unwrap_or(0);
                if min > reported {
                    if reported == 0 {
                        println!("ready {min} {bytes}");
                    } else {
                        println!("all {min} {:.6}", now());
                    }
                    reported = min;
                }
            }
            Some(joined) = tasks.join_next() => {
                joined.context("a watcher panicked")??;
            }
            else => bail!("every watcher ended"),
        }
    }
}
