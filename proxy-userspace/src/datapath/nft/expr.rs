//! The rules the proxy writes, as a small typed form: each [`Rule`] is a
//! list of matches and statements that renders to the text `nft list`
//! prints and encodes to the nf_tables expressions the kernel runs.
//!
//! Registers follow nft's own use: 32-bit registers from
//! [`REG32_00`], a concatenated key in consecutive ones, each part padded
//! to 4 bytes.

use std::fmt::{self, Write as _};
use std::net::IpAddr;

use super::batch::{Family, NFT_GOTO, NFT_JUMP, NFT_RETURN, NF_ACCEPT, NF_DROP};
use super::nlsock::Attrs;
use crate::net::Cidr;

/// The first 32-bit register (`NFT_REG32_00`); `0` is the verdict register.
const REG32_00: u32 = 8;
const REG_VERDICT: u32 = 0;

// Payload bases and offsets.
const BASE_NETWORK: u32 = 1;
const BASE_TRANSPORT: u32 = 2;
// Keys.
const META_MARK: u32 = 3;
const META_L4PROTO: u32 = 16;
const CT_STATE: u32 = 0;
const CT_STATUS: u32 = 2;
const CT_STATE_NEW: u32 = 1 << 3;
const CT_STATE_INVALID: u32 = 1 << 0;
const IPS_DST_NAT: u32 = 1 << 5;
const FIB_RESULT_ADDRTYPE: u32 = 3;
const FIB_F_SADDR: u32 = 1;
const FIB_F_DADDR: u32 = 2;
const RTN_LOCAL: u32 = 2;
const NAT_DNAT: u32 = 1;
const NG_RANDOM: u32 = 1;
const DYNSET_OP_UPDATE: u32 = 1;
const CMP_EQ: u32 = 0;
const CMP_NEQ: u32 = 1;
const LOOKUP_F_INV: u32 = 1;
const REJECT_ICMP_UNREACH: u32 = 0;
const REJECT_TCP_RST: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Saddr,
    Daddr,
}

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::Saddr => "saddr",
            Field::Daddr => "daddr",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Accept,
    Drop,
    Return,
    Jump(String),
    Goto(String),
}

impl Verdict {
    pub fn code(&self) -> (i32, Option<&str>) {
        match self {
            Verdict::Accept => (NF_ACCEPT, None),
            Verdict::Drop => (NF_DROP, None),
            Verdict::Return => (NFT_RETURN, None),
            Verdict::Jump(c) => (NFT_JUMP, Some(c)),
            Verdict::Goto(c) => (NFT_GOTO, Some(c)),
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Accept => f.write_str("accept"),
            Verdict::Drop => f.write_str("drop"),
            Verdict::Return => f.write_str("return"),
            Verdict::Jump(c) => write!(f, "jump {c}"),
            Verdict::Goto(c) => write!(f, "goto {c}"),
        }
    }
}

/// A condition; a rule's matches must all hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Match {
    /// `ip saddr 10.0.0.0/8`, `ip daddr != 127.0.0.0/8`, a host when the
    /// prefix is the whole address.
    Addr {
        field: Field,
        negate: bool,
        net: Cidr,
    },
    /// `meta l4proto tcp`.
    L4Proto(u8),
    /// `fib saddr type local` / `fib daddr type local`.
    FibLocal(Field),
    /// `ct state new`.
    CtStateNew,
    /// `ct state invalid`: conntrack could not place the packet (an
    /// out-of-window TCP segment, say).
    CtStateInvalid,
    /// `ct status dnat`.
    CtStatusDnat,
    /// `meta mark & 0x4000 == 0`.
    MarkClear(u32),
    /// `numgen random mod N == 0`: true with probability 1/N.
    OneIn(u32),
    /// `ip saddr @set`.
    SaddrIn(String),
    /// `ip saddr . ip daddr @set`.
    SaddrDaddrIn(String),
}

/// What a rule does once its matches hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stmt {
    /// `ip daddr . meta l4proto . th dport vmap @map`.
    ServiceVmap(String),
    /// `meta l4proto . th dport vmap @map`.
    NodePortVmap(String),
    /// `dnat to addr:port` (needs a [`Match::L4Proto`] before it).
    Dnat(IpAddr, u16),
    /// `meta mark set meta mark | bits`.
    MarkSet(u32),
    /// `meta mark set meta mark ^ bits`.
    MarkFlip(u32),
    Masquerade,
    /// `reject with tcp reset`: TCP only (the `meta l4proto tcp` check is
    /// part of it, as nft writes it).
    RejectTcpReset,
    /// `reject`: ICMP port unreachable.
    Reject,
    /// `update @set { ip saddr }`.
    UpdateSaddr(String),
    /// DNAT to an endpoint of the packet's frontend when it has `count`
    /// endpoints (see [`FrontendPick`]).
    PickEndpoint(FrontendPick),
    Verdict(Verdict),
}

