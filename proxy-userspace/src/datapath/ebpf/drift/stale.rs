//! Stale entries in the maps the eBPF programs write (issue 38 item 4):
//! reverse NAT (`EKP_REVNAT`), ClientIP affinity (`EKP_AFFINITY`,
//! `EKP_EXT_AFFINITY`) and the tc programs' connection tracking
//! (`EKP_CT`). An entry is stale when what it points at is not in what
//! was programmed any more:
//!
//! * `EKP_REVNAT`: its backend address is no backend of any service, nor
//!   an endpoint that terminates but still serves (draining).
//! * `EKP_AFFINITY`, `EKP_EXT_AFFINITY`: its service id is no programmed
//!   service with ClientIP affinity of that scope, or its backend id is
//!   not in that service's slots (the rule the apply path follows when it
//!   purges affinity of a backend that leaves a service).
//! * `EKP_CT`, a flow's entry: its frontend is no programmed external
//!   frontend, or its backend is neither one of the frontend's slots nor
//!   one of its draining endpoints (as `ctflush` decides after an apply: a
//!   TCP flow to a terminating-but-serving endpoint keeps going). Its
//!   reply entry goes with it. A reply entry alone is stale when its
//!   backend is no backend or draining endpoint anywhere.
//!
//! Such entries are left by earlier daemons, by an apply that failed
//! half-way, by a purge that missed, or were written by hand; an affinity
//! entry whose backend id is later given to another backend sends its
//! client there. Each map is read once in batches (cost: the map's fill),
//! judged against the view without building anything, and against the
//! draining endpoints (the desired state, worked out once) only for the
//! entries the view alone would remove. The stale ones are deleted in one
//! batch per map — only when `still_current` says nothing was written
//! since the judgement began — and reported as `map_entry` drift that
//! the check itself repaired ([`Drift::repaired`]).

use std::cell::OnceCell;
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::path::Path;

use aya::maps::MapData;
use proxy_common::{
    AffinityKey, AffinityValue, CtKey, CtValue, ExtAffinityKey, RevNatKey, RevNatValue,
    CT_F_CLOSING, CT_F_ORIGINAL, MAP_AFFINITY, MAP_CT, MAP_EXT_AFFINITY, MAP_REVNAT,
};

use super::super::batch;
use super::super::codec::{decode_ip, Scope, Vip};
use super::super::desired::DesiredService;
use super::super::plan::Programmed;
use super::super::EbpfError;
use crate::datapath::drift::{Drift, DriftKind, ABSENT};

/// What is live: the view, and the draining endpoints asked for only when
/// an entry fails the view.
pub struct Live<'a> {
    view: &'a Programmed,
    desired: &'a dyn Fn() -> Vec<DesiredService>,
    owner: &'a dyn Fn(&Vip) -> Option<String>,
    backends: OnceCell<HashSet<SocketAddr>>,
    /// Service id → (VIP, backend ids in its slots), per scope, for
    /// services with ClientIP affinity.
    affinity: OnceCell<AffinityServices>,
    frontends: std::cell::RefCell<HashMap<Vip, Option<HashSet<SocketAddr>>>>,
    draining: OnceCell<Draining>,
}

/// (scope, service id) → a VIP of the service and its slots' backend ids.
type AffinityServices = HashMap<(Scope, u32), (Vip, HashSet<u32>)>;

#[derive(Default)]
struct Draining {
    any: HashSet<SocketAddr>,
    by_vip: HashMap<Vip, HashSet<SocketAddr>>,
}

fn sock(ip: IpAddr, port_be: u16) -> SocketAddr {
    SocketAddr::new(ip, u16::from_be(port_be))
}

