//! `cargo xtask bench`: a new revision reaching 100 localnet watchers at
//! 10k services / 100k endpoints and 50k / 250k, over the unix socket.
//!
//! Three client styles, 100 of each on their own connections: long-polling
//! `Next` calls, `Watch` streams, and `Watch` streams that ask for delta
//! frames (after the first frame, only the changed service). The time is from publishing the
//! snapshot until the last of the 100 has its whole new state. Clients
//! read the messages as bytes without decoding them, so the figure is the
//! server's fan-out and the transport, not 100 decoders on two cores.
//! Each revision changes one service, the others are shared with the
//! previous state as the incremental model shares them. The baseline,
//! measured in the same run on the same state, is converting and
//! prost-encoding the whole state once.

mod common;

use std::marker::PhantomData;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use ebpf_kube_proxy::grpc_unix::limits::GrpcLimits;
use ebpf_kube_proxy::grpc_unix::{self, MAX_MESSAGE_BYTES};
use ebpf_kube_proxy::localnet::convert;
use ebpf_kube_proxy::localnet::server::{Listeners, LocalnetService};
use ebpf_kube_proxy::model::*;
use ebpf_kube_proxy::snapshot::{snapshot_channel, Snapshot, SnapshotSender};
use prost::Message;
use proto::localnet::v1 as pb;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::transport::Channel;

use common::{cluster_of, median, report};

const WATCHERS: usize = 100;
const RUNS: usize = 3;
const TARGET: Duration = Duration::from_millis(500);

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    for (services, per_service) in [(10_000, 10), (50_000, 5)] {
        let state = compute(&cluster_of(services, per_service), &common::node());
        let bytes: usize = state
            .services
            .iter()
            .map(|s| convert::service_endpoints(s).encoded_len())
            .sum();
        println!(
            "\n{services} services, {} endpoints ({:.1} MiB per revision), {WATCHERS} watchers, median of {RUNS} runs",
            services * per_service,
            bytes as f64 / (1 << 20) as f64
        );
        let encode_once = median(|| {
            state
                .services
                .iter()
                .map(|s| convert::service_endpoints(s).encode_to_vec().len())
                .sum::<usize>()
        });
        let (next, watch, delta) = rt.block_on(fan_out(state));
        report(
            "new rev to 100 Next long-polls",
            next,
            "encoding the state once",
            encode_once,
            TARGET,
        );
        report(
            "new rev to 100 Watch streams",
            watch,
            "encoding the state once",
            encode_once,
            TARGET,
        );
        report(
            "new rev to 100 delta Watch streams",
            delta,
            "encoding the state once",
            encode_once,
            TARGET,
        );
    }
}

/// (Next, Watch, delta Watch) medians of `RUNS` revisions each.
async fn fan_out(state: LocalState) -> (Duration, Duration, Duration) {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("localnet.sock");
    let (tx, rx) = snapshot_channel();
    let shutdown = CancellationToken::new();
    let listeners = Listeners::bind(None, Some(&socket)).await.expect("bind");
    let service = LocalnetService::new(1, rx, shutdown.clone()).await;
    let server = tokio::spawn(listeners.serve(service, GrpcLimits::default(), shutdown.clone()));
    let mut rev = 1;
    publish(&tx, rev, &state);
    let channels = connect_all(&socket).await;
    // Warm-up: the first frame is converted and every connection is up.
    let mut warm = next_all(&channels, 0);
    while let Some(r) = warm.join_next().await {
        r.expect("join");
    }

    let mut next_times = Vec::new();
    for _ in 0..RUNS {
        let mut waiters = next_all(&channels, rev);
        // The calls are parked on the server before the revision comes.
        tokio::time::sleep(Duration::from_millis(300)).await;
        rev += 1;
        let start = Instant::now();
        publish(&tx, rev, &state);
        while let Some(r) = waiters.join_next().await {
            assert_eq!(r.expect("join"), rev);
        }
        next_times.push(start.elapsed());
    }

    let mut watch_times = Vec::new();
    let mut delta_times = Vec::new();
    for (deltas, times) in [(false, &mut watch_times), (true, &mut delta_times)] {
        let mut streams = Vec::new();
        for c in &channels {
            let mut s = call(
                c.clone(),
                "Watch",
                pb::WatchRequest {
                    instance_id: 0,
                    rev: 0,
                    deltas,
                },
            )
            .await;
            assert_eq!(read_watch_frame(&mut s).await, (rev, 0));
            streams.push(s);
        }
        for _ in 0..RUNS {
            rev += 1;
            let start = Instant::now();
            publish(&tx, rev, &state);
            let mut readers = JoinSet::new();
            for mut s in streams.drain(..) {
                readers.spawn(async move { (read_watch_frame(&mut s).await, s) });
            }
            while let Some(r) = readers.join_next().await {
                let (got, s) = r.expect("join");
                // A delta frame is on the revision before it.
                assert_eq!(got, (rev, if deltas { rev - 1 } else { 0 }));
                streams.push(s);
            }
            times.push(start.elapsed());
        }
    }
    shutdown.cancel();
    let _ = server.await;
    for t in [&mut next_times, &mut watch_times, &mut delta_times] {
        t.sort();
    }
    (
        next_times[RUNS / 2],
        watch_times[RUNS / 2],
        delta_times[RUNS / 2],
    )
}

