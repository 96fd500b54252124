//! The PodInfo API of the real daemon over its real unix socket (SPEC §7),
//! fed by Pod manifests (file source) and by the fake API server (kube
//! source).

mod common;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::fake_apiserver::FakeApiServer;
use common::{get, manifests_dir, pod_yaml, write_atomic, Daemon, BIN};
use ebpf_kube_proxy::podinfo::client::connect;
use proto::podinfo::v1alpha1 as pb;
use proto::podinfo::v1alpha1::pod_info_service_client::PodInfoServiceClient;
use serde_json::{json, Value};
use tonic::transport::Channel;
use tonic::Code;

type Client = PodInfoServiceClient<Channel>;

/// Tests about semantics, not rate limits, get a bucket they cannot empty.
const GENEROUS: &[&str] = &["--podinfo-burst", "1000"];
const HOLD_SOURCE: &str = "EBPF_KUBE_PROXY_TEST_HOLD_SOURCE";

fn socket(d: &Daemon) -> PathBuf {
    d.dir.path().join("run/podinfo.sock")
}

async fn client(d: &Daemon) -> Client {
    client_at(d, &socket(d)).await
}

/// `Daemon` waits for the other listeners only, so wait (bounded) for the
/// PodInfo socket at `path` to be bound too.
async fn client_at(d: &Daemon, path: &Path) -> Client {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match connect(path).await {
            Ok(c) => return c,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("PodInfo socket not listening: {e}; log:\n{}", d.log_text()),
        }
    }
}

fn web(ready: &str) -> String {
    pod_yaml(
        "default",
        "web-0",
        "n1",
        &[
            ("PodScheduled", "True", ""),
            ("Initialized", "True", ""),
            ("ContainersReady", ready, ""),
            ("Ready", ready, "ContainersNotReady"),
        ],
    )
}

/// web-0 and a mirror pod on n1, one pod on n2.
fn three_pods() -> String {
    let mirror = "apiVersion: v1\nkind: Pod\n\
        metadata: {name: etcd-n1, namespace: kube-system, uid: uid-etcd-n1, annotations: {kubernetes.io/config.mirror: abc}}\n\
        spec: {nodeName: n1, containers: []}\nstatus: {conditions: [{type: Ready, status: \"True\"}]}\n";
    format!(
        "{}---\n{mirror}---\n{}",
        web("True"),
        pod_yaml("default", "elsewhere", "n2", &[("Ready", "True", "")])
    )
}

fn names(pods: &[pb::PodInfo]) -> Vec<String> {
    pods.iter()
        .map(|p| format!("{}/{}", p.pod_namespace, p.pod_name))
        .collect()
}

fn condition(pods: &[pb::PodInfo], name: &str, t: &str) -> Option<pb::ConditionStatus> {
    pods.iter()
        .find(|p| p.pod_name == name)?
        .conditions
        .iter()
        .find(|c| c.r#type == t)
        .map(|c| c.status())
}

/// Lists until the daemon has synced (bounded, paced below the refill rate).
async fn wait_synced(c: &mut Client) -> pb::ListPodConditionsResponse {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match c.list_pod_conditions(pb::ListPodConditionsRequest {}).await {
            Ok(r) => return r.into_inner(),
            Err(s) if s.code() == Code::Unavailable && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(s) => panic!("not synced within 10 s: {s}"),
        }
    }
}

async fn next_message(
    stream: &mut tonic::Streaming<pb::WatchPodConditionsResponse>,
    within: Duration,
) -> pb::WatchPodConditionsResponse {
    tokio::time::timeout(within, stream.message())
        .await
        .unwrap_or_else(|_| panic!("no watch message within {within:?}"))
        .expect("stream ok")
        .expect("stream open")
}

