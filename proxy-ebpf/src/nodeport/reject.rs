//! Refusing a new flow to a frontend without any usable endpoint, as
//! kube-proxy's REJECT rule does: the packet itself becomes the answer (a
//! TCP RST, or an ICMP / ICMPv6 port unreachable quoting the datagram's
//! headers for UDP), rewritten in place and sent back out of the interface
//! it arrived on. Replies are rate-limited per source with a token bucket
//! in `EKP_REJECT_RATE`, so a flood of new flows does not turn into a flood
//! of replies; a limited packet is dropped.
//!
//! Every header of the reply is written whole from this stack and its
//! checksums computed from scratch, so nothing depends on the original's
//! options or payload: an IPv4 packet with options is dropped instead
//! (its quoted header would need them).

use aya_ebpf::{
    bindings::{BPF_F_RECOMPUTE_CSUM, TC_ACT_SHOT},
    helpers::generated::{bpf_csum_diff, bpf_redirect, bpf_skb_change_tail},
    macros::map,
    maps::LruHashMap,
    programs::TcContext,
};
use proxy_common::{
    RejectKey, RejectTokens, FAMILY_V4, MAX_REJECT_SOURCES, PROTO_TCP, REJECT_BURST,
    REJECT_INTERVAL_NS,
};

use super::{Pkt, ETH_HLEN, ETH_P_IP, ETH_P_IPV6, IPV6_HLEN, TCP_RST};

#[map]
static EKP_REJECT_RATE: LruHashMap<RejectKey, RejectTokens> =
    LruHashMap::pinned(MAX_REJECT_SOURCES, 0);

