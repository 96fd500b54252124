//! The one-off events a cell puts the daemon through: SIGKILL and restart
//! under load, an API server restart (relist), every pod rotated at once.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::{kill, line_reader, Episode, Restart, Settings};
use crate::bench::daemon::{self, unix_now};
use crate::bench::manifests::{self, Scale};
use crate::e2e::bed::Bed;
use crate::e2e::fake_apiserver::FakeApiServer;

/// SIGKILL and restart while a client connects to the probe ClusterIP
/// every 5 ms: the requests that failed and the seconds from the restart
/// to the whole state programmed again.
pub(super) fn restart_under_load(
    bed: &mut Bed,
    total: u64,
    settings: &Settings,
) -> Result<Restart> {
    let mut client = bed.spawn_client(
        None,
        &[
            "--proto",
            "tcp",
            "--target",
            &format!("{}:80", manifests::PROBE_IP),
            "--duration-ms",
            "900000",
            "--interval-ms",
            "5",
            "--timeout-ms",
            "500",
        ],
    )?;
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let rx = line_reader(&mut client)?;
    let sink = lines.clone();
    let collector = std::thread::spawn(move || {
        for l in rx {
            sink.lock().unwrap_or_else(|e| e.into_inner()).push(l);
        }
    });
    let result = (|| -> Result<Restart> {
        std::thread::sleep(Duration::from_secs(1));
        let oks = |v: &[String]| v.iter().filter(|l| l.starts_with("ok ")).count();
        if oks(&lines.lock().unwrap_or_else(|e| e.into_inner())) == 0 {
            bail!("the probe ClusterIP answered nothing before the restart");
        }
        bed.kill_daemon();
        let restarted = unix_now();
        bed.spawn_daemon()?;
        let p = daemon::wait_for(
            bed,
            settings.sync_timeout,
            Duration::from_millis(20),
            "reconciled after the restart",
            |p| p.programmed_rev >= 1 && p.programmed_rev >= p.state_rev && p.services == total,
        )?;
        std::thread::sleep(Duration::from_secs(1));
        Ok(Restart {
            requests: 0,
            failed: 0,
            reconcile_s: p.programmed_at - restarted,
        })
    })();
    kill(&mut client);
    let _ = collector.join();
    let mut r = result?;
    let all = lines.lock().unwrap_or_else(|e| e.into_inner());
    r.requests = all.len();
    r.failed = all.iter().filter(|l| !l.starts_with("ok ")).count();
    Ok(r)
}

/// Restarts the API server (a new resourceVersion history, nothing
/// changed): every watch gets 410 Gone and lists again, and the daemon
/// should take in what changed (nothing), not hold a second copy of the
/// cluster. Waits for each resource's "relisted" log line.
pub(super) fn relist(bed: &mut Bed, api: &FakeApiServer) -> Result<Episode> {
    // Services, EndpointSlices, the Node, its Pods.
    const RESOURCES: usize = 4;
    let relisted = |bed: &Bed| bed.daemon_log().matches("relisted").count();
    let before = relisted(bed);
    let started = Instant::now();
    api.restart();
    while relisted(bed) < before + RESOURCES {
        if !bed.daemon_alive()? {
            bail!("the daemon exited; log:\n{}", daemon::log_tail(bed, 15));
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!(
                "not relisted within 60 s; log:\n{}",
                daemon::log_tail(bed, 20)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Episode {
        seconds: started.elapsed().as_secs_f64(),
        peak_rss_mib: daemon::peak_rss_mib(bed)?,
    })
}

/// Every generated manifest rewritten with its pods rotated, then all
/// renamed into place at once. The file source takes each file whole but
/// may take the burst in more than one state; the rotation is in when the
/// service the last file adds is programmed.
pub(super) fn rotation(bed: &mut Bed, dir: &Path, scale: Scale) -> Result<Episode> {
    let staged = manifests::stage_rotated(dir, scale)?;
    let before = daemon::progress(bed)?;
    let started = unix_now();
    manifests::rename_all(&staged)?;
    let p = daemon::wait_for(
        bed,
        Duration::from_secs(120),
        Duration::from_millis(20),
        "the rotation programmed",
        |p| p.services > before.services && p.programmed_rev >= p.state_rev,
    )?;
    Ok(Episode {
        seconds: p.programmed_at - started,
        peak_rss_mib: daemon::peak_rss_mib(bed)?,
    })
}
