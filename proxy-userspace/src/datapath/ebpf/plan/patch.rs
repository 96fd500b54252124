//! An upsert of a big service planned from the backends its VIP was last
//! written from ([`super::LastWritten`]): the work is the changed
//! backends' (plus linear passes over the slots), not a hash look-up per
//! backend of the service.

use hashbrown::HashMap;
use proxy_common::MAX_BACKENDS_PER_SERVICE;
use smallvec::SmallVec;

use super::{slot_number, IdAlloc, Op, Programmed, ProgrammedService};
use crate::datapath::ebpf::codec::{BackendAddr, Header};
use crate::datapath::ebpf::desired::DesiredService;

/// An upsert planned from the backends the VIP was last written from: the
/// slots of the backends that left, and the backends that arrived.
pub(super) struct Patch<'d> {
    /// Slot indexes (into `slots`) that lose their backend, ascending.
    holes: Vec<usize>,
    /// Their backend ids, sorted (affinity entries to purge).
    gone: Vec<u32>,
    /// Backends that arrive, in `DesiredService::backends` order, with
    /// their id when one exists already.
    added: Vec<(&'d BackendAddr, Option<u32>)>,
    pub(super) looked_up: usize,
}

impl<'d> Patch<'d> {
    /// The patch from `last` to `d`, or `None` when the view does not hold
    /// what `last` says it was written from (then the whole service is
    /// planned): its count, every departing backend in exactly one slot and
    /// no arriving one in a slot already.
    pub(super) fn of(
        view: &Programmed,
        old: &ProgrammedService,
        last: &[BackendAddr],
        d: &'d DesiredService,
        new_backends: &HashMap<BackendAddr, u32>,
    ) -> Option<Patch<'d>> {
        let header = old.header?;
        if header.count as usize != old.slots.len() || last.len() != old.slots.len() {
            return None;
        }
        // Both sorted without duplicates: one merge walk.
        let (mut left, mut added) = (Vec::new(), Vec::new());
        let (mut i, mut j) = (0, 0);
        while i < last.len() || j < d.backends.len() {
            match (last.get(i), d.backends.get(j)) {
                (Some(a), Some(b)) if a == b => (i, j) = (i + 1, j + 1),
                (Some(a), Some(b)) if a < b => {
                    left.push(a);
                    i += 1;
                }
                (Some(a), None) => {
                    left.push(a);
                    i += 1;
                }
                (_, Some(b)) => {
                    added.push(b);
                    j += 1;
                }
                (None, None) => break,
            }
        }
        // Ids whose slot is looked for: departing ones (each must be in
        // one slot) and arriving ones that exist already (in none).
        let mut wanted: HashMap<u32, bool> = HashMap::with_capacity(left.len() + added.len());
        for b in &left {
            if wanted.insert(view.backends.id_of(b)?, true).is_some() {
                return None;
            }
        }
        let added: Vec<(&BackendAddr, Option<u32>)> = added
            .into_iter()
            .map(|b| {
                let id = view
                    .backends
                    .id_of(b)
                    .or_else(|| new_backends.get(b).copied());
                (b, id)
            })
            .collect();
        for id in added.iter().filter_map(|(_, id)| *id) {
            if wanted.insert(id, false).is_some() {
                return None;
            }
        }
        let mut holes = Vec::with_capacity(left.len());
        let mut gone = Vec::with_capacity(left.len());
        // The one pass over the slots: a few ids are compared directly (a
        // hash per slot would cost more than the rest of the plan).
        let few: SmallVec<[(u32, bool); 8]> = match wanted.len() {
            n if n <= 8 => wanted.iter().map(|(id, l)| (*id, *l)).collect(),
            _ => SmallVec::new(),
        };
        let departs = |id: u32| match few.is_empty() {
            true => wanted.get(&id).copied(),
            false => few.iter().find(|(w, _)| *w == id).map(|(_, l)| *l),
        };
        if !wanted.is_empty() {
            for (i, &id) in old.slots.iter().enumerate() {
                match departs(id) {
                    Some(true) => {
                        holes.push(i);
                        gone.push(id);
                    }
                    Some(false) => return None,
                    None => {}
                }
            }
        }
        if holes.len() != left.len() {
            return None;
        }
        gone.sort_unstable();
        let looked_up = left.len() + added.len();
        Some(Patch {
            holes,
            gone,
            added,
            looked_up,
        })
    }

    /// The ops [`super::plan_upsert`] makes for the whole service, from the
    /// changed slots only: the holes filled with the arriving backends in
    /// order, the rest appended, holes left over refilled from the end (as
    /// [`super::stable_slots`] does).
    pub(super) fn plan(
        self,
        old: &ProgrammedService,
        d: &DesiredService,
        backend_alloc: &mut IdAlloc<'_>,
        new_backends: &mut HashMap<BackendAddr, u32>,
        ops: &mut Vec<Op>,
    ) {
        let mut slots: Vec<u32> = old.slots.to_vec();
        let mut added = self.added.into_iter().map(|(b, id)| match id {
            Some(id) => id,
            None => {
                let id = backend_alloc.alloc();
                new_backends.insert(*b, id);
                ops.push(Op::PutBackend { id, addr: *b });
                id
            }
        });
        let mut touched = Vec::with_capacity(self.holes.len() * 2);
        let mut left_over = Vec::new();
        for &h in &self.holes {
            touched.push(h);
            match added.next() {
                Some(id) => slots[h] = id,
                None => {
                    slots[h] = 0;
                    left_over.push(h);
                }
            }
        }
        for id in added {
            touched.push(slots.len());
            slots.push(id);
        }
        for &h in &left_over {
            // A hole at the end may be moved into an earlier one, and is
            // gone then: every later hole is past the end too.
            while h < slots.len() && slots[h] == 0 {
                slots.swap_remove(h);
                if h < slots.len() {
                    touched.push(h);
                }
            }
            if h >= slots.len() {
                break;
            }
        }
        touched.sort_unstable();
        touched.dedup();
        let vip = d.vip;
        for &i in touched.iter().filter(|&&i| i < slots.len()) {
            if old.slots.get(i) != Some(&slots[i]) {
                ops.push(Op::PutSlot {
                    vip,
                    slot: slot_number(i),
                    backend_id: slots[i],
                });
            }
        }
        let Some(old_header) = old.header else {
            return;
        };
        let header = Header {
            count: u32::try_from(slots.len()).unwrap_or(MAX_BACKENDS_PER_SERVICE),
            flags: d.flags(),
            affinity_timeout: d.affinity_timeout.unwrap_or(0),
            service_id: old_header.service_id,
        };
        if old_header != header {
            ops.push(Op::PutHeader { vip, header });
        }
        for i in slots.len()..old.slots.len() {
            if old.slots[i] != 0 {
                ops.push(Op::DeleteSlot {
                    vip,
                    slot: slot_number(i),
                });
            }
        }
        if old_header.affinity() {
            if !header.affinity() {
                ops.push(Op::PurgeAffinity {
                    service_id: old_header.service_id,
                    backend_ids: None,
                });
            } else if !self.gone.is_empty() {
                ops.push(Op::PurgeAffinity {
                    service_id: old_header.service_id,
                    backend_ids: Some(self.gone),
                });
            }
        }
    }
}