/// What a packet's frontend is looked up by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrontendKey {
    /// `daddr . l4proto . dport`: cluster, external and load-balancer IPs.
    Service,
    /// `l4proto . dport`: node ports.
    NodePort,
}

/// One rule's endpoint pick from shared maps: when the packet's frontend
/// (by [`FrontendKey`]) has `count` endpoints in `counts`, DNAT to the
/// `addr . port` of `frontend . (numgen random mod count)` in `endpoints`.
/// numgen's modulus is a constant, hence one rule per count. The frontend
/// itself is the key, not a group id looked up first: `nft` (1.0.6)
/// aborts listing a rule whose lookup key holds a map's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontendPick {
    pub key: FrontendKey,
    pub counts: String,
    pub endpoints: String,
    pub count: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rule {
    pub matches: Vec<Match>,
    pub stmts: Vec<Stmt>,
}

impl Rule {
    pub fn new(matches: Vec<Match>, stmts: Vec<Stmt>) -> Rule {
        Rule { matches, stmts }
    }

    /// The rule as `nft list` prints it (family `f`).
    pub fn text(&self, f: Family) -> String {
        let mut parts = Vec::new();
        let fam = f.nft();
        for m in &self.matches {
            parts.push(match m {
                Match::Addr { field, negate, net } => {
                    let op = if *negate { "!= " } else { "" };
                    if usize::from(net.prefix_len) == addr_len(&net.addr) * 8 {
                        format!("{fam} {} {op}{}", field.name(), net.addr)
                    } else {
                        format!("{fam} {} {op}{}/{}", field.name(), net.addr, net.prefix_len)
                    }
                }
                Match::L4Proto(p) => format!("meta l4proto {}", proto_name(*p)),
                Match::FibLocal(field) => format!("fib {} type local", field.name()),
                Match::CtStateNew => "ct state new".to_owned(),
                Match::CtStateInvalid => "ct state invalid".to_owned(),
                Match::CtStatusDnat => "ct status dnat".to_owned(),
                Match::MarkClear(bits) => format!("meta mark & {bits:#010x} == 0x00000000"),
                Match::OneIn(n) => format!("numgen random mod {n} 0"),
                Match::SaddrIn(set) => format!("{fam} saddr @{set}"),
                Match::SaddrDaddrIn(set) => format!("{fam} saddr . {fam} daddr @{set}"),
            });
        }
        for s in &self.stmts {
            parts.push(match s {
                Stmt::ServiceVmap(map) => {
                    format!("{fam} daddr . meta l4proto . th dport vmap @{map}")
                }
                Stmt::NodePortVmap(map) => format!("meta l4proto . th dport vmap @{map}"),
                Stmt::Dnat(ip, port) => match ip {
                    IpAddr::V4(a) => format!("dnat to {a}:{port}"),
                    IpAddr::V6(a) => format!("dnat to [{a}]:{port}"),
                },
                Stmt::MarkSet(bits) => format!("meta mark set meta mark | {bits:#010x}"),
                Stmt::MarkFlip(bits) => format!("meta mark set meta mark ^ {bits:#010x}"),
                Stmt::Masquerade => "masquerade".to_owned(),
                Stmt::RejectTcpReset => "reject with tcp reset".to_owned(),
                Stmt::Reject => "reject".to_owned(),
                Stmt::UpdateSaddr(set) => format!("update @{set} {{ {fam} saddr }}"),
                Stmt::PickEndpoint(p) => p.text(f),
                Stmt::Verdict(v) => v.to_string(),
            });
        }
        parts.join(" ")
    }

    /// The rule's expression list (`NFTA_RULE_EXPRESSIONS` contents).
    pub fn encode(&self, f: Family) -> Attrs {
        let mut a = Attrs::default();
        for m in &self.matches {
            encode_match(&mut a, f, m);
        }
        for s in &self.stmts {
            encode_stmt(&mut a, f, s);
        }
        a
    }
}

fn addr_len(ip: &IpAddr) -> usize {
    if ip.is_ipv4() {
        4
    } else {
        16
    }
}

fn addr_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

pub fn proto_name(p: u8) -> String {
    match p {
        6 => "tcp".to_owned(),
        17 => "udp".to_owned(),
        132 => "sctp".to_owned(),
        other => other.to_string(),
    }
}

