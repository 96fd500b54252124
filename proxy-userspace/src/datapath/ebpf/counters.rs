//! The eBPF programs' own per-CPU counters (`EKP_STATS`) on `/metrics`,
//! read from the pinned map at scrape time and summed over CPUs, so the
//! figures are the kernel's, not a copy taken at the last sync.

use std::path::PathBuf;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, Opts};
use proxy_common::{
    STAT_AFFINITY_HIT, STAT_EXT_NO_BACKEND, STAT_EXT_REJECTED, STAT_EXT_SOURCE_DENIED,
    STAT_EXT_TRANSLATED, STAT_EXT_TTL_EXCEEDED, STAT_EXT_UNROUTABLE, STAT_NO_BACKEND,
    STAT_SLOT_MISSING, STAT_TRANSLATED,
};

use super::maps::{read_ext_stats, read_stats};

/// Metric family name.
pub const CONNECTIONS_TOTAL: &str = "ebpf_kube_proxy_datapath_connections_total";

/// `result` label values, by `STAT_*` index.
const RESULTS: [(u32, &str); 4] = [
    (STAT_TRANSLATED, "load_balanced"),
    (STAT_AFFINITY_HIT, "session_affinity"),
    (STAT_NO_BACKEND, "no_backend"),
    (STAT_SLOT_MISSING, "backend_slot_missing"),
];

/// Metric family of the tc programs' decisions.
pub const EXTERNAL_PACKETS_TOTAL: &str = "ebpf_kube_proxy_datapath_external_packets_total";

/// `result` label values of [`EXTERNAL_PACKETS_TOTAL`], by `STAT_*` index.
const EXTERNAL_RESULTS: [(u32, &str); 6] = [
    (STAT_EXT_TRANSLATED, "translated"),
    (STAT_EXT_NO_BACKEND, "no_local_endpoint"),
    (STAT_EXT_SOURCE_DENIED, "source_range_denied"),
    (STAT_EXT_UNROUTABLE, "unroutable"),
    (STAT_EXT_REJECTED, "rejected"),
    (STAT_EXT_TTL_EXCEEDED, "ttl_exceeded"),
];

/// Collects [`CONNECTIONS_TOTAL`] and [`EXTERNAL_PACKETS_TOTAL`] from the
/// maps pinned under `root`.
pub struct StatsCollector {
    root: PathBuf,
    family: IntCounterVec,
    external: IntCounterVec,
}

impl StatsCollector {
    pub fn new(root: PathBuf) -> Result<Self, prometheus::Error> {
        let family = IntCounterVec::new(
            Opts::new(
                CONNECTIONS_TOTAL,
                "[ALPHA] Socket-LB decisions of the eBPF programs, by result: load_balanced (a backend picked), session_affinity (the affine backend reused), no_backend (refused: the service has no usable endpoint), backend_slot_missing (a slot pointed at no backend). Summed over CPUs; kept across daemon restarts while the maps stay pinned.",
            ),
            &["result"],
        )?;
        let external = IntCounterVec::new(
            Opts::new(
                EXTERNAL_PACKETS_TOTAL,
                "[ALPHA] Node-external packets the tc programs handled, by result: translated (NAT applied, new or tracked flow), no_local_endpoint (dropped: no usable endpoint for traffic from outside, e.g. externalTrafficPolicy Local without a local endpoint), source_range_denied (dropped by loadBalancerSourceRanges), unroutable (dropped: no route or no free SNAT port), rejected (a new flow to a service without any usable endpoint, answered with a TCP RST or an ICMP port unreachable unless its source's replies are rate-limited), ttl_exceeded (a packet to forward arrived with TTL or hop limit 1: handed to the stack untranslated). Summed over CPUs; kept across daemon restarts while the maps stay pinned.",
            ),
            &["result"],
        )?;
        Ok(StatsCollector {
            root,
            family,
            external,
        })
    }
}

impl Collector for StatsCollector {
    fn desc(&self) -> Vec<&Desc> {
        let mut d = self.family.desc();
        d.extend(self.external.desc());
        d
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let counters = match read_stats(&self.root) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "eBPF counters unreadable; left out of this scrape");
                return Vec::new();
            }
        };
        // Pinned by an earlier version without the tc programs: absent.
        let external = read_ext_stats(&self.root).unwrap_or_default();
        for (family, results, counters) in [
            (&self.family, &RESULTS[..], &counters),
            (&self.external, &EXTERNAL_RESULTS[..], &external),
        ] {
            for (index, result) in results {
                let c = family.with_label_values(&[result]);
                c.reset();
                c.inc_by(counters.get(*index as usize).copied().unwrap_or(0));
            }
        }
        let mut out = self.family.collect();
        out.extend(self.external.collect());
        out
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
