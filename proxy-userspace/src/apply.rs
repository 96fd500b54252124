//! The apply coordinator: the one place that decides how a new
//! [`LocalState`] reaches the datapath, whichever datapath runs.
//!
//! * **Full or partial.** The first apply, and every apply after a failure,
//!   programs the whole state ([`Datapath::program_all`]); otherwise only
//!   the services that differ from what is programmed, plus those whose
//!   owned addresses moved, go to [`Datapath::program_changes`].
//! * **Who owns an address.** [`Claims`] decides once which service owns a
//!   contested (IP, protocol, port); the datapaths program only what a
//!   service owns. The loser is logged and counted
//!   (`ebpf_kube_proxy_address_conflicts`); when the owner goes away, the
//!   next claimant is reprogrammed in the same sync.
//! * **Retry.** A failed apply is retried on the `--sync-period` timer,
//!   doubling up to [`MAX_RETRY_FACTOR`] periods while it keeps failing
//!   (kube-proxy's `syncRunner.RetryAfter(syncPeriod)`), even when no new
//!   state arrives; a new state is tried at once.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::datapath::{ApplyStats, Datapath, DatapathError, ServiceChange};
use crate::model::claims::Claims;
use crate::model::{for_each_changed, LocalState, ObjectKey};
use crate::snapshot::{Follower, SnapshotReceiver};
use crate::status::Status;

/// Test hook (SPEC §10.3): while the file it names exists, the datapath
/// applies nothing (a stuck datapath).
pub const STALL_DATAPATH_ENV: &str = "EBPF_KUBE_PROXY_TEST_STALL_DATAPATH";
/// Test hook (SPEC §10.3): the next N applies (N the variable's value) fail
/// before reaching the datapath, as a refused kernel write would.
pub const FAIL_APPLIES_ENV: &str = "EBPF_KUBE_PROXY_TEST_FAIL_APPLIES";
/// How often a stalled datapath checks whether the stall file is gone.
const STALL_RECHECK: Duration = Duration::from_millis(100);
/// Retries back off up to this many sync periods.
pub const MAX_RETRY_FACTOR: u32 = 16;
/// Partial syncs are logged at info level at most this often (each full
/// sync always is); the ones in between are folded into the next line.
const SYNC_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Rate limit of the info-level sync line.
#[derive(Debug, Default)]
struct SyncLog {
    last: Option<Instant>,
    /// Partial syncs not logged since `last`, and the services they changed.
    folded: u32,
    folded_changed: usize,
}

impl SyncLog {
    /// Whether the sync that just ended at `now` gets a line; if so, the
    /// syncs folded into it (count, services changed).
    fn admit(&mut self, now: Instant, full: bool, changed: usize) -> Option<(u32, usize)> {
        let due = self
            .last
            .is_none_or(|t| now.duration_since(t) >= SYNC_LOG_INTERVAL);
        if full || due {
            self.last = Some(now);
            Some((
                std::mem::take(&mut self.folded),
                std::mem::take(&mut self.folded_changed),
            ))
        } else {
            self.folded += 1;
            self.folded_changed += changed;
            None
        }
    }
}

/// What one successful apply did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    pub full: bool,
    pub stats: ApplyStats,
}

/// Programs states into one datapath, remembering what it programmed.
pub struct Applier {
    datapath: Box<dyn Datapath>,
    programmed: Arc<LocalState>,
    claims: Claims,
    full_next: bool,
    /// Remaining applies the [`FAIL_APPLIES_ENV`] hook fails.
    fail_next: u32,
}

