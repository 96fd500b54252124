//! `/statusz` and `/flagz` of the real daemon over raw HTTP/1.1 (SPEC §1,
//! §2): layout, content negotiation, every flag with its effective value.

mod common;

use std::time::Duration;

use common::status::*;
use common::{get, http, manifests_dir, Daemon};

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
    let command = <ebpf_kube_proxy::config::DaemonFlags as clap::Args>::augment_args(
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
    // `v`'s value is a number: its line fixes D.
    let v_at = names.iter().position(|n| n == "v").expect("the v flag");
    let v_line = lines[v_at];
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
    assert_eq!(
        value("kube-api-content-type"),
        "application/vnd.kubernetes.protobuf",
        "the encoding asked of the API server, kube-proxy's default"
    );
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
