//! The bed's second node (`node-2`): its own network namespace behind the
//! router, its own pods in 10.244.2.0/24 and fd00:244:2::/64, and its own
//! daemon instance (own cgroup, bpffs directory and sockets) reading the
//! same manifests as node 1's. Built on the first [`Bed::node2`] call, so
//! the scenarios that never need it pay nothing; kept until the bed drops.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};

use super::{free_port, ip, Bed, Pod, NODE2};

/// Pods on node 2.
pub const POD_COUNT: usize = 2;

pub struct Node2 {
    pub netns: String,
    pub pods: Vec<Pod>,
    pub cgroup: PathBuf,
    pub bpffs: PathBuf,
    localnet_socket: PathBuf,
    podinfo_socket: PathBuf,
    daemon: Option<Child>,
    starts: u32,
    log_dir: PathBuf,
}

impl Node2 {
    /// Whether `netns` is this node's or one of its pods'.
    pub fn owns_netns(&self, netns: &str) -> bool {
        netns == self.netns || self.pods.iter().any(|p| p.netns == netns)
    }

    fn log_path(&self) -> PathBuf {
        self.log_dir
            .join(format!("daemon-node2-{}.log", self.starts))
    }

    pub fn daemon_log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// SIGKILL the daemon, remove what it left through the product's own
    /// cleanup, then the bpffs directory and the cgroup. The namespaces go
    /// with the bed's.
    pub(super) fn remove(mut self, daemon_bin: &Path) {
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
        if daemon_bin.exists() {
            let _ = Command::new("nsenter")
                .arg(format!("--net=/run/netns/{}", self.netns))
                .arg(daemon_bin)
                .arg("cleanup")
                .arg("--bpffs-root")
                .arg(&self.bpffs)
                .arg("--cgroup-path")
                .arg(&self.cgroup)
                .arg("--localnet-socket")
                .arg(&self.localnet_socket)
                .arg("--podinfo-socket")
                .arg(&self.podinfo_socket)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.bpffs);
        if let Ok(procs) = std::fs::read_to_string(self.cgroup.join("cgroup.procs")) {
            if let Some(parent) = self.cgroup.parent() {
                for pid in procs.lines() {
                    let _ = std::fs::write(parent.join("cgroup.procs"), pid);
                }
            }
        }
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

impl Bed {
    /// Node 2, built and its daemon running (started when it is not).
    pub fn node2(&mut self) -> Result<&Node2> {
        if self.node2.is_none() {
            let n2 = self.build_node2().context("building node 2")?;
            self.node2 = Some(n2);
        }
        let n2 = self.node2.as_mut().context("node 2")?;
        // A daemon that exited (a failed scenario may have left it so) is
        // started again, like one that was never started.
        if let Some(d) = n2.daemon.as_mut() {
            if d.try_wait()?.is_some() {
                n2.daemon = None;
            }
        }
        if n2.daemon.is_none() {
            self.start_node2_daemon()?;
        }
        self.node2.as_ref().context("node 2")
    }

    /// Stops node 2's daemon (SIGKILL) when it runs: scenarios that measure
    /// one daemon's cost do not want a second one on the same cores.
    pub fn stop_node2_daemon(&mut self) {
        if let Some(d) = self.node2.as_mut().and_then(|n| n.daemon.take()) {
            let mut d = d;
            let _ = d.kill();
            let _ = d.wait();
        }
    }

    /// Node 2's daemon log, empty when node 2 was never built.
    pub fn node2_daemon_log(&self) -> String {
        self.node2
            .as_ref()
            .map(Node2::daemon_log)
            .unwrap_or_default()
    }

    fn build_node2(&mut self) -> Result<Node2> {
        let netns = format!("{}-node2", self.prefix);
        let cgroup = PathBuf::from(format!("{}-node2", self.cgroup.display()));
        let bpffs = PathBuf::from(format!("{}-node2", self.bpffs.display()));
        std::fs::create_dir_all(&cgroup)
            .with_context(|| format!("creating cgroup {}", cgroup.display()))?;
        let mut n2 = Node2 {
            netns: netns.clone(),
            pods: Vec::new(),
            cgroup,
            bpffs,
            localnet_socket: self.dir.join("localnet-node2.sock"),
            podinfo_socket: self.dir.join("podinfo-node2.sock"),
            daemon: None,
            starts: 0,
            log_dir: self.dir.clone(),
        };
        self.add_netns(&netns)?;
        ip(&["-n", &netns, "addr", "add", "169.254.1.1/32", "dev", "lo"])?;
        if self.proxy_mode != "ebpf" {
            self.add_void_default_route(&netns)?;
        }
        self.forwarding(&netns)?;
        let uplink = format!("{}up", self.prefix);
        self.uplink(&netns, &uplink, &NODE2)?;
        for i in 1..=POD_COUNT {
            let pod = Pod {
                name: format!("n2pod{i}"),
                netns: format!("{}-n2pod{i}", self.prefix),
                ipv4: format!("10.244.2.{}", 10 + i),
                ipv6: format!("fd00:244:2::{}", 10 + i),
            };
            let veth = format!("{}v{i}", self.prefix);
            self.add_pod(&netns, &veth, &pod)?;
            self.start_server(&pod)?;
            n2.pods.push(pod);
        }
        Ok(n2)
    }

    fn start_node2_daemon(&mut self) -> Result<()> {
        if !self.dir.join("manifests/scenario.yaml").exists() {
            self.apply_manifests("")?;
        }
        let mut args: Vec<OsString> = vec![
            "--hostname-override".into(),
            NODE2.name.into(),
            "--proxy-mode".into(),
            self.proxy_mode.clone().into(),
        ];
        args.extend(self.source_args());
        let n2 = self.node2.as_mut().context("node 2 is not built")?;
        for (flag, value) in [
            ("--cgroup-path", n2.cgroup.clone().into_os_string()),
            ("--bpffs-root", n2.bpffs.clone().into_os_string()),
            ("--localnet-bind-address", free_port()?.to_string().into()),
            (
                "--localnet-socket",
                n2.localnet_socket.clone().into_os_string(),
            ),
            (
                "--podinfo-socket",
                n2.podinfo_socket.clone().into_os_string(),
            ),
            ("--metrics-bind-address", free_port()?.to_string().into()),
            ("--healthz-bind-address", free_port()?.to_string().into()),
        ] {
            args.push(flag.into());
            args.push(value);
        }
        n2.starts += 1;
        let log = std::fs::File::create(n2.log_path())?;
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", n2.netns))
            .arg(&self.daemon_bin)
            .args(&args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting node 2's daemon")?;
        n2.daemon = Some(child);
        let log = n2.log_path();
        super::wait_published(&self.daemon_bin, &n2.localnet_socket, &mut n2.daemon, &log)
            .context("node 2's daemon")
    }
}
