//! Tracked node-external flows (`EKP_CT`) whose backend is no longer one
//! of its frontend's — removed from the slice, another target port, the
//! service or frontend deleted, externalTrafficPolicy changed — are
//! deleted after the apply that made them stale, both directions, as
//! kube-proxy deletes the conntrack entries of stale UDP endpoints. The
//! flow's next packet is then a new flow: a UDP client keeping its source
//! port reaches a live backend (or is refused when there is none), and a
//! TCP segment reaches a backend without the connection, which answers
//! with a RST. Endpoints that terminate but still serve keep their flows.
//!
//! A TCP flow's reply entry is not deleted but marked closing, so it
//! lapses once the backend has been silent for `CT_TIMEOUT_TCP_CLOSING`:
//! a backend that has acknowledged a request and answers it after the
//! apply still reaches its client. Deleted with the flow, the answer left
//! untranslated, the client dropped it and, having nothing more to send
//! (its request was acknowledged), waited silently for an answer that
//! never came (the `sync-under-load` bench's hung NodePort connections).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;

use aya::maps::{HashMap as BpfHashMap, MapData};
use proxy_common::{CtKey, CtValue, CT_F_CLOSING, CT_F_ORIGINAL, MAP_CT, PROTO_TCP};

use super::codec::{decode_ip, Scope, Vip};
use super::maps::open_pinned;
use super::plan::{Change, Programmed};
use super::{chain, EbpfError};

/// `bpf_map_update_elem` flag: only an existing entry is updated.
const BPF_EXIST: u64 = 2;

/// External frontends that lost backends in an apply, with the backends
/// their flows may keep.
#[derive(Debug, Default)]
pub struct StaleFlows {
    keep: HashMap<Vip, HashSet<SocketAddr>>,
}

impl StaleFlows {
    /// Compares `changes` with the maps before they are written (`view`).
    pub fn of(view: &Programmed, changes: &[Change<'_>]) -> StaleFlows {
        let mut keep = HashMap::new();
        for c in changes {
            let vip = match c {
                Change::Upsert(d) => d.vip,
                Change::Remove(vip) => *vip,
            };
            // Before the set of its backends is made: a socket-scope VIP
            // of 100,000 backends would cost milliseconds for nothing.
            if vip.scope != Scope::External {
                continue;
            }
            let (vip, allowed): (Vip, HashSet<SocketAddr>) = match c {
                Change::Upsert(d) => (
                    d.vip,
                    d.backends
                        .iter()
                        .chain(&d.draining)
                        .map(|b| SocketAddr::new(b.ip, b.port))
                        .collect(),
                ),
                Change::Remove(vip) => (*vip, HashSet::new()),
            };
            let Some(old) = view.service(&vip) else {
                continue;
            };
            let lost = old
                .slots
                .iter()
                .filter_map(|&id| view.backend(id))
                .any(|b| !allowed.contains(&SocketAddr::new(b.ip, b.port)));
            if lost {
                keep.insert(vip, allowed);
            }
        }
        StaleFlows { keep }
    }

    pub fn is_empty(&self) -> bool {
        self.keep.is_empty()
    }

    /// Deletes the stale flows' entries from the `EKP_CT` pinned under
    /// `root`; how many flows.
    pub fn flush(&self, root: &Path) -> Result<usize, EbpfError> {
        if self.keep.is_empty() {
            return Ok(0);
        }
        let mut ct: BpfHashMap<MapData, CtKey, CtValue> =
            BpfHashMap::try_from(open_pinned(root, MAP_CT)?).map_err(|e| EbpfError::Map {
                map: MAP_CT,
                op: "open pin",
                reason: chain(&e),
            })?;
        let mut stale = Vec::new();
        for entry in ct.iter() {
            // An entry that expired between two reads: skipped.
            let Ok((k, v)) = entry else {
                continue;
            };
            if v.flags & CT_F_ORIGINAL == 0 {
                continue;
            }
            let Some(ip) = decode_ip(&k.daddr, k.family) else {
                continue;
            };
            let vip = Vip {
                ip,
                port: u16::from_be(k.dport),
                proto: k.proto,
                scope: Scope::External,
            };
            let Some(keep) = self.keep.get(&vip) else {
                continue;
            };
            let Some(backend) = decode_ip(&v.daddr, k.family) else {
                continue;
            };
            if !keep.contains(&SocketAddr::new(backend, u16::from_be(v.dport))) {
                stale.push((k, v));
            }
        }
        for (k, v) in &stale {
            let reply = reply_key(k, v);
            // Gone already (expired, evicted): nothing to do.
            let _ = ct.remove(k);
            if k.proto != PROTO_TCP {
                let _ = ct.remove(&reply);
                continue;
            }
            if let Ok(mut r) = ct.get(&reply, 0) {
                if r.flags & CT_F_ORIGINAL == 0 {
                    r.flags |= CT_F_CLOSING;
                    // A reply entry evicted meanwhile stays gone.
                    let _ = ct.insert(reply, r, BPF_EXIST);
                }
            }
        }
        Ok(stale.len())
    }
}

/// The key of a tracked flow's reply direction, as `record` in the tc
/// program writes it from the flow's entry.
pub(crate) fn reply_key(k: &CtKey, v: &CtValue) -> CtKey {
    CtKey {
        saddr: v.daddr,
        daddr: v.saddr,
        sport: v.dport,
        dport: v.sport,
        proto: k.proto,
        family: k.family,
        _pad: 0,
    }
}
