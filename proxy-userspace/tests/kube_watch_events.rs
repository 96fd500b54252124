//! Every watch event the API server sends is accounted for, and an API
//! outage is logged, not flooded: the daemon on the kube source against
//! the fake API server.

mod common;

use std::time::{Duration, Instant};

use common::fake_apiserver::service_object as service;
use common::{service_names as names, Daemon, Wire};

on_each_wire!(
    a_watch_event_of_an_unknown_type_is_logged_once_and_counted,
    an_api_server_outage_writes_a_few_lines_not_a_flood,
);

/// `ebpf_kube_proxy_rejected_objects_total{reason, source="kube"}` once it
/// is at least `min` (bounded wait).
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

/// A watch event of a type the API does not define is logged once with
/// its type and counted as `undecodable`; it changes nothing, is not a
/// watch error (no staleness, no backoff), and the events after it flow.
async fn a_watch_event_of_an_unknown_type_is_logged_once_and_counted(wire: Wire) {
    let (api, d, s) = common::kube_daemon_with(&[("web", "10.96.0.10")], wire).await;
    assert_eq!(rejected(&d, "undecodable", 0.0).await, 0.0);

    api.send_event("RESYNC", service("default", "ghost", "10.96.0.30"));
    api.apply(service("default", "after", "10.96.0.11"));
    let s2 = d
        .wait_state((s.instance_id, s.rev), Duration::from_secs(10), |s| {
            names(s).contains(&"after".to_owned())
        })
        .await;
    assert_eq!(
        names(&s2),
        ["after", "web"],
        "the unknown event changed the state"
    );
    assert_eq!(rejected(&d, "undecodable", 1.0).await, 1.0, "counted once");
    let log = d.log_text();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("RESYNC")).collect();
    assert_eq!(lines.len(), 1, "logged once with its type:\n{log}");
    assert!(
        lines[0].contains("unknown type") && lines[0].contains("services"),
        "{}",
        lines[0]
    );
    assert!(
        !log.contains("watch error"),
        "reported as a watch error:\n{log}"
    );
}

/// During an API server outage the log says so a few times, not once per
/// failed request of every watcher (41 lines in 20 s before: kube-rs'
/// error line for each request and the source's warning for each retry).
/// The tests run the daemon with `RUST_LOG=info`.
async fn an_api_server_outage_writes_a_few_lines_not_a_flood(wire: Wire) {
    let (api, d, s) = common::kube_daemon_with(&[("web", "10.96.0.10")], wire).await;
    let before = d.log_text().lines().count();
    api.set_down(true);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let log = d.log_text();
    let during: Vec<&str> = log.lines().skip(before).collect();
    api.set_down(false);
    api.apply(service("default", "after", "10.96.0.11"));
    // Backoff after 20 s of failures: the next try may be 10–20 s away.
    d.wait_state((s.instance_id, s.rev), Duration::from_secs(30), |s| {
        s.services.len() == 2
    })
    .await;
    assert!(
        during.len() <= 8,
        "{} lines in 20 s of outage:\n{}",
        during.len(),
        during.join("\n")
    );
}
