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
    bindings::{BPF_F_NO_COMMON_LRU, BPF_F_NO_PREALLOC, TC_ACT_SHOT},
    helpers::generated::{bpf_ktime_get_coarse_ns, bpf_ktime_get_ns},
    macros::{classifier, map},
    maps::{HashMap, LpmTrie, LruHashMap, PerCpuArray},
    programs::TcContext,
};
use proxy_common::{
    AffinityValue, CtKey, CtValue, ExtAffinityKey, IfaceValue, ServiceKey, ServiceValue,
    SrcRangeKey, EXT_STAT_COUNT, MAX_AFFINITY, MAX_CT, MAX_IFACES, MAX_SRC_RANGES, PROTO_TCP,
    PROTO_UDP, SCOPE_EXTERNAL, SNAT_PORT_MAX, SNAT_PORT_MIN,
};

use crate::{EKP_SERVICES, NSEC_PER_SEC};

mod flow;
mod frag;
mod icmp;
mod parse;
mod reject;
mod rewrite;

use flow::{known_flow, new_flow, no_endpoint};
use parse::parse;
use rewrite::{decrement_hop_limit, forward, hop_limit};

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
const TCP_FIN: u8 = 0x01;
const TCP_RST: u8 = 0x04;
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

/// What a packet is rewritten to.
#[derive(Clone, Copy)]
struct Tuple {
    saddr: [u32; 4],
    daddr: [u32; 4],
    sport: u16,
    dport: u16,
}

/// The clock of conntrack and affinity times.
#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: helper without arguments.
    unsafe { bpf_ktime_get_ns() }
}

/// The clock of a tracked flow's packets: the same CLOCK_MONOTONIC at the
/// resolution of the scheduler tick (the time of the last tick, a few
/// milliseconds behind [`now_ns`] and never ahead of it), read from the
/// timekeeper without reading the clock source, which costs a packet of
/// an established flow far less. Conntrack times are compared in
/// seconds.
#[inline(always)]
fn coarse_now_ns() -> u64 {
    // SAFETY: helper without arguments.
    unsafe { bpf_ktime_get_coarse_ns() }
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
    if p.sport == 0 && p.dport == 0 {
        return without_ports(&ctx, &mut p, false);
    }
    if let Some(hdr) = frontend(&p) {
        // To a frontend: the client's direction of a tracked flow, or a
        // new one.
        return match known_flow(&ctx, &p, false) {
            Some(verdict) => verdict,
            None if hdr.count == 0 => no_endpoint(&ctx, &p, &hdr, now_ns()),
            None => new_flow(&ctx, &p, &hdr, now_ns()),
        };
    }
    // Replies of remote backends come back to a SNAT port; anything else
    // is no service's and has cost the one lookup above (and no clock
    // read: the time is read only for a packet that has a flow).
    let dport = u16::from_be(p.dport);
    if (SNAT_PORT_MIN..=SNAT_PORT_MAX).contains(&dport) {
        return known_flow(&ctx, &p, false).unwrap_or(TCX_NEXT);
    }
    TCX_NEXT
}

#[classifier]
pub fn ekp_tc_egress(ctx: TcContext) -> i32 {
    let Some(mut p) = parse(&ctx) else {
        return TCX_NEXT;
    };
    if p.sport == 0 && p.dport == 0 {
        return without_ports(&ctx, &mut p, true);
    }
    known_flow(&ctx, &p, true).unwrap_or(TCX_NEXT)
}

/// A packet without ports of its own: an ICMP error (translated when it is
/// about a tracked flow), a later fragment (translated as its flow when
/// its first fragment was), or a datagram to port 0 (no service's). One
/// lookup when it is no service's.
#[inline(always)]
fn without_ports(ctx: &TcContext, p: &mut Pkt, egress: bool) -> i32 {
    if p.proto != PROTO_TCP && p.proto != PROTO_UDP {
        return icmp::error(ctx, p, now_ns(), egress);
    }
    if p.frag == FRAG_LATER && frag::place(p) {
        return known_flow(ctx, p, egress).unwrap_or(TCX_NEXT);
    }
    TCX_NEXT
}
