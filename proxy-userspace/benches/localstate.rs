//! `cargo xtask bench`: compute() and full-state publishing at 10k services
//! / 100k endpoints, each printed with a ratio against a baseline measured
//! in the same run on the same data:
//!
//! * compute() vs. cloning its input (one pass over the same memory);
//! * a full `Next` over the unix socket vs. prost-encoding and decoding the
//!   same messages in memory (what any gRPC transfer must at least do).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ebpf_kube_proxy::localnet::client::{self, Target};
use ebpf_kube_proxy::localnet::convert;
use ebpf_kube_proxy::localnet::server::{Listeners, LocalnetService};
use ebpf_kube_proxy::model::*;
use ebpf_kube_proxy::snapshot::{snapshot_channel, Snapshot};
use prost::Message;
use tokio_util::sync::CancellationToken;

use common::{cluster, median, report, ENDPOINTS_PER_SERVICE, RUNS, SERVICES};

fn main() {
    let cluster = cluster();
    let node = common::node();
    println!(
        "{SERVICES} services, {} endpoints, median of {RUNS} runs",
        SERVICES * ENDPOINTS_PER_SERVICE
    );

    let clone = median(|| cluster.clone());
    let compute_time = median(|| compute(&cluster, &node));
    report(
        "compute()",
        compute_time,
        "clone of the input",
        clone,
        Duration::from_millis(200),
    );

    let state = Arc::new(compute(&cluster, &node));
    let messages: Vec<_> = state
        .services
        .iter()
        .map(|s| convert::service_endpoints(s))
        .collect();
    let encode_decode = median(|| {
        messages
            .iter()
            .map(|m| {
                let bytes = m.encode_to_vec();
                proto::localnet::v1::ServiceEndpoints::decode(bytes.as_slice()).map(|_| bytes.len())
            })
            .sum::<Result<usize, _>>()
    });

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let publish = rt.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("localnet.sock");
        let (tx, rx) = snapshot_channel();
        let shutdown = CancellationToken::new();
        let listeners = Listeners::bind(None, Some(&socket)).await.expect("bind");
        let service = LocalnetService::new(1, rx, shutdown.clone()).await;
        let server = tokio::spawn(listeners.serve(
            service,
            ebpf_kube_proxy::grpc_unix::limits::GrpcLimits::default(),
            shutdown.clone(),
        ));
        tx.send_replace(Arc::new(Snapshot {
            rev: 1,
            state: state.clone(),
            changed: None,
        }));
        let mut c = client::connect(&Target::Unix(socket))
            .await
            .expect("connect");
        // Warm-up: waits for the frame conversion and the connection.
        let first = client::next(&mut c, 0, 0).await.expect("next");
        assert_eq!(first.services.len(), SERVICES);
        let mut times = Vec::new();
        for _ in 0..RUNS {
            let t = Instant::now();
            let s = client::next(&mut c, 0, 0).await.expect("next");
            times.push(t.elapsed());
            assert_eq!(s.services.len(), SERVICES);
        }
        shutdown.cancel();
        let _ = server.await;
        times.sort();
        times[RUNS / 2]
    });
    report(
        "full state to one client (Next over unix)",
        publish,
        "in-memory encode+decode",
        encode_decode,
        Duration::from_millis(200),
    );
}
