//! Health of the real daemon: component `/livez` `/readyz` and SLIs on the
//! status server (SPEC §3), kube-proxy's `/healthz` `/livez` on the health
//! server (SPEC §4), over raw HTTP/1.1.

mod common;

use std::time::{Duration, Instant};

use common::status::*;
use common::{get, http, manifests_dir, metric_value, write_atomic, Daemon};

// ------------------------------------------------ component health, SLIs

#[test]
fn component_health_endpoints_pass_once_synced() {
    let d = start_web(&[]);
    wait_ready(&d);
    let checks = [
        ("livez", &["ping", "datapath-progress"][..]),
        (
            "readyz",
            &[
                "ping",
                "informer-sync",
                "datapath-synced",
                "localnet",
                "shutdown",
            ][..],
        ),
        ("healthz", &["ping", "datapath-progress"][..]),
    ];
    for (name, list) in checks {
        let r = get(d.metrics, &format!("/{name}"));
        assert_eq!((r.status, r.text().as_str()), (200, "ok"), "/{name}");
        assert_eq!(r.header("content-type"), Some(TEXT_PLAIN));
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));

        let mut want: String = list.iter().map(|c| format!("[+]{c} ok\n")).collect();
        want.push_str(&format!("{name} check passed\n"));
        let r = get(d.metrics, &format!("/{name}?verbose"));
        assert_eq!((r.status, r.text()), (200, want), "/{name}?verbose");

        for check in list {
            let r = get(d.metrics, &format!("/{name}/{check}"));
            assert_eq!(
                (r.status, r.text().as_str()),
                (200, "ok"),
                "/{name}/{check}"
            );
        }
        let r = get(d.metrics, &format!("/{name}/unknown"));
        assert_eq!((r.status, r.text().as_str()), (404, "404 page not found\n"));
    }

    let r = get(d.metrics, "/readyz?verbose&exclude=informer-sync");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.text(),
        "[+]ping ok\n[+]informer-sync excluded: ok\n[+]datapath-synced ok\n[+]localnet ok\n\
         [+]shutdown ok\nreadyz check passed\n"
    );
    let r = get(d.metrics, "/livez?verbose=1&exclude=nope");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.text(),
        "[+]ping ok\n[+]datapath-progress ok\n\
         warn: some health checks cannot be excluded: no matches for \"nope\"\nlivez check passed\n"
    );
    assert_eq!(
        get(d.metrics, "/livez/informer-sync").status,
        404,
        "a check of another endpoint"
    );
}

#[test]
fn a_held_back_source_fails_readiness_but_not_liveness() {
    let dir = manifests_dir(&[("a.yaml", &web())]);
    let hold = dir.path().join("hold-source");
    std::fs::write(&hold, "").unwrap();
    let d = Daemon::start_in_env(dir, &[], &[(HOLD_SOURCE, hold.as_os_str())]);

    let r = get(d.metrics, "/readyz");
    assert_eq!(r.status, 500);
    assert_eq!(
        r.text(),
        "[+]ping ok\n[-]informer-sync failed: reason withheld\n\
         [-]datapath-synced failed: reason withheld\n[+]localnet ok\n[+]shutdown ok\n\
         readyz check failed\n",
        "failure output is verbose and withholds reasons"
    );
    let r = get(d.metrics, "/readyz/informer-sync");
    assert_eq!(r.status, 500);
    assert_eq!(
        r.text(),
        "internal server error: the file source has not finished its initial list\n"
    );
    let r = get(d.metrics, "/livez");
    assert_eq!((r.status, r.text().as_str()), (200, "ok"));

    // Excluding the failing checks makes readiness pass.
    let r = get(
        d.metrics,
        "/readyz?verbose&exclude=informer-sync&exclude=datapath-synced",
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.text(),
        "[+]ping ok\n[+]informer-sync excluded: ok\n[+]datapath-synced excluded: ok\n\
         [+]localnet ok\n[+]shutdown ok\nreadyz check passed\n"
    );

    let slis = get(d.metrics, "/metrics/slis").text();
    for line in [
        "kubernetes_healthcheck{name=\"informer-sync\",type=\"readyz\"} 0\n",
        "kubernetes_healthchecks_total{name=\"informer-sync\",status=\"error\",type=\"readyz\"} 1\n",
        "kubernetes_healthchecks_total{name=\"localnet\",status=\"success\",type=\"readyz\"} 2\n",
    ] {
        assert!(slis.contains(line), "{line} missing in\n{slis}");
    }
    assert_eq!(
        metric_value(
            &metrics_text(&d),
            "ebpf_kube_proxy_source_synced{resource=\"services\",source=\"file\"}"
        ),
        Some(0.0)
    );

    std::fs::remove_file(&hold).unwrap();
    wait_ready(&d);
    assert_eq!(
        metric_value(
            &metrics_text(&d),
            "ebpf_kube_proxy_source_synced{resource=\"services\",source=\"file\"}"
        ),
        Some(1.0)
    );
}

