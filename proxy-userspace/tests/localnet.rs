//! The localnet `Endpoints` API of the real daemon over real TCP and unix
//! sockets (SPEC §6), fed by the file source.

mod common;

use std::time::{Duration, Instant};

use common::{service, slice, write_atomic, Daemon, BIN};
use ebpf_kube_proxy::localnet::client::{self, State};
use prost::Message;
use proto::localnet::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::StreamExt;

fn names(state: &State) -> Vec<String> {
    state
        .services
        .iter()
        .map(|s| {
            let svc = s.service.as_ref().unwrap();
            format!("{}/{}", svc.namespace, svc.name)
        })
        .collect()
}

fn endpoint_ips(state: &State, name: &str) -> Vec<String> {
    let s = state
        .services
        .iter()
        .find(|s| s.service.as_ref().unwrap().name == name)
        .unwrap_or_else(|| panic!("service {name} missing"));
    s.endpoints.iter().map(|e| e.ip.clone()).collect()
}

fn two_services() -> Vec<(&'static str, String)> {
    vec![
        (
            "a.yaml",
            format!(
                "{}---\n{}",
                service("prod", "web", "10.96.0.10"),
                slice("prod", "web", &["10.244.2.1", "10.244.2.2"])
            ),
        ),
        ("b.yaml", service("default", "api", "10.96.0.11")),
    ]
}

