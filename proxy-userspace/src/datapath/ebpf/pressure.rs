//! `ebpf_kube_proxy_datapath_map_pressure{map}`: how full the maps the
//! programs write are (entries / capacity, 0..1; the anchor is Cilium's
//! `bpf_map_pressure`). These are LRU maps: when one is full, every insert
//! evicts the least recently used entry (a tracked flow, a socket's
//! reverse NAT, an affinity), which shows to users as broken connections.
//!
//! The entries are counted with batched lookups (`BPF_MAP_LOOKUP_BATCH`,
//! 8,192 entries per call) on a thread of its own every
//! [`SAMPLE_INTERVAL`], never at scrape time and never on the apply path: a
//! full 262,144-entry `EKP_CT` is about 32 calls. A map found above
//! [`WARN_RATIO`] on two samples in a row (one interval) is logged at warn,
//! once until it falls below again.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use aya::maps::MapData;
use prometheus::{GaugeVec, Opts};
use proxy_common::{MAP_AFFINITY, MAP_CT, MAP_EXT_AFFINITY, MAP_REVNAT};

use super::batch;

/// Metric family name.
pub const MAP_PRESSURE: &str = "ebpf_kube_proxy_datapath_map_pressure";

/// The maps the programs fill, by pin name. `EKP_FRAGS` (fragments of
/// translated datagrams) is reported when it is pinned.
pub const PRESSURED_MAPS: [&str; 5] = [
    MAP_CT,
    MAP_AFFINITY,
    MAP_EXT_AFFINITY,
    MAP_REVNAT,
    "EKP_FRAGS",
];

/// Time between two counts (kube-proxy's default sync period).
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(30);

/// Fill ratio above which a map that stays there is warned about.
pub const WARN_RATIO: f64 = 0.9;

/// One map's fill.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fill {
    pub map: &'static str,
    pub entries: usize,
    pub capacity: u32,
}

impl Fill {
    pub fn ratio(&self) -> f64 {
        if self.capacity == 0 {
            0.0
        } else {
            self.entries as f64 / f64::from(self.capacity)
        }
    }
}

/// Counts the entries of every pinned map of [`PRESSURED_MAPS`] under
/// `root` (maps not pinned are left out; one that cannot be read is logged
/// at debug and left out).
pub fn sample(root: &Path) -> Vec<Fill> {
    PRESSURED_MAPS
        .iter()
        .filter(|name| root.join(name).exists())
        .filter_map(|&map| match count(root, map) {
            Ok(fill) => Some(fill),
            Err(e) => {
                tracing::debug!(map, error = %e, "cannot count the entries of an eBPF map");
                None
            }
        })
        .collect()
}

fn count(root: &Path, map: &'static str) -> Result<Fill, String> {
    let data = MapData::from_pin(root.join(map)).map_err(|e| e.to_string())?;
    let info = data.info().map_err(|e| e.to_string())?;
    let entries = batch::count_entries(
        data.fd().as_fd(),
        info.key_size() as usize,
        info.value_size() as usize,
    )
    .map_err(|e| e.to_string())?;
    Ok(Fill {
        map,
        entries,
        capacity: info.max_entries(),
    })
}

/// The gauge, and which maps were above [`WARN_RATIO`] at the last sample.
#[derive(Clone)]
pub struct PressureMetrics {
    gauge: GaugeVec,
}

impl PressureMetrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        Ok(PressureMetrics {
            gauge: GaugeVec::new(
                Opts::new(
                    MAP_PRESSURE,
                    "[ALPHA] Fill ratio (entries / capacity, 0 to 1) of the LRU maps the eBPF programs write, by map: EKP_CT (tracked node-external flows), EKP_AFFINITY and EKP_EXT_AFFINITY (session affinity), EKP_REVNAT (reverse NAT of sockets), EKP_FRAGS (fragments). Near 1 the kernel evicts the least recently used entries. Counted every 30 s off the apply path.",
                ),
                &["map"],
            )?,
        })
    }

    pub fn register(&self, registry: &prometheus::Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.gauge.clone()))
    }

    /// Sets the gauge from one sample.
    pub fn set(&self, fills: &[Fill]) {
        for f in fills {
            self.gauge.with_label_values(&[f.map]).set(f.ratio());
        }
    }

    /// Counts the maps under `root` and sets the gauge; the fills.
    pub fn update(&self, root: &Path) -> Vec<Fill> {
        let fills = sample(root);
        self.set(&fills);
        fills
    }

    /// Samples every [`SAMPLE_INTERVAL`] on a thread of its own until
    /// `alive` (held by the datapath) is dropped.
    pub fn spawn(&self, root: PathBuf, alive: &Arc<()>) -> std::io::Result<()> {
        let metrics = self.clone();
        let alive: Weak<()> = Arc::downgrade(alive);
        std::thread::Builder::new()
            .name("ekp-map-pressure".to_owned())
            .spawn(move || {
                let mut warned = Warned::default();
                loop {
                    std::thread::sleep(SAMPLE_INTERVAL);
                    if alive.upgrade().is_none() {
                        return;
                    }
                    let fills = metrics.update(&root);
                    warned.check(&fills);
                }
            })
            .map(|_| ())
    }
}

/// Maps above [`WARN_RATIO`] at the previous sample, and those warned
/// about since they went above.
#[derive(Default)]
pub struct Warned {
    above: Vec<&'static str>,
    told: Vec<&'static str>,
}

impl Warned {
    /// Logs a warning for each map above [`WARN_RATIO`] now and at the
    /// sample before (once until it falls below again); the maps warned
    /// about now.
    pub fn check(&mut self, fills: &[Fill]) -> Vec<&'static str> {
        let mut now = Vec::new();
        let mut warn = Vec::new();
        for f in fills.iter().filter(|f| f.ratio() > WARN_RATIO) {
            now.push(f.map);
            if self.above.contains(&f.map) && !self.told.contains(&f.map) {
                tracing::warn!(
                    map = f.map,
                    entries = f.entries,
                    capacity = f.capacity,
                    pressure = f.ratio(),
                    "eBPF map above 90% full for a sync period; when full, the kernel evicts its least recently used entries (connections may break)"
                );
                warn.push(f.map);
            }
        }
        self.told.retain(|m| now.contains(m));
        self.told.extend(&warn);
        self.above = now;
        warn
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(map: &'static str, entries: usize) -> Fill {
        Fill {
            map,
            entries,
            capacity: 100,
        }
    }

    #[test]
    fn a_map_is_warned_about_once_after_two_samples_above_90_percent() {
        let mut w = Warned::default();
        assert!(
            w.check(&[fill(MAP_CT, 95)]).is_empty(),
            "one sample is not a period"
        );
        assert_eq!(w.check(&[fill(MAP_CT, 95)]), vec![MAP_CT]);
        assert!(w.check(&[fill(MAP_CT, 99)]).is_empty(), "told once");
        assert!(w.check(&[fill(MAP_CT, 50)]).is_empty());
        assert!(w.check(&[fill(MAP_CT, 91)]).is_empty());
        assert_eq!(w.check(&[fill(MAP_CT, 91)]), vec![MAP_CT], "above again");
        assert!(
            w.check(&[fill(MAP_REVNAT, 90)]).is_empty(),
            "90% is not above"
        );
    }
}
