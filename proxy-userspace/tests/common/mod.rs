//! Test support: run the real `ebpf-kube-proxy` binary on the file source
//! with its own manifests directory, TCP port and unix socket.

// Each test binary uses a part of this module.
#![allow(dead_code, unused_imports)]

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use ebpf_kube_proxy::localnet::client::{self, Target};
use proto::localnet::v1::endpoints_client::EndpointsClient;
use test_support::manifests;
use tonic::transport::Channel;

pub const BIN: &str = env!("CARGO_BIN_EXE_ebpf-kube-proxy");

pub use test_support::free_port;

/// A Service manifest with one TCP port `http` 80 → 8080.
pub fn service(ns: &str, name: &str, cluster_ip: &str) -> String {
    manifests::Svc::new(ns, name, cluster_ip).yaml()
}

/// An EndpointSlice `<service>-1` for `service` with ready endpoints at
/// `ips` on node n2.
pub fn slice(ns: &str, service: &str, ips: &[&str]) -> String {
    let endpoints: Vec<manifests::Endpoint> = ips
        .iter()
        .map(|ip| manifests::Endpoint::ready(ip, "n2"))
        .collect();
    manifests::slice_yaml(
        &manifests::Svc::new(ns, service, ""),
        "1",
        false,
        &endpoints,
    )
}

pub use test_support::manifests::pod_yaml;

