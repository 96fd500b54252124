//! The map writer's pure core: what should be in the maps
//! ([`DesiredService`], from a [`LocalState`]), what is in them
//! ([`Programmed`], the writer's view, rebuilt from the kernel on start),
//! and the ordered list of map writes ([`Op`]) that turns one into the
//! other. No syscalls here; [`super::maps`] executes the ops.
//!
//! Ordering rules (the kernel must never read a half-written service):
//! * a backend is written before any slot refers to it, and deleted only
//!   after no slot refers to it any more ([`plan_gc`], run last);
//! * slots `1..=n` are written before a header's count grows to `n`;
//!   a header's count shrinks before the slots above it are deleted;
//! * a removed service loses its header first, then its slots.
//!
//! Slots are stable: a backend keeps its slot while it stays in the
//! service, a removed backend's slot is refilled from an added backend or
//! from the last slot. A one-endpoint change is O(1) map writes whatever the
//! service's size.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proxy_common::{
    Backend, ServiceKey, ServiceValue, FAMILY_V4, FAMILY_V6, MAX_BACKENDS_PER_SERVICE,
    SVC_FLAG_AFFINITY,
};

use crate::model::claims::{Claims, Frontend, FrontendIp};
use crate::model::{LocalState, ObjectKey, Protocol, ServiceEndpoints};

/// A service address: one header (and its slots) in `EKP_SERVICES`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Vip {
    pub ip: IpAddr,
    pub port: u16,
    /// IANA protocol number.
    pub proto: u8,
}

/// An endpoint address: one entry in `EKP_BACKENDS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendAddr {
    pub ip: IpAddr,
    pub port: u16,
}

/// Address words in network byte order as the kernel stores them, and the
/// family marker. IPv4 sits in word 0.
pub fn encode_ip(ip: IpAddr) -> ([u32; 4], u8) {
    match ip {
        // from_ne_bytes keeps the octets' memory order: network order.
        IpAddr::V4(a) => ([u32::from_ne_bytes(a.octets()), 0, 0, 0], FAMILY_V4),
        IpAddr::V6(a) => {
            let o = a.octets();
            let w = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            ([w(0), w(4), w(8), w(12)], FAMILY_V6)
        }
    }
}

/// The inverse of [`encode_ip`]; `None` for an unknown family.
pub fn decode_ip(addr: &[u32; 4], family: u8) -> Option<IpAddr> {
    match family {
        FAMILY_V4 => Some(IpAddr::V4(Ipv4Addr::from(addr[0].to_ne_bytes()))),
        FAMILY_V6 => {
            let mut o = [0u8; 16];
            for (i, w) in addr.iter().enumerate() {
                o[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
            }
            Some(IpAddr::V6(Ipv6Addr::from(o)))
        }
        _ => None,
    }
}

pub fn protocol_name(p: u8) -> String {
    match Protocol::from_ip_number(p) {
        Some(known) => known.as_str().to_owned(),
        None => format!("proto-{p}"),
    }
}

impl Vip {
    pub fn key(&self, slot: u16) -> ServiceKey {
        let (addr, family) = encode_ip(self.ip);
        ServiceKey {
            addr,
            port: self.port.to_be(),
            proto: self.proto,
            family,
            slot,
            _pad: 0,
        }
    }

    /// The VIP of a key and the key's slot.
    pub fn from_key(k: &ServiceKey) -> Option<(Vip, u16)> {
        let ip = decode_ip(&k.addr, k.family)?;
        Some((
            Vip {
                ip,
                port: u16::from_be(k.port),
                proto: k.proto,
            },
            k.slot,
        ))
    }
}

impl std::fmt::Display for Vip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let addr = std::net::SocketAddr::new(self.ip, self.port);
        write!(f, "{addr}/{}", protocol_name(self.proto))
    }
}

impl BackendAddr {
    pub fn value(&self) -> Backend {
        let (addr, family) = encode_ip(self.ip);
        Backend {
            addr,
            port: self.port.to_be(),
            family,
            _pad: 0,
        }
    }

    pub fn from_value(b: &Backend) -> Option<BackendAddr> {
        Some(BackendAddr {
            ip: decode_ip(&b.addr, b.family)?,
            port: u16::from_be(b.port),
        })
    }
}

impl std::fmt::Display for BackendAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::net::SocketAddr::new(self.ip, self.port).fmt(f)
    }
}

/// A header in `EKP_SERVICES` (slot 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    pub count: u16,
    pub flags: u16,
    pub affinity_timeout: u32,
    pub service_id: u32,
}

impl Header {
    pub fn value(&self) -> ServiceValue {
        ServiceValue {
            backend_id: 0,
            count: self.count,
            flags: self.flags,
            affinity_timeout: self.affinity_timeout,
            service_id: self.service_id,
        }
    }

    pub fn from_value(v: &ServiceValue) -> Header {
        Header {
            count: v.count,
            flags: v.flags,
            affinity_timeout: v.affinity_timeout,
            service_id: v.service_id,
        }
    }

    pub fn affinity(&self) -> bool {
        self.flags & SVC_FLAG_AFFINITY != 0
    }
}

/// What one VIP should translate to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredService {
    pub vip: Vip,
    pub owner: ObjectKey,
    /// `Some(seconds)` for ClientIP session affinity.
    pub affinity_timeout: Option<u32>,
    /// Sorted, no duplicates; empty = refuse connections.
    pub backends: Vec<BackendAddr>,
}

