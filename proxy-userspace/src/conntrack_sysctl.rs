//! The node's conntrack settings, set at start as kube-proxy sets them
//! (`KubeProxyConfiguration.conntrack` and the `--conntrack-*` flags):
//! `nf_conntrack_max` (maxPerCore × CPUs, at least `min`) and the hash
//! table size that goes with it, the TCP established and CLOSE_WAIT
//! timeouts, the UDP timeouts when set, and `nf_conntrack_tcp_be_liberal`
//! when asked. Both datapaths need it: the node's conntrack tracks pod
//! traffic either way.
//!
//! [`plan`] is the pure part (flags → writes); [`apply`] does them. A value
//! already in place is left alone; a file that is absent (nf_conntrack not
//! loaded) or read-only here (`nf_conntrack_max` and the hash size outside
//! the initial network namespace) is skipped with a log line; a failed
//! write is a warning, never an exit. In a container, /proc/sys and /sys
//! are writable only when it is privileged (kube-proxy's is): elsewhere
//! every value is skipped as read-only.

use std::io::ErrorKind;
use std::path::Path;
use std::time::Duration;

/// `/proc/sys/net/netfilter/`: per network namespace.
pub const NETFILTER_SYSCTLS: &str = "/proc/sys/net/netfilter";
/// The hash table size: global, writable only from the initial network
/// namespace.
pub const HASHSIZE: &str = "/sys/module/nf_conntrack/parameters/hashsize";

/// The values of the `--conntrack-*` flags, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConntrackSettings {
    /// 0: leave `nf_conntrack_max` (and `min`) alone.
    pub max_per_core: u32,
    pub min: u32,
    /// Zero: leave the sysctl alone (all four timeouts).
    pub tcp_established_timeout: Duration,
    pub tcp_close_wait_timeout: Duration,
    pub udp_timeout: Duration,
    pub udp_stream_timeout: Duration,
    pub tcp_be_liberal: bool,
}

impl ConntrackSettings {
    /// kube-proxy's `nf_conntrack_max`: maxPerCore × CPUs, at least `min`;
    /// `None` when maxPerCore is 0.
    pub fn max(&self, cpus: u64) -> Option<u64> {
        (self.max_per_core > 0)
            .then(|| (u64::from(self.max_per_core) * cpus).max(u64::from(self.min)))
    }
}

/// One value to set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// `net.netfilter.<name>` = value.
    Sysctl { name: &'static str, value: u64 },
    /// [`HASHSIZE`] = value, only when it is smaller (as kube-proxy: a
    /// larger table is kept) and once `nf_conntrack_max` is set.
    Hashsize(u64),
}

/// What to set for `settings` on a node with `cpus` CPUs, in order.
pub fn plan(settings: &ConntrackSettings, cpus: u64) -> Vec<Write> {
    let mut writes = Vec::new();
    if let Some(max) = settings.max(cpus) {
        writes.push(Write::Sysctl {
            name: "nf_conntrack_max",
            value: max,
        });
        writes.push(Write::Hashsize(max / 4));
    }
    let timeouts = [
        (
            "nf_conntrack_tcp_timeout_established",
            settings.tcp_established_timeout,
        ),
        (
            "nf_conntrack_tcp_timeout_close_wait",
            settings.tcp_close_wait_timeout,
        ),
    ];
    for (name, timeout) in timeouts {
        if !timeout.is_zero() {
            writes.push(Write::Sysctl {
                name,
                value: timeout.as_secs(),
            });
        }
    }
    if settings.tcp_be_liberal {
        writes.push(Write::Sysctl {
            name: "nf_conntrack_tcp_be_liberal",
            value: 1,
        });
    }
    for (name, timeout) in [
        ("nf_conntrack_udp_timeout", settings.udp_timeout),
        (
            "nf_conntrack_udp_timeout_stream",
            settings.udp_stream_timeout,
        ),
    ] {
        if !timeout.is_zero() {
            writes.push(Write::Sysctl {
                name,
                value: timeout.as_secs(),
            });
        }
    }
    writes
}

