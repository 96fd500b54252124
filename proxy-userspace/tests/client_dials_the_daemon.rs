//! The client subcommands (`dump`, `localnet watch`, `podinfo list`) given
//! the daemon's own flags dial where that daemon listens: its
//! `--localnet-socket` first, then its `--localnet-bind-address`, and the
//! PodInfo API on its `--podinfo-socket`; `--target` still wins.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{pod_yaml, service, slice, Daemon, BIN};

struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs the binary with `args` (in the root network namespace: the TCP
/// address under test is the daemon's loopback one).
fn run(args: &[String]) -> Run {
    let out: Output = Command::new(BIN)
        .args(args)
        .output()
        .expect("running ebpf-kube-proxy");
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// One Service with an endpoint, one pod on the daemon's node (n1).
fn start() -> Daemon {
    let web = format!(
        "{}---\n{}",
        service("default", "web", "10.96.0.10"),
        slice("default", "web", &["10.244.7.7"])
    );
    let pod = pod_yaml("default", "web-0", "n1", &[("Ready", "True", "")]);
    let d = Daemon::start(&[("web.yaml", &web), ("pod.yaml", &pod)]);
    // The daemon is waited for on the localnet listeners only.
    let podinfo = d.dir.path().join("run/podinfo.sock");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&podinfo).is_err() {
        assert!(
            Instant::now() < deadline,
            "PodInfo socket not listening; log:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    d
}

/// The flags the daemon was started with (`common::Daemon`), `socket` as
/// its --localnet-socket, plus a --bpffs-root where nothing is pinned so
/// `dump` falls through to the daemon's LocalState.
fn daemon_flags(d: &Daemon, socket: &Path) -> Vec<String> {
    let dir = d.dir.path();
    vec![
        "--hostname-override=n1".to_owned(),
        "--proxy-mode=none".to_owned(),
        format!("--localnet-bind-address={}", d.addr),
        format!("--localnet-socket={}", socket.display()),
        format!(
            "--podinfo-socket={}",
            dir.join("run/podinfo.sock").display()
        ),
        format!("--bpffs-root={}", dir.join("no-bpf").display()),
    ]
}

fn with(command: &[&str], flags: &[String]) -> Vec<String> {
    command
        .iter()
        .map(|s| (*s).to_owned())
        .chain(flags.iter().cloned())
        .collect()
}

/// `dump` and `localnet watch --once` print the daemon's state, and
/// `dump` says which address answered.
fn assert_localnet_found(flags: &[String], answered: &str) {
    let dump = run(&with(&["dump"], flags));
    assert!(dump.ok, "dump {flags:?}: {}", dump.stderr);
    assert!(
        dump.stdout.contains("default/web") && dump.stdout.contains("10.244.7.7"),
        "dump {flags:?} printed no daemon state:\n{}{}",
        dump.stdout,
        dump.stderr
    );
    assert!(
        dump.stderr
            .contains(&format!("the LocalState published on {answered} follows")),
        "dump {flags:?}: {}",
        dump.stderr
    );
    let watch = run(&with(&["localnet", "watch", "--once"], flags));
    assert!(watch.ok, "localnet watch {flags:?}: {}", watch.stderr);
    assert_eq!(
        watch.stdout, dump.stdout,
        "localnet watch --once and dump print the same LocalState"
    );
    let full = run(&with(
        &["localnet", "watch", "--once", "--full-frames"],
        flags,
    ));
    assert!(
        full.ok,
        "localnet watch --full-frames {flags:?}: {}",
        full.stderr
    );
    assert_eq!(full.stdout, watch.stdout, "--full-frames prints the same");
}

#[test]
fn the_daemons_flags_lead_every_client_to_its_socket() {
    let d = start();
    let flags = daemon_flags(&d, &d.socket);
    assert_localnet_found(&flags, &format!("unix:{}", d.socket.display()));
    let list = run(&with(&["podinfo", "list"], &flags));
    assert!(list.ok, "podinfo list: {}", list.stderr);
    assert!(
        list.stdout.contains("default/web-0 uid=") && list.stdout.contains("Ready=True"),
        "podinfo list printed no pod of the daemon:\n{}{}",
        list.stdout,
        list.stderr
    );
}

#[test]
fn without_its_socket_the_clients_dial_the_daemons_tcp_address() {
    let d = start();
    // A daemon told to listen on TCP only (an empty --localnet-socket), or
    // whose socket is not there: the TCP address answers.
    for socket in ["".into(), d.dir.path().join("run/absent.sock")] {
        let flags = daemon_flags(&d, &socket);
        assert_localnet_found(&flags, &d.addr.to_string());
    }
}

#[test]
fn target_wins_over_the_daemons_flags() {
    let d = start();
    let absent = d.dir.path().join("run/absent.sock");
    let mut flags = daemon_flags(&d, &d.socket);
    flags.push(format!("--target=unix:{}", absent.display()));
    let dump = run(&with(&["dump"], &flags));
    assert!(dump.ok, "{}", dump.stderr);
    assert!(
        dump.stderr
            .contains(&format!("no daemon answers on unix:{}", absent.display())),
        "{}",
        dump.stderr
    );
    let watch = run(&with(&["localnet", "watch", "--once"], &flags));
    assert!(!watch.ok, "--target should win: {}", watch.stdout);
    assert!(watch.stderr.contains("absent.sock"), "{}", watch.stderr);
    let list = run(&with(&["podinfo", "list"], &flags));
    assert!(!list.ok, "--target should win: {}", list.stdout);
    assert!(list.stderr.contains("absent.sock"), "{}", list.stderr);
}
