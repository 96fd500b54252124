//! The status surfaces of the real daemon over real HTTP (SPEC §1–§5, the
//! §9 checklist): `/statusz`, `/flagz`, component health and SLIs, `/metrics`
//! and `/proxyMode` on the status server, kube-proxy's `/healthz` `/livez`
//! on the health server. Requests are raw HTTP/1.1 so headers and bytes are
//! seen exactly as a client sees them.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{get, http, manifests_dir, service, slice, write_atomic, Daemon, BIN};

const WARNING: &str = "Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only.";
/// Longest first, so that `: ` is not taken for `:`.
const DELIMITERS: [&str; 4] = [": ", ":", "=", " "];
const PATHS: &str = "/flagz /healthz /livez /metrics /proxyMode /readyz /statusz";
const TEXT_PLAIN: &str = "text/plain; charset=utf-8";
const EXPOSITION: &str = "text/plain; version=0.0.4; charset=utf-8";
const STATUSZ_JSON: &str = "application/json;g=config.k8s.io;v=v1beta1;as=Statusz";

// Test hooks of the daemon (environment variables, not flags).
const STALL_DATAPATH: &str = "EBPF_KUBE_PROXY_TEST_STALL_DATAPATH";
const HOLD_SOURCE: &str = "EBPF_KUBE_PROXY_TEST_HOLD_SOURCE";
const SHUTDOWN_DELAY: &str = "EBPF_KUBE_PROXY_TEST_SHUTDOWN_DELAY";

fn web() -> String {
    format!(
        "{}---\n{}",
        service("prod", "web", "10.96.0.10"),
        slice("prod", "web", &["10.244.2.1", "10.244.2.2"])
    )
}

fn start_web(extra: &[&str]) -> Daemon {
    Daemon::start_in(manifests_dir(&[("a.yaml", &web())]), extra)
}

/// Polls `probe` every 50 ms until it yields, for at most `timeout`.
fn wait_for<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_ready(d: &Daemon) {
    wait_for("/readyz to pass", Duration::from_secs(10), || {
        (get(d.metrics, "/readyz").status == 200).then_some(())
    });
}

fn metrics_text(d: &Daemon) -> String {
    get(d.metrics, "/metrics").text()
}

/// The value of one exact series (`name{labels}`) in an exposition.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn help_and_type(name: &str, help: &str, kind: &str) -> String {
    format!("# HELP {name} {help}\n# TYPE {name} {kind}\n")
}

/// `Label{D} value` → (D, value).
fn labelled<'a>(line: &'a str, label: &str) -> (&'static str, &'a str) {
    let rest = line
        .strip_prefix(label)
        .unwrap_or_else(|| panic!("{line:?} does not start with {label:?}"));
    for d in DELIMITERS {
        if let Some(value) = rest.strip_prefix(d).and_then(|r| r.strip_prefix(' ')) {
            if !value.starts_with(' ') {
                return (d, value);
            }
        }
    }
    panic!("{line:?}: no delimiter from {DELIMITERS:?} followed by one space");
}

/// Go's `time.UnixDate`: `Mon Jan _2 15:04:05 UTC 2006`.
fn is_go_unix_date(s: &str) -> bool {
    const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    s.len() == 28
        && DAYS.contains(&&s[0..3])
        && b[3] == b' '
        && MONTHS.contains(&&s[4..7])
        && b[7] == b' '
        && (b[8] == b' ' || b[8].is_ascii_digit())
        && digits(9..10)
        && b[10] == b' '
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && &s[19..24] == " UTC "
        && digits(24..28)
}

/// `N hr MM min SS sec`.
fn is_uptime(s: &str) -> bool {
    let parts: Vec<&str> = s.split(' ').collect();
    let num = |p: &str, width: Option<usize>| {
        !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()) && width.is_none_or(|w| p.len() == w)
    };
    parts.len() == 6
        && num(parts[0], None)
        && parts[1] == "hr"
        && num(parts[2], Some(2))
        && parts[3] == "min"
        && num(parts[4], Some(2))
        && parts[5] == "sec"
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

// ---------------------------------------------------------------- statusz

