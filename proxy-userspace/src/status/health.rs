//! kube-proxy's health state (SPEC §4.1) and the JSON body of the health
//! server on 10256 (SPEC §4.2). Pure: every method takes the time.
//!
//! Changes are tracked from the moment they are queued until the datapath
//! apply that covers them: queued changes wait for the syncer to compute
//! them into a revision, then for the datapath to apply that revision (or a
//! newer one). The oldest change still waiting decides `healthy`.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use crate::gofmt::{rfc3339_nanos, ZERO_TIME_RFC3339};
use crate::model::IpFamily;

/// A point in time on both clocks: `Instant` for ages (immune to clock
/// steps), wall time for what is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub at: Instant,
    pub wall: SystemTime,
}

impl Stamp {
    pub fn now() -> Self {
        Stamp {
            at: Instant::now(),
            wall: SystemTime::now(),
        }
    }
}

/// Changes queued together (one source batch), not yet applied.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PendingChanges {
    pub service_changes: u64,
    pub endpoint_changes: u64,
    /// `last-change-trigger-time` of the changed EndpointSlices, by family.
    pub trigger_times: Vec<(IpFamily, SystemTime)>,
}

impl PendingChanges {
    fn merge(&mut self, other: PendingChanges) {
        self.service_changes += other.service_changes;
        self.endpoint_changes += other.endpoint_changes;
        self.trigger_times.extend(other.trigger_times);
    }
}

#[derive(Debug)]
struct Batch {
    /// When the oldest change of the batch was queued.
    since: Instant,
    changes: PendingChanges,
}

/// Pending changes and the last update of the datapath.
#[derive(Debug)]
pub struct HealthTracker {
    timeout: Duration,
    /// Queued, not yet computed into a revision.
    queued: Option<Batch>,
    /// Computed into a revision the datapath has not applied yet; ascending.
    awaiting: VecDeque<(u64, Batch)>,
    applied_rev: u64,
    last_updated: Option<SystemTime>,
}

impl HealthTracker {
    /// Process start counts as a pending change (SPEC §4.1 deviation): a
    /// daemon that never programs its first state turns unhealthy.
    pub fn new(timeout: Duration, start: Stamp) -> Self {
        HealthTracker {
            timeout,
            queued: Some(Batch {
                since: start.at,
                changes: PendingChanges::default(),
            }),
            awaiting: VecDeque::new(),
            applied_rev: 0,
            last_updated: None,
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A ClusterState change was queued.
    pub fn queued(&mut self, now: Instant, changes: PendingChanges) {
        self.queued
            .get_or_insert_with(|| Batch {
                since: now,
                changes: PendingChanges::default(),
            })
            .changes
            .merge(changes);
    }

    /// The syncer computed everything queued into `rev` (a new revision, or
    /// the current one when the state did not change). Returns the changes
    /// that this completes: those whose revision is already applied.
    pub fn computed(&mut self, rev: u64, now: SystemTime) -> Option<PendingChanges> {
        let batch = self.queued.take()?;
        if rev <= self.applied_rev {
            // Recompute with nothing to apply: counts as an update.
            self.last_updated = Some(now);
            return Some(batch.changes);
        }
        match self.awaiting.back_mut() {
            Some((r, b)) if *r == rev => b.changes.merge(batch.changes),
            _ => self.awaiting.push_back((rev, batch)),
        }
        None
    }

    /// The datapath finished applying `rev`. Returns the changes it covered.
    pub fn applied(&mut self, rev: u64, now: SystemTime) -> PendingChanges {
        self.applied_rev = self.applied_rev.max(rev);
        self.last_updated = Some(now);
        let mut done = PendingChanges::default();
        while self.awaiting.front().is_some_and(|(r, _)| *r <= rev) {
            if let Some((_, b)) = self.awaiting.pop_front() {
                done.merge(b.changes);
            }
        }
        done
    }

    fn oldest_pending(&self) -> Option<Instant> {
        let awaiting = self.awaiting.front().map(|(_, b)| b.since);
        let queued = self.queued.as_ref().map(|b| b.since);
        awaiting.into_iter().chain(queued).min()
    }

    /// No change has waited for `timeout` or longer.
    pub fn healthy(&self, now: Instant) -> bool {
        self.oldest_pending()
            .is_none_or(|since| now.saturating_duration_since(since) < self.timeout)
    }

    /// Why not healthy, for logs and `/livez/datapath-progress`.
    pub fn unhealthy_reason(&self, now: Instant) -> Option<String> {
        if self.healthy(now) {
            return None;
        }
        let age = self
            .oldest_pending()
            .map(|s| now.saturating_duration_since(s))
            .unwrap_or_default();
        Some(format!(
            "a change has waited {}s for the datapath, longer than the health timeout of {}s",
            age.as_secs(),
            self.timeout.as_secs()
        ))
    }

    /// Service and EndpointSlice changes not yet applied.
    pub fn pending_counts(&self) -> (u64, u64) {
        let batches = self
            .awaiting
            .iter()
            .map(|(_, b)| b)
            .chain(self.queued.as_ref());
        batches.fold((0, 0), |(s, e), b| {
            (
                s + b.changes.service_changes,
                e + b.changes.endpoint_changes,
            )
        })
    }

    pub fn last_updated(&self) -> Option<SystemTime> {
        self.last_updated
    }
}

/// What the 10256 server answers: `/healthz` or `/livez`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyEndpoint {
    Healthz,
    Livez,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FamilyStatus {
    last_updated: String,
    healthy: bool,
}

/// kube-proxy's `ProxyHealth`, keys in upstream order.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ProxyHealth {
    last_updated: String,
    current_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    node_eligible: Option<bool>,
    healthy: bool,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    status: BTreeMap<&'static str, FamilyStatus>,
}

/// Inputs of one 10256 answer.
#[derive(Clone, Debug)]
pub struct ProxyHealthInput<'a> {
    pub healthy: bool,
    pub node_eligible: bool,
    pub last_updated: Option<SystemTime>,
    /// Families the datapath programs; shown once they have synced.
    pub families: &'a [IpFamily],
    pub now: SystemTime,
}

