//! Shared by the status-surface tests: the daemon on a one-service
//! manifest, polling, and readers for the pages' formats.

use std::time::{Duration, Instant};

use super::{get, manifests_dir, service, slice, Daemon};

pub const WARNING: &str = "Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only.";
/// Longest first, so that `: ` is not taken for `:`.
pub const DELIMITERS: [&str; 4] = [": ", ":", "=", " "];
pub const PATHS: &str = "/flagz /healthz /livez /metrics /proxyMode /readyz /statusz";
pub const TEXT_PLAIN: &str = "text/plain; charset=utf-8";
pub const EXPOSITION: &str = "text/plain; version=0.0.4; charset=utf-8";
pub const STATUSZ_JSON: &str = "application/json;g=config.k8s.io;v=v1beta1;as=Statusz";

// Test hooks of the daemon (environment variables, not flags).
pub const STALL_DATAPATH: &str = "EBPF_KUBE_PROXY_TEST_STALL_DATAPATH";
pub const HOLD_SOURCE: &str = "EBPF_KUBE_PROXY_TEST_HOLD_SOURCE";
pub const SHUTDOWN_DELAY: &str = "EBPF_KUBE_PROXY_TEST_SHUTDOWN_DELAY";

pub fn web() -> String {
    format!(
        "{}---\n{}",
        service("prod", "web", "10.96.0.10"),
        slice("prod", "web", &["10.244.2.1", "10.244.2.2"])
    )
}

pub fn start_web(extra: &[&str]) -> Daemon {
    Daemon::start_in(manifests_dir(&[("a.yaml", &web())]), extra)
}

/// Polls `probe` every 50 ms until it yields, for at most `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
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

pub fn wait_ready(d: &Daemon) {
    wait_for("/readyz to pass", Duration::from_secs(10), || {
        (get(d.metrics, "/readyz").status == 200).then_some(())
    });
}

pub fn metrics_text(d: &Daemon) -> String {
    get(d.metrics, "/metrics").text()
}

pub fn help_and_type(name: &str, help: &str, kind: &str) -> String {
    format!("# HELP {name} {help}\n# TYPE {name} {kind}\n")
}

/// `Label{D} value` → (D, value).
pub fn labelled<'a>(line: &'a str, label: &str) -> (&'static str, &'a str) {
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
pub fn is_go_unix_date(s: &str) -> bool {
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
pub fn is_uptime(s: &str) -> bool {
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

pub fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}
