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
//! service's size, and with the backends the VIP was last written from
//! ([`LastWritten`]) it is planned in time proportional to the change too
//! (a linear compare of two sorted lists, then hashing of the changed
//! backends only), not to the service.

use std::collections::BTreeSet;

// foldhash (randomly seeded), not SipHash: these tables take every entry
// of a full sync (300k slots and 250k backends at 50k services) and their
// keys are small.
use hashbrown::{HashMap, HashSet};
use proxy_common::{ServiceValue, MAX_BACKENDS_PER_SERVICE};
use smallvec::SmallVec;

use super::backend_table::BackendTable;
use super::codec::{BackendAddr, Header, Vip};
use super::desired::DesiredService;

/// One VIP as it is in the kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProgrammedService {
    pub header: Option<Header>,
    /// `slots[i]` is the backend id in slot `i + 1`; 0 = no entry. Up to
    /// four inline: the size of a `Vec`, without its heap block.
    pub slots: SmallVec<[u32; 4]>,
}

/// The writer's view of the kernel maps. It changes only through
/// [`Programmed::apply`] after the kernel accepted the op, so it never
/// claims more than the kernel holds.
#[derive(Clone, Debug, Default)]
pub struct Programmed {
    services: HashMap<Vip, ProgrammedService>,
    /// Backends by id and by address, with the number of slots using each.
    backends: BackendTable,
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
        slot: u32,
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
        slot: u32,
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

/// One entry read back from the kernel maps.
#[derive(Clone, Copy, Debug)]
pub enum Entry {
    /// A services map entry: slot 0 is the header.
    Service(Vip, u32, ServiceValue),
    Backend(u32, BackendAddr),
}

impl Programmed {
    /// Adds an entry read back from the kernel (in any order; reading the
    /// backends first, as [`super::maps`] does, sorts them once).
    /// [`Programmed::finish_load`] ends the load.
    pub fn add_entry(&mut self, entry: Entry) {
        match entry {
            Entry::Backend(id, addr) => {
                // Sorted and indexed all at once (the map's order is its
                // hash order): one sort, not a shift per backend.
                // A slot read before it already counts (and is kept).
                if self.backends.load_unordered(id, addr) {
                    self.unreferenced.insert(id);
                }
                self.next_backend_id = self.next_backend_id.max(id.saturating_add(1));
            }
            Entry::Service(vip, slot, value) => {
                self.backends.finish_load();
                match slot {
                    0 => self.put_header(vip, Header::from_value(&value)),
                    _ => self.put_slot(vip, slot, value.backend_id),
                }
            }
        }
    }

    /// Ends a load of entries read back from the kernel.
    pub fn finish_load(&mut self) {
        self.backends.finish_load();
    }

    /// Whether the view has this entry, as it is.
    pub fn holds(&self, entry: &Entry) -> bool {
        match *entry {
            Entry::Backend(id, addr) => self.backends.get(id) == Some(addr),
            Entry::Service(vip, 0, value) => self
                .services
                .get(&vip)
                .is_some_and(|s| s.header == Some(Header::from_value(&value))),
            Entry::Service(vip, slot, value) => self.services.get(&vip).is_some_and(|s| {
                s.slots.get(slot as usize - 1) == Some(&value.backend_id) && value.backend_id != 0
            }),
        }
    }

    /// Rebuilds the view from map contents read back from the kernel.
    pub fn from_entries(
        services: impl IntoIterator<Item = (Vip, u32, ServiceValue)>,
        backends: impl IntoIterator<Item = (u32, BackendAddr)>,
    ) -> Programmed {
        let mut p = Programmed::default();
        let backends = backends.into_iter().map(|(id, a)| Entry::Backend(id, a));
        let services = services
            .into_iter()
            .map(|(v, s, x)| Entry::Service(v, s, x));
        backends.chain(services).for_each(|e| p.add_entry(e));
        p.finish_load();
        p
    }

    pub fn service(&self, vip: &Vip) -> Option<&ProgrammedService> {
        self.services.get(vip)
    }

    pub fn services(&self) -> impl Iterator<Item = (&Vip, &ProgrammedService)> {
        self.services.iter()
    }

    pub fn backend(&self, id: u32) -> Option<BackendAddr> {
        self.backends.get(id)
    }

    pub fn backends(&self) -> impl Iterator<Item = (u32, BackendAddr)> + '_ {
        self.backends.iter()
    }

    pub fn backend_count(&self) -> usize {
        self.backends.len()
    }

    pub fn service_entry_count(&self) -> usize {
        self.service_entries
    }

