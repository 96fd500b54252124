//! `/metrics` and `/proxyMode` of the real daemon (SPEC §5) and the status
//! listeners themselves.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::status::*;
use common::{get, manifests_dir, metric_value, service, slice, write_atomic, Daemon, BIN};

// ---------------------------------------------------------------- metrics

#[test]
fn metrics_expose_kube_proxy_families_with_help_type_and_labels() {
    let d = start_web(&[]);
    wait_ready(&d);
    get(d.healthz, "/healthz");
    get(d.healthz, "/livez");
    let r = get(d.metrics, "/metrics");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some(EXPOSITION));
    let m = r.text();
    let families = [
        (
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "histogram",
            "SyncProxyRules latency in seconds",
        ),
        (
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "gauge",
            "The last time proxy rules were successfully synced",
        ),
        (
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "gauge",
            "The last time a sync of proxy rules was queued",
        ),
        (
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "gauge",
            "Pending proxy rules Endpoint changes",
        ),
        (
            "kubeproxy_sync_proxy_rules_endpoint_changes_total",
            "counter",
            "Cumulative proxy rules Endpoint changes",
        ),
        (
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "gauge",
            "Pending proxy rules Service changes",
        ),
        (
            "kubeproxy_sync_proxy_rules_service_changes_total",
            "counter",
            "Cumulative proxy rules Service changes",
        ),
        (
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "gauge",
            "Number of services with a Local traffic policy and no endpoints",
        ),
        (
            "kubeproxy_proxy_healthz_total",
            "counter",
            "Cumulative proxy healthz HTTP status",
        ),
        (
            "kubeproxy_proxy_livez_total",
            "counter",
            "Cumulative proxy livez HTTP status",
        ),
    ];
    for (name, kind, help) in families {
        let want = help_and_type(name, &format!("[ALPHA] {help}"), kind);
        assert!(m.contains(&want), "{want} missing in\n{m}");
    }
    let buckets: Vec<&str> = m
        .lines()
        .filter_map(|l| {
            l.strip_prefix(
                "kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"",
            )?
            .split('"')
            .next()
        })
        .collect();
    assert_eq!(
        buckets,
        [
            "0.001", "0.002", "0.004", "0.008", "0.016", "0.032", "0.064", "0.128", "0.256",
            "0.512", "1.024", "2.048", "4.096", "8.192", "16.384", "+Inf"
        ]
    );
    for family in ["IPv4", "IPv6"] {
        let count =
            format!("kubeproxy_sync_proxy_rules_duration_seconds_count{{ip_family=\"{family}\"}}");
        assert!(metric_value(&m, &count).unwrap() >= 1.0, "{count}");
        for gauge in ["last_timestamp_seconds", "last_queued_timestamp_seconds"] {
            let series = format!("kubeproxy_sync_proxy_rules_{gauge}{{ip_family=\"{family}\"}}");
            let t = metric_value(&m, &series).unwrap_or_else(|| panic!("{series} missing"));
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs_f64();
            assert!(t > now - 60.0 && t <= now + 1.0, "{series} = {t}");
        }
        for policy in ["internal", "external"] {
            let series = format!(
                "kubeproxy_sync_proxy_rules_no_local_endpoints_total{{ip_family=\"{family}\",traffic_policy=\"{policy}\"}}"
            );
            assert_eq!(metric_value(&m, &series), Some(0.0), "{series}");
        }
    }
    assert_eq!(
        metric_value(&m, "kubeproxy_sync_proxy_rules_endpoint_changes_pending"),
        Some(0.0)
    );
    assert_eq!(
        metric_value(&m, "kubeproxy_sync_proxy_rules_service_changes_pending"),
        Some(0.0)
    );
    assert_eq!(
        metric_value(&m, "kubeproxy_proxy_healthz_total{code=\"200\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric_value(&m, "kubeproxy_proxy_livez_total{code=\"200\"}"),
        Some(1.0)
    );
    assert!(
        !m.contains("nftables"),
        "nftables families only in nftables mode"
    );
    assert!(!m.contains("\ngo_"), "no Go runtime metrics");
    assert!(
        m.contains("\nprocess_resident_memory_bytes "),
        "process collector"
    );

    // The ebpf_kube_proxy_* extension.
    let build_info = format!(
        "ebpf_kube_proxy_build_info{{git_commit=\"{}\",rustc_version=\"rustc ",
        m.split("ebpf_kube_proxy_build_info{git_commit=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .expect("build_info series")
    );
    let line = m.lines().find(|l| l.starts_with(&build_info)).unwrap();
    assert!(
        line.ends_with(&format!("version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"))),
        "{line}"
    );
    assert_eq!(
        metric_value(&m, "ebpf_kube_proxy_localstate_revision"),
        Some(1.0)
    );
    assert_eq!(
        metric_value(&m, "ebpf_kube_proxy_localstate_services"),
        Some(1.0)
    );
    assert_eq!(
        metric_value(&m, "ebpf_kube_proxy_localstate_endpoints"),
        Some(2.0)
    );
    for resource in ["endpointslices", "nodes", "pods", "services"] {
        let series =
            format!("ebpf_kube_proxy_source_synced{{resource=\"{resource}\",source=\"file\"}}");
        assert_eq!(metric_value(&m, &series), Some(1.0), "{series}");
    }
    assert_eq!(
        metric_value(
            &m,
            "ebpf_kube_proxy_datapath_apply_errors_total{mode=\"none\"}"
        ),
        Some(0.0)
    );
}