/// Payload offset of `field` in family `f`'s network header.
fn addr_offset(f: Family, field: Field) -> u32 {
    match (f, field) {
        (Family::V4, Field::Saddr) => 12,
        (Family::V4, Field::Daddr) => 16,
        (Family::V6, Field::Saddr) => 8,
        (Family::V6, Field::Daddr) => 24,
    }
}

/// Registers a value of `len` bytes takes (32-bit registers).
fn regs(len: u32) -> u32 {
    len.div_ceil(4)
}

fn payload(a: &mut Attrs, dreg: u32, base: u32, offset: u32, len: u32) {
    a.expr("payload", |e| {
        e.be32(1, dreg).be32(2, base).be32(3, offset).be32(4, len);
    });
}

fn load_addr(a: &mut Attrs, f: Family, field: Field, dreg: u32) -> u32 {
    let len = f.addr_len();
    payload(a, dreg, BASE_NETWORK, addr_offset(f, field), len);
    len
}

fn meta_load(a: &mut Attrs, key: u32, dreg: u32) {
    a.expr("meta", |e| {
        e.be32(2, key).be32(1, dreg);
    });
}

fn cmp(a: &mut Attrs, sreg: u32, op: u32, data: &[u8]) {
    a.expr("cmp", |e| {
        e.be32(1, sreg).be32(2, op).data_value(3, data);
    });
}

fn bitwise(a: &mut Attrs, reg: u32, mask: &[u8], xor: &[u8]) {
    a.expr("bitwise", |e| {
        e.be32(1, reg)
            .be32(2, reg)
            .be32(3, mask.len() as u32)
            .data_value(4, mask)
            .data_value(5, xor);
    });
}

fn lookup(a: &mut Attrs, set: &str, sreg: u32, dreg: Option<u32>, invert: bool) {
    a.expr("lookup", |e| {
        e.str(1, set).be32(2, sreg);
        if let Some(d) = dreg {
            e.be32(3, d);
        }
        if invert {
            e.be32(5, LOOKUP_F_INV);
        }
    });
}

fn immediate_value(a: &mut Attrs, dreg: u32, data: &[u8]) {
    a.expr("immediate", |e| {
        e.be32(1, dreg).data_value(2, data);
    });
}

/// DNAT to the address in register `addr` and the port in `port`.
fn dnat(a: &mut Attrs, f: Family, addr: u32, port: u32) {
    a.expr("nat", |e| {
        e.be32(1, NAT_DNAT)
            .be32(2, f.nfproto())
            .be32(3, addr)
            .be32(4, addr)
            .be32(5, port)
            .be32(6, port);
    });
}

/// `daddr . l4proto . dport` into consecutive registers; returns the
/// first.
fn service_key(a: &mut Attrs, f: Family) -> u32 {
    let len = load_addr(a, f, Field::Daddr, REG32_00);
    let next = REG32_00 + regs(len);
    meta_load(a, META_L4PROTO, next);
    payload(a, next + 1, BASE_TRANSPORT, 2, 2);
    REG32_00
}

fn encode_match(a: &mut Attrs, f: Family, m: &Match) {
    let r = REG32_00;
    match m {
        Match::Addr { field, negate, net } => {
            let len = load_addr(a, f, *field, r) as usize;
            let full = usize::from(net.prefix_len) == len * 8;
            if !full {
                let mask = prefix_mask(len, net.prefix_len);
                bitwise(a, r, &mask, &vec![0; len]);
            }
            let op = if *negate { CMP_NEQ } else { CMP_EQ };
            cmp(a, r, op, &addr_bytes(&net.addr));
        }
        Match::L4Proto(p) => {
            meta_load(a, META_L4PROTO, r);
            cmp(a, r, CMP_EQ, &[*p]);
        }
        Match::FibLocal(field) => {
            let flag = match field {
                Field::Saddr => FIB_F_SADDR,
                Field::Daddr => FIB_F_DADDR,
            };
            a.expr("fib", |e| {
                e.be32(1, r).be32(2, FIB_RESULT_ADDRTYPE).be32(3, flag);
            });
            cmp(a, r, CMP_EQ, &RTN_LOCAL.to_ne_bytes());
        }
        Match::CtStateNew | Match::CtStateInvalid | Match::CtStatusDnat => {
            let (key, bit) = match m {
                Match::CtStateNew => (CT_STATE, CT_STATE_NEW),
                Match::CtStateInvalid => (CT_STATE, CT_STATE_INVALID),
                _ => (CT_STATUS, IPS_DST_NAT),
            };
            a.expr("ct", |e| {
                e.be32(2, key).be32(1, r);
            });
            bitwise(a, r, &bit.to_ne_bytes(), &[0; 4]);
            cmp(a, r, CMP_NEQ, &[0; 4]);
        }
        Match::MarkClear(bits) => {
            meta_load(a, META_MARK, r);
            bitwise(a, r, &bits.to_ne_bytes(), &[0; 4]);
            cmp(a, r, CMP_EQ, &[0; 4]);
        }
        Match::OneIn(n) => {
            a.expr("numgen", |e| {
                e.be32(1, r).be32(2, *n).be32(3, NG_RANDOM).be32(4, 0);
            });
            cmp(a, r, CMP_EQ, &0u32.to_ne_bytes());
        }
        Match::SaddrIn(set) => {
            load_addr(a, f, Field::Saddr, r);
            lookup(a, set, r, None, false);
        }
        Match::SaddrDaddrIn(set) => {
            let len = load_addr(a, f, Field::Saddr, r);
            load_addr(a, f, Field::Daddr, r + regs(len));
            lookup(a, set, r, None, false);
        }
    }
}

