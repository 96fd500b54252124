//! The file source as an operator sees it on an idle node: after the first
//! sync, a daemon whose manifests do not change does no work.

mod common;

use std::time::Duration;

use common::{get, manifests_dir, pod_yaml, service, slice, Daemon};

/// User plus system CPU time of `pid`, in clock ticks (`/proc/PID/stat`
/// fields 14 and 15).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The command name may hold spaces; fields start after its ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn an_idle_daemon_on_the_file_source_stays_idle() {
    // 50 files of 20 services each, 1,000 services with two endpoints.
    let files: Vec<(String, String)> = (0..50)
        .map(|f| {
            let docs: Vec<String> = (0..20)
                .map(|i| {
                    let name = format!("svc-{f}-{i}");
                    let ip = format!("10.96.{f}.{i}");
                    format!(
                        "{}---\n{}",
                        service("default", &name, &ip),
                        slice("default", &name, &["10.244.1.1", "10.244.1.2"])
                    )
                })
                .collect();
            (format!("file-{f}.yaml"), docs.join("---\n"))
        })
        .collect();
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(n, c)| (n.as_str(), c.as_str()))
        .collect();
    let d = Daemon::start_in(manifests_dir(&refs), &[]);
    // Synced and programmed: readiness passes.
    for _ in 0..100 {
        if get(d.metrics, "/readyz").status == 200 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let pid = d.pid();
    let ticks_per_second = 100; // USER_HZ on Linux
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(3));
    let used = cpu_ticks(pid) - before;
    eprintln!("idle CPU: {used} ticks in 3 s");
    // Re-reading the directory after its own reads kept it busy (about 60
    // ticks in 3 s here, a whole core at 50k services); idle is a few
    // ticks at most (the 5 s safety-net rescan may fall in the window).
    assert!(
        used < ticks_per_second / 4,
        "the idle daemon used {used} ticks of CPU in 3 s"
    );
}

/// The manifest directory deleted and created again (a re-provisioned host
/// path, `kubectl cp` of a whole directory): its new content is picked up
/// at once, not at the next 5 s safety-net rescan, and the services kept
/// serving meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_manifest_directory_is_watched_again() {
    use ebpf_kube_proxy::localnet::client;
    use std::time::Instant;

    let d = Daemon::start(&[("a.yaml", &service("default", "one", "10.96.0.1"))]);
    let mut c = d.unix().await;
    let first = client::next(&mut c, 0, 0).await.unwrap();
    assert_eq!(first.services.len(), 1);

    let dir = d.dir.path().join("manifests");
    std::fs::remove_dir_all(&dir).unwrap();
    // Let the removal be seen (and the watch die) before the new one.
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::create_dir(&dir).unwrap();
    // The directory gone, the last good state keeps serving.
    let still = tokio::time::timeout(Duration::from_millis(500), client::next(&mut c, 0, 0))
        .await
        .expect("the state is still served")
        .unwrap();
    assert_eq!(still.services.len(), 1);

    // Twice: the first write goes to a directory whose watch had to be
    // re-established, the second checks that the new watch keeps working.
    let mut rev = first.rev;
    for (i, name) in ["two", "three"].into_iter().enumerate() {
        let content = format!(
            "{}---\n{}",
            service("default", "one", "10.96.0.1"),
            service("default", name, &format!("10.96.0.{}", i + 2))
        );
        let written = Instant::now();
        common::write_atomic(&dir.join("a.yaml"), &content);
        let next = tokio::time::timeout(
            Duration::from_secs(10),
            client::next(&mut c, first.instance_id, rev),
        )
        .await
        .expect("a new revision")
        .unwrap();
        let took = written.elapsed();
        assert_eq!(next.services.len(), 2, "{next:?}");
        assert!(
            took < Duration::from_secs(2),
            "the change in the re-created directory took {took:?}: it waited for the periodic rescan"
        );
        rev = next.rev;
    }
}

