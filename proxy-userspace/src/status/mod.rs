//! Status surfaces: kube-proxy's health server (10256), and the status
//! server (10249) with `/metrics`, `/metrics/slis`, component `/livez`
//! `/readyz` `/healthz`, `/statusz`, `/flagz` and `/proxyMode` (SPEC §1–§5).
//!
//! The rest of the daemon feeds one shared [`Status`] handle: the syncer
//! reports queued changes, computed revisions, the source's sync and errors
//! and this node's eligibility; the datapath runner reports applies; the
//! daemon reports the localnet listeners and shutdown. The HTTP servers
//! ([`server`]) only read it. Nothing here reaches back into the model.

pub mod checks;
pub mod hcnp;
pub mod health;
pub mod http_serve;
pub mod metrics;
pub mod negotiate;
pub mod server;
pub mod zpages;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::datapath::ProxyMode;
use crate::flagz::FlagValue;
use crate::model::{AddressType, Change, IpFamily, LocalState, Object, ObjectKind};
use checks::Check;
use health::{HealthTracker, PendingChanges, ProxyEndpoint, ProxyHealthInput, Stamp};
use metrics::Metrics;

pub use http_serve::HttpLimits;
pub use server::{StatusError, StatusServers};

/// What the status surfaces need to know about this daemon at start.
#[derive(Clone, Debug)]
pub struct StatusOptions {
    /// `--sync-period`; the health timeout is twice this.
    pub sync_period: Duration,
    pub requested_mode: ProxyMode,
    pub active_mode: ProxyMode,
    /// Source label (`file`, `kube`).
    pub source: &'static str,
    /// Resources whose initial list the source completes (`source_synced`).
    pub resources: &'static [&'static str],
    /// Families the datapath programs.
    pub families: Vec<IpFamily>,
    /// `/flagz` values, rendered and redacted.
    pub flags: Vec<FlagValue>,
}

/// The shared status handle.
pub struct Status {
    started: Stamp,
    options: StatusOptions,
    metrics: Metrics,
    tracker: Mutex<HealthTracker>,
    source_synced: AtomicBool,
    datapath_synced: AtomicBool,
    localnet_listening: AtomicBool,
    shutting_down: AtomicBool,
    node_eligible: AtomicBool,
    /// Rendered once: its delimiter is fixed per process (SPEC §2.1).
    flagz_text: String,
}

/// What one applied change contributes to the pending counters and the
/// network programming latency; taken before the change is consumed.
#[derive(Clone, Copy, Debug)]
pub struct ChangeNote {
    kind: ObjectKind,
    trigger: Option<(IpFamily, SystemTime)>,
}

impl ChangeNote {
    pub fn of(change: &Change) -> Self {
        let trigger = match change {
            Change::Upsert(Object::EndpointSlice(s)) => {
                let family = match s.address_type {
                    AddressType::Ipv4 => Some(IpFamily::V4),
                    AddressType::Ipv6 => Some(IpFamily::V6),
                    AddressType::Fqdn => None,
                };
                family.zip(s.last_change_trigger_time.and_then(|t| {
                    let secs = u64::try_from(t.seconds).ok()?;
                    let nanos = u32::try_from(t.nanos).ok()?;
                    Some(UNIX_EPOCH + Duration::new(secs, nanos))
                }))
            }
            _ => None,
        };
        ChangeNote {
            kind: change.kind(),
            trigger,
        }
    }
}

/// Collects the notes of one source batch.
#[derive(Debug, Default)]
pub struct ChangeBatch(PendingChanges);

impl ChangeBatch {
    pub fn add(&mut self, note: ChangeNote) {
        match note.kind {
            ObjectKind::Service => self.0.service_changes += 1,
            ObjectKind::EndpointSlice => self.0.endpoint_changes += 1,
            ObjectKind::Node | ObjectKind::Pod => {}
        }
        self.0.trigger_times.extend(note.trigger);
    }
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

impl Status {
    pub fn new(options: StatusOptions) -> Result<Self, StatusError> {
        let started = Stamp::now();
        let metrics = Metrics::new()?;
        metrics
            .build_info
            .with_label_values(&[
                env!("CARGO_PKG_VERSION"),
                env!("EKP_RUSTC_VERSION"),
                env!("EKP_GIT_COMMIT"),
            ])
            .set(1);
        metrics
            .datapath_mode
            .with_label_values(&[
                options.active_mode.as_str(),
                options.requested_mode.as_str(),
            ])
            .set(1);
        metrics
            .datapath_apply_errors
            .with_label_values(&[options.active_mode.as_str()]);
        for resource in options.resources {
            metrics
                .source_synced
                .with_label_values(&[options.source, resource])
                .set(0);
        }
        for reason in crate::sources::RejectReason::of_source(options.source) {
            metrics
                .rejected_objects
                .with_label_values(&[options.source, reason.as_str()]);
        }
        let flagz_text = zpages::flagz_text(&options.flags, zpages::random_delimiter());
        Ok(Status {
            started,
            tracker: Mutex::new(HealthTracker::new(2 * options.sync_period, started)),
            options,
            metrics,
            source_synced: AtomicBool::new(false),
            datapath_synced: AtomicBool::new(false),
            localnet_listening: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            node_eligible: AtomicBool::new(true),
            flagz_text,
        })
    }

