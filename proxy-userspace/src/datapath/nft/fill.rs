//! The full sync: one family's table refilled with a whole state in one
//! transaction, built service by service.
//!
//! Each service's objects are built, written into the batch and dropped
//! before the next service's: the batch's bytes are the only thing that
//! grows with the table. Map elements wait in one short list per map and
//! go out [`ELEMENTS_PER_MESSAGE`] at a time; they come after the chains
//! they name, since a service's chains are written before its elements
//! are queued. What must follow every service (the pick rules, the
//! `hairpin` elements, the removal of chains and sets left over from an
//! earlier run) is written last; nothing sees the table before the
//! transaction commits, so the order inside it is only about references.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::batch::{self, Batch, Element, ELEMENTS_PER_MESSAGE};
use super::expr::{key_text, KeyPart};
use super::hairpin::HairpinList;
use super::rules::{self, ElementValue, Family, TABLE};
use super::{add_rules, element, hairpin_element, has_table, NftDatapath, NftError};
use crate::model::claims::Claims;
use crate::model::LocalState;

/// Map elements queued per map, sent as one message per
/// [`ELEMENTS_PER_MESSAGE`].
struct PendingElements {
    family: u8,
    /// Map → its queued elements and the text of the first few keys (for
    /// the message's description).
    maps: BTreeMap<&'static str, (Vec<Element>, Vec<String>)>,
}

impl PendingElements {
    fn new(family: u8) -> Self {
        PendingElements {
            family,
            maps: BTreeMap::new(),
        }
    }

    fn push(
        &mut self,
        b: &mut Batch,
        map: &'static str,
        key: &[KeyPart],
        value: Option<&ElementValue>,
    ) {
        let (elems, keys) = self.maps.entry(map).or_default();
        elems.push(element(key, value));
        if keys.len() < 3 {
            keys.push(key_text(key));
        }
        if elems.len() >= ELEMENTS_PER_MESSAGE {
            self.send(b, map);
        }
    }

    fn send(&mut self, b: &mut Batch, map: &'static str) {
        if let Some((elems, keys)) = self.maps.get_mut(map) {
            if !elems.is_empty() {
                let what = super::describe(map, keys, elems.len());
                b.add_elements(self.family, TABLE, map, elems, what);
                elems.clear();
                keys.clear();
            }
        }
    }

    fn send_all(&mut self, b: &mut Batch) {
        let maps: Vec<&'static str> = self.maps.keys().copied().collect();
        for map in maps {
            self.send(b, map);
        }
    }
}