#[test]
fn service_and_endpoint_slice_changes_are_counted_and_the_sync_time_advances() {
    let d = start_web(&[]);
    wait_ready(&d);
    let read = || {
        let m = metrics_text(&d);
        let get = |s: &str| metric_value(&m, s).unwrap_or_else(|| panic!("{s} missing in\n{m}"));
        (
            get("kubeproxy_sync_proxy_rules_service_changes_total"),
            get("kubeproxy_sync_proxy_rules_endpoint_changes_total"),
            get("kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}"),
        )
    };
    let (services, slices, synced_at) = read();

    write_atomic(
        &d.manifest("b.yaml"),
        &service("default", "api", "10.96.0.11"),
    );
    // Changes are counted when queued, the sync time when the datapath has
    // applied them a moment later: wait for both.
    let (s1, e1, t1) = wait_for("a Service change, synced", Duration::from_secs(5), || {
        let now = read();
        (now.0 > services && now.2 > synced_at).then_some(now)
    });
    assert_eq!(s1, services + 1.0, "one Service added");
    assert_eq!(e1, slices, "no EndpointSlice changed");
    assert!(t1 > synced_at, "last_timestamp_seconds advances");

    write_atomic(
        &d.manifest("a.yaml"),
        &format!(
            "{}---\n{}",
            service("prod", "web", "10.96.0.10"),
            slice("prod", "web", &["10.244.2.1", "10.244.2.2", "10.244.2.3"])
        ),
    );
    let (s2, e2, t2) = wait_for(
        "an EndpointSlice change, synced",
        Duration::from_secs(5),
        || {
            let now = read();
            (now.1 > e1 && now.2 > t1).then_some(now)
        },
    );
    assert_eq!(e2, e1 + 1.0, "one EndpointSlice edited");
    assert_eq!(s2, s1, "the unchanged Service is not counted");
    assert!(t2 > t1);
    let m = wait_for("pending changes to clear", Duration::from_secs(5), || {
        let m = metrics_text(&d);
        (metric_value(&m, "kubeproxy_sync_proxy_rules_endpoint_changes_pending") == Some(0.0))
            .then_some(m)
    });
    assert_eq!(
        metric_value(&m, "kubeproxy_sync_proxy_rules_service_changes_pending"),
        Some(0.0)
    );
    assert_eq!(
        metric_value(&m, "ebpf_kube_proxy_localstate_endpoints"),
        Some(3.0)
    );
}