/// Writes a file atomically (temp file + rename), as kubelet does for
/// ConfigMap volumes, so the daemon never sees a half-written file.
pub fn write_atomic(path: &Path, content: &str) {
    let tmp = path.with_file_name(format!(
        ".{}.tmp",
        path.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A temporary directory with `manifests/` holding `files` (name, content).
pub fn manifests_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    for (name, content) in files {
        std::fs::write(manifests.join(name), content).unwrap();
    }
    dir
}

pub struct Daemon {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub addr: SocketAddr,
    pub socket: PathBuf,
    pub log: PathBuf,
    /// `--metrics-bind-address`: the status server (10249 in production).
    pub metrics: SocketAddr,
    /// `--healthz-bind-address`: kube-proxy's health server (10256).
    pub healthz: SocketAddr,
}

impl Daemon {
    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Starts the daemon on `files` (name, content) and waits until its
    /// unix socket accepts connections.
    pub fn start(files: &[(&str, &str)]) -> Daemon {
        Self::start_in(manifests_dir(files), &[])
    }

    /// As [`Daemon::start_in`], with extra environment variables (the
    /// daemon's test hooks).
    pub fn start_in_env(
        dir: tempfile::TempDir,
        extra: &[&str],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Daemon {
        let manifests = dir.path().join("manifests").display().to_string();
        let mut args = vec!["--source", "file", "--manifests", manifests.as_str()];
        args.extend_from_slice(extra);
        Self::spawn_env(dir, &args, env)
    }

    pub fn start_in(dir: tempfile::TempDir, extra: &[&str]) -> Daemon {
        let manifests = dir.path().join("manifests").display().to_string();
        let mut args = vec!["--source", "file", "--manifests", manifests.as_str()];
        args.extend_from_slice(extra);
        Self::spawn(dir, &args)
    }

    /// The daemon on the kube source, talking to the API server described
    /// by `kubeconfig`.
    pub fn start_kube(dir: tempfile::TempDir, kubeconfig: &Path, extra: &[&str]) -> Daemon {
        let kubeconfig = kubeconfig.display().to_string();
        let mut args = vec!["--source", "kube", "--kubeconfig", kubeconfig.as_str()];
        args.extend_from_slice(extra);
        Self::spawn(dir, &args)
    }

    /// Starts the binary with `args` plus this test's own listeners.
    pub fn spawn(dir: tempfile::TempDir, args: &[&str]) -> Daemon {
        Self::spawn_env(dir, args, &[])
    }

    pub fn spawn_env(
        dir: tempfile::TempDir,
        args: &[&str],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Daemon {
        let addr = free_port();
        let (metrics, healthz) = (free_port(), free_port());
        let socket = dir.path().join("run/localnet.sock");
        let log = dir.path().join("daemon.log");
        let child = Command::new(BIN)
            .args(["--hostname-override", "n1", "--proxy-mode", "none"])
            .arg("--localnet-bind-address")
            .arg(addr.to_string())
            .arg("--localnet-socket")
            .arg(&socket)
            .arg("--podinfo-socket")
            .arg(dir.path().join("run/podinfo.sock"))
            .arg("--metrics-bind-address")
            .arg(metrics.to_string())
            .arg("--healthz-bind-address")
            .arg(healthz.to_string())
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut d = Daemon {
            child: Some(child),
            dir,
            addr,
            socket,
            log,
            metrics,
            healthz,
        };
        d.wait_listening();
        d
    }

    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!("daemon exited with {status}; log:\n{}", self.log_text());
            }
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
                && std::net::TcpStream::connect(self.addr).is_ok()
                && std::net::TcpStream::connect(self.metrics).is_ok()
                && std::net::TcpStream::connect(self.healthz).is_ok()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("daemon did not start listening; log:\n{}", self.log_text());
    }

    pub fn manifest(&self, name: &str) -> PathBuf {
        self.dir.path().join("manifests").join(name)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub async fn tcp(&self) -> EndpointsClient<Channel> {
        client::connect(&Target::Tcp(self.addr.to_string()))
            .await
            .unwrap()
    }

    /// Waits (bounded) for a state newer than (instance, rev) that
    /// satisfies `pred`, over localnet `Next` on TCP.
    pub async fn wait_state(
        &self,
        (mut i, mut r): (u64, u64),
        within: Duration,
        pred: impl Fn(&client::State) -> bool,
    ) -> client::State {
        let deadline = Instant::now() + within;
        let mut c = self.tcp().await;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let s = tokio::time::timeout(left, client::next(&mut c, i, r))
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "no matching state within {within:?}; log:\n{}",
                        self.log_text()
                    )
                })
                .unwrap();
            if pred(&s) {
                return s;
            }
            (i, r) = (s.instance_id, s.rev);
        }
    }

    /// The daemon on the kube source against `api` (a kubeconfig for it in
    /// the daemon's own directory), on the encoding `wire`.
    pub fn start_on(api: &fake_apiserver::FakeApiServer, wire: Wire) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig);
        wire.prepare(api);
        Daemon::start_kube(dir, &kubeconfig, wire.args())
    }

    pub async fn unix(&self) -> EndpointsClient<Channel> {
        client::connect(&Target::Unix(self.socket.clone()))
            .await
            .unwrap()
    }

    /// SIGTERM, then waits (bounded) for the exit.
    pub fn terminate(&mut self) -> ExitStatus {
        self.sigterm();
        self.wait_exit(Duration::from_secs(10))
    }

    /// Sends SIGTERM without waiting.
    pub fn sigterm(&self) {
        let child = self.child.as_ref().expect("daemon already stopped");
        let pid = child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    }

    /// Waits up to `timeout` for the exit (after [`Daemon::sigterm`]).
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("daemon already stopped");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("daemon did not exit within {timeout:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One HTTP/1.1 answer, as it came over the wire.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    /// Header names lower-cased, in wire order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// The only value of header `name`; panics when it is repeated.
    pub fn header(&self, name: &str) -> Option<&str> {
        let all = self.header_all(name);
        assert!(all.len() <= 1, "header {name} repeated: {all:?}");
        all.first().copied()
    }

    pub fn header_all(&self, name: &str) -> Vec<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).expect("UTF-8 body")
    }
}

