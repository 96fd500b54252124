//! The test bed: nodes made of network namespaces, behind a router.
//!
//! ```text
//!   node netns (node-1; lo: 10.0.0.1, fd00::1, 169.254.1.1) ── the client
//!     │  vhN: routed veth (Calico style)          runs here, inside the test
//!     ├── pod1 netns  eth0 10.244.1.11 fd00:244::11  netexec         cgroup
//!     ├── pod2 netns  eth0 10.244.1.12 fd00:244::12  netexec
//!     ├── pod3 netns  eth0 10.244.1.13 fd00:244::13  netexec
//!     │  up: 192.168.100.1/24 fd00:192:168:100::1/64
//!   router netns ── n1: .254 / ::fe      10.244.1.0/24, fd00:244::/64,
//!     │                                  203.0.113.0/24, fd00:203::/64 → node 1
//!     ├── n2: 192.168.101.254/24 ::fe    10.244.2.0/24, fd00:244:2::/64 → node 2
//!     │     └── node2 netns (node-2, built on demand, see `node2.rs`)
//!     │           up: 192.168.101.1/24 fd00:192:168:101::1/64
//!     │           ├── n2pod1 10.244.2.11 fd00:244:2::11, n2pod2 …12
//!     └── client: 192.168.200.254/24 fd00:192:168:200::fe/64
//!           └── outside netns  eth0 192.168.200.2 fd00:192:168:200::2
//!               (default routes of both families via the router)
//! ```
//!
//! Pods reach their node through a /32 route and a default route via
//! 169.254.1.1 (an address of the node's lo, so the node answers ARP for it)
//! and, for IPv6, via fe80::1 on the node's veth. A node sends the underlay
//! (192.168.0.0/16, fd00:192:168::/48) and all pod CIDRs (10.244.0.0/16,
//! fd00:244::/32) to the router; its own pods' host routes are more
//! specific. Nodes and router forward (ip_forward, IPv6 forwarding). Each
//! daemon runs in its node namespace (nftables rules are per network
//! namespace; the eBPF socket hooks are per cgroup and attach to a cgroup
//! v2 directory created for each node). Everything is removed on drop, also
//! when a scenario fails.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub mod hostnet;
mod net;
pub mod node2;

use net::{address, route_via, veth};
pub use net::{NODE1, NODE2};

pub const POD_COUNT: usize = 3;
/// Ports every netexec serves.
pub const TCP_PORTS: &[u16] = &[8080, 8081, 8082];
pub const UDP_PORTS: &[u16] = &[5353, 8080];
/// Node 1's address as the outside client sees it.
pub const NODE_EXTERNAL_IP: &str = NODE1.ip;
/// Node 1's IPv6 address as the outside client sees it.
pub const NODE_EXTERNAL_IPV6: &str = NODE1.ipv6;
/// The outside client's addresses, behind the router.
pub const OUTSIDE_IP: &str = "192.168.200.2";
pub const OUTSIDE_IPV6: &str = "fd00:192:168:200::2";
/// The outside client's subnets (for source ranges).
pub const OUTSIDE_SUBNET: &str = "192.168.200.0/24";
pub const OUTSIDE_SUBNET_V6: &str = "fd00:192:168:200::/64";
const ROUTER_CLIENT_IP: &str = "192.168.200.254";
const ROUTER_CLIENT_IPV6: &str = "fd00:192:168:200::fe";
/// Routed to node 1 by the router: where external and load-balancer IPs
/// of the scenarios come from.
pub const EXTERNAL_V4_PREFIX: &str = "203.0.113.0/24";
pub const EXTERNAL_V6_PREFIX: &str = "fd00:203::/64";
#[derive(Clone, Debug)]
pub struct Pod {
    pub name: String,
    pub netns: String,
    pub ipv4: String,
    pub ipv6: String,
}

