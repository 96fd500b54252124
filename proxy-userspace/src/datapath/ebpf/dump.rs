//! `ebpf-kube-proxy dump`: decodes the pinned maps (service → slots →
//! backends, affinity entries, counters) of a running or stopped eBPF
//! datapath. Read-only; works without the daemon.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use aya::maps::{HashMap, MapData};
use proxy_common::{
    RevNatKey, RevNatValue, MAP_REVNAT, STAT_AFFINITY_HIT, STAT_NO_BACKEND, STAT_SLOT_MISSING,
    STAT_TRANSLATED,
};
use serde::Serialize;

use super::codec::{protocol_name, BackendAddr, Header, Vip};
use super::loader::{LINKS_DIR, PROGRAMS};
use super::maps::{open_pinned, read_stats, KernelMaps};
use super::EbpfError;

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct SlotDump {
    pub slot: u16,
    pub backend_id: u32,
    /// `None`: the id is not in EKP_BACKENDS (never expected).
    pub backend: Option<String>,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ServiceDump {
    pub address: String,
    pub port: u16,
    pub protocol: String,
    pub service_id: u32,
    /// Backends the hook picks from; 0 = connections refused.
    pub count: u16,
    pub affinity_timeout_seconds: Option<u32>,
    pub slots: Vec<SlotDump>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct AffinityDump {
    pub netns_cookie: u64,
    pub service_id: u32,
    pub backend_id: u32,
    pub backend: Option<String>,
    pub idle_seconds: f64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MapDump {
    pub bpffs_root: String,
    /// Pinned links (programs attached).
    pub links: Vec<String>,
    pub services: Vec<ServiceDump>,
    pub backends: usize,
    pub affinity: Vec<AffinityDump>,
    pub reverse_nat_entries: usize,
    pub stats: BTreeMap<String, u64>,
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// Reads every pinned map under `root`.
pub fn read(root: &Path) -> Result<MapDump, EbpfError> {
    let maps = KernelMaps::from_pins(root)?;
    let backends: BTreeMap<u32, BackendAddr> = maps
        .backend_entries()?
        .into_iter()
        .filter_map(|(id, b)| Some((id, BackendAddr::from_value(&b)?)))
        .collect();
    let name_of = |id: u32| backends.get(&id).map(ToString::to_string);

    let mut headers: BTreeMap<Vip, Header> = BTreeMap::new();
    let mut slots: BTreeMap<Vip, Vec<(u16, u32)>> = BTreeMap::new();
    for (k, v) in maps.service_entries()? {
        let Some((vip, slot)) = Vip::from_key(&k) else {
            continue;
        };
        if slot == 0 {
            headers.insert(vip, Header::from_value(&v));
        } else {
            slots.entry(vip).or_default().push((slot, v.backend_id));
        }
    }
    let services = headers
        .iter()
        .map(|(vip, h)| {
            let mut s = slots.remove(vip).unwrap_or_default();
            s.sort_unstable();
            ServiceDump {
                address: vip.ip.to_string(),
                port: vip.port,
                protocol: protocol_name(vip.proto),
                service_id: h.service_id,
                count: h.count,
                affinity_timeout_seconds: h.affinity().then_some(h.affinity_timeout),
                slots: s
                    .into_iter()
                    .map(|(slot, backend_id)| SlotDump {
                        slot,
                        backend_id,
                        backend: name_of(backend_id),
                    })
                    .collect(),
            }
        })
        .collect();

    let now = monotonic_ns();
    let mut affinity: Vec<AffinityDump> = maps
        .affinity_entries()?
        .into_iter()
        .map(|(k, v)| AffinityDump {
            netns_cookie: k.client_cookie,
            service_id: k.service_id,
            backend_id: v.backend_id,
            backend: name_of(v.backend_id),
            idle_seconds: now.saturating_sub(v.last_used_ns) as f64 / 1e9,
        })
        .collect();
    affinity.sort_by_key(|a| (a.service_id, a.netns_cookie));

    let revnat: HashMap<MapData, RevNatKey, RevNatValue> =
        HashMap::try_from(open_pinned(root, MAP_REVNAT)?).map_err(|e| EbpfError::Map {
            map: MAP_REVNAT,
            op: "open",
            reason: e.to_string(),
        })?;
    let reverse_nat_entries = revnat.keys().filter(Result::is_ok).count();

    let counters = read_stats(root)?;
    let stat = |i: u32| counters.get(i as usize).copied().unwrap_or(0);
    let stats = BTreeMap::from([
        ("translated".to_owned(), stat(STAT_TRANSLATED)),
        ("no_backend".to_owned(), stat(STAT_NO_BACKEND)),
        ("affinity_hit".to_owned(), stat(STAT_AFFINITY_HIT)),
        ("slot_missing".to_owned(), stat(STAT_SLOT_MISSING)),
    ]);

    let links = PROGRAMS
        .iter()
        .filter(|p| root.join(LINKS_DIR).join(p).exists())
        .map(|p| p.to_string())
        .collect();
    Ok(MapDump {
        bpffs_root: root.display().to_string(),
        links,
        services,
        backends: backends.len(),
        affinity,
        reverse_nat_entries,
        stats,
    })
}

/// Human-readable form; ends with a newline.
pub fn text(d: &MapDump) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# eBPF datapath, pinned under {}", d.bpffs_root);
    let _ = writeln!(
        s,
        "links: {}",
        if d.links.is_empty() {
            "none (programs detached)".to_owned()
        } else {
            d.links.join(" ")
        }
    );
    let _ = writeln!(
        s,
        "services: {}  backends: {}  reverse-NAT entries: {}",
        d.services.len(),
        d.backends,
        d.reverse_nat_entries
    );
    for svc in &d.services {
        let addr = std::net::SocketAddr::new(
            svc.address
                .parse()
                .unwrap_or(std::net::IpAddr::from([0, 0, 0, 0])),
            svc.port,
        );
        let mut line = format!(
            "{addr}/{}  id={}  backends={}",
            svc.protocol, svc.service_id, svc.count
        );
        if let Some(t) = svc.affinity_timeout_seconds {
            let _ = write!(line, "  affinity=ClientIP/{t}s");
        }
        if svc.count == 0 {
            line.push_str("  (no endpoints: connect refused)");
        }
        let _ = writeln!(s, "{line}");
        for slot in &svc.slots {
            let _ = writeln!(
                s,
                "  slot {:>4} -> #{} {}{}",
                slot.slot,
                slot.backend_id,
                slot.backend.as_deref().unwrap_or("(missing backend)"),
                if slot.slot > svc.count {
                    "  (beyond count)"
                } else {
                    ""
                }
            );
        }
    }
    let _ = writeln!(s, "affinity entries: {}", d.affinity.len());
    for a in &d.affinity {
        let _ = writeln!(
            s,
            "  netns {} service id {} -> #{} {}  idle {:.1}s",
            a.netns_cookie,
            a.service_id,
            a.backend_id,
            a.backend.as_deref().unwrap_or("(gone)"),
            a.idle_seconds
        );
    }
    let stats: Vec<String> = d.stats.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let _ = writeln!(s, "stats: {}", stats.join(" "));
    s
}
