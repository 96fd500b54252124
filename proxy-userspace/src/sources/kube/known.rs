//! What the model holds of one watched resource: every object passed on,
//! with the resourceVersion it was read at ([`Known`]).
//!
//! A relist (a watch expired with 410 Gone, an API server restarted) lists
//! every object again, nearly all of them unchanged. An item whose
//! resourceVersion is the one passed on is the object the model already
//! has: it is only marked as still existing, never decoded or held, so a
//! relist costs memory and work for what changed, not for the cluster
//! (at 50k Services / 250k endpoints, holding a whole second copy of the
//! EndpointSlices until the list ended took the daemon from 191 to
//! 244 MiB). The objects a list did not mark are the ones deleted while
//! the watch was down.
//!
//! The resourceVersion is compared for equality only, as the API asks of
//! clients; one that is not a decimal number (no API server backed by etcd
//! writes one) is never taken as current, so its object is always checked
//! again.

use hashbrown::HashMap;

use crate::model::ObjectKey;

/// Marks an entry as listed by the (re)list under way.
const LISTED: u64 = 1 << 63;
/// An object whose resourceVersion is not known.
const UNKNOWN: u64 = LISTED - 1;

/// The resourceVersion `rv` as compared here; `None` when it cannot be.
pub fn version(rv: Option<&str>) -> Option<u64> {
    rv?.parse::<u64>().ok().filter(|&v| v < UNKNOWN)
}

/// The objects of one resource that the model holds, by namespace and
/// name, each with the resourceVersion passed on and, during a list,
/// whether the list has had it.
#[derive(Default)]
pub struct Known {
    objects: HashMap<ObjectKey, u64>,
}

impl Known {
    /// Whether the model holds `key` at resourceVersion `rv`.
    pub fn is_current(&self, key: &ObjectKey, rv: u64) -> bool {
        rv != UNKNOWN && self.objects.get(key).is_some_and(|&v| v & !LISTED == rv)
    }

    /// `key` as passed on at `rv` (`None`: not known).
    pub fn insert(&mut self, key: ObjectKey, rv: Option<u64>, listed: bool) {
        let mark = if listed { LISTED } else { 0 };
        self.objects.insert(key, rv.unwrap_or(UNKNOWN) | mark);
    }

    pub fn remove(&mut self, key: &ObjectKey) {
        self.objects.remove(key);
    }

    /// Marks `key` as listed, when it is known.
    pub fn mark_listed(&mut self, key: &ObjectKey) {
        if let Some(v) = self.objects.get_mut(key) {
            *v |= LISTED;
        }
    }

    /// A list begins: nothing is listed yet (an attempt that failed part
    /// way listed some).
    pub fn begin_list(&mut self) {
        for v in self.objects.values_mut() {
            *v &= !LISTED;
        }
    }

    /// A list ended: the objects it did not list are gone, and returned.
    pub fn end_list(&mut self) -> Vec<ObjectKey> {
        let mut gone = Vec::new();
        self.objects.retain(|key, v| {
            let listed = *v & LISTED != 0;
            *v &= !LISTED;
            if !listed {
                gone.push(key.clone());
            }
            listed
        });
        gone.sort_unstable();
        gone
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.objects.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("default", name)
    }

    #[test]
    fn a_list_keeps_what_it_listed_and_returns_the_rest() {
        let mut known = Known::default();
        known.insert(key("a"), version(Some("10")), false);
        known.insert(key("b"), version(Some("11")), false);
        known.insert(key("c"), version(Some("12")), false);
        assert!(known.is_current(&key("a"), 10));
        assert!(!known.is_current(&key("a"), 11));
        assert!(!known.is_current(&key("d"), 10));

        known.begin_list();
        known.mark_listed(&key("a"));
        // Changed while the watch was down: passed on again, listed.
        known.insert(key("b"), version(Some("20")), true);
        // New.
        known.insert(key("d"), version(Some("21")), true);
        // Not known: marking it adds nothing.
        known.mark_listed(&key("e"));
        // Marks do not change what is current.
        assert!(known.is_current(&key("a"), 10));
        assert_eq!(known.end_list(), vec![key("c")]);
        assert_eq!(known.len(), 3);
        assert!(known.is_current(&key("b"), 20));

        // A second list starts with nothing listed: an attempt that failed
        // part way does not count.
        known.begin_list();
        known.mark_listed(&key("a"));
        known.begin_list();
        known.mark_listed(&key("b"));
        assert_eq!(known.end_list(), vec![key("a"), key("d")]);
    }

    #[test]
    fn a_version_that_is_not_a_number_is_never_current() {
        assert_eq!(version(Some("123")), Some(123));
        assert_eq!(version(Some("abc")), None);
        assert_eq!(version(Some("")), None);
        assert_eq!(version(None), None);
        assert_eq!(version(Some(&u64::MAX.to_string())), None);
        let mut known = Known::default();
        known.insert(key("a"), version(Some("abc")), false);
        assert!(!known.is_current(&key("a"), UNKNOWN));
        assert!(!known.is_current(&key("a"), 0));
    }
}
