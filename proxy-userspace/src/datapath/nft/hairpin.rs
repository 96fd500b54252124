//! How many services DNAT to each endpoint address: an address's
//! `hairpin` element lives while its count is above 0. Kept per family so
//! an IPv4 key takes 4 bytes rather than an `IpAddr`'s 17 (a quarter of a
//! million addresses at 50,000 services).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::batch::Family;

#[derive(Clone, Debug, Default)]
pub(super) struct HairpinRefs {
    v4: HashMap<Ipv4Addr, u32>,
    v6: HashMap<Ipv6Addr, u32>,
}

impl HairpinRefs {
    /// The services that DNAT to `ip`.
    pub(super) fn get(&self, ip: &IpAddr) -> u32 {
        match ip {
            IpAddr::V4(a) => self.v4.get(a),
            IpAddr::V6(a) => self.v6.get(a),
        }
        .copied()
        .unwrap_or(0)
    }

    /// Sets the count of `ip` (0: forgotten).
    pub(super) fn set(&mut self, ip: IpAddr, n: u32) {
        match (ip, n) {
            (IpAddr::V4(a), 0) => drop(self.v4.remove(&a)),
            (IpAddr::V6(a), 0) => drop(self.v6.remove(&a)),
            (IpAddr::V4(a), n) => drop(self.v4.insert(a, n)),
            (IpAddr::V6(a), n) => drop(self.v6.insert(a, n)),
        }
    }

    /// Addresses with a count, both families.
    pub(super) fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    /// The addresses of family `f` with a count.
    pub(super) fn addrs(&self, f: Family) -> Box<dyn Iterator<Item = IpAddr> + '_> {
        match f {
            Family::V4 => Box::new(self.v4.keys().map(|a| IpAddr::V4(*a))),
            Family::V6 => Box::new(self.v6.keys().map(|a| IpAddr::V6(*a))),
        }
    }

    /// Takes family `f`'s counts from `other` in place of these.
    pub(super) fn replace(&mut self, f: Family, other: HairpinRefs) {
        match f {
            Family::V4 => self.v4 = other.v4,
            Family::V6 => self.v6 = other.v6,
        }
    }
}

/// The endpoint addresses a full sync DNATs to, one entry per service
/// that does, as the sync comes across them: a plain list (4 bytes an IPv4
/// address) while the transaction is built, counted into [`HairpinRefs`]
/// once it is sent. A table of a quarter of a million addresses grown as
/// they came used to be the peak of the nftables full sync, on top of the
/// transaction itself.
#[derive(Debug, Default)]
pub(super) struct HairpinList {
    v4: Vec<Ipv4Addr>,
    v6: Vec<Ipv6Addr>,
}

impl HairpinList {
    /// One more service DNATs to `ip`.
    pub(super) fn add(&mut self, ip: IpAddr) {
        match ip {
            IpAddr::V4(a) => self.v4.push(a),
            IpAddr::V6(a) => self.v6.push(a),
        }
    }

    /// Sorts the list, so that [`HairpinList::distinct`] can read it.
    pub(super) fn sort(&mut self) {
        self.v4.sort_unstable();
        self.v6.sort_unstable();
    }

    /// The distinct addresses of family `f`, once sorted.
    pub(super) fn distinct(&self, f: Family) -> Box<dyn Iterator<Item = IpAddr> + '_> {
        match f {
            Family::V4 => Box::new(runs(&self.v4).map(|(a, _)| IpAddr::V4(a))),
            Family::V6 => Box::new(runs(&self.v6).map(|(a, _)| IpAddr::V6(a))),
        }
    }

    /// The count of each address, once sorted.
    pub(super) fn into_refs(self) -> HairpinRefs {
        HairpinRefs {
            v4: runs(&self.v4).collect(),
            v6: runs(&self.v6).collect(),
        }
    }
}

/// Each value of a sorted list with the length of its run.
fn runs<T: Copy + PartialEq>(sorted: &[T]) -> impl Iterator<Item = (T, u32)> + '_ {
    sorted
        .chunk_by(|a, b| a == b)
        .map(|run| (run[0], run.len() as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_counts_each_address_once_per_service() {
        let mut list = HairpinList::default();
        for ip in [
            "10.0.0.2", "fd00::1", "10.0.0.1", "10.0.0.2", "fd00::1", "10.0.0.2",
        ] {
            list.add(ip.parse().unwrap());
        }
        list.sort();
        let v4: Vec<String> = list.distinct(Family::V4).map(|a| a.to_string()).collect();
        assert_eq!(v4, ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(list.distinct(Family::V6).count(), 1);
        let refs = list.into_refs();
        assert_eq!(refs.get(&"10.0.0.2".parse().unwrap()), 3);
        assert_eq!(refs.get(&"10.0.0.1".parse().unwrap()), 1);
        assert_eq!(refs.get(&"fd00::1".parse().unwrap()), 2);
        assert_eq!(refs.get(&"10.0.0.3".parse().unwrap()), 0);
        assert_eq!(refs.len(), 3);
    }
}
