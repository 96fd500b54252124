//! The map formats: service addresses ([`Vip`]), backend addresses
//! ([`BackendAddr`]) and service headers ([`Header`]) to and from the
//! `proxy_common` key and value types the eBPF programs read.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proxy_common::{
    Backend, ServiceKey, ServiceValue, BACKEND_F_LOCAL, FAMILY_V4, FAMILY_V6, SCOPE_EXTERNAL,
    SCOPE_SOCKET, SVC_FLAG_AFFINITY,
};

use crate::model::Protocol;

/// Which programs read a service entry (`ServiceKey::scope`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// The socket-LB hooks: connections made on the node.
    #[default]
    Socket,
    /// The tc programs: packets arriving from outside the node.
    External,
}

impl Scope {
    pub fn code(self) -> u8 {
        match self {
            Scope::Socket => SCOPE_SOCKET,
            Scope::External => SCOPE_EXTERNAL,
        }
    }

    pub fn from_code(code: u8) -> Option<Scope> {
        match code {
            SCOPE_SOCKET => Some(Scope::Socket),
            SCOPE_EXTERNAL => Some(Scope::External),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Vip {
    pub ip: IpAddr,
    pub port: u16,
    /// IANA protocol number.
    pub proto: u8,
    pub scope: Scope,
}

/// An endpoint address: one entry in `EKP_BACKENDS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendAddr {
    pub ip: IpAddr,
    pub port: u16,
    /// The endpoint runs on this node: node-external traffic reaches it
    /// without SNAT.
    pub local: bool,
}

/// Address words in network byte order as the kernel stores them, and the
/// family marker. IPv4 sits in word 0.
pub fn encode_ip(ip: IpAddr) -> ([u32; 4], u8) {
    match ip {
        // from_ne_bytes keeps the octets' memory order: network order.
        IpAddr::V4(a) => ([u32::from_ne_bytes(a.octets()), 0, 0, 0], FAMILY_V4),
        IpAddr::V6(a) => {
            let o = a.octets();
            let w = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            ([w(0), w(4), w(8), w(12)], FAMILY_V6)
        }
    }
}

/// The inverse of [`encode_ip`]; `None` for an unknown family.
pub fn decode_ip(addr: &[u32; 4], family: u8) -> Option<IpAddr> {
    match family {
        FAMILY_V4 => Some(IpAddr::V4(Ipv4Addr::from(addr[0].to_ne_bytes()))),
        FAMILY_V6 => {
            let mut o = [0u8; 16];
            for (i, w) in addr.iter().enumerate() {
                o[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
            }
            Some(IpAddr::V6(Ipv6Addr::from(o)))
        }
        _ => None,
    }
}

pub fn protocol_name(p: u8) -> String {
    match Protocol::from_ip_number(p) {
        Some(known) => known.as_str().to_owned(),
        None => format!("proto-{p}"),
    }
}

impl Vip {
    /// The key of slot `slot` (0: the header; < 2^23).
    pub fn key(&self, slot: u32) -> ServiceKey {
        let (addr, family) = encode_ip(self.ip);
        ServiceKey {
            addr,
            port: self.port.to_be(),
            proto: self.proto,
            family,
            slot: 0,
            scope: self.scope.code(),
            _pad: 0,
        }
        .with_slot(slot)
    }

    /// The VIP of a key and the key's slot number.
    pub fn from_key(k: &ServiceKey) -> Option<(Vip, u32)> {
        let ip = decode_ip(&k.addr, k.family)?;
        Some((
            Vip {
                ip,
                port: u16::from_be(k.port),
                proto: k.proto,
                scope: Scope::from_code(k.scope_code())?,
            },
            k.slot_number(),
        ))
    }
}

impl std::fmt::Display for Vip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let addr = std::net::SocketAddr::new(self.ip, self.port);
        write!(f, "{addr}/{}", protocol_name(self.proto))?;
        match self.scope {
            Scope::Socket => Ok(()),
            Scope::External => f.write_str(" (external)"),
        }
    }
}

impl BackendAddr {
    pub fn value(&self) -> Backend {
        let (addr, family) = encode_ip(self.ip);
        Backend {
            addr,
            port: self.port.to_be(),
            family,
            flags: if self.local { BACKEND_F_LOCAL } else { 0 },
        }
    }

    pub fn from_value(b: &Backend) -> Option<BackendAddr> {
        Some(BackendAddr {
            ip: decode_ip(&b.addr, b.family)?,
            port: u16::from_be(b.port),
            local: b.flags & BACKEND_F_LOCAL != 0,
        })
    }
}

impl std::fmt::Display for BackendAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::net::SocketAddr::new(self.ip, self.port).fmt(f)
    }
}

/// A header in `EKP_SERVICES` (slot 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    /// Backends (slots); beyond `u16::MAX` kept in the value's
    /// `backend_id` ([`ServiceValue::header`]).
    pub count: u32,
    pub flags: u16,
    pub affinity_timeout: u32,
    pub service_id: u32,
}

impl Header {
    pub fn value(&self) -> ServiceValue {
        ServiceValue::header(
            self.count,
            self.flags,
            self.affinity_timeout,
            self.service_id,
        )
    }

    pub fn from_value(v: &ServiceValue) -> Header {
        Header {
            count: v.backend_count(),
            flags: v.flags,
            affinity_timeout: v.affinity_timeout,
            service_id: v.service_id,
        }
    }

    pub fn affinity(&self) -> bool {
        self.flags & SVC_FLAG_AFFINITY != 0
    }
}