    fn tracker(&self) -> MutexGuard<'_, HealthTracker> {
        // The tracker has no invariants a panicking holder could break
        // halfway, so a poisoned lock is still good to use.
        self.tracker.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn started(&self) -> Stamp {
        self.started
    }

    pub fn active_mode(&self) -> ProxyMode {
        self.options.active_mode
    }

    pub fn flags(&self) -> &[FlagValue] {
        &self.options.flags
    }

    pub fn flagz_text(&self) -> &str {
        &self.flagz_text
    }

    fn set_pending_gauges(&self, tracker: &HealthTracker) {
        let (services, endpoints) = tracker.pending_counts();
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.metrics.service_changes_pending.set(gauge(services));
        self.metrics.endpoint_changes_pending.set(gauge(endpoints));
    }

    /// Network programming latency of completed EndpointSlice changes.
    fn observe_programmed(&self, done: &PendingChanges, now: SystemTime) {
        for (family, trigger) in &done.trigger_times {
            let latency = now
                .duration_since(*trigger)
                .unwrap_or_default()
                .as_secs_f64();
            self.metrics
                .network_programming
                .with_label_values(&[family.as_str()])
                .observe(latency);
        }
    }

    // ---- syncer ----

    /// Changes of one source batch that altered the ClusterState.
    pub fn changes_queued(&self, batch: ChangeBatch) {
        let ChangeBatch(mut changes) = batch;
        let now = Stamp::now();
        // As kube-proxy: trigger times from before this process started
        // would report the downtime, not programming latency.
        changes
            .trigger_times
            .retain(|(_, t)| *t >= self.started.wall);
        self.metrics
            .service_changes_total
            .inc_by(changes.service_changes);
        self.metrics
            .endpoint_changes_total
            .inc_by(changes.endpoint_changes);
        for f in &self.options.families {
            self.metrics
                .last_queued_timestamp
                .with_label_values(&[f.as_str()])
                .set(unix_seconds(now.wall));
        }
        let mut tracker = self.tracker();
        tracker.queued(now.at, changes);
        self.set_pending_gauges(&tracker);
    }

    /// The syncer computed the queued changes into `rev`; `published` is
    /// the new state when the revision is new.
    pub fn state_computed(&self, rev: u64, published: Option<&LocalState>) {
        if let Some(state) = published {
            let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
            self.metrics
                .localstate_revision
                .set(i64::try_from(rev).unwrap_or(i64::MAX));
            self.metrics
                .localstate_timestamp
                .set(unix_seconds(SystemTime::now()));
            self.metrics
                .localstate_services
                .set(gauge(state.services.len()));
            self.metrics
                .localstate_endpoints
                .set(gauge(state.endpoint_count()));
        }
        let now = SystemTime::now();
        let mut tracker = self.tracker();
        if let Some(done) = tracker.computed(rev, now) {
            self.observe_programmed(&done, now);
        }
        self.set_pending_gauges(&tracker);
    }

    /// The source finished its initial list.
    pub fn source_synced(&self) {
        self.source_synced.store(true, Ordering::Release);
        for resource in self.options.resources {
            self.metrics
                .source_synced
                .with_label_values(&[self.options.source, resource])
                .set(1);
        }
    }

    /// A watched resource lost (`false`) or regained (`true`) its
    /// connection to the API server: `ebpf_kube_proxy_source_synced` shows
    /// the staleness while the last good state keeps serving.
    pub fn set_resource_in_sync(&self, resource: &str, in_sync: bool) {
        self.metrics
            .source_synced
            .with_label_values(&[self.options.source, resource])
            .set(i64::from(in_sync));
    }

    /// One source error by reason class (`read`, `decode`,
    /// `invalid_object`, `watch`, `relist_410`).
    pub fn source_error(&self, reason: &str) {
        self.metrics
            .source_errors
            .with_label_values(&[self.options.source, reason])
            .inc();
    }

