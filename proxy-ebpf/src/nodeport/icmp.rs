//! ICMP / ICMPv6 errors about translated flows (destination unreachable —
//! fragmentation needed, port and host unreachable among them —, packet
//! too big, time exceeded, parameter problem), in either direction. An
//! error quotes the packet it is about as that packet was on the wire
//! where it failed, i.e. translated; the flow's `EKP_CT` entry for packets
//! travelling the way the error does is the one of the quoted tuple
//! reversed. The error is rewritten as a packet of that direction would
//! be — outer addresses to the entry's — and its quote back to what the
//! other side sent or expects: the quoted source becomes the entry's
//! destination, the quoted destination its source. So a client learns the
//! path MTU towards its backend and that the backend refused a datagram,
//! about the flow it knows (to the frontend), and a backend learns the
//! same about its replies.
//!
//! Checksums: an IPv4 header's checksum is patched with each address, so
//! the quoted header still sums right and, being inside the ICMP message,
//! leaves the ICMP checksum as it was; the quoted L4 checksum is patched
//! when quoted, and the ICMP checksum follows its change and the ports'.
//! ICMPv6 checksums also cover the outer addresses and the quoted IPv6
//! addresses (no header checksum there).

use aya_ebpf::{
    bindings::{BPF_F_PSEUDO_HDR, BPF_F_RECOMPUTE_CSUM},
    helpers::generated::bpf_csum_diff,
    programs::TcContext,
};
use proxy_common::{
    CtKey, CtValue, CT_F_ORIGINAL, CT_F_REDIRECT, CT_TIMEOUT_OTHER, CT_TIMEOUT_TCP, FAMILY_V4,
    PROTO_TCP, PROTO_UDP, STAT_EXT_TRANSLATED, STAT_EXT_TTL_EXCEEDED, STAT_EXT_UNROUTABLE,
};

use super::{
    count, decrement_hop_limit, forward, hop_limit, Pkt, DROP, IPV4_CSUM, IPV4_DADDR, IPV4_SADDR,
    IPV6_DADDR, IPV6_HLEN, IPV6_SADDR, TCX_NEXT,
};
use crate::NSEC_PER_SEC;

pub(super) const IPPROTO_ICMP: u8 = 1;
pub(super) const IPPROTO_ICMPV6: u8 = 58;
const ICMP_HLEN: usize = 8;
/// Offset of the checksum in an ICMP (ICMPv6) header.
const ICMP_CSUM: usize = 2;

/// Whether an ICMP (ICMPv6) type is an error quoting a packet.
#[inline(always)]
pub(super) fn is_error(family: u8, ty: u8) -> bool {
    if family == FAMILY_V4 {
        // Destination unreachable, time exceeded, parameter problem.
        ty == 3 || ty == 11 || ty == 12
    } else {
        // Destination unreachable, packet too big, time exceeded,
        // parameter problem.
        (1..=4).contains(&ty)
    }
}

/// The packet an error quotes: offsets of its IP and L4 headers, its
/// addresses and ports (network order).
struct Quoted {
    l3: usize,
    l4: usize,
    saddr: [u32; 4],
    daddr: [u32; 4],
    sport: u16,
    dport: u16,
    proto: u8,
}

