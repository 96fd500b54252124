//! The daemon on the kube source against the fake API server: real HTTP
//! list/watch with the real JSON and protobuf encodings (each test runs on
//! both: `protobuf::…` and `json::…`), real gRPC out.

mod common;

use std::time::{Duration, Instant};

use common::fake_apiserver::{service_object as service, slice_object as slice, FakeApiServer};
use common::{service_names as names, Daemon, Wire};
use ebpf_kube_proxy::localnet::client::{self, State};
use serde_json::json;

on_each_wire!(
    objects_from_the_api_server_reach_the_localnet_api_within_a_second,
    a_dropped_watch_and_410_gone_relist_without_partial_state,
    an_api_server_outage_keeps_the_state_and_recovers_without_restart,
    a_relist_takes_in_only_what_changed_while_the_watch_was_down,
    a_relist_keeps_the_last_good_version_of_an_object_now_invalid,
    deleting_an_object_whose_current_version_is_invalid_removes_it,
    an_undecodable_service_does_not_stall_the_others,
    a_twelve_megabyte_list_in_one_piece_syncs_whole,
    addresses_with_leading_zeros_are_read_as_decimal,
);

/// Protobuf asked for (the default) of a server that answers JSON only:
/// the answers are read as JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_is_read_when_the_server_answers_json_to_a_protobuf_request() {
    objects_from_the_api_server_reach_the_localnet_api_within_a_second(Wire::JsonAnswered).await;
}

async fn objects_from_the_api_server_reach_the_localnet_api_within_a_second(wire: Wire) {
    let api = FakeApiServer::start().await;
    api.apply(service("default", "web", "10.96.0.10"));
    api.apply(slice("default", "web", &["10.244.2.1".into()]));
    // Filtered like kube-proxy: another proxy's service never shows up.
    let mut other = service("default", "other-proxy", "10.96.0.11");
    other["metadata"]["labels"] = json!({"service.kubernetes.io/service-proxy-name": "x"});
    api.apply(other);
    api.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "a"}}}));
    api.apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"}, "spec": {"nodeName": "n1", "containers": []}}));
    let d = Daemon::start_on(&api, wire);

    let s = d
        .wait_state((0, 0), Duration::from_secs(10), |_| true)
        .await;
    wire.check(&api);
    assert_eq!(names(&s), ["web"]);
    assert_eq!(s.services[0].endpoints[0].ip, "10.244.2.1");

    let changed = Instant::now();
    api.apply(slice(
        "default",
        "web",
        &["10.244.2.1".into(), "10.244.2.2".into()],
    ));
    let s2 = d
        .wait_state((s.instance_id, s.rev), Duration::from_secs(1), |s| {
            s.services[0].endpoints.len() == 2
        })
        .await;
    assert!(changed.elapsed() < Duration::from_secs(1));
    assert_eq!(s2.rev, s.rev + 1);

    api.delete("Service", "default", "web");
    let s3 = d
        .wait_state((s2.instance_id, s2.rev), Duration::from_secs(1), |s| {
            s.services.is_empty()
        })
        .await;
    assert!(s3.rev > s2.rev);
}

async fn a_dropped_watch_and_410_gone_relist_without_partial_state(wire: Wire) {
    let api = FakeApiServer::start().await;
    for i in 0..20 {
        api.apply(service(
            "default",
            &format!("svc-{i:02}"),
            &format!("10.96.0.{}", 10 + i),
        ));
    }
    api.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}));
    let d = Daemon::start_on(&api, wire);
    let s = d
        .wait_state((0, 0), Duration::from_secs(10), |_| true)
        .await;
    wire.check(&api);
    assert_eq!(s.services.len(), 20);

    // Watch every frame from now on: none may ever lack a service.
    let mut c = d.unix().await;
    let mut frames = c
        .watch(proto::localnet::v1::WatchRequest {
            instance_id: s.instance_id,
            rev: s.rev,
            deltas: false,
        })
        .await
        .unwrap()
        .into_inner();

    // A plain drop: watches resume from their resource version.
    api.drop_watches();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // While no watch is open, one service is deleted and one added, and the
    // history is compacted: the watches come back to 410 Gone and relist;
    // the relist must be applied whole (never 19 services in between).
    api.set_down(true);
    api.delete("Service", "default", "svc-00");
    api.apply(service("default", "svc-new", "10.96.1.1"));
    api.compact();
    api.set_down(false);

    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen_new = false;
    while !seen_new {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = tokio::time::timeout(left, tokio_stream::StreamExt::next(&mut frames))
            .await
            .unwrap_or_else(|_| panic!("relist not applied; log:\n{}", d.log_text()))
            .unwrap()
            .unwrap();
        if let Some(proto::localnet::v1::watch_event::Event::Begin(b)) = ev.event {
            assert!(
                b.service_count >= 20,
                "a partial state was published: {} services",
                b.service_count
            );
        }
        if let Some(proto::localnet::v1::watch_event::Event::Service(se)) = ev.event.clone() {
            seen_new |= se.service.unwrap().name == "svc-new";
        }
    }
    let now = client::next(&mut d.tcp().await, 0, 0).await.unwrap();
    let n = names(&now);
    assert_eq!(n.len(), 20);
    assert!(
        !n.contains(&"svc-00".to_owned()),
        "deleted during the outage of the watch: {n:?}"
    );
    assert!(d.log_text().contains("relist"), "log:\n{}", d.log_text());
}