fn start(files: &[(&'static str, String)]) -> Daemon {
    let refs: Vec<(&str, &str)> = files.iter().map(|(n, c)| (*n, c.as_str())).collect();
    Daemon::start(&refs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rev0_returns_the_full_state_in_order_and_the_stream_ends() {
    let mut d = start(&two_services());
    for mut c in [d.tcp().await, d.unix().await] {
        let s = client::next(&mut c, 0, 0).await.unwrap();
        assert_ne!(s.instance_id, 0);
        assert_eq!(s.rev, 1);
        // (namespace, name) order; a service without endpoints is included.
        assert_eq!(names(&s), ["default/api", "prod/web"]);
        assert_eq!(endpoint_ips(&s, "web"), ["10.244.2.1", "10.244.2.2"]);
        assert!(endpoint_ips(&s, "api").is_empty());
    }

    let first = client::next(&mut d.tcp().await, 0, 0).await.unwrap();
    let again = client::next(&mut d.unix().await, 0, 0).await.unwrap();
    assert_eq!(first.instance_id, again.instance_id, "stable within a run");
    // Equal state serialises byte for byte identically.
    let bytes =
        |s: &State| -> Vec<Vec<u8>> { s.services.iter().map(|x| x.encode_to_vec()).collect() };
    assert_eq!(bytes(&first), bytes(&again));

    assert!(d.terminate().success());
    let d2 = Daemon::start_in(tempfile_with(&two_services()), &[]);
    let restarted = client::next(&mut d2.tcp().await, 0, 0).await.unwrap();
    assert_ne!(
        restarted.instance_id, first.instance_id,
        "new instance id per start"
    );
    assert_eq!(bytes(&restarted), bytes(&first));
}

fn tempfile_with(files: &[(&'static str, String)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("manifests")).unwrap();
    for (n, c) in files {
        std::fs::write(dir.path().join("manifests").join(n), c).unwrap();
    }
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn current_rev_waits_and_a_manifest_edit_wakes_it_within_a_second() {
    let d = start(&two_services());
    let mut c = d.tcp().await;
    let s = client::next(&mut c, 0, 0).await.unwrap();

    let waiting = tokio::spawn({
        let mut c = d.unix().await;
        async move { client::next(&mut c, s.instance_id, s.rev).await }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !waiting.is_finished(),
        "a call with the current rev must wait"
    );

    let edited = Instant::now();
    write_atomic(
        &d.manifest("a.yaml"),
        &format!(
            "{}---\n{}",
            service("prod", "web", "10.96.0.10"),
            slice("prod", "web", &["10.244.2.1", "10.244.2.2", "10.244.2.3"])
        ),
    );
    let next = tokio::time::timeout(Duration::from_secs(1), waiting)
        .await
        .expect("new state within 1 s of the edit")
        .unwrap()
        .unwrap();
    assert!(edited.elapsed() < Duration::from_secs(1));
    assert_eq!(next.instance_id, s.instance_id);
    assert_eq!(next.rev, s.rev + 1);
    assert_eq!(
        endpoint_ips(&next, "web"),
        ["10.244.2.1", "10.244.2.2", "10.244.2.3"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_that_does_not_change_the_state_bumps_no_rev() {
    let files = two_services();
    let d = start(&files);
    let mut c = d.tcp().await;
    let s = client::next(&mut c, 0, 0).await.unwrap();

    // Same objects, different bytes: a comment and reordered documents.
    write_atomic(
        &d.manifest("b.yaml"),
        &format!("# a comment\n{}", files[1].1),
    );
    let noop = tokio::time::timeout(
        Duration::from_secs(2),
        client::next(&mut c, s.instance_id, s.rev),
    )
    .await;
    assert!(
        noop.is_err(),
        "no new revision for a no-op edit, got {noop:?}"
    );
    let again = client::next(&mut d.tcp().await, 0, 0).await.unwrap();
    assert_eq!(again.rev, s.rev);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_instance_id_or_older_rev_gets_the_state_at_once() {
    let d = start(&two_services());
    let mut c = d.tcp().await;
    let s = client::next(&mut c, 0, 0).await.unwrap();
    for (instance, rev) in [
        (s.instance_id.wrapping_add(1), s.rev),
        (12345, 1),
        (s.instance_id, s.rev + 7),
    ] {
        let started = Instant::now();
        let got = tokio::time::timeout(
            Duration::from_millis(500),
            client::next(&mut c, instance, rev),
        )
        .await
        .unwrap_or_else(|_| panic!("({instance}, {rev}) must not wait"))
        .unwrap();
        assert_eq!((got.instance_id, got.rev), (s.instance_id, s.rev));
        assert!(started.elapsed() < Duration::from_millis(500));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_waiting_clients_all_receive_the_new_rev() {
    let d = start(&two_services());
    let s = client::next(&mut d.tcp().await, 0, 0).await.unwrap();
    let mut waiters = tokio::task::JoinSet::new();
    for i in 0..100 {
        // Separate connections, half over TCP and half over the unix socket.
        let mut c = if i % 2 == 0 {
            d.tcp().await
        } else {
            d.unix().await
        };
        waiters.spawn(async move { client::next(&mut c, s.instance_id, s.rev).await });
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    write_atomic(
        &d.manifest("c.yaml"),
        &service("default", "new", "10.96.0.12"),
    );
    let mut woken = 0;
    let all = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(r) = waiters.join_next().await {
            let next = r.unwrap().unwrap();
            assert_eq!(next.rev, s.rev + 1);
            assert!(names(&next).contains(&"default/new".to_owned()));
            woken += 1;
        }
    })
    .await;
    assert!(all.is_ok(), "only {woken} of 100 clients woke");
    assert_eq!(woken, 100);
}

async fn next_event(stream: &mut tonic::Streaming<pb::WatchEvent>) -> pb::watch_event::Event {
    tokio::time::timeout(Duration::from_secs(2), stream.next())
        .await
        .expect("watch event within 2 s")
        .expect("stream open")
        .expect("event ok")
        .event
        .expect("event set")
}

/// Reads one frame: begin, n services, end. Returns (rev, service names).
async fn read_frame(stream: &mut tonic::Streaming<pb::WatchEvent>) -> (u64, Vec<String>) {
    use pb::watch_event::Event;
    let Event::Begin(begin) = next_event(stream).await else {
        panic!("a frame starts with begin")
    };
    let mut names = Vec::new();
    for _ in 0..begin.service_count {
        match next_event(stream).await {
            Event::Service(s) => names.push(s.service.unwrap().name),
            other => panic!("expected a service, got {other:?}"),
        }
    }
    assert!(
        matches!(next_event(stream).await, Event::End(_)),
        "a frame ends with end"
    );
    (begin.rev, names)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sends_one_full_frame_per_revision() {
    let d = start(&two_services());
    let mut c = d.unix().await;
    let mut stream = common::watch_all(&mut c).await;
    let (rev, names) = read_frame(&mut stream).await;
    assert_eq!(
        (rev, names.clone()),
        (1, vec!["api".to_owned(), "web".to_owned()])
    );

    write_atomic(
        &d.manifest("c.yaml"),
        &service("default", "new", "10.96.0.12"),
    );
    let (rev, names) = read_frame(&mut stream).await;
    assert_eq!(rev, 2);
    assert_eq!(names, ["api", "new", "web"]);

    std::fs::remove_file(d.manifest("c.yaml")).unwrap();
    let (rev, names) = read_frame(&mut stream).await;
    assert_eq!((rev, names.len()), (3, 2));

    // A watch that names the current (instance, rev) stays silent until a change.
    let s = client::next(&mut c, 0, 0).await.unwrap();
    let mut resumed = c
        .watch(pb::WatchRequest {
            instance_id: s.instance_id,
            rev: s.rev,
            deltas: false,
        })
        .await
        .unwrap()
        .into_inner();
    let silent = tokio::time::timeout(Duration::from_secs(1), resumed.next()).await;
    assert!(
        silent.is_err(),
        "resumed watch must not resend the current state"
    );
    write_atomic(
        &d.manifest("c.yaml"),
        &service("default", "new", "10.96.0.12"),
    );
    assert_eq!(read_frame(&mut resumed).await.0, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_manifest_keeps_the_last_good_state_until_fixed() {
    let files = two_services();
    let d = start(&files);
    let mut c = d.tcp().await;
    let s = client::next(&mut c, 0, 0).await.unwrap();

    write_atomic(
        &d.manifest("a.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: [broken\n",
    );
    write_atomic(
        &d.manifest("b.yaml"),
        &format!("{}---\napiVersion: v1\nkind: Service\nmetadata: {{name: bad}}\nspec: {{clusterIP: 10.96.0.999}}\n", files[1].1),
    );
    let blocked = tokio::time::timeout(
        Duration::from_millis(1500),
        client::next(&mut c, s.instance_id, s.rev),
    )
    .await;
    assert!(blocked.is_err(), "broken files must not change the state");
    let log = d.log_text();
    let a = d.manifest("a.yaml").display().to_string();
    let b = d.manifest("b.yaml").display().to_string();
    assert!(
        log.contains(&format!("{a}: document 0: malformed")),
        "log:\n{log}"
    );
    assert!(
        log.contains(&format!(
            "{b}: document 1: invalid Service bad: spec.clusterIPs[0]"
        )),
        "log:\n{log}"
    );

    // Fixing the file applies it.
    write_atomic(
        &d.manifest("a.yaml"),
        &format!(
            "{}---\n{}",
            service("prod", "web", "10.96.0.10"),
            slice("prod", "web", &["10.244.2.9"])
        ),
    );
    let fixed = tokio::time::timeout(
        Duration::from_secs(1),
        client::next(&mut c, s.instance_id, s.rev),
    )
    .await
    .expect("fixed file applied within 1 s")
    .unwrap();
    assert_eq!(fixed.rev, s.rev + 1);
    assert_eq!(endpoint_ips(&fixed, "web"), ["10.244.2.9"]);
    assert_eq!(
        names(&fixed),
        ["default/api", "prod/web"],
        "b.yaml keeps its last good version"
    );
}

/// `--socket-group`: both sockets belong to that group, mode 0660, never
/// world-accessible.
#[test]
fn sockets_belong_to_the_socket_group_and_no_one_else() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("skipped: chown to another group needs root");
        return;
    }
    let d = Daemon::start_in(tempfile_with(&two_services()), &["--socket-group=4242"]);
    for path in [d.socket.clone(), d.dir.path().join("run/podinfo.sock")] {
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.gid(), 4242, "{}", path.display());
        assert_eq!(
            meta.permissions().mode() & 0o777,
            0o660,
            "{}",
            path.display()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_waiting_calls_and_removes_the_socket() {
    use std::os::unix::fs::PermissionsExt;
    let mut d = start(&two_services());
    let mode = std::fs::metadata(&d.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);

    let mut c = d.tcp().await;
    let s = client::next(&mut c, 0, 0).await.unwrap();
    let waiting = tokio::spawn(async move { client::next(&mut c, s.instance_id, s.rev).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = tokio::task::spawn_blocking(move || {
        let st = d.terminate();
        (st, d)
    })
    .await
    .unwrap();
    assert!(status.0.success(), "clean exit on SIGTERM: {:?}", status.0);
    assert!(!status.1.socket.exists(), "socket removed on shutdown");
    match waiting.await.unwrap() {
        Err(client::ClientError::Status(st)) => {
            assert_eq!(st.code(), tonic::Code::Unavailable, "{st}")
        }
        other => panic!("waiting call must end UNAVAILABLE, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn localnet_watch_once_prints_the_state_in_every_format() {
    let d = start(&two_services());
    let run = |args: &[&str]| {
        let out = std::process::Command::new(BIN).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let target = format!("unix:{}", d.socket.display());
    let text = run(&["localnet", "watch", "--once", "--target", &target]);
    assert!(text.starts_with("# localnet instance="), "{text}");
    assert!(
        text.contains("prod/web ClusterIP 10.96.0.10 [http 80/TCP->8080]"),
        "{text}"
    );
    assert!(
        text.contains("    10.244.2.1 ready node=n2 | http 8080/TCP cluster,internal,external"),
        "{text}"
    );

    let json = run(&[
        "localnet",
        "watch",
        "--once",
        "--target",
        &d.addr.to_string(),
        "-o",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["rev"], "1");
    assert_eq!(v["services"][1]["service"]["name"], "web");
    assert_eq!(v["services"][1]["endpoints"][0]["ip"], "10.244.2.1");

    let yaml = run(&[
        "localnet", "watch", "--once", "--target", &target, "-o", "yaml",
    ]);
    let y: serde_json::Value = ebpf_kube_proxy::yaml::from_str(&yaml).unwrap();
    assert_eq!(y, v);

    let dump = run(&["dump", "--target", &target]);
    assert!(dump.contains("prod/web ClusterIP"), "{dump}");
}

#[test]
fn startup_errors_name_the_cause() {
    let empty = tempfile::tempdir().unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--manifests".into(), "/nonexistent/dir".into()],
            "--manifests /nonexistent/dir",
        ),
        (
            vec!["--manifests".into(), empty.path().display().to_string()],
            "no .yaml, .yml or .json files",
        ),
        (vec!["--proxy-mode".into(), "ipvs".into()], "--proxy-mode"),
        (
            vec![
                "--manifests".into(),
                "/x".into(),
                "--localnet-bind-address".into(),
                "nope".into(),
            ],
            "--localnet-bind-address \"nope\"",
        ),
        (
            vec![
                "--manifests".into(),
                "/x".into(),
                "--cluster-cidr".into(),
                "10.0.0.0/99".into(),
            ],
            "--cluster-cidr",
        ),
        (
            vec![
                "--manifests".into(),
                "/x".into(),
                "--socket-group".into(),
                "no-such-group-here".into(),
            ],
            "--socket-group \"no-such-group-here\": no such group",
        ),
    ];
    for (args, expected) in cases {
        let out = std::process::Command::new(BIN)
            .args([
                "--source",
                "file",
                "--hostname-override",
                "n1",
                "--localnet-socket",
                "",
            ])
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} must fail");
        assert!(
            stderr.contains(expected),
            "{args:?}: expected {expected:?} in:\n{stderr}"
        );
    }
}

/// A cluster of `services` services with `endpoints` endpoints each; the
/// first service's first endpoint is `10.200.0.<variant>`, so each variant
/// is a new revision.
fn big_cluster(services: usize, endpoints: usize, variant: u8) -> String {
    let mut out = String::new();
    for s in 0..services {
        let name = format!("svc-{s}");
        let ip = format!("10.96.{}.{}", s / 250, s % 250 + 1);
        out.push_str(&service("big", &name, &ip));
        out.push_str("---\n");
        let ips: Vec<String> = (0..endpoints)
            .map(|e| match (s, e) {
                (0, 0) => format!("10.200.0.{variant}"),
                _ => format!("10.{}.{}.{}", 100 + s / 250, s % 250, e + 1),
            })
            .collect();
        let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
        out.push_str(&slice("big", &name, &ips));
        out.push_str("---\n");
    }
    out
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Watchers that never read cost a bounded amount each (a few events, not
/// whole states per revision), and do not hold back a watcher that reads:
/// a slow reader is not buffered for; it gets the newest revision when it
/// reads again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_that_never_read_cost_bounded_memory_and_block_no_one() {
    const SERVICES: usize = 400;
    const ENDPOINTS: usize = 25;
    let d = start(&[("big.yaml", big_cluster(SERVICES, ENDPOINTS, 1))]);
    let mut reader = d.tcp().await;
    let first = client::next(&mut reader, 0, 0).await.unwrap();
    assert_eq!(first.services.len(), SERVICES);

    // 20 watchers on their own connections, none of which ever reads.
    let mut stuck = Vec::new();
    for _ in 0..20 {
        let mut c = d.tcp().await;
        let s = common::watch_all(&mut c).await;
        stuck.push((c, s));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(d.pid());
    let mut rev = first.rev;
    for variant in 2..12u8 {
        write_atomic(
            &d.manifest("big.yaml"),
            &big_cluster(SERVICES, ENDPOINTS, variant),
        );
        let next = tokio::time::timeout(
            Duration::from_secs(20),
            client::next(&mut reader, first.instance_id, rev),
        )
        .await
        .expect("a reading client is not held back by stuck watchers")
        .unwrap();
        assert!(next.rev > rev);
        rev = next.rev;
    }
    let after = rss_kib(d.pid());
    let grown_mib = after.saturating_sub(before) / 1024;
    assert!(
        grown_mib < 64,
        "20 stuck watchers over 10 revisions grew the daemon by {grown_mib} MiB ({before} → {after} KiB)"
    );
    // A stuck watcher that reads again gets what its flow-control window
    // already held, then the newest revision: not every one it missed.
    let (_, mut s) = stuck.pop().unwrap();
    let mut revs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while revs.last() != Some(&rev) && Instant::now() < deadline {
        revs.push(read_frame(&mut s).await.0);
    }
    assert_eq!(revs.last(), Some(&rev), "{revs:?}");
    assert!(
        revs.len() < (rev - first.rev + 1) as usize,
        "every missed revision was replayed: {revs:?}"
    );
}

/// Sends the HTTP/2 preface on a raw connection and reads what the server
/// answers: some bytes (its SETTINGS) when it serves the connection, 0 or an
/// error when it closed it.
async fn h2_hello(s: &mut tokio::net::UnixStream) -> std::io::Result<usize> {
    let _ = s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
    let mut buf = [0u8; 64];
    tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .expect("the connection was neither served nor closed within 10 s")
}

/// Reads until the server closes `s`; false if it is still open after 1 s.
async fn closed_within_a_second(s: &mut tokio::net::UnixStream) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// `--grpc-max-connections`: at the cap a new connection closes the oldest
/// one without a call open; only when every connection has a call open is
/// the new one closed, and a slot is free again once a call ends.
///
/// Every step waits for what the daemon did (a raw connection's bytes, the
/// open-call gauge), never for a gRPC channel to reconnect: the test once
/// raced a freed slot against a fresh tonic channel, which, when its first
/// connection was closed, reconnected on its own backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_are_closed_and_slots_come_back() {
    let dir = tempfile_with(&two_services());
    let d = Daemon::start_in(dir, &["--grpc-max-connections=3"]);
    let watching = |n: f64| {
        let text = common::get(d.metrics, "/metrics").text();
        common::metric_value(&text, "ebpf_kube_proxy_localnet_clients{rpc=\"Watch\"}") == Some(n)
    };
    // One idle connection, then two with a call open.
    let mut idle = tokio::net::UnixStream::connect(&d.socket).await.unwrap();
    assert!(
        h2_hello(&mut idle).await.unwrap() > 0,
        "first connection served"
    );
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c = d.unix().await;
        let mut s = common::watch_all(&mut c).await;
        read_frame(&mut s).await;
        held.push((c, s));
    }
    // A fourth takes the idle one's slot; the idle one is closed.
    let started = Instant::now();
    let mut c = d.unix().await;
    let s = client::next(&mut c, 0, 0).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(s.rev, 1);
    assert!(
        closed_within_a_second(&mut idle).await,
        "the idle connection stayed open"
    );
    // Every connection has a call open: a new one is closed as it is
    // accepted (end-of-file or a reset, never the server's SETTINGS).
    let mut s = common::watch_all(&mut c).await;
    read_frame(&mut s).await;
    held.push((c, s));
    let mut refused = tokio::net::UnixStream::connect(&d.socket).await.unwrap();
    let read = h2_hello(&mut refused).await;
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "a fourth connection was served: {read:?}"
    );
    assert!(
        d.log_text().contains("every connection has a call open"),
        "{}",
        d.log_text()
    );
    // A call ends (its connection stays): that connection is idle, and
    // the next new connection takes its slot.
    let (_conn, stream) = held.pop().unwrap();
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !watching(2.0) {
        assert!(Instant::now() < deadline, "the cancelled Watch stayed open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut again = tokio::net::UnixStream::connect(&d.socket).await.unwrap();
    assert!(
        h2_hello(&mut again).await.unwrap() > 0,
        "the freed slot did not come back"
    );
}
