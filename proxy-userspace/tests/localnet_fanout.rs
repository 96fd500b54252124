//! localnet fan-out: many clients waiting on the real daemon all get the
//! same new revision, whatever way they wait (SPEC §6).

mod common;

use std::time::{Duration, Instant};

use common::{service, slice, write_atomic, Daemon};
use ebpf_kube_proxy::localnet::client::{self, State};
use proto::localnet::v1 as pb;
use tokio_stream::StreamExt;

const SERVICES: usize = 1_000;
const ENDPOINTS: usize = 20;

/// Services per manifest file (a file holds at most 1,024 documents).
const PER_FILE: usize = 250;

/// Manifest file `n` of the cluster: services `n * PER_FILE..` of
/// `ENDPOINTS` endpoints each; the first service's first endpoint is
/// `10.200.0.<variant>`, so each variant of file 0 is a new state.
fn cluster_file(n: usize, variant: u8) -> String {
    let mut out = String::new();
    for s in n * PER_FILE..(n + 1) * PER_FILE {
        let name = format!("svc-{s}");
        out.push_str(&service(
            "fan",
            &name,
            &format!("10.96.{}.{}", s / 250, s % 250 + 1),
        ));
        out.push_str("---\n");
        let ips: Vec<String> = (0..ENDPOINTS)
            .map(|e| match (s, e) {
                (0, 0) => format!("10.200.0.{variant}"),
                _ => format!("10.{}.{}.{}", 100 + s / 250, s % 250, e + 1),
            })
            .collect();
        let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
        out.push_str(&slice("fan", &name, &ips));
        out.push_str("---\n");
    }
    out
}

/// Reads one whole `Watch` frame: (begin, services).
async fn watch_frame(
    stream: &mut tonic::Streaming<pb::WatchEvent>,
) -> (pb::StateBegin, Vec<pb::ServiceEndpoints>) {
    use pb::watch_event::Event;
    let mut next = async || {
        stream
            .next()
            .await
            .expect("stream open")
            .expect("event ok")
            .event
            .expect("event set")
    };
    let Event::Begin(begin) = next().await else {
        panic!("a frame starts with begin")
    };
    let mut services = Vec::new();
    for _ in 0..begin.service_count {
        match next().await {
            Event::Service(s) => services.push(s),
            other => panic!("expected a service, got {other:?}"),
        }
    }
    let end = next().await;
    assert!(
        matches!(end, Event::End(_)),
        "a frame ends with end: {end:?}"
    );
    (begin, services)
}

/// One test at a time: 100 clients and a daemon each already load two
/// cores, and two such runs side by side have lost connections.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The daemon on the whole cluster, and its first state holding it all.
async fn start() -> (Daemon, State) {
    let files: Vec<(String, String)> = (0..SERVICES / PER_FILE)
        .map(|n| (format!("fan-{n}.yaml"), cluster_file(n, 1)))
        .collect();
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(n, c)| (n.as_str(), c.as_str()))
        .collect();
    let d = Daemon::start(&refs);
    let mut c = d.tcp().await;
    let mut first = client::next(&mut c, 0, 0).await.unwrap();
    // The first revision may come before the whole file is read.
    while first.services.len() < SERVICES {
        first = tokio::time::timeout(
            Duration::from_secs(30),
            client::next(&mut c, first.instance_id, first.rev),
        )
        .await
        .unwrap_or_else(|_| panic!("never all {SERVICES} services:\n{}", d.log_text()))
        .unwrap();
    }
    (d, first)
}

