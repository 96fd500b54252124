//! A client that arrives after a revision was published starts from that
//! revision (SPEC §6.2, §6.3): `Next` from the start, `Next` with another
//! instance's id and a fresh `Watch`, over TCP and the unix socket, after
//! small and large updates, with no call open while the update came in.

mod common;

use std::time::Duration;

use common::{service, slice, write_atomic, Daemon};
use ebpf_kube_proxy::localnet::client;
use proto::localnet::v1 as pb;
use test_support::manifests;
use tokio_stream::StreamExt;

/// A Service `big/huge` with `slices` EndpointSlices of `per_slice`
/// endpoints each.
fn huge_service(slices: usize, per_slice: usize) -> String {
    let svc = manifests::Svc::new("big", "huge", "10.96.9.9");
    let mut docs = vec![svc.yaml()];
    for s in 0..slices {
        let endpoints: Vec<manifests::Endpoint> = (0..per_slice)
            .map(|e| {
                let n = s * per_slice + e;
                manifests::Endpoint::ready(&format!("10.50.{}.{}", n / 250, n % 250 + 1), "n2")
            })
            .collect();
        let slice = manifests::slice_yaml(
            &manifests::Svc::new("big", "huge", ""),
            &(s + 1).to_string(),
            false,
            &endpoints,
        );
        docs.push(slice);
    }
    manifests::docs(&docs)
}

fn small(ns: &str, name: &str, ip: &str, backend: &str) -> String {
    format!(
        "{}---\n{}",
        service(ns, name, ip),
        slice(ns, name, &[backend])
    )
}

/// Waits (bounded) until the daemon has published revision `rev`: it
/// logs "new local state rev=N" once the state is published.
async fn wait_published(d: &Daemon, rev: u64) {
    let line = format!("new local state rev={rev} ");
    for _ in 0..600 {
        if d.log_text().contains(&line) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "revision {rev} not published within 30 s:\n{}",
        d.log_text()
    );
}

async fn watch_event(stream: &mut tonic::Streaming<pb::WatchEvent>) -> pb::watch_event::Event {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("watch event within 10 s")
        .expect("stream open")
        .expect("event ok")
        .event
        .expect("event set")
}

/// The first frame of a fresh `Watch`: its revision and service names.
async fn watch_first_frame(
    c: &mut pb::endpoints_client::EndpointsClient<tonic::transport::Channel>,
) -> (u64, Vec<String>) {
    use pb::watch_event::Event;
    let mut stream = common::watch_all(c).await;
    let Event::Begin(begin) = watch_event(&mut stream).await else {
        panic!("a frame starts with begin")
    };
    let mut names = Vec::new();
    for _ in 0..begin.service_count {
        match watch_event(&mut stream).await {
            Event::Service(s) => names.push(s.service.unwrap().name),
            other => panic!("expected a service, got {other:?}"),
        }
    }
    (begin.rev, names)
}

/// Every way a new client can start sees revision `rev` with `services`.
async fn all_start_at(d: &Daemon, instance: u64, rev: u64, services: &[&str], what: &str) {
    let services: Vec<String> = services.iter().map(|s| s.to_string()).collect();
    let within = Duration::from_secs(10);
    for (transport, mut c) in [("tcp", d.tcp().await), ("unix", d.unix().await)] {
        for (ask_instance, ask_rev) in [(0, 0), (instance.wrapping_add(1), rev.saturating_sub(1))] {
            let s = tokio::time::timeout(within, client::next(&mut c, ask_instance, ask_rev))
                .await
                .unwrap_or_else(|_| panic!("{what}: Next over {transport} took over {within:?}"))
                .unwrap();
            let names: Vec<String> = s
                .services
                .iter()
                .map(|x| x.service.as_ref().unwrap().name.clone())
                .collect();
            assert_eq!(
                (s.instance_id, s.rev, names),
                (instance, rev, services.to_vec()),
                "{what}: Next{{{ask_instance}, {ask_rev}}} over {transport} from a new client"
            );
        }
        let (frame_rev, names) = watch_first_frame(&mut c).await;
        assert_eq!(
            (frame_rev, names),
            (rev, services.to_vec()),
            "{what}: a fresh Watch over {transport}"
        );
    }
}

/// Found with four small services published and a 20,000-endpoint
/// service added: the daemon published revision 2, but `Next{0, 0}`
/// answered revision 1 (the last frame encoded while a call was open)
/// until something else happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_clients_start_from_the_published_revision_after_small_and_large_updates() {
    let files = [
        ("a.yaml", small("default", "a", "10.96.0.1", "10.244.1.1")),
        ("b.yaml", small("default", "b", "10.96.0.2", "10.244.1.2")),
        ("c.yaml", small("default", "c", "10.96.0.3", "10.244.1.3")),
        ("d.yaml", small("default", "d", "10.96.0.4", "10.244.1.4")),
    ];
    let refs: Vec<(&str, &str)> = files.iter().map(|(n, c)| (*n, c.as_str())).collect();
    let d = Daemon::start(&refs);
    let first = client::next(&mut d.tcp().await, 0, 0).await.unwrap();
    assert_eq!(first.rev, 1);
    let instance = first.instance_id;
    all_start_at(&d, instance, 1, &["a", "b", "c", "d"], "the first state").await;

    // A large update: one Service with 20 slices of 1,000 endpoints.
    write_atomic(&d.manifest("huge.yaml"), &huge_service(20, 1_000));
    wait_published(&d, 2).await;
    all_start_at(
        &d,
        instance,
        2,
        &["huge", "a", "b", "c", "d"],
        "a large update",
    )
    .await;

    // A small update.
    write_atomic(
        &d.manifest("e.yaml"),
        &small("default", "e", "10.96.0.5", "10.244.1.5"),
    );
    wait_published(&d, 3).await;
    all_start_at(
        &d,
        instance,
        3,
        &["huge", "a", "b", "c", "d", "e"],
        "a small update",
    )
    .await;

    // The large service removed again.
    std::fs::remove_file(d.manifest("huge.yaml")).unwrap();
    wait_published(&d, 4).await;
    all_start_at(
        &d,
        instance,
        4,
        &["a", "b", "c", "d", "e"],
        "a large removal",
    )
    .await;
}
