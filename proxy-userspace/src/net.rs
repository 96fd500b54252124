//! Small network value types shared by flag parsing and object validation.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An IP prefix such as `10.244.0.0/16` or `fd00::/64`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix_len: u8,
}

impl Cidr {
    /// The prefix holding exactly `addr` (/32 or /128).
    pub fn host(addr: IpAddr) -> Cidr {
        let prefix_len = if addr.is_ipv4() { 32 } else { 128 };
        Cidr { addr, prefix_len }
    }

    pub fn contains(&self, ip: &IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix_len))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(*ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix_len))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(*ip) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{s:?} is not a valid CIDR");
        let (addr, len) = s.trim().split_once('/').ok_or_else(bad)?;
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let prefix_len: u8 = len.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix_len > max {
            return Err(bad());
        }
        Ok(Cidr { addr, prefix_len })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

/// Parses a comma-separated CIDR list; empty input is an empty list.
pub fn parse_cidr_list(s: &str) -> Result<Vec<Cidr>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(Cidr::from_str)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_parse_and_match() {
        let c: Cidr = "10.244.0.0/16".parse().unwrap();
        assert!(c.contains(&"10.244.3.4".parse().unwrap()));
        assert!(!c.contains(&"10.245.0.1".parse().unwrap()));
        assert!(!c.contains(&"fd00::1".parse().unwrap()));
        let all: Cidr = "::/0".parse().unwrap();
        assert!(all.contains(&"fd00::1".parse().unwrap()));
        for bad in ["10.0.0.0", "10.0.0.0/33", "x/8", "fd00::/129"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        assert_eq!(parse_cidr_list(" 10.0.0.0/8, fd00::/8 ,").unwrap().len(), 2);
        assert_eq!(parse_cidr_list("").unwrap(), vec![]);
    }
}
