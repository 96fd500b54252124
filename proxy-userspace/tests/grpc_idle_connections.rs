//! `--grpc-max-connections` does not let idle clients lock others out: at
//! the cap the oldest connection with no call open is closed to make room
//! (localnet over TCP and its unix socket, PodInfo's unix socket).

mod common;

use std::time::{Duration, Instant};

use common::{service, slice, Daemon};
use ebpf_kube_proxy::localnet::client;
use proto::podinfo::v1alpha1 as podinfo;
use tokio::io::AsyncReadExt;

/// More idle connections than the default cap of 256.
const IDLE: usize = 1_000;

fn daemon() -> Daemon {
    let web = format!(
        "{}---\n{}",
        service("prod", "web", "10.96.0.10"),
        slice("prod", "web", &["10.244.2.1"])
    );
    Daemon::start(&[("a.yaml", web.as_str())])
}

/// Whether the server closes `s` within `within` (end-of-file or an
/// error, after whatever it had sent).
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(s: &mut S, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_idle_localnet_connections_do_not_lock_out_a_new_client() {
    let d = daemon();
    let addr = d.addr;
    let socket = d.socket.clone();

    let mut tcp = Vec::new();
    for _ in 0..IDLE {
        tcp.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    let started = Instant::now();
    let next = tokio::time::timeout(Duration::from_secs(1), async {
        client::next(&mut d.tcp().await, 0, 0).await
    })
    .await
    .expect("Next over TCP within 1 s of 1,000 idle connections")
    .unwrap();
    assert_eq!(next.rev, 1);
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(
        closed_within(&mut tcp[0], Duration::from_secs(1)).await,
        "the oldest idle TCP connection is closed"
    );

    let mut unix = Vec::new();
    for _ in 0..IDLE {
        unix.push(tokio::net::UnixStream::connect(&socket).await.unwrap());
    }
    let next = tokio::time::timeout(Duration::from_secs(1), async {
        client::next(&mut d.unix().await, 0, 0).await
    })
    .await
    .expect("Next over the unix socket within 1 s of 1,000 idle connections")
    .unwrap();
    assert_eq!(next.rev, 1);
    assert!(
        closed_within(&mut unix[0], Duration::from_secs(1)).await,
        "the oldest idle unix connection is closed"
    );
    assert!(
        d.log_text()
            .contains("closing the oldest idle connections to make room"),
        "{}",
        d.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_idle_podinfo_connections_do_not_lock_out_a_new_client() {
    let d = daemon();
    let path = d.dir.path().join("run/podinfo.sock");
    let list = |path: std::path::PathBuf| async move {
        let mut c = ebpf_kube_proxy::podinfo::client::connect(&path)
            .await
            .unwrap();
        c.list_pod_conditions(podinfo::ListPodConditionsRequest {})
            .await
    };
    // The socket is there and the API synced (it answers UNAVAILABLE
    // until then).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() || list(path.clone()).await.is_err() {
        assert!(Instant::now() < deadline, "PodInfo not serving within 10 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let mut idle = Vec::new();
    for _ in 0..IDLE {
        idle.push(tokio::net::UnixStream::connect(&path).await.unwrap());
    }
    tokio::time::timeout(Duration::from_secs(1), list(path.clone()))
        .await
        .expect("PodInfo List within 1 s of 1,000 idle connections")
        .unwrap();
    assert!(
        closed_within(&mut idle[0], Duration::from_secs(1)).await,
        "the oldest idle PodInfo connection is closed"
    );
}
