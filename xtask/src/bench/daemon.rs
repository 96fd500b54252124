//! What the benchmark reads from the running daemon: its `/metrics` page
//! (revisions and the daemon's own timestamps) and `/proc/PID`.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

use crate::e2e::bed::Bed;

/// The figures of one `/metrics` page the benchmark needs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Progress {
    /// `ebpf_kube_proxy_localstate_revision`.
    pub state_rev: u64,
    /// `ebpf_kube_proxy_localstate_timestamp_seconds`: when it was computed.
    pub state_at: f64,
    /// `ebpf_kube_proxy_datapath_revision`.
    pub programmed_rev: u64,
    /// `kubeproxy_sync_proxy_rules_last_timestamp_seconds`.
    pub programmed_at: f64,
    pub services: u64,
    /// `ebpf_kube_proxy_localstate_endpoints`.
    pub endpoints: u64,
    pub apply_errors: u64,
}

/// The value of `name` (a bare series, or the sum of its labelled ones).
pub fn metric(page: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in page.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let value = if let Some(v) = rest.strip_prefix(' ') {
            v
        } else if rest.starts_with('{') {
            match rest.rsplit_once(' ') {
                Some((_, v)) => v,
                None => continue,
            }
        } else {
            continue;
        };
        if let Ok(v) = value.trim().parse::<f64>() {
            found = Some(found.unwrap_or(0.0) + v);
        }
    }
    found
}

/// The first labelled series of `name` (per-family gauges carry the same
/// value for each family).
fn first_series(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .filter_map(|l| l.strip_prefix(name))
        .filter(|r| r.starts_with('{') || r.starts_with(' '))
        .find_map(|r| r.rsplit_once(' ')?.1.trim().parse().ok())
}

pub fn progress(bed: &Bed) -> Result<Progress> {
    let page = bed.metrics()?;
    let int = |name| metric(&page, name).unwrap_or(0.0) as u64;
    Ok(Progress {
        state_rev: int("ebpf_kube_proxy_localstate_revision"),
        state_at: metric(&page, "ebpf_kube_proxy_localstate_timestamp_seconds").unwrap_or(0.0),
        programmed_rev: int("ebpf_kube_proxy_datapath_revision"),
        programmed_at: first_series(&page, "kubeproxy_sync_proxy_rules_last_timestamp_seconds")
            .unwrap_or(0.0),
        services: int("ebpf_kube_proxy_localstate_services"),
        endpoints: int("ebpf_kube_proxy_localstate_endpoints"),
        apply_errors: int("ebpf_kube_proxy_datapath_apply_errors_total"),
    })
}

pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The last lines of the daemon's log, for error messages.
pub fn log_tail(bed: &Bed, lines: usize) -> String {
    let log = bed.daemon_log();
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Polls until `done` holds for the daemon's progress: the progress then,
/// or an error when the daemon exits, fails an apply or `timeout` passes.
pub fn wait_for(
    bed: &mut Bed,
    timeout: Duration,
    every: Duration,
    what: &str,
    done: impl Fn(&Progress) -> bool,
) -> Result<Progress> {
    let started = Instant::now();
    let errors_before = progress(bed).map(|p| p.apply_errors).unwrap_or(0);
    loop {
        if !bed.daemon_alive()? {
            bail!("{what}: the daemon exited; log:\n{}", log_tail(bed, 15));
        }
        // Before the daemon listens, the page cannot be read: keep polling.
        if let Ok(p) = progress(bed) {
            if done(&p) {
                return Ok(p);
            }
            if p.apply_errors > errors_before {
                bail!(
                    "{what}: the datapath apply failed; log:\n{}",
                    log_tail(bed, 5)
                );
            }
        }
        if started.elapsed() > timeout {
            bail!(
                "{what}: not within {} s; log:\n{}",
                timeout.as_secs(),
                log_tail(bed, 5)
            );
        }
        std::thread::sleep(every);
    }
}

fn proc_pid(bed: &Bed) -> Result<u32> {
    bed.daemon_pid().context("the daemon is not running")
}

/// User + system CPU time of the daemon, in clock ticks.
pub fn cpu_ticks(bed: &Bed) -> Result<u64> {
    pid_cpu_ticks(proc_pid(bed)?)
}

/// Seconds of CPU in `ticks`.
pub fn cpu_seconds(ticks: u64) -> f64 {
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// User + system CPU time of process `pid`, in clock ticks.
pub fn pid_cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // The command name may hold spaces: fields count from after its ')'.
    let after = stat.rsplit_once(')').context("malformed stat")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After ')': state is field 3 of stat(5), utime 14, stime 15.
    let field = |n: usize| -> Result<u64> {
        fields
            .get(n - 3)
            .context("short stat")?
            .parse()
            .context("stat field")
    };
    Ok(field(14)? + field(15)?)
}

/// The daemon's CPU use over `window`, in percent of one core.
pub fn idle_cpu(bed: &Bed, window: Duration) -> Result<f64> {
    let before = cpu_ticks(bed)?;
    let started = Instant::now();
    std::thread::sleep(window);
    let used = cpu_seconds(cpu_ticks(bed)? - before);
    Ok(100.0 * used / started.elapsed().as_secs_f64())
}

/// VmHWM (peak resident set) of the daemon, in MiB.
pub fn peak_rss_mib(bed: &Bed) -> Result<f64> {
    status_mib(bed, "VmHWM:")
}

/// VmRSS (resident set now) of the daemon, in MiB.
pub fn rss_mib(bed: &Bed) -> Result<f64> {
    status_mib(bed, "VmRSS:")
}

fn status_mib(bed: &Bed, field: &str) -> Result<f64> {
    let pid = proc_pid(bed)?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .with_context(|| format!("no {field}"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .with_context(|| format!("{field} value"))?;
    Ok(kib / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_by_name_bare_or_summed_over_labels() {
        let page = "# HELP x\n\
            ebpf_kube_proxy_localstate_revision 7\n\
            ebpf_kube_proxy_localstate_revision_other 9\n\
            ebpf_kube_proxy_datapath_apply_errors_total{mode=\"ebpf\"} 2\n\
            ebpf_kube_proxy_datapath_apply_errors_total{mode=\"nftables\"} 1\n\
            kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 1764082549.25\n\
            kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"} 1764082549.25\n";
        assert_eq!(
            metric(page, "ebpf_kube_proxy_localstate_revision"),
            Some(7.0)
        );
        assert_eq!(
            metric(page, "ebpf_kube_proxy_datapath_apply_errors_total"),
            Some(3.0)
        );
        assert_eq!(
            first_series(page, "kubeproxy_sync_proxy_rules_last_timestamp_seconds"),
            Some(1764082549.25)
        );
        assert_eq!(metric(page, "absent"), None);
    }
}
