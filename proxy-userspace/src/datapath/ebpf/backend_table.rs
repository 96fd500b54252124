//! The writer's view of the backends map: id → address and slot count,
//! and address → id, in one table plus an index of ids.
//!
//! Each backend is stored once, in a `Vec` sorted by id: the plan hands
//! out ids in increasing order ([`super::plan`]), so a new backend is
//! appended, and a quarter of a million of them take 8 MB where a hash
//! table took 20 (its buckets were half empty at that count, and each
//! carried a control byte). A deleted backend leaves a hole that later
//! writes compact away, so a delete costs no shift of the whole table.
//! The address index holds only ids, hashed by the address they point at
//! (`hashbrown::HashTable`, which lets the index borrow its keys from the
//! table).

use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashMap, HashTable};

use super::codec::BackendAddr;

#[derive(Clone, Copy, Debug)]
struct Backend {
    id: u32,
    addr: BackendAddr,
    /// Slots that refer to this backend.
    refs: u32,
    /// Deleted: a hole until the next compaction.
    gone: bool,
}

#[derive(Clone, Default)]
pub struct BackendTable {
    /// Sorted by id, ids unique; holes (`gone`) included. While
    /// `loading`, in the order read back from the kernel instead.
    by_id: Vec<Backend>,
    holes: usize,
    loading: bool,
    /// Ids, hashed by their backend's address: one id per address (the
    /// latest written), as the plan reuses it.
    by_addr: HashTable<u32>,
    /// Slot counts of ids with no backend entry (slots read back from a
    /// kernel whose backend was gone): normally empty. Kept so that the
    /// id, if written again, is not collected while those slots remain.
    orphan_refs: HashMap<u32, u32>,
    /// foldhash, randomly seeded: quicker than SipHash on these keys.
    hasher: DefaultHashBuilder,
}

impl std::fmt::Debug for BackendTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// Where `id` is in `by_id` (`Ok`, possibly a hole) or would go (`Err`).
fn position(by_id: &[Backend], id: u32) -> Result<usize, usize> {
    match by_id.last() {
        // The common case: ids are handed out in increasing order.
        Some(last) if last.id < id => Err(by_id.len()),
        _ => by_id.binary_search_by_key(&id, |b| b.id),
    }
}

fn live(by_id: &[Backend], id: u32) -> Option<&Backend> {
    position(by_id, id)
        .ok()
        .map(|i| &by_id[i])
        .filter(|b| !b.gone)
}

/// Points `addr` at `id` in the address index.
fn index(
    by_addr: &mut HashTable<u32>,
    hasher: &DefaultHashBuilder,
    by_id: &[Backend],
    id: u32,
    addr: BackendAddr,
) {
    let id_addr = |i: u32| live(by_id, i).map(|b| b.addr);
    match by_addr.entry(
        hasher.hash_one(addr),
        |i| id_addr(*i) == Some(addr),
        |i| id_addr(*i).map_or(0, |a| hasher.hash_one(a)),
    ) {
        hashbrown::hash_table::Entry::Occupied(mut e) => *e.get_mut() = id,
        hashbrown::hash_table::Entry::Vacant(e) => {
            e.insert(id);
        }
    }
}

impl BackendTable {
    pub fn len(&self) -> usize {
        self.by_id.len() - self.holes
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, id: u32) -> Option<BackendAddr> {
        live(&self.by_id, id).map(|b| b.addr)
    }

    pub fn contains(&self, id: u32) -> bool {
        live(&self.by_id, id).is_some()
    }

    /// Room in the address index for `additional` more backends: its
    /// growth re-hashes every address, each found through `by_id`. (The
    /// table itself grows by copying, with no hashing.)
    pub fn reserve(&mut self, additional: usize) {
        let (by_id, hasher) = (&self.by_id, &self.hasher);
        self.by_addr.reserve(additional, |i| {
            live(by_id, *i).map_or(0, |b| hasher.hash_one(b.addr))
        });
    }