impl NftDatapath {
    /// Refills the table of family `f` with `next` in one transaction
    /// (see [`NftDatapath::full_sync`]); `recreate` deletes the table
    /// first instead of flushing it.
    pub(super) fn fill(
        &mut self,
        f: Family,
        next: &LocalState,
        claims: &Claims,
        recreate: bool,
    ) -> Result<(), NftError> {
        let fam = f.nfproto_u8();
        let (old_chains, old_sets) = if recreate {
            (Vec::new(), Vec::new())
        } else {
            batch::list_objects(fam, TABLE)
                .map_err(|e| NftError::Exec(format!("listing table {} {TABLE}: {e}", f.nft())))?
        };
        let base_sets: BTreeSet<&str> = rules::BASE_SETS.iter().copied().collect();
        // What an earlier run left and this state may not want: whatever
        // no service claims by the end is deleted then.
        let mut leftover_chains: HashSet<String> = old_chains.into_iter().collect();
        let had_info_chain = leftover_chains.remove(rules::INFO_CHAIN);
        for name in rules::BASE_CHAINS
            .iter()
            .map(|c| c.0)
            .chain(rules::HELPER_CHAINS)
        {
            leftover_chains.remove(name);
        }
        let mut leftover_sets: HashMap<String, u64> = HashMap::new();

        let mut b = Batch::new();
        if recreate && has_table(f)? {
            b.delete_table(fam, TABLE);
        }
        b.add_table(fam, TABLE);
        b.flush_rules(fam, TABLE, None);
        for set in old_sets {
            if base_sets.contains(set.name.as_str()) {
                b.flush_set(fam, TABLE, &set.name);
            } else {
                leftover_sets.insert(set.name, set.timeout_ms);
            }
        }
        if had_info_chain {
            b.delete_chain(fam, TABLE, rules::INFO_CHAIN);
        }
        b.add_commented_chain(fam, TABLE, rules::INFO_CHAIN, &self.note);
        for set in rules::base_sets(f) {
            b.add_set(fam, TABLE, &set);
        }
        for (name, kind, hook, prio) in rules::BASE_CHAINS {
            b.add_chain(fam, TABLE, name, Some((kind, hook, prio)));
        }
        for name in rules::HELPER_CHAINS {
            b.add_chain(fam, TABLE, name, None);
        }
        for (chain, rule) in rules::base_rules(f, &self.nodeport_addresses, self.drop_invalid) {
            add_rules(&mut b, f, chain, std::slice::from_ref(&rule));
        }

        let mut pending = PendingElements::new(fam);
        let mut hairpin = HairpinList::default();
        let mut counts_in_use = BTreeSet::new();
        let mut map_counts: BTreeMap<&'static str, usize> = BTreeMap::new();
        for se in &next.services {
            let (objs, lost) = self.owned_objects(se, f, claims);
            self.note_unowned(&se.service.key, lost);
            for (name, timeout) in &objs.sets {
                match leftover_sets.remove(name) {
                    // An affinity set that still applies keeps its entries.
                    Some(ms) if ms == u64::from(*timeout) * 1000 => continue,
                    // Rules were flushed: nothing uses it any more.
                    Some(_) => b.delete_set(fam, TABLE, name),
                    None => {}
                }
                b.add_set(fam, TABLE, &rules::affinity_set(f, name, *timeout));
            }
            for name in objs.chains.keys() {
                leftover_chains.remove(name);
                b.add_chain(fam, TABLE, name, None);
            }
            for (name, chain_rules) in &objs.chains {
                add_rules(&mut b, f, name, chain_rules);
            }
            for ((map, key), value) in &objs.elements {
                pending.push(&mut b, map, key, Some(value));
                *map_counts.entry(map).or_default() += 1;
            }
            for list in &objs.slots {
                for ((map, key), value) in list.elements() {
                    pending.push(&mut b, map, &key, Some(&value));
                }
                *map_counts.entry(list.map).or_default() += list.targets.len();
            }
            for ip in &objs.hairpin {
                hairpin.add(*ip);
            }
            counts_in_use.extend(objs.counts.iter().copied());
        }
        pending.send_all(&mut b);
        let counts = rules::pick_counts(counts_in_use);
        for (chain, rule) in rules::pick_rules(&counts) {
            add_rules(&mut b, f, chain, std::slice::from_ref(&rule));
        }
        let hairpin_what = |n: usize| format!("element {} ({n} addresses)", rules::HAIRPIN);
        let mut hp = Vec::new();
        hairpin.sort();
        for ip in hairpin.distinct(f) {
            hp.push(hairpin_element(ip));
            if hp.len() >= ELEMENTS_PER_MESSAGE {
                b.add_elements(fam, TABLE, rules::HAIRPIN, &hp, hairpin_what(hp.len()));
                hp.clear();
            }
        }
        if !hp.is_empty() {
            b.add_elements(fam, TABLE, rules::HAIRPIN, &hp, hairpin_what(hp.len()));
        }
        // Left over from an earlier run: rules are gone with the flush, so
        // nothing references them any more.
        for name in leftover_sets.keys() {
            b.delete_set(fam, TABLE, name);
        }
        for name in &leftover_chains {
            b.delete_chain(fam, TABLE, name);
        }
        self.send(f, b)?;
        self.pick_counts.insert(f, counts);
        self.map_counts.retain(|(fam, _), _| *fam != f);
        self.map_counts
            .extend(map_counts.into_iter().map(|(map, n)| ((f, map), n)));
        self.hairpin_refs.replace(f, hairpin.into_refs());
        Ok(())
    }
}
