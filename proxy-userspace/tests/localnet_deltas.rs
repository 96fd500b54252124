//! The delta `Watch` extension (WatchRequest.deltas, described in
//! proto/localnet/v1/localnet.proto) on the real daemon over TCP and the
//! unix socket: delta clients rebuild every state `Next` returns, clients
//! that did not ask keep getting full frames from the same server, and
//! `localnet watch --deltas` prints what `localnet watch` prints.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{service, slice, write_atomic, Daemon, BIN};
use ebpf_kube_proxy::localnet::client::{self, State, Watched};
use proto::localnet::v1 as pb;
use tokio_stream::StreamExt;

fn web(ips: &[&str]) -> String {
    format!(
        "{}---\n{}",
        service("prod", "web", "10.96.0.10"),
        slice("prod", "web", ips)
    )
}

fn api() -> String {
    format!(
        "{}---\n{}",
        service("default", "api", "10.96.0.11"),
        slice("default", "api", &["10.244.1.1"])
    )
}

/// Long-polls `Next` until the state satisfies `done` (10 s at most).
async fn next_until(d: &Daemon, done: impl Fn(&State) -> bool) -> State {
    let mut c = d.tcp().await;
    let mut s = client::next(&mut c, 0, 0).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done(&s) {
        let left = deadline.saturating_duration_since(Instant::now());
        s = tokio::time::timeout(left, client::next(&mut c, s.instance_id, s.rev))
            .await
            .unwrap_or_else(|_| panic!("state never as expected: {s:?}\n{}", d.log_text()))
            .unwrap();
    }
    s
}

fn names(s: &State) -> Vec<String> {
    s.services
        .iter()
        .map(|s| {
            let svc = s.service.as_ref().unwrap();
            format!("{}/{}", svc.namespace, svc.name)
        })
        .collect()
}

fn has_ip(s: &State, ip: &str) -> bool {
    s.services
        .iter()
        .flat_map(|s| &s.endpoints)
        .any(|e| e.ip == ip)
}

/// A stream that asked for deltas and what it has rebuilt.
struct DeltaWatcher {
    stream: tonic::Streaming<pb::WatchEvent>,
    held: Watched,
    frames: Vec<pb::StateBegin>,
}

impl DeltaWatcher {
    async fn open(
        c: &mut proto::localnet::v1::endpoints_client::EndpointsClient<tonic::transport::Channel>,
        from: &Watched,
    ) -> Self {
        let stream = client::watch(c, from.instance_id, from.rev, true)
            .await
            .unwrap();
        DeltaWatcher {
            stream,
            held: from.clone(),
            frames: Vec::new(),
        }
    }

    /// Reads frames until it holds `want`'s revision; checks the state.
    async fn catch_up(&mut self, want: &State) {
        while self.held.rev != want.rev {
            let begin = tokio::time::timeout(
                Duration::from_secs(10),
                self.held.read_frame(&mut self.stream),
            )
            .await
            .expect("a frame within 10 s")
            .expect("the frame applies")
            .expect("stream open");
            assert!(begin.rev <= want.rev, "overshot: {begin:?}");
            self.frames.push(begin);
        }
        assert_eq!(self.held.state(), *want, "rebuilt state differs from Next");
    }
}

/// An old-style stream: every frame must be full.
struct FullWatcher {
    stream: tonic::Streaming<pb::WatchEvent>,
    rev: u64,
    services: Vec<pb::ServiceEndpoints>,
}

