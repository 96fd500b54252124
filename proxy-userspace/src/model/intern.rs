//! Shared strings for the values that repeat across objects: node names,
//! zones, namespaces, port names, label keys. 250,000 endpoints on three
//! nodes hold three node-name strings, each endpoint a pointer to one.
//!
//! [`intern`] hands out the one [`ArcStr`] per distinct value it has seen;
//! a value nothing else holds any more is dropped the next time the pool
//! has doubled since it was last swept, so the pool stays proportional to
//! the values in use. Interning changes no value, only where it is stored:
//! a string from here equals (and hashes as) the same text from anywhere.

use std::sync::{Mutex, PoisonError};

use hashbrown::HashSet;

pub use arcstr::ArcStr;

/// Below this size the pool is never swept.
const MIN_SWEEP: usize = 1024;

struct Pool {
    /// hashbrown's default hasher (foldhash): a quarter of a million
    /// endpoints look up their node, zone and pod namespace and kind here
    /// while a cluster is read, and SipHash was most of that.
    strings: HashSet<ArcStr>,
    /// Sweep when the pool reaches this size.
    sweep_at: usize,
}

static POOL: Mutex<Option<Pool>> = Mutex::new(None);

/// The shared copy of `s`.
pub fn intern(s: &str) -> ArcStr {
    if s.is_empty() {
        return ArcStr::new();
    }
    // A panic while the lock was held cannot leave the set half-updated
    // (insert and retain either happened or not), so a poisoned pool is
    // still a good one.
    let mut guard = POOL.lock().unwrap_or_else(PoisonError::into_inner);
    let pool = guard.get_or_insert_with(|| Pool {
        strings: HashSet::default(),
        sweep_at: MIN_SWEEP,
    });
    if let Some(shared) = pool.strings.get(s) {
        return shared.clone();
    }
    if pool.strings.len() >= pool.sweep_at {
        // Only the pool holds these: nothing uses the value any more.
        pool.strings.retain(|a| ArcStr::strong_count(a) != Some(1));
        pool.strings.shrink_to_fit();
        pool.sweep_at = (2 * pool.strings.len()).max(MIN_SWEEP);
    }
    let shared = ArcStr::from(s);
    pool.strings.insert(shared.clone());
    shared
}

/// [`intern`] for an optional value.
pub fn intern_opt(s: Option<&str>) -> Option<ArcStr> {
    s.map(intern)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_text_is_one_string_and_unused_ones_go() {
        let a = intern("node-1");
        let b = intern(&String::from("node-1"));
        assert!(ArcStr::ptr_eq(&a, &b));
        assert_eq!(a, "node-1");
        // Fill past a sweep: values nobody holds are dropped, held ones stay.
        for i in 0..3 * MIN_SWEEP {
            intern(&format!("transient-{i}"));
        }
        let c = intern("node-1");
        assert!(ArcStr::ptr_eq(&a, &c));
        let size = POOL.lock().unwrap().as_ref().map_or(0, |p| p.strings.len());
        assert!(size < 3 * MIN_SWEEP, "{size}");
    }
}