#[test]
fn sigterm_fails_readiness_on_shutdown_at_once() {
    let dir = manifests_dir(&[("a.yaml", &web())]);
    let mut d = Daemon::start_in_env(dir, &[], &[(SHUTDOWN_DELAY, std::ffi::OsStr::new("3s"))]);
    wait_ready(&d);
    d.sigterm();
    let r = wait_for(
        "/readyz to fail after SIGTERM",
        Duration::from_secs(2),
        || {
            let r = get(d.metrics, "/readyz");
            (r.status == 500).then_some(r)
        },
    );
    assert_eq!(
        r.text(),
        "[+]ping ok\n[+]informer-sync ok\n[+]datapath-synced ok\n[+]localnet ok\n\
         [-]shutdown failed: reason withheld\nreadyz check failed\n"
    );
    let r = get(d.metrics, "/readyz/shutdown");
    assert_eq!(
        (r.status, r.text().as_str()),
        (500, "internal server error: process is shutting down\n")
    );
    assert_eq!(
        get(d.metrics, "/livez").status,
        200,
        "liveness is unaffected"
    );
    assert!(d.wait_exit(Duration::from_secs(15)).success());
}

#[test]
fn slis_record_each_root_request_and_reset_on_delete() {
    let d = start_web(&[]);
    wait_ready(&d);
    let r = http(d.metrics, "DELETE", "/metrics/slis", &[]);
    assert_eq!((r.status, r.text().as_str()), (200, "metrics reset\n"));
    let r = get(d.metrics, "/metrics/slis");
    assert_eq!(r.header("content-type"), Some(EXPOSITION));
    assert_eq!(r.text(), "", "both families are empty after a reset");

    assert_eq!(get(d.metrics, "/readyz").status, 200);
    let checks = [
        "datapath-synced",
        "informer-sync",
        "localnet",
        "ping",
        "shutdown",
    ];
    let mut want = help_and_type(
        "kubernetes_healthcheck",
        "[STABLE] This metric records the result of a single healthcheck.",
        "gauge",
    );
    for c in checks {
        want.push_str(&format!(
            "kubernetes_healthcheck{{name=\"{c}\",type=\"readyz\"}} 1\n"
        ));
    }
    want.push_str(&help_and_type(
        "kubernetes_healthchecks_total",
        "[STABLE] This metric records the results of all healthcheck.",
        "counter",
    ));
    for c in checks {
        want.push_str(&format!(
            "kubernetes_healthchecks_total{{name=\"{c}\",status=\"success\",type=\"readyz\"}} 1\n"
        ));
    }
    assert_eq!(get(d.metrics, "/metrics/slis").text(), want);
    assert!(
        metrics_text(&d).contains(&want),
        "/metrics carries the SLI families too"
    );

    // Excluded checks and per-check paths record nothing.
    assert_eq!(get(d.metrics, "/readyz?exclude=localnet").status, 200);
    assert_eq!(get(d.metrics, "/readyz/localnet").status, 200);
    assert_eq!(get(d.metrics, "/livez").status, 200);
    let slis = get(d.metrics, "/metrics/slis").text();
    let total = |name: &str, ty: &str| {
        metric_value(
            &slis,
            &format!(
                "kubernetes_healthchecks_total{{name=\"{name}\",status=\"success\",type=\"{ty}\"}}"
            ),
        )
    };
    assert_eq!(total("ping", "readyz"), Some(2.0));
    assert_eq!(total("localnet", "readyz"), Some(1.0));
    assert_eq!(total("ping", "livez"), Some(1.0));
    assert_eq!(total("datapath-progress", "livez"), Some(1.0));
}

// ------------------------------------------------- kube-proxy health 10256

fn assert_proxy_health_headers(r: &common::HttpResponse) {
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
}