impl DesiredService {
    fn flags(&self) -> u16 {
        if self.affinity_timeout.is_some() {
            SVC_FLAG_AFFINITY
        } else {
            0
        }
    }
}

/// The VIPs of one service and their backends.
///
/// Cluster IPs use the endpoints whose port scope `internal` is set (that
/// already encodes internalTrafficPolicy and topology); external IPs and
/// load-balancer IPs reached from inside the node use the `cluster` scope.
/// Node ports are not handled by the socket hooks.
pub fn desired_services(se: &ServiceEndpoints, claims: &Claims) -> Vec<DesiredService> {
    let svc = &se.service;
    let mut out = Vec::new();
    for pm in &svc.ports {
        let proto = pm.protocol.ip_number();
        let backends = |family_v4: bool, internal: bool| -> Vec<BackendAddr> {
            let mut b: Vec<BackendAddr> = se
                .endpoints
                .iter()
                .filter(|e| e.ip.is_ipv4() == family_v4)
                .flat_map(|e| {
                    e.ports
                        .iter()
                        .filter(|p| p.name == pm.name && p.protocol == pm.protocol)
                        .filter(|p| {
                            if internal {
                                p.scopes.internal
                            } else {
                                p.scopes.cluster
                            }
                        })
                        .map(|p| BackendAddr {
                            ip: e.ip,
                            port: p.port,
                        })
                })
                .collect();
            b.sort_unstable();
            b.dedup();
            b
        };
        let vips = svc
            .cluster_ips
            .iter()
            .map(|ip| (ip, true))
            .chain(svc.external_ips.iter().map(|ip| (ip, false)))
            .chain(svc.load_balancer_ips.iter().map(|ip| (ip, false)));
        for (ip, internal) in vips {
            let frontend = Frontend {
                ip: FrontendIp::Ip(ip),
                protocol: pm.protocol,
                port: pm.port,
            };
            if !claims.owns(&svc.key, &frontend) {
                continue;
            }
            out.push(DesiredService {
                vip: Vip {
                    ip,
                    port: pm.port,
                    proto,
                },
                owner: svc.key.clone(),
                affinity_timeout: svc.session_affinity_timeout,
                backends: backends(ip.is_ipv4(), internal),
            });
        }
    }
    out
}

/// Every VIP of a state that its service owns.
pub fn desired_state(state: &LocalState, claims: &Claims) -> Vec<DesiredService> {
    state
        .services
        .iter()
        .flat_map(|se| desired_services(se, claims))
        .collect()
}

/// One VIP as it is in the kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProgrammedService {
    pub header: Option<Header>,
    /// `slots[i]` is the backend id in slot `i + 1`; 0 = no entry.
    pub slots: Vec<u32>,
}

/// The writer's view of the kernel maps. It changes only through
/// [`Programmed::apply`] after the kernel accepted the op, so it never
/// claims more than the kernel holds.
#[derive(Clone, Debug, Default)]
pub struct Programmed {
    services: HashMap<Vip, ProgrammedService>,
    backends: HashMap<u32, BackendAddr>,
    backend_ids: HashMap<BackendAddr, u32>,
    /// Number of slots per backend id (only ids with at least one).
    refs: HashMap<u32, u32>,
    /// Backends in the map with no slot: deleted by [`plan_gc`].
    unreferenced: BTreeSet<u32>,
    service_ids: HashSet<u32>,
    next_service_id: u32,
    next_backend_id: u32,
    /// Service map entries (headers plus slots) and backends, to report a
    /// full map before the kernel does.
    service_entries: usize,
}

/// A map write, in execution order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    PutBackend {
        id: u32,
        addr: BackendAddr,
    },
    PutSlot {
        vip: Vip,
        slot: u16,
        backend_id: u32,
    },
    PutHeader {
        vip: Vip,
        header: Header,
    },
    DeleteHeader {
        vip: Vip,
    },
    DeleteSlot {
        vip: Vip,
        slot: u16,
    },
    DeleteBackend {
        id: u32,
    },
    /// Forget ClientIP affinity entries of a service that point at these
    /// backends (`None`: all of the service's entries).
    PurgeAffinity {
        service_id: u32,
        backend_ids: Option<Vec<u32>>,
    },
}

impl Programmed {
    /// Rebuilds the view from map contents read back from the kernel.
    pub fn from_entries(
        services: impl IntoIterator<Item = (Vip, u16, ServiceValue)>,
        backends: impl IntoIterator<Item = (u32, BackendAddr)>,
    ) -> Programmed {
        let mut p = Programmed::default();
        for (id, addr) in backends {
            p.put_backend(id, addr);
        }
        for (vip, slot, value) in services {
            if slot == 0 {
                p.put_header(vip, Header::from_value(&value));
            } else {
                p.put_slot(vip, slot, value.backend_id);
            }
        }
        p
    }

    pub fn service(&self, vip: &Vip) -> Option<&ProgrammedService> {
        self.services.get(vip)
    }

    pub fn services(&self) -> impl Iterator<Item = (&Vip, &ProgrammedService)> {
        self.services.iter()
    }

    pub fn backend(&self, id: u32) -> Option<BackendAddr> {
        self.backends.get(&id).copied()
    }

