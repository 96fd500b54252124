//! Rewriting a packet to a tuple (addresses, ports, checksums), the TTL
//! of a forwarded packet, and forwarding by FIB lookup.

use aya_ebpf::{
    bindings::{
        bpf_fib_lookup as FibParams, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS,
        BPF_FIB_LOOKUP_SKIP_NEIGH, BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, BPF_F_RECOMPUTE_CSUM,
    },
    helpers::generated::{bpf_csum_diff, bpf_fib_lookup, bpf_redirect_neigh},
    programs::TcContext,
};
use proxy_common::{
    CT_F_REDIRECT, FAMILY_V4, PROTO_TCP, PROTO_UDP, STAT_EXT_TRANSLATED, STAT_EXT_TTL_EXCEEDED,
    STAT_EXT_UNROUTABLE,
};

use super::{
    count, frag, Pkt, Tuple, DROP, FRAG_FIRST, FRAG_LATER,
    IPV4_CSUM, IPV4_DADDR, IPV4_SADDR, IPV4_TTL, IPV6_DADDR, IPV6_HOP_LIMIT, IPV6_SADDR, TCX_NEXT,
};

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
/// Bytes of the `bpf_fib_lookup` parameters the kernel reads.
const FIB_PARAMS_LEN: i32 = core::mem::size_of::<FibParams>() as i32;

#[inline(always)]
fn same_addr(a: &[u32; 4], b: &[u32; 4]) -> bool {
    a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3]
}

/// Rewrites one address (at `off`) and patches the checksums.
#[inline(always)]
fn set_addr(ctx: &TcContext, p: &Pkt, off: usize, old: &[u32; 4], new: &[u32; 4]) -> Option<()> {
    if same_addr(old, new) {
        return Some(());
    }
    let l4_csum = l4_csum_offset(p);
    // A later fragment has no L4 header (its datagram's checksum is in the
    // first fragment, patched there).
    let l4 = p.frag != FRAG_LATER;
    if p.family == FAMILY_V4 {
        let (o, n) = (old[0] as u64, new[0] as u64);
        let mangled = if p.proto == PROTO_UDP {
            BPF_F_MARK_MANGLED_0 as u64
        } else {
            0
        };
        if l4 {
            ctx.l4_csum_replace(l4_csum, o, n, BPF_F_PSEUDO_HDR as u64 | mangled | 4)
                .ok()?;
        }
        ctx.l3_csum_replace(IPV4_CSUM, o, n, 4).ok()?;
        ctx.store(off, &new[0], 0).ok()?;
    } else {
        let mut from = *old;
        let mut to = *new;
        // SAFETY: both buffers are 16-byte arrays on this stack frame.
        let diff = unsafe {
            bpf_csum_diff(
                from.as_mut_ptr(),
                16,
                to.as_mut_ptr(),
                16,
                0,
            )
        };
        if diff < 0 {
            return None;
        }
        if l4 {
            ctx.l4_csum_replace(l4_csum, 0, diff as u64, BPF_F_PSEUDO_HDR as u64)
                .ok()?;
        }
        // IPv6 has no header checksum: the stored bytes themselves change
        // the packet's sum, so a CHECKSUM_COMPLETE skb needs it recomputed.
        ctx.store(off, new, BPF_F_RECOMPUTE_CSUM as u64).ok()?;
    }
    Some(())
}

#[inline(always)]
fn l4_csum_offset(p: &Pkt) -> usize {
    if p.proto == PROTO_TCP {
        p.l4 + 16
    } else {
        p.l4 + 6
    }
}

/// Rewrites a port (at `off` in the L4 header) and patches the checksum.
#[inline(always)]
fn set_port(ctx: &TcContext, p: &Pkt, off: usize, old: u16, new: u16) -> Option<()> {
    if old == new || p.frag == FRAG_LATER {
        return Some(());
    }
    let mangled = if p.proto == PROTO_UDP && p.family == FAMILY_V4 {
        BPF_F_MARK_MANGLED_0 as u64
    } else {
        0
    };
    ctx.l4_csum_replace(l4_csum_offset(p), old as u64, new as u64, mangled | 2)
        .ok()?;
    ctx.store(p.l4 + off, &new, 0).ok()
}

/// Rewrites the packet's addresses and ports to `t`.
#[inline(always)]
fn rewrite(ctx: &TcContext, p: &Pkt, t: &Tuple) -> Option<()> {
    let (s_off, d_off) = if p.family == FAMILY_V4 {
        (IPV4_SADDR, IPV4_DADDR)
    } else {
        (IPV6_SADDR, IPV6_DADDR)
    };
    set_addr(ctx, p, s_off, &p.saddr, &t.saddr)?;
    set_addr(ctx, p, d_off, &p.daddr, &t.daddr)?;
    set_port(ctx, p, 0, p.sport, t.sport)?;
    set_port(ctx, p, 2, p.dport, t.dport)
}