#[test]
fn a_slice_with_a_trigger_time_gives_one_network_programming_sample() {
    let d = start_web(&[]);
    wait_ready(&d);
    let name = "kubeproxy_network_programming_duration_seconds";
    assert!(
        !metrics_text(&d).contains(name),
        "slices without the annotation give no sample"
    );

    // Trigger times before the process started are ignored (as upstream);
    // the annotation has whole seconds, so let a second pass.
    std::thread::sleep(Duration::from_millis(1100));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let trigger = jiff::Timestamp::from_second(i64::try_from(now).unwrap())
        .unwrap()
        .strftime("%Y-%m-%dT%H:%M:%SZ");
    write_atomic(
        &d.manifest("c.yaml"),
        &format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata:\n  name: web-2\n  namespace: prod\n  labels: {{kubernetes.io/service-name: web}}\n  \
             annotations: {{endpoints.kubernetes.io/last-change-trigger-time: \"{trigger}\"}}\n\
             addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\n\
             endpoints: [{{addresses: [10.244.2.9], nodeName: n2, conditions: {{ready: true}}}}]\n"
        ),
    );
    let count = format!("{name}_count{{ip_family=\"IPv4\"}}");
    let m = wait_for(
        "a programming latency sample",
        Duration::from_secs(5),
        || {
            let m = metrics_text(&d);
            metric_value(&m, &count).is_some().then_some(m)
        },
    );
    assert_eq!(metric_value(&m, &count), Some(1.0));
    let sum = metric_value(&m, &format!("{name}_sum{{ip_family=\"IPv4\"}}")).unwrap();
    assert!((0.0..30.0).contains(&sum), "latency {sum}s");
    assert!(
        !m.contains(&format!("{name}_count{{ip_family=\"IPv6\"}}")),
        "IPv4 slice only"
    );
    assert!(m.contains(&help_and_type(
        name,
        "[ALPHA] In Cluster Network Programming Latency in seconds",
        "histogram"
    )));
    let buckets: Vec<String> = m
        .lines()
        .filter_map(|l| {
            l.strip_prefix(&format!("{name}_bucket{{ip_family=\"IPv4\",le=\""))?
                .split('"')
                .next()
                .map(str::to_owned)
        })
        .collect();
    let mut want: Vec<String> = vec!["0.25".into(), "0.5".into()];
    want.extend((1..=59).map(|s| s.to_string()));
    want.extend((60..=115).step_by(5).map(|s| s.to_string()));
    want.extend((120..=300).step_by(30).map(|s| s.to_string()));
    want.push("+Inf".into());
    assert_eq!(buckets, want);
}

#[test]
fn proxy_mode_is_the_active_mode_and_its_gauge() {
    let d = start_web(&[]);
    let r = get(d.metrics, "/proxyMode");
    assert_eq!((r.status, r.text().as_str()), (200, "none"));
    assert_eq!(r.header("content-type"), Some(TEXT_PLAIN));
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    let m = metrics_text(&d);
    let modes: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("ebpf_kube_proxy_datapath_mode{"))
        .collect();
    assert_eq!(
        modes,
        ["ebpf_kube_proxy_datapath_mode{mode=\"none\",requested=\"none\"} 1"]
    );
}

// ------------------------------------------------------------- listeners

#[test]
fn unknown_paths_are_404_on_both_servers() {
    let d = start_web(&[]);
    for (addr, path) in [
        (d.metrics, "/nope"),
        (d.metrics, "/metricsx"),
        (d.metrics, "/readyz/nope"),
        (d.healthz, "/nope"),
        (d.healthz, "/readyz"),
    ] {
        let r = get(addr, path);
        assert_eq!(r.status, 404, "{path}");
        assert_eq!(r.header("content-type"), Some(TEXT_PLAIN), "{path}");
        assert_eq!(r.text(), "404 page not found\n", "{path}");
    }
}

/// Runs the daemon with one status address taken; it must fail to start.
fn startup_error_with_busy(flag: &str, busy: SocketAddr) -> String {
    let dir = manifests_dir(&[("a.yaml", &web())]);
    let log = dir.path().join("daemon.log");
    let (metrics, healthz) = (common::free_port(), common::free_port());
    let mut child = Command::new(BIN)
        .args([
            "--source",
            "file",
            "--hostname-override",
            "n1",
            "--proxy-mode",
            "none",
        ])
        .arg("--manifests")
        .arg(dir.path().join("manifests"))
        .arg("--localnet-bind-address")
        .arg(common::free_port().to_string())
        .arg("--localnet-socket")
        .arg(dir.path().join("run/localnet.sock"))
        .arg("--podinfo-socket")
        .arg(dir.path().join("run/podinfo.sock"))
        .arg("--metrics-bind-address")
        .arg(if flag == "metrics" { busy } else { metrics }.to_string())
        .arg("--healthz-bind-address")
        .arg(if flag == "healthz" { busy } else { healthz }.to_string())
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the daemon started although {busy} is taken");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    std::fs::read_to_string(&log).unwrap()
}

#[test]
fn a_busy_status_address_fails_startup_naming_the_flag() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap();
    let log = startup_error_with_busy("metrics", busy);
    assert!(
        log.contains(&format!("--metrics-bind-address {busy}")),
        "{log}"
    );
    let log = startup_error_with_busy("healthz", busy);
    assert!(
        log.contains(&format!("--healthz-bind-address {busy}")),
        "{log}"
    );
}

