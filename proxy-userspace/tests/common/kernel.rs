//! The environment of the kernel tests (`ebpf_*`): whether they can run
//! here at all, and everything one test creates — network namespaces, a
//! cgroup v2 directory of its own (the socket hooks attach there, never to
//! the root cgroup), a bpffs directory and helper processes — removed when
//! the [`Env`] drops, also after a failed assertion.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use ebpf_kube_proxy::datapath::ebpf::{self, loader, EbpfConfig};
use serde_json::Value;
use test_support::netns::Netns;

/// argv: PORT. A TCP server for [`Env::serve`] that answers each
/// connection's first bytes with `ok:` and the address it was reached on,
/// so a test sees which backend address answered.
pub const ADDR_ECHO_SERVER: &str = r#"
import socket, sys
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("0.0.0.0", int(sys.argv[1]))); t.listen(512)
print("ready", flush=True)
while True:
    c, _ = t.accept()
    try:
        c.recv(100)
        c.sendall(b"ok:" + c.getsockname()[0].encode())
    except OSError:
        pass
    c.close()
"#;

/// Echo server on 127.0.0.1 and ::1 (TCP and UDP). argv: NAME PORT;
/// prints "ready" once listening, answers "NAME:DATA".
pub const LOOPBACK_ECHO: &str = r#"
import socket, sys, threading
name, port = sys.argv[1], int(sys.argv[2])
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("127.0.0.1", port)); t.listen(128)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("127.0.0.1", port))
t6 = socket.socket(socket.AF_INET6); t6.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
t6.bind(("::1", port)); t6.listen(128)
def conn(c):
    with c:
        while True:
            try:
                d = c.recv(100)
            except OSError:
                return
            if not d:
                return
            c.sendall(name.encode() + b":" + d)
def udp():
    while True:
        d, a = u.recvfrom(100)
        u.sendto(name.encode() + b":" + d, a)
def accept(l):
    while True:
        c, _ = l.accept()
        threading.Thread(target=conn, args=(c,), daemon=True).start()
threading.Thread(target=udp, daemon=True).start()
threading.Thread(target=accept, args=(t6,), daemon=True).start()
print("ready", flush=True)
accept(t)
"#;

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The cgroup v2 mount point, or why the kernel tests cannot run here.
pub fn cgroup2_root_or_skip_reason() -> Result<PathBuf, String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root (cgroups, network namespaces, BPF)".to_owned());
    }
    if !ebpf::object_embedded() {
        return Err("this build has no eBPF object; run `cargo xtask build-ebpf --release`, then the tests again".to_owned());
    }
    for cmd in ["ip", "nsenter", "python3"] {
        if !have(cmd) {
            return Err(format!("`{cmd}` is not installed"));
        }
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
    loader::cgroup2_root(&loader::parse_mountinfo(&mountinfo))
        .ok_or_else(|| "no cgroup v2 mount".to_owned())
}

/// Everything one kernel test creates. Dropping it kills the helper
/// processes, removes the datapath's pins (which detaches its programs),
/// the cgroup and then the namespaces.
pub struct Env {
    /// The test's namespaces, named by [`Env::ns`].
    pub netns: Netns,
    prefix: String,
    /// `<cgroup2 root>/ebpf-kube-proxy-<tag>-<pid>`, created empty.
    pub cgroup: PathBuf,
    /// `/sys/fs/bpf/ebpf-kube-proxy-<tag>-<pid>`, for the datapath to create.
    pub bpffs: PathBuf,
    children: Vec<Child>,
}

impl Env {
    /// The environment of test binary `test`, its names tagged `tag` (unique
    /// among the binary's tests, which run in parallel) and the pid; `None`,
    /// after a `SKIP <test>: <why>` line, where kernel tests cannot run.
    pub fn new(test: &str, tag: &str) -> Option<Env> {
        let cg_root = match cgroup2_root_or_skip_reason() {
            Ok(root) => root,
            Err(why) => {
                eprintln!("SKIP {test}: {why}");
                return None;
            }
        };
        let pid = std::process::id();
        let env = Env {
            netns: Netns::default(),
            prefix: format!("ekp-{tag}-{pid}"),
            cgroup: cg_root.join(format!("ebpf-kube-proxy-{tag}-{pid}")),
            bpffs: PathBuf::from(format!("/sys/fs/bpf/ebpf-kube-proxy-{tag}-{pid}")),
            children: vec![],
        };
        assert_ne!(env.cgroup, cg_root, "never the root cgroup");
        std::fs::create_dir(&env.cgroup).expect("creating the test cgroup");
        Some(env)
    }