/// 50 `Watch` streams and 50 `Next` long polls, each on its own connection
/// (half TCP, half unix), wait on the current revision; one endpoint
/// changes; every one of the 100 gets the new revision, the very state
/// that a fresh `Next` returns (within a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_watchers_get_the_same_new_revision() {
    let _serial = SERIAL.lock().await;
    let (d, first) = start().await;
    let mut waiters = tokio::task::JoinSet::new();
    for i in 0..100 {
        let mut c = if i % 4 < 2 {
            d.tcp().await
        } else {
            d.unix().await
        };
        if i % 2 == 0 {
            let mut stream = common::watch_all(&mut c).await;
            let (begin, _) = watch_frame(&mut stream).await;
            assert_eq!(begin.rev, first.rev);
            waiters.spawn(async move {
                let (begin, services) = watch_frame(&mut stream).await;
                (Instant::now(), begin.instance_id, begin.rev, services)
            });
        } else {
            let (id, rev) = (first.instance_id, first.rev);
            waiters.spawn(async move {
                let State {
                    instance_id,
                    rev,
                    services,
                } = client::next(&mut c, id, rev).await.unwrap();
                (Instant::now(), instance_id, rev, services)
            });
        }
    }
    // Every call is parked on the server before the change.
    tokio::time::sleep(Duration::from_millis(500)).await;

    write_atomic(&d.manifest("fan-0.yaml"), &cluster_file(0, 2));
    let changed = Instant::now();
    let mut received = Vec::new();
    let all = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(r) = waiters.join_next().await {
            received.push(r.unwrap());
        }
    })
    .await;
    assert!(
        all.is_ok(),
        "only {} of 100 watchers got the new revision",
        received.len()
    );

    let now = client::next(&mut d.tcp().await, 0, 0).await.unwrap();
    assert_eq!(
        (now.instance_id, now.rev),
        (first.instance_id, first.rev + 1)
    );
    assert!(
        now.services
            .iter()
            .flat_map(|s| &s.endpoints)
            .any(|e| e.ip == "10.200.0.2"),
        "the change is in the new state"
    );
    let mut last = changed;
    for (at, instance_id, rev, services) in received {
        assert_eq!((instance_id, rev), (now.instance_id, now.rev));
        assert!(
            services == now.services,
            "a watcher got other content than Next returns"
        );
        last = last.max(at);
    }
    // How long it took, for the record: with the daemon and 100 decoding
    // clients in debug builds on two cores this is seconds, so it is not
    // asserted here; `cargo bench --bench localnet_fanout` measures it.
    eprintln!(
        "the last of 100 watchers got the revision {:?} after the change",
        last - changed
    );
}

/// 100 `Watch` streams that ask for deltas (half TCP, half unix) hold the
/// current revision; one endpoint changes; each gets a delta of one
/// service on the revision it holds and rebuilds the very state a fresh
/// `Next` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_delta_watchers_rebuild_the_same_new_revision() {
    let _serial = SERIAL.lock().await;
    let (d, first) = start().await;
    let mut waiters = tokio::task::JoinSet::new();
    for i in 0..100 {
        let mut c = if i % 2 == 0 {
            d.tcp().await
        } else {
            d.unix().await
        };
        let mut stream = client::watch(&mut c, 0, 0, true).await.unwrap();
        let mut held = client::Watched::default();
        let begin = held.read_frame(&mut stream).await.unwrap().unwrap();
        assert_eq!((begin.rev, begin.base_rev), (first.rev, 0));
        assert_eq!(held.state(), first);
        waiters.spawn(async move {
            let begin = held.read_frame(&mut stream).await.unwrap().unwrap();
            (begin, held.state())
        });
    }
    write_atomic(&d.manifest("fan-0.yaml"), &cluster_file(0, 2));
    let mut received = Vec::new();
    let all = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(r) = waiters.join_next().await {
            received.push(r.unwrap());
        }
    })
    .await;
    assert!(
        all.is_ok(),
        "only {} of 100 delta watchers got the new revision",
        received.len()
    );
    let now = client::next(&mut d.tcp().await, 0, 0).await.unwrap();
    assert_eq!(now.rev, first.rev + 1);
    for (begin, state) in received {
        assert_eq!(
            (begin.base_rev, begin.service_count, begin.removed_count),
            (first.rev, 1, 0),
            "a delta of the one changed service"
        );
        assert!(
            state == now,
            "a delta watcher rebuilt another state than Next returns"
        );
    }
}