    pub fn backend_count(&self) -> usize {
        self.backends.len()
    }

    pub fn service_entry_count(&self) -> usize {
        self.service_entries
    }

    /// Records an op the kernel accepted.
    pub fn apply(&mut self, op: &Op) {
        match op {
            Op::PutBackend { id, addr } => self.put_backend(*id, *addr),
            Op::PutSlot {
                vip,
                slot,
                backend_id,
            } => self.put_slot(*vip, *slot, *backend_id),
            Op::PutHeader { vip, header } => self.put_header(*vip, *header),
            Op::DeleteHeader { vip } => {
                if let Some(s) = self.services.get_mut(vip) {
                    if let Some(h) = s.header.take() {
                        self.service_ids.remove(&h.service_id);
                        self.service_entries -= 1;
                    }
                }
                self.forget_if_empty(vip);
            }
            Op::DeleteSlot { vip, slot } => {
                let old = self.services.get_mut(vip).and_then(|s| {
                    let i = usize::from(*slot).checked_sub(1)?;
                    let old = std::mem::take(s.slots.get_mut(i)?);
                    while s.slots.last() == Some(&0) {
                        s.slots.pop();
                    }
                    Some(old)
                });
                if let Some(old) = old.filter(|&id| id != 0) {
                    self.service_entries -= 1;
                    self.unref(old);
                }
                self.forget_if_empty(vip);
            }
            Op::DeleteBackend { id } => {
                if let Some(addr) = self.backends.remove(id) {
                    if self.backend_ids.get(&addr) == Some(id) {
                        self.backend_ids.remove(&addr);
                    }
                }
                self.refs.remove(id);
                self.unreferenced.remove(id);
            }
            Op::PurgeAffinity { .. } => {}
        }
    }

    fn put_backend(&mut self, id: u32, addr: BackendAddr) {
        if let Some(old) = self.backends.insert(id, addr) {
            if self.backend_ids.get(&old) == Some(&id) {
                self.backend_ids.remove(&old);
            }
        }
        self.backend_ids.insert(addr, id);
        if !self.refs.contains_key(&id) {
            self.unreferenced.insert(id);
        }
        self.next_backend_id = self.next_backend_id.max(id.saturating_add(1));
    }

    fn put_header(&mut self, vip: Vip, header: Header) {
        let s = self.services.entry(vip).or_default();
        match s.header.replace(header) {
            Some(old) => {
                self.service_ids.remove(&old.service_id);
            }
            None => self.service_entries += 1,
        }
        self.service_ids.insert(header.service_id);
        self.next_service_id = self
            .next_service_id
            .max(header.service_id.saturating_add(1));
    }

    fn put_slot(&mut self, vip: Vip, slot: u16, backend_id: u32) {
        let Some(i) = usize::from(slot).checked_sub(1) else {
            return;
        };
        let s = self.services.entry(vip).or_default();
        if s.slots.len() <= i {
            s.slots.resize(i + 1, 0);
        }
        let old = std::mem::replace(&mut s.slots[i], backend_id);
        if old == 0 {
            self.service_entries += 1;
        } else {
            self.unref(old);
        }
        if backend_id != 0 {
            *self.refs.entry(backend_id).or_insert(0) += 1;
            self.unreferenced.remove(&backend_id);
        }
    }

    fn unref(&mut self, id: u32) {
        if let Some(n) = self.refs.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                self.refs.remove(&id);
                if self.backends.contains_key(&id) {
                    self.unreferenced.insert(id);
                }
            }
        }
    }

    fn forget_if_empty(&mut self, vip: &Vip) {
        if self
            .services
            .get(vip)
            .is_some_and(|s| s.header.is_none() && s.slots.is_empty())
        {
            self.services.remove(vip);
        }
    }
}

/// A change for one VIP.
#[derive(Clone, Debug)]
pub enum Change<'a> {
    Upsert(&'a DesiredService),
    Remove(Vip),
}

/// A service that cannot be programmed as asked; the others still are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanProblem {
    TooManyBackends { vip: Vip, count: usize },
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub ops: Vec<Op>,
    pub problems: Vec<PlanProblem>,
    /// VIPs whose map entries change.
    pub vips_changed: usize,
}

/// Hands out ids not used in the view nor earlier in the same plan.
struct IdAlloc<'a> {
    next: u32,
    used: &'a dyn Fn(u32) -> bool,
    taken: HashSet<u32>,
}

impl IdAlloc<'_> {
    fn alloc(&mut self) -> u32 {
        loop {
            // 0 means "none" in the maps; wrap around past u32::MAX.
            let id = self.next.max(1);
            self.next = id.wrapping_add(1);
            if !(self.used)(id) && self.taken.insert(id) {
                return id;
            }
        }
    }
}

