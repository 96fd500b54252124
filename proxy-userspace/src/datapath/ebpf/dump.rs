//! `ebpf-kube-proxy dump`: decodes the pinned maps (service → slots →
//! backends, affinity entries, counters), the tc attachments and a summary
//! of the node-external connection tracking of a running or stopped eBPF
//! datapath. Read-only; works without the daemon.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use aya::maps::{HashMap, MapData};
use proxy_common::{
    CtKey, CtValue, RevNatKey, RevNatValue, CT_F_CLOSING, CT_F_ORIGINAL, CT_F_REDIRECT, MAP_CT,
    MAP_REVNAT, PROTO_TCP, STAT_AFFINITY_HIT, STAT_EXT_NO_BACKEND, STAT_EXT_REJECTED,
    STAT_EXT_SOURCE_DENIED, STAT_EXT_TRANSLATED, STAT_EXT_TTL_EXCEEDED, STAT_EXT_UNROUTABLE,
    STAT_NO_BACKEND, STAT_SLOT_MISSING, STAT_TRANSLATED,
};
use serde::Serialize;

use super::codec::{protocol_name, BackendAddr, Header, Scope, Vip};
use super::loader::PROGRAMS;
use super::maps::{open_pinned, read_ext_stats, read_stats, KernelMaps};
use super::pins::LINKS_DIR;
use super::EbpfError;

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct SlotDump {
    pub slot: u32,
    pub backend_id: u32,
    /// `None`: the id is not in EKP_BACKENDS (never expected).
    pub backend: Option<String>,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ServiceDump {
    pub address: String,
    pub port: u16,
    pub protocol: String,
    /// `socket` (the cgroup hooks: connections made on the node) or
    /// `external` (the tc programs: packets from outside the node).
    pub scope: &'static str,
    /// loadBalancerSourceRanges are enforced (external scope).
    pub source_ranges: bool,
    /// External scope without any usable endpoint: new flows are refused
    /// (TCP RST, ICMP port unreachable) instead of dropped.
    pub reject: bool,
    pub service_id: u32,
    /// Backends the hook picks from; 0 = connections refused.
    pub count: u32,
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

/// A tc program attached to an interface (a pinned TCX link).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct TcDump {
    pub interface: String,
    pub ifindex: u32,
    pub direction: &'static str,
    pub program: &'static str,
}

/// The node-external connection tracking (`EKP_CT`), summed up.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ConntrackDump {
    /// Flows (client-direction entries).
    pub flows: usize,
    /// Of those, forwarded to another node with SNAT.
    pub snat_flows: usize,
    pub tcp_flows: usize,
    /// TCP flows that saw a FIN or RST.
    pub closing: usize,
    /// Every entry (each flow has two: both directions).
    pub entries: usize,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MapDump {
    pub bpffs_root: String,
    /// Pinned links (programs attached).
    pub links: Vec<String>,
    /// tc programs on the node's interfaces.
    pub tc: Vec<TcDump>,
    pub conntrack: ConntrackDump,
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
    let mut slots: BTreeMap<Vip, Vec<(u32, u32)>> = BTreeMap::new();
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
                scope: match vip.scope {
                    Scope::Socket => "socket",
                    Scope::External => "external",
                },
                source_ranges: h.flags & proxy_common::SVC_FLAG_SOURCE_RANGES != 0,
                reject: h.flags & proxy_common::SVC_FLAG_REJECT != 0,
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
    let ext = read_ext_stats(root).unwrap_or_default();
    let ext_stat = |i: u32| ext.get(i as usize).copied().unwrap_or(0);
    let mut stats = stats;
    stats.extend([
        (
            "external_translated".to_owned(),
            ext_stat(STAT_EXT_TRANSLATED),
        ),
        (
            "external_no_local_endpoint".to_owned(),
            ext_stat(STAT_EXT_NO_BACKEND),
        ),
        (
            "external_source_range_denied".to_owned(),
            ext_stat(STAT_EXT_SOURCE_DENIED),
        ),
        (
            "external_unroutable".to_owned(),
            ext_stat(STAT_EXT_UNROUTABLE),
        ),
        ("external_rejected".to_owned(), ext_stat(STAT_EXT_REJECTED)),
        (
            "external_ttl_exceeded".to_owned(),
            ext_stat(STAT_EXT_TTL_EXCEEDED),
        ),
    ]);

    let links = PROGRAMS
        .iter()
        .filter(|p| root.join(LINKS_DIR).join(p).exists())
        .map(|p| p.to_string())
        .collect();
    let tc = super::external::pinned(root)
        .into_iter()
        .filter_map(|(name, ifindex)| {
            let (program, direction) = super::external::TC_PROGRAMS
                .iter()
                .find(|(p, _)| name.starts_with(p))
                .map(|(p, d)| (*p, *d))?;
            Some(TcDump {
                interface: interface_name(ifindex),
                ifindex,
                direction: match direction {
                    aya::programs::TcAttachType::Egress => "egress",
                    _ => "ingress",
                },
                program,
            })
        })
        .collect();
    Ok(MapDump {
        bpffs_root: root.display().to_string(),
        links,
        tc,
        conntrack: conntrack(root),
        services,
        backends: backends.len(),
        affinity,
        reverse_nat_entries,
        stats,
    })
}

/// The interface's name in this network namespace, or `?` when it is gone.
fn interface_name(ifindex: u32) -> String {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` has IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return "?".to_owned();
    }
    // SAFETY: on success the buffer holds a NUL-terminated name.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Counts the conntrack entries (an empty summary without the map: a
/// datapath pinned by a version without the tc programs).
fn conntrack(root: &Path) -> ConntrackDump {
    let Ok(map) = open_pinned(root, MAP_CT) else {
        return ConntrackDump::default();
    };
    let Ok(ct) = HashMap::<MapData, CtKey, CtValue>::try_from(map) else {
        return ConntrackDump::default();
    };
    let mut d = ConntrackDump::default();
    for (k, v) in ct.iter().filter_map(Result::ok) {
        d.entries += 1;
        if v.flags & CT_F_ORIGINAL == 0 {
            continue;
        }
        d.flows += 1;
        d.snat_flows += usize::from(v.flags & CT_F_REDIRECT != 0);
        if k.proto == PROTO_TCP {
            d.tcp_flows += 1;
            d.closing += usize::from(v.flags & CT_F_CLOSING != 0);
        }
    }
    d
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
        "tc: {}",
        if d.tc.is_empty() {
            "none (no node-external traffic served)".to_owned()
        } else {
            let t: Vec<String> =
                d.tc.iter()
                    .map(|t| format!("{}/{}={}", t.interface, t.direction, t.program))
                    .collect();
            t.join(" ")
        }
    );
    let c = &d.conntrack;
    let _ = writeln!(
        s,
        "conntrack (node-external): {} flows ({} with SNAT, {} TCP, {} closing), {} entries",
        c.flows, c.snat_flows, c.tcp_flows, c.closing, c.entries
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
        if svc.scope == "external" {
            line.push_str("  (from outside the node)");
        }
        if svc.source_ranges {
            line.push_str("  source-ranges");
        }
        if let Some(t) = svc.affinity_timeout_seconds {
            let _ = write!(line, "  affinity=ClientIP/{t}s");
        }
        if svc.count == 0 {
            line.push_str(if svc.reject {
                "  (no endpoints: rejected)"
            } else if svc.scope == "external" {
                "  (no endpoints: packets dropped)"
            } else {
                "  (no endpoints: connect refused)"
            });
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