async fn an_api_server_outage_keeps_the_state_and_recovers_without_restart(wire: Wire) {
    let api = FakeApiServer::start().await;
    api.apply(service("default", "web", "10.96.0.10"));
    api.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}));
    let d = Daemon::start_on(&api, wire);
    let s = d
        .wait_state((0, 0), Duration::from_secs(10), |_| true)
        .await;
    wire.check(&api);

    let in_sync = |d: &Daemon| {
        let m = common::get(d.metrics, "/metrics").text();
        m.lines()
            .find(|l| {
                l.starts_with(
                    "ebpf_kube_proxy_source_synced{resource=\"services\",source=\"kube\"}",
                )
            })
            .map(|l| l.ends_with(" 1"))
            .unwrap_or_else(|| panic!("no source_synced series for services:\n{m}"))
    };
    assert!(in_sync(&d));

    api.set_down(true);
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The last state keeps serving, and the staleness shows.
    let during = client::next(&mut d.tcp().await, 0, 0).await.unwrap();
    assert_eq!(
        (during.instance_id, during.rev, names(&during)),
        (s.instance_id, s.rev, names(&s))
    );
    assert!(!in_sync(&d), "the outage must show as stale on /metrics");

    api.set_down(false);
    api.apply(service("default", "after", "10.96.0.11"));
    // Backoff after 5 s of failures stays well under 10 s.
    let after = d
        .wait_state((s.instance_id, s.rev), Duration::from_secs(15), |s| {
            s.services.len() == 2
        })
        .await;
    assert_eq!(names(&after), ["after", "web"]);
    assert!(in_sync(&d), "recovered watches show in sync again");
    assert!(
        d.log_text().contains("watch error"),
        "outage not logged:\n{}",
        d.log_text()
    );
}