/// Ops that bring the given VIPs from what `view` holds to what `changes`
/// asks, in a safe order. VIPs not mentioned are left alone.
pub fn plan<'a>(view: &Programmed, changes: impl IntoIterator<Item = Change<'a>>) -> Plan {
    let backend_used = |id: u32| view.backends.contains_key(&id);
    let service_used = |id: u32| view.service_ids.contains(&id);
    let mut backend_alloc = IdAlloc {
        next: view.next_backend_id,
        used: &backend_used,
        taken: HashSet::new(),
    };
    let mut service_alloc = IdAlloc {
        next: view.next_service_id,
        used: &service_used,
        taken: HashSet::new(),
    };
    let mut new_backends: HashMap<BackendAddr, u32> = HashMap::new();
    let mut plan = Plan::default();
    // One change per VIP, the last one given: every VIP is planned against
    // the view once (a Remove then an Upsert of one address, when it moves
    // between services, is just the Upsert).
    let mut order = Vec::new();
    let mut last: HashMap<Vip, Change<'a>> = HashMap::new();
    for change in changes {
        let vip = match &change {
            Change::Upsert(d) => d.vip,
            Change::Remove(vip) => *vip,
        };
        if last.insert(vip, change).is_none() {
            order.push(vip);
        }
    }
    for change in order.iter().filter_map(|vip| last.remove(vip)) {
        let before = plan.ops.len();
        match change {
            Change::Upsert(d) => plan_upsert(
                view,
                d,
                &mut backend_alloc,
                &mut service_alloc,
                &mut new_backends,
                &mut plan,
            ),
            Change::Remove(vip) => plan_remove(view, &vip, &mut plan.ops),
        }
        if plan.ops.len() > before {
            plan.vips_changed += 1;
        }
    }
    plan
}

fn plan_upsert(
    view: &Programmed,
    d: &DesiredService,
    backend_alloc: &mut IdAlloc<'_>,
    service_alloc: &mut IdAlloc<'_>,
    new_backends: &mut HashMap<BackendAddr, u32>,
    plan: &mut Plan,
) {
    if d.backends.len() > usize::from(MAX_BACKENDS_PER_SERVICE) {
        plan.problems.push(PlanProblem::TooManyBackends {
            vip: d.vip,
            count: d.backends.len(),
        });
        return;
    }
    let old = view.services.get(&d.vip);
    let ops = &mut plan.ops;
    let mut want = Vec::with_capacity(d.backends.len());
    for b in &d.backends {
        let id = match view.backend_ids.get(b).or_else(|| new_backends.get(b)) {
            Some(&id) => id,
            None => {
                let id = backend_alloc.alloc();
                new_backends.insert(*b, id);
                ops.push(Op::PutBackend { id, addr: *b });
                id
            }
        };
        want.push(id);
    }
    let old_slots: &[u32] = old.map(|s| s.slots.as_slice()).unwrap_or(&[]);
    let slots = stable_slots(old_slots, &want);
    let old_header = old.and_then(|s| s.header);
    let header = Header {
        // Bounded by MAX_BACKENDS_PER_SERVICE above.
        count: u16::try_from(slots.len()).unwrap_or(MAX_BACKENDS_PER_SERVICE),
        flags: d.flags(),
        affinity_timeout: d.affinity_timeout.unwrap_or(0),
        service_id: old_header
            .map(|h| h.service_id)
            .unwrap_or_else(|| service_alloc.alloc()),
    };
    for (i, &id) in slots.iter().enumerate() {
        if old_slots.get(i) != Some(&id) {
            ops.push(Op::PutSlot {
                vip: d.vip,
                slot: slot_number(i),
                backend_id: id,
            });
        }
    }
    if old_header != Some(header) {
        ops.push(Op::PutHeader { vip: d.vip, header });
    }
    for (i, &id) in old_slots.iter().enumerate().skip(slots.len()) {
        if id != 0 {
            ops.push(Op::DeleteSlot {
                vip: d.vip,
                slot: slot_number(i),
            });
        }
    }
    if let Some(h) = old_header.filter(Header::affinity) {
        if !header.affinity() {
            ops.push(Op::PurgeAffinity {
                service_id: h.service_id,
                backend_ids: None,
            });
        } else {
            let keep: HashSet<u32> = want.iter().copied().collect();
            let mut gone: Vec<u32> = old_slots
                .iter()
                .copied()
                .filter(|id| *id != 0 && !keep.contains(id))
                .collect();
            gone.sort_unstable();
            gone.dedup();
            if !gone.is_empty() {
                ops.push(Op::PurgeAffinity {
                    service_id: h.service_id,
                    backend_ids: Some(gone),
                });
            }
        }
    }
}

fn plan_remove(view: &Programmed, vip: &Vip, ops: &mut Vec<Op>) {
    let Some(old) = view.services.get(vip) else {
        return;
    };
    if old.header.is_some() {
        ops.push(Op::DeleteHeader { vip: *vip });
    }
    for (i, &id) in old.slots.iter().enumerate() {
        if id != 0 {
            ops.push(Op::DeleteSlot {
                vip: *vip,
                slot: slot_number(i),
            });
        }
    }
    if let Some(h) = old.header.filter(Header::affinity) {
        ops.push(Op::PurgeAffinity {
            service_id: h.service_id,
            backend_ids: None,
        });
    }
}

/// Slot number of `slots[i]`. Slot vectors are bounded by
/// MAX_BACKENDS_PER_SERVICE or by what was read from a u16-keyed map.
fn slot_number(i: usize) -> u16 {
    u16::try_from(i + 1).unwrap_or(u16::MAX)
}

/// Backends no slot refers to any more; run after the service ops.
pub fn plan_gc(view: &Programmed) -> Vec<Op> {
    view.unreferenced
        .iter()
        .map(|&id| Op::DeleteBackend { id })
        .collect()
}