#[test]
fn statusz_text_page_has_the_spec_layout_and_a_delimiter_per_response() {
    let d = start_web(&[]);
    let head = format!("\nebpf-kube-proxy statusz\n{WARNING}\n\n");
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let r = get(d.metrics, "/statusz");
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some(TEXT_PLAIN));
        let body = r.text();
        let lines = body
            .strip_prefix(&head)
            .and_then(|b| b.strip_suffix('\n'))
            .unwrap_or_else(|| panic!("header or final newline missing:\n{body}"));
        let lines: Vec<&str> = lines.split('\n').collect();
        assert_eq!(lines.len(), 6, "{body}");
        let (d1, started) = labelled(lines[0], "Started");
        assert!(is_go_unix_date(started), "Started {started:?}");
        let (d2, up) = labelled(lines[1], "Up");
        assert!(is_uptime(up), "Up {up:?}");
        let (d3, rust) = labelled(lines[2], "Rust version");
        assert!(rust.starts_with("rustc 1."), "{rust}");
        let (d4, version) = labelled(lines[3], "Binary version");
        assert_eq!(version, env!("CARGO_PKG_VERSION"));
        assert_eq!(lines[4], "", "no emulation version: empty line");
        let (d5, paths) = labelled(lines[5], "Paths");
        assert_eq!(paths, PATHS);
        assert!(
            [d2, d3, d4, d5].iter().all(|x| *x == d1),
            "one delimiter per response:\n{body}"
        );
        seen.insert(d1);
    }
    assert!(
        seen.len() >= 2,
        "the delimiter is drawn per response; 40 answers all used {seen:?}"
    );
}

#[test]
fn statusz_serves_text_to_text_and_wildcard_accepts() {
    let d = start_web(&[]);
    for accept in [
        "text/plain",
        "*/*",
        "text/*",
        "application/json;v=foo;g=config.k8s.io;as=Statusz,*/*",
    ] {
        let r = http(d.metrics, "GET", "/statusz", &[("Accept", accept)]);
        assert_eq!(r.status, 200, "Accept: {accept}");
        assert_eq!(
            r.header("content-type"),
            Some(TEXT_PLAIN),
            "Accept: {accept}"
        );
        assert!(
            r.text().starts_with("\nebpf-kube-proxy statusz\n"),
            "Accept: {accept}"
        );
    }
}

#[test]
fn statusz_refuses_unacceptable_media_types_with_a_status() {
    let d = start_web(&[]);
    for accept in [
        "application/json",
        "application/json;g=config.k8s.io;v=v1beta1",
        "application/xml",
        "application/cbor",
    ] {
        let r = http(d.metrics, "GET", "/statusz", &[("Accept", accept)]);
        assert_eq!(r.status, 406, "Accept: {accept}");
        assert_eq!(r.header("content-type"), Some("application/json"));
        let body = r.text();
        assert!(
            body.starts_with(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"#
            ),
            "{body}"
        );
        let v = json(&body);
        assert_eq!(v["reason"], "NotAcceptable");
        assert_eq!(v["code"], 406);
        assert_eq!(
            v["message"],
            "only the following media types are accepted: text/plain, \
             application/json;g=config.k8s.io;v=v1beta1;as=Statusz, \
             application/json;g=config.k8s.io;v=v1alpha1;as=Statusz, \
             application/yaml;g=config.k8s.io;v=v1beta1;as=Statusz, \
             application/yaml;g=config.k8s.io;v=v1alpha1;as=Statusz"
        );
    }
}

#[test]
fn statusz_structured_json_and_yaml() {
    let d = start_web(&[]);
    let fetch = |accept: &str| http(d.metrics, "GET", "/statusz", &[("Accept", accept)]);

    let r = fetch(STATUSZ_JSON);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("warning"), None, "v1beta1 is not deprecated");
    let body = r.text();
    assert!(
        body.starts_with(r#"{"kind":"Statusz","apiVersion":"config.k8s.io/v1beta1","metadata":{"name":"ebpf-kube-proxy"},"startTime":""#),
        "{body}"
    );
    assert!(
        body.ends_with("}\n"),
        "compact JSON and one newline: {body:?}"
    );
    let keys = [
        "\"startTime\"",
        "\"uptimeSeconds\"",
        "\"binaryVersion\"",
        "\"paths\"",
    ];
    let positions: Vec<usize> = keys.iter().map(|k| body.find(k).unwrap()).collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "key order: {body}"
    );
    let v = json(&body);
    assert_eq!(
        v.as_object().unwrap().len(),
        7,
        "no goVersion, no emulationVersion: {body}"
    );
    let start = v["startTime"].as_str().unwrap();
    assert!(start.len() == 20 && start.ends_with('Z'), "{start}");
    assert_eq!(v["binaryVersion"], env!("CARGO_PKG_VERSION"));
    let paths: Vec<&str> = PATHS.split(' ').collect();
    assert_eq!(v["paths"], serde_json::json!(paths));
    let uptime = v["uptimeSeconds"].as_u64().unwrap();

    std::thread::sleep(Duration::from_millis(1100));
    let later = json(&fetch(STATUSZ_JSON).text());
    assert!(later["uptimeSeconds"].as_u64().unwrap() > uptime);
    assert_eq!(later["startTime"], v["startTime"]);

    let r = fetch("application/json;g=config.k8s.io;v=v1alpha1;as=Statusz");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("warning"),
        Some("299 - \"This version of the statusz endpoint is deprecated. Please use a newer version.\"")
    );
    assert_eq!(json(&r.text())["apiVersion"], "config.k8s.io/v1alpha1");

    let r = fetch("application/yaml;g=config.k8s.io;v=v1beta1;as=Statusz");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/yaml"));
    let yaml = r.text();
    assert!(
        yaml.starts_with("kind: Statusz\napiVersion: config.k8s.io/v1beta1\nmetadata:\n  name: ebpf-kube-proxy\nstartTime: "),
        "{yaml}"
    );
    assert!(yaml.contains("\npaths:\n- /flagz\n- /healthz\n"), "{yaml}");
}