/// The node's CPUs as kube-proxy counts them (every online CPU, not this
/// process's share).
pub fn online_cpus() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    u64::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64))
}

/// What [`apply`] did with one write, for its log line and the tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Set {
        from: u64,
    },
    AlreadySet,
    /// The hash table is at least this large already.
    Larger(u64),
    Absent,
    ReadOnly,
    /// Not tried: `nf_conntrack_max` was not set.
    Skipped,
    Failed(String),
}

/// Sets `settings` on this node (in this network namespace), logging each
/// value; never fails.
pub fn apply(settings: &ConntrackSettings) -> Vec<(Write, Outcome)> {
    apply_at(
        &plan(settings, online_cpus()),
        Path::new(NETFILTER_SYSCTLS),
        Path::new(HASHSIZE),
    )
}

/// [`apply`] of `writes` with the sysctls under `sysctls` and the hash size
/// at `hashsize`.
pub fn apply_at(writes: &[Write], sysctls: &Path, hashsize: &Path) -> Vec<(Write, Outcome)> {
    let mut max_set = false;
    let mut done = Vec::with_capacity(writes.len());
    for w in writes {
        let outcome = match w {
            Write::Sysctl { name, value } => {
                let outcome = set(&sysctls.join(name), *value, false);
                if *name == "nf_conntrack_max" {
                    max_set = matches!(outcome, Outcome::Set { .. } | Outcome::AlreadySet);
                }
                log(&format!("net.netfilter.{name}"), *value, &outcome);
                outcome
            }
            Write::Hashsize(value) => {
                let outcome = if max_set {
                    set(hashsize, *value, true)
                } else {
                    Outcome::Skipped
                };
                log("nf_conntrack hashsize", *value, &outcome);
                outcome
            }
        };
        done.push((w.clone(), outcome));
    }
    done
}

/// Sets `path` to `value` when it differs (`only_raise`: when smaller).
fn set(path: &Path, value: u64, only_raise: bool) -> Outcome {
    let current = match std::fs::read_to_string(path) {
        Ok(s) => s.trim().parse::<u64>().ok(),
        Err(e) if e.kind() == ErrorKind::NotFound => return Outcome::Absent,
        Err(e) => return Outcome::Failed(format!("reading {}: {e}", path.display())),
    };
    match current {
        Some(c) if c == value => return Outcome::AlreadySet,
        Some(c) if only_raise && c > value => return Outcome::Larger(c),
        _ => {}
    }
    if let Ok(meta) = std::fs::metadata(path) {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o222 == 0 {
            return Outcome::ReadOnly;
        }
    }
    match std::fs::write(path, value.to_string()) {
        Ok(()) => Outcome::Set {
            from: current.unwrap_or_default(),
        },
        // A read-only sysfs, or the hash size outside the initial network
        // namespace (EOPNOTSUPP).
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem
            ) || e.raw_os_error() == Some(libc::EOPNOTSUPP) =>
        {
            Outcome::ReadOnly
        }
        Err(e) => Outcome::Failed(format!("writing {}: {e}", path.display())),
    }
}

fn log(what: &str, value: u64, outcome: &Outcome) {
    match outcome {
        Outcome::Set { from } => tracing::info!(from, to = value, "set {what}"),
        Outcome::AlreadySet => tracing::debug!(value, "{what} already set"),
        Outcome::Larger(current) => {
            tracing::debug!(current, wanted = value, "{what} already larger; kept")
        }
        Outcome::Absent => tracing::info!(
            wanted = value,
            "{what} not set: absent here (nf_conntrack not loaded)"
        ),
        Outcome::ReadOnly => tracing::info!(
            wanted = value,
            "{what} not set: read-only here (outside the initial network namespace, or /proc/sys or /sys mounted read-only as in an unprivileged container)"
        ),
        Outcome::Skipped => {
            tracing::debug!(wanted = value, "{what} not set: nf_conntrack_max was not")
        }
        Outcome::Failed(reason) => {
            tracing::warn!(wanted = value, reason = %reason, "{what} not set")
        }
    }
}

#[cfg(test)]
#[path = "conntrack_sysctl_tests.rs"]
mod tests;