    /// The id the plan reuses for `addr`.
    pub fn id_of(&self, addr: &BackendAddr) -> Option<u32> {
        let hash = self.hasher.hash_one(addr);
        self.by_addr
            .find(hash, |id| self.get(*id).as_ref() == Some(addr))
            .copied()
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, BackendAddr)> + '_ {
        self.by_id
            .iter()
            .filter(|b| !b.gone)
            .map(|b| (b.id, b.addr))
    }

    /// Adds a backend read back from the kernel map, in the map's (hash)
    /// order and without indexing it: [`BackendTable::finish_load`] sorts
    /// and indexes them all at once, before anything else uses the table.
    /// Returns whether no slot counted so far refers to it.
    pub fn load_unordered(&mut self, id: u32, addr: BackendAddr) -> bool {
        self.loading = true;
        self.by_id.push(Backend {
            id,
            addr,
            refs: 0,
            gone: false,
        });
        !self.orphan_refs.contains_key(&id)
    }

    /// Ends a load: ids sorted (a repeated id keeps its last address and
    /// the slot counts of all its entries), the address index built.
    pub fn finish_load(&mut self) {
        if !std::mem::take(&mut self.loading) {
            return;
        }
        let mut loaded = std::mem::take(&mut self.by_id);
        loaded.retain(|b| !b.gone);
        // Stable: of two entries with one id, the later stays last.
        loaded.sort_by_key(|b| b.id);
        self.holes = 0;
        for b in loaded {
            match self.by_id.last_mut() {
                Some(last) if last.id == b.id => {
                    last.addr = b.addr;
                    last.refs += b.refs;
                }
                _ => {
                    let refs = b.refs + self.orphan_refs.remove(&b.id).unwrap_or(0);
                    self.by_id.push(Backend { refs, ..b });
                }
            }
        }
        self.by_addr.clear();
        // In id order: an address written under two ids keeps the later.
        for b in &self.by_id {
            index(&mut self.by_addr, &self.hasher, &self.by_id, b.id, b.addr);
        }
    }

    /// Writes `id`; returns whether it is referenced by no slot.
    pub fn insert(&mut self, id: u32, addr: BackendAddr) -> bool {
        let refs = match self.remove(id) {
            Some(old) => old.refs,
            None => self.orphan_refs.remove(&id).unwrap_or(0),
        };
        let backend = Backend {
            id,
            addr,
            refs,
            gone: false,
        };
        match position(&self.by_id, id) {
            Ok(i) => {
                // `remove` left a hole here.
                self.by_id[i] = backend;
                self.holes -= 1;
            }
            Err(i) => self.by_id.insert(i, backend),
        }
        index(&mut self.by_addr, &self.hasher, &self.by_id, id, addr);
        refs == 0
    }

    /// Forgets `id` (and its address, when the address maps to it),
    /// leaving a hole.
    fn remove(&mut self, id: u32) -> Option<Backend> {
        let i = position(&self.by_id, id).ok()?;
        let old = self.by_id[i];
        if old.gone {
            return None;
        }
        self.by_id[i].gone = true;
        self.holes += 1;
        if let Ok(e) = self
            .by_addr
            .find_entry(self.hasher.hash_one(old.addr), |i| *i == id)
        {
            e.remove();
        }
        Some(old)
    }

    /// Deletes `id` (slots still referring to it keep their count).
    pub fn delete(&mut self, id: u32) {
        if let Some(old) = self.remove(id) {
            if old.refs > 0 {
                self.orphan_refs.insert(id, old.refs);
            }
        }
        // Holes are dropped once they are a quarter of the table: each
        // costs one shift of the table, shared by as many deletes.
        if self.holes > 64 && self.holes * 4 > self.by_id.len() {
            self.by_id.retain(|b| !b.gone);
            self.holes = 0;
        }
    }

    /// Counts one more slot referring to `id`.
    pub fn add_ref(&mut self, id: u32) {
        match self.find_mut(id) {
            Some(b) => b.refs += 1,
            None => *self.orphan_refs.entry(id).or_insert(0) += 1,
        }
    }

    /// Counts one slot less referring to `id`; `true` when the backend is
    /// in the table and no slot refers to it any more.
    pub fn drop_ref(&mut self, id: u32) -> bool {
        if let Some(b) = self.find_mut(id) {
            b.refs = b.refs.saturating_sub(1);
            return b.refs == 0;
        }
        if let Some(n) = self.orphan_refs.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                self.orphan_refs.remove(&id);
            }
        }
        false
    }

    fn find_mut(&mut self, id: u32) -> Option<&mut Backend> {
        let i = position(&self.by_id, id).ok()?;
        Some(&mut self.by_id[i]).filter(|b| !b.gone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> BackendAddr {
        BackendAddr {
            ip: "10.0.0.1".parse().unwrap(),
            port,
            local: false,
        }
    }

    #[test]
    fn ids_addresses_and_slot_counts_stay_in_step() {
        let mut t = BackendTable::default();
        assert!(t.insert(1, addr(80)), "a new backend has no slot yet");
        t.add_ref(1);
        assert_eq!(
            (t.get(1), t.id_of(&addr(80)), t.len()),
            (Some(addr(80)), Some(1), 1)
        );
        // Written again with another address: the count stays, the old
        // address no longer finds it.
        assert!(!t.insert(1, addr(81)));
        assert_eq!((t.id_of(&addr(80)), t.id_of(&addr(81))), (None, Some(1)));
        // A second id for the same address: the latest is the one reused.
        t.insert(2, addr(81));
        assert_eq!(t.id_of(&addr(81)), Some(2));
        t.delete(2);
        assert_eq!(
            (t.id_of(&addr(81)), t.contains(2), t.len()),
            (None, false, 1)
        );
        assert!(t.drop_ref(1), "its last slot went");
        assert_eq!(t.iter().collect::<Vec<_>>(), vec![(1, addr(81))]);
    }

    #[test]
    fn slots_of_a_missing_backend_are_counted_until_it_is_written() {
        let mut t = BackendTable::default();
        t.add_ref(7);
        t.add_ref(7);
        assert!(!t.drop_ref(7), "not in the table: never reported free");
        assert!(!t.insert(7, addr(80)), "one slot still refers to it");
        assert!(t.drop_ref(7));
    }

    #[test]
    fn many_backends_keep_their_ids() {
        let mut t = BackendTable::default();
        for id in 1..=5_000u16 {
            t.insert(u32::from(id), addr(id));
        }
        for id in (1..=5_000u16).step_by(2) {
            t.delete(u32::from(id));
        }
        assert_eq!(t.len(), 2_500);
        for id in 1..=5_000u16 {
            let want = (id % 2 == 0).then_some(u32::from(id));
            assert_eq!(t.id_of(&addr(id)), want);
        }
    }

    #[test]
    fn ids_out_of_order_and_holes_compacted_keep_every_backend() {
        let mut t = BackendTable::default();
        // Read back from a kernel map: any order.
        let ids: Vec<u16> = (1..=3_000u16).map(|i| (i * 7) % 3_001).collect();
        for &id in &ids {
            t.insert(u32::from(id), addr(id));
        }
        // Enough deletes to compact the holes away, some rewritten after.
        for id in (1..=3_000u16).filter(|i| i % 3 != 0) {
            t.delete(u32::from(id));
        }
        for id in (1..=3_000u16).filter(|i| i % 3 == 1).take(10) {
            assert!(t.insert(u32::from(id), addr(id)));
        }
        let want: Vec<u32> = (1..=3_000u32)
            .filter(|i| i % 3 == 0 || (i % 3 == 1 && *i <= 28))
            .collect();
        let got: Vec<u32> = t.iter().map(|(id, _)| id).collect();
        assert_eq!(got, want, "in id order, deleted ones gone");
        assert_eq!(t.len(), want.len());
        for id in 1..=3_000u16 {
            let live = want.contains(&u32::from(id));
            assert_eq!(t.contains(u32::from(id)), live, "{id}");
            assert_eq!(t.id_of(&addr(id)), live.then_some(u32::from(id)));
        }
    }

    #[test]
    fn a_load_in_hash_order_is_sorted_and_indexed_once() {
        let mut t = BackendTable::default();
        t.add_ref(9);
        for id in [9u16, 3, 7, 1, 5] {
            t.load_unordered(u32::from(id), addr(id));
        }
        // The same address under two ids: the later id is the one reused.
        t.load_unordered(11, addr(5));
        t.finish_load();
        let ids: Vec<u32> = t.iter().map(|(id, _)| id).collect();
        assert_eq!(ids, [1, 3, 5, 7, 9, 11]);
        assert_eq!(t.id_of(&addr(5)), Some(11));
        assert_eq!(t.id_of(&addr(7)), Some(7));
        assert!(
            t.drop_ref(9),
            "the slot counted before the load was its one slot"
        );
        assert!(t.insert(12, addr(12)), "appended after the load");
        assert_eq!(t.len(), 7);
    }
}