    /// The source refused one object (its last good version stays).
    pub fn object_rejected(&self, reason: crate::sources::RejectReason) {
        self.metrics
            .rejected_objects
            .with_label_values(&[self.options.source, reason.as_str()])
            .inc();
    }

    pub fn set_node_eligible(&self, eligible: bool) {
        self.node_eligible.store(eligible, Ordering::Release);
    }

    // ---- datapath runner ----

    /// The datapath finished programming `state` (revision `rev`).
    pub fn datapath_applied(&self, rev: u64, state: &LocalState, elapsed: Duration) {
        let now = SystemTime::now();
        for f in &self.options.families {
            self.metrics
                .sync_duration_for(*f)
                .observe(elapsed.as_secs_f64());
            self.metrics
                .last_timestamp
                .with_label_values(&[f.as_str()])
                .set(unix_seconds(now));
        }
        self.metrics
            .datapath_revision
            .set(i64::try_from(rev).unwrap_or(i64::MAX));
        self.metrics
            .set_no_local_endpoints(state, &self.options.families);
        {
            let mut tracker = self.tracker();
            let done = tracker.applied(rev, now);
            self.observe_programmed(&done, now);
            self.set_pending_gauges(&tracker);
        }
        if rev >= 1 {
            self.datapath_synced.store(true, Ordering::Release);
        }
    }

    /// `auto` fell back from `from` to `to`; `reason` is one of `no_btf`,
    /// `no_cgroup2`, `verifier`, `permission`, `other`.
    pub fn datapath_fallback(&self, from: ProxyMode, to: ProxyMode, reason: &str) {
        self.metrics
            .datapath_fallbacks
            .with_label_values(&[from.as_str(), to.as_str(), reason])
            .inc();
    }

