//! The writer's view of the backends map: id → address and slot count,
//! and address → id, in one table plus an index of ids.
//!
//! At 250k endpoints three `HashMap`s (id → address, address → id,
//! id → slot count) held ~30 MB, two thirds of it the address → id map
//! repeating every address. Here each backend is stored once
//! ([`Backend`], keyed by id) and the address index only holds ids,
//! hashed by the address they point at (`hashbrown::HashTable`, the raw
//! table `std`'s `HashMap` is built on, which lets the index borrow its
//! keys from the other table).

use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashMap, HashTable};

use super::codec::BackendAddr;

#[derive(Clone, Copy, Debug)]
struct Backend {
    id: u32,
    addr: BackendAddr,
    /// Slots that refer to this backend.
    refs: u32,
}

#[derive(Clone, Default)]
pub struct BackendTable {
    by_id: HashTable<Backend>,
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

impl BackendTable {
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    pub fn get(&self, id: u32) -> Option<BackendAddr> {
        self.find(id).map(|b| b.addr)
    }

    pub fn contains(&self, id: u32) -> bool {
        self.find(id).is_some()
    }

    /// The id the plan reuses for `addr`.
    pub fn id_of(&self, addr: &BackendAddr) -> Option<u32> {
        let hash = self.hasher.hash_one(addr);
        self.by_addr
            .find(hash, |id| self.get(*id).as_ref() == Some(addr))
            .copied()
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, BackendAddr)> + '_ {
        self.by_id.iter().map(|b| (b.id, b.addr))
    }

    /// Writes `id`; returns whether it is referenced by no slot.
    pub fn insert(&mut self, id: u32, addr: BackendAddr) -> bool {
        let refs = match self.remove(id) {
            Some(old) => old.refs,
            None => self.orphan_refs.remove(&id).unwrap_or(0),
        };
        let hasher = &self.hasher;
        self.by_id
            .insert_unique(hasher.hash_one(id), Backend { id, addr, refs }, |b| {
                hasher.hash_one(b.id)
            });
        let by_id = &self.by_id;
        let id_addr = |i: u32| {
            by_id
                .find(hasher.hash_one(i), |b| b.id == i)
                .map(|b| b.addr)
        };
        match self.by_addr.entry(
            hasher.hash_one(addr),
            |i| id_addr(*i) == Some(addr),
            |i| id_addr(*i).map_or(0, |a| hasher.hash_one(a)),
        ) {
            hashbrown::hash_table::Entry::Occupied(mut e) => *e.get_mut() = id,
            hashbrown::hash_table::Entry::Vacant(e) => {
                e.insert(id);
            }
        }
        refs == 0
    }

    /// Forgets `id` (and its address, when the address maps to it).
    fn remove(&mut self, id: u32) -> Option<Backend> {
        let hasher = &self.hasher;
        let old = self
            .by_id
            .find_entry(hasher.hash_one(id), |b| b.id == id)
            .ok()?
            .remove()
            .0;
        if let Ok(e) = self
            .by_addr
            .find_entry(hasher.hash_one(old.addr), |i| *i == id)
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

    fn find(&self, id: u32) -> Option<&Backend> {
        self.by_id.find(self.hasher.hash_one(id), |b| b.id == id)
    }

    fn find_mut(&mut self, id: u32) -> Option<&mut Backend> {
        let hash = self.hasher.hash_one(id);
        self.by_id.find_mut(hash, |b| b.id == id)
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
}
