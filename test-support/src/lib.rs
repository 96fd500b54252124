//! Test support shared by `proxy-userspace`'s integration tests and benches
//! and by the e2e suite in `xtask` (never a dependency of the product):
//!
//! * [`manifests`]: Service, EndpointSlice and Pod manifests as the file
//!   source and the API server take them;
//! * [`fake_apiserver`]: a Kubernetes API server speaking the real
//!   list/watch protocol;
//! * [`netexec`]: the echo server the test pods run and its client;
//! * [`cgroup2_root`]: where the cgroup v2 hierarchy is mounted, so tests
//!   attach to a cgroup of their own below it, never to the root.

pub mod fake_apiserver;
pub mod manifests;
pub mod netexec;

use std::path::PathBuf;

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