#[test]
fn statusz_answers_get_and_head_only() {
    let d = start_web(&[]);
    for method in ["POST", "PUT", "DELETE"] {
        let r = http(d.metrics, method, "/statusz", &[]);
        assert_eq!(r.status, 405, "{method}");
        assert_eq!(r.header("allow"), Some("GET, HEAD"), "{method}");
    }
    let r = http(d.metrics, "HEAD", "/statusz", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some(TEXT_PLAIN));
}

// ------------------------------------------------------------------ flagz

/// Every daemon flag's long name, sorted: the set /flagz must show.
fn daemon_flag_names() -> Vec<String> {
    let command = <ebpf_kube_proxy::cli::DaemonFlags as clap::Args>::augment_args(
        clap::Command::new("flags"),
    );
    let mut names: Vec<String> = command
        .get_arguments()
        .map(|a| {
            a.get_long()
                .expect("every daemon flag has a long name")
                .to_owned()
        })
        .collect();
    names.sort();
    names
}

/// Parses a flagz text page into (name, value), checking the header, that
/// every flag appears once in byte order, and one delimiter for all lines.
fn parse_flagz(body: &str) -> Vec<(String, String)> {
    let head = format!("\nebpf-kube-proxy flagz\n{WARNING}\n");
    let lines = body
        .strip_prefix(&head)
        .and_then(|b| b.strip_suffix('\n'))
        .unwrap_or_else(|| panic!("flagz header or final newline missing:\n{body}"));
    let lines: Vec<&str> = lines.split('\n').collect();
    let names = daemon_flag_names();
    assert_eq!(lines.len(), names.len(), "one line per flag:\n{body}");
    // `v` is last in byte order and its value is a number: it fixes D.
    let v_line = lines.last().unwrap();
    let delimiter = DELIMITERS
        .into_iter()
        .find(|d| {
            v_line
                .strip_prefix("v")
                .and_then(|r| r.strip_prefix(d))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()))
        })
        .unwrap_or_else(|| panic!("no delimiter in {v_line:?}"));
    lines
        .iter()
        .zip(&names)
        .map(|(line, name)| {
            let value = line
                .strip_prefix(name.as_str())
                .and_then(|r| r.strip_prefix(delimiter))
                .unwrap_or_else(|| panic!("line {line:?} is not flag {name} with {delimiter:?}"));
            (name.clone(), value.to_owned())
        })
        .collect()
}