async fn open_watch(c: &mut Client) -> tonic::Streaming<pb::WatchPodConditionsResponse> {
    c.watch_pod_conditions(pb::WatchPodConditionsRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// The value of one series on /metrics.
fn metric(d: &Daemon, series: &str) -> f64 {
    let text = get(d.metrics, "/metrics").text();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{series} missing in\n{text}"))
}

fn series(name: &str) -> String {
    format!("{name}{{server_api_version=\"v1alpha1\"}}")
}

/// Runs the binary's `podinfo` subcommand (a separate process).
fn podinfo_cli(args: &[&str]) -> std::process::Output {
    std::process::Command::new(BIN)
        .arg("podinfo")
        .args(args)
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_get_serve_this_nodes_pods_from_manifests() {
    let d = Daemon::start_in(manifests_dir(&[("pods.yaml", &three_pods())]), GENEROUS);
    let mut c = client(&d).await;
    let list = wait_synced(&mut c).await;

    // Sorted by (namespace, name); the pod of n2 is not here.
    assert_eq!(names(&list.pods), ["default/web-0", "kube-system/etcd-n1"]);
    assert_eq!(list.revision, 1);
    let web = &list.pods[0];
    assert_eq!((web.pod_uid.as_str(), web.static_pod), ("uid-web-0", false));
    let types: Vec<&str> = web.conditions.iter().map(|c| c.r#type.as_str()).collect();
    assert_eq!(
        types,
        ["PodScheduled", "Initialized", "ContainersReady", "Ready"],
        "conditions in status order"
    );
    assert_eq!(web.conditions[3].reason, "ContainersNotReady");
    assert_eq!(
        web.conditions[3]
            .last_transition_time
            .as_ref()
            .map(|t| t.seconds),
        Some(1_714_557_600)
    );
    assert_eq!(web.deletion_timestamp, None);
    assert!(list.pods[1].static_pod, "mirror pods are static");

    let get = |uid: &str, ns: &str, name: &str| pb::GetPodConditionsRequest {
        pod_uid: uid.to_owned(),
        pod_namespace: ns.to_owned(),
        pod_name: name.to_owned(),
    };
    let by_uid = c.get_pod_conditions(get("uid-etcd-n1", "", "")).await;
    assert_eq!(
        by_uid.unwrap().into_inner().pod.as_ref(),
        Some(&list.pods[1])
    );
    let by_name = c.get_pod_conditions(get("", "default", "web-0")).await;
    assert_eq!(by_name.unwrap().into_inner().pod.as_ref(), Some(web));

    for (request, code) in [
        (get("", "default", "nope"), Code::NotFound),
        (get("no-such-uid", "", ""), Code::NotFound),
        // Another node's pod is not served.
        (get("", "default", "elsewhere"), Code::NotFound),
        (get("uid-web-0", "kube-system", "etcd-n1"), Code::NotFound),
        (get("", "", ""), Code::InvalidArgument),
        (get("", "default", ""), Code::InvalidArgument),
    ] {
        let err = c.get_pod_conditions(request.clone()).await.unwrap_err();
        assert_eq!(err.code(), code, "{request:?}: {err}");
    }

    let errors_get = metric(&d, &series("pod_info_endpoint_errors_get"));
    assert_eq!(errors_get, 6.0);
    assert_eq!(metric(&d, &series("pod_info_endpoint_requests_get")), 8.0);
    assert!(metric(&d, &series("pod_info_endpoint_requests_list")) >= 1.0);
    assert!(metric(&d, &series("pod_info_endpoint_requests_total")) >= 9.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_prints_list_get_and_watch_as_text_and_json() {
    let d = Daemon::start_in(manifests_dir(&[("pods.yaml", &three_pods())]), GENEROUS);
    wait_synced(&mut client(&d).await).await;
    let sock = socket(&d).display().to_string();
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--target", sock.as_str()]);
        let out = podinfo_cli(&all);
        (
            out.status.success(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };

    let (ok, text, err) = run(&["list"]);
    assert!(ok, "{err}");
    assert_eq!(
        text,
        "# podinfo revision=1 pods=2\n\
         default/web-0 uid=uid-web-0 PodScheduled=True Initialized=True ContainersReady=True Ready=True\n\
         kube-system/etcd-n1 uid=uid-etcd-n1 static Ready=True\n"
    );
    let (ok, json, err) = run(&["list", "-o", "json"]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["revision"], "1");
    assert_eq!(v["pods"][1]["pod_name"], "etcd-n1");
    assert_eq!(v["pods"][1]["static_pod"], true);
    assert_eq!(
        v["pods"][0]["conditions"][3]["status"],
        "CONDITION_STATUS_TRUE"
    );

    let (ok, text, _) = run(&["get", "default/web-0"]);
    assert!(ok);
    assert!(text.starts_with("default/web-0 uid=uid-web-0 "), "{text}");
    let (ok, json, _) = run(&["get", "--uid", "uid-etcd-n1", "-o", "json"]);
    assert!(ok);
    let v: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["pod"]["pod_namespace"], "kube-system");
    let (ok, _, err) = run(&["get", "default/nope"]);
    assert!(!ok);
    assert!(
        err.contains("NotFound: no pod default/nope on this node"),
        "{err}"
    );

    // watch: the list now, then again after an edit.
    let mut child = std::process::Command::new(BIN)
        .args(["podinfo", "watch", "--socket", &sock])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                return;
            }
        }
    });
    let wait_line = |prefix: &str| loop {
        let line = lines
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("no line starting {prefix:?} within 5 s"));
        if line.starts_with(prefix) {
            return line;
        }
    };
    wait_line("# podinfo revision=1 pods=2");
    write_atomic(&d.manifest("pods.yaml"), &web("False"));
    wait_line("# podinfo revision=2 pods=1");
    let line = wait_line("default/web-0");
    assert!(line.ends_with("Ready=False(ContainersNotReady)"), "{line}");
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_edit_reaches_watchers_within_a_second() {
    let d = Daemon::start_in(manifests_dir(&[("pods.yaml", &three_pods())]), GENEROUS);
    let mut c = client(&d).await;
    wait_synced(&mut c).await;
    let mut stream = open_watch(&mut c).await;
    let first = next_message(&mut stream, Duration::from_secs(2)).await;
    assert_eq!(names(&first.pods), ["default/web-0", "kube-system/etcd-n1"]);

    // Ready flips; the mirror pod's document goes away.
    let edited = Instant::now();
    write_atomic(
        &d.manifest("pods.yaml"),
        &format!(
            "{}---\n{}",
            web("False"),
            pod_yaml("default", "elsewhere", "n2", &[])
        ),
    );
    let next = next_message(&mut stream, Duration::from_secs(1)).await;
    assert!(edited.elapsed() < Duration::from_secs(1));
    assert!(next.revision > first.revision);
    assert_eq!(names(&next.pods), ["default/web-0"]);
    assert_eq!(
        condition(&next.pods, "web-0", "Ready"),
        Some(pb::ConditionStatus::False)
    );
}

fn api_pod(name: &str, ready: bool, labels: Value) -> Value {
    let status = if ready { "True" } else { "False" };
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default", "labels": labels},
           "spec": {"nodeName": "n1", "containers": []},
           "status": {"conditions": [
               {"type": "PodScheduled", "status": "True"},
               {"type": "Ready", "status": status, "lastTransitionTime": "2024-05-01T10:00:00Z"}]}})
}