impl<'a> Live<'a> {
    pub fn new(
        view: &'a Programmed,
        desired: &'a dyn Fn() -> Vec<DesiredService>,
        owner: &'a dyn Fn(&Vip) -> Option<String>,
    ) -> Live<'a> {
        Live {
            view,
            desired,
            owner,
            backends: OnceCell::new(),
            affinity: OnceCell::new(),
            frontends: Default::default(),
            draining: OnceCell::new(),
        }
    }

    fn draining(&self) -> &Draining {
        self.draining.get_or_init(|| {
            let mut d = Draining::default();
            for s in (self.desired)() {
                for b in &s.draining {
                    let a = SocketAddr::new(b.ip, b.port);
                    d.any.insert(a);
                    d.by_vip.entry(s.vip).or_default().insert(a);
                }
            }
            d
        })
    }

    /// A backend of some service, or a draining endpoint.
    fn backend_live(&self, addr: SocketAddr) -> bool {
        self.backends
            .get_or_init(|| {
                self.view
                    .backends()
                    .map(|(_, b)| SocketAddr::new(b.ip, b.port))
                    .collect()
            })
            .contains(&addr)
            || self.draining().any.contains(&addr)
    }

    /// The affinity entry's service and whether `backend_id` is in its
    /// slots; `None` when no such service has affinity.
    fn affinity(&self, scope: Scope, service_id: u32, backend_id: u32) -> Option<(Vip, bool)> {
        let by_id = self.affinity.get_or_init(|| {
            let mut out = AffinityServices::new();
            for (vip, s) in self.view.services() {
                let Some(h) = s.header.filter(|h| h.affinity()) else {
                    continue;
                };
                let e = out
                    .entry((vip.scope, h.service_id))
                    .or_insert_with(|| (*vip, HashSet::new()));
                e.1.extend(s.slots.iter().copied().filter(|id| *id != 0));
            }
            out
        });
        by_id
            .get(&(scope, service_id))
            .map(|(vip, ids)| (*vip, ids.contains(&backend_id)))
    }

    /// Whether `vip` is a programmed frontend, and `backend` one of its
    /// slots' backends or draining endpoints.
    fn flow(&self, vip: &Vip, backend: SocketAddr) -> (bool, bool) {
        let mut frontends = self.frontends.borrow_mut();
        let slots = frontends.entry(*vip).or_insert_with(|| {
            self.view.service(vip).map(|s| {
                s.slots
                    .iter()
                    .filter_map(|id| self.view.backend(*id))
                    .map(|b| SocketAddr::new(b.ip, b.port))
                    .collect()
            })
        });
        match slots {
            None => (false, false),
            Some(slots) => (
                true,
                slots.contains(&backend)
                    || self
                        .draining()
                        .by_vip
                        .get(vip)
                        .is_some_and(|d| d.contains(&backend)),
            ),
        }
    }
}

/// One map's stale keys and their differences.
struct Stale<K> {
    keys: Vec<K>,
    drifts: Vec<Drift>,
}

impl<K> Default for Stale<K> {
    fn default() -> Self {
        Stale {
            keys: Vec::new(),
            drifts: Vec::new(),
        }
    }
}

/// A pinned map whose key and value are `K` and `V` (a map of another
/// layout, left by another build, is not read: `None`).
fn open<K, V>(root: &Path, name: &'static str) -> Result<Option<MapData>, EbpfError> {
    let path = root.join(name);
    if !path.exists() {
        return Ok(None);
    }
    let err = |e: &dyn std::error::Error| EbpfError::Map {
        map: name,
        op: "open pin",
        reason: e.to_string(),
    };
    let data = MapData::from_pin(&path).map_err(|e| err(&e))?;
    let info = data.info().map_err(|e| err(&e))?;
    if info.key_size() as usize != size_of::<K>() || info.value_size() as usize != size_of::<V>() {
        tracing::debug!(map = name, "not checked for stale entries: another layout");
        return Ok(None);
    }
    Ok(Some(data))
}

fn read_err(map: &'static str, e: std::io::Error) -> EbpfError {
    EbpfError::Map {
        map,
        op: "read",
        reason: e.to_string(),
    }
}

/// Reads `name`, judges each entry with `judge` (which adds the keys to
/// delete), then deletes them if `still_current()`; `None` when nothing
/// was deleted.
fn sweep_map<K: aya::Pod + Eq + std::hash::Hash, V: aya::Pod>(
    root: &Path,
    name: &'static str,
    still_current: &dyn Fn() -> bool,
    mut judge: impl FnMut(&K, &V, &mut Stale<K>),
) -> Result<Option<Vec<Drift>>, EbpfError> {
    let Some(data) = open::<K, V>(root, name)? else {
        return Ok(None);
    };
    let fd = data.fd().as_fd();
    let mut stale = Stale::default();
    batch::for_each_entry(fd, |k: &K, v: &V| judge(k, v, &mut stale))
        .map_err(|e| read_err(name, e))?;
    if stale.keys.is_empty() || !still_current() {
        // Written meanwhile: judged against an outdated view; the next
        // check looks again.
        return Ok(None);
    }
    let mut seen = HashSet::new();
    stale.keys.retain(|k| seen.insert(*k));
    batch::delete(fd, &stale.keys).map_err(|e| EbpfError::Map {
        map: name,
        op: "delete",
        reason: e.error.to_string(),
    })?;
    Ok(Some(stale.drifts))
}

fn stale(map: &'static str, key: String, found: String) -> Drift {
    Drift::new(DriftKind::MapEntry, map, key, ABSENT, found).repaired()
}

