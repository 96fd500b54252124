//! tc (TCX) programs for node-external traffic: node ports on the node's
//! addresses, external IPs and load-balancer IPs, for packets that arrive
//! on a node interface (socket-LB only sees sockets on the node).
//!
//! * `ekp_tc_ingress`, on every interface holding a node address:
//!   - a packet of a known flow (`EKP_CT`, by its 5-tuple as it arrives)
//!     is rewritten to the tuple recorded for it;
//!   - the first packet to a frontend (`EKP_SERVICES` entries of scope
//!     external, whose backends already follow externalTrafficPolicy)
//!     passes the loadBalancerSourceRanges check, picks a backend (ClientIP
//!     affinity first), records both directions in `EKP_CT` and is
//!     rewritten: DNAT only for a backend on this node (the stack forwards
//!     it, the reply leaves through `ekp_tc_egress`), DNAT plus SNAT to the
//!     node's address on the interface towards a remote backend, forwarded
//!     by FIB lookup and redirect, as is the reply (the stack would drop a
//!     packet carrying its own address as source as a martian).
//! * `ekp_tc_egress`: replies of local backends leaving the node get the
//!   frontend's address and port back.
//!
//! * A new flow to a frontend of a service without any usable endpoint is
//!   refused with a TCP RST or an ICMP port unreachable ([`reject`]).
//!
//! * Fragments of a translated datagram are translated with it ([`frag`]);
//!   ICMP / ICMPv6 errors about a translated flow are translated back,
//!   quote included, in either direction ([`icmp`]).
//!
//! Anything else is passed on untouched (`TCX_NEXT`, so later programs on
//! the hook still run). IPv6 extension headers other than a fragment
//! header right after the fixed header are passed on too; SCTP is not
//! translated here (its CRC32c covers the ports and cannot be patched
//! incrementally). Checksums are patched incrementally.

use aya_ebpf::{
    bindings::{
        bpf_fib_lookup as FibParams, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS,
        BPF_FIB_LOOKUP_SKIP_NEIGH, BPF_F_MARK_MANGLED_0, BPF_F_NO_COMMON_LRU, BPF_F_NO_PREALLOC, BPF_F_PSEUDO_HDR, BPF_NOEXIST,
        BPF_F_RECOMPUTE_CSUM, TC_ACT_SHOT,
    },
    helpers::generated::{
        bpf_csum_diff, bpf_fib_lookup, bpf_get_prandom_u32, bpf_ktime_get_ns, bpf_redirect_neigh,
    },
    macros::{classifier, map},
    maps::{lpm_trie::Key, HashMap, LpmTrie, LruHashMap, PerCpuArray},
    programs::TcContext,
};
use proxy_common::{
    AffinityValue, Backend, CtKey, CtValue, ExtAffinityKey, IfaceValue, ServiceKey, ServiceValue,
    SrcRangeKey,
    BACKEND_F_LOCAL, CT_F_CLOSING, CT_F_ORIGINAL, CT_F_REDIRECT, CT_TIMEOUT_OTHER, CT_TIMEOUT_TCP,
    CT_TIMEOUT_TCP_CLOSING, EXT_STAT_COUNT, FAMILY_V4, FAMILY_V6, MAX_AFFINITY, MAX_CT, MAX_IFACES,
    MAX_SRC_RANGES, PROTO_TCP, PROTO_UDP, SCOPE_EXTERNAL, SNAT_PORT_MAX, SNAT_PORT_MIN, SRC_RANGE_FRONTEND_BITS,
    STAT_EXT_NO_BACKEND, STAT_EXT_REJECTED, STAT_EXT_SOURCE_DENIED, STAT_EXT_TRANSLATED, STAT_EXT_TTL_EXCEEDED,
    STAT_EXT_UNROUTABLE, SVC_FLAG_AFFINITY, SVC_FLAG_REJECT, SVC_FLAG_SOURCE_RANGES,
};

