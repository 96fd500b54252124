//! A partial sync of the nftables datapath: one transaction per family
//! holding only the services that changed (see the module doc of
//! [`super`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::batch::Batch;
use super::expr;
use super::rules::{self, ElementKey, ElementValue, Family, TABLE};
use super::slots::{keep_slots, slot_changes};
use super::{add_rules, describe, grouped, hairpin_element, NftDatapath, NftError};
use crate::datapath::ServiceChange;
use crate::model::claims::{Claims, Frontend};
use crate::model::{LocalState, ObjectKey};

impl NftDatapath {
    /// One transaction with only the services that changed.
    ///
    /// Element deletions come before additions, so an address handed from
    /// one changed service to another is re-pointed in the same
    /// transaction.
    /// Returns the frontends each changed service does not own now.
    pub(super) fn partial_sync(
        &mut self,
        f: Family,
        prev: &LocalState,
        changed: &[ServiceChange<'_>],
        claims: &Claims,
    ) -> Result<Vec<(ObjectKey, Vec<Frontend>)>, NftError> {
        let fam = f.nfproto_u8();
        let mut del_elems: Vec<(ElementKey, ElementValue)> = Vec::new();
        let mut add_elems: Vec<(ElementKey, ElementValue)> = Vec::new();
        // The endpoint counts in use.
        let mut counts_in_use = BTreeSet::new();
        let (mut flushes, mut del_chains, mut del_sets) = (Vec::new(), Vec::new(), Vec::new());
        let (mut add_sets, mut add_chains) = (Vec::new(), Vec::new());
        let mut add_rule_sets: Vec<(String, Vec<expr::Rule>)> = Vec::new();
        let mut results = Vec::new();
        // Hairpin counts change once the kernel took the transaction (no
        // copy of the whole tables: a one-service change stays small at
        // any scale).
        let mut hairpin_delta: BTreeMap<IpAddr, i32> = BTreeMap::new();
        let mut orders = Vec::new();
        for c in changed {
            let key = c.key;
            let old = self.programmed_objects(prev, key, f);
            let (mut new, lost) = c
                .next
                .map(|se| self.owned_objects(se, f, claims))
                .unwrap_or_default();
            let stable = keep_slots(&old.slots, &mut new.slots);
            slot_changes(&old.slots, &new.slots, &mut del_elems, &mut add_elems);
            orders.push(((key.clone(), f), stable.then(|| new.slots.clone())));
            for (ek, verdict) in &old.elements {
                if new.elements.get(ek) != Some(verdict) {
                    del_elems.push((ek.clone(), verdict.clone()));
                }
            }
            for (ek, verdict) in &new.elements {
                if old.elements.get(ek) != Some(verdict) {
                    add_elems.push((ek.clone(), verdict.clone()));
                }
            }
            for ip in old.hairpin.difference(&new.hairpin) {
                *hairpin_delta.entry(*ip).or_default() -= 1;
            }
            for ip in new.hairpin.difference(&old.hairpin) {
                *hairpin_delta.entry(*ip).or_default() += 1;
            }
            counts_in_use.extend(new.counts.iter().copied());
            // A chain is rewritten whole when its rules changed, or when
            // the service's affinity sets did (a chain whose rules did not
            // change may still point at a set re-created with a new
            // timeout). A chain that ends in a pick chain keeps its rules
            // while the service has endpoints.
            let sets_changed = old.sets != new.sets;
            for name in old.chains.keys() {
                if !new.chains.contains_key(name) {
                    flushes.push(name.clone());
                    del_chains.push(name.clone());
                }
            }
            for (name, timeout) in &old.sets {
                if new.sets.get(name) != Some(timeout) {
                    del_sets.push(name.clone());
                }
            }
            for (name, timeout) in &new.sets {
                if old.sets.get(name) != Some(timeout) {
                    add_sets.push(rules::affinity_set(f, name, *timeout));
                }
            }
            for (name, chain_rules) in &new.chains {
                match old.chains.get(name) {
                    None => add_chains.push(name.clone()),
                    Some(old_rules) if sets_changed || old_rules != chain_rules => {
                        flushes.push(name.clone());
                    }
                    Some(_) => continue,
                }
                add_rule_sets.push((name.clone(), chain_rules.clone()));
            }
            results.push((key.clone(), lost));
        }
        // A count without pick rules: both pick chains are rewritten with
        // rules for it and its neighbours (counts no longer in use keep
        // theirs until the next full sync, so a service going back and
        // forth does not rewrite them every time).
        let current = self.pick_counts.get(&f).cloned().unwrap_or_default();
        let missing: Vec<u32> = counts_in_use.difference(&current).copied().collect();
        let pick_counts = (!missing.is_empty()).then(|| {
            let mut c = current.clone();
            c.extend(rules::pick_counts(missing));
            c
        });
        if let Some(c) = &pick_counts {
            for chain in [rules::PICK_INTERNAL, rules::PICK_EXTERNAL] {
                flushes.push(chain.to_owned());
            }
            for (chain, rule) in rules::pick_rules(c) {
                add_rule_sets.push((chain.to_owned(), vec![rule]));
            }
        }
        let mut counts = Vec::new();
        let (mut gone, mut new_hp) = (Vec::new(), Vec::new());
        for (ip, delta) in hairpin_delta {
            let before = self.hairpin_refs.get(&ip);
            let after = before.saturating_add_signed(delta);
            if before > 0 && after == 0 {
                gone.push(hairpin_element(ip));
            } else if before == 0 && after > 0 {
                new_hp.push(hairpin_element(ip));
            }
            counts.push((ip, after));
        }
        let mut map_delta: BTreeMap<&'static str, isize> = BTreeMap::new();
        for ((map, _), _) in &del_elems {
            *map_delta.entry(map).or_default() -= 1;
        }
        for ((map, _), _) in &add_elems {
            *map_delta.entry(map).or_default() += 1;
        }

        // Phases in this order inside the one transaction, so nothing is
        // deleted while referenced and nothing referenced is missing.
        let mut b = Batch::new();
        for (map, (elems, keys)) in grouped(del_elems.iter().map(|(k, v)| (k, Some(v)))) {
            let what = format!("delete {}", describe(map, &keys, elems.len()));
            b.delete_elements(fam, TABLE, map, &elems, what);
        }
        if !gone.is_empty() {
            b.delete_elements(
                fam,
                TABLE,
                rules::HAIRPIN,
                &gone,
                format!("delete element {}", rules::HAIRPIN),
            );
        }
        for name in &flushes {
            b.flush_rules(fam, TABLE, Some(name));
        }
        for name in &del_chains {
            b.delete_chain(fam, TABLE, name);
        }
        for name in &del_sets {
            b.delete_set(fam, TABLE, name);
        }
        for set in &add_sets {
            b.add_set(fam, TABLE, set);
        }
        for name in &add_chains {
            b.add_chain(fam, TABLE, name, None);
        }
        for (name, chain_rules) in &add_rule_sets {
            add_rules(&mut b, f, name, chain_rules);
        }
        for (map, (elems, keys)) in grouped(add_elems.iter().map(|(k, v)| (k, Some(v)))) {
            let what = format!("add {}", describe(map, &keys, elems.len()));
            b.add_elements(fam, TABLE, map, &elems, what);
        }
        if !new_hp.is_empty() {
            b.add_elements(
                fam,
                TABLE,
                rules::HAIRPIN,
                &new_hp,
                format!("add element {}", rules::HAIRPIN),
            );
        }
        self.send(f, b)?;
        for (k, lists) in orders {
            match lists {
                Some(lists) => drop(self.slot_orders.insert(k, lists)),
                None => drop(self.slot_orders.remove(&k)),
            }
        }
        if let Some(c) = pick_counts {
            self.pick_counts.insert(f, c);
        }
        for (ip, n) in counts {
            self.hairpin_refs.set(ip, n);
        }
        for (map, delta) in map_delta {
            let n = self.map_counts.entry((f, map)).or_default();
            *n = n.saturating_add_signed(delta);
        }
        Ok(results)
    }
}
