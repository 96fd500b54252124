//! The conntrack sysctls kube-proxy sets at start ("KubeProxy should set
//! TCP CLOSE_WAIT timeout"), set by the real daemon on the nftables
//! datapath in a network namespace of its own: the timeouts there are
//! that namespace's own, so the machine's are never touched (checked too).
//! `nf_conntrack_max` is read-only outside the initial namespace: left
//! alone, with a log line. /flagz shows the values. Root only.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{get, manifests_dir, service, Daemon, BIN};

const NETFILTER: &str = "/proc/sys/net/netfilter";

fn is_root() -> bool {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() == 0 }
}

/// A network namespace of this test, deleted on drop.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("ekp-ct-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap()
            .success();
        assert!(ok, "ip netns add {name}");
        Netns(name)
    }

    fn path(&self) -> String {
        format!("--net=/run/netns/{}", self.0)
    }

    /// `name` under /proc/sys/net/netfilter as this namespace sees it
    /// (`None`: absent).
    fn sysctl(&self, name: &str) -> Option<String> {
        let out = Command::new("nsenter")
            .arg(self.path())
            .args(["cat", &format!("{NETFILTER}/{name}")])
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// The daemon on the nftables datapath inside `ns`, on `dir`'s manifests,
/// with `extra` flags; killed on drop.
struct NsDaemon {
    child: Child,
    log: PathBuf,
}

impl NsDaemon {
    fn start(ns: &Netns, dir: &Path, extra: &[&str]) -> NsDaemon {
        let log = dir.join("daemon.log");
        let child = Command::new("nsenter")
            .arg(ns.path())
            .arg(common::BIN)
            .args(["--hostname-override", "n1", "--proxy-mode", "nftables"])
            .args(["--source", "file", "--manifests"])
            .arg(dir.join("manifests"))
            .arg("--localnet-socket")
            .arg(dir.join("run/localnet.sock"))
            .arg("--podinfo-socket")
            .arg(dir.join("run/podinfo.sock"))
            .arg(format!("--bpffs-root={}", dir.join("bpf").display()))
            .args(extra)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        NsDaemon { child, log }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (bounded) until the log holds `needle`.
    fn wait_log(&mut self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.log_text().contains(needle) {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("daemon exited with {status}; log:\n{}", self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "{needle:?} not logged; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for NsDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn host_sysctl(name: &str) -> Option<String> {
    std::fs::read_to_string(format!("{NETFILTER}/{name}"))
        .ok()
        .map(|s| s.trim().to_owned())
}

const CLOSE_WAIT: &str = "nf_conntrack_tcp_timeout_close_wait";
const ESTABLISHED: &str = "nf_conntrack_tcp_timeout_established";

#[test]
fn the_daemon_sets_kube_proxys_conntrack_timeouts_in_its_namespace() {
    if !is_root() {
        eprintln!("skipped: needs root (a network namespace)");
        return;
    }
    let host = [CLOSE_WAIT, ESTABLISHED, "nf_conntrack_max"].map(host_sysctl);
    let ns = Netns::new("defaults");
    let Some(before) = ns.sysctl(CLOSE_WAIT) else {
        eprintln!("skipped: no nf_conntrack sysctls on this kernel");
        return;
    };
    // A fresh namespace starts with the kernel's defaults.
    assert_eq!(before, "60");
    let max_before = ns.sysctl("nf_conntrack_max");

    let dir = manifests_dir(&[("a.yaml", &service("default", "a", "10.96.0.1"))]);
    let mut d = NsDaemon::start(&ns, dir.path(), &[]);
    d.wait_log("set net.netfilter.nf_conntrack_tcp_timeout_close_wait");
    assert_eq!(ns.sysctl(CLOSE_WAIT).as_deref(), Some("3600"));
    assert_eq!(ns.sysctl(ESTABLISHED).as_deref(), Some("86400"));
    // Read-only here: left, and said so.
    d.wait_log("net.netfilter.nf_conntrack_max not set: read-only here");
    assert_eq!(ns.sysctl("nf_conntrack_max"), max_before);
    assert_eq!(
        ns.sysctl("nf_conntrack_tcp_be_liberal").as_deref(),
        Some("0")
    );
    // The machine's own values are untouched.
    assert_eq!(
        [CLOSE_WAIT, ESTABLISHED, "nf_conntrack_max"].map(host_sysctl),
        host
    );
}

#[test]
fn flag_and_config_file_values_are_respected() {
    if !is_root() {
        eprintln!("skipped: needs root (a network namespace)");
        return;
    }
    let host = [
        CLOSE_WAIT,
        "nf_conntrack_tcp_be_liberal",
        "nf_conntrack_udp_timeout",
    ]
    .map(host_sysctl);
    let ns = Netns::new("flags");
    if ns.sysctl(CLOSE_WAIT).is_none() {
        eprintln!("skipped: no nf_conntrack sysctls on this kernel");
        return;
    }
    let dir = manifests_dir(&[("a.yaml", &service("default", "a", "10.96.0.1"))]);
    let mut d = NsDaemon::start(
        &ns,
        dir.path(),
        &[
            "--conntrack-tcp-timeout-close-wait=1800s",
            "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-be-liberal",
            "--conntrack-udp-timeout=45s",
        ],
    );
    d.wait_log("set net.netfilter.nf_conntrack_udp_timeout");
    assert_eq!(ns.sysctl(CLOSE_WAIT).as_deref(), Some("1800"));
    // 0: left at the kernel's default (5 days).
    assert_eq!(ns.sysctl(ESTABLISHED).as_deref(), Some("432000"));
    assert_eq!(
        ns.sysctl("nf_conntrack_tcp_be_liberal").as_deref(),
        Some("1")
    );
    assert_eq!(ns.sysctl("nf_conntrack_udp_timeout").as_deref(), Some("45"));
    drop(d);

    // The same through a KubeProxyConfiguration, in a second namespace.
    let ns = Netns::new("config");
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
         conntrack:\n  maxPerCore: 0\n  tcpCloseWaitTimeout: 20m0s\n  udpStreamTimeout: 3m0s\n",
    )
    .unwrap();
    let mut d = NsDaemon::start(
        &ns,
        dir.path(),
        &[&format!("--config={}", config.display())],
    );
    d.wait_log("set net.netfilter.nf_conntrack_udp_timeout_stream");
    assert_eq!(ns.sysctl(CLOSE_WAIT).as_deref(), Some("1200"));
    assert_eq!(
        ns.sysctl("nf_conntrack_udp_timeout_stream").as_deref(),
        Some("180")
    );
    // maxPerCore 0: nf_conntrack_max is not even tried.
    assert!(
        !d.log_text().contains("nf_conntrack_max"),
        "{}",
        d.log_text()
    );
    assert_eq!(
        [
            CLOSE_WAIT,
            "nf_conntrack_tcp_be_liberal",
            "nf_conntrack_udp_timeout"
        ]
        .map(host_sysctl),
        host
    );
}

/// /flagz lists the conntrack flags with their values (Go durations). The
/// daemon on `--proxy-mode none` sets nothing.
#[test]
fn flagz_shows_the_conntrack_flags() {
    let dir = manifests_dir(&[("a.yaml", &service("default", "a", "10.96.0.1"))]);
    let d = Daemon::start_in(
        dir,
        &[
            "--conntrack-tcp-timeout-close-wait=1800s",
            "--conntrack-udp-timeout=45s",
        ],
    );
    let page = get(d.metrics, "/flagz").text();
    for (name, value) in [
        ("conntrack-max-per-core", "32768"),
        ("conntrack-min", "131072"),
        ("conntrack-tcp-be-liberal", "false"),
        ("conntrack-tcp-timeout-close-wait", "30m0s"),
        ("conntrack-tcp-timeout-established", "24h0m0s"),
        ("conntrack-udp-timeout", "45s"),
        ("conntrack-udp-timeout-stream", "0s"),
    ] {
        // NAME, the page's delimiter, VALUE.
        let shown = page.lines().any(|l| {
            l.strip_prefix(name)
                .and_then(|r| r.strip_suffix(value))
                .is_some_and(|d| !d.is_empty() && !d.chars().any(char::is_alphanumeric))
        });
        assert!(shown, "{name} {value} missing:\n{page}");
    }
    let log = d.log_text();
    assert!(
        !log.contains("nf_conntrack"),
        "none mode set a sysctl:\n{log}"
    );
    let _ = BIN;
}
