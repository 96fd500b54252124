//! Drift: a difference between what a datapath programmed and what the
//! kernel holds now (an entry deleted or changed by hand, a detached link,
//! a flushed table). Each backend finds its own with
//! [`super::Datapath::verify`] (comparisons in `ebpf/drift.rs` and
//! `nft/drift.rs`); this module holds the shared vocabulary, the log lines
//! and the `ebpf_kube_proxy_datapath_drift_total{kind}` counter.

use std::collections::BTreeMap;
use std::fmt;

/// What kind of kernel object differs. A fixed set: the metric's `kind`
/// label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DriftKind {
    /// An eBPF map entry (service header or slot, backend).
    MapEntry,
    /// An eBPF program's pinned link (the program is detached).
    Link,
    /// A whole nftables table.
    Table,
    /// An nftables chain.
    Chain,
    /// The rules of an nftables chain.
    Rules,
    /// An nftables set or map.
    Set,
    /// An element of an nftables map or set.
    Element,
}

impl DriftKind {
    pub const ALL: [DriftKind; 7] = [
        DriftKind::MapEntry,
        DriftKind::Link,
        DriftKind::Table,
        DriftKind::Chain,
        DriftKind::Rules,
        DriftKind::Set,
        DriftKind::Element,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DriftKind::MapEntry => "map_entry",
            DriftKind::Link => "link",
            DriftKind::Table => "table",
            DriftKind::Chain => "chain",
            DriftKind::Rules => "rules",
            DriftKind::Set => "set",
            DriftKind::Element => "element",
        }
    }
}

impl fmt::Display for DriftKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the kernel has where nothing should be, or lacks.
pub const ABSENT: &str = "absent";

/// One difference, described for an operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drift {
    pub kind: DriftKind,
    /// The kernel object: a map, a link pin, `ip ebpf-kube-proxy`, a chain
    /// or set name.
    pub object: String,
    /// Where in the object (a map key, an element); empty for the object
    /// itself.
    pub key: String,
    /// `namespace/name` of the service it belongs to, when one does.
    pub service: Option<String>,
    pub expected: String,
    pub found: String,
    /// The check removed it already (a stale entry of a map the programs
    /// write): counted and logged, no full sync needed.
    pub repaired: bool,
}

impl Drift {
    pub fn new(
        kind: DriftKind,
        object: impl Into<String>,
        key: impl Into<String>,
        expected: impl Into<String>,
        found: impl Into<String>,
    ) -> Drift {
        Drift {
            kind,
            object: object.into(),
            key: key.into(),
            service: None,
            expected: expected.into(),
            found: found.into(),
            repaired: false,
        }
    }

    /// Marks it as removed by the check itself.
    pub fn repaired(mut self) -> Drift {
        self.repaired = true;
        self
    }

    pub fn for_service(mut self, service: Option<String>) -> Drift {
        self.service = service;
        self
    }
}

/// One check finds at most this many lines' worth of differences in the
/// log (a flushed table at 10,000 services would be 10,000 lines); the
/// rest are counted in the summary line.
pub const MAX_LOGGED: usize = 20;

/// Counts per kind, in [`DriftKind::ALL`] order, only the kinds present.
pub fn counts(drifts: &[Drift]) -> BTreeMap<DriftKind, usize> {
    let mut out = BTreeMap::new();
    for d in drifts {
        *out.entry(d.kind).or_default() += 1;
    }
    out
}

/// `ebpf_kube_proxy_datapath_drift_total{kind}`.
#[derive(Clone, Debug)]
pub struct DriftMetrics {
    total: prometheus::IntCounterVec,
}

impl DriftMetrics {
    pub fn register(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        let total = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "ebpf_kube_proxy_datapath_drift_total",
                "[ALPHA] Differences found between the kernel's datapath and the state \
                 the daemon programmed (each check after a sync period or SIGHUP; every \
                 difference is repaired by a full sync), by kind of kernel object",
            ),
            &["kind"],
        )?;
        registry.register(Box::new(total.clone()))?;
        for k in DriftKind::ALL {
            total.with_label_values(&[k.as_str()]);
        }
        Ok(DriftMetrics { total })
    }

    pub fn count(&self, drifts: &[Drift]) {
        for (kind, n) in counts(drifts) {
            self.total
                .with_label_values(&[kind.as_str()])
                .inc_by(n as u64);
        }
    }
}

/// One warning per difference (the first [`MAX_LOGGED`]), then a summary.
pub fn log(drifts: &[Drift], mode: super::ProxyMode) {
    for d in drifts.iter().take(MAX_LOGGED) {
        tracing::warn!(
            kind = %d.kind,
            object = %d.object,
            key = %d.key,
            service = %d.service.as_deref().unwrap_or("-"),
            expected = %d.expected,
            found = %d.found,
            repaired = d.repaired,
            "datapath drift: the kernel differs from what was programmed"
        );
    }
    let by_kind: Vec<String> = counts(drifts)
        .into_iter()
        .map(|(k, n)| format!("{k}={n}"))
        .collect();
    if needs_full_sync(drifts) {
        tracing::warn!(
            %mode,
            differences = drifts.len(),
            not_logged = drifts.len().saturating_sub(MAX_LOGGED),
            by_kind = %by_kind.join(","),
            "datapath drift found; repairing with a full sync"
        );
    } else {
        tracing::warn!(
            %mode,
            differences = drifts.len(),
            not_logged = drifts.len().saturating_sub(MAX_LOGGED),
            by_kind = %by_kind.join(","),
            "datapath drift found: stale entries, removed by the check"
        );
    }
}

/// Whether any difference waits for a full sync (one the check did not
/// remove itself).
pub fn needs_full_sync(drifts: &[Drift]) -> bool {
    drifts.iter().any(|d| !d.repaired)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_label_and_counts_add_up_per_kind() {
        let labels: std::collections::BTreeSet<&str> =
            DriftKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(labels.len(), DriftKind::ALL.len());
        let d = |kind| Drift::new(kind, "m", "k", "a", "b");
        let c = counts(&[
            d(DriftKind::Element),
            d(DriftKind::Link),
            d(DriftKind::Element),
        ]);
        assert_eq!(
            c.into_iter().collect::<Vec<_>>(),
            [(DriftKind::Link, 1), (DriftKind::Element, 2)]
        );
    }

    #[test]
    fn the_counter_moves_by_the_differences_of_each_kind() {
        let registry = prometheus::Registry::new();
        let m = DriftMetrics::register(&registry).unwrap();
        m.count(&[
            Drift::new(DriftKind::MapEntry, "EKP_SERVICES", "x", "a", ABSENT),
            Drift::new(DriftKind::MapEntry, "EKP_SERVICES", "y", "a", ABSENT),
        ]);
        let mut text = Vec::new();
        use prometheus::Encoder;
        prometheus::TextEncoder::new()
            .encode(&registry.gather(), &mut text)
            .unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains("ebpf_kube_proxy_datapath_drift_total{kind=\"map_entry\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("ebpf_kube_proxy_datapath_drift_total{kind=\"table\"} 0"),
            "{text}"
        );
    }
}
