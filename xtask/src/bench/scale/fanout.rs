//! The localnet fan-out of a cell: from one change to every watcher
//! holding it, with the CPU the daemon and the watchers spent on it.

use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::{kill, line_reader, Driver, FanOut, FanoutCpu, Settings};
use crate::bench::daemon::{self, unix_now};
use crate::e2e::bed::Bed;

const FANOUT_TIMEOUT: Duration = Duration::from_secs(120);
const FANOUT_RSS_CAP_MIB: f64 = 6144.0;

/// From one change to every one of the watchers holding it: how long,
/// the bytes of a full frame on the wire, and the CPU the daemon and the
/// watchers spent meanwhile; `deltas`: watchers that ask for delta frames.
pub(super) fn fanout(
    bed: &mut Bed,
    driver: &Driver,
    pods: &[String],
    generation: usize,
    deltas: bool,
    settings: &Settings,
) -> Result<FanOut> {
    let mut helper = Command::new(&settings.fanout_bin)
        .arg("--target")
        .arg(format!("unix:{}", bed.localnet_socket.display()))
        .args(["--clients", &settings.watchers.to_string()])
        .args(deltas.then_some("--deltas"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", settings.fanout_bin.display()))?;
    let helper_pid = helper.id();
    let result = (|| -> Result<FanOut> {
        let lines = line_reader(&mut helper)?;
        let ready = next_line(bed, &lines, "the watchers did not all get the first state")?;
        let (ready_rev, frame_bytes): (u64, usize) = ready
            .strip_prefix("ready ")
            .and_then(|r| r.split_once(' '))
            .and_then(|(rev, bytes)| Some((rev.parse().ok()?, bytes.parse().ok()?)))
            .with_context(|| format!("unexpected line {ready:?}"))?;
        let cpu = || -> Result<(u64, u64)> {
            Ok((daemon::cpu_ticks(bed)?, daemon::pid_cpu_ticks(helper_pid)?))
        };
        let before = cpu()?;
        let written = unix_now();
        driver.change(pods, generation)?;
        loop {
            let line = next_line(bed, &lines, "the watchers did not all get the new revision")?;
            let mut words = line.split_whitespace().skip(1);
            let rev: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
            let at: f64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0.0);
            if rev > ready_rev {
                let after = cpu()?;
                return Ok(FanOut {
                    ms: 1e3 * (at - written),
                    frame_bytes,
                    cpu: FanoutCpu {
                        daemon_s: daemon::cpu_seconds(after.0 - before.0),
                        watchers_s: daemon::cpu_seconds(after.1 - before.1),
                    },
                });
            }
        }
    })();
    kill(&mut helper);
    if result.is_err() {
        let mut err = String::new();
        if let Some(mut e) = helper.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        return result.with_context(|| format!("fan-out helper: {}", err.trim()));
    }
    result
}

/// The fan-out helper's next line, within [`FANOUT_TIMEOUT`]; gives up
/// early when the daemon's RSS passes [`FANOUT_RSS_CAP_MIB`] (a copy of the
/// state per watcher must not take the machine down).
fn next_line(bed: &Bed, lines: &mpsc::Receiver<String>, what: &str) -> Result<String> {
    let deadline = Instant::now() + FANOUT_TIMEOUT;
    loop {
        match lines.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => return Ok(line),
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("{what}: the helper exited"),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if Instant::now() > deadline {
            bail!("{what} within {} s", FANOUT_TIMEOUT.as_secs());
        }
        let rss = daemon::rss_mib(bed)?;
        if rss > FANOUT_RSS_CAP_MIB {
            bail!("{what}: stopped at a daemon RSS of {rss:.0} MiB (cap {FANOUT_RSS_CAP_MIB} MiB)");
        }
    }
}