/// A one-service change written into place (temporary file, rename) among
/// many files is served within a few milliseconds, and editors' swap and
/// backup files next to it are not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_renamed_into_place_is_served_at_once_and_editor_files_are_ignored() {
    use ebpf_kube_proxy::localnet::client;
    use std::time::Instant;

    let files: Vec<(String, String)> = (0..30)
        .map(|f| {
            let name = format!("svc-{f}");
            let content = format!(
                "{}---\n{}",
                service("default", &name, &format!("10.96.0.{f}")),
                slice("default", &name, &["10.244.1.1"])
            );
            (format!("file-{f:02}.yaml"), content)
        })
        .collect();
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(n, c)| (n.as_str(), c.as_str()))
        .collect();
    let d = Daemon::start_in(manifests_dir(&refs), &[]);
    let mut c = d.unix().await;
    let first = client::next(&mut c, 0, 0).await.unwrap();
    assert_eq!(first.services.len(), 30);

    // Swap, backup and lock files holding a valid manifest of a new
    // service: never read.
    let extra = service("default", "swap", "10.96.1.1");
    for name in [
        ".file-07.yaml.swp",
        "file-07.yaml~",
        ".#file-07.yaml",
        "4913",
    ] {
        std::fs::write(d.manifest(name), &extra).unwrap();
    }
    let none = tokio::time::timeout(
        Duration::from_millis(500),
        client::next(&mut c, first.instance_id, first.rev),
    )
    .await;
    assert!(none.is_err(), "a swap file changed the state: {none:?}");

    // The fastest of three changes: the old source slept 100 ms after an
    // event before it read the whole directory.
    let mut rev = first.rev;
    let mut fastest = Duration::MAX;
    for i in 0..3 {
        let ips = [format!("10.244.2.{i}")];
        let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
        let content = format!(
            "{}---\n{}",
            service("default", "svc-7", "10.96.0.7"),
            slice("default", "svc-7", &ips)
        );
        let written = Instant::now();
        common::write_atomic(&d.manifest("file-07.yaml"), &content);
        let next = tokio::time::timeout(
            Duration::from_secs(10),
            client::next(&mut c, first.instance_id, rev),
        )
        .await
        .expect("a new revision")
        .unwrap();
        fastest = fastest.min(written.elapsed());
        assert_eq!(next.services.len(), 30);
        let svc7 = format!("{next:?}");
        assert!(svc7.contains(&format!("10.244.2.{i}")), "{svc7}");
        rev = next.rev;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        fastest < Duration::from_millis(60),
        "a one-file change took {fastest:?} at best"
    );
}

/// One file per Service, `svc-N` at `10.{net}.N/250.N%250` with one
/// endpoint; `mover` too when `with_mover`.
fn one_service_file(n: usize, net: u8, with_mover: bool) -> String {
    let name = format!("svc-{n:03}");
    let mut content = format!(
        "{}---\n{}",
        service(
            "default",
            &name,
            &format!("10.{net}.{}.{}", n / 250, n % 250)
        ),
        slice("default", &name, &["10.244.1.1"])
    );
    if with_mover {
        content.push_str(&format!(
            "---\n{}---\n{}---\n{}",
            service("default", "mover", "10.96.9.9"),
            slice("default", "mover", &["10.244.1.2"]),
            pod_yaml("default", "wanderer", "n1", &[("Ready", "True", "")])
        ));
    }
    content
}

/// Writes a ConfigMap volume's version `version` of `files` under
/// `manifests` (`..<version>/NAME`), as the kubelet does before it swaps
/// the `..data` link.
fn configmap_version(manifests: &std::path::Path, version: &str, files: &[(String, String)]) {
    let dir = manifests.join(format!("..{version}"));
    std::fs::create_dir(&dir).unwrap();
    for (name, content) in files {
        std::fs::write(dir.join(name), content).unwrap();
    }
}

/// The daemon's PodInfo client, once its socket is bound (bounded wait:
/// `Daemon` waits for the other listeners only).
async fn podinfo_client(
    d: &Daemon,
) -> proto::podinfo::v1alpha1::pod_info_service_client::PodInfoServiceClient<
    tonic::transport::Channel,