    /// `ebpf_kube_proxy_datapath_map_entries{map}` after an apply.
    pub fn set_map_entries(&self, entries: &[(&'static str, usize)]) {
        for (map, n) in entries {
            self.metrics
                .datapath_map_entries
                .with_label_values(&[map])
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }

    /// Frontends lost to an older service claiming the same address.
    pub fn set_address_conflicts(&self, lost_claims: usize) {
        self.metrics
            .address_conflicts
            .set(i64::try_from(lost_claims).unwrap_or(i64::MAX));
    }

    pub fn datapath_apply_failed(&self) {
        self.metrics
            .datapath_apply_errors
            .with_label_values(&[self.options.active_mode.as_str()])
            .inc();
    }

    // ---- daemon ----

    pub fn set_localnet_listening(&self, listening: bool) {
        self.localnet_listening.store(listening, Ordering::Release);
    }

    /// SIGTERM/SIGINT received: readiness fails from now on.
    pub fn shutting_down(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }

    // ---- readers ----

    /// §4.1 `healthy`: no change pending longer than the health timeout.
    pub fn healthy(&self) -> bool {
        self.tracker().healthy(std::time::Instant::now())
    }

    /// Runs one component check; `Err` carries the reason.
    pub fn check(&self, check: Check) -> Result<(), String> {
        let fail = |ok: bool, reason: &str| if ok { Ok(()) } else { Err(reason.to_owned()) };
        match check {
            Check::Ping => Ok(()),
            Check::DatapathProgress => {
                match self.tracker().unhealthy_reason(std::time::Instant::now()) {
                    None => Ok(()),
                    Some(reason) => Err(reason),
                }
            }
            Check::InformerSync => fail(
                self.source_synced.load(Ordering::Acquire),
                &format!(
                    "the {} source has not finished its initial list",
                    self.options.source
                ),
            ),
            Check::DatapathSynced => fail(
                self.datapath_synced.load(Ordering::Acquire),
                "the datapath has not applied the first complete state",
            ),
            Check::Localnet => fail(
                self.localnet_listening.load(Ordering::Acquire),
                "the localnet listeners are not bound",
            ),
            Check::Shutdown => fail(
                !self.shutting_down.load(Ordering::Acquire),
                "process is shutting down",
            ),
        }
    }

    /// The 10256 answer; counted in `kubeproxy_proxy_{healthz,livez}_total`.
    pub fn proxy_health(&self, endpoint: ProxyEndpoint) -> (u16, String) {
        let (healthy, last_updated) = {
            let tracker = self.tracker();
            (
                tracker.healthy(std::time::Instant::now()),
                tracker.last_updated(),
            )
        };
        let input = ProxyHealthInput {
            healthy,
            node_eligible: self.node_eligible.load(Ordering::Acquire),
            last_updated,
            families: &self.options.families,
            now: SystemTime::now(),
        };
        let (code, body) = health::proxy_health(endpoint, &input);
        let counter = match endpoint {
            ProxyEndpoint::Healthz => &self.metrics.proxy_healthz_total,
            ProxyEndpoint::Livez => &self.metrics.proxy_livez_total,
        };
        counter.with_label_values(&[&code.to_string()]).inc();
        (code, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{compute, ClusterState, NodeContext};
    use crate::model::{Node, TAINT_TO_BE_DELETED};

    fn status(sync_period: Duration) -> Status {
        Status::new(StatusOptions {
            sync_period,
            requested_mode: ProxyMode::Auto,
            active_mode: ProxyMode::None,
            source: "file",
            resources: &["services"],
            families: vec![IpFamily::V4, IpFamily::V6],
            flags: vec![("v".to_owned(), "0".to_owned())],
        })
        .unwrap()
    }

    fn metrics_text(s: &Status) -> String {
        String::from_utf8(s.metrics().encode_all()).unwrap()
    }

    #[test]
    fn readiness_follows_source_datapath_localnet_and_shutdown() {
        let s = status(Duration::from_secs(30));
        for c in [Check::InformerSync, Check::DatapathSynced, Check::Localnet] {
            assert!(s.check(c).is_err(), "{c:?}");
        }
        assert_eq!(s.check(Check::Ping), Ok(()));
        assert_eq!(s.check(Check::Shutdown), Ok(()));
        assert_eq!(s.check(Check::DatapathProgress), Ok(()));

        s.source_synced();
        s.set_localnet_listening(true);
        let state = compute(&ClusterState::default(), &NodeContext::default());
        s.state_computed(1, Some(&state));
        s.datapath_applied(1, &state, Duration::from_millis(3));
        for c in [Check::InformerSync, Check::DatapathSynced, Check::Localnet] {
            assert_eq!(s.check(c), Ok(()), "{c:?}");
        }
        s.shutting_down();
        assert_eq!(
            s.check(Check::Shutdown),
            Err("process is shutting down".to_owned())
        );
        let text = metrics_text(&s);
        assert!(
            text.contains("ebpf_kube_proxy_source_synced{resource=\"services\",source=\"file\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv6\"} 1"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_stalled_datapath_turns_the_proxy_unhealthy() {
        let s = status(Duration::from_millis(10));
        std::thread::sleep(Duration::from_millis(25));
        assert!(s.check(Check::DatapathProgress).is_err());
        let (code, body) = s.proxy_health(ProxyEndpoint::Livez);
        assert_eq!(code, 503);
        assert!(body.contains("\"healthy\":false"), "{body}");
        let state = LocalState::default();
        s.state_computed(1, Some(&state));
        s.datapath_applied(1, &state, Duration::ZERO);
        assert_eq!(s.proxy_health(ProxyEndpoint::Livez).0, 200);
        let text = metrics_text(&s);
        assert!(
            text.contains("kubeproxy_proxy_livez_total{code=\"200\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("kubeproxy_proxy_livez_total{code=\"503\"} 1\n"),
            "{text}"
        );
    }

    #[test]
    fn node_eligibility_from_deletion_and_autoscaler_taint() {
        let node = |deleting, taints: &[&str]| Node {
            name: "n1".to_owned(),
            labels: Default::default(),
            deleting,
            taint_keys: taints.iter().map(|t| t.to_string()).collect(),
            addresses: vec![],
        };
        assert!(Node::eligible(None));
        assert!(Node::eligible(Some(&node(false, &["other"]))));
        assert!(!Node::eligible(Some(&node(true, &[]))));
        assert!(!Node::eligible(Some(&node(false, &[TAINT_TO_BE_DELETED]))));
    }

    #[test]
    fn source_errors_are_counted_by_reason_class() {
        use crate::sources::file::ManifestError;
        let s = status(Duration::from_secs(30));
        let errors = [
            ManifestError::Read {
                file: "a".into(),
                reason: "x".into(),
            },
            ManifestError::Decode {
                file: "a".into(),
                doc_index: 0,
                reason: "x".into(),
            },
            ManifestError::Decode {
                file: "b".into(),
                doc_index: 1,
                reason: "y".into(),
            },
        ];
        for e in &errors {
            s.source_error(e.reason_class());
        }
        let text = metrics_text(&s);
        assert!(
            text.contains(
                "ebpf_kube_proxy_source_errors_total{reason=\"decode\",source=\"file\"} 2\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "ebpf_kube_proxy_source_errors_total{reason=\"read\",source=\"file\"} 1\n"
            ),
            "{text}"
        );
    }
}
