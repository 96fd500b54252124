//! `node_addrs` against the real kernel (root only; otherwise the test says
//! why and passes): in a network namespace of its own, a veth pair with
//! IPv4 and IPv6 addresses is listed, then added and removed addresses and
//! a new interface reach the subscriber within a bounded time. A Drop
//! guard deletes the namespace, also after a failure.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::Duration;

use ebpf_kube_proxy::net::Cidr;
use ebpf_kube_proxy::node_addrs::{self, NodeAddress, NodeAddresses};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long a change may take to reach the subscriber.
const WITHIN: Duration = Duration::from_secs(5);

struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn ip(ns: &str, args: &str) {
    let out = Command::new("ip")
        .args(["-n", ns])
        .args(args.split_whitespace())
        .output()
        .expect("running ip");
    assert!(
        out.status.success(),
        "ip -n {ns} {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn has(list: &[NodeAddress], ifname: &str, addr: &str, prefix_len: u8) -> bool {
    let addr: std::net::IpAddr = addr.parse().unwrap();
    list.iter()
        .any(|a| a.ifname == ifname && a.addr == addr && a.prefix_len == prefix_len)
}

/// Waits (bounded) until the published list satisfies `want`.
async fn until(
    rx: &mut watch::Receiver<NodeAddresses>,
    what: &str,
    want: impl Fn(&[NodeAddress]) -> bool,
) -> NodeAddresses {
    let waited = tokio::time::timeout(WITHIN, async {
        loop {
            let now = rx.borrow_and_update().clone();
            if want(&now) {
                return now;
            }
            rx.changed().await.expect("the publisher stopped");
        }
    })
    .await;
    match waited {
        Ok(list) => list,
        Err(_) => panic!(
            "{what}: not seen within {WITHIN:?}; last list: {:#?}",
            rx.borrow()
        ),
    }
}

#[test]
fn node_addresses_are_listed_and_followed_in_a_netns() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP node_addrs: needs root (network namespaces)");
        return;
    }
    if Command::new("ip").arg("-V").output().is_err() {
        eprintln!("SKIP node_addrs: `ip` is not installed");
        return;
    }
    let ns = Netns(format!("ekp-nodeaddrs-{}", std::process::id()));
    let ns_name = ns.0.clone();
    let _ = Command::new("ip").args(["netns", "del", &ns_name]).output();
    let out = Command::new("ip")
        .args(["netns", "add", &ns_name])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ip netns add: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ip(&ns_name, "link set lo up");
    ip(&ns_name, "link add ekp0 type veth peer name ekp1");
    ip(&ns_name, "addr add 10.99.0.1/24 dev ekp0");
    ip(&ns_name, "addr add fd99::1/64 dev ekp0 nodad");
    ip(&ns_name, "link set ekp0 up");
    ip(&ns_name, "link set ekp1 up");

    // setns moves only the calling thread: everything that reads the
    // namespace (list, the watcher's socket, the runtime) lives on this one.
    let worker = std::thread::spawn(move || {
        let file = File::open(format!("/run/netns/{ns_name}")).expect("opening the netns");
        // SAFETY: setns on an open netns descriptor; it moves only this
        // thread, which the test owns.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(follow(&ns_name));
    });
    if let Err(panic) = worker.join() {
        drop(ns);
        std::panic::resume_unwind(panic);
    }
}

async fn follow(ns: &str) {
    let all = node_addrs::list().expect("listing the netns's addresses");
    assert!(has(&all, "lo", "127.0.0.1", 8), "{all:#?}");
    assert!(has(&all, "lo", "::1", 128), "{all:#?}");
    assert!(has(&all, "ekp0", "10.99.0.1", 24), "{all:#?}");
    assert!(has(&all, "ekp0", "fd99::1", 64), "{all:#?}");
    let ekp0 = all.iter().find(|a| a.ifname == "ekp0").unwrap().ifindex;
    // The index is the kernel's: `ip -o link` opens its line with it.
    let shown = Command::new("ip")
        .args(["-n", ns, "-o", "link", "show", "ekp0"])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.starts_with(&format!("{ekp0}: ekp0")),
        "ifindex {ekp0} for ekp0, ip says: {shown}"
    );

    // The default selection: no loopback, no link-local, both families.
    let selected = node_addrs::select(&all, &[]);
    let ips: Vec<String> = selected.iter().map(|a| a.addr.to_string()).collect();
    assert_eq!(ips, ["10.99.0.1", "fd99::1"], "{selected:#?}");
    let only_v4: Vec<Cidr> = vec!["10.99.0.0/16".parse().unwrap()];
    let ips: Vec<String> = node_addrs::select(&all, &only_v4)
        .iter()
        .map(|a| a.addr.to_string())
        .collect();
    assert_eq!(ips, ["10.99.0.1"]);

    let cancel = CancellationToken::new();
    let (mut rx, task) = node_addrs::subscribe(cancel.clone()).expect("subscribing");
    let task = tokio::spawn(task);
    until(&mut rx, "the initial list", |l| {
        has(l, "ekp0", "10.99.0.1", 24)
    })
    .await;

    ip(ns, "addr add 10.99.7.1/24 dev ekp1");
    until(&mut rx, "an added address", |l| {
        has(l, "ekp1", "10.99.7.1", 24)
    })
    .await;

    ip(ns, "addr del 10.99.0.1/24 dev ekp0");
    let now = until(&mut rx, "a removed address", |l| {
        !has(l, "ekp0", "10.99.0.1", 24)
    })
    .await;
    assert!(has(&now, "ekp0", "fd99::1", 64), "{now:#?}");

    ip(ns, "link add ekp2 type veth peer name ekp3");
    ip(ns, "addr add fd98::2/120 dev ekp2 nodad");
    until(&mut rx, "a new interface's address", |l| {
        has(l, "ekp2", "fd98::2", 120)
    })
    .await;

    ip(ns, "link del ekp2");
    until(&mut rx, "a deleted interface", |l| {
        !l.iter().any(|a| a.ifname == "ekp2" || a.ifname == "ekp3")
    })
    .await;

    // The raw watcher wakes on a change too.
    let mut watcher = node_addrs::Watcher::new().expect("a watcher");
    ip(ns, "addr add 10.99.8.1/24 dev ekp1");
    tokio::time::timeout(WITHIN, watcher.changed())
        .await
        .expect("the watcher did not wake within the bound")
        .expect("the watcher failed");
    assert!(has(&node_addrs::list().unwrap(), "ekp1", "10.99.8.1", 24));

    cancel.cancel();
    tokio::time::timeout(WITHIN, task)
        .await
        .expect("the publisher did not stop when cancelled")
        .unwrap()
        .expect("the publisher failed");
}
