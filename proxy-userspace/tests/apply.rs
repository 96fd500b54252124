//! The apply coordinator through the real binary: a failed apply is
//! retried on the `--sync-period` timer, with a full sync, even when no new
//! state arrives.

mod common;

use std::ffi::OsStr;
use std::time::{Duration, Instant};

use common::{get, manifests_dir, metric_value, service, slice, Daemon};

const FAIL_APPLIES: &str = "EBPF_KUBE_PROXY_TEST_FAIL_APPLIES";

#[test]
fn a_failed_apply_is_retried_after_the_sync_period_without_a_new_state() {
    let started = Instant::now();
    let d = Daemon::start_in_env(
        manifests_dir(&[
            ("svc.yaml", &service("default", "web", "10.96.0.10")),
            ("eps.yaml", &slice("default", "web", &["10.0.0.1"])),
        ]),
        &["--sync-period", "1s"],
        &[(FAIL_APPLIES, OsStr::new("2"))],
    );
    let errors = "ebpf_kube_proxy_datapath_apply_errors_total{mode=\"none\"}";
    let synced = "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}";
    // Bounded: 150 × 100 ms.
    let mut seen_first_failure = None;
    for _ in 0..150 {
        let text = get(d.metrics, "/metrics").text();
        let failed = metric_value(&text, errors).unwrap_or(0.0);
        let last = metric_value(&text, synced).unwrap_or(0.0);
        if failed >= 1.0 && seen_first_failure.is_none() {
            seen_first_failure = Some(Instant::now());
        }
        if last > 0.0 {
            assert_eq!(failed, 2.0, "both hooked applies failed first:\n{text}");
            // Fails at once, retries after 1 s (fails), then after 2 s more.
            let first = seen_first_failure.expect("a failure before the success");
            assert!(
                first.elapsed() >= Duration::from_millis(2500),
                "retried too early: {:?} after the first failure",
                first.elapsed()
            );
            let log = d.log_text();
            assert_eq!(
                log.matches("datapath apply failed; retrying").count(),
                2,
                "{log}"
            );
            assert!(started.elapsed() < Duration::from_secs(15));
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "no successful apply within 15 s; log:\n{}\nmetrics:\n{}",
        d.log_text(),
        get(d.metrics, "/metrics").text()
    );
}
