//! The eBPF programs' own per-CPU counters (`EKP_STATS`) on `/metrics`,
//! read from the pinned map at scrape time and summed over CPUs, so the
//! figures are the kernel's, not a copy taken at the last sync.

use std::path::PathBuf;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, Opts};
use proxy_common::{
    STAT_AFFINITY_HIT, STAT_EXT_NO_BACKEND, STAT_EXT_SOURCE_DENIED, STAT_EXT_TRANSLATED,
    STAT_EXT_UNROUTABLE, STAT_NO_BACKEND, STAT_SLOT_MISSING, STAT_TRANSLATED,
};

use super::maps::read_stats;

/// Metric family name.
pub const CONNECTIONS_TOTAL: &str = "ebpf_kube_proxy_datapath_connections_total";

/// `result` label values, by `STAT_*` index.
const RESULTS: [(u32, &str); 8] = [
    (STAT_TRANSLATED, "load_balanced"),
    (STAT_AFFINITY_HIT, "session_affinity"),
    (STAT_NO_BACKEND, "no_backend"),
    (STAT_SLOT_MISSING, "backend_slot_missing"),
    (STAT_EXT_TRANSLATED, "external_translated"),
    (STAT_EXT_NO_BACKEND, "external_no_backend"),
    (STAT_EXT_SOURCE_DENIED, "external_source_denied"),
    (STAT_EXT_UNROUTABLE, "external_unroutable"),
];

/// Collects [`CONNECTIONS_TOTAL`] from the maps pinned under `root`.
pub struct StatsCollector {
    root: PathBuf,
    family: IntCounterVec,
}

impl StatsCollector {
    pub fn new(root: PathBuf) -> Result<Self, prometheus::Error> {
        let family = IntCounterVec::new(
            Opts::new(
                CONNECTIONS_TOTAL,
                "[ALPHA] Socket-LB decisions of the eBPF programs, by result: load_balanced (a backend picked), session_affinity (the affine backend reused), no_backend (refused: the service has no usable endpoint), backend_slot_missing (a slot pointed at no backend); the tc programs' node-external packets: external_translated (translated, new flow or tracked), external_no_backend (dropped: no usable endpoint), external_source_denied (dropped by loadBalancerSourceRanges), external_unroutable (a remote backend unreachable). Summed over CPUs; kept across daemon restarts while the maps stay pinned.",
            ),
            &["result"],
        )?;
        Ok(StatsCollector { root, family })
    }
}

impl Collector for StatsCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.family.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let counters = match read_stats(&self.root) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "eBPF counters unreadable; left out of this scrape");
                return Vec::new();
            }
        };
        for (index, result) in RESULTS {
            let c = self.family.with_label_values(&[result]);
            c.reset();
            c.inc_by(counters.get(index as usize).copied().unwrap_or(0));
        }
        self.family.collect()
    }
}

/// Capacity of the sized maps and plans refused because a map would
/// overflow, by map.
#[derive(Clone)]
pub struct CapacityMetrics {
    pub capacity: prometheus::IntGaugeVec,
    pub full: prometheus::IntCounterVec,
}

impl CapacityMetrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        Ok(CapacityMetrics {
            capacity: prometheus::IntGaugeVec::new(
                Opts::new(
                    "ebpf_kube_proxy_datapath_map_capacity",
                    "[ALPHA] Entries the eBPF map can hold (--ebpf-map-size), by map; compare with ebpf_kube_proxy_datapath_map_entries.",
                ),
                &["map"],
            )?,
            full: IntCounterVec::new(
                Opts::new(
                    "ebpf_kube_proxy_datapath_map_full_total",
                    "[ALPHA] Applies refused because the state did not fit an eBPF map (the programmed state was kept; raise --ebpf-map-size), by map.",
                ),
                &["map"],
            )?,
        })
    }

    pub fn register(&self, registry: &prometheus::Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.capacity.clone()))?;
        registry.register(Box::new(self.full.clone()))
    }
}
