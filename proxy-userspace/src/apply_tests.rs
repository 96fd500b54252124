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

/// A datapath that records its calls and finds drift in its first
/// `drifts` checks.
struct Recorder {
    calls: Arc<std::sync::Mutex<Vec<&'static str>>>,
    drifts: u32,
}

impl Datapath for Recorder {
    fn mode(&self) -> crate::datapath::ProxyMode {
        crate::datapath::ProxyMode::None
    }
    fn program_all(&mut self, _: &LocalState, _: &Claims) -> Result<ApplyStats, DatapathError> {
        self.calls.lock().unwrap().push("program_all");
        Ok(ApplyStats::default())
    }
    fn program_changes(
        &mut self,
        _: &LocalState,
        _: &LocalState,
        _: &[ServiceChange<'_>],
        _: &Claims,
    ) -> Result<ApplyStats, DatapathError> {
        self.calls.lock().unwrap().push("program_changes");
        Ok(ApplyStats::default())
    }
    fn verify(&mut self, _: &LocalState, _: &Claims) -> Result<Vec<Drift>, DatapathError> {
        self.calls.lock().unwrap().push("verify");
        if self.drifts == 0 {
            return Ok(Vec::new());
        }
        self.drifts -= 1;
        Ok(vec![Drift::new(
            crate::datapath::DriftKind::Element,
            "ip ebpf-kube-proxy service-ips",
            "10.96.0.10 . tcp . 80",
            "goto svc-default/web/tcp/http",
            "absent",
        )])
    }
    fn dump(
        _: &crate::datapath::DatapathConfig,
    ) -> Result<Option<crate::datapath::Dump>, DatapathError> {
        Ok(None)
    }
    fn cleanup(_: &crate::datapath::DatapathConfig) -> Result<Vec<String>, DatapathError> {
        Ok(Vec::new())
    }
}

/// Runs the coordinator on one synced state with a [`Recorder`] until
/// `done` holds for its calls (bounded: 5 s), then stops it.
async fn calls_until(
    sync_period: Duration,
    drifts: u32,
    request_check: bool,
    done: impl Fn(&[&'static str]) -> bool,
) -> (Vec<&'static str>, String) {
    let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
    let applier = Applier::new(Box::new(Recorder {
        calls: calls.clone(),
        drifts,
    }));
    let (tx, rx) = crate::snapshot::snapshot_channel();
    tx.send_replace(Arc::new(Snapshot {
        rev: 1,
        state: Arc::default(),
        changed: None,
    }));
    let status = Arc::new(
        Status::new(crate::status::StatusOptions {
            sync_period,
            requested_mode: crate::datapath::ProxyMode::None,
            active_mode: crate::datapath::ProxyMode::None,
            source: "file",
            resources: &["services"],
            families: vec![],
            flags: vec![],
        })
        .unwrap(),
    );
    let (stop, checks) = (CancellationToken::new(), Arc::new(Notify::new()));
    let task = tokio::spawn(run(
        applier,
        rx,
        stop.clone(),
        status.clone(),
        sync_period,
        checks.clone(),
        Arc::new(Notify::new()),
    ));
    let snapshot = || calls.lock().unwrap().clone();
    for _ in 0..500 {
        if request_check && snapshot() == ["program_all"] {
            checks.notify_one();
        }
        if done(&snapshot()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.cancel();
    task.await.unwrap();
    let metrics = String::from_utf8(status.metrics().encode_all()).unwrap();
    (snapshot(), metrics)
}

#[tokio::test]
async fn drift_found_by_the_periodic_check_is_counted_and_repaired_by_a_full_sync() {
    let (calls, metrics) = calls_until(Duration::from_millis(50), 1, false, |c| c.len() >= 4).await;
    assert_eq!(
        calls[..4],
        ["program_all", "verify", "program_all", "verify"],
        "{calls:?}"
    );
    assert!(
        metrics.contains("ebpf_kube_proxy_datapath_drift_total{kind=\"element\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_requested_check_runs_at_once_and_nothing_is_reprogrammed_without_drift() {
    let hour = Duration::from_secs(3600);
    let (calls, metrics) = calls_until(hour, 0, true, |c| c.len() >= 2).await;
    assert_eq!(calls, ["program_all", "verify"]);
    assert!(
        metrics.contains("ebpf_kube_proxy_datapath_drift_total{kind=\"element\"} 0"),
        "{metrics}"
    );
    let (calls, _) = calls_until(hour, 1, true, |c| c.len() >= 3).await;
    assert_eq!(calls, ["program_all", "verify", "program_all"]);
}

#[test]
fn retries_back_off_from_one_sync_period_to_sixteen() {
    let p = Duration::from_secs(30);
    let delays: Vec<u64> = (1..=7).map(|n| retry_delay(p, n).as_secs()).collect();
    assert_eq!(delays, [30, 60, 120, 240, 480, 480, 480]);
}

#[test]
fn periodic_drift_checks_are_spaced_by_the_cost_of_the_last_one() {
    let period = Duration::from_secs(30);
    let ms = Duration::from_millis;
    // A cheap check (or none measured): one sync period, never less.
    assert_eq!(check_interval(period, Duration::ZERO), period);
    assert_eq!(check_interval(period, ms(5)), period);
    // Up to a hundredth of the period, still the period.
    assert_eq!(check_interval(period, ms(300)), period);
    // Beyond: 100 times what the check took, following its cost.
    assert_eq!(check_interval(period, ms(301)), ms(30_100));
    assert_eq!(
        check_interval(period, Duration::from_secs(3)),
        Duration::from_secs(300)
    );
    assert!(check_interval(period, ms(2_000)) < check_interval(period, ms(2_001)));
    // A shorter sync period shortens only cheap checks' spacing.
    assert_eq!(
        check_interval(Duration::from_secs(1), ms(5)),
        Duration::from_secs(1)
    );
    assert_eq!(
        check_interval(Duration::from_secs(1), Duration::from_secs(3)),
        Duration::from_secs(300)
    );
    // An absurd duration saturates instead of overflowing.
    assert_eq!(check_interval(period, Duration::MAX), Duration::MAX);
}
