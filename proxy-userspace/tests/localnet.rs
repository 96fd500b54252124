//! The localnet `Endpoints` API of the real daemon over real TCP and unix
//! sockets (SPEC §6), fed by the file source.

mod common;

use std::time::{Duration, Instant};

use common::{service, slice, write_atomic, Daemon, BIN};
use ebpf_kube_proxy::localnet::client::{self, State};
use prost::Message;
use proto::localnet::v1 as pb;
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
    let mut stream = c
        .watch(pb::WatchRequest {
            instance_id: 0,
            rev: 0,
        })
        .await
        .unwrap()
        .into_inner();
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