use crate::{random_slot, EKP_BACKENDS, EKP_SERVICES, NSEC_PER_SEC};

mod frag;
mod icmp;
mod reject;

#[inline(always)]
fn count(stat: u32) {
    if let Some(p) = EKP_EXT_STATS.get_ptr_mut(stat) {
        // SAFETY: a per-CPU array slot belongs to this CPU while the
        // program runs, so this is no data race.
        unsafe { *p += 1 };
    }
}

#[map]
// Per-CPU LRU lists: a new flow's inserts take no lock shared by the CPUs.
static EKP_CT: LruHashMap<CtKey, CtValue> = LruHashMap::pinned(MAX_CT, BPF_F_NO_COMMON_LRU);

#[map]
static EKP_IFACES: HashMap<u32, IfaceValue> = HashMap::pinned(MAX_IFACES, 0);

#[map]
pub(crate) static EKP_SRC_RANGES: LpmTrie<SrcRangeKey, u8> =
    LpmTrie::pinned(MAX_SRC_RANGES, BPF_F_NO_PREALLOC);

#[map]
static EKP_EXT_STATS: PerCpuArray<u64> = PerCpuArray::pinned(EXT_STAT_COUNT, 0);

#[map]
static EKP_EXT_AFFINITY: LruHashMap<ExtAffinityKey, AffinityValue> =
    LruHashMap::pinned(MAX_AFFINITY, 0);

/// TCX verdict: continue with the next program on the hook (the packet is
/// passed on when there is none).
const TCX_NEXT: i32 = -1;
const DROP: i32 = TC_ACT_SHOT as i32;

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const IPV4_TTL: usize = ETH_HLEN + 8;
const IPV4_CSUM: usize = ETH_HLEN + 10;
const IPV6_HOP_LIMIT: usize = ETH_HLEN + 7;
const IPV4_SADDR: usize = ETH_HLEN + 12;
const IPV4_DADDR: usize = ETH_HLEN + 16;
const IPV6_SADDR: usize = ETH_HLEN + 8;
const IPV6_DADDR: usize = ETH_HLEN + 24;
const IPV6_HLEN: usize = 40;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
const TCP_FIN: u8 = 0x01;
const TCP_RST: u8 = 0x04;
/// Bytes of the `bpf_fib_lookup` parameters the kernel reads.
const FIB_PARAMS_LEN: i32 = core::mem::size_of::<FibParams>() as i32;
/// How many source ports SNAT tries before it gives up on a flow.
const SNAT_PORT_TRIES: u32 = 8;
/// A conntrack entry's last-seen time is written at most this often.
const CT_REFRESH_NS: u64 = NSEC_PER_SEC;

/// A packet's addresses and ports as found on the wire (network order).
#[derive(Clone, Copy)]
struct Pkt {
    family: u8,
    proto: u8,
    /// Offset of the L4 header.
    l4: usize,
    saddr: [u32; 4],
    daddr: [u32; 4],
    sport: u16,
    dport: u16,
    /// TCP: the flags; ICMP / ICMPv6: the type.
    tcp_flags: u8,
    /// [`FRAG_NONE`], [`FRAG_FIRST`] or [`FRAG_LATER`] (no L4 header: the
    /// ports are 0 until [`frag::place`] finds them).
    frag: u8,
    /// A fragment's identification (IPv4: 16 bits, as read), else 0.
    frag_id: u32,
}

/// `Pkt::frag`: not a fragment.
const FRAG_NONE: u8 = 0;
/// `Pkt::frag`: the first fragment of a datagram (it has the L4 header).
const FRAG_FIRST: u8 = 1;
/// `Pkt::frag`: a later fragment.
const FRAG_LATER: u8 = 2;
/// IPv6 fragment header.
const IPPROTO_FRAGMENT: u8 = 44;

