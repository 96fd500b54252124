//! Test support shared by `proxy-userspace`'s integration tests and benches
//! and by the e2e suite in `xtask` (never a dependency of the product):
//!
//! * [`manifests`]: Service, EndpointSlice and Pod manifests as the file
//!   source and the API server take them;
//! * [`fake_apiserver`]: a Kubernetes API server speaking the real
//!   list/watch protocol;
//! * [`netexec`]: the echo server the test pods run and its client;
//! * [`netns`]: network namespaces a test creates, removed on drop;
//! * [`cgroup2_root`]: where the cgroup v2 hierarchy is mounted, so tests
//!   attach to a cgroup of their own below it, never to the root;
//! * [`docs`]: the links, headings and `sh` commands of the Markdown pages,
//!   for the docs tests.

pub mod docs;
pub mod fake_apiserver;
pub mod manifests;
pub mod netexec;
pub mod netns;

use std::path::PathBuf;

/// A free loopback port for a daemon to listen on. Taken below the
/// kernel's ephemeral range, so that the many client connections of a test
/// run (whose local ports come from that range) cannot grab it between
/// this check and the daemon's bind.
pub fn free_port() -> std::net::SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_low: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next().and_then(|p| p.parse().ok()))
        .unwrap_or(32768);
    let (low, high) = (10_000u32, ephemeral_low.max(10_100));
    let span = high - low;
    let start = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let port = low + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port as u16)) {
            return l.local_addr().unwrap();
        }
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// The cgroup v2 mount point, from `/proc/self/mountinfo`.
pub fn cgroup2_root() -> anyhow::Result<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    for line in mountinfo.lines() {
        // "... - cgroup2 cgroup2 rw": the mount point is field 5.
        if let Some((left, right)) = line.split_once(" - ") {
            if right.starts_with("cgroup2 ") {
                if let Some(mp) = left.split_whitespace().nth(4) {
                    return Ok(PathBuf::from(mp));
                }
            }
        }
    }
    anyhow::bail!("no cgroup2 mount in /proc/self/mountinfo")
}
