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
//! * **Drift.** Every sync period, and on request (SIGHUP), the datapath
//!   compares the kernel with what it programmed ([`Datapath::verify`]);
//!   a difference (an entry deleted or changed by hand, a detached
//!   program, a flushed table) is logged at warn with what differed,
//!   counted (`ebpf_kube_proxy_datapath_drift_total{kind}`) and repaired
//!   at once by a full sync. Where the datapath can check away from
//!   itself ([`Datapath::drift_check`]), the check runs on a blocking
//!   thread on a copy of what was programmed, and applies go on meanwhile;
//!   a difference in a service applied since, or one a full sync since
//!   has repaired, is not drift.

use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::datapath::drift::DriftMetrics;
use crate::datapath::{ApplyStats, Datapath, DatapathError, Drift, DriftCheck, ServiceChange};
use crate::model::claims::Claims;
use crate::model::{for_each_changed, LocalState, ObjectKey};
use crate::snapshot::{Follower, Snapshot, SnapshotReceiver};
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
        self.apply_changes(next, None)
    }

    /// Programs `next`, given (when known) the keys of the services that
    /// differ between what is programmed and `next`: then a partial sync
    /// looks at those services only. Without them it compares the two
    /// states (a pointer comparison per unchanged service).
    pub fn apply_changes(
        &mut self,
        next: &Arc<LocalState>,
        changed: Option<&[ObjectKey]>,
    ) -> Result<Applied, DatapathError> {
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
            self.program_changes(next, changed)?
        };
        self.programmed = next.clone();
        self.full_next = false;
        Ok(Applied { full, stats })
    }

    /// Compares the kernel with what was programmed (see
    /// [`Datapath::verify`]); any difference makes the next apply a full
    /// one.
    pub fn verify(&mut self) -> Result<Vec<Drift>, DatapathError> {
        let drifts = self.datapath.verify(&self.programmed, &self.claims)?;
        if !drifts.is_empty() {
            self.full_next = true;
        }
        Ok(drifts)
    }

    /// [`Datapath::drift_check`] of what is programmed now.
    pub fn drift_check(&self) -> Option<DriftCheck> {
        self.datapath
            .drift_check(self.programmed.clone(), self.claims.clone())
    }

    /// The state last programmed.
    pub fn programmed(&self) -> &Arc<LocalState> {
        &self.programmed
    }

    /// A drift check run away from the datapath found a difference: the
    /// next apply is a full one.
    pub fn drift_found(&mut self) {
        self.full_next = true;
    }

    /// The node's addresses changed: the datapath follows them, and a full
    /// sync comes next when its frontends depend on them.
    pub fn node_addresses_changed(&mut self) -> Result<bool, DatapathError> {
        let full = self.datapath.node_addresses_changed()?;
        self.full_next |= full;
        Ok(full)
    }

    fn program_changes(
        &mut self,
        next: &LocalState,
        hint: Option<&[ObjectKey]>,
    ) -> Result<ApplyStats, DatapathError> {
        let (claims, prev) = (&mut self.claims, &self.programmed);
        let mut changed: Vec<ServiceChange<'_>> = Vec::new();
        match hint {
            Some(keys) => changed.extend(keys.iter().map(|key| ServiceChange {
                key,
                next: next.service(key),
            })),
            None => for_each_changed(prev, next, |key, new| {
                changed.push(ServiceChange { key, next: new });
            }),
        }
        let mut moved: BTreeSet<ObjectKey> = BTreeSet::new();
        for c in &changed {
            moved.extend(claims.update(c.key, c.next.map(|s| &s.service)));
        }
        // Services that won or lost an address without changing
        // themselves are reprogrammed as they are.
        let listed: HashSet<&ObjectKey> = changed.iter().map(|c| c.key).collect();
        for key in &moved {
            if !listed.contains(key) {
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

/// A periodic drift check waits at least this many times as long as the
/// last one took (see `Coordinator::check_interval`).
const CHECK_TIME_SHARE: u32 = 100;

/// Time to the next periodic drift check after one that took `took`: at
/// least `sync_period`, else [`CHECK_TIME_SHARE`] times the check's cost.
fn check_interval(sync_period: Duration, took: Duration) -> Duration {
    sync_period.max(took.saturating_mul(CHECK_TIME_SHARE))
}

/// When to retry after `failures` consecutive failed applies.
pub fn retry_delay(sync_period: Duration, failures: u32) -> Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(4);
    sync_period * factor.min(MAX_RETRY_FACTOR)
}

/// Why the coordinator woke up.
enum Wake {
    /// A new snapshot, or a timer (retry, stall recheck, drift check).
    Snapshot(Arc<Snapshot>),
    /// An operator asked for a drift check (SIGHUP).
    CheckRequested,
    /// The node's addresses or interfaces changed.
    NodeAddresses,
    /// The drift check running beside the applies ended.
    CheckDone(Result<Result<Vec<Drift>, DatapathError>, tokio::task::JoinError>),
}

/// A drift check running on a blocking thread.
struct RunningCheck {
    handle: JoinHandle<Result<Vec<Drift>, DatapathError>>,
    trigger: &'static str,
    started: Instant,
    /// What it compares the kernel with.
    state: Arc<LocalState>,
    /// [`Coordinator::applies`] when it started.
    applies: u64,
}

/// Waits for the running check, if any (otherwise forever).
async fn check_done(
    check: &mut Option<RunningCheck>,
) -> Result<Result<Vec<Drift>, DatapathError>, tokio::task::JoinError> {
    match check {
        Some(c) => (&mut c.handle).await,
        None => std::future::pending().await,
    }
}

/// The coordinator's loop state between wake-ups.
struct Coordinator {
    applier: Applier,
    status: Arc<Status>,
    sync_period: Duration,
    drift_metrics: Option<DriftMetrics>,
    failures: u32,
    sync_log: SyncLog,
    /// The revision the datapath holds; `None` before the first successful
    /// apply and after a failed one (a full sync is due anyway).
    programmed_rev: Option<u64>,
    /// A retry (or a stall recheck) is due then.
    retry_at: Option<Instant>,
    /// The next drift check is due then.
    check_due: Instant,
    /// Applies tried (and node address changes followed) so far.
    applies: u64,
    /// [`Coordinator::applies`] after the last full sync.
    full_at: u64,
    /// The drift check running beside the applies.
    checking: Option<RunningCheck>,
}

impl Coordinator {
    /// When the follower should wake without a change: a retry, else the
    /// next drift check once something is programmed.
    fn wake_at(&self) -> Option<Instant> {
        self.retry_at
            .or_else(|| self.programmed_rev.map(|_| self.check_due))
    }

    fn apply(&mut self, snapshot: &Snapshot) {
        let started = Instant::now();
        let changed = snapshot.changed_since(self.programmed_rev);
        self.applies += 1;
        match self.applier.apply_changes(&snapshot.state, changed) {
            Ok(applied) => {
                let elapsed = started.elapsed();
                if applied.full {
                    self.full_at = self.applies;
                }
                self.failures = 0;
                self.programmed_rev = Some(snapshot.rev);
                self.retry_at = None;
                let (status, applier) = (&self.status, &self.applier);
                status.datapath_applied(snapshot.rev, &snapshot.state, elapsed);
                status.set_map_entries(&applier.datapath().map_entries());
                status.set_address_conflicts(applier.address_conflicts());
                let changed = applied.stats.services_changed;
                if let Some((folded, folded_changed)) =
                    self.sync_log.admit(Instant::now(), applied.full, changed)
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
                self.failures += 1;
                self.programmed_rev = None;
                let delay = retry_delay(self.sync_period, self.failures);
                self.retry_at = Some(Instant::now() + delay);
                self.status.datapath_apply_failed();
                tracing::error!(rev = snapshot.rev, error = %e, retry_in = ?delay, "datapath apply failed; retrying with a full sync");
            }
        }
    }

    /// The node's addresses changed (see [`Applier::node_addresses_changed`]).
    fn node_addresses_changed(&mut self) -> Result<bool, DatapathError> {
        // What a running check compares with may no longer hold.
        self.applies += 1;
        self.applier.node_addresses_changed()
    }

    /// Starts a drift check: beside the applies when the datapath can
    /// check away from itself, else in place ([`Coordinator::check_drift`]).
    fn start_check(&mut self, latest: &Snapshot, trigger: &'static str) {
        if self.checking.is_some() {
            if trigger == TRIGGER_REQUESTED {
                tracing::info!(
                    trigger,
                    "datapath drift check requested while one runs; its verdict answers"
                );
            }
            return;
        }
        let Some(job) = self.applier.drift_check() else {
            self.check_drift(latest, trigger);
            return;
        };
        // Due again one period after this one ends; not before.
        self.check_due = Instant::now() + self.sync_period;
        self.checking = Some(RunningCheck {
            handle: tokio::task::spawn_blocking(job),
            trigger,
            started: Instant::now(),
            state: self.applier.programmed().clone(),
            applies: self.applies,
        });
    }

    /// The check running beside the applies ended. When something was
    /// applied meanwhile, its verdict is weighed against what is
    /// programmed now: a full sync since repaired anything it found; a
    /// difference in a service applied since is the apply, not drift; a
    /// difference no service owns (a chain's rules, the hairpin set, the
    /// table) cannot be told apart from one, so it is checked again at
    /// once. What remains is drift, handled as in place.
    fn check_finished(
        &mut self,
        result: Result<Result<Vec<Drift>, DatapathError>, tokio::task::JoinError>,
        latest: Option<&Snapshot>,
    ) {
        let Some(check) = self.checking.take() else {
            return;
        };
        let result = result.unwrap_or_else(|e| {
            Err(DatapathError::Apply {
                mode: self.applier.datapath().mode(),
                reason: format!("drift check task: {e}"),
            })
        });
        let applied_since = self.applies != check.applies;
        let result = match result {
            Ok(drifts) if applied_since && !drifts.is_empty() => {
                if self.full_at > check.applies || self.programmed_rev.is_none() {
                    tracing::debug!(
                        found = drifts.len(),
                        "datapath drift check overtaken by a full sync; its verdict is dropped"
                    );
                    Ok(Vec::new())
                } else {
                    let changed = changed_services(&check.state, self.applier.programmed());
                    let (unowned, owned): (Vec<Drift>, Vec<Drift>) = drifts
                        .into_iter()
                        .filter(|d| d.service.as_ref().is_none_or(|s| !changed.contains(s)))
                        .partition(|d| d.service.is_none());
                    if owned.is_empty() && !unowned.is_empty() {
                        tracing::debug!(
                            found = unowned.len(),
                            "datapath drift check overtaken by an apply; checking again"
                        );
                        self.check_due = Instant::now();
                        return;
                    }
                    Ok(owned.into_iter().chain(unowned).collect())
                }
            }
            other => other,
        };
        let took = check.started.elapsed();
        self.check_due = Instant::now() + self.check_interval(took);
        self.verdict(result, latest, check.trigger, took.as_secs_f64() * 1e3);
    }

    /// Compares the kernel with what was programmed, in place; a
    /// difference is logged, counted and repaired at once by a full sync
    /// of `latest`.
    fn check_drift(&mut self, latest: &Snapshot, trigger: &'static str) {
        let started = Instant::now();
        let result = self.applier.verify();
        let took = started.elapsed();
        let duration_ms = took.as_secs_f64() * 1e3;
        self.check_due = Instant::now() + self.check_interval(took);
        self.verdict(result, Some(latest), trigger, duration_ms);
    }

    /// Time to the next periodic drift check after one that took `took`:
    /// one sync period, or longer where a check is costly (a million
    /// endpoints read back from the kernel), so that checking stays under
    /// 1 % of the time (of a core) while nothing else happens.
    fn check_interval(&self, took: Duration) -> Duration {
        check_interval(self.sync_period, took)
    }

    /// Logs a check's verdict; drift is counted and repaired by a full
    /// sync of `latest`.
    fn verdict(
        &mut self,
        result: Result<Vec<Drift>, DatapathError>,
        latest: Option<&Snapshot>,
        trigger: &'static str,
        duration_ms: f64,
    ) {
        match result {
            Ok(drifts) if drifts.is_empty() => {
                if trigger == TRIGGER_REQUESTED {
                    tracing::info!(
                        trigger,
                        duration_ms,
                        "datapath drift check: the kernel holds what was programmed"
                    );
                } else {
                    tracing::debug!(
                        trigger,
                        duration_ms,
                        "datapath drift check: the kernel holds what was programmed"
                    );
                }
            }
            Ok(drifts) => {
                crate::datapath::drift::log(&drifts, self.applier.datapath().mode());
                if let Some(m) = &self.drift_metrics {
                    m.count(&drifts);
                }
                if crate::datapath::drift::needs_full_sync(&drifts) {
                    self.applier.drift_found();
                    if let Some(latest) = latest {
                        self.apply(latest);
                    }
                }
            }
            Err(e) => tracing::warn!(
                trigger,
                error = %e,
                "datapath drift check failed; trying again after one sync period"
            ),
        }
    }
}

/// The keys (`namespace/name`) of the services that differ between `a`
/// and `b`.
fn changed_services(a: &LocalState, b: &LocalState) -> HashSet<String> {
    let mut out = HashSet::new();
    for_each_changed(a, b, |key, _| {
        out.insert(key.to_string());
    });
    out
}

/// `trigger` of a drift check on SIGHUP (the other is `sync-period`).
const TRIGGER_REQUESTED: &str = "requested";

/// Applies every new snapshot, newest first (a slow apply skips
/// intermediate revisions), retries failures on the sync-period timer, and
/// reports every apply to `status`. Every sync period, and whenever
/// `drift_checks` is notified (SIGHUP), it compares what the kernel holds
/// with what it programmed ([`Datapath::verify`]) and repairs any
/// difference with a full sync. Ends with `shutdown` or the snapshot
/// channel.
pub async fn run(
    applier: Applier,
    snapshots: SnapshotReceiver,
    shutdown: CancellationToken,
    status: Arc<Status>,
    sync_period: Duration,
    drift_checks: Arc<Notify>,
    node_addresses: Arc<Notify>,
) {
    let stall_file = std::env::var_os(STALL_DATAPATH_ENV).map(PathBuf::from);
    let drift_metrics = DriftMetrics::register(status.metrics().registry())
        .inspect_err(
            |e| tracing::warn!(error = %e, "ebpf_kube_proxy_datapath_drift_total is not exported"),
        )
        .ok();
    let mut c = Coordinator {
        applier,
        status,
        sync_period,
        drift_metrics,
        failures: 0,
        sync_log: SyncLog::default(),
        programmed_rev: None,
        retry_at: None,
        check_due: Instant::now() + sync_period,
        applies: 0,
        full_at: 0,
        checking: None,
    };
    let mut latest: Option<Arc<Snapshot>> = None;
    let mut follower = Follower::new(snapshots, shutdown);
    loop {
        if let Some(at) = c.wake_at() {
            follower.again_after(at.saturating_duration_since(Instant::now()));
        }
        // A check request drops the follower's wait; the timer is set
        // again above, and a change is still pending in the channel.
        let wake = tokio::select! {
            s = follower.next() => match s {
                Some(s) => Wake::Snapshot(s),
                None => break,
            },
            () = drift_checks.notified() => Wake::CheckRequested,
            () = node_addresses.notified() => Wake::NodeAddresses,
            r = check_done(&mut c.checking) => Wake::CheckDone(r),
        };
        match wake {
            Wake::Snapshot(snapshot) => {
                if stall_file.as_deref().is_some_and(|p| p.exists()) {
                    c.retry_at = Some(Instant::now() + STALL_RECHECK);
                    continue;
                }
                if !snapshot.is_synced() {
                    continue;
                }
                if c.programmed_rev != Some(snapshot.rev) {
                    // A new state is tried at once, whatever the timer says.
                    c.apply(&snapshot);
                } else if c.retry_at.is_some_and(|t| Instant::now() >= t) {
                    c.retry_at = None; // the end of a stall
                }
                if c.programmed_rev.is_some()
                    && c.checking.is_none()
                    && Instant::now() >= c.check_due
                {
                    c.start_check(&snapshot, "sync-period");
                }
                latest = Some(snapshot);
            }
            Wake::CheckRequested => match &latest {
                Some(s) if c.programmed_rev.is_some() => {
                    let s = s.clone();
                    c.start_check(&s, TRIGGER_REQUESTED);
                }
                _ => tracing::info!(
                    "datapath drift check requested, but nothing is programmed yet (or a full sync after a failure is due anyway)"
                ),
            },
            Wake::CheckDone(result) => {
                let latest = latest.clone().filter(|_| c.programmed_rev.is_some());
                c.check_finished(result, latest.as_deref());
            }
            Wake::NodeAddresses => match c.node_addresses_changed() {
                Ok(true) => {
                    if let Some(s) = latest.clone().filter(|_| c.programmed_rev.is_some()) {
                        c.programmed_rev = None;
                        c.apply(&s);
                    }
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "following the node's addresses failed; retrying with a full sync");
                    c.programmed_rev = None;
                    c.retry_at = Some(Instant::now());
                }
            },
        }
    }
}

#[cfg(test)]
#[path = "apply_tests.rs"]
mod tests;