#[inline(always)]
fn quoted(ctx: &TcContext, p: &Pkt) -> Option<Quoted> {
    let l3 = p.l4 + ICMP_HLEN;
    let (proto, l4, saddr, daddr) = if p.family == FAMILY_V4 {
        let vihl: u8 = ctx.load(l3).ok()?;
        let ihl = ((vihl & 0x0f) as usize) * 4;
        // A later fragment quoted has no ports to find its flow by.
        let frag = u16::from_be(ctx.load::<u16>(l3 + 6).ok()?);
        if vihl >> 4 != 4 || ihl < 20 || frag & 0x1fff != 0 {
            return None;
        }
        let s: u32 = ctx.load(l3 + 12).ok()?;
        let d: u32 = ctx.load(l3 + 16).ok()?;
        (
            ctx.load::<u8>(l3 + 9).ok()?,
            l3 + ihl,
            [s, 0, 0, 0],
            [d, 0, 0, 0],
        )
    } else {
        (
            ctx.load::<u8>(l3 + 6).ok()?,
            l3 + IPV6_HLEN,
            ctx.load(l3 + 8).ok()?,
            ctx.load(l3 + 24).ok()?,
        )
    };
    if proto != PROTO_TCP && proto != PROTO_UDP {
        return None;
    }
    let ports: [u16; 2] = ctx.load(l4).ok()?;
    Some(Quoted {
        l3,
        l4,
        saddr,
        daddr,
        sport: ports[0],
        dport: ports[1],
        proto,
    })
}

/// The live entry of the flow `q` is about, for packets travelling the
/// other way (as the error does), not refreshed: an error keeps no flow
/// alive. Out of line (as the rewrites below): the key and the quote's
/// parsing stay off the frame that forwards.
#[inline(never)]
fn entry(ctx: &TcContext, p: &Pkt, now: u64) -> Option<(Quoted, CtValue)> {
    let q = quoted(ctx, p)?;
    let key = CtKey {
        saddr: q.daddr,
        daddr: q.saddr,
        sport: q.dport,
        dport: q.sport,
        proto: q.proto,
        family: p.family,
        _pad: 0,
    };
    // SAFETY: the value is copied out at once.
    let v = *unsafe { super::EKP_CT.get(&key) }?;
    let timeout = if q.proto == PROTO_TCP {
        CT_TIMEOUT_TCP
    } else {
        CT_TIMEOUT_OTHER
    };
    (now.wrapping_sub(v.last_seen_ns) <= timeout as u64 * NSEC_PER_SEC).then_some((q, v))
}

/// An ICMP error: translated when it is about a translated flow and this
/// is the hook that translates that flow's packets of its direction (as
/// in `known_flow`), else passed on. One map lookup.
#[inline(never)]
pub(super) fn error(ctx: &TcContext, p: &Pkt, now: u64, egress: bool) -> i32 {
    let Some((q, v)) = entry(ctx, p, now) else {
        return TCX_NEXT;
    };
    let forwarded = v.flags & (CT_F_ORIGINAL | CT_F_REDIRECT) != 0;
    if forwarded == egress {
        return TCX_NEXT;
    }
    let redirect = v.flags & CT_F_REDIRECT != 0;
    if redirect && !hop_limit(ctx, p).is_some_and(|h| h > 1) {
        count(STAT_EXT_TTL_EXCEEDED);
        return TCX_NEXT;
    }
    if rewrite_quote(ctx, p, &q, &v).is_none()
        || rewrite_outer(ctx, p, &v).is_none()
        || (redirect && decrement_hop_limit(ctx, p).is_none())
    {
        count(STAT_EXT_UNROUTABLE);
        return DROP;
    }
    count(STAT_EXT_TRANSLATED);
    if redirect {
        return forward(ctx, p, &v.saddr, &v.daddr);
    }
    TCX_NEXT
}

/// The sum of the change from `old` to `new` (16 bytes), for
/// `l4_csum_replace` by difference.
#[inline(always)]
fn diff16(old: &[u32; 4], new: &[u32; 4]) -> Option<u64> {
    let mut from = *old;
    let mut to = *new;
    // SAFETY: both buffers are 16-byte arrays on this stack frame.
    let d = unsafe { bpf_csum_diff(from.as_mut_ptr(), 16, to.as_mut_ptr(), 16, 0) };
    (d >= 0).then_some(d as u64)
}