/// Status code (200/503) and compact JSON body (no trailing newline).
pub fn proxy_health(endpoint: ProxyEndpoint, input: &ProxyHealthInput<'_>) -> (u16, String) {
    let ok = match endpoint {
        ProxyEndpoint::Healthz => input.healthy && input.node_eligible,
        ProxyEndpoint::Livez => input.healthy,
    };
    let now = rfc3339_nanos(input.now);
    let last = input
        .last_updated
        .map_or_else(|| ZERO_TIME_RFC3339.to_owned(), rfc3339_nanos);
    let status = match input.last_updated {
        Some(_) => input
            .families
            .iter()
            .map(|f| {
                (
                    f.as_str(),
                    FamilyStatus {
                        last_updated: last.clone(),
                        healthy: input.healthy,
                    },
                )
            })
            .collect(),
        None => BTreeMap::new(),
    };
    let body = ProxyHealth {
        // Upstream quirk kept for compatibility: a 200 answer reports now.
        last_updated: if ok { now.clone() } else { last.clone() },
        current_time: now,
        node_eligible: (endpoint == ProxyEndpoint::Healthz).then_some(input.node_eligible),
        healthy: input.healthy,
        status,
    };
    // Serialising plain strings and bools into a String cannot fail.
    let json = serde_json::to_string(&body).unwrap_or_default();
    (if ok { 200 } else { 503 }, json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    const TIMEOUT: Duration = Duration::from_secs(60);

    fn start() -> (Instant, HealthTracker) {
        let t0 = Instant::now();
        let tracker = HealthTracker::new(
            TIMEOUT,
            Stamp {
                at: t0,
                wall: SystemTime::now(),
            },
        );
        (t0, tracker)
    }

    fn svc(n: u64) -> PendingChanges {
        PendingChanges {
            service_changes: n,
            ..Default::default()
        }
    }

    #[test]
    fn process_start_is_pending_until_the_first_apply() {
        let (t0, mut h) = start();
        assert!(h.healthy(t0 + Duration::from_secs(59)));
        assert!(!h.healthy(t0 + TIMEOUT));
        assert!(h.unhealthy_reason(t0 + TIMEOUT).is_some());
        h.queued(t0 + Duration::from_secs(1), svc(2));
        assert_eq!(h.pending_counts(), (2, 0));
        assert!(h.computed(1, SystemTime::now()).is_none());
        let done = h.applied(1, SystemTime::now());
        assert_eq!(done.service_changes, 2);
        assert_eq!(h.pending_counts(), (0, 0));
        assert!(h.healthy(t0 + Duration::from_secs(3600)));
    }

    #[test]
    fn an_apply_clears_only_the_changes_it_covers() {
        let (t0, mut h) = start();
        h.computed(1, SystemTime::now());
        h.applied(1, SystemTime::now());
        h.queued(t0 + Duration::from_secs(10), svc(1));
        h.computed(2, SystemTime::now());
        h.queued(t0 + Duration::from_secs(20), svc(1));
        h.computed(3, SystemTime::now());
        assert_eq!(h.pending_counts(), (2, 0));
        h.applied(2, SystemTime::now());
        assert_eq!(h.pending_counts(), (1, 0));
        // The change for rev 3 is the oldest pending now.
        assert!(h.healthy(t0 + Duration::from_secs(79)));
        assert!(!h.healthy(t0 + Duration::from_secs(80)));
        h.applied(3, SystemTime::now());
        assert!(h.healthy(t0 + Duration::from_secs(1000)));
    }

    #[test]
    fn a_recompute_without_a_new_revision_completes_at_once() {
        let (t0, mut h) = start();
        h.computed(1, SystemTime::now());
        h.applied(1, UNIX_EPOCH + Duration::from_secs(5));
        h.queued(t0, svc(1));
        let later = UNIX_EPOCH + Duration::from_secs(9);
        assert_eq!(h.computed(1, later), Some(svc(1)));
        assert_eq!(h.last_updated(), Some(later));
        assert!(h.healthy(t0 + Duration::from_secs(1000)));
    }

    fn input(healthy: bool, node_eligible: bool, synced: bool) -> ProxyHealthInput<'static> {
        ProxyHealthInput {
            healthy,
            node_eligible,
            last_updated: synced.then(|| UNIX_EPOCH + Duration::new(1_746_093_580, 500_000_000)),
            families: &[IpFamily::V4, IpFamily::V6],
            now: UNIX_EPOCH + Duration::new(1_746_093_602, 123_456_789),
        }
    }

    #[test]
    fn healthy_answer_reports_now_as_last_updated() {
        let (code, body) = proxy_health(ProxyEndpoint::Healthz, &input(true, true, true));
        assert_eq!(code, 200);
        assert_eq!(
            body,
            r#"{"lastUpdated":"2025-05-01T10:00:02.123456789Z","currentTime":"2025-05-01T10:00:02.123456789Z","nodeEligible":true,"healthy":true,"status":{"IPv4":{"lastUpdated":"2025-05-01T09:59:40.5Z","healthy":true},"IPv6":{"lastUpdated":"2025-05-01T09:59:40.5Z","healthy":true}}}"#
        );
    }

    #[test]
    fn unhealthy_and_ineligible_answers() {
        let (code, body) = proxy_health(ProxyEndpoint::Healthz, &input(false, true, false));
        assert_eq!(code, 503);
        assert_eq!(
            body,
            r#"{"lastUpdated":"0001-01-01T00:00:00Z","currentTime":"2025-05-01T10:00:02.123456789Z","nodeEligible":true,"healthy":false}"#
        );
        // Node deletion fails /healthz but never /livez.
        let (code, body) = proxy_health(ProxyEndpoint::Healthz, &input(true, false, true));
        assert_eq!(code, 503);
        assert!(body.contains(r#""lastUpdated":"2025-05-01T09:59:40.5Z","currentTime""#));
        assert!(body.contains(r#""nodeEligible":false"#));
        let (code, body) = proxy_health(ProxyEndpoint::Livez, &input(true, false, true));
        assert_eq!(code, 200);
        assert!(!body.contains("nodeEligible"), "{body}");
    }
}