impl FullWatcher {
    async fn catch_up(&mut self, want: &State) {
        use pb::watch_event::Event;
        while self.rev != want.rev {
            let mut next = async || {
                tokio::time::timeout(Duration::from_secs(10), self.stream.next())
                    .await
                    .expect("an event within 10 s")
                    .expect("stream open")
                    .expect("event ok")
                    .event
                    .expect("event set")
            };
            let Event::Begin(begin) = next().await else {
                panic!("a frame starts with begin")
            };
            assert_eq!(
                (begin.base_rev, begin.removed_count),
                (0, 0),
                "a client that did not ask got a delta: {begin:?}"
            );
            let mut services = Vec::new();
            loop {
                match next().await {
                    Event::Service(s) => services.push(s),
                    Event::End(_) => break,
                    other => panic!("unexpected event in a full frame: {other:?}"),
                }
            }
            assert_eq!(services.len(), begin.service_count as usize);
            self.rev = begin.rev;
            self.services = services;
        }
        assert_eq!(self.services, want.services);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_watchers_rebuild_every_state_and_other_watchers_get_full_frames() {
    let d = Daemon::start(&[("a.yaml", &web(&["10.244.2.1"])), ("b.yaml", &api())]);
    let first = next_until(&d, |s| s.services.len() == 2 && has_ip(s, "10.244.1.1")).await;
    let (mut tcp, mut unix) = (d.tcp().await, d.unix().await);
    let none = Watched::default();
    let mut deltas = vec![
        DeltaWatcher::open(&mut tcp, &none).await,
        DeltaWatcher::open(&mut unix, &none).await,
    ];
    let mut fulls = Vec::new();
    for c in [&mut tcp, &mut unix] {
        fulls.push(FullWatcher {
            stream: common::watch_all(c).await,
            rev: 0,
            services: Vec::new(),
        });
    }
    // A delta watcher that reads only at the end of the run.
    let mut slow = DeltaWatcher::open(&mut d.unix().await, &none).await;
    slow.catch_up(&first).await;
    for w in &mut deltas {
        w.catch_up(&first).await;
        assert_eq!(w.frames[0].base_rev, 0, "the first frame is full");
        assert_eq!(w.frames[0].service_count, 2);
    }
    for w in &mut fulls {
        w.catch_up(&first).await;
    }

    type Change = (&'static str, Option<String>, fn(&State) -> bool);
    let changes: [Change; 3] = [
        ("a.yaml", Some(web(&["10.244.2.1", "10.244.2.2"])), |s| {
            has_ip(s, "10.244.2.2")
        }),
        (
            "c.yaml",
            Some(format!(
                "{}---\n{}",
                service("prod", "db", "10.96.0.12"),
                slice("prod", "db", &["10.244.3.1"])
            )),
            |s| has_ip(s, "10.244.3.1"),
        ),
        ("b.yaml", None, |s| !has_ip(s, "10.244.1.1")),
    ];
    let mut want = first;
    for (file, content, done) in changes {
        match content {
            Some(c) => write_atomic(&d.manifest(file), &c),
            None => std::fs::remove_file(d.manifest(file)).unwrap(),
        }
        want = next_until(&d, done).await;
        for w in &mut deltas {
            w.catch_up(&want).await;
        }
        for w in &mut fulls {
            w.catch_up(&want).await;
        }
    }
    assert_eq!(names(&want), ["prod/db", "prod/web"]);
    for w in &deltas {
        // After the first, every frame is a delta on the one before it,
        // naming only what changed: one service per change here.
        for pair in w.frames.windows(2) {
            assert_eq!(pair[1].base_rev, pair[0].rev, "{:?}", w.frames);
            assert!(
                pair[1].service_count + pair[1].removed_count <= 1,
                "more than the change: {:?}",
                w.frames
            );
        }
        assert!(
            w.frames.iter().any(|f| f.removed_count == 1),
            "the removal was never sent: {:?}",
            w.frames
        );
    }
    slow.catch_up(&want).await;
    assert_eq!(slow.frames[1].base_rev, slow.frames[0].rev);

    // A delta client resuming at the current revision gets no full frame:
    // its first frame is the delta of the next change.
    let mut resumed = DeltaWatcher::open(&mut d.tcp().await, &deltas[0].held).await;
    write_atomic(&d.manifest("a.yaml"), &web(&["10.244.2.3"]));
    want = next_until(&d, |s| has_ip(s, "10.244.2.3")).await;
    resumed.catch_up(&want).await;
    assert_eq!(resumed.frames[0].base_rev, deltas[0].held.rev);
    assert_eq!(resumed.frames[0].service_count, 1, "{:?}", resumed.frames);
}

/// `localnet watch --deltas` prints each state exactly as `localnet watch
/// --once` prints it at that revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn localnet_watch_deltas_prints_what_next_gives() {
    let d = Daemon::start(&[("a.yaml", &web(&["10.244.2.1"])), ("b.yaml", &api())]);
    next_until(&d, |s| s.services.len() == 2 && has_ip(s, "10.244.1.1")).await;
    let target = format!("unix:{}", d.socket.display());
    let once = |extra: &[&str]| {
        let out = Command::new(BIN)
            .args(["localnet", "watch", "--once", "--target", &target])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(once(&["--deltas"]), once(&[]));

    let mut child = Command::new(BIN)
        .args(["localnet", "watch", "--deltas", "--target", &target])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Each state is printed whole with one write; read until `until` is
    // in the output (10 s at most).
    let mut printed = String::new();
    let mut read_until = |until: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !printed.contains(until) {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    printed.push_str(&line);
                    printed.push('\n');
                }
                Err(_) => break,
            }
        }
        printed.clone()
    };
    let first = once(&[]);
    assert!(
        read_until(&first).contains(&first),
        "the first state is not printed as `--once` prints it"
    );
    write_atomic(&d.manifest("a.yaml"), &web(&["10.244.2.1", "10.244.2.9"]));
    std::fs::remove_file(d.manifest("b.yaml")).unwrap();
    let want = next_until(&d, |s| has_ip(s, "10.244.2.9") && s.services.len() == 1).await;
    let expected = once(&[]);
    assert!(
        expected.contains(&format!("rev={} ", want.rev)),
        "{expected}"
    );
    let printed = read_until(&expected);
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        printed.contains(&expected),
        "no printed state equals `localnet watch --once` at rev {}:\nwant:\n{expected}\ngot:\n{printed}",
        want.rev
    );
}