const DROP: i32 = TC_ACT_SHOT as i32;
const IPV4_HLEN: usize = 20;
const TCP_HLEN: usize = 20;
const ICMP_HLEN: usize = 8;
/// Bytes of the datagram's L4 header an ICMP error quotes (RFC 792).
const QUOTED_L4: usize = 8;
const TCP_F_ACK: u8 = 0x10;
const TCP_F_SYN: u8 = 0x02;
const TCP_F_FIN: u8 = 0x01;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_ICMPV6: u8 = 58;
const REPLY_TTL: u8 = 64;
/// IPv4 "don't fragment".
const IP_DF: u16 = 0x4000;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Ipv4Hdr {
    vihl: u8,
    tos: u8,
    tot_len: u16,
    id: u16,
    frag: u16,
    ttl: u8,
    proto: u8,
    csum: u16,
    saddr: u32,
    daddr: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Ipv6Hdr {
    /// Version, traffic class, flow label.
    vtcfl: u32,
    plen: u16,
    next: u8,
    hop_limit: u8,
    saddr: [u32; 4],
    daddr: [u32; 4],
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct TcpHdr {
    sport: u16,
    dport: u16,
    seq: u32,
    ack: u32,
    doff: u8,
    flags: u8,
    window: u16,
    csum: u16,
    urg: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct IcmpHdr {
    ty: u8,
    code: u8,
    csum: u16,
    unused: u32,
}

/// The IPv6 pseudo-header of the TCP and ICMPv6 checksums (the IPv4 one
/// is its first 12 bytes' equivalent, built in place).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Pseudo6 {
    saddr: [u32; 4],
    daddr: [u32; 4],
    len: u32,
    zero: [u8; 3],
    next: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Pseudo4 {
    saddr: u32,
    daddr: u32,
    zero: u8,
    proto: u8,
    len: u16,
}

/// Adds `T`'s bytes (a multiple of 4) to a running checksum.
#[inline(always)]
fn sum<T>(v: &mut T, seed: i64) -> i64 {
    if seed < 0 {
        return seed;
    }
    // SAFETY: `v` is a stack value of the size passed; the helper only
    // reads it.
    unsafe {
        bpf_csum_diff(
            core::ptr::null_mut(),
            0,
            v as *mut T as *mut u32,
            core::mem::size_of::<T>() as u32,
            seed as u32,
        )
    }
}

/// The Internet checksum of a sum, as stored (network order in memory).
#[inline(always)]
fn fold(sum: i64) -> u16 {
    let mut s = (sum as u64) & 0xffff_ffff;
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    !(s as u16)
}

/// Whether `src` may be sent another reply now (token bucket).
#[inline(always)]
fn allowed(p: &Pkt, now: u64) -> bool {
    let key = RejectKey {
        addr: p.saddr,
        family: p.family,
        _pad: [0; 3],
    };
    let cap = REJECT_BURST * REJECT_INTERVAL_NS;
    match EKP_REJECT_RATE.get_ptr_mut(&key) {
        Some(ptr) => {
            // SAFETY: a pointer into an LRU map value; a concurrent update
            // by another CPU at worst grants one reply too many.
            let v = unsafe { &mut *ptr };
            let elapsed = now.wrapping_sub(v.last_ns);
            let credit = if elapsed >= cap {
                cap
            } else {
                let c = v.credit_ns + elapsed;
                if c > cap {
                    cap
                } else {
                    c
                }
            };
            v.last_ns = now;
            if credit < REJECT_INTERVAL_NS {
                v.credit_ns = credit;
                return false;
            }
            v.credit_ns = credit - REJECT_INTERVAL_NS;
            true
        }
        None => {
            let v = RejectTokens {
                credit_ns: cap - REJECT_INTERVAL_NS,
                last_ns: now,
            };
            let _ = EKP_REJECT_RATE.insert(&key, &v, 0);
            true
        }
    }
}

/// The reply's Ethernet header: the original's with the addresses swapped.
#[inline(always)]
fn eth_reply(ctx: &TcContext, v4: bool) -> Option<[u8; 14]> {
    let orig: [u8; 12] = ctx.load(0).ok()?;
    let proto = if v4 { ETH_P_IP } else { ETH_P_IPV6 }.to_be_bytes();
    let mut e = [0u8; 14];
    let mut i = 0;
    while i < 6 {
        e[i] = orig[i + 6];
        e[i + 6] = orig[i];
        i += 1;
    }
    e[12] = proto[0];
    e[13] = proto[1];
    Some(e)
}

#[inline(always)]
fn ipv4_reply(p: &Pkt, proto: u8, payload: usize) -> Ipv4Hdr {
    let mut ip = Ipv4Hdr {
        vihl: 0x45,
        tos: 0,
        tot_len: ((IPV4_HLEN + payload) as u16).to_be(),
        id: 0,
        frag: IP_DF.to_be(),
        ttl: REPLY_TTL,
        proto,
        csum: 0,
        saddr: p.daddr[0],
        daddr: p.saddr[0],
    };
    ip.csum = fold(sum(&mut ip, 0));
    ip
}

#[inline(always)]
fn ipv6_reply(p: &Pkt, next: u8, payload: usize) -> Ipv6Hdr {
    Ipv6Hdr {
        vtcfl: 0x6000_0000u32.to_be(),
        plen: (payload as u16).to_be(),
        next,
        hop_limit: REPLY_TTL,
        saddr: p.daddr,
        daddr: p.saddr,
    }
}

/// Turns the packet into `len` bytes and sends it back out of the
/// interface it came in on.
#[inline(always)]
fn resize(ctx: &TcContext, len: usize) -> Option<()> {
    // SAFETY: the context's skb; the helper checks the length.
    let rc = unsafe { bpf_skb_change_tail(ctx.skb.skb as *mut _, len as u32, 0) };
    (rc == 0).then_some(())
}

#[inline(always)]
fn bounce(ctx: &TcContext) -> i32 {
    // SAFETY: the context is a valid __sk_buff for the program's lifetime.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    // SAFETY: a plain helper call on the device the packet arrived on.
    unsafe { bpf_redirect(ifindex, 0) as i32 }
}

const STORE: u64 = BPF_F_RECOMPUTE_CSUM as u64;

/// A TCP RST answering the segment (RFC 9293 3.10.7.1: the segment's ACK
/// as sequence number if it has one, else an ACK of everything it used).
#[inline(never)]
fn tcp_reset(ctx: &TcContext, p: &Pkt) -> Option<i32> {
    if p.tcp_flags & TCP_RST != 0 {
        return Some(DROP);
    }
    let v4 = p.family == FAMILY_V4;
    let seq = u32::from_be(ctx.load::<u32>(p.l4 + 4).ok()?);
    let ack = ctx.load::<u32>(p.l4 + 8).ok()?;
    let doff = ((ctx.load::<u8>(p.l4 + 12).ok()? >> 4) as usize) * 4;
    let ip_len = if v4 {
        (u16::from_be(ctx.load::<u16>(ETH_HLEN + 2).ok()?) as usize).checked_sub(p.l4 - ETH_HLEN)?
    } else {
        u16::from_be(ctx.load::<u16>(ETH_HLEN + 4).ok()?) as usize
    };
    let data = ip_len.checked_sub(doff)?;
    let mut tcp = TcpHdr {
        sport: p.dport,
        dport: p.sport,
        doff: ((TCP_HLEN / 4) as u8) << 4,
        ..TcpHdr::default()
    };
    if p.tcp_flags & TCP_F_ACK != 0 {
        tcp.seq = ack;
        tcp.flags = TCP_RST;
    } else {
        let used = data as u32
            + (p.tcp_flags & TCP_F_SYN != 0) as u32
            + (p.tcp_flags & TCP_F_FIN != 0) as u32;
        tcp.ack = seq.wrapping_add(used).to_be();
        tcp.flags = TCP_RST | TCP_F_ACK;
    }
    let eth = eth_reply(ctx, v4)?;
    if v4 {
        let mut ph = Pseudo4 {
            saddr: p.daddr[0],
            daddr: p.saddr[0],
            zero: 0,
            proto: PROTO_TCP,
            len: (TCP_HLEN as u16).to_be(),
        };
        tcp.csum = fold(sum(&mut tcp, sum(&mut ph, 0)));
        let ip = ipv4_reply(p, PROTO_TCP, TCP_HLEN);
        resize(ctx, ETH_HLEN + IPV4_HLEN + TCP_HLEN)?;
        ctx.store(ETH_HLEN, &ip, STORE).ok()?;
        ctx.store(ETH_HLEN + IPV4_HLEN, &tcp, STORE).ok()?;
    } else {
        let mut ph = Pseudo6 {
            saddr: p.daddr,
            daddr: p.saddr,
            len: (TCP_HLEN as u32).to_be(),
            zero: [0; 3],
            next: PROTO_TCP,
        };
        tcp.csum = fold(sum(&mut tcp, sum(&mut ph, 0)));
        let ip = ipv6_reply(p, PROTO_TCP, TCP_HLEN);
        resize(ctx, ETH_HLEN + IPV6_HLEN + TCP_HLEN)?;
        ctx.store(ETH_HLEN, &ip, STORE).ok()?;
        ctx.store(ETH_HLEN + IPV6_HLEN, &tcp, STORE).ok()?;
    }
    ctx.store(0, &eth, STORE).ok()?;
    Some(bounce(ctx))
}

/// An ICMP (ICMPv6) destination unreachable, port unreachable, quoting
/// the datagram's IP header and first 8 bytes of its L4 header.
#[inline(never)]
fn port_unreachable(ctx: &TcContext, p: &Pkt) -> Option<i32> {
    let v4 = p.family == FAMILY_V4;
    let mut l4: [u32; 2] = ctx.load(p.l4).ok()?;
    let eth = eth_reply(ctx, v4)?;
    if v4 {
        if p.l4 != ETH_HLEN + IPV4_HLEN {
            return None;
        }
        let mut inner: Ipv4Hdr = ctx.load(ETH_HLEN).ok()?;
        let mut icmp = IcmpHdr {
            ty: 3,
            code: 3,
            ..IcmpHdr::default()
        };
        icmp.csum = fold(sum(&mut l4, sum(&mut inner, sum(&mut icmp, 0))));
        let len = ICMP_HLEN + IPV4_HLEN + QUOTED_L4;
        let ip = ipv4_reply(p, IPPROTO_ICMP, len);
        resize(ctx, ETH_HLEN + IPV4_HLEN + len)?;
        ctx.store(ETH_HLEN, &ip, STORE).ok()?;
        let at = ETH_HLEN + IPV4_HLEN;
        ctx.store(at, &icmp, STORE).ok()?;
        ctx.store(at + ICMP_HLEN, &inner, STORE).ok()?;
        ctx.store(at + ICMP_HLEN + IPV4_HLEN, &l4, STORE).ok()?;
    } else {
        let mut inner: Ipv6Hdr = ctx.load(ETH_HLEN).ok()?;
        let len = ICMP_HLEN + IPV6_HLEN + QUOTED_L4;
        let mut ph = Pseudo6 {
            saddr: p.daddr,
            daddr: p.saddr,
            len: (len as u32).to_be(),
            zero: [0; 3],
            next: IPPROTO_ICMPV6,
        };
        let mut icmp = IcmpHdr {
            ty: 1,
            code: 4,
            ..IcmpHdr::default()
        };
        icmp.csum = fold(sum(
            &mut l4,
            sum(&mut inner, sum(&mut icmp, sum(&mut ph, 0))),
        ));
        let ip = ipv6_reply(p, IPPROTO_ICMPV6, len);
        resize(ctx, ETH_HLEN + IPV6_HLEN + len)?;
        ctx.store(ETH_HLEN, &ip, STORE).ok()?;
        let at = ETH_HLEN + IPV6_HLEN;
        ctx.store(at, &icmp, STORE).ok()?;
        ctx.store(at + ICMP_HLEN, &inner, STORE).ok()?;
        ctx.store(at + ICMP_HLEN + IPV6_HLEN, &l4, STORE).ok()?;
    }
    ctx.store(0, &eth, STORE).ok()?;
    Some(bounce(ctx))
}

/// Answers a new flow's packet with a refusal (or drops it when its source
/// has used up its replies, or the reply cannot be built).
#[inline(always)]
pub(super) fn reject(ctx: &TcContext, p: &Pkt, now: u64) -> i32 {
    if !allowed(p, now) {
        return DROP;
    }
    let verdict = if p.proto == PROTO_TCP {
        tcp_reset(ctx, p)
    } else {
        port_unreachable(ctx, p)
    };
    verdict.unwrap_or(DROP)
}