> {
    let path = d.dir.path().join("run/podinfo.sock");
    for _ in 0..200 {
        if let Ok(c) = ebpf_kube_proxy::podinfo::client::connect(&path).await {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("PodInfo socket not listening; log:\n{}", d.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_larger_than_a_read_chunk_is_published_whole() {
    use proto::localnet::v1::{watch_event::Event, WatchRequest};
    use std::os::unix::fs::symlink;

    // A ConfigMap volume of 300 manifests, one Service each, and `mover`
    // (and this node's pod `wanderer`) in the first: each manifest a link
    // through `..data` to the current version's directory.
    const FILES: usize = 300;
    let version = |net: u8, mover_in: usize| -> Vec<(String, String)> {
        (0..FILES)
            .map(|n| {
                let mut content = one_service_file(n, net, n == mover_in);
                if n == FILES - 1 {
                    // Read last, and slowly: a state computed from the
                    // first chunk alone would be published meanwhile.
                    content.push_str(&"# padding\n".repeat(300_000));
                }
                (format!("file-{n:03}.yaml"), content)
            })
            .collect()
    };
    let root = tempfile::tempdir().unwrap();
    let manifests = root.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    configmap_version(&manifests, "v1", &version(96, 0));
    symlink("..v1", manifests.join("..data")).unwrap();
    for n in 0..FILES {
        let name = format!("file-{n:03}.yaml");
        symlink(format!("..data/{name}"), manifests.join(&name)).unwrap();
    }
    let d = Daemon::start_in(root, &[]);
    let mut c = d.unix().await;
    let first = ebpf_kube_proxy::localnet::client::next(&mut c, 0, 0)
        .await
        .unwrap();
    assert_eq!(first.services.len(), FILES + 1);
    let mut frames = c
        .watch(WatchRequest {
            instance_id: first.instance_id,
            rev: first.rev,
            deltas: false,
        })
        .await
        .unwrap()
        .into_inner();
    let mut pods = podinfo_client(&d)
        .await
        .watch_pod_conditions(proto::podinfo::v1alpha1::WatchPodConditionsRequest {})
        .await
        .unwrap()
        .into_inner();
    let pods_first = pods.message().await.unwrap().unwrap();
    assert_eq!(pods_first.pods.len(), 1, "{pods_first:?}");

    // The next version gives every Service another address and moves
    // `mover` and `wanderer` to the last file. The kubelet's swap of `..data` changes
    // all 300 files at once, one burst, more than a read chunk holds:
    // `mover` leaves the first chunk and arrives in the second, and no
    // state may lack it.
    configmap_version(&d.manifest(""), "v2", &version(97, FILES - 1));
    symlink("..v2", d.manifest("..data_tmp")).unwrap();
    std::fs::rename(d.manifest("..data_tmp"), d.manifest("..data")).unwrap();

    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut moved = 0;
    let mut revisions = 0;
    while moved < FILES {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let ev = tokio::time::timeout(left, tokio_stream::StreamExt::next(&mut frames))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the burst was not applied ({moved} of {FILES} moved); log:\n{}",
                    d.log_text()
                )
            })
            .unwrap()
            .unwrap();
        match ev.event {
            Some(Event::Begin(b)) => {
                revisions += 1;
                moved = 0;
                assert_eq!(
                    b.service_count as usize,
                    FILES + 1,
                    "revision {} lacks a Service: half a burst was published",
                    b.rev
                );
            }
            Some(Event::Service(se)) => {
                let svc = se.service.unwrap();
                let ip = svc
                    .ips
                    .and_then(|ips| ips.cluster_ips)
                    .map(|set| set.v4)
                    .unwrap_or_default();
                if svc.name.starts_with("svc-") && ip.iter().any(|a| a.starts_with("10.97.")) {
                    moved += 1;
                }
            }
            _ => {}
        }
    }
    assert!(revisions >= 1);
    // The pod list did not change, so PodInfo watchers were told nothing:
    // not a list without `wanderer` in the middle of the burst.
    if let Ok(m) = tokio::time::timeout(Duration::from_millis(500), pods.message()).await {
        panic!("the pods were published from half a burst: {m:?}");
    }
    // Every state computed, watched or not, had them all.
    let log = d.log_text();
    let half = format!("services={FILES} ");
    assert!(
        !log.lines()
            .any(|l| l.contains("new local state") && l.contains(&half)),
        "half a burst was computed; log:\n{log}"
    );
}

/// The names of the Services a localnet state serves.
fn served(state: &ebpf_kube_proxy::localnet::client::State) -> Vec<String> {
    let mut names: Vec<String> = state
        .services
        .iter()
        .filter_map(|s| s.service.as_ref().map(|s| s.name.clone()))
        .collect();
    names.sort();
    names
}

/// The next revision of the daemon's state, within 10 s.
async fn next_state(
    c: &mut proto::localnet::v1::endpoints_client::EndpointsClient<tonic::transport::Channel>,
    after: &ebpf_kube_proxy::localnet::client::State,
    d: &Daemon,
) -> ebpf_kube_proxy::localnet::client::State {
    tokio::time::timeout(
        Duration::from_secs(10),
        ebpf_kube_proxy::localnet::client::next(c, after.instance_id, after.rev),
    )
    .await
    .unwrap_or_else(|_| panic!("no new revision; log:\n{}", d.log_text()))
    .unwrap()
}

/// kube-proxy's informers select Services and EndpointSlices with
/// `!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless`:
/// the file source serves the same set. A Service labelled headless (here
/// with a ClusterIP, as the upstream e2e test "should implement
/// service.kubernetes.io/headless" does) is not served, and is served once
/// the label is removed; labelling it again takes it away again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_labelled_headless_is_not_served_until_the_label_is_removed() {
    let plain = |name: &str, ip: &str| {
        format!(
            "{}---\n{}",
            service("default", name, ip),
            slice("default", name, &["10.244.1.1"])
        )
    };
    let labelled = |name: &str, ip: &str, labels: &str| {
        plain(name, ip).replacen(
            &format!("name: {name}, namespace: default}}"),
            &format!("name: {name}, namespace: default, labels: {{{labels}}}}}"),
            1,
        )
    };
    let headless = labelled("hl", "10.96.0.20", "service.kubernetes.io/headless: \"\"");
    assert!(headless.contains("labels:"), "{headless}");
    let d = Daemon::start(&[
        ("web.yaml", &plain("web", "10.96.0.10")),
        ("hl.yaml", &headless),
        (
            "other.yaml",
            &labelled(
                "other",
                "10.96.0.30",
                "service.kubernetes.io/service-proxy-name: other-proxy",
            ),
        ),
    ]);
    let mut c = d.unix().await;
    let first = ebpf_kube_proxy::localnet::client::next(&mut c, 0, 0)
        .await
        .unwrap();
    assert_eq!(served(&first), ["web"], "{first:?}");

    // The label removed at runtime: served.
    common::write_atomic(&d.manifest("hl.yaml"), &plain("hl", "10.96.0.20"));
    let second = next_state(&mut c, &first, &d).await;
    assert_eq!(served(&second), ["hl", "web"], "{second:?}");
    assert!(format!("{second:?}").contains("10.96.0.20"));

    // Labelled again (any value): gone again.
    common::write_atomic(
        &d.manifest("hl.yaml"),
        &labelled(
            "hl",
            "10.96.0.20",
            "service.kubernetes.io/headless: \"yes\"",
        ),
    );
    let third = next_state(&mut c, &second, &d).await;
    assert_eq!(served(&third), ["web"], "{third:?}");
}

/// CVE-2021-29923 ("IPv4 Service Type ClusterIP with leading zeros should
/// work interpreted as decimal"): a manifest's `10.96.0.010` is accepted,
/// read as decimal as kube-proxy reads it, and served as 10.96.0.10.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_ip_with_leading_zeros_is_read_as_decimal() {
    let content = format!(
        "{}---\n{}",
        service("default", "web", "10.96.0.010"),
        slice("default", "web", &["10.244.001.010"])
    );
    let d = Daemon::start(&[("web.yaml", &content)]);
    let mut c = d.unix().await;
    let first = ebpf_kube_proxy::localnet::client::next(&mut c, 0, 0)
        .await
        .unwrap();
    assert_eq!(served(&first), ["web"], "log:\n{}", d.log_text());
    let web = &first.services[0];
    let ips = web.service.as_ref().unwrap().ips.as_ref().unwrap();
    assert_eq!(ips.cluster_ips.as_ref().unwrap().v4, ["10.96.0.10"]);
    assert_eq!(web.endpoints[0].ip, "10.244.1.10");
}