fn encode_stmt(a: &mut Attrs, f: Family, s: &Stmt) {
    let r = REG32_00;
    match s {
        Stmt::ServiceVmap(map) => {
            let first = service_key(a, f);
            lookup(a, map, first, Some(REG_VERDICT), false);
        }
        Stmt::NodePortVmap(map) => {
            meta_load(a, META_L4PROTO, r);
            payload(a, r + 1, BASE_TRANSPORT, 2, 2);
            lookup(a, map, r, Some(REG_VERDICT), false);
        }
        Stmt::Dnat(ip, port) => {
            // The address from the first register, the port after the
            // widest address (IPv6: four registers).
            let port_reg = r + 4;
            immediate_value(a, r, &addr_bytes(ip));
            immediate_value(a, port_reg, &port.to_be_bytes());
            dnat(a, f, r, port_reg);
        }
        Stmt::MarkSet(bits) | Stmt::MarkFlip(bits) => {
            meta_load(a, META_MARK, r);
            let (mask, xor) = match s {
                Stmt::MarkSet(_) => (!bits, *bits),
                _ => (u32::MAX, *bits),
            };
            bitwise(a, r, &mask.to_ne_bytes(), &xor.to_ne_bytes());
            a.expr("meta", |e| {
                e.be32(2, META_MARK).be32(3, r);
            });
        }
        Stmt::Masquerade => {
            a.expr("masq", |_| {});
        }
        Stmt::RejectTcpReset => {
            encode_match(a, f, &Match::L4Proto(6));
            a.expr("reject", |e| {
                e.be32(1, REJECT_TCP_RST);
            });
        }
        Stmt::Reject => {
            // Port unreachable: ICMP code 3, ICMPv6 code 4.
            let code = match f {
                Family::V4 => 3u8,
                Family::V6 => 4u8,
            };
            a.expr("reject", |e| {
                e.be32(1, REJECT_ICMP_UNREACH).bytes(2, &[code]);
            });
        }
        Stmt::UpdateSaddr(set) => {
            load_addr(a, f, Field::Saddr, r);
            a.expr("dynset", |e| {
                e.str(1, set).be32(3, DYNSET_OP_UPDATE).be32(4, r);
            });
        }
        Stmt::PickEndpoint(p) => p.encode(a, f),
        Stmt::Verdict(v) => {
            let (code, chain) = v.code();
            a.expr("immediate", |e| {
                e.be32(1, REG_VERDICT).data_verdict(2, code, chain);
            });
        }
    }
}

impl FrontendPick {
    /// nft's listing of the rule's statement.
    fn text(&self, f: Family) -> String {
        let FrontendPick {
            key,
            counts,
            endpoints,
            count,
        } = self;
        let key = match key {
            FrontendKey::Service => format!("{} daddr . meta l4proto . th dport", f.nft()),
            FrontendKey::NodePort => "meta l4proto . th dport".to_owned(),
        };
        // The count has no type nft knows in this place: it prints its
        // bytes (host order) as a big-endian number.
        format!(
            "{key} map @{counts} {:#x} [invalid type] dnat {} to {key} . numgen random mod {count} map @{endpoints}",
            u32::from_be_bytes(count.to_ne_bytes()),
            f.nft()
        )
    }

