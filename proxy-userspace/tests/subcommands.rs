//! `dump` and `cleanup` as an operator runs them (SPEC §10.2, §10.7): with
//! the DaemonSet's own flags before or after the subcommand, kube-proxy's
//! `--cleanup` spelling, and nothing programmed. Run in a private network
//! namespace when root, so the host's nftables are never touched.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::BIN;

/// Runs the binary with `args`, in a fresh network namespace when root.
fn run(args: &[&str]) -> Output {
    // SAFETY: getuid has no preconditions.
    let root = unsafe { libc::getuid() } == 0;
    let mut cmd = if root {
        let mut c = Command::new("unshare");
        c.args(["--net", "--", BIN]);
        c
    } else {
        Command::new(BIN)
    };
    cmd.args(args).output().expect("running ebpf-kube-proxy")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The flags a DaemonSet passes, pointing at `dir`.
fn daemonset_flags(dir: &Path, mode: &str) -> Vec<String> {
    let d = |p: &str| dir.join(p).display().to_string();
    [
        "--hostname-override=node-1",
        &format!("--proxy-mode={mode}"),
        "--cluster-cidr=10.244.0.0/16",
        "--cgroup-path=",
        &format!("--bpffs-root={}", d("bpf")),
        &format!("--localnet-socket={}", d("run/localnet.sock")),
        &format!("--podinfo-socket={}", d("run/podinfo.sock")),
        "--metrics-bind-address=127.0.0.1:10249",
        "--sync-period=30s",
        "--v=2",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

#[test]
fn dump_takes_the_daemon_flags_and_says_when_nothing_is_programmed() {
    let dir = tempfile::tempdir().unwrap();
    let flags = daemonset_flags(dir.path(), "ebpf");
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let target = format!("--target=unix:{}", dir.path().join("none.sock").display());
    let after: Vec<&str> = ["dump", target.as_str()]
        .iter()
        .chain(&flags)
        .copied()
        .collect();
    let before: Vec<&str> = flags
        .iter()
        .chain(&["dump", target.as_str()])
        .copied()
        .collect();
    for args in [after, before] {
        let out = run(&args);
        let t = text(&out);
        assert!(out.status.success(), "{args:?}: {t}");
        assert!(t.contains("nothing programmed"), "{args:?}: {t}");
        assert!(t.contains("no daemon answers"), "{args:?}: {t}");
    }
}

#[test]
fn cleanup_and_kube_proxys_cleanup_flag_take_the_daemon_flags_and_remove_stale_sockets() {
    for spelling in ["cleanup", "--cleanup"] {
        let dir = tempfile::tempdir().unwrap();
        // A socket file no daemon listens on any more.
        std::fs::create_dir_all(dir.path().join("run")).unwrap();
        let stale = dir.path().join("run/localnet.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        assert!(stale.exists());
        let flags = daemonset_flags(dir.path(), "nftables");
        let mut args: Vec<&str> = vec![spelling];
        args.extend(flags.iter().map(String::as_str));
        let out = run(&args);
        let t = text(&out);
        assert!(out.status.success(), "{spelling}: {t}");
        assert!(!stale.exists(), "{spelling}: stale socket left: {t}");
        assert!(t.contains("removed stale socket"), "{spelling}: {t}");
        assert!(
            t.contains("no eBPF links or maps pinned"),
            "{spelling}: {t}"
        );
        assert!(t.contains("nftables"), "{spelling}: {t}");
        assert!(t.contains("cleanup complete"), "{spelling}: {t}");
    }
}

/// kube-proxy's `--proxy-mode iptables|ipvs` is taken as `auto` with a
/// warning, as the config file's `mode` is; `--logging-format json` writes
/// one JSON object per line.
#[test]
fn kube_proxy_modes_are_auto_with_a_warning_in_json_logs() {
    for mode in ["iptables", "ipvs"] {
        let out = Command::new(BIN)
            .args(["--logging-format", "json", "--proxy-mode", mode, "version"])
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        let line = stderr
            .lines()
            .find(|l| l.contains("using auto"))
            .unwrap_or_else(|| panic!("no warning in {stderr}"));
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON log line");
        assert_eq!(v["level"], "warn", "{v}");
        assert_eq!(v["mode"], mode, "{v}");
        assert!(v["ts"].as_f64().unwrap() > 1.7e9, "{v}");
        assert!(v["msg"].as_str().unwrap().contains("using auto"), "{v}");
    }
}

/// `dump | head -1`: stdout closing early is not an error.
#[test]
fn dump_into_a_closed_pipe_exits_quietly() {
    let files: Vec<(String, String)> = (0..2000)
        .map(|i| {
            let name = format!("svc-{i}");
            let svc = common::service("default", &name, &format!("10.96.{}.{}", i / 250, i % 250));
            (format!("{name}.yaml"), svc)
        })
        .collect();
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(n, c)| (n.as_str(), c.as_str()))
        .collect();
    let d = common::Daemon::start_in(common::manifests_dir(&refs), &[]);
    let script = format!(
        "set -o pipefail; \"{BIN}\" dump --bpffs-root /nonexistent --target unix:{} -o json | head -c 100 > /dev/null",
        d.socket.display()
    );
    // Run where no nftables table of ours can exist when root.
    // SAFETY: getuid has no preconditions.
    let root = unsafe { libc::getuid() } == 0;
    let mut cmd = if root {
        let mut c = Command::new("unshare");
        c.args(["--net", "--", "bash", "-c", &script]);
        c
    } else {
        let mut c = Command::new("bash");
        c.args(["-c", &script]);
        c
    };
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    assert!(!stderr.contains("error"), "{stderr}");
}

/// A kube-proxy DaemonSet's flags that mean nothing here are accepted,
/// each with a one-line warning naming it.
#[test]
fn kube_proxy_only_flags_are_accepted_with_a_warning() {
    let out = Command::new(BIN)
        .args([
            "--bind-address=0.0.0.0",
            "--masquerade-all",
            "--oom-score-adj=-999",
            "--conntrack-max-per-core",
            "0",
            "--conntrack-tcp-be-liberal",
            "--iptables-sync-period=30s",
            "--ipvs-scheduler=rr",
            "--feature-gates=SomeGate=true",
            "--cluster-cidr=10.244.0.0/16",
            "version",
        ])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for flag in [
        "--oom-score-adj",
        "--iptables-sync-period",
        "--ipvs-scheduler",
        "--feature-gates",
    ] {
        assert!(
            t.lines().any(|l| l.contains(flag) && l.contains("ignored")),
            "{flag}: {t}"
        );
    }
    // Flags that take effect here are not called ignored.
    for flag in [
        "--bind-address",
        "--masquerade-all",
        "--cluster-cidr",
        "--conntrack-max-per-core",
        "--conntrack-tcp-be-liberal",
    ] {
        assert!(
            !t.lines().any(|l| l.contains(flag) && l.contains("ignored")),
            "{flag}: {t}"
        );
    }
}

/// `--write-config-to` writes the effective KubeProxyConfiguration, and it
/// loads back through `--config` to the same configuration.
#[test]
fn write_config_to_round_trips_through_config() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first.yaml");
    let second = dir.path().join("second.yaml");
    let out = Command::new(BIN)
        .args([
            "--proxy-mode=nftables",
            "--hostname-override=node-7",
            "--sync-period=45s",
            "--nodeport-addresses=10.0.0.0/8,fd00::/64",
            "--cluster-cidr=10.244.0.0/16",
        ])
        .arg(format!("--write-config-to={}", first.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let written = std::fs::read_to_string(&first).unwrap();
    for expected in [
        "kind: KubeProxyConfiguration",
        "mode: nftables",
        "hostnameOverride: node-7",
        "syncPeriod: 45s",
        "- 10.0.0.0/8",
        "clusterCIDR: 10.244.0.0/16",
    ] {
        assert!(written.contains(expected), "{expected} missing:\n{written}");
    }
    let out = Command::new(BIN)
        .arg(format!("--config={}", first.display()))
        .arg(format!("--write-config-to={}", second.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&second).unwrap(), written);
}

/// `--init-only` prepares the node for the datapath and exits (here
/// nftables, in a private network namespace).
#[test]
fn init_only_prepares_the_datapath_and_exits() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("m");
    std::fs::create_dir(&manifests).unwrap();
    std::fs::write(
        manifests.join("s.yaml"),
        common::service("default", "a", "10.96.0.1"),
    )
    .unwrap();
    let flags = [
        "--init-only".to_owned(),
        "--proxy-mode=nftables".to_owned(),
        "--source=file".to_owned(),
        format!("--manifests={}", manifests.display()),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let out = run(&flags);
    let t = text(&out);
    // Without root there is no nf_tables to check: the error names it.
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        assert!(!out.status.success() && t.contains("nftables"), "{t}");
        return;
    }
    assert!(out.status.success(), "{t}");
    assert!(t.contains("node prepared for the nftables datapath"), "{t}");
}

/// `--version` and `version` print the same line.
#[test]
fn version_flag_and_subcommand_agree() {
    let flag = Command::new(BIN).arg("--version").output().unwrap();
    let sub = Command::new(BIN).arg("version").output().unwrap();
    assert!(flag.status.success() && sub.status.success());
    let line = String::from_utf8_lossy(&sub.stdout);
    assert!(
        line.starts_with("ebpf-kube-proxy ") && line.contains("(git "),
        "{line}"
    );
    assert_eq!(String::from_utf8_lossy(&flag.stdout), line);
}