/// FIB lookup towards `dst`: the egress interface, or 0 without a route. Out of line (here and below): the verifier allows 512 bytes of
/// stack for the whole call chain, and each BPF-to-BPF call gets its own
/// frame, so the phases of a new flow do not pile up in one frame.
#[inline(never)]
pub(super) fn route(ctx: &TcContext, p: &Pkt, src: &[u32; 4], dst: &[u32; 4]) -> u32 {
    let (family, proto) = (p.family, p.proto);
    // SAFETY: an all-zero bpf_fib_lookup is a valid input (plain integers).
    let mut params: FibParams = unsafe { core::mem::zeroed() };
    params.family = if family == FAMILY_V4 { AF_INET } else { AF_INET6 };
    params.l4_protocol = proto;
    // SAFETY: the context is a valid __sk_buff for the program's lifetime.
    params.ifindex = unsafe { (*ctx.skb.skb).ifindex };
    if family == FAMILY_V4 {
        params.__bindgen_anon_3.ipv4_src = src[0];
        params.__bindgen_anon_4.ipv4_dst = dst[0];
    } else {
        params.__bindgen_anon_3.ipv6_src = *src;
        params.__bindgen_anon_4.ipv6_dst = *dst;
    }
    // SAFETY: params is a stack buffer of the size passed.
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.skb.skb as *mut _,
            &mut params,
            FIB_PARAMS_LEN,
            BPF_FIB_LOOKUP_SKIP_NEIGH,
        )
    };
    if rc == BPF_FIB_LKUP_RET_SUCCESS as i64 || rc == BPF_FIB_LKUP_RET_NO_NEIGH as i64 {
        params.ifindex
    } else {
        0
    }
}

/// Sends a rewritten packet out of the interface its destination routes
/// through, resolving the neighbour there.
#[inline(always)]
pub(super) fn forward(ctx: &TcContext, p: &Pkt, src: &[u32; 4], dst: &[u32; 4]) -> i32 {
    let ifindex = route(ctx, p, src, dst);
    if ifindex == 0 {
        count(STAT_EXT_UNROUTABLE);
        return DROP;
    }
    // SAFETY: no neighbour parameters: the kernel resolves the next hop.
    unsafe { bpf_redirect_neigh(ifindex, core::ptr::null_mut(), 0, 0) as i32 }
}

/// The TTL (IPv4) or hop limit (IPv6) of the packet.
#[inline(always)]
pub(super) fn hop_limit(ctx: &TcContext, p: &Pkt) -> Option<u8> {
    let off = if p.family == FAMILY_V4 {
        IPV4_TTL
    } else {
        IPV6_HOP_LIMIT
    };
    ctx.load::<u8>(off).ok()
}

/// Decrements the TTL (hop limit) as a router does, patching the IPv4
/// header checksum. The caller checked that it is above 1.
#[inline(always)]
pub(super) fn decrement_hop_limit(ctx: &TcContext, p: &Pkt) -> Option<()> {
    if p.family == FAMILY_V4 {
        // The TTL and protocol bytes as one 16-bit word of the header
        // checksum, in memory order: the TTL is the first byte.
        let old: [u8; 2] = ctx.load(IPV4_TTL).ok()?;
        let new = [old[0].wrapping_sub(1), old[1]];
        let (o, n) = (u16::from_ne_bytes(old), u16::from_ne_bytes(new));
        ctx.l3_csum_replace(IPV4_CSUM, o as u64, n as u64, 2).ok()?;
        ctx.store(IPV4_TTL, &new, 0).ok()
    } else {
        let hl: u8 = ctx.load(IPV6_HOP_LIMIT).ok()?;
        ctx.store(IPV6_HOP_LIMIT, &hl.wrapping_sub(1), BPF_F_RECOMPUTE_CSUM as u64)
            .ok()
    }
}

/// Rewrites a packet to `t`; forwards it itself with `CT_F_REDIRECT` in
/// `flags`, as a router: its TTL (hop limit) is decremented, and a packet
/// whose TTL would run out is handed to the stack untranslated instead
/// (which answers time exceeded for what it would forward).
#[inline(never)]
pub(super) fn translate(ctx: &TcContext, p: &Pkt, t: &Tuple, flags: u8) -> i32 {
    let redirect = flags & CT_F_REDIRECT != 0;
    if redirect && !hop_limit(ctx, p).is_some_and(|h| h > 1) {
        count(STAT_EXT_TTL_EXCEEDED);
        return TCX_NEXT;
    }
    if rewrite(ctx, p, t).is_none() || (redirect && decrement_hop_limit(ctx, p).is_none()) {
        count(STAT_EXT_UNROUTABLE);
        return DROP;
    }
    count(STAT_EXT_TRANSLATED);
    if p.frag == FRAG_FIRST {
        frag::remember(p);
    }
    if redirect {
        return forward(ctx, p, &t.saddr, &t.daddr);
    }
    TCX_NEXT
}
