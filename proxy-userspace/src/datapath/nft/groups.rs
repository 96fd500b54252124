//! Endpoint groups: one per service chain that picks from a group (see
//! [`super::rules`]). A group keeps its id while its chain exists, and
//! the range of endpoint counts its rules cover while its count stays
//! inside, so the chain's rules do not change with its endpoints.

use std::collections::HashMap;

use super::rules::Group;

/// The groups of one family's table.
#[derive(Clone, Debug, Default)]
pub struct Groups {
    groups: HashMap<String, Group>,
    /// Ids released by removed chains, reused before new ones.
    free: Vec<u32>,
    next: u32,
}

impl Groups {
    /// The group of `chain` with `n` endpoints: its id, assigned on first
    /// use, and its range, re-centred on `n` when `n` left it.
    pub fn get(&mut self, chain: &str, n: u32) -> Group {
        if let Some(g) = self.groups.get_mut(chain) {
            if !g.covers(n) {
                *g = Group::around(g.id, n);
            }
            return *g;
        }
        let id = self.free.pop().unwrap_or_else(|| {
            self.next += 1;
            self.next
        });
        let g = Group::around(id, n);
        self.groups.insert(chain.to_owned(), g);
        g
    }

    /// Releases the group of a chain the kernel no longer has.
    pub fn release(&mut self, chain: &str) {
        if let Some(g) = self.groups.remove(chain) {
            self.free.push(g.id);
        }
    }

    /// Keeps only the groups of chains `keep` says exist.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        let gone: Vec<String> = self.groups.keys().filter(|c| !keep(c)).cloned().collect();
        for chain in gone {
            self.release(&chain);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_keeps_its_id_and_its_range_while_the_count_stays_inside() {
        let mut g = Groups::default();
        let a = g.get("svc-a", 5);
        assert_eq!((a.min, a.max), (3, 7));
        let b = g.get("svc-b", 1);
        assert_ne!(a.id, b.id);
        assert_eq!(g.get("svc-a", 7), a);
        assert_eq!(g.get("svc-a", 3), a);
        let moved = g.get("svc-a", 8);
        assert_eq!((moved.id, moved.min, moved.max), (a.id, 6, 10));
        g.release("svc-a");
        assert_eq!(g.get("svc-c", 2).id, a.id);
        g.retain(|c| c == "svc-c");
        assert_eq!(g.get("svc-d", 2).id, b.id);
    }
}