/// Finds, deletes and reports the stale entries of the four maps pinned
/// under `root`.
pub fn sweep(
    root: &Path,
    live: &Live<'_>,
    still_current: &dyn Fn() -> bool,
) -> Result<Vec<Drift>, EbpfError> {
    let mut out = Vec::new();
    out.extend(
        sweep_map(
            root,
            MAP_REVNAT,
            still_current,
            |k: &RevNatKey, v: &RevNatValue, s| {
                let Some(ip) = decode_ip(&k.addr, k.family) else {
                    return;
                };
                let backend = sock(ip, k.port);
                if live.backend_live(backend) {
                    return;
                }
                let vip = decode_ip(&v.addr, k.family).map(|ip| sock(ip, v.port));
                s.keys.push(*k);
                s.drifts.push(stale(
                    MAP_REVNAT,
                    format!("socket {} backend {backend}", k.cookie),
                    format!(
                        "reverse NAT to {} (backend not programmed)",
                        vip.map_or_else(|| "?".to_owned(), |a| a.to_string())
                    ),
                ));
            },
        )?
        .unwrap_or_default(),
    );
    let affinity_found = |scope, service_id, backend_id| {
        match live.affinity(
        scope, service_id, backend_id,
    ) {
        None => Some((
            None,
            format!("backend {backend_id} (service id {service_id} has no ClientIP affinity programmed)"),
        )),
        Some((_, true)) => None,
        Some((vip, false)) => Some((
            (live.owner)(&vip),
            format!("backend {backend_id} (not a backend of {vip} any more)"),
        )),
    }
    };
    out.extend(
        sweep_map(
            root,
            MAP_AFFINITY,
            still_current,
            |k: &AffinityKey, v: &AffinityValue, s| {
                if let Some((service, found)) =
                    affinity_found(Scope::Socket, k.service_id, v.backend_id)
                {
                    s.keys.push(*k);
                    s.drifts.push(
                        stale(
                            MAP_AFFINITY,
                            format!(
                                "client netns {} service id {}",
                                k.client_cookie, k.service_id
                            ),
                            found,
                        )
                        .for_service(service),
                    );
                }
            },
        )?
        .unwrap_or_default(),
    );
    out.extend(
        sweep_map(
            root,
            MAP_EXT_AFFINITY,
            still_current,
            |k: &ExtAffinityKey, v: &AffinityValue, s| {
                if let Some((service, found)) =
                    affinity_found(Scope::External, k.service_id, v.backend_id)
                {
                    let client = decode_ip(&k.client, k.family)
                        .map_or_else(|| "?".to_owned(), |ip| ip.to_string());
                    s.keys.push(*k);
                    s.drifts.push(
                        stale(
                            MAP_EXT_AFFINITY,
                            format!("client {client} service id {}", k.service_id),
                            found,
                        )
                        .for_service(service),
                    );
                }
            },
        )?
        .unwrap_or_default(),
    );
    // A reply alone is reported only when its flow's entry is not (the
    // kernel's walk meets the two in either order).
    let (mut replies, mut orphans) = (HashSet::new(), Vec::new());
    if let Some(flows) = sweep_map(root, MAP_CT, still_current, |k: &CtKey, v: &CtValue, s| {
        judge_ct(live, k, v, s, &mut replies, &mut orphans)
    })? {
        out.extend(flows);
        out.extend(
            orphans
                .into_iter()
                .filter(|(k, _)| !replies.contains(k))
                .map(|(_, d)| d),
        );
    }
    Ok(out)
}

fn proto_name(proto: u8) -> String {
    match proto {
        proxy_common::PROTO_TCP => "TCP".to_owned(),
        proxy_common::PROTO_UDP => "UDP".to_owned(),
        proxy_common::PROTO_SCTP => "SCTP".to_owned(),
        p => format!("proto {p}"),
    }
}

fn judge_ct(
    live: &Live<'_>,
    k: &CtKey,
    v: &CtValue,
    s: &mut Stale<CtKey>,
    replies: &mut HashSet<CtKey>,
    orphans: &mut Vec<(CtKey, Drift)>,
) {
    let (Some(src), Some(dst)) = (decode_ip(&k.saddr, k.family), decode_ip(&k.daddr, k.family))
    else {
        return;
    };
    let flow = format!(
        "{} {} -> {}",
        proto_name(k.proto),
        sock(src, k.sport),
        sock(dst, k.dport)
    );
    if v.flags & CT_F_ORIGINAL == 0 {
        // A reply: its key's source is the backend. One marked closing is
        // kept on purpose by `ctflush` for a TCP flow whose backend left
        // (its answers still reach the client) and lapses by itself.
        let backend = sock(src, k.sport);
        if v.flags & CT_F_CLOSING == 0 && !live.backend_live(backend) {
            s.keys.push(*k);
            orphans.push((
                *k,
                stale(
                    MAP_CT,
                    format!("reply {flow}"),
                    format!("tracked reply of backend {backend} (backend not programmed)"),
                ),
            ));
        }
        return;
    }
    let Some(backend) = decode_ip(&v.daddr, k.family).map(|ip| sock(ip, v.dport)) else {
        return;
    };
    let vip = Vip {
        ip: dst,
        port: u16::from_be(k.dport),
        proto: k.proto,
        scope: Scope::External,
    };
    let (frontend, member) = live.flow(&vip, backend);
    if member {
        return;
    }
    let reply = crate::datapath::ebpf::ctflush::reply_key(k, v);
    s.keys.extend([*k, reply]);
    replies.insert(reply);
    let found = if frontend {
        format!("tracked flow to backend {backend} (not a backend of {vip} any more)")
    } else {
        format!("tracked flow to backend {backend} (frontend {vip} not programmed)")
    };
    s.drifts.push(
        stale(MAP_CT, flow, found).for_service(frontend.then(|| (live.owner)(&vip)).flatten()),
    );
}