/// What a packet is rewritten to.
#[derive(Clone, Copy)]
struct Tuple {
    saddr: [u32; 4],
    daddr: [u32; 4],
    sport: u16,
    dport: u16,
}

/// Reads packet bytes at an offset from the Ethernet header.
trait PacketReader {
    fn get<T: Copy>(&self, off: usize) -> Option<T>;
}

/// Direct packet access: plain loads, checked against `data_end` (what
/// the verifier asks). Only the linear part of the packet is there.
struct Direct {
    start: usize,
    end: usize,
}

impl PacketReader for Direct {
    #[inline(always)]
    fn get<T: Copy>(&self, off: usize) -> Option<T> {
        if self.start + off + core::mem::size_of::<T>() > self.end {
            return None;
        }
        // SAFETY: the bytes were checked to lie within the packet.
        Some(unsafe { core::ptr::read_unaligned((self.start + off) as *const T) })
    }
}

/// `bpf_skb_load_bytes`: also reads headers outside the linear part.
struct Copied<'a>(&'a TcContext);

impl PacketReader for Copied<'_> {
    #[inline(always)]
    fn get<T: Copy>(&self, off: usize) -> Option<T> {
        self.0.load(off).ok()
    }
}

/// The packet's addresses and ports, by direct access (a few loads, the
/// per-packet cost of traffic that is no service's), or with helper calls
/// when the headers are not all in the linear part. Out of line, so that
/// its temporaries do not stay in the program's own frame, at the top of
/// every call chain.
#[inline(never)]
fn parse(ctx: &TcContext) -> Option<Pkt> {
    let direct = Direct {
        start: ctx.data(),
        end: ctx.data_end(),
    };
    match parse_with(&direct) {
        Some(p) => Some(p),
        None => parse_with(&Copied(ctx)),
    }
}

#[inline(always)]
fn parse_with<R: PacketReader>(r: &R) -> Option<Pkt> {
    let eth_proto = u16::from_be(r.get::<u16>(12)?);
    let (family, proto, l4, saddr, daddr, frag, frag_id) = if eth_proto == ETH_P_IP {
        let vihl: u8 = r.get(ETH_HLEN)?;
        let ihl = ((vihl & 0x0f) as usize) * 4;
        if vihl >> 4 != 4 || ihl < 20 {
            return None;
        }
        // A fragment offset, or more fragments to come.
        let fragw = u16::from_be(r.get::<u16>(ETH_HLEN + 6)?);
        let (frag, id) = if fragw & 0x1fff != 0 {
            (FRAG_LATER, r.get::<u16>(ETH_HLEN + 4)? as u32)
        } else if fragw & 0x2000 != 0 {
            (FRAG_FIRST, r.get::<u16>(ETH_HLEN + 4)? as u32)
        } else {
            (FRAG_NONE, 0)
        };
        let proto: u8 = r.get(ETH_HLEN + 9)?;
        let s: u32 = r.get(IPV4_SADDR)?;
        let d: u32 = r.get(IPV4_DADDR)?;
        (
            FAMILY_V4,
            proto,
            ETH_HLEN + ihl,
            [s, 0, 0, 0],
            [d, 0, 0, 0],
            frag,
            id,
        )
    } else if eth_proto == ETH_P_IPV6 {
        let mut proto: u8 = r.get(ETH_HLEN + 6)?;
        let s: [u32; 4] = r.get(IPV6_SADDR)?;
        let d: [u32; 4] = r.get(IPV6_DADDR)?;
        let mut l4 = ETH_HLEN + IPV6_HLEN;
        let (mut frag, mut id) = (FRAG_NONE, 0);
        if proto == IPPROTO_FRAGMENT {
            // Next header, reserved, offset (13 bits) and M, identification.
            let fh: [u8; 4] = r.get(l4)?;
            let offw = u16::from_be_bytes([fh[2], fh[3]]);
            id = r.get::<u32>(l4 + 4)?;
            proto = fh[0];
            l4 += 8;
            if offw & 0xfff8 != 0 {
                frag = FRAG_LATER;
            } else if offw & 1 != 0 {
                frag = FRAG_FIRST;
            }
        }
        (FAMILY_V6, proto, l4, s, d, frag, id)
    } else {
        return None;
    };
    let icmp = if family == FAMILY_V4 {
        icmp::IPPROTO_ICMP
    } else {
        icmp::IPPROTO_ICMPV6
    };
    let (ports, tcp_flags) = if proto == icmp && frag == FRAG_NONE {
        // Only errors (their quote names a flow); the rest costs nothing.
        // Type and code: a read of one byte at a variable offset compiles
        // to a bounds check the verifier does not follow.
        let ty = r.get::<[u8; 2]>(l4)?[0];
        if !icmp::is_error(family, ty) {
            return None;
        }
        ([0, 0], ty)
    } else if proto != PROTO_TCP && proto != PROTO_UDP {
        return None;
    } else if frag == FRAG_LATER {
        ([0, 0], 0)
    } else if proto == PROTO_TCP {
        (r.get::<[u16; 2]>(l4)?, r.get::<u8>(l4 + 13)?)
    } else {
        (r.get::<[u16; 2]>(l4)?, 0)
    };
    Some(Pkt {
        family,
        proto,
        l4,
        saddr,
        daddr,
        sport: ports[0],
        dport: ports[1],
        tcp_flags,
        frag,
        frag_id,
    })
}