    /// Records an op the kernel accepted.
    /// Room for what a full sync bounded before its first write (VIPs
    /// it writes, backends it may add): growing the tables while writing
    /// re-hashes everything they hold at each doubling.
    pub fn reserve(&mut self, vips: usize, new_backends: usize) {
        self.services
            .reserve(vips.saturating_sub(self.services.len()));
        self.backends.reserve(new_backends);
    }

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
                    let i = (*slot as usize).checked_sub(1)?;
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
                self.backends.delete(*id);
                self.unreferenced.remove(id);
            }
            Op::PurgeAffinity { .. } => {}
        }
    }

    fn put_backend(&mut self, id: u32, addr: BackendAddr) {
        if self.backends.insert(id, addr) {
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

    fn put_slot(&mut self, vip: Vip, slot: u32, backend_id: u32) {
        let Some(i) = (slot as usize).checked_sub(1) else {
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
            self.backends.add_ref(backend_id);
            self.unreferenced.remove(&backend_id);
        }
    }

    fn unref(&mut self, id: u32) {
        if self.backends.drop_ref(id) {
            self.unreferenced.insert(id);
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
    /// Backend addresses looked up in the view: what planning costs, the
    /// whole service's for an upsert planned whole, the changed ones' for
    /// one planned from [`LastWritten`].
    pub backends_looked_up: usize,
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

mod patch;

/// Services from this many backends on are kept in [`LastWritten`]: below
/// it a whole-service plan costs microseconds, and the copy is not worth
/// its memory.
pub const PATCH_MIN_BACKENDS: usize = 512;

/// The sorted backends ([`DesiredService::backends`]) each VIP's slots were
/// last written from, for VIPs of [`PATCH_MIN_BACKENDS`] or more; kept by
/// the caller between plans, only while the view holds exactly what those
/// plans wrote.
pub type LastWritten = HashMap<Vip, Vec<BackendAddr>>;

/// Ops that bring the given VIPs from what `view` holds to what `changes`
/// asks, in a safe order. VIPs not mentioned are left alone.
pub fn plan<'a>(view: &Programmed, changes: impl IntoIterator<Item = Change<'a>>) -> Plan {
    plan_from(view, changes, &LastWritten::new())
}

/// [`plan`], where an upsert of a VIP that `written_from` holds is planned from the
/// difference between its backends then and now, when the view still
/// agrees with it: a few backends changed in a service of 100,000 cost a
/// few hash look-ups, not 100,000. The ops are the ones [`plan`] makes.
pub fn plan_from<'a>(
    view: &Programmed,
    changes: impl IntoIterator<Item = Change<'a>>,
    written_from: &LastWritten,
) -> Plan {
    let backend_used = |id: u32| view.backends.contains(id);
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
    let mut removals = Vec::new();
    for change in order.iter().filter_map(|vip| last.remove(vip)) {
        let before = plan.ops.len() + removals.len();
        match change {
            Change::Upsert(d) => plan_upsert(
                view,
                d,
                written_from.get(&d.vip).map(Vec::as_slice),
                &mut backend_alloc,
                &mut service_alloc,
                &mut new_backends,
                &mut plan,
            ),
            Change::Remove(vip) => plan_remove(view, &vip, &mut removals),
        }
        if plan.ops.len() + removals.len() > before {
            plan.vips_changed += 1;
        }
    }
    // Removed VIPs first (fewer entries at the peak), then every new
    // backend, then the service entries, then what upserts trim: long runs
    // of one kind, each one batch for the kernel, instead of a few
    // entries per service. The sort is stable and each VIP's own ops were
    // already in this order, so no service is ever seen half-written.
    plan.ops.sort_by_key(|op| match op {
        Op::PutBackend { .. } => 0,
        Op::PutSlot { .. } | Op::PutHeader { .. } => 1,
        Op::DeleteHeader { .. } | Op::DeleteSlot { .. } => 2,
        Op::PurgeAffinity { .. } => 3,
        Op::DeleteBackend { .. } => 4,
    });
    removals.append(&mut plan.ops);
    plan.ops = removals;
    plan
}

fn plan_upsert(
    view: &Programmed,
    d: &DesiredService,
    last: Option<&[BackendAddr]>,
    backend_alloc: &mut IdAlloc<'_>,
    service_alloc: &mut IdAlloc<'_>,
    new_backends: &mut HashMap<BackendAddr, u32>,
    plan: &mut Plan,
) {
    if d.backends.len() > MAX_BACKENDS_PER_SERVICE as usize {
        plan.problems.push(PlanProblem::TooManyBackends {
            vip: d.vip,
            count: d.backends.len(),
        });
        return;
    }
    let old = view.services.get(&d.vip);
    if let (Some(old), Some(last)) = (old, last) {
        if let Some(patch) = patch::Patch::of(view, old, last, d, new_backends) {
            plan.backends_looked_up += patch.looked_up;
            patch.plan(old, d, backend_alloc, new_backends, &mut plan.ops);
            return;
        }
    }
    plan.backends_looked_up += d.backends.len();
    let ops = &mut plan.ops;
    let mut want = Vec::with_capacity(d.backends.len());
    for b in &d.backends {
        let id = match view
            .backends
            .id_of(b)
            .or_else(|| new_backends.get(b).copied())
        {
            Some(id) => id,
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
        count: u32::try_from(slots.len()).unwrap_or(MAX_BACKENDS_PER_SERVICE),
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
/// MAX_BACKENDS_PER_SERVICE or by what was read from the map (23-bit
/// slot numbers).
fn slot_number(i: usize) -> u32 {
    u32::try_from(i + 1).unwrap_or(u32::MAX)
}

/// Entries each map holds at most while a plan runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peak {
    pub service_entries: usize,
    pub backends: usize,
}

/// The most entries the maps hold at any point while `ops` run against
/// `view` (backends are only deleted afterwards, by [`plan_gc`]), so a plan
/// that would overflow a map is refused before its first write. A plan
/// touches each (VIP, slot) at most once, so whether a write adds an entry
/// is read from the view.
pub fn peak(view: &Programmed, ops: &[Op]) -> Peak {
    let slot_of = |vip: &Vip, slot: u32| {
        let s = view.services.get(vip)?;
        let id = *s.slots.get((slot as usize).checked_sub(1)?)?;
        (id != 0).then_some(id)
    };
    let header = |vip: &Vip| view.services.get(vip).is_some_and(|s| s.header.is_some());
    let mut services = view.service_entries;
    let mut most = services;
    let mut backends = view.backends.len();
    for op in ops {
        match op {
            Op::PutBackend { id, .. } if !view.backends.contains(*id) => backends += 1,
            Op::PutSlot { vip, slot, .. } if slot_of(vip, *slot).is_none() => services += 1,
            Op::PutHeader { vip, .. } if !header(vip) => services += 1,
            Op::DeleteSlot { vip, slot } if slot_of(vip, *slot).is_some() => services -= 1,
            Op::DeleteHeader { vip } if header(vip) => services -= 1,
            _ => {}
        }
        most = most.max(services);
    }
    Peak {
        service_entries: most,
        backends,
    }
}

/// An upper bound of [`peak`] over any sequence of plans that first
/// removes `stale` and then writes `desired` (each VIP once, in any
/// grouping), with backends collected only after the last.
pub fn peak_bound(view: &Programmed, stale: &[Vip], desired: &[DesiredService]) -> Peak {
    let mut bound = PeakBound::new(view);
    bound.upserts(desired);
    bound.removals(stale);
    bound.peak()
}

/// [`peak_bound`], fed the desired services a part at a time (a full sync
/// computes them in chunks and never holds all of them): the maps as they
/// are, or after the removals with each VIP at the larger of its old and
/// new entry counts; every backend in the view stays while new ones are
/// added (counted once per VIP that lists them: no set of a quarter of a
/// million addresses to tell that VIPs share one, at the price of a looser
/// bound for NodePort and external addresses).
pub struct PeakBound<'v> {
    view: &'v Programmed,
    removed: usize,
    grown: usize,
    new_backends: usize,
}

impl<'v> PeakBound<'v> {
    pub fn new(view: &'v Programmed) -> Self {
        PeakBound {
            view,
            removed: 0,
            grown: 0,
            new_backends: 0,
        }
    }

    fn entries(&self, vip: &Vip) -> usize {
        self.view.services.get(vip).map_or(0, |s| {
            usize::from(s.header.is_some()) + s.slots.iter().filter(|&&id| id != 0).count()
        })
    }

    pub fn upserts(&mut self, desired: &[DesiredService]) {
        for d in desired {
            self.grown += (1 + d.backends.len()).saturating_sub(self.entries(&d.vip));
            let view = self.view;
            self.new_backends += d
                .backends
                .iter()
                .filter(|b| view.backends.id_of(b).is_none())
                .count();
        }
    }

    /// Adds what `other`, over the same view, counted.
    pub fn merge(&mut self, other: &PeakBound<'_>) {
        self.removed += other.removed;
        self.grown += other.grown;
        self.new_backends += other.new_backends;
    }

    pub fn removals(&mut self, stale: &[Vip]) {
        self.removed += stale.iter().map(|v| self.entries(v)).sum::<usize>();
    }

    /// Backends the upserts may add (an upper bound).
    pub fn new_backends(&self) -> usize {
        self.new_backends
    }

    pub fn peak(&self) -> Peak {
        let now = self.view.service_entries;
        Peak {
            service_entries: now.max(now.saturating_sub(self.removed) + self.grown),
            backends: self.view.backends.len() + self.new_backends,
        }
    }
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
    // A new service (every one at a first start) or one whose backends did
    // not move: no sets to build.
    if old.is_empty() || old == want {
        return want.to_vec();
    }
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
#[path = "plan_tests/mod.rs"]
mod tests;