#[test]
fn flagz_shows_every_flag_once_with_its_effective_value_and_hides_secrets() {
    let d = start_web(&[
        "--sync-period",
        "90s",
        "--cluster-cidr",
        "10.244.0.0/16",
        "--nodeport-addresses",
        "10.0.0.0/8,192.168.0.0/16",
        "--master",
        "https://admin:s3cret@api.example:6443",
        "--v=2",
    ]);
    let r = get(d.metrics, "/flagz");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some(TEXT_PLAIN));
    let text = r.text();
    let flags = parse_flagz(&text);
    let value = |n: &str| flags.iter().find(|(k, _)| k == n).unwrap().1.as_str();
    // Command line over defaults, rendered as Go components do.
    assert_eq!(value("sync-period"), "1m30s");
    assert_eq!(value("cluster-cidr"), "10.244.0.0/16");
    assert_eq!(value("nodeport-addresses"), "[10.0.0.0/8,192.168.0.0/16]");
    assert_eq!(value("proxy-mode"), "none");
    assert_eq!(value("source"), "file");
    assert_eq!(value("hostname-override"), "n1");
    assert_eq!(value("metrics-bind-address"), d.metrics.to_string());
    assert_eq!(value("kubeconfig"), "", "unset: empty");
    assert_eq!(value("v"), "2");
    assert_eq!(
        value("master"),
        "CLASSIFIED",
        "a URL with user-info is sensitive"
    );

    assert_eq!(
        get(d.metrics, "/flagz").text(),
        text,
        "rendered once per process"
    );

    let accept = "application/json;g=config.k8s.io;v=v1beta1;as=Flagz";
    let r = http(d.metrics, "GET", "/flagz", &[("Accept", accept)]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let body = r.text();
    assert!(
        body.starts_with(r#"{"kind":"Flagz","apiVersion":"config.k8s.io/v1beta1","metadata":{"name":"ebpf-kube-proxy"},"flags":{"#),
        "{body}"
    );
    let structured: Vec<(String, String)> = json(&body)["flags"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(structured, flags, "JSON flags equal the text page");

    let r = http(
        d.metrics,
        "GET",
        "/flagz",
        &[(
            "Accept",
            "application/yaml;g=config.k8s.io;v=v1alpha1;as=Flagz",
        )],
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("warning"),
        Some("299 - \"This version of the flagz endpoint is deprecated. Please use a newer version.\"")
    );
    let yaml = r.text();
    assert!(yaml.contains("\n  master: CLASSIFIED\n"), "{yaml}");

    for shown in [&text, &body, &yaml] {
        assert!(!shown.contains("s3cret"), "secret leaked:\n{shown}");
    }
}

#[test]
fn flagz_shows_config_file_values_and_command_line_overrides() {
    let dir = manifests_dir(&[("a.yaml", &web())]);
    let config = dir.path().join("kube-proxy.conf");
    std::fs::write(
        &config,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
         clusterCIDR: 10.244.0.0/16\nsyncPeriod: 45s\nnodePortAddresses: [10.0.0.0/8]\n",
    )
    .unwrap();
    let config_arg = config.display().to_string();
    let d = Daemon::start_in(dir, &["--config", &config_arg, "--sync-period", "2m"]);
    let flags = parse_flagz(&get(d.metrics, "/flagz").text());
    let value = |n: &str| flags.iter().find(|(k, _)| k == n).unwrap().1.as_str();
    assert_eq!(value("cluster-cidr"), "10.244.0.0/16", "from the file");
    assert_eq!(value("nodeport-addresses"), "[10.0.0.0/8]", "from the file");
    assert_eq!(value("sync-period"), "2m0s", "the command line wins");
    assert_eq!(value("config"), config_arg);
}

#[test]
fn flagz_refuses_bare_json_and_the_statusz_kind() {
    let d = start_web(&[]);
    for accept in [
        "application/json",
        "application/json;g=config.k8s.io;v=v1beta1;as=Statusz",
        "application/cbor",
    ] {
        let r = http(d.metrics, "GET", "/flagz", &[("Accept", accept)]);
        assert_eq!(r.status, 406, "Accept: {accept}");
        let v = json(&r.text());
        assert_eq!(v["reason"], "NotAcceptable");
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("application/json;g=config.k8s.io;v=v1beta1;as=Flagz"),
            "{v}"
        );
    }
    assert_eq!(http(d.metrics, "POST", "/flagz", &[]).status, 405);
}

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
        metric(
            &metrics_text(&d),
            "ebpf_kube_proxy_source_synced{resource=\"services\",source=\"file\"}"
        ),
        Some(0.0)
    );

    std::fs::remove_file(&hold).unwrap();
    wait_ready(&d);
    assert_eq!(
        metric(
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
        metric(
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
        metric(&m, "kubeproxy_proxy_healthz_total{code=\"200\"}"),
        Some(2.0)
    );
    assert_eq!(
        metric(&m, "kubeproxy_proxy_livez_total{code=\"200\"}"),
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
    assert!(metric(&m, "kubeproxy_proxy_healthz_total{code=\"503\"}").unwrap() >= 1.0);
    assert!(metric(&m, "kubeproxy_proxy_healthz_total{code=\"200\"}").unwrap() >= 2.0);
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
    assert!(metric(&m, "kubeproxy_proxy_healthz_total{code=\"503\"}").unwrap() >= 1.0);
    assert!(metric(&m, "kubeproxy_proxy_healthz_total{code=\"200\"}").unwrap() >= 1.0);
}

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
        assert!(metric(&m, &count).unwrap() >= 1.0, "{count}");
        for gauge in ["last_timestamp_seconds", "last_queued_timestamp_seconds"] {
            let series = format!("kubeproxy_sync_proxy_rules_{gauge}{{ip_family=\"{family}\"}}");
            let t = metric(&m, &series).unwrap_or_else(|| panic!("{series} missing"));
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
            assert_eq!(metric(&m, &series), Some(0.0), "{series}");
        }
    }
    assert_eq!(
        metric(&m, "kubeproxy_sync_proxy_rules_endpoint_changes_pending"),
        Some(0.0)
    );
    assert_eq!(
        metric(&m, "kubeproxy_sync_proxy_rules_service_changes_pending"),
        Some(0.0)
    );
    assert_eq!(
        metric(&m, "kubeproxy_proxy_healthz_total{code=\"200\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(&m, "kubeproxy_proxy_livez_total{code=\"200\"}"),
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
    assert_eq!(metric(&m, "ebpf_kube_proxy_localstate_revision"), Some(1.0));
    assert_eq!(metric(&m, "ebpf_kube_proxy_localstate_services"), Some(1.0));
    assert_eq!(
        metric(&m, "ebpf_kube_proxy_localstate_endpoints"),
        Some(2.0)
    );
    for resource in ["endpointslices", "nodes", "pods", "services"] {
        let series =
            format!("ebpf_kube_proxy_source_synced{{resource=\"{resource}\",source=\"file\"}}");
        assert_eq!(metric(&m, &series), Some(1.0), "{series}");
    }
    assert_eq!(
        metric(
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
        let get = |s: &str| metric(&m, s).unwrap_or_else(|| panic!("{s} missing in\n{m}"));
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
    let (s1, e1, t1) = wait_for("a Service change", Duration::from_secs(5), || {
        let now = read();
        (now.0 > services).then_some(now)
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
    let (s2, e2, t2) = wait_for("an EndpointSlice change", Duration::from_secs(5), || {
        let now = read();
        (now.1 > e1).then_some(now)
    });
    assert_eq!(e2, e1 + 1.0, "one EndpointSlice edited");
    assert_eq!(s2, s1, "the unchanged Service is not counted");
    assert!(t2 > t1);
    let m = wait_for("pending changes to clear", Duration::from_secs(5), || {
        let m = metrics_text(&d);
        (metric(&m, "kubeproxy_sync_proxy_rules_endpoint_changes_pending") == Some(0.0))
            .then_some(m)
    });
    assert_eq!(
        metric(&m, "kubeproxy_sync_proxy_rules_service_changes_pending"),
        Some(0.0)
    );
    assert_eq!(
        metric(&m, "ebpf_kube_proxy_localstate_endpoints"),
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
    let trigger = chrono::DateTime::from_timestamp(i64::try_from(now).unwrap(), 0)
        .unwrap()
        .format("%Y-%m-%dT%H:%M:%SZ");
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
            metric(&m, &count).is_some().then_some(m)
        },
    );
    assert_eq!(metric(&m, &count), Some(1.0));
    let sum = metric(&m, &format!("{name}_sum{{ip_family=\"IPv4\"}}")).unwrap();
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
    let mut watch = c
        .watch(pb::WatchRequest {
            instance_id: 0,
            rev: 0,
        })
        .await
        .unwrap()
        .into_inner();
    watch.next().await.unwrap().unwrap();
    let mut poller = c.clone();
    let (instance_id, rev) = (state.instance_id, state.rev);
    let waiting = tokio::spawn(async move {
        let mut req = tonic::Request::new(pb::NextFilter { instance_id, rev });
        req.set_timeout(Duration::from_millis(1500));
        poller.next(req).await.map(drop)
    });
    let open = |m: &str, rpc: &str| {
        metric(
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
                    (metric(&m, "ebpf_kube_proxy_localnet_clients{rpc=\"Next\"}") == Some(1.0)
                        && metric(&m, "ebpf_kube_proxy_localnet_clients{rpc=\"Watch\"}")
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
                (metric(&m, "ebpf_kube_proxy_localnet_clients{rpc=\"Next\"}") == Some(0.0)
                    && metric(&m, "ebpf_kube_proxy_localnet_clients{rpc=\"Watch\"}") == Some(0.0))
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
        assert_eq!(metric(&m, &name), Some(value), "{name}\n{m}");
    }
}
