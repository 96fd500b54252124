//! Never partial: before the source has synced, the localnet server returns
//! nothing (SPEC §6.1). The source is held back by driving the snapshot
//! channel directly; the server runs over a real TCP socket.

use std::sync::Arc;
use std::time::Duration;

use ebpf_kube_proxy::localnet::client::{self, Target};
use ebpf_kube_proxy::localnet::server::{Listeners, LocalnetService};
use ebpf_kube_proxy::model::{compute, ClusterState, NodeContext};
use ebpf_kube_proxy::snapshot::{snapshot_channel, Snapshot};
use proto::localnet::v1 as pb;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_returned_before_the_source_has_synced() {
    let (tx, rx) = snapshot_channel();
    let shutdown = CancellationToken::new();
    let listeners = Listeners::bind(Some("127.0.0.1:0".parse().unwrap()), None)
        .await
        .unwrap();
    let addr = listeners.tcp_addr().unwrap();
    let service = LocalnetService::new(7, rx, shutdown.clone()).await;
    let server = tokio::spawn(listeners.serve(
        service,
        ebpf_kube_proxy::grpc_unix::limits::GrpcLimits::default(),
        shutdown.clone(),
    ));

    let mut c = client::connect(&Target::Tcp(addr.to_string()))
        .await
        .unwrap();
    let mut req = tonic::Request::new(pb::NextFilter {
        instance_id: 0,
        rev: 0,
    });
    req.set_timeout(Duration::from_millis(700));
    let err = c.next(req).await.expect_err("no state before sync");
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err}");

    // Watch waits for the first state too: no response, no frame.
    let mut wc = c.clone();
    let watch = tokio::time::timeout(Duration::from_millis(500), async move {
        let mut stream = wc
            .watch(pb::WatchRequest {
                instance_id: 0,
                rev: 0,
                deltas: false,
            })
            .await?
            .into_inner();
        stream.next().await.transpose()
    })
    .await;
    assert!(watch.is_err(), "watch must not send before sync: {watch:?}");

    // The source syncs: rev 1 is served.
    let waiter = tokio::spawn({
        let mut c = c.clone();
        async move { client::next(&mut c, 0, 0).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished());
    let state = compute(&ClusterState::default(), &NodeContext::default());
    tx.send_replace(Arc::new(Snapshot {
        rev: 1,
        state: Arc::new(state),
        changed: None,
    }));
    let got = tokio::time::timeout(Duration::from_secs(1), waiter)
        .await
        .expect("served once synced")
        .unwrap()
        .unwrap();
    assert_eq!((got.instance_id, got.rev), (7, 1));

    shutdown.cancel();
    server.await.unwrap().unwrap();
}