async fn start_kube(api: &FakeApiServer, extra: &[&str]) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    Daemon::start_kube(dir, &kubeconfig, extra)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_pods_from_the_api_server_and_ignores_other_changes() {
    let api = FakeApiServer::start().await;
    api.apply(api_pod("a", true, json!({"app": "x"})));
    api.apply(api_pod("b", true, json!({"app": "x"})));
    let mut other_node = api_pod("c", true, json!({}));
    other_node["spec"]["nodeName"] = json!("n2");
    api.apply(other_node);
    let d = start_kube(&api, GENEROUS).await;
    let mut c = client(&d).await;
    wait_synced(&mut c).await;
    let mut stream = open_watch(&mut c).await;
    let first = next_message(&mut stream, Duration::from_secs(2)).await;
    assert_eq!(names(&first.pods), ["default/a", "default/b"]);
    assert_eq!(first.pods[0].pod_uid, "uid-default-a");

    // Ready flips: a new full list within a second, higher revision.
    let changed = Instant::now();
    api.apply(api_pod("a", false, json!({"app": "x"})));
    let flipped = next_message(&mut stream, Duration::from_secs(1)).await;
    assert!(changed.elapsed() < Duration::from_secs(1));
    assert!(flipped.revision > first.revision);
    assert_eq!(
        condition(&flipped.pods, "a", "Ready"),
        Some(pb::ConditionStatus::False)
    );
    assert_eq!(names(&flipped.pods), ["default/a", "default/b"]);

    // A label-only change and a change on another node emit nothing.
    api.apply(api_pod("a", false, json!({"app": "y"})));
    let mut other_node = api_pod("c", false, json!({}));
    other_node["spec"]["nodeName"] = json!("n2");
    api.apply(other_node);
    let silent = tokio::time::timeout(Duration::from_millis(1500), stream.message()).await;
    assert!(
        silent.is_err(),
        "no message for a label-only change: {silent:?}"
    );

    // Graceful deletion sets the deletion timestamp, then the pod goes.
    let mut deleting = api_pod("b", true, json!({"app": "x"}));
    deleting["metadata"]["deletionTimestamp"] = json!("2024-05-01T11:00:00Z");
    api.apply(deleting);
    let terminating = next_message(&mut stream, Duration::from_secs(1)).await;
    assert_eq!(
        terminating.pods[1]
            .deletion_timestamp
            .as_ref()
            .map(|t| t.seconds),
        Some(1_714_561_200)
    );
    api.delete("Pod", "default", "b");
    let deleted = next_message(&mut stream, Duration::from_secs(1)).await;
    assert!(deleted.revision > terminating.revision);
    assert_eq!(names(&deleted.pods), ["default/a"]);
    let list = c
        .list_pod_conditions(pb::ListPodConditionsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (names(&list.pods), list.revision),
        (names(&deleted.pods), deleted.revision)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_is_unavailable_until_the_source_has_synced() {
    let dir = manifests_dir(&[("pods.yaml", &three_pods())]);
    let hold = dir.path().join("hold-source");
    std::fs::write(&hold, "").unwrap();
    let d = Daemon::start_in_env(dir, GENEROUS, &[(HOLD_SOURCE, hold.as_os_str())]);
    let mut c = client(&d).await;
    let list = c.list_pod_conditions(pb::ListPodConditionsRequest {}).await;
    let get = c
        .get_pod_conditions(pb::GetPodConditionsRequest {
            pod_uid: "uid-web-0".to_owned(),
            ..Default::default()
        })
        .await;
    let watch = c
        .watch_pod_conditions(pb::WatchPodConditionsRequest {})
        .await;
    for status in [list.unwrap_err(), get.unwrap_err(), watch.err().unwrap()] {
        assert_eq!(
            (status.code(), status.message()),
            (Code::Unavailable, "pod information not synced yet")
        );
    }
    let out = podinfo_cli(&["list", "--socket", socket(&d).to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("pod information not synced yet"));
    assert_eq!(metric(&d, &series("pod_info_endpoint_errors_watch")), 1.0);

    std::fs::remove_file(&hold).unwrap();
    let list = wait_synced(&mut c).await;
    assert_eq!(list.pods.len(), 2, "complete from the first answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_client_is_rate_limited_while_another_process_is_served() {
    let d = Daemon::start(&[("pods.yaml", &three_pods())]);
    let mut c = client(&d).await;
    wait_synced(&mut c).await;
    // Let the bucket fill up again (100/s, burst 10).
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut outcomes = Vec::new();
    for _ in 0..50 {
        outcomes.push(c.list_pod_conditions(pb::ListPodConditionsRequest {}).await);
    }
    let served = outcomes.iter().filter(|r| r.is_ok()).count();
    let first_rejected = outcomes.iter().position(|r| r.is_err());
    assert!(
        first_rejected.is_some_and(|i| i >= 10),
        "the burst of 10 is served first: {first_rejected:?}"
    );
    assert!(served < 50, "50 tight calls must hit the limit");
    for r in outcomes.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(
            (r.code(), r.message()),
            (Code::ResourceExhausted, "rejected by rate limit")
        );
    }
    // Another process has its own bucket: served at once.
    let out = podinfo_cli(&["list", "--socket", socket(&d).to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("# podinfo revision=1 pods=2\n"));

    let limited = metric(&d, &series("pod_info_endpoint_rate_limited_total"));
    assert_eq!(limited, (50 - served) as f64);
    assert!(metric(&d, &series("pod_info_endpoint_errors_list")) >= limited);
    assert!(metric(&d, &series("pod_info_endpoint_requests_list")) >= 51.0);
    println!("{served} of 50 tight calls served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_may_hold_at_most_sixteen_watches() {
    let d = Daemon::start(&[("pods.yaml", &three_pods())]);
    // Watches also take tokens: open them at the refill rate.
    let mut c = client(&d).await;
    wait_synced(&mut c).await;
    let mut open = Vec::new();
    for _ in 0..16 {
        tokio::time::sleep(Duration::from_millis(15)).await;
        open.push(open_watch(&mut c).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let err = c
        .watch_pod_conditions(pb::WatchPodConditionsRequest {})
        .await
        .expect_err("a 17th watch is refused");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert_eq!(metric(&d, &series("pod_info_watch_streams")), 16.0);

    // Closing one frees a slot.
    drop(open.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(&d, &series("pod_info_watch_streams")) > 15.0 {
        assert!(Instant::now() < deadline, "closed stream not released");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut again = open_watch(&mut c).await;
    assert_eq!(
        next_message(&mut again, Duration::from_secs(2))
            .await
            .revision,
        1
    );
}

/// A pod whose conditions carry a long message, so that each list is big
/// enough to fill the transport's buffers quickly.
fn bulky_pod(i: usize, ready: bool) -> Value {
    let mut p = api_pod(&format!("p-{i:03}"), ready, json!({}));
    p["status"]["conditions"][1]["message"] = json!("m".repeat(1000));
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_stops_reading_is_dropped_while_another_keeps_receiving() {
    let api = FakeApiServer::start().await;
    for i in 0..100 {
        api.apply(bulky_pod(i, true));
    }
    let d = start_kube(&api, GENEROUS).await;
    let mut c = client(&d).await;
    let synced = wait_synced(&mut c).await;
    assert_eq!(synced.pods.len(), 100);

    // Separate connections, as separate programs would have.
    let mut slow = open_watch(&mut client(&d).await).await;
    let mut fast = open_watch(&mut client(&d).await).await;
    let (rev_tx, mut revisions) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        while let Ok(Some(m)) = fast.message().await {
            if rev_tx.send(m.revision).is_err() {
                return;
            }
        }
    });

    // Flip one pod until the server gives up on the slow watcher.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut flips = 0;
    while !d.log_text().contains("PodInfo watcher too slow") {
        assert!(
            Instant::now() < deadline,
            "slow watcher not dropped after {flips} changes; log:\n{}",
            d.log_text()
        );
        flips += 1;
        api.apply(bulky_pod(0, flips % 2 == 0));
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    // The other watcher saw every list in order and still gets new ones.
    let mut seen = Vec::new();
    while let Ok(r) = revisions.try_recv() {
        seen.push(r);
    }
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "in revision order");
    let last = *seen.last().expect("the fast watcher received lists");
    api.apply(bulky_pod(1, false));
    let newer = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            match revisions.recv().await {
                Some(r) if r > last => return r,
                Some(_) => {}
                None => panic!("the fast watcher's stream ended"),
            }
        }
    })
    .await
    .expect("the fast watcher keeps receiving");
    assert!(newer > last);

    // The slow one finds its queue and then the verdict.
    let mut queued = 0;
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match slow.message().await {
                Ok(Some(_)) => queued += 1,
                Ok(None) => panic!("stream ended without a status"),
                Err(status) => return status,
            }
        }
    })
    .await
    .expect("the slow stream ends");
    assert_eq!(
        (end.code(), end.message()),
        (Code::ResourceExhausted, "watcher too slow")
    );
    assert!(
        queued >= 64,
        "at least the queue of 64 was delivered: {queued}"
    );
    println!("{flips} changes; the slow watcher got {queued} lists before its stream ended");
    reader.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_is_0660_replaces_a_stale_file_and_is_removed_on_exit() {
    use std::os::unix::fs::PermissionsExt;
    let dir = manifests_dir(&[("pods.yaml", &three_pods())]);
    // A socket file left behind by a daemon that died.
    let path = dir.path().join("stale/podinfo.sock");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(std::os::unix::net::UnixStream::connect(&path).is_err());
    let flag = path.display().to_string();
    let d = Daemon::start_in(dir, &["--podinfo-socket", &flag]);

    let mut c = client_at(&d, &path).await;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);
    wait_synced(&mut c).await;
    let mut stream = open_watch(&mut c).await;
    next_message(&mut stream, Duration::from_secs(2)).await;

    let exited = tokio::task::spawn_blocking(move || {
        let mut d = d;
        d.terminate()
    });
    let end = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("the stream ends at shutdown")
        .unwrap_err();
    assert_eq!(end.code(), Code::Unavailable, "{end}");
    drop(stream);
    drop(c);
    assert!(exited.await.unwrap().success());
    assert!(!path.exists(), "socket removed on exit");
}

#[test]
fn a_bad_podinfo_flag_fails_start_up_naming_it() {
    let dir = manifests_dir(&[("pods.yaml", &three_pods())]);
    let manifests = dir.path().join("manifests").display().to_string();
    // A path under a regular file cannot be created.
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, "").unwrap();
    let bad_socket = blocker.join("podinfo.sock").display().to_string();
    for (args, expected) in [
        (
            vec!["--podinfo-socket", bad_socket.as_str()],
            "--podinfo-socket",
        ),
        (vec!["--podinfo-qps", "0"], "--podinfo-qps"),
        (vec!["--podinfo-burst", "0"], "--podinfo-burst"),
    ] {
        let out = std::process::Command::new(BIN)
            .args(["--source", "file", "--manifests", &manifests])
            .args(["--hostname-override", "n1", "--proxy-mode", "none"])
            .args([
                "--localnet-socket",
                "",
                "--localnet-bind-address",
                "127.0.0.1:0",
            ])
            .args(["--metrics-bind-address", "", "--healthz-bind-address", ""])
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} must fail");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_pods_are_listed_in_one_call() {
    let mut manifest = String::new();
    for i in 0..1000 {
        manifest.push_str(&pod_yaml(
            &format!("ns-{:02}", i % 20),
            &format!("pod-{i:04}"),
            "n1",
            &[
                ("PodScheduled", "True", ""),
                ("Initialized", "True", ""),
                ("ContainersReady", "True", ""),
                ("Ready", "True", ""),
            ],
        ));
        manifest.push_str("---\n");
    }
    let d = Daemon::start_in(manifests_dir(&[("pods.yaml", &manifest)]), GENEROUS);
    let mut c = client(&d).await;
    let first = wait_synced(&mut c).await;
    assert_eq!(first.pods.len(), 1000);
    let keys: Vec<(String, String)> = first
        .pods
        .iter()
        .map(|p| (p.pod_namespace.clone(), p.pod_name.clone()))
        .collect();
    assert!(
        keys.windows(2).all(|w| w[0] < w[1]),
        "sorted by (namespace, name)"
    );

    let mut times = Vec::new();
    for _ in 0..9 {
        let started = Instant::now();
        let list = c
            .list_pod_conditions(pb::ListPodConditionsRequest {})
            .await
            .unwrap()
            .into_inner();
        times.push(started.elapsed());
        assert_eq!(list.pods.len(), 1000);
    }
    times.sort();
    // Baseline: what any transfer costs at least, prost-encoding and
    // decoding the same message in this process (same build profile).
    let started = Instant::now();
    let bytes = prost::Message::encode_to_vec(&first);
    let decoded: pb::ListPodConditionsResponse = prost::Message::decode(bytes.as_slice()).unwrap();
    let baseline = started.elapsed();
    assert_eq!(decoded, first);
    let median = times[times.len() / 2];
    println!(
        "ListPodConditions, 1000 pods ({} bytes) over the unix socket: median {median:?} \
         (min {:?}, max {:?}); in-memory encode+decode {baseline:?}, ratio {:.1}",
        bytes.len(),
        times[0],
        times[times.len() - 1],
        median.as_secs_f64() / baseline.as_secs_f64()
    );
}