impl Applier {
    pub fn new(datapath: Box<dyn Datapath>) -> Self {
        let fail_next = std::env::var(FAIL_APPLIES_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        Self {
            datapath,
            programmed: Arc::default(),
            claims: Claims::default(),
            full_next: true,
            fail_next,
        }
    }

    pub fn datapath(&self) -> &dyn Datapath {
        self.datapath.as_ref()
    }

    pub fn datapath_mut(&mut self) -> &mut dyn Datapath {
        self.datapath.as_mut()
    }

    /// Claims that lost their address to an older service, now.
    pub fn address_conflicts(&self) -> usize {
        self.claims.lost_claims()
    }

    /// Programs `next`. On failure the next apply is a full one.
    pub fn apply(&mut self, next: &Arc<LocalState>) -> Result<Applied, DatapathError> {
        let full = self.full_next;
        self.full_next = true;
        if self.fail_next > 0 {
            self.fail_next -= 1;
            return Err(DatapathError::Apply {
                mode: self.datapath.mode(),
                reason: format!("failed by {FAIL_APPLIES_ENV} (test hook)"),
            });
        }
        let stats = if full {
            self.claims = Claims::of(next);
            for c in self.claims.conflicts() {
                for loser in &c.losers {
                    log_lost(loser, &c.frontend.to_string(), &c.owner);
                }
            }
            self.datapath.program_all(next, &self.claims)?
        } else {
            self.program_changes(next)?
        };
        self.programmed = next.clone();
        self.full_next = false;
        Ok(Applied { full, stats })
    }

    fn program_changes(&mut self, next: &LocalState) -> Result<ApplyStats, DatapathError> {
        let (claims, prev) = (&mut self.claims, &self.programmed);
        let mut changed: Vec<ServiceChange<'_>> = Vec::new();
        let mut moved: BTreeSet<ObjectKey> = BTreeSet::new();
        for_each_changed(prev, next, |key, new| {
            moved.extend(claims.update(key, new.map(|s| &s.service)));
            changed.push(ServiceChange { key, next: new });
        });
        // Services that won or lost an address without changing
        // themselves are reprogrammed as they are.
        for key in &moved {
            if !changed.iter().any(|c| c.key == key) {
                if let Some(se) = next.service(key) {
                    changed.push(ServiceChange {
                        key: &se.service.key,
                        next: Some(se),
                    });
                }
            }
        }
        for c in &changed {
            for (frontend, owner) in self.claims.losses(c.key) {
                log_lost(c.key, &frontend.to_string(), owner);
            }
        }
        self.datapath
            .program_changes(&self.programmed, next, &changed, &self.claims)
    }
}

fn log_lost(loser: &ObjectKey, frontend: &str, owner: &ObjectKey) {
    tracing::warn!(
        service = %format!("{}/{}", loser.namespace, loser.name),
        %frontend,
        owner = %format!("{}/{}", owner.namespace, owner.name),
        "two services claim one address; the older one owns it"
    );
}

/// When to retry after `failures` consecutive failed applies.
pub fn retry_delay(sync_period: Duration, failures: u32) -> Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(4);
    sync_period * factor.min(MAX_RETRY_FACTOR)
}

/// Applies every new snapshot, newest first (a slow apply skips
/// intermediate revisions), retries failures on the sync-period timer, and
/// reports every apply to `status`. Ends with `shutdown` or the snapshot
/// channel.
pub async fn run(
    mut applier: Applier,
    snapshots: SnapshotReceiver,
    shutdown: CancellationToken,
    status: Arc<Status>,
    sync_period: Duration,
) {
    let stall_file = std::env::var_os(STALL_DATAPATH_ENV).map(PathBuf::from);
    let mut failures = 0u32;
    let mut sync_log = SyncLog::default();
    let mut follower = Follower::new(snapshots, shutdown);
    while let Some(snapshot) = follower.next().await {
        if stall_file.as_deref().is_some_and(|p| p.exists()) {
            follower.again_after(STALL_RECHECK);
            continue;
        }
        if !snapshot.is_synced() {
            continue;
        }
        let started = Instant::now();
        match applier.apply(&snapshot.state) {
            Ok(applied) => {
                let elapsed = started.elapsed();
                failures = 0;
                status.datapath_applied(snapshot.rev, &snapshot.state, elapsed);
                status.set_map_entries(&applier.datapath().map_entries());
                status.set_address_conflicts(applier.address_conflicts());
                let changed = applied.stats.services_changed;
                if let Some((folded, folded_changed)) =
                    sync_log.admit(Instant::now(), applied.full, changed)
                {
                    tracing::info!(
                        kind = if applied.full { "full" } else { "partial" },
                        rev = snapshot.rev,
                        mode = %applier.datapath().mode(),
                        services = snapshot.state.services.len(),
                        endpoints = snapshot.state.endpoint_count(),
                        services_changed = changed,
                        duration_ms = elapsed.as_secs_f64() * 1e3,
                        earlier_syncs_not_logged = folded,
                        earlier_services_changed = folded_changed,
                        "datapath synced"
                    );
                } else {
                    tracing::debug!(
                        rev = snapshot.rev,
                        full = applied.full,
                        services_changed = changed,
                        ?elapsed,
                        "datapath synced"
                    );
                }
            }
            Err(e) => {
                failures += 1;
                let delay = retry_delay(sync_period, failures);
                status.datapath_apply_failed();
                tracing::error!(rev = snapshot.rev, error = %e, retry_in = ?delay, "datapath apply failed; retrying with a full sync");
                // A new state is tried at once, whatever the timer says.
                follower.again_after(delay);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_syncs_are_logged_at_most_once_per_interval_and_full_ones_always() {
        let mut log = SyncLog::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(log.admit(at(0), true, 100), Some((0, 0)));
        assert_eq!(log.admit(at(1), false, 1), None);
        assert_eq!(log.admit(at(2), false, 2), None);
        assert_eq!(log.admit(at(3), true, 5), Some((2, 3)), "full: always");
        assert_eq!(log.admit(at(4), false, 1), None);
        assert_eq!(log.admit(at(13), false, 1), Some((1, 1)), "interval over");
        assert_eq!(log.admit(at(14), false, 1), None);
    }

    #[test]
    fn retries_back_off_from_one_sync_period_to_sixteen() {
        let p = Duration::from_secs(30);
        let delays: Vec<u64> = (1..=7).map(|n| retry_delay(p, n).as_secs()).collect();
        assert_eq!(delays, [30, 60, 120, 240, 480, 480, 480]);
    }
}
