//! How many services DNAT to each endpoint address: an address's
//! `hairpin` element lives while its count is above 0. Kept per family so
//! an IPv4 key takes 4 bytes rather than an `IpAddr`'s 17 (a quarter of a
//! million addresses at 50,000 services).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::batch::Family;

#[derive(Debug, Default)]
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

    /// One more service DNATs to `ip`.
    pub(super) fn add(&mut self, ip: IpAddr) {
        match ip {
            IpAddr::V4(a) => *self.v4.entry(a).or_default() += 1,
            IpAddr::V6(a) => *self.v6.entry(a).or_default() += 1,
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