#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: helper without arguments.
    unsafe { bpf_ktime_get_ns() }
}

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
fn route(ctx: &TcContext, p: &Pkt, src: &[u32; 4], dst: &[u32; 4]) -> u32 {
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
fn forward(ctx: &TcContext, p: &Pkt, src: &[u32; 4], dst: &[u32; 4]) -> i32 {
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
fn hop_limit(ctx: &TcContext, p: &Pkt) -> Option<u8> {
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
fn decrement_hop_limit(ctx: &TcContext, p: &Pkt) -> Option<()> {
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
fn translate(ctx: &TcContext, p: &Pkt, t: &Tuple, flags: u8) -> i32 {
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

/// A packet of a tracked flow: translated as its entry says. `None` when
/// the flow is not tracked (or its entry has expired).
#[inline(never)]
fn known_flow(ctx: &TcContext, p: &Pkt, now: u64, egress: bool) -> Option<i32> {
    let v = ct_lookup(p, now)?;
    let t = Tuple {
        saddr: v.saddr,
        daddr: v.daddr,
        sport: v.sport,
        dport: v.dport,
    };
    let forwarded = v.flags & (CT_F_ORIGINAL | CT_F_REDIRECT) != 0;
    // Ingress: the client's direction, and replies of remote backends
    // (behind SNAT). Replies of local backends are translated on their way
    // out (egress): on ingress of a pod-facing interface the stack would
    // drop them, with the node's address as source.
    if forwarded == egress {
        return Some(TCX_NEXT);
    }
    Some(translate(ctx, p, &t, v.flags))
}

#[inline(always)]
fn ct_key(p: &Pkt) -> CtKey {
    CtKey {
        saddr: p.saddr,
        daddr: p.daddr,
        sport: p.sport,
        dport: p.dport,
        proto: p.proto,
        family: p.family,
        _pad: 0,
    }
}

/// The live conntrack entry of a packet, refreshed; `None` when there is
/// none or it has been idle longer than its timeout.
#[inline(always)]
fn ct_lookup(p: &Pkt, now: u64) -> Option<CtValue> {
    let ptr = EKP_CT.get_ptr_mut(ct_key(p))?;
    // SAFETY: a pointer into an LRU map value; the entry may be updated
    // concurrently by another CPU, which at worst loses a refresh.
    let v = unsafe { &mut *ptr };
    let timeout = if p.proto != PROTO_TCP {
        CT_TIMEOUT_OTHER
    } else if v.flags & CT_F_CLOSING != 0 {
        CT_TIMEOUT_TCP_CLOSING
    } else {
        CT_TIMEOUT_TCP
    };
    let idle = now.wrapping_sub(v.last_seen_ns);
    if idle > timeout as u64 * NSEC_PER_SEC {
        return None;
    }
    if idle > CT_REFRESH_NS {
        v.last_seen_ns = now;
    }
    if p.tcp_flags & (TCP_FIN | TCP_RST) != 0 {
        v.flags |= CT_F_CLOSING;
    }
    Some(*v)
}

/// loadBalancerSourceRanges: whether the client may reach the frontend.
#[inline(always)]
fn source_allowed(p: &Pkt) -> bool {
    let key = Key::new(
        SRC_RANGE_FRONTEND_BITS + 128,
        SrcRangeKey {
            addr: p.daddr,
            port: p.dport,
            proto: p.proto,
            family: p.family,
            src: p.saddr,
        },
    );
    EKP_SRC_RANGES.get(key).is_some()
}

/// The backend of a new flow: the client's ClientIP-affinity backend if it
/// is still live, else a random slot.
#[inline(never)]
fn pick(p: &Pkt, key: &ServiceKey, hdr: &ServiceValue, now: u64) -> Option<(u32, Backend)> {
    let (count_, flags, timeout_s, service_id) =
        (hdr.count, hdr.flags, hdr.affinity_timeout, hdr.service_id);
    // Checked by the caller too, but this function is out of line: without
    // it the modulo below would keep a panic path the verifier rejects.
    if count_ == 0 {
        return None;
    }
    let akey = ExtAffinityKey {
        client: p.saddr,
        service_id,
        family: p.family,
        _pad: [0; 3],
    };
    let affinity = flags & SVC_FLAG_AFFINITY != 0;
    if affinity {
        // SAFETY: the value is copied out at once.
        if let Some(v) = unsafe { EKP_EXT_AFFINITY.get(&akey) } {
            let (id, last) = (v.backend_id, v.last_used_ns);
            if now.wrapping_sub(last) <= timeout_s as u64 * NSEC_PER_SEC {
                // SAFETY: the value is copied out at once.
                if let Some(be) = unsafe { EKP_BACKENDS.get(&id) } {
                    return Some((id, *be));
                }
            }
        }
    }
    let id = random_slot(key, hdr.backend_count())?;
    // SAFETY: the value is copied out at once.
    let be = *unsafe { EKP_BACKENDS.get(&id) }?;
    if affinity {
        let value = AffinityValue {
            backend_id: id,
            _pad: 0,
            last_used_ns: now,
        };
        let _ = EKP_EXT_AFFINITY.insert(&akey, &value, 0);
    }
    Some((id, be))
}

/// The node's address on `ifindex` of `family`, if it has one.
#[inline(always)]
fn iface_addr(ifindex: u32, family: u8) -> Option<[u32; 4]> {
    // SAFETY: the value is copied out at once.
    let v = unsafe { EKP_IFACES.get(&ifindex) }?;
    if family == FAMILY_V4 {
        (v.v4 != 0).then_some([v.v4, 0, 0, 0])
    } else {
        (v.v6[0] | v.v6[1] | v.v6[2] | v.v6[3] != 0).then_some(v.v6)
    }
}

/// A new flow as picked: where its packets go and as whom.
struct Flow {
    backend: [u32; 4],
    /// The client, or the node's address with SNAT.
    src: [u32; 4],
    backend_port: u16,
    /// The source port towards the backend (network order): asked for on
    /// the way in (the client's own, or 0 for any), the one recorded on the
    /// way out.
    sport: u16,
    /// `CT_F_REDIRECT` with SNAT, else 0.
    redirect: u8,
    backend_id: u32,
    service_id: u32,
    now: u64,
}

/// Records both directions of a new flow in `EKP_CT`, the reply first (a
/// reply must never find its flow missing). The reply entry is inserted
/// only where none is (`BPF_NOEXIST`), which also picks the source port:
/// the one asked for if no other flow's reply holds that tuple, else one
/// of `SNAT_PORT_MIN..=SNAT_PORT_MAX` (a client reusing its port towards
/// another frontend of the same backend is remapped, as netfilter's NAT
/// would). One map operation per try, no lookup before it.
#[inline(never)]
fn record(p: &Pkt, f: &mut Flow) -> bool {
    // One key and one value, rewritten in place between the inserts: this
    // frame sits at the bottom of the deepest call chain.
    let mut key = CtKey {
        saddr: f.backend,
        daddr: f.src,
        sport: f.backend_port,
        dport: f.sport,
        proto: p.proto,
        family: p.family,
        _pad: 0,
    };
    let mut value = CtValue {
        saddr: p.daddr,
        daddr: p.saddr,
        sport: p.dport,
        dport: p.sport,
        flags: f.redirect,
        _pad: [0; 3],
        last_seen_ns: f.now,
        backend_id: 0,
        service_id: f.service_id,
    };
    // SAFETY: helper without arguments.
    let seed = unsafe { bpf_get_prandom_u32() };
    let span = (SNAT_PORT_MAX - SNAT_PORT_MIN) as u32 + 1;
    let mut recorded = false;
    for i in 0..SNAT_PORT_TRIES + 1 {
        if i > 0 || key.dport == 0 {
            let host = SNAT_PORT_MIN as u32 + seed.wrapping_add(i.wrapping_mul(7919)) % span;
            key.dport = (host as u16).to_be();
        }
        if EKP_CT.insert(&key, &value, BPF_NOEXIST as u64).is_ok() {
            recorded = true;
            break;
        }
    }
    if !recorded {
        return false;
    }
    f.sport = key.dport;
    key.saddr = p.saddr;
    key.daddr = p.daddr;
    key.sport = p.sport;
    key.dport = p.dport;
    value.saddr = f.src;
    value.daddr = f.backend;
    value.sport = f.sport;
    value.dport = f.backend_port;
    value.flags = f.redirect | CT_F_ORIGINAL;
    value.backend_id = f.backend_id;
    EKP_CT.insert(&key, &value, 0).is_ok()
}

/// The first packet of a flow to a frontend: pick, record, translate.
#[inline(never)]
fn new_flow(ctx: &TcContext, p: &Pkt, hdr: &ServiceValue, now: u64) -> i32 {
    let key = frontend_key(p);
    let (flags, service_id) = (hdr.flags, hdr.service_id);
    if flags & SVC_FLAG_SOURCE_RANGES != 0 && !source_allowed(p) {
        count(STAT_EXT_SOURCE_DENIED);
        return DROP;
    }
    let Some((backend_id, be)) = pick(p, &key, hdr, now) else {
        count(STAT_EXT_NO_BACKEND);
        return DROP;
    };
    if be.family != p.family {
        count(STAT_EXT_UNROUTABLE);
        return DROP;
    }

    // A backend on another node is reached with SNAT to the node's address
    // on the interface towards it, so that its replies come back through
    // that interface, where this program reverses them. Without a node
    // address there (or for a local backend), plain DNAT: the replies are
    // routed back through the node and reversed on their way out.
    let out_if = if be.flags & BACKEND_F_LOCAL != 0 {
        0
    } else {
        route(ctx, p, &p.saddr, &be.addr)
    };
    let (src, first, redirect) = match iface_addr(out_if, p.family) {
        None => (p.saddr, p.sport, 0),
        Some(snat) => (snat, 0, CT_F_REDIRECT),
    };
    let mut flow = Flow {
        backend: be.addr,
        src,
        backend_port: be.port,
        sport: first,
        redirect,
        backend_id,
        service_id,
        now,
    };
    if !record(p, &mut flow) {
        count(STAT_EXT_UNROUTABLE);
        return DROP;
    }
    let t = Tuple {
        saddr: src,
        daddr: be.addr,
        sport: flow.sport,
        dport: be.port,
    };
    translate(ctx, p, &t, redirect)
}

/// A new flow to a frontend without endpoints (`count == 0`): refused at
/// once, as kube-proxy does, when the service has none at all; dropped
/// when it has none for traffic from outside (externalTrafficPolicy
/// Local). Called by the program itself, beside [`new_flow`], and out of
/// line, so that the reply's frames stack neither on `new_flow`'s nor in
/// the program's own.
#[inline(never)]
fn no_endpoint(ctx: &TcContext, p: &Pkt, hdr: &ServiceValue, now: u64) -> i32 {
    if hdr.flags & SVC_FLAG_REJECT != 0 {
        count(STAT_EXT_REJECTED);
        return reject::reject(ctx, p, now);
    }
    count(STAT_EXT_NO_BACKEND);
    DROP
}

/// The external-scope header key of the packet's destination.
#[inline(always)]
fn frontend_key(p: &Pkt) -> ServiceKey {
    ServiceKey {
        addr: p.daddr,
        port: p.dport,
        proto: p.proto,
        family: p.family,
        slot: 0,
        scope: SCOPE_EXTERNAL,
        _pad: 0,
    }
}

/// The frontend header of the packet's destination, if it is one.
#[inline(never)]
fn frontend(p: &Pkt) -> Option<ServiceValue> {
    // SAFETY: the value is copied out at once.
    unsafe { EKP_SERVICES.get(&frontend_key(p)) }.copied()
}

#[classifier]
pub fn ekp_tc_ingress(ctx: TcContext) -> i32 {
    let Some(mut p) = parse(&ctx) else {
        return TCX_NEXT;
    };
    let now = now_ns();
    if p.sport == 0 && p.dport == 0 {
        return without_ports(&ctx, &mut p, now, false);
    }
    if let Some(hdr) = frontend(&p) {
        // To a frontend: the client's direction of a tracked flow, or a
        // new one.
        return match known_flow(&ctx, &p, now, false) {
            Some(verdict) => verdict,
            None if hdr.count == 0 => no_endpoint(&ctx, &p, &hdr, now),
            None => new_flow(&ctx, &p, &hdr, now),
        };
    }
    // Replies of remote backends come back to a SNAT port; anything else
    // is no service's and has cost the one lookup above.
    let dport = u16::from_be(p.dport);
    if (SNAT_PORT_MIN..=SNAT_PORT_MAX).contains(&dport) {
        return known_flow(&ctx, &p, now, false).unwrap_or(TCX_NEXT);
    }
    TCX_NEXT
}

#[classifier]
pub fn ekp_tc_egress(ctx: TcContext) -> i32 {
    let Some(mut p) = parse(&ctx) else {
        return TCX_NEXT;
    };
    let now = now_ns();
    if p.sport == 0 && p.dport == 0 {
        return without_ports(&ctx, &mut p, now, true);
    }
    known_flow(&ctx, &p, now, true).unwrap_or(TCX_NEXT)
}

/// A packet without ports of its own: an ICMP error (translated when it is
/// about a tracked flow), a later fragment (translated as its flow when
/// its first fragment was), or a datagram to port 0 (no service's). One
/// lookup when it is no service's.
#[inline(always)]
fn without_ports(ctx: &TcContext, p: &mut Pkt, now: u64, egress: bool) -> i32 {
    if p.proto != PROTO_TCP && p.proto != PROTO_UDP {
        return icmp::error(ctx, p, now, egress);
    }
    if p.frag == FRAG_LATER && frag::place(p) {
        return known_flow(ctx, p, now, egress).unwrap_or(TCX_NEXT);
    }
    TCX_NEXT
}