/// The value of `ebpf_kube_proxy_rejected_objects_total` for `reason` on
/// the kube source, once it is at least `min` (bounded wait: the counter
/// moves a moment after the source logged the object).
async fn rejected(d: &Daemon, reason: &str, min: f64) -> f64 {
    let series =
        format!("ebpf_kube_proxy_rejected_objects_total{{reason=\"{reason}\",source=\"kube\"}}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let m = common::get(d.metrics, "/metrics").text();
        let v =
            common::metric_value(&m, &series).unwrap_or_else(|| panic!("{series} missing in\n{m}"));
        if v >= min || Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn cluster_ip(s: &State, name: &str) -> String {
    let svc = s
        .services
        .iter()
        .filter_map(|s| s.service.as_ref())
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("{name} missing: {:?}", names(s)));
    svc.ips.as_ref().unwrap().cluster_ips.as_ref().unwrap().v4[0].clone()
}

/// Waits (bounded) until the daemon's log holds `needle`.
async fn wait_log(d: &Daemon, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.log_text().contains(needle) {
        assert!(
            Instant::now() < deadline,
            "{needle:?} not logged; log:\n{}",
            d.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Forces a relist: while no watch is open, `during` writes to the API
/// server, whose history is then compacted (every watch gets 410 Gone).
fn relist_with(api: &FakeApiServer, during: impl FnOnce(&FakeApiServer)) {
    api.set_down(true);
    during(api);
    api.compact();
    api.set_down(false);
}

async fn a_relist_takes_in_only_what_changed_while_the_watch_was_down(wire: Wire) {
    let services: Vec<(String, String)> = (0..20)
        .map(|i| (format!("svc-{i:02}"), format!("10.96.0.{}", 10 + i)))
        .collect();
    let refs: Vec<(&str, &str)> = services
        .iter()
        .map(|(n, ip)| (n.as_str(), ip.as_str()))
        .collect();
    let (api, d, s) = common::kube_daemon_with(&refs, wire).await;
    assert_eq!(s.services.len(), 20);

    relist_with(&api, |api| {
        api.apply(service("default", "svc-01", "10.96.1.1"));
        api.delete("Service", "default", "svc-02");
        api.apply(service("default", "svc-new", "10.96.1.2"));
    });

    let after = d
        .wait_state((s.instance_id, s.rev), Duration::from_secs(10), |s| {
            names(s).contains(&"svc-new".to_owned())
        })
        .await;
    let n = names(&after);
    assert_eq!(n.len(), 20, "{n:?}");
    assert!(!n.contains(&"svc-02".to_owned()), "{n:?}");
    assert_eq!(cluster_ip(&after, "svc-01"), "10.96.1.1");
    assert_eq!(cluster_ip(&after, "svc-03"), "10.96.0.13");
    // The 18 Services listed at the version the daemon has were counted,
    // not decoded again.
    wait_log(
        &d,
        "relisted resource=\"services\" changed=2 deleted=1 unchanged=18",
    )
    .await;
}

async fn a_relist_keeps_the_last_good_version_of_an_object_now_invalid(wire: Wire) {
    let (api, d, s) =
        common::kube_daemon_with(&[("keep", "10.96.0.10"), ("gone", "10.96.0.11")], wire).await;
    assert_eq!(names(&s), ["gone", "keep"]);

    relist_with(&api, |api| {
        // A new version the API server should have refused: a protocol
        // no proxy knows, and another address.
        let mut bad = service("default", "keep", "10.96.0.99");
        bad["spec"]["ports"][0]["protocol"] = json!("ICMP");
        api.apply(bad);
        api.delete("Service", "default", "gone");
        api.apply(service("default", "new", "10.96.0.12"));
    });

    let after = d
        .wait_state((s.instance_id, s.rev), Duration::from_secs(10), |s| {
            names(s).contains(&"new".to_owned())
        })
        .await;
    assert_eq!(
        names(&after),
        ["keep", "new"],
        "the relist's other changes land, the invalid object stays; log:\n{}",
        d.log_text()
    );
    assert_eq!(
        cluster_ip(&after, "keep"),
        "10.96.0.10",
        "last good version"
    );
    wait_log(&d, "Service default/keep: spec.ports[0].protocol").await;
    assert_eq!(rejected(&d, "invalid_object", 1.0).await, 1.0);
}

async fn deleting_an_object_whose_current_version_is_invalid_removes_it(wire: Wire) {
    let (api, d, s) =
        common::kube_daemon_with(&[("web", "10.96.0.10"), ("api", "10.96.0.11")], wire).await;
    assert_eq!(names(&s), ["api", "web"]);
    assert_eq!(
        rejected(&d, "invalid_object", 0.0).await,
        0.0,
        "the series starts at 0"
    );

    let mut bad = service("default", "web", "10.96.0.10");
    bad["spec"]["ports"][0]["port"] = json!(70000);
    api.apply(bad);
    wait_log(&d, "Service default/web: spec.ports[0].port: 70000").await;
    assert_eq!(rejected(&d, "invalid_object", 1.0).await, 1.0);

    api.delete("Service", "default", "web");
    let after = d
        .wait_state((s.instance_id, s.rev), Duration::from_secs(5), |s| {
            names(s) == ["api"]
        })
        .await;
    assert!(after.rev > s.rev);
}

async fn an_undecodable_service_does_not_stall_the_others(wire: Wire) {
    let (api, d, s) = common::kube_daemon_with(&[("web", "10.96.0.10")], wire).await;
    assert_eq!(
        rejected(&d, "undecodable", 0.0).await,
        0.0,
        "the series starts at 0"
    );

    // No typed client can read these: a port given as a string, a list
    // given as a string.
    let mut eighty = service("default", "bad", "10.96.0.20");
    eighty["spec"]["ports"][0]["port"] = json!("eighty");
    api.apply(eighty);
    let mut scalar = service("default", "worse", "10.96.0.21");
    scalar["spec"]["ports"] = json!("x");
    api.apply(scalar);
    api.apply(service("default", "after", "10.96.0.11"));
    let s2 = d
        .wait_state((s.instance_id, s.rev), Duration::from_secs(5), |s| {
            names(s).contains(&"after".to_owned())
        })
        .await;
    assert_eq!(names(&s2), ["after", "web"]);
    wait_log(&d, "Service default/bad: ").await;
    wait_log(&d, "Service default/worse: ").await;
    let counted = rejected(&d, "undecodable", 2.0).await;
    assert_eq!(counted, 2.0, "one each");

    // A relist lists them again: it must not fail for every other object.
    relist_with(&api, |api| {
        api.apply(service("default", "later", "10.96.0.12"))
    });
    let s3 = d
        .wait_state((s2.instance_id, s2.rev), Duration::from_secs(10), |s| {
            names(s).contains(&"later".to_owned())
        })
        .await;
    assert_eq!(names(&s3), ["after", "later", "web"]);
    assert_eq!(
        rejected(&d, "undecodable", 4.0).await,
        4.0,
        "once more each"
    );
}

/// An API server answering a list from its watch cache ignores `limit`:
/// the whole list comes in one piece. Past 8 MB of objects' text waiting
/// to be checked on other threads, the source checks the rest as it reads
/// them. Every object arrives whichever way it was checked, and a refused
/// one is counted at either end of the list.
async fn a_twelve_megabyte_list_in_one_piece_syncs_whole(wire: Wire) {
    let api = FakeApiServer::start().await;
    api.set_unpaged(true);
    // What `kubectl apply` keeps of each object: 24 KiB a slice here,
    // 12 MB over the 500.
    let applied = "x".repeat(24 << 10);
    let service_ip = |i: u32| format!("10.96.{}.{}", i / 250, i % 250 + 1);
    for i in 0..500u32 {
        let name = format!("svc-{i:03}");
        api.apply(service("bulk", &name, &service_ip(i)));
        let ips: Vec<String> = (1..=4)
            .map(|j| format!("10.{}.{}.{j}", 100 + i / 250, i % 250))
            .collect();
        let mut s = slice("bulk", &name, &ips);
        s["metadata"]["annotations"] =
            json!({"kubectl.kubernetes.io/last-applied-configuration": applied});
        api.apply(s);
    }
    // Refused: the first slice listed (its text waits) and the last
    // (checked as it is read).
    for (i, name) in [(500, "aaa"), (501, "zzz")] {
        api.apply(service("bulk", name, &service_ip(i)));
        let mut bad = slice("bulk", name, &["10.200.0.1".into()]);
        bad["ports"][0]["port"] = json!("eighty");
        api.apply(bad);
    }
    api.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}));
    let d = Daemon::start_on(&api, wire);

    let s = d
        .wait_state((0, 0), Duration::from_secs(30), |s| s.services.len() == 502)
        .await;
    wire.check(&api);
    for svc in &s.services {
        let name = &svc.service.as_ref().unwrap().name;
        let want = if name.starts_with("svc-") { 4 } else { 0 };
        assert_eq!(svc.endpoints.len(), want, "{name}");
    }
    let last = s
        .services
        .iter()
        .find(|x| x.service.as_ref().unwrap().name == "svc-499")
        .unwrap();
    let ips: Vec<&str> = last.endpoints.iter().map(|e| e.ip.as_str()).collect();
    assert_eq!(
        ips,
        [
            "10.101.249.1",
            "10.101.249.2",
            "10.101.249.3",
            "10.101.249.4"
        ]
    );
    assert_eq!(rejected(&d, "undecodable", 2.0).await, 2.0);
    wait_log(&d, "EndpointSlice bulk/aaa-abc: ").await;
    wait_log(&d, "EndpointSlice bulk/zzz-abc: ").await;
}

/// CVE-2021-29923 ("IPv4 Service Type ClusterIP with leading zeros should
/// work interpreted as decimal"): the API server keeps legacy addresses
/// such as `10.96.0.010`; kube-proxy reads every address and CIDR of a
/// Service, an EndpointSlice and a Node with leading zeros as decimal.
/// They are served, in canonical form.
async fn addresses_with_leading_zeros_are_read_as_decimal(wire: Wire) {
    let api = FakeApiServer::start().await;
    let mut svc = service("default", "web", "10.96.0.010");
    svc["spec"]["type"] = json!("LoadBalancer");
    svc["spec"]["ports"][0]["nodePort"] = json!(30080);
    svc["spec"]["externalIPs"] = json!(["192.0.2.010"]);
    svc["spec"]["loadBalancerSourceRanges"] = json!(["010.0.0.0/08"]);
    svc["status"] = json!({"loadBalancer": {"ingress": [{"ip": "198.51.100.007"}]}});
    api.apply(svc);
    api.apply(slice("default", "web", &["10.244.2.001".into()]));
    api.apply(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "n1"},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.001.002"}]}}));
    let d = Daemon::start_on(&api, wire);

    let s = d
        .wait_state((0, 0), Duration::from_secs(10), |_| true)
        .await;
    wire.check(&api);
    assert_eq!(names(&s), ["web"], "log:\n{}", d.log_text());
    assert_eq!(cluster_ip(&s, "web"), "10.96.0.10");
    let web = s.services[0].service.as_ref().unwrap();
    let ips = web.ips.as_ref().unwrap();
    assert_eq!(ips.external_ips.as_ref().unwrap().v4, ["192.0.2.10"]);
    assert_eq!(ips.load_balancer_ips.as_ref().unwrap().v4, ["198.51.100.7"]);
    assert_eq!(web.load_balancer_source_ranges, ["10.0.0.0/8"]);
    assert_eq!(s.services[0].endpoints[0].ip, "10.244.2.1");
    assert!(
        !d.log_text().contains("not a valid IP"),
        "an address was refused; log:\n{}",
        d.log_text()
    );
}