/// A raw HTTP/1.1 request (one connection, `Connection: close`), so tests
/// see exact status lines, headers and body bytes.
pub fn http(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();

    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut rest = raw[split + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap();
            (n.trim().to_ascii_lowercase(), v.trim().to_owned())
        })
        .collect();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let body = if method == "HEAD" {
        Vec::new()
    } else if header("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        let mut body = Vec::new();
        loop {
            let line_end = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let size_text = String::from_utf8(rest[..line_end].to_vec()).unwrap();
            let size =
                usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16).unwrap();
            rest.drain(..line_end + 2);
            if size == 0 {
                break;
            }
            body.extend(rest.drain(..size));
            rest.drain(..2);
        }
        body
    } else if let Some(len) = header("content-length") {
        let len: usize = len.parse().unwrap();
        assert_eq!(rest.len(), len, "body length");
        rest
    } else {
        rest
    };
    HttpResponse {
        status,
        headers,
        body,
    }
}

/// `GET path` without extra headers.
pub fn get(addr: SocketAddr, path: &str) -> HttpResponse {
    http(addr, "GET", path, &[])
}

/// The value of one exact series (`name{labels}`) in an exposition.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}
pub use test_support::fake_apiserver;
pub mod kernel;
pub mod netns;
pub mod status;
pub mod tc_bed;

/// A `Watch` from the start (instance 0, rev 0): the stream of frames.
pub async fn watch_all(
    c: &mut EndpointsClient<Channel>,
) -> tonic::Streaming<proto::localnet::v1::WatchEvent> {
    c.watch(proto::localnet::v1::WatchRequest {
        instance_id: 0,
        rev: 0,
        deltas: false,
    })
    .await
    .unwrap()
    .into_inner()
}

/// The names of a state's services, in its order.
pub fn service_names(s: &client::State) -> Vec<String> {
    s.services
        .iter()
        .map(|s| s.service.as_ref().unwrap().name.clone())
        .collect()
}

/// The encoding between the daemon and the fake API server: each kube
/// source test runs on each ([`on_each_wire`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    /// Protobuf, the daemon's default (kube-proxy's).
    Protobuf,
    /// `--kube-api-content-type application/json`.
    Json,
    /// Protobuf asked for, JSON answered (a server without protobuf).
    JsonAnswered,
}

impl Wire {
    pub fn args(self) -> &'static [&'static str] {
        match self {
            Wire::Protobuf => &[
                "--kube-api-content-type",
                "application/vnd.kubernetes.protobuf",
            ],
            Wire::Json => &["--kube-api-content-type", "application/json"],
            Wire::JsonAnswered => &[],
        }
    }

    fn prepare(self, api: &fake_apiserver::FakeApiServer) {
        api.set_json_only(self == Wire::JsonAnswered);
    }

    /// Fails unless every list and watch `api` answered was in this
    /// encoding.
    pub fn check(self, api: &fake_apiserver::FakeApiServer) {
        let (protobuf, json) = api.answers();
        match self {
            Wire::Protobuf => assert!(
                protobuf > 0 && json == 0,
                "{protobuf} answers in protobuf, {json} in JSON"
            ),
            Wire::Json | Wire::JsonAnswered => assert!(
                json > 0 && protobuf == 0,
                "{protobuf} answers in protobuf, {json} in JSON"
            ),
        }
    }
}

/// `#[tokio::test]`s named `protobuf::T` and `json::T` for each
/// `async fn T(wire: Wire)` given.
#[macro_export]
macro_rules! on_each_wire {
    ($($test:ident),* $(,)?) => {
        mod protobuf {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                super::$test(super::common::Wire::Protobuf).await
            })*
        }
        mod json {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                super::$test(super::common::Wire::Json).await
            })*
        }
    };
}

/// A fake API server holding node n1 and the ClusterIP services
/// (name, address) of `default`, and the daemon on it (on `wire`) with
/// its first state.
pub async fn kube_daemon_with(
    services: &[(&str, &str)],
    wire: Wire,
) -> (fake_apiserver::FakeApiServer, Daemon, client::State) {
    let api = fake_apiserver::FakeApiServer::start().await;
    for (name, ip) in services {
        api.apply(fake_apiserver::service_object("default", name, ip));
    }
    api.apply(serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}));
    let d = Daemon::start_on(&api, wire);
    let s = d
        .wait_state((0, 0), Duration::from_secs(10), |_| true)
        .await;
    wire.check(&api);
    (api, d, s)
}
