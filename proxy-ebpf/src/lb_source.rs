//! loadBalancerSourceRanges for sockets on the node (pods and hostNetwork
//! processes) that connect to a load-balancer IP.
//!
//! The socket hooks translate at `connect()` / `sendmsg()`, when the socket
//! has no source address yet (it is chosen by the route lookup after the
//! hook), so they cannot check the client against the ranges there. Nor can
//! the hook know a pod's address from its network namespace: the daemon
//! never learns which namespace holds which pod IP. The first packet the
//! socket sends does carry the source, so the check is split in two:
//!
//! * the connect / sendmsg hook, translating a frontend whose header has
//!   `SVC_FLAG_SOURCE_RANGES` (only load-balancer IPs with ranges have it),
//!   records the socket (its cookie) with the frontend and the backend it
//!   chose in `EKP_LB_SOURCE_PENDING` ([`record`]);
//! * `ekp_lb_source_egress`, a `cgroup_skb/egress` program on the same
//!   cgroup, looks each outgoing packet's socket up there. A packet to the
//!   recorded backend whose source `EKP_SRC_RANGES` (the ranges the tc
//!   programs use for the same frontend) allows lets the entry go, so the
//!   socket's later packets cost a missed lookup; a source outside the
//!   ranges is dropped, as kube-proxy drops it, with the entry kept, so
//!   every retransmitted SYN (or datagram) is dropped too. A TCP connect
//!   then times out; a UDP `send()` fails with EPERM.
//!
//! Every packet of every socket in the cgroup pays one hash lookup by
//! cookie (a miss unless a socket is waiting for its check). The map is not
//! pinned: a restarted daemon starts with an empty one, and a socket that
//! connects during the hand-over of the links (milliseconds) is not checked.

use aya_ebpf::{
    helpers::generated::bpf_get_socket_cookie,
    macros::{cgroup_skb, map},
    maps::{lpm_trie::Key, LruHashMap},
    programs::SkBuffContext,
    EbpfContext,
};
use proxy_common::{
    Backend, ServiceKey, SrcRangeKey, FAMILY_V4, FAMILY_V6, SRC_RANGE_FRONTEND_BITS,
    SVC_FLAG_SOURCE_RANGES,
};

use crate::nodeport::EKP_SRC_RANGES;

/// Sockets waiting for their first packet's check (LRU: one a socket never
/// sends on is evicted in time).
const MAX_PENDING: u32 = 65_536;

/// A socket translated to a frontend with source ranges.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Pending {
    /// The load-balancer IP (network order, IPv4 in `frontend[0]`).
    frontend: [u32; 4],
    /// The backend the hook sent the socket to.
    backend: [u32; 4],
    /// The frontend's port, network order.
    port: u16,
    proto: u8,
    family: u8,
}

#[map]
static EKP_LB_SOURCE_PENDING: LruHashMap<u64, Pending> =
    LruHashMap::with_max_entries(MAX_PENDING, 0);

/// cgroup_skb verdicts.
const PASS: i32 = 1;
const DROP: i32 = 0;

/// Called by the connect / sendmsg hook once it translated `cookie`'s
/// socket from the frontend `key` (a header's key, `flags` its flags) to
/// `be`: frontends with source ranges have the socket's first packet
/// checked.
#[inline(always)]
pub fn record(flags: u16, cookie: u64, key: &ServiceKey, be: &Backend) {
    if flags & SVC_FLAG_SOURCE_RANGES == 0 {
        return;
    }
    let pending = Pending {
        frontend: key.addr,
        backend: be.addr,
        port: key.port,
        proto: key.proto,
        family: key.family,
    };
    // A full LRU map evicts its oldest entry: nothing to handle.
    let _ = EKP_LB_SOURCE_PENDING.insert(&cookie, &pending, 0);
}

#[cgroup_skb(egress)]
pub fn ekp_lb_source_egress(ctx: SkBuffContext) -> i32 {
    // SAFETY: allowed in cgroup_skb programs (0 without a socket, a cookie
    // no entry has).
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    // SAFETY: the value is copied out at once.
    let Some(pending) = (unsafe { EKP_LB_SOURCE_PENDING.get(&cookie) }).copied() else {
        return PASS;
    };
    if allowed(&ctx, &pending) {
        let _ = EKP_LB_SOURCE_PENDING.remove(&cookie);
        PASS
    } else {
        DROP
    }
}

/// Whether the packet may leave: it goes elsewhere than the recorded
/// backend (an unconnected UDP socket's other datagram), or its source is
/// within the frontend's ranges.
#[inline(always)]
fn allowed(ctx: &SkBuffContext, p: &Pending) -> bool {
    // The packet starts at its IP header here.
    let Ok(first) = ctx.load::<u8>(0) else {
        return true;
    };
    let (family, src_at, dst_at) = match first >> 4 {
        4 => (FAMILY_V4, 12, 16),
        6 => (FAMILY_V6, 8, 24),
        _ => return true,
    };
    if family != p.family {
        return true;
    }
    let (Some(src), Some(dst)) = (address(ctx, family, src_at), address(ctx, family, dst_at))
    else {
        return true;
    };
    if dst[0] != p.backend[0]
        || dst[1] != p.backend[1]
        || dst[2] != p.backend[2]
        || dst[3] != p.backend[3]
    {
        return true;
    }
    let key = Key::new(
        SRC_RANGE_FRONTEND_BITS + 128,
        SrcRangeKey {
            addr: p.frontend,
            port: p.port,
            proto: p.proto,
            family: p.family,
            src,
        },
    );
    EKP_SRC_RANGES.get(key).is_some()
}

/// An address of the IP header at `at`, stored as the maps store it (IPv4
/// in the first word).
#[inline(always)]
fn address(ctx: &SkBuffContext, family: u8, at: usize) -> Option<[u32; 4]> {
    if family == FAMILY_V4 {
        let a: u32 = ctx.load(at).ok()?;
        Some([a, 0, 0, 0])
    } else {
        ctx.load::<[u32; 4]>(at).ok()
    }
}