    /// Registers: the frontend key from the first, the slot right after it
    /// (so `key . slot` is one key), the count after the slot; the
    /// endpoint's address from there on (the count is read by then), its
    /// port next.
    fn encode(&self, a: &mut Attrs, f: Family) {
        let first = REG32_00;
        let slot = match self.key {
            FrontendKey::Service => service_key(a, f) + regs(f.addr_len()) + 2,
            FrontendKey::NodePort => {
                meta_load(a, META_L4PROTO, first);
                payload(a, first + 1, BASE_TRANSPORT, 2, 2);
                first + 2
            }
        };
        let count = slot + 1;
        lookup(a, &self.counts, first, Some(count), false);
        cmp(a, count, CMP_EQ, &self.count.to_ne_bytes());
        a.expr("numgen", |e| {
            e.be32(1, slot)
                .be32(2, self.count)
                .be32(3, NG_RANDOM)
                .be32(4, 0);
        });
        let addr = slot + 1;
        let port = addr + regs(f.addr_len());
        lookup(a, &self.endpoints, first, Some(addr), false);
        dnat(a, f, addr, port);
    }
}

fn prefix_mask(len: usize, prefix: u8) -> Vec<u8> {
    let mut mask = vec![0u8; len];
    let mut bits = usize::from(prefix);
    for b in mask.iter_mut() {
        let take = bits.min(8);
        *b = if take == 0 { 0 } else { 0xffu8 << (8 - take) };
        bits -= take;
    }
    mask
}

/// A verdict-map key's bytes: each part padded to a 4-byte register.
pub fn key_bytes(parts: &[KeyPart]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        let start = out.len();
        match p {
            KeyPart::Addr(ip) => out.extend(addr_bytes(ip)),
            KeyPart::Proto(p) => out.push(*p),
            KeyPart::Port(port) => out.extend(port.to_be_bytes()),
            KeyPart::Mark(n) => out.extend(n.to_ne_bytes()),
        }
        while !(out.len() - start).is_multiple_of(4) {
            out.push(0);
        }
    }
    out
}

/// The text of a key, as `nft list` prints it (`10.96.0.10 . tcp . 80`).
pub fn key_text(parts: &[KeyPart]) -> String {
    let mut s = String::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            s.push_str(" . ");
        }
        let _ = match p {
            KeyPart::Addr(ip) => write!(s, "{ip}"),
            KeyPart::Proto(p) => write!(s, "{}", proto_name(*p)),
            KeyPart::Port(port) => write!(s, "{port}"),
            KeyPart::Mark(n) => write!(s, "{n}"),
        };
    }
    s
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KeyPart {
    Addr(IpAddr),
    Proto(u8),
    Port(u16),
    /// A 32-bit number in host order, as nft's `mark` type and numgen
    /// hold it: endpoint counts and slots.
    Mark(u32),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_render_as_nft_lists_them() {
        let r = Rule::new(
            vec![
                Match::Addr {
                    field: Field::Saddr,
                    negate: true,
                    net: "10.244.0.0/16".parse().unwrap(),
                },
                Match::OneIn(3),
                Match::L4Proto(6),
            ],
            vec![Stmt::Dnat("10.244.1.11".parse().unwrap(), 8080)],
        );
        assert_eq!(
            r.text(Family::V4),
            "ip saddr != 10.244.0.0/16 numgen random mod 3 0 meta l4proto tcp dnat to 10.244.1.11:8080"
        );
        let v6 = Rule::new(
            vec![Match::L4Proto(17)],
            vec![Stmt::Dnat("fd00::1".parse().unwrap(), 53)],
        );
        assert_eq!(v6.text(Family::V6), "meta l4proto udp dnat to [fd00::1]:53");
    }

    #[test]
    fn keys_pad_every_part_to_a_register() {
        let parts = [
            KeyPart::Addr("10.96.0.10".parse().unwrap()),
            KeyPart::Proto(6),
            KeyPart::Port(80),
        ];
        assert_eq!(key_bytes(&parts), [10, 96, 0, 10, 6, 0, 0, 0, 0, 80, 0, 0]);
        assert_eq!(key_text(&parts), "10.96.0.10 . tcp . 80");
        assert_eq!(prefix_mask(4, 12), [255, 240, 0, 0]);
    }

    #[test]
    fn a_prefix_match_masks_before_comparing() {
        let net: Cidr = "10.0.0.0/8".parse().unwrap();
        let r = Rule::new(
            vec![Match::Addr {
                field: Field::Daddr,
                negate: false,
                net,
            }],
            vec![],
        );
        let names: Vec<String> = super::super::nlsock::attrs(&r.encode(Family::V4).buf)
            .iter()
            .map(|(_, e)| {
                let inner = super::super::nlsock::attrs(e);
                String::from_utf8_lossy(inner[0].1)
                    .trim_end_matches('\0')
                    .to_owned()
            })
            .collect();
        assert_eq!(names, ["payload", "bitwise", "cmp"]);
    }
}