pub struct Bed {
    pub prefix: String,
    pub node_netns: String,
    /// A client outside the nodes, behind the router: [`OUTSIDE_IP`] and
    /// [`OUTSIDE_IPV6`]. Its processes stay out of the nodes' cgroups, so
    /// socket-LB never sees them: their traffic reaches a node as packets.
    pub outside_netns: String,
    /// The router joining the nodes and the outside client.
    pub router_netns: String,
    /// The second node, once a scenario asked for it ([`Bed::node2`]).
    pub node2: Option<node2::Node2>,
    pub pods: Vec<Pod>,
    pub cgroup: PathBuf,
    pub bpffs: PathBuf,
    pub dir: PathBuf,
    pub proxy_mode: String,
    pub daemon_bin: PathBuf,
    pub xtask_bin: PathBuf,
    pub localnet: SocketAddr,
    servers: Vec<Child>,
    /// Whether the node's own netexec ([`Bed::host_endpoint`]) runs.
    host_endpoint: bool,
    daemon: Option<Child>,
    netns: Vec<String>,
    daemon_starts: u32,
    /// Set: the daemon runs on the kube source with this kubeconfig.
    pub kubeconfig: Option<PathBuf>,
    /// Extra environment for the daemon (test hooks).
    pub daemon_env: Vec<(String, String)>,
    /// Extra command-line arguments for the daemon.
    pub daemon_args: Vec<String>,
    /// A command the daemon is started through, inside the node netns
    /// (`capsh --drop=...`): it must exec the daemon's command line that
    /// follows it, so the child's process id stays the daemon's.
    pub daemon_wrapper: Vec<OsString>,
    /// The daemon's unix sockets.
    pub localnet_socket: PathBuf,
    pub podinfo_socket: PathBuf,
    /// The arguments the daemon was last started with.
    pub last_args: Vec<OsString>,
    /// The daemon's `--metrics-bind-address` (in the node netns).
    metrics: Option<SocketAddr>,
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn ip(args: &[&str]) -> Result<()> {
    run(Command::new("ip").args(args))
}

/// A free port below the ephemeral range (see [`test_support::free_port`]):
/// the clients' source ports cannot take it before the daemon binds it.
fn free_port() -> Result<SocketAddr> {
    Ok(test_support::free_port())
}

/// The pods' netexec servers and the clients are this binary; run them
/// from a copy, so that a rebuild of xtask during a run cannot pull the
/// executable away from under them.
fn stable_copy_of_self(dir: &Path) -> Result<PathBuf> {
    let copy = dir.join("xtask-helper");
    std::fs::copy(std::env::current_exe()?, &copy).context("copying the xtask binary")?;
    Ok(copy)
}

impl Bed {
    pub fn new(proxy_mode: &str, daemon_bin: PathBuf) -> Result<Bed> {
        let id = std::process::id() % 100_000;
        let prefix = format!("ekp{id}");
        let dir = std::env::temp_dir().join(format!("ebpf-kube-proxy-e2e-{id}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("manifests"))?;
        let cgroup = test_support::cgroup2_root()?.join(format!("ebpf-kube-proxy-e2e-{id}"));
        let bpffs = PathBuf::from(format!("/sys/fs/bpf/ebpf-kube-proxy-e2e-{id}"));
        let xtask_bin = stable_copy_of_self(&dir)?;
        let (localnet_socket, podinfo_socket) =
            (dir.join("localnet.sock"), dir.join("podinfo.sock"));
        let mut bed = Bed {
            node_netns: format!("{prefix}-node"),
            outside_netns: format!("{prefix}-outside"),
            router_netns: format!("{prefix}-rtr"),
            node2: None,
            pods: Vec::new(),
            cgroup,
            bpffs,
            dir,
            proxy_mode: proxy_mode.to_owned(),
            daemon_bin,
            xtask_bin,
            localnet: free_port()?,
            servers: Vec::new(),
            host_endpoint: false,
            daemon: None,
            netns: Vec::new(),
            daemon_starts: 0,
            kubeconfig: None,
            daemon_env: Vec::new(),
            daemon_args: Vec::new(),
            daemon_wrapper: Vec::new(),
            localnet_socket,
            podinfo_socket,
            last_args: Vec::new(),
            metrics: None,
            prefix,
        };
        bed.build().context("building the test bed")?;
        Ok(bed)
    }

    fn add_netns(&mut self, name: &str) -> Result<()> {
        ip(&["netns", "add", name])?;
        self.netns.push(name.to_owned());
        // No duplicate address detection on the links created from now on:
        // a tentative link-local address delays neighbour discovery by a
        // second, and a scenario's first IPv6 requests with it.
        for scope in ["default", "all"] {
            self.sysctl(name, &format!("net.ipv6.conf.{scope}.accept_dad"), "0")?;
        }
        ip(&["-n", name, "link", "set", "lo", "up"])
    }

    fn sysctl(&self, netns: &str, key: &str, value: &str) -> Result<()> {
        run(Command::new("nsenter")
            .arg(format!("--net=/run/netns/{netns}"))
            .args(["sysctl", "-q", "-w", &format!("{key}={value}")]))
    }

    fn build(&mut self) -> Result<()> {
        std::fs::create_dir_all(&self.cgroup)
            .with_context(|| format!("creating cgroup {}", self.cgroup.display()))?;
        let node = self.node_netns.clone();
        self.add_netns(&node)?;
        for addr in ["10.0.0.1/32", "169.254.1.1/32"] {
            ip(&["-n", &node, "addr", "add", addr, "dev", "lo"])?;
        }
        ip(&["-n", &node, "-6", "addr", "add", "fd00::1/128", "dev", "lo"])?;
        if self.proxy_mode != "ebpf" {
            self.add_void_default_route(&node)?;
        }
        self.forwarding(&node)?;
        let router = self.router_netns.clone();
        self.add_netns(&router)?;
        self.forwarding(&router)?;
        let uplink = format!("{}up", self.prefix);
        self.uplink(&node, &uplink, &NODE1)?;
        let outside = self.outside_netns.clone();
        self.add_netns(&outside)?;
        veth(&outside, "eth0", &router, "client")?;
        address(&outside, "eth0", OUTSIDE_IP, 24, OUTSIDE_IPV6, 64)?;
        address(
            &router,
            "client",
            ROUTER_CLIENT_IP,
            24,
            ROUTER_CLIENT_IPV6,
            64,
        )?;
        ip(&[
            "-n",
            &outside,
            "route",
            "add",
            "default",
            "via",
            ROUTER_CLIENT_IP,
        ])?;
        ip(&[
            "-n",
            &outside,
            "-6",
            "route",
            "add",
            "default",
            "via",
            ROUTER_CLIENT_IPV6,
        ])?;
        // The addresses a router in front of the cluster sends to node 1:
        // its external and load-balancer IPs.
        for prefix in [EXTERNAL_V4_PREFIX, EXTERNAL_V6_PREFIX] {
            route_via(&router, prefix, NODE1.ip, NODE1.ipv6)?;
        }
        for i in 1..=POD_COUNT {
            let pod = Pod {
                name: format!("pod{i}"),
                netns: format!("{}-pod{i}", self.prefix),
                ipv4: format!("10.244.1.{}", 10 + i),
                ipv6: format!("fd00:244::{}", 10 + i),
            };
            let veth = format!("{}v{i}", self.prefix);
            self.add_pod(&node, &veth, &pod)?;
            self.start_server(&pod)?;
            self.pods.push(pod);
        }
        Ok(())
    }

    fn start_server(&mut self, pod: &Pod) -> Result<()> {
        self.start_netexec(&pod.netns, &pod.name, TCP_PORTS, UDP_PORTS)
    }

    /// A netexec named `name` in `netns` on the given ports; returns once
    /// it listens.
    fn start_netexec(&mut self, netns: &str, name: &str, tcp: &[u16], udp: &[u16]) -> Result<()> {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{netns}"))
            .arg(&self.xtask_bin)
            .args(["netexec", "--name", name]);
        for p in tcp {
            cmd.args(["--tcp", &p.to_string()]);
        }
        for p in udp {
            cmd.args(["--udp", &p.to_string()]);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting netexec")?;
        let stdout = child.stdout.take().context("netexec stdout")?;
        self.servers.push(child);
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        if line.trim() != "ready" {
            bail!("netexec in {netns} did not start: {line:?}");
        }
        Ok(())
    }

    /// Writes the scenario's manifests (atomically, replacing the previous
    /// scenario's).
    pub fn apply_manifests(&self, yaml: &str) -> Result<()> {
        let path = self.dir.join("manifests/scenario.yaml");
        let tmp = self.dir.join("manifests/.scenario.yaml.tmp");
        std::fs::write(&tmp, yaml)?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }

    pub fn daemon_running(&self) -> bool {
        self.daemon.is_some()
    }

    /// Whether the daemon started last is still running (not reaped).
    pub fn daemon_alive(&mut self) -> Result<bool> {
        match self.daemon.as_mut() {
            None => Ok(false),
            Some(d) => Ok(d.try_wait()?.is_none()),
        }
    }

    /// The daemon's process id (nsenter execs it, so the child's own id).
    pub fn daemon_pid(&self) -> Option<u32> {
        self.daemon.as_ref().map(Child::id)
    }

    /// Starts the daemon and waits until it has published a state.
    pub fn start_daemon(&mut self) -> Result<()> {
        self.spawn_daemon()?;
        self.wait_published()
    }

    /// Starts the daemon without waiting for it (the scale benchmark polls
    /// its metrics instead).
    pub fn spawn_daemon(&mut self) -> Result<()> {
        if !self.dir.join("manifests/scenario.yaml").exists() {
            self.apply_manifests("")?;
        }
        self.daemon_starts += 1;
        let log =
            std::fs::File::create(self.dir.join(format!("daemon-{}.log", self.daemon_starts)))?;
        let source_args = self.source_args();
        let metrics = free_port()?;
        self.metrics = Some(metrics);
        let mut args: Vec<OsString> = vec![
            "--hostname-override".into(),
            "node-1".into(),
            "--proxy-mode".into(),
            self.proxy_mode.clone().into(),
        ];
        args.extend(source_args);
        for (flag, value) in [
            ("--cgroup-path", self.cgroup.clone().into_os_string()),
            ("--bpffs-root", self.bpffs.clone().into_os_string()),
            ("--localnet-bind-address", self.localnet.to_string().into()),
            (
                "--localnet-socket",
                self.localnet_socket.clone().into_os_string(),
            ),
            (
                "--podinfo-socket",
                self.podinfo_socket.clone().into_os_string(),
            ),
            ("--metrics-bind-address", metrics.to_string().into()),
            ("--healthz-bind-address", free_port()?.to_string().into()),
        ] {
            args.push(flag.into());
            args.push(value);
        }
        args.extend(self.daemon_args.iter().map(OsString::from));
        self.last_args = args.clone();
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.node_netns))
            .args(&self.daemon_wrapper)
            .arg(&self.daemon_bin)
            .args(&args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .envs(self.daemon_env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting the daemon")?;
        self.daemon = Some(child);
        Ok(())
    }

    /// Where the daemons read Services and EndpointSlices from: every
    /// node's daemon reads the same.
    fn source_args(&self) -> Vec<OsString> {
        match &self.kubeconfig {
            Some(k) => vec![
                "--source".into(),
                "kube".into(),
                "--kubeconfig".into(),
                k.into(),
            ],
            None => vec![
                "--source".into(),
                "file".into(),
                "--manifests".into(),
                self.dir.join("manifests").into(),
            ],
        }
    }

    /// Waits until the daemon has published a state (its localnet answers).
    fn wait_published(&mut self) -> Result<()> {
        let log = self.dir.join(format!("daemon-{}.log", self.daemon_starts));
        wait_published(
            &self.daemon_bin,
            &self.localnet_socket,
            &mut self.daemon,
            &log,
        )
    }

    pub fn daemon_log(&self) -> String {
        std::fs::read_to_string(self.dir.join(format!("daemon-{}.log", self.daemon_starts)))
            .unwrap_or_default()
    }

    /// SIGKILL: what a crash or an OOM kill does.
    pub fn kill_daemon(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
    }

    /// Sends `signal` (`HUP`, …) to the running daemon.
    pub fn signal_daemon(&self, signal: &str) -> Result<()> {
        let d = self.daemon.as_ref().context("the daemon is not running")?;
        run(Command::new("kill").args([&format!("-{signal}"), &d.id().to_string()]))
    }

    /// SIGTERM and wait.
    pub fn stop_daemon(&mut self) -> Result<()> {
        if let Some(mut d) = self.daemon.take() {
            run(Command::new("kill").args(["-TERM", &d.id().to_string()]))?;
            let deadline = Instant::now() + Duration::from_secs(10);
            while d.try_wait()?.is_none() {
                if Instant::now() > deadline {
                    let _ = d.kill();
                    bail!("the daemon did not stop within 10 s of SIGTERM");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// Runs the daemon's binary with `args` in the node namespace, where
    /// the daemon ran; its output, or an error when it fails.
    pub fn run_in_node(&self, args: &[OsString]) -> Result<String> {
        let out = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.node_netns))
            .arg(&self.daemon_bin)
            .args(args)
            .output()?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            bail!("{args:?} failed: {text}");
        }
        Ok(text)
    }

    /// Runs the daemon's `cleanup` subcommand for this bed's paths.
    pub fn cleanup_command(&self) -> Result<String> {
        let mut args: Vec<OsString> = vec!["cleanup".into()];
        for (flag, value) in [
            ("--bpffs-root", &self.bpffs),
            ("--cgroup-path", &self.cgroup),
            ("--localnet-socket", &self.localnet_socket),
            ("--podinfo-socket", &self.podinfo_socket),
        ] {
            args.push(flag.into());
            args.push(value.into());
        }
        self.run_in_node(&args)
    }

    /// Runs `f` on a thread inside the node namespace: sockets it creates
    /// (a listener for the fake API server) live there, where the daemon
    /// can reach them on 127.0.0.1.
    pub fn in_node_netns<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        in_netns(&self.node_netns, f)
    }

    /// The daemon's `/metrics` page, fetched inside the node namespace.
    pub fn metrics(&self) -> Result<String> {
        let addr = self.metrics.context("the daemon was never started")?;
        self.in_node_netns(move || -> Result<String> {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
            let mut page = String::new();
            s.read_to_string(&mut page)?;
            Ok(page)
        })?
    }

    /// A client in `netns` (the node's by default; in the test cgroup only
    /// there, as a process elsewhere is not on the node). Returns its
    /// output lines.
    pub fn client(&self, netns: Option<&str>, args: &[&str]) -> Result<Vec<String>> {
        let child = self.spawn_client(netns, args)?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "client failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect())
    }

    /// A client on a node (node 1's netns or a pod's) joins that node's
    /// cgroup, as a process on a node does; the outside client joins none.
    pub fn spawn_client(&self, netns: Option<&str>, args: &[&str]) -> Result<Child> {
        let netns = netns.unwrap_or(&self.node_netns);
        // Join the cgroup first, then the network namespace, then exec the
        // client: every socket it opens is covered by the hooks.
        let script = r#"{ [ -z "$1" ] || echo $$ > "$1/cgroup.procs"; } && shift && exec nsenter --net="/run/netns/$1" "$2" client "${@:3}""#;
        let cgroup = if netns == self.outside_netns || netns == self.router_netns {
            PathBuf::new()
        } else {
            match &self.node2 {
                Some(n2) if n2.owns_netns(netns) => n2.cgroup.clone(),
                _ => self.cgroup.clone(),
            }
        };
        let mut cmd = Command::new("bash");
        cmd.args(["-c", script, "client"])
            .arg(&cgroup)
            .arg(netns)
            .arg(&self.xtask_bin)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd.spawn().context("starting the client")
    }
}

/// Runs `f` on a thread inside the network namespace `netns`.
pub fn in_netns<T: Send>(netns: &str, f: impl FnOnce() -> T + Send) -> Result<T> {
    let ns = std::fs::File::open(format!("/run/netns/{netns}"))?;
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                use std::os::fd::AsRawFd;
                // SAFETY: setns on a valid, open netns descriptor; it only
                // changes this (scoped, short-lived) thread's namespace.
                let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
                if rc != 0 {
                    bail!("setns: {}", std::io::Error::last_os_error());
                }
                Ok(f())
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the thread in netns {netns} panicked"))?
    })
}

/// Waits until the daemon `child` has published a state (its localnet
/// socket answers); fails at once when it exits, with its log.
fn wait_published(
    daemon_bin: &Path,
    localnet_socket: &Path,
    child: &mut Option<Child>,
    log: &Path,
) -> Result<()> {
    let read_log = || std::fs::read_to_string(log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = Command::new(daemon_bin)
            .args(["localnet", "watch", "--once", "--target"])
            .arg(format!("unix:{}", localnet_socket.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if out.success() {
            return Ok(());
        }
        if let Some(d) = child.as_mut() {
            if let Some(st) = d.try_wait()? {
                *child = None;
                bail!("the daemon exited: {st}; log:\n{}", read_log());
            }
        }
        if Instant::now() > deadline {
            bail!(
                "the daemon published no state within 20 s; log:\n{}",
                read_log()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        self.kill_daemon();
        if let Some(n2) = self.node2.take() {
            n2.remove(&self.daemon_bin);
        }
        for s in &mut self.servers {
            let _ = s.kill();
            let _ = s.wait();
        }
        // Remove programs and pins through the product's own cleanup first;
        // then make sure, whatever it did.
        if self.daemon_bin.exists() {
            let _ = self.cleanup_command();
        }
        let _ = std::fs::remove_dir_all(&self.bpffs);
        for ns in self.netns.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        // The cgroup can only be removed once empty: move stragglers out.
        if let Ok(procs) = std::fs::read_to_string(self.cgroup.join("cgroup.procs")) {
            if let Some(parent) = self.cgroup.parent() {
                for pid in procs.lines() {
                    let _ = std::fs::write(parent.join("cgroup.procs"), pid);
                }
            }
        }
        let _ = std::fs::remove_dir(&self.cgroup);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where this bed's state lives, for error messages.
pub fn describe(bed: &Bed) -> String {
    format!(
        "netns {}-*, cgroup {}, bpffs {}, dir {}",
        bed.prefix,
        bed.cgroup.display(),
        bed.bpffs.display(),
        Path::new(&bed.dir).display()
    )
}