/// The new slot vector: ids that stay keep their slot; holes left by
/// removed ids are filled with added ids, then from the end. 0 in `old`
/// is an empty slot. `want` has no duplicates.
pub fn stable_slots(old: &[u32], want: &[u32]) -> Vec<u32> {
    let want_set: HashSet<u32> = want.iter().copied().collect();
    let mut seen = HashSet::with_capacity(old.len());
    let mut out: Vec<u32> = old
        .iter()
        .map(|&id| {
            if id != 0 && want_set.contains(&id) && seen.insert(id) {
                id
            } else {
                0
            }
        })
        .collect();
    let mut added = want.iter().copied().filter(|id| !seen.contains(id));
    for x in out.iter_mut().filter(|x| **x == 0) {
        match added.next() {
            Some(id) => *x = id,
            None => break,
        }
    }
    out.extend(added);
    let mut i = 0;
    while i < out.len() {
        if out[i] == 0 {
            // The last element moves here; look at position i again.
            out.swap_remove(i);
        } else {
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{testing, EndpointScopes};
    use proxy_common::PROTO_TCP;

    fn vip(s: &str) -> Vip {
        let a: std::net::SocketAddr = s.parse().unwrap();
        Vip {
            ip: a.ip(),
            port: a.port(),
            proto: PROTO_TCP,
        }
    }

    fn be(s: &str) -> BackendAddr {
        let a: std::net::SocketAddr = s.parse().unwrap();
        BackendAddr {
            ip: a.ip(),
            port: a.port(),
        }
    }

    fn desired(v: &str, backends: &[&str], affinity: Option<u32>) -> DesiredService {
        let mut backends: Vec<BackendAddr> = backends.iter().map(|b| be(b)).collect();
        backends.sort_unstable();
        DesiredService {
            vip: vip(v),
            owner: ObjectKey::new("default", "svc"),
            affinity_timeout: affinity,
            backends,
        }
    }

    /// A fake kernel: the two maps, checked after every single op for what
    /// the eBPF programs rely on.
    #[derive(Default)]
    struct FakeKernel {
        services: HashMap<ServiceKey, ServiceValue>,
        backends: HashMap<u32, Backend>,
        purged: Vec<(u32, Option<Vec<u32>>)>,
    }

    impl FakeKernel {
        fn run(&mut self, view: &mut Programmed, ops: &[Op]) {
            for op in ops {
                match op {
                    Op::PutBackend { id, addr } => {
                        self.backends.insert(*id, addr.value());
                    }
                    Op::PutSlot {
                        vip,
                        slot,
                        backend_id,
                    } => {
                        self.services.insert(
                            vip.key(*slot),
                            ServiceValue {
                                backend_id: *backend_id,
                                ..Default::default()
                            },
                        );
                    }
                    Op::PutHeader { vip, header } => {
                        self.services.insert(vip.key(0), header.value());
                    }
                    Op::DeleteHeader { vip } => {
                        self.services.remove(&vip.key(0));
                    }
                    Op::DeleteSlot { vip, slot } => {
                        self.services.remove(&vip.key(*slot));
                    }
                    Op::DeleteBackend { id } => {
                        self.backends.remove(id);
                    }
                    Op::PurgeAffinity {
                        service_id,
                        backend_ids,
                    } => self.purged.push((*service_id, backend_ids.clone())),
                }
                view.apply(op);
                self.check_invariants(op);
            }
        }

        /// Every header's slots 1..=count exist and point at a backend.
        fn check_invariants(&self, after: &Op) {
            for (k, v) in &self.services {
                if k.slot != 0 {
                    continue;
                }
                for slot in 1..=v.count {
                    let sk = ServiceKey { slot, ..*k };
                    let s = self
                        .services
                        .get(&sk)
                        .unwrap_or_else(|| panic!("after {after:?}: slot {slot} missing"));
                    assert!(
                        self.backends.contains_key(&s.backend_id),
                        "after {after:?}: slot {slot} -> missing backend {}",
                        s.backend_id
                    );
                }
            }
        }

        /// VIP -> backend addresses the kernel can pick (slots 1..=count).
        fn resolved(&self, v: &Vip) -> Option<Vec<BackendAddr>> {
            let h = self.services.get(&v.key(0))?;
            let mut out: Vec<BackendAddr> = (1..=h.count)
                .map(|slot| {
                    let id = self.services[&v.key(slot)].backend_id;
                    BackendAddr::from_value(&self.backends[&id]).unwrap()
                })
                .collect();
            out.sort_unstable();
            Some(out)
        }
    }

    fn sync(k: &mut FakeKernel, view: &mut Programmed, changes: Vec<Change<'_>>) -> Plan {
        let p = plan(view, changes);
        k.run(view, &p.ops);
        let gc = plan_gc(view);
        k.run(view, &gc);
        let mut p = p;
        p.ops.extend(gc);
        p
    }

    #[test]
    fn key_and_backend_are_network_byte_order() {
        let k = vip("10.96.0.10:80").key(0);
        assert_eq!(k.addr[0].to_ne_bytes(), [10, 96, 0, 10]);
        assert_eq!(k.addr[1..], [0, 0, 0]);
        assert_eq!(k.port.to_ne_bytes(), [0, 80]);
        assert_eq!((k.proto, k.family, k.slot, k._pad), (6, FAMILY_V4, 0, 0));
        let b = be("10.244.1.5:8080").value();
        assert_eq!(b.addr[0].to_ne_bytes(), [10, 244, 1, 5]);
        assert_eq!(b.port.to_ne_bytes(), 8080u16.to_be_bytes());
        assert_eq!(b.family, FAMILY_V4);
    }

    #[test]
    fn v6_keys_round_trip() {
        let v = vip("[fd00:10:96::a]:443");
        let k = v.key(3);
        assert_eq!(k.family, FAMILY_V6);
        assert_eq!(k.addr[0].to_ne_bytes(), [0xfd, 0x00, 0x00, 0x10]);
        assert_eq!(k.addr[3].to_ne_bytes(), [0, 0, 0, 0x0a]);
        assert_eq!(Vip::from_key(&k), Some((v, 3)));
        let b = be("[fd00::1]:8080");
        assert_eq!(BackendAddr::from_value(&b.value()), Some(b));
        assert_eq!(v.to_string(), "[fd00:10:96::a]:443/TCP");
    }

    #[test]
    fn new_service_writes_backends_then_slots_then_header() {
        let mut k = FakeKernel::default();
        let mut view = Programmed::default();
        let d = desired("10.96.0.10:80", &["10.0.0.1:8080", "10.0.0.2:8080"], None);
        let p = sync(&mut k, &mut view, vec![Change::Upsert(&d)]);
        let v = d.vip;
        let header = Header {
            count: 2,
            flags: 0,
            affinity_timeout: 0,
            service_id: 1,
        };
        assert_eq!(
            p.ops,
            vec![
                Op::PutBackend {
                    id: 1,
                    addr: be("10.0.0.1:8080")
                },
                Op::PutBackend {
                    id: 2,
                    addr: be("10.0.0.2:8080")
                },
                Op::PutSlot {
                    vip: v,
                    slot: 1,
                    backend_id: 1
                },
                Op::PutSlot {
                    vip: v,
                    slot: 2,
                    backend_id: 2
                },
                Op::PutHeader { vip: v, header },
            ]
        );
        assert_eq!(k.resolved(&v), Some(d.backends.clone()));
        // Applying the same state again writes nothing.
        let again = sync(&mut k, &mut view, vec![Change::Upsert(&d)]);
        assert_eq!(again.ops, vec![]);
        assert_eq!(again.vips_changed, 0);
    }

    #[test]
    fn plan_table() {
        struct Case {
            name: &'static str,
            before: Vec<&'static str>,
            after: Vec<&'static str>,
            affinity: (Option<u32>, Option<u32>),
            /// Op kinds in order: B+ backend, S+ slot, H header, S- slot
            /// delete, B- backend delete, A purge affinity.
            kinds: &'static str,
        }
        let cases = [
            Case {
                name: "grow by one",
                before: vec!["10.0.0.1:80"],
                after: vec!["10.0.0.1:80", "10.0.0.2:80"],
                affinity: (None, None),
                kinds: "B+ S+ H",
            },
            Case {
                name: "shrink the last",
                before: vec!["10.0.0.1:80", "10.0.0.2:80"],
                after: vec!["10.0.0.1:80"],
                affinity: (None, None),
                kinds: "H S- B-",
            },
            Case {
                name: "shrink the first of three: the last slot moves into the hole",
                before: vec!["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"],
                after: vec!["10.0.0.2:80", "10.0.0.3:80"],
                affinity: (None, None),
                kinds: "S+ H S- B-",
            },
            Case {
                name: "replace one: the new backend takes the slot",
                before: vec!["10.0.0.1:80", "10.0.0.2:80"],
                after: vec!["10.0.0.1:80", "10.0.0.3:80"],
                affinity: (None, None),
                kinds: "B+ S+ B-",
            },
            Case {
                name: "all endpoints gone: count 0 refuses connections",
                before: vec!["10.0.0.1:80"],
                after: vec![],
                affinity: (None, None),
                kinds: "H S- B-",
            },
            Case {
                name: "affinity: a removed backend's entries are purged",
                before: vec!["10.0.0.1:80", "10.0.0.2:80"],
                after: vec!["10.0.0.1:80"],
                affinity: (Some(10800), Some(10800)),
                kinds: "H S- A B-",
            },
            Case {
                name: "affinity switched on: header only",
                before: vec!["10.0.0.1:80"],
                after: vec!["10.0.0.1:80"],
                affinity: (None, Some(60)),
                kinds: "H",
            },
            Case {
                name: "affinity switched off: all entries purged",
                before: vec!["10.0.0.1:80"],
                after: vec!["10.0.0.1:80"],
                affinity: (Some(60), None),
                kinds: "H A",
            },
        ];
        for c in cases {
            let mut k = FakeKernel::default();
            let mut view = Programmed::default();
            let d0 = desired("10.96.0.10:80", &c.before, c.affinity.0);
            sync(&mut k, &mut view, vec![Change::Upsert(&d0)]);
            let d1 = desired("10.96.0.10:80", &c.after, c.affinity.1);
            let p = sync(&mut k, &mut view, vec![Change::Upsert(&d1)]);
            let kinds: Vec<&str> = p
                .ops
                .iter()
                .map(|op| match op {
                    Op::PutBackend { .. } => "B+",
                    Op::PutSlot { .. } => "S+",
                    Op::PutHeader { .. } => "H",
                    Op::DeleteSlot { .. } => "S-",
                    Op::DeleteHeader { .. } => "H-",
                    Op::DeleteBackend { .. } => "B-",
                    Op::PurgeAffinity { .. } => "A",
                })
                .collect();
            assert_eq!(kinds.join(" "), c.kinds, "{}", c.name);
            assert_eq!(k.resolved(&d1.vip), Some(d1.backends.clone()), "{}", c.name);
            assert_eq!(
                k.backends.len(),
                c.after.len(),
                "{}: no leaked backends",
                c.name
            );
        }
    }

    #[test]
    fn removing_a_service_deletes_header_first_and_frees_backends() {
        let mut k = FakeKernel::default();
        let mut view = Programmed::default();
        let d = desired("10.96.0.10:80", &["10.0.0.1:80", "10.0.0.2:80"], Some(5));
        sync(&mut k, &mut view, vec![Change::Upsert(&d)]);
        let p = sync(&mut k, &mut view, vec![Change::Remove(d.vip)]);
        assert_eq!(p.ops[0], Op::DeleteHeader { vip: d.vip });
        assert!(p.ops.contains(&Op::PurgeAffinity {
            service_id: 1,
            backend_ids: None
        }));
        assert!(k.services.is_empty() && k.backends.is_empty());
        assert!(view.service(&d.vip).is_none());
        assert_eq!((view.service_entry_count(), view.backend_count()), (0, 0));
    }

    #[test]
    fn an_address_moving_between_services_in_one_plan_is_rewritten_not_lost() {
        let mut k = FakeKernel::default();
        let mut view = Programmed::default();
        let a = desired("10.96.0.10:80", &["10.0.0.1:80", "10.0.0.2:80"], None);
        sync(&mut k, &mut view, vec![Change::Upsert(&a)]);
        let b = DesiredService {
            owner: ObjectKey::new("default", "other"),
            ..desired("10.96.0.10:80", &["10.0.0.2:80", "10.0.0.3:80"], None)
        };
        let p = sync(
            &mut k,
            &mut view,
            vec![Change::Remove(a.vip), Change::Upsert(&b)],
        );
        assert!(
            !p.ops.contains(&Op::DeleteHeader { vip: a.vip }),
            "{:?}",
            p.ops
        );
        assert_eq!(k.resolved(&b.vip), Some(b.backends.clone()));
        // And the other way round: upsert, then remove.
        sync(
            &mut k,
            &mut view,
            vec![Change::Upsert(&a), Change::Remove(a.vip)],
        );
        assert_eq!(k.resolved(&a.vip), None);
        assert!(k.services.is_empty() && k.backends.is_empty());
    }

    #[test]
    fn shared_backends_are_written_once_and_kept_while_used() {
        let mut k = FakeKernel::default();
        let mut view = Programmed::default();
        let a = desired("10.96.0.10:80", &["10.0.0.1:80"], None);
        let b = desired("10.96.0.11:80", &["10.0.0.1:80"], None);
        let p = sync(
            &mut k,
            &mut view,
            vec![Change::Upsert(&a), Change::Upsert(&b)],
        );
        let puts = p
            .ops
            .iter()
            .filter(|o| matches!(o, Op::PutBackend { .. }))
            .count();
        assert_eq!(puts, 1);
        sync(&mut k, &mut view, vec![Change::Remove(a.vip)]);
        assert_eq!(k.backends.len(), 1, "still used by b");
        assert_eq!(k.resolved(&b.vip), Some(b.backends.clone()));
    }

    #[test]
    fn one_endpoint_change_in_a_big_service_is_a_few_writes() {
        let mut k = FakeKernel::default();
        let mut view = Programmed::default();
        let addrs: Vec<String> = (0..1000)
            .map(|i| format!("10.1.{}.{}:80", i / 250, i % 250))
            .collect();
        let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
        let d0 = desired("10.96.0.10:80", &refs, None);
        sync(&mut k, &mut view, vec![Change::Upsert(&d0)]);
        let d1 = desired("10.96.0.10:80", &refs[1..], None);
        let p = sync(&mut k, &mut view, vec![Change::Upsert(&d1)]);
        assert!(p.ops.len() <= 4, "{:?}", p.ops);
        assert_eq!(k.resolved(&d1.vip), Some(d1.backends.clone()));
    }

    #[test]
    fn too_many_backends_is_reported_not_truncated() {
        let view = Programmed::default();
        let addrs: Vec<String> = (0..=u32::from(MAX_BACKENDS_PER_SERVICE))
            .map(|i| format!("10.{}.{}.{}:80", i >> 16, (i >> 8) & 255, i & 255))
            .collect();
        let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
        let d = desired("10.96.0.10:80", &refs, None);
        let p = plan(&view, vec![Change::Upsert(&d)]);
        assert!(p.ops.is_empty());
        assert_eq!(
            p.problems,
            vec![PlanProblem::TooManyBackends {
                vip: d.vip,
                count: usize::from(MAX_BACKENDS_PER_SERVICE) + 1
            }]
        );
    }

    #[test]
    fn adopted_view_reconciles_without_rewriting_what_is_right() {
        // A previous daemon programmed the maps; a new one reads them back.
        let mut k = FakeKernel::default();
        let mut old = Programmed::default();
        let d = desired("10.96.0.10:80", &["10.0.0.1:80", "10.0.0.2:80"], None);
        let gone = desired("10.96.0.99:80", &["10.0.0.9:80"], None);
        sync(
            &mut k,
            &mut old,
            vec![Change::Upsert(&d), Change::Upsert(&gone)],
        );
        let mut view = Programmed::from_entries(
            k.services
                .iter()
                .map(|(key, v)| {
                    let (vip, slot) = Vip::from_key(key).unwrap();
                    (vip, slot, *v)
                })
                .collect::<Vec<_>>(),
            k.backends
                .iter()
                .map(|(id, b)| (*id, BackendAddr::from_value(b).unwrap()))
                .collect::<Vec<_>>(),
        );
        let p = sync(
            &mut k,
            &mut view,
            vec![Change::Upsert(&d), Change::Remove(gone.vip)],
        );
        // Nothing of the kept service is rewritten.
        assert!(p.ops.iter().all(|o| !matches!(o, Op::PutSlot { vip, .. } | Op::PutHeader { vip, .. } if *vip == d.vip)), "{:?}", p.ops);
        assert_eq!(k.resolved(&d.vip), Some(d.backends.clone()));
        assert_eq!(k.resolved(&gone.vip), None);
        assert_eq!(k.backends.len(), 2);
        // New ids do not collide with adopted ones.
        let e = desired("10.96.0.12:80", &["10.0.0.3:80"], None);
        let p = sync(&mut k, &mut view, vec![Change::Upsert(&e)]);
        match &p.ops[0] {
            Op::PutBackend { id, .. } => assert_eq!(*id, 4, "ids 1-3 were adopted"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn stable_slots_keep_positions() {
        assert_eq!(stable_slots(&[1, 2, 3], &[1, 2, 3]), vec![1, 2, 3]);
        assert_eq!(stable_slots(&[1, 2, 3], &[2, 3]), vec![3, 2]);
        assert_eq!(stable_slots(&[1, 2, 3], &[1, 2]), vec![1, 2]);
        assert_eq!(stable_slots(&[1, 2], &[1, 2, 4]), vec![1, 2, 4]);
        assert_eq!(stable_slots(&[1, 2, 3], &[1, 3, 4]), vec![1, 4, 3]);
        assert_eq!(stable_slots(&[1, 0, 3], &[1, 3]), vec![1, 3]);
        assert_eq!(stable_slots(&[5, 5], &[5]), vec![5]);
        assert_eq!(stable_slots(&[], &[7, 8]), vec![7, 8]);
        assert_eq!(stable_slots(&[7, 8], &[]), Vec::<u32>::new());
    }

    fn service(
        cluster: &[&str],
        external: &[&str],
        endpoints: &[(&str, u16, EndpointScopes)],
    ) -> ServiceEndpoints {
        let mut se = testing::service("default", "web", cluster)
            .with_external_ips(external)
            .with_endpoints(
                endpoints
                    .iter()
                    .map(|(ip, port, scopes)| testing::endpoint(ip, *port, *scopes)),
            );
        se.service.uid = String::new();
        se.service.session_affinity_timeout = Some(10800);
        se
    }

    #[test]
    fn cluster_ips_use_the_internal_scope_and_external_ips_the_cluster_scope() {
        let both = EndpointScopes {
            cluster: true,
            local: true,
            internal: true,
            external: true,
        };
        let remote = EndpointScopes {
            cluster: true,
            internal: false,
            ..Default::default()
        };
        let se = service(
            &["10.96.0.10", "fd00::10"],
            &["192.0.2.7"],
            &[
                ("10.0.0.1", 8080, both),
                ("10.0.0.2", 8080, remote),
                ("fd00::1", 8080, both),
            ],
        );
        let claims = Claims::of(&testing::state(vec![se.clone()]));
        let d = desired_services(&se, &claims);
        let got: Vec<(String, Vec<String>, Option<u32>)> = d
            .iter()
            .map(|d| {
                (
                    d.vip.to_string(),
                    d.backends.iter().map(ToString::to_string).collect(),
                    d.affinity_timeout,
                )
            })
            .collect();
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            got,
            vec![
                (
                    "10.96.0.10:80/TCP".into(),
                    s(&["10.0.0.1:8080"]),
                    Some(10800)
                ),
                (
                    "[fd00::10]:80/TCP".into(),
                    s(&["[fd00::1]:8080"]),
                    Some(10800)
                ),
                (
                    "192.0.2.7:80/TCP".into(),
                    s(&["10.0.0.1:8080", "10.0.0.2:8080"]),
                    Some(10800)
                ),
            ]
        );
    }

    #[test]
    fn a_vip_claimed_twice_goes_to_its_owner_only() {
        let a = service(&["10.96.0.10"], &[], &[]).created_at(2);
        let mut b = service(&["10.96.0.20"], &["10.96.0.10"], &[]).created_at(1);
        b.service.key = ObjectKey::new("default", "zzz");
        let state = testing::state(vec![a, b]);
        let d = desired_state(&state, &Claims::of(&state));
        let owners: Vec<(String, &str)> = d
            .iter()
            .map(|d| (d.vip.to_string(), d.owner.name.as_str()))
            .collect();
        assert_eq!(
            owners,
            [
                ("10.96.0.20:80/TCP".to_owned(), "zzz"),
                ("10.96.0.10:80/TCP".to_owned(), "zzz")
            ]
        );
    }
}