/// `ebpf_kube_proxy_localnet_clients{rpc}` counts open calls (a watcher, a
/// waiting poll) and `_localnet_requests_total{rpc,code}` finished ones by
/// their gRPC status.
#[tokio::test]
async fn localnet_calls_are_counted_by_rpc_and_status() {
    use ebpf_kube_proxy::localnet::client;
    use proto::localnet::v1 as pb;
    use tokio_stream::StreamExt;

    let d = start_web(&[]);
    wait_ready(&d);
    let mut c = d.tcp().await;
    let state = client::next(&mut c, 0, 0).await.unwrap();

    // A watcher that stays, and a poll that waits for a newer state.
    let mut watch = common::watch_all(&mut c).await;
    watch.next().await.unwrap().unwrap();
    let mut poller = c.clone();
    let (instance_id, rev) = (state.instance_id, state.rev);
    let waiting = tokio::spawn(async move {
        let mut req = tonic::Request::new(pb::NextFilter { instance_id, rev });
        req.set_timeout(Duration::from_millis(1500));
        poller.next(req).await.map(drop)
    });
    let open = |m: &str, rpc: &str| {
        metric_value(
            m,
            &format!("ebpf_kube_proxy_localnet_clients{{rpc=\"{rpc}\"}}"),
        )
    };
    let m = tokio::task::spawn_blocking({
        let addr = d.metrics;
        move || {
            wait_for(
                "a waiting poll and a watcher",
                Duration::from_secs(5),
                || {
                    let m = get(addr, "/metrics").text();
                    (metric_value(&m, "ebpf_kube_proxy_localnet_clients{rpc=\"Next\"}")
                        == Some(1.0)
                        && metric_value(&m, "ebpf_kube_proxy_localnet_clients{rpc=\"Watch\"}")
                            == Some(1.0))
                    .then_some(m)
                },
            )
        }
    })
    .await
    .unwrap();
    assert_eq!(open(&m, "Watch"), Some(1.0));

    let err = waiting
        .await
        .unwrap()
        .expect_err("nothing new within the deadline");
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err}");
    drop(watch);
    let m = tokio::task::spawn_blocking({
        let addr = d.metrics;
        move || {
            wait_for("the calls to end", Duration::from_secs(5), || {
                let m = get(addr, "/metrics").text();
                (metric_value(&m, "ebpf_kube_proxy_localnet_clients{rpc=\"Next\"}") == Some(0.0)
                    && metric_value(&m, "ebpf_kube_proxy_localnet_clients{rpc=\"Watch\"}")
                        == Some(0.0))
                .then_some(m)
            })
        }
    })
    .await
    .unwrap();
    for (series, value) in [
        ("{code=\"OK\",rpc=\"Next\"}", 1.0),
        ("{code=\"DEADLINE_EXCEEDED\",rpc=\"Next\"}", 1.0),
        ("{code=\"CANCELLED\",rpc=\"Watch\"}", 1.0),
    ] {
        let name = format!("ebpf_kube_proxy_localnet_requests_total{series}");
        assert_eq!(metric_value(&m, &name), Some(value), "{name}\n{m}");
    }
}

/// SPEC §10.5: an internalTrafficPolicy Local service whose only endpoint
/// is on another node has no local endpoints for internal traffic.
#[test]
fn an_itp_local_service_with_only_remote_endpoints_counts_for_internal() {
    let svc = service("default", "itp", "10.96.0.40").replacen(
        "spec:\n",
        "spec:\n  internalTrafficPolicy: Local\n",
        1,
    );
    // `slice` puts the endpoint on node n2; the daemon is n1.
    let d = Daemon::start_in(
        manifests_dir(&[
            ("svc.yaml", &svc),
            ("eps.yaml", &slice("default", "itp", &["10.244.2.9"])),
        ]),
        &[],
    );
    wait_ready(&d);
    let series = |policy: &str| {
        format!("kubeproxy_sync_proxy_rules_no_local_endpoints_total{{ip_family=\"IPv4\",traffic_policy=\"{policy}\"}}")
    };
    let m = metrics_text(&d);
    assert_eq!(metric_value(&m, &series("internal")), Some(1.0), "{m}");
    assert_eq!(metric_value(&m, &series("external")), Some(0.0), "{m}");
}

#[test]
fn refused_manifest_objects_are_counted_by_reason_once_each() {
    let d = start_web(&[]);
    wait_ready(&d);
    let series = |reason: &str| {
        format!("ebpf_kube_proxy_rejected_objects_total{{reason=\"{reason}\",source=\"file\"}}")
    };
    let reasons = ["invalid_manifest", "invalid_object", "undecodable"];
    let read = || {
        let m = metrics_text(&d);
        reasons.map(|r| {
            metric_value(&m, &series(r)).unwrap_or_else(|| panic!("{} missing in\n{m}", series(r)))
        })
    };
    assert_eq!(read(), [0.0; 3], "each series exists from the start");

    write_atomic(
        &d.manifest("b.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: [broken\n",
    );
    write_atomic(
        &d.manifest("c.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: bad}\nspec: {ports: [{port: 70000}]}\n",
    );
    write_atomic(
        &d.manifest("d.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: worse}\nspec: {ports: [{port: eighty}]}\n",
    );
    wait_for("three refusals counted", Duration::from_secs(5), || {
        (read() == [1.0; 3]).then_some(())
    });
    // Counted per refused version, not per re-read of the directory.
    write_atomic(
        &d.manifest("e.yaml"),
        &service("default", "api", "10.96.0.11"),
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(read(), [1.0; 3]);
}