/// Publishes `state` as `rev` with one service changed, as the
/// incremental model does: that service is a new `Arc`, the rest shared.
fn publish(tx: &SnapshotSender, rev: u64, state: &LocalState) {
    let mut next = state.clone();
    let first = Arc::make_mut(&mut next.services[0]);
    first.local_ready_endpoints_v4 = rev as u32;
    let changed = Arc::from([first.service.key.clone()]);
    tx.send_replace(Arc::new(Snapshot {
        rev,
        state: Arc::new(next),
        changed: Some(changed),
    }));
}

async fn connect_all(socket: &Path) -> Vec<Channel> {
    let mut channels = Vec::new();
    for _ in 0..WATCHERS {
        channels.push(grpc_unix::channel(socket).await.expect("connect"));
    }
    channels
}

/// One `Next(1, rev)` per channel; each task returns the rev it received.
fn next_all(channels: &[Channel], rev: u64) -> JoinSet<u64> {
    let mut set = JoinSet::new();
    for c in channels {
        let c = c.clone();
        set.spawn(async move {
            let mut s = call(
                c,
                "Next",
                pb::NextFilter {
                    instance_id: 1,
                    rev,
                },
            )
            .await;
            let head = s.message().await.expect("next").expect("head item");
            let got = match pb::NextItem::decode(head).expect("decode").item {
                Some(pb::next_item::Item::Next(n)) => n.rev,
                other => panic!("first item {other:?}"),
            };
            while s.message().await.expect("item").is_some() {}
            got
        });
    }
    set
}

/// Reads begin, the services and removals (as bytes) and end; returns
/// the rev and the base rev (0: a full frame).
async fn read_watch_frame(s: &mut tonic::Streaming<Bytes>) -> (u64, u64) {
    use pb::watch_event::Event;
    let event = |b: Bytes| pb::WatchEvent::decode(b).expect("decode").event;
    let Some(Event::Begin(begin)) = event(s.message().await.expect("begin").expect("open")) else {
        panic!("a frame starts with begin");
    };
    for _ in 0..begin.service_count + begin.removed_count {
        s.message().await.expect("service").expect("open");
    }
    let end = event(s.message().await.expect("end").expect("open"));
    assert!(matches!(end, Some(Event::End(_))), "{end:?}");
    (begin.rev, begin.base_rev)
}

/// A server-streaming call whose answers stay undecoded bytes.
async fn call<Req: Message + Send + Sync + 'static>(
    channel: Channel,
    method: &'static str,
    request: Req,
) -> tonic::Streaming<Bytes> {
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
    grpc.ready().await.expect("ready");
    let path = format!("/localnet.v1.Endpoints/{method}")
        .parse()
        .expect("path");
    grpc.server_streaming(tonic::Request::new(request), path, RawCodec(PhantomData))
        .await
        .expect("call")
        .into_inner()
}

/// Encodes requests with prost, hands answers back as bytes.
struct RawCodec<Req>(PhantomData<Req>);

impl<Req: Message + Send + 'static> Codec for RawCodec<Req> {
    type Encode = Req;
    type Decode = Bytes;
    type Encoder = tonic_prost::ProstEncoder<Req>;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawDecoder
    }
}

struct RawDecoder;

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