/// The outer addresses become the entry's.
#[inline(never)]
fn rewrite_outer(ctx: &TcContext, p: &Pkt, v: &CtValue) -> Option<()> {
    let icmp_csum = p.l4 + ICMP_CSUM;
    if p.family == FAMILY_V4 {
        for (off, old, new) in [
            (IPV4_SADDR, p.saddr[0], v.saddr[0]),
            (IPV4_DADDR, p.daddr[0], v.daddr[0]),
        ] {
            if old != new {
                ctx.l3_csum_replace(IPV4_CSUM, old as u64, new as u64, 4)
                    .ok()?;
                ctx.store(off, &new, 0).ok()?;
            }
        }
    } else {
        for (off, old, new) in [
            (IPV6_SADDR, &p.saddr, &v.saddr),
            (IPV6_DADDR, &p.daddr, &v.daddr),
        ] {
            let d = diff16(old, new)?;
            ctx.l4_csum_replace(icmp_csum, 0, d, BPF_F_PSEUDO_HDR as u64)
                .ok()?;
            ctx.store(off, new, BPF_F_RECOMPUTE_CSUM as u64).ok()?;
        }
    }
    Some(())
}

/// The quote becomes the packet the other side sent (or expects): source
/// the entry's destination, destination the entry's source.
#[inline(never)]
fn rewrite_quote(ctx: &TcContext, p: &Pkt, q: &Quoted, v: &CtValue) -> Option<()> {
    let icmp_csum = p.l4 + ICMP_CSUM;
    let v4 = p.family == FAMILY_V4;
    // The quoted L4 checksum, when quoted (a UDP one of 0 means none).
    let l4_csum = q.l4 + if q.proto == PROTO_TCP { 16 } else { 6 };
    let before = ctx.load::<u16>(l4_csum).ok();
    if let Some(before) = before.filter(|c| *c != 0 || q.proto == PROTO_TCP) {
        if v4 {
            ctx.l4_csum_replace(l4_csum, q.saddr[0] as u64, v.daddr[0] as u64, 4)
                .ok()?;
            ctx.l4_csum_replace(l4_csum, q.daddr[0] as u64, v.saddr[0] as u64, 4)
                .ok()?;
        } else {
            ctx.l4_csum_replace(l4_csum, 0, diff16(&q.saddr, &v.daddr)?, 0)
                .ok()?;
            ctx.l4_csum_replace(l4_csum, 0, diff16(&q.daddr, &v.saddr)?, 0)
                .ok()?;
        }
        ctx.l4_csum_replace(l4_csum, q.sport as u64, v.dport as u64, 2)
            .ok()?;
        ctx.l4_csum_replace(l4_csum, q.dport as u64, v.sport as u64, 2)
            .ok()?;
        let after: u16 = ctx.load(l4_csum).ok()?;
        ctx.l4_csum_replace(icmp_csum, before as u64, after as u64, 2)
            .ok()?;
    }
    for (off, old, new) in [(0, q.sport, v.dport), (2, q.dport, v.sport)] {
        if old != new {
            ctx.l4_csum_replace(icmp_csum, old as u64, new as u64, 2)
                .ok()?;
            ctx.store(q.l4 + off, &new, 0).ok()?;
        }
    }
    if v4 {
        for (off, old, new) in [(12, q.saddr[0], v.daddr[0]), (16, q.daddr[0], v.saddr[0])] {
            if old != new {
                // The quoted header's own checksum absorbs the change, so
                // the ICMP checksum over it stays right.
                ctx.l3_csum_replace(q.l3 + 10, old as u64, new as u64, 4)
                    .ok()?;
                ctx.store(q.l3 + off, &new, 0).ok()?;
            }
        }
    } else {
        for (off, old, new) in [(8, &q.saddr, &v.daddr), (24, &q.daddr, &v.saddr)] {
            ctx.l4_csum_replace(icmp_csum, 0, diff16(old, new)?, 0)
                .ok()?;
            ctx.store(q.l3 + off, new, 0).ok()?;
        }
    }
    Some(())
}
