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

    /// The prefix with the address's bits past it cleared (Go's `IPNet`
    /// of `ParseCIDR`).
    pub fn network(&self) -> Cidr {
        let addr = match self.addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix_len))
                    .unwrap_or(0);
                IpAddr::V4((u32::from(a) & mask).into())
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix_len))
                    .unwrap_or(0);
                IpAddr::V6((u128::from(a) & mask).into())
            }
        };
        Cidr { addr, ..*self }
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

    /// [`parse_cidr_sloppy`] of `s` without its surrounding whitespace.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_cidr_sloppy(s.trim()).ok_or_else(|| format!("{s:?} is not a valid CIDR"))
    }
}

/// An IP address as kube-proxy reads one (`ParseIPSloppy` of
/// k8s.io/utils/net): Go's `net.ParseIP`, plus IPv4 fields with leading
/// zeros read as decimal (`10.96.0.010` is 10.96.0.10, as Go before 1.17
/// read it), in a plain address or at the end of an IPv6 one
/// (`::ffff:010.1.2.3`). An IPv4-mapped IPv6 address is the IPv4 address,
/// as Go prints and classifies it. No whitespace, zone, port or brackets.
pub fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    parse_ip_as_written(s).map(unmapped)
}

/// A CIDR as kube-proxy reads one (`ParseCIDRSloppy`): an address as in
/// [`parse_ip_sloppy`], `/`, and a decimal prefix length (leading zeros
/// allowed, no sign) of at most the address's width as written. An
/// IPv4-mapped prefix of at least 96 bits is the IPv4 prefix (Go prints
/// `::ffff:1.1.1.0/120` as `1.1.1.0/24`). The address is kept as given,
/// bits past the prefix included.
pub fn parse_cidr_sloppy(s: &str) -> Option<Cidr> {
    let (addr, len) = s.split_once('/')?;
    let addr = parse_ip_as_written(addr)?;
    if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let len = len.bytes().fold(0u32, |n, d| {
        n.saturating_mul(10).saturating_add(u32::from(d - b'0'))
    });
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix_len = u8::try_from(len).ok().filter(|l| *l <= max)?;
    Some(match addr {
        IpAddr::V6(v6) if prefix_len >= 96 => match v6.to_ipv4_mapped() {
            Some(v4) => Cidr {
                addr: IpAddr::V4(v4),
                prefix_len: prefix_len - 96,
            },
            None => Cidr { addr, prefix_len },
        },
        _ => Cidr { addr, prefix_len },
    })
}

/// `IP:PORT` (`[IPv6]:PORT`) with the IP read as [`parse_ip_sloppy`]
/// reads it, as kube-proxy reads its bind addresses.
pub fn parse_socket_addr_sloppy(s: &str) -> Option<std::net::SocketAddr> {
    if let Ok(a) = s.parse::<std::net::SocketAddr>() {
        return Some(std::net::SocketAddr::new(unmapped(a.ip()), a.port()));
    }
    let (host, port) = s.rsplit_once(':')?;
    let ip = match host.strip_prefix('[') {
        Some(h) => parse_ip_as_written(h.strip_suffix(']')?)?,
        None => parse_ip_as_written(host).filter(IpAddr::is_ipv4)?,
    };
    Some(std::net::SocketAddr::new(unmapped(ip), port.parse().ok()?))
}

/// The address as written: an IPv4-mapped one stays IPv6.
fn parse_ip_as_written(s: &str) -> Option<IpAddr> {
    s.parse()
        .ok()
        .or_else(|| without_ipv4_leading_zeros(s)?.parse().ok())
}

fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// `s` with the leading zeros of its dotted IPv4 part removed, when it
/// ends in one (four dot-separated runs of decimal digits, at the start or
/// after the last colon); `None` when it does not.
fn without_ipv4_leading_zeros(s: &str) -> Option<String> {
    let start = s.rfind(':').map_or(0, |i| i + 1);
    let (head, tail) = s.split_at(start);
    let fields: Vec<&str> = tail.split('.').collect();
    let decimal = |f: &&str| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit());
    if fields.len() != 4 || !fields.iter().all(decimal) {
        return None;
    }
    let fields: Vec<&str> = fields
        .iter()
        .map(|f| match f.trim_start_matches('0') {
            "" => "0",
            digits => digits,
        })
        .collect();
    Some(format!("{head}{}", fields.join(".")))
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

#[doc(hidden)]
#[path = "net_go_cases.rs"]
pub mod go_cases;

#[cfg(test)]
mod tests {
    use super::go_cases::*;
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

    #[test]
    fn ips_parse_as_kube_proxy_reads_them() {
        for spellings in GOOD_IPS {
            for s in *spellings {
                let ip = parse_ip_sloppy(s).unwrap_or_else(|| panic!("{s:?} refused"));
                assert_eq!(ip.to_string(), spellings[0], "{s:?}");
            }
        }
        for s in BAD_IPS {
            assert_eq!(parse_ip_sloppy(s), None, "{s:?}");
        }
        assert!(parse_ip_sloppy("::ffff:1.2.3.4").unwrap().is_ipv4());
        // IPv4-compatible (not mapped) stays IPv6.
        assert_eq!(
            parse_ip_sloppy("::1.2.3.4").unwrap().to_string(),
            "::102:304"
        );
    }

    #[test]
    fn socket_addresses_read_their_ip_sloppily() {
        for (s, want) in [
            ("127.0.0.001:10249", Some("127.0.0.1:10249")),
            ("[::ffff:127.0.0.01]:10256", Some("127.0.0.1:10256")),
            ("[fd00::0001]:80", Some("[fd00::1]:80")),
            ("0.0.0.0:10256", Some("0.0.0.0:10256")),
            ("fd00::1:80", None),
            // Go's SplitHostPort takes brackets around any host.
            ("[010.0.0.1]:80", Some("10.0.0.1:80")),
            ("127.0.0.1", None),
            ("127.0.0.1:http", None),
            ("127.0.0.1:65536", None),
        ] {
            let got = parse_socket_addr_sloppy(s).map(|a| a.to_string());
            assert_eq!(got.as_deref(), want, "{s:?}");
        }
    }

    #[test]
    fn cidrs_parse_as_kube_proxy_reads_them() {
        for spellings in GOOD_CIDRS {
            for s in *spellings {
                let c = parse_cidr_sloppy(s).unwrap_or_else(|| panic!("{s:?} refused"));
                assert_eq!(c.network().to_string(), spellings[0], "{s:?}");
            }
        }
        for s in BAD_CIDRS {
            assert_eq!(parse_cidr_sloppy(s), None, "{s:?}");
        }
        // The address is kept, in canonical form.
        assert_eq!(
            parse_cidr_sloppy("10.0.0.010/24").unwrap().to_string(),
            "10.0.0.10/24"
        );
        // Flags and manifests: whitespace around is forgiven.
        assert_eq!(
            " 010.0.0.0/8 ".parse::<Cidr>().unwrap().to_string(),
            "10.0.0.0/8"
        );
    }
}
