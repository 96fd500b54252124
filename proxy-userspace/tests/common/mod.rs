//! Test support: run the real `ebpf-kube-proxy` binary on the file source
//! with its own manifests directory, TCP port and unix socket.

#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use ebpf_kube_proxy::localnet::client::{self, Target};
use proto::localnet::v1::endpoints_client::EndpointsClient;
use tonic::transport::Channel;

pub const BIN: &str = env!("CARGO_BIN_EXE_ebpf-kube-proxy");

/// A free loopback port (bound and released; good enough for tests).
pub fn free_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// A Service manifest with one TCP port 80 → named/numbered target.
pub fn service(ns: &str, name: &str, cluster_ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\n\
         spec:\n  clusterIP: {cluster_ip}\n  ports:\n  - {{name: http, port: 80, targetPort: 8080}}\n"
    )
}

/// An EndpointSlice for `service` with ready endpoints at `ips` on node n2.
pub fn slice(ns: &str, service: &str, ips: &[&str]) -> String {
    let mut s = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: {service}-1, namespace: {ns}, labels: {{kubernetes.io/service-name: {service}}}}}\n\
         addressType: IPv4\nports:\n- {{name: http, port: 8080, protocol: TCP}}\nendpoints:\n"
    );
    for ip in ips {
        s.push_str(&format!(
            "- {{addresses: [{ip}], nodeName: n2, conditions: {{ready: true}}}}\n"
        ));
    }
    s
}

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

pub struct Daemon {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub addr: SocketAddr,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts the daemon on `files` (name, content) and waits until its
    /// unix socket accepts connections.
    pub fn start(files: &[(&str, &str)]) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let manifests = dir.path().join("manifests");
        std::fs::create_dir(&manifests).unwrap();
        for (name, content) in files {
            std::fs::write(manifests.join(name), content).unwrap();
        }
        Self::start_in(dir, &[])
    }

    pub fn start_in(dir: tempfile::TempDir, extra: &[&str]) -> Daemon {
        let addr = free_port();
        let socket = dir.path().join("run/localnet.sock");
        let log = dir.path().join("daemon.log");
        let child = Command::new(BIN)
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
            .arg(addr.to_string())
            .arg("--localnet-socket")
            .arg(&socket)
            .arg("--podinfo-socket")
            .arg(dir.path().join("run/podinfo.sock"))
            .args(extra)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let d = Daemon {
            child: Some(child),
            dir,
            addr,
            socket,
            log,
        };
        d.wait_listening();
        d
    }

    fn wait_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
                && std::net::TcpStream::connect(self.addr).is_ok()
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

    pub async fn unix(&self) -> EndpointsClient<Channel> {
        client::connect(&Target::Unix(self.socket.clone()))
            .await
            .unwrap()
    }

    /// SIGTERM, then waits (bounded) for the exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("daemon already stopped");
        let pid = child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("daemon did not exit within 10 s of SIGTERM");
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
