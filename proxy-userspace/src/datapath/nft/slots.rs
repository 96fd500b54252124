//! Where a large frontend's endpoints sit in the endpoints maps: in the
//! slots they were programmed in, so that a change of a few endpoints of
//! a 100,000-endpoint service is a few element updates, not the slots
//! after the first changed address shifted by one (every endpoint list
//! is in address order otherwise).

use std::collections::HashSet;
use std::sync::Arc;

use super::rules::{ElementKey, ElementValue, SlotList, SlotTarget};

/// A frontend with at least this many endpoints keeps its endpoints in
/// the slots they were programmed in (see [`stable_order`]), so a change
/// of some of them rewrites those slots only; smaller lists are in
/// address order, and a change rewrites the slots that shifted.
pub const STABLE_SLOTS: usize = 64;

/// `next` (the frontend's endpoints now, in address order) in slots that
/// keep `programmed`'s order: an endpoint still there stays in its slot,
/// a new one takes the slot of one that left, and when more left than
/// came, the endpoints in the last slots move into the holes (the slots
/// stay `0..n`, as the pick's `numgen random mod n` needs). A change of
/// *k* endpoints changes at most about *2k* slots whatever the list's
/// length.
pub fn stable_order(programmed: &[SlotTarget], next: &[SlotTarget]) -> Arc<[SlotTarget]> {
    let next_set: HashSet<&SlotTarget> = next.iter().collect();
    let programmed_set: HashSet<&SlotTarget> = programmed.iter().collect();
    let mut slots: Vec<Option<SlotTarget>> = programmed
        .iter()
        .map(|t| next_set.contains(t).then_some(*t))
        .collect();
    let mut added = next.iter().filter(|t| !programmed_set.contains(t)).copied();
    for slot in slots.iter_mut().filter(|s| s.is_none()) {
        match added.next() {
            Some(t) => *slot = Some(t),
            None => break,
        }
    }
    slots.extend(added.map(Some));
    let mut i = 0;
    while i < slots.len() {
        if slots[i].is_none() {
            while slots.last().is_some_and(Option::is_none) {
                slots.pop();
            }
            if i < slots.len() {
                slots.swap_remove(i);
            }
        }
        i += 1;
    }
    let out: Arc<[SlotTarget]> = slots.into_iter().flatten().collect();
    if out.len() == next.len() {
        out
    } else {
        // Only with the same endpoint twice in a list, which the model
        // never makes: address order then.
        next.into()
    }
}

/// Puts each of `next`'s slot lists of at least [`STABLE_SLOTS`]
/// endpoints in the slot order of the same frontend's list in
/// `programmed` (lists shared by frontends stay shared); returns whether
/// any list was (then the lists must be kept as programmed).
pub(super) fn keep_slots(programmed: &[SlotList], next: &mut [SlotList]) -> bool {
    let mut stable = false;
    // (programmed list, next list) → the ordered list, per shared pair.
    let mut done: Vec<(*const SlotTarget, *const SlotTarget, Arc<[SlotTarget]>)> = Vec::new();
    for list in next.iter_mut() {
        if list.targets.len() < STABLE_SLOTS {
            continue;
        }
        stable = true;
        let Some(old) = programmed
            .iter()
            .find(|o| o.map == list.map && o.frontend == list.frontend)
        else {
            continue;
        };
        let pair = (old.targets.as_ptr(), list.targets.as_ptr());
        list.targets = match done.iter().find(|d| (d.0, d.1) == pair) {
            Some(d) => d.2.clone(),
            None => {
                let ordered = stable_order(&old.targets, &list.targets);
                done.push((pair.0, pair.1, ordered.clone()));
                ordered
            }
        };
    }
    stable
}

/// The endpoints-map elements that differ between `old` and `new`, slot
/// by slot: deleted from `old`, added from `new`.
pub(super) fn slot_changes(
    old: &[SlotList],
    new: &[SlotList],
    del: &mut Vec<(ElementKey, ElementValue)>,
    add: &mut Vec<(ElementKey, ElementValue)>,
) {
    let find = |lists: &'_ [SlotList], l: &SlotList| -> Option<usize> {
        lists
            .iter()
            .position(|o| o.map == l.map && o.frontend == l.frontend)
    };
    for o in old {
        let Some(i) = find(new, o) else {
            del.extend(o.elements());
            continue;
        };
        let n = &new[i];
        if Arc::ptr_eq(&o.targets, &n.targets) {
            continue;
        }
        for slot in 0..o.targets.len().max(n.targets.len()) {
            let (a, b) = (o.targets.get(slot), n.targets.get(slot));
            if a == b {
                continue;
            }
            if a.is_some() {
                del.push(o.element(slot));
            }
            if b.is_some() {
                add.push(n.element(slot));
            }
        }
    }
    for n in new.iter().filter(|n| find(old, n).is_none()) {
        add.extend(n.elements());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u8) -> SlotTarget {
        (std::net::IpAddr::from([10, 0, 0, n]), 8080)
    }

    fn list(ns: &[u8]) -> Vec<SlotTarget> {
        ns.iter().map(|n| t(*n)).collect()
    }

    #[test]
    fn a_replaced_endpoint_takes_the_slot_of_the_one_that_left() {
        let got = stable_order(&list(&[1, 2, 3, 4]), &list(&[0, 1, 3, 4]));
        assert_eq!(&*got, list(&[1, 0, 3, 4]));
    }

    #[test]
    fn a_removed_endpoint_s_slot_takes_the_last_one() {
        let got = stable_order(&list(&[1, 2, 3, 4, 5]), &list(&[1, 3, 4, 5]));
        assert_eq!(&*got, list(&[1, 5, 3, 4]));
        // Holes at the end go without moving anything.
        let got = stable_order(&list(&[1, 2, 3, 4, 5]), &list(&[1, 2, 3]));
        assert_eq!(&*got, list(&[1, 2, 3]));
        let got = stable_order(&list(&[1, 2, 3, 4, 5]), &list(&[2, 4]));
        assert_eq!(&*got, list(&[4, 2]));
    }

    #[test]
    fn added_endpoints_go_after_the_programmed_ones() {
        let got = stable_order(&list(&[3, 1]), &list(&[1, 2, 3, 4]));
        assert_eq!(&*got, list(&[3, 1, 2, 4]));
    }

    #[test]
    fn any_change_keeps_the_next_endpoints_and_moves_few_slots() {
        // Deterministic pseudo-random lists: every result holds exactly
        // the next endpoints, and the slots that differ are at most twice
        // the endpoints that changed.
        let mut seed = 7u32;
        let mut rand = move || {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            (seed >> 16) as u8
        };
        for _ in 0..500 {
            let mut a: Vec<u8> = (0..rand() % 40).map(|_| rand()).collect();
            let mut b: Vec<u8> = (0..rand() % 40).map(|_| rand()).collect();
            for v in [&mut a, &mut b] {
                v.sort_unstable();
                v.dedup();
            }
            let (old, new) = (list(&a), list(&b));
            let got = stable_order(&old, &new);
            let mut sorted = got.to_vec();
            sorted.sort();
            assert_eq!(sorted, new);
            let changed = old.iter().filter(|x| !new.contains(x)).count()
                + new.iter().filter(|x| !old.contains(x)).count();
            let moved = (0..old.len().max(got.len()))
                .filter(|i| old.get(*i) != got.get(*i))
                .count();
            assert!(moved <= 2 * changed, "{a:?} -> {b:?}: {got:?}");
        }
    }
}