    /// The full name of the test's namespace `short`.
    pub fn ns(&self, short: &str) -> String {
        format!("{}-{short}", self.prefix)
    }

    /// Adds namespace `short` (loopback up); its full name.
    pub fn add_ns(&mut self, short: &str) -> String {
        let name = self.ns(short);
        self.netns.add(&name).expect("adding a network namespace");
        name
    }

    /// `ip -n <ns short> args...`, which must succeed.
    pub fn ip(&self, short: &str, args: &[&str]) {
        self.netns.ip(&self.ns(short), args).unwrap();
    }

    /// Runs each `(namespace short, "ip arguments")` of `config` in order
    /// (the arguments split at white space); each must succeed.
    pub fn ip_all(&self, config: &[(&str, &str)]) {
        for (short, command) in config {
            let args: Vec<&str> = command.split_whitespace().collect();
            self.ip(short, &args);
        }
    }

    /// Runs `python3 -c script args...` in namespace `short` to its end
    /// and reads the one JSON value it prints.
    pub fn python_json(&self, short: &str, script: &str, args: &[&str]) -> Value {
        let out = self
            .python(short, script)
            .args(args)
            .output()
            .expect("running a client");
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "client {args:?}: {e}: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// `python3 -c script` in namespace `short`, entered with nsenter
    /// (`ip netns exec` would hide the cgroup2 and bpffs mounts); add the
    /// script's arguments.
    pub fn python(&self, short: &str, script: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.ns(short)))
            .args(["python3", "-c", script]);
        cmd
    }

    /// Starts `cmd` with stdin and stdout piped; it is killed on drop.
    pub fn spawn(&mut self, mut cmd: Command) -> Piped {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
        let piped = Piped {
            stdin: child.stdin.take().expect("piped stdin"),
            stdout: BufReader::new(child.stdout.take().expect("piped stdout")),
        };
        self.children.push(child);
        piped
    }

    /// Starts `python3 -c script args...` in namespace `short` and waits
    /// for its "ready" line.
    pub fn serve(&mut self, short: &str, script: &str, args: &[&str]) {
        let mut cmd = self.python(short, script);
        cmd.args(args);
        let line = self.spawn(cmd).line();
        assert_eq!(line.trim(), "ready", "server {args:?} in {short}");
    }

    /// A datapath configuration for this environment's bpffs directory
    /// and cgroup. `nodeport_addresses` decides where the tc programs
    /// attach: empty means every interface of the thread's namespace (enter
    /// the test's own first), `0.0.0.0/32` none.
    pub fn config(&self, map_size: u32, nodeport_addresses: &[&str]) -> EbpfConfig {
        EbpfConfig {
            bpffs_root: self.bpffs.clone(),
            cgroup_path: Some(self.cgroup.clone()),
            map_size,
            nodeport_addresses: nodeport_addresses
                .iter()
                .map(|a| a.parse().expect("a CIDR"))
                .collect(),
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Err(e) = ebpf::cleanup(&self.bpffs) {
            eprintln!("cleanup of {}: {e}", self.bpffs.display());
        }
        // The clients have exited; the cgroup is empty once the kernel
        // has reaped them (retry briefly).
        for _ in 0..50 {
            match std::fs::remove_dir(&self.cgroup) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        // `netns` drops after this: the namespaces go last.
    }
}

/// A helper process's stdin and stdout.
pub struct Piped {
    pub stdin: ChildStdin,
    pub stdout: BufReader<ChildStdout>,
}

impl Piped {
    /// The next line it prints.
    pub fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .expect("reading a helper process");
        line
    }

    /// The next line it prints, as JSON.
    pub fn json(&mut self) -> Value {
        let line = self.line();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("client printed {line:?}: {e}"))
    }
}