#[test]
fn proxy_health_server_answers_kube_proxy_json() {
    let d = start_web(&[]);
    wait_ready(&d);
    let r = get(d.healthz, "/healthz");
    assert_eq!(r.status, 200);
    assert_proxy_health_headers(&r);
    let body = r.text();
    assert!(body.starts_with(r#"{"lastUpdated":""#), "{body}");
    let keys = [
        "\"currentTime\"",
        "\"nodeEligible\"",
        "\"healthy\"",
        "\"status\"",
    ];
    let positions: Vec<usize> = keys.iter().map(|k| body.find(k).unwrap()).collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "key order: {body}"
    );
    assert!(!body.ends_with('\n'));
    let v = json(&body);
    assert_eq!(v["nodeEligible"], true);
    assert_eq!(v["healthy"], true);
    for t in [
        &v["lastUpdated"],
        &v["currentTime"],
        &v["status"]["IPv4"]["lastUpdated"],
    ] {
        assert!(t.as_str().unwrap().ends_with('Z'), "{t}");
    }
    assert_eq!(v["status"]["IPv4"]["healthy"], true);
    assert_eq!(v["status"]["IPv6"]["healthy"], true);

    let r = http(d.healthz, "POST", "/livez?x=1", &[]);
    assert_eq!(r.status, 200, "any method, any query");
    assert_proxy_health_headers(&r);
    let body = r.text();
    assert!(body.starts_with(r#"{"lastUpdated":""#), "{body}");
    assert!(!body.contains("nodeEligible"), "{body}");

    get(d.healthz, "/healthz");
    let m = metrics_text(&d);
    assert_eq!(
        metric_value(&m, "kubeproxy_proxy_healthz_total{code=\"200\"}"),
        Some(2.0)
    );
    assert_eq!(
        metric_value(&m, "kubeproxy_proxy_livez_total{code=\"200\"}"),
        Some(1.0)
    );
}

#[test]
fn a_stalled_datapath_turns_proxy_health_503_and_recovers() {
    let dir = manifests_dir(&[("a.yaml", &web())]);
    let stall = dir.path().join("stall-datapath");
    std::fs::write(&stall, "").unwrap();
    let started = Instant::now();
    let d = Daemon::start_in_env(
        dir,
        &["--sync-period", "1s"],
        &[(STALL_DATAPATH, stall.as_os_str())],
    );
    assert_eq!(
        get(d.healthz, "/healthz").status,
        200,
        "healthy within the timeout"
    );

    let r = wait_for("/healthz 503", Duration::from_secs(10), || {
        let r = get(d.healthz, "/healthz");
        (r.status == 503).then_some(r)
    });
    assert!(
        started.elapsed() > Duration::from_secs(2),
        "timeout = 2 × sync period"
    );
    assert_proxy_health_headers(&r);
    let v = json(&r.text());
    assert_eq!(v["healthy"], false);
    assert_eq!(v["lastUpdated"], "0001-01-01T00:00:00Z", "never synced");
    assert!(v.get("status").is_none(), "no family has synced: {v}");
    let r = get(d.healthz, "/livez");
    assert_eq!(r.status, 503);
    assert_eq!(json(&r.text())["healthy"], false);
    let r = get(d.metrics, "/livez");
    assert_eq!(
        (r.status, r.text().as_str()),
        (
            500,
            "[+]ping ok\n[-]datapath-progress failed: reason withheld\nlivez check failed\n"
        )
    );

    std::fs::remove_file(&stall).unwrap();
    let r = wait_for("/healthz 200 again", Duration::from_secs(5), || {
        let r = get(d.healthz, "/healthz");
        (r.status == 200).then_some(r)
    });
    let v = json(&r.text());
    assert_eq!(v["healthy"], true);
    assert_eq!(v["status"]["IPv4"]["healthy"], true);
    assert_eq!(get(d.healthz, "/livez").status, 200);
    assert_eq!(get(d.metrics, "/livez").status, 200);
    let m = metrics_text(&d);
    assert!(metric_value(&m, "kubeproxy_proxy_healthz_total{code=\"503\"}").unwrap() >= 1.0);
    assert!(metric_value(&m, "kubeproxy_proxy_healthz_total{code=\"200\"}").unwrap() >= 2.0);
}

fn node(taints: &str) -> String {
    format!("apiVersion: v1\nkind: Node\nmetadata: {{name: n1}}\nspec: {{taints: [{taints}]}}\n")
}

#[test]
fn autoscaler_taint_makes_the_node_ineligible_for_healthz_only() {
    let dir = manifests_dir(&[
        ("a.yaml", &web()),
        (
            "node.yaml",
            &node("{key: ToBeDeletedByClusterAutoscaler, value: '1700000000', effect: NoSchedule}"),
        ),
    ]);
    let d = Daemon::start_in(dir, &[]);
    wait_ready(&d);
    let r = get(d.healthz, "/healthz");
    assert_eq!(r.status, 503);
    let body = r.text();
    assert!(
        body.contains(r#""nodeEligible":false,"healthy":true"#),
        "{body}"
    );
    let r = get(d.healthz, "/livez");
    assert_eq!(r.status, 200, "node deletion never fails liveness");

    write_atomic(
        &d.manifest("node.yaml"),
        &node("{key: other, effect: NoSchedule}"),
    );
    let r = wait_for(
        "/healthz 200 without the taint",
        Duration::from_secs(5),
        || {
            let r = get(d.healthz, "/healthz");
            (r.status == 200).then_some(r)
        },
    );
    assert!(r.text().contains(r#""nodeEligible":true"#));
    let m = metrics_text(&d);
    assert!(metric_value(&m, "kubeproxy_proxy_healthz_total{code=\"503\"}").unwrap() >= 1.0);
    assert!(metric_value(&m, "kubeproxy_proxy_healthz_total{code=\"200\"}").unwrap() >= 1.0);
}
