#![no_std]
#![no_main]
// The bpf_sock_destroy kfunc call is inline assembly (sockdestroy.rs).
#![feature(asm_experimental_arch)]
//! Socket-level load balancing for ClusterIPs (and external / load-balancer
//! IPs reached from inside the node), in the style of Cilium's socket-LB.
//!
//! Programs (one per cgroup sock_addr hook, all attached to one cgroup v2
//! directory):
//! * `connect4/6`   TCP, UDP (and SCTP where the hook runs): rewrite a
//!   service address to a backend before the socket connects;
//! * `sendmsg4/6`   unconnected UDP: the same per datagram;
//! * `recvmsg4/6`   unconnected UDP: restore the service address as the
//!   source of the reply;
//! * `getpeername4/6`: restore the service address for the application.
//!
//! The daemon writes the maps (layout in `proxy-common`); these programs
//! only read them, except for the reverse-NAT, affinity and stats maps.
//! A service whose header has `count == 0` has no usable endpoint: connect()
//! and sendmsg() are refused at once (the hook returns 0, the syscall fails
//! with EPERM) instead of sending packets to an address nobody answers.
//! IPv4-mapped IPv6 destinations (`::ffff:a.b.c.d`, dual-stack sockets) are
//! looked up as IPv4 services.
//!
//! Failures are counted in the per-CPU `EKP_STATS` array, never logged.
//!
//! Node-external traffic (node ports, external and load-balancer IPs
//! reached from outside the node) is served by the tc programs in
//! [`nodeport`], which share the services and backends maps.

mod nodeport;

use aya_ebpf::{
    bindings::bpf_sock_addr,
    helpers::generated::{
        bpf_get_netns_cookie, bpf_get_prandom_u32, bpf_get_socket_cookie, bpf_ktime_get_ns,
    },
    macros::{cgroup_sock_addr, map},
    maps::{HashMap, LruHashMap, PerCpuArray},
    programs::SockAddrContext,
    EbpfContext,
};
use proxy_common::{
    AffinityKey, AffinityValue, Backend, RevNatKey, RevNatValue, ServiceKey, ServiceValue,
    FAMILY_V4, FAMILY_V6, MAX_AFFINITY, MAX_BACKENDS, MAX_REVNAT, MAX_SERVICE_ENTRIES, PROTO_SCTP,
    PROTO_TCP, PROTO_UDP, SCOPE_SOCKET, STAT_AFFINITY_HIT, STAT_COUNT, STAT_NO_BACKEND, STAT_SLOT_MISSING,
    STAT_TRANSLATED, SVC_FLAG_AFFINITY,
};

mod lb_source;
mod sockdestroy;

// All maps are pinned by name: the loader gives a pin directory, and a
// restarted daemon reuses the very same maps, so the programs keep serving
// while it is away.

#[map]
pub(crate) static EKP_SERVICES: HashMap<ServiceKey, ServiceValue> = HashMap::pinned(MAX_SERVICE_ENTRIES, 0);

#[map]
pub(crate) static EKP_BACKENDS: HashMap<u32, Backend> = HashMap::pinned(MAX_BACKENDS, 0);

#[map]
static EKP_REVNAT: LruHashMap<RevNatKey, RevNatValue> = LruHashMap::pinned(MAX_REVNAT, 0);

#[map]
static EKP_AFFINITY: LruHashMap<AffinityKey, AffinityValue> = LruHashMap::pinned(MAX_AFFINITY, 0);

#[map]
static EKP_STATS: PerCpuArray<u64> = PerCpuArray::pinned(STAT_COUNT, 0);

/// Return values of sock_addr programs.
const ALLOW: i32 = 1;
/// Only connect*/sendmsg* may return this (the verifier insists that
/// recvmsg*/getpeername* return exactly 1); the syscall fails with EPERM.
const REJECT: i32 = 0;

/// `::ffff:0:0/96` marker in the third word of an IPv6 address, as stored
/// (network byte order).
const V4_MAPPED_MARKER: u32 = u32::from_be(0x0000_ffff);

pub(crate) const NSEC_PER_SEC: u64 = 1_000_000_000;

/// A socket address as the hook sees it, normalised: an IPv4-mapped IPv6
/// address becomes `family = 4` with the address in `addr[0]`.
#[derive(Clone, Copy)]
struct SockAddr {
    addr: [u32; 4],
    /// Network order.
    port: u16,
    family: u8,
    /// The hook's address was `::ffff:a.b.c.d` (write it back that way).
    mapped: bool,
}

#[inline(always)]
fn count(stat: u32) {
    if let Some(p) = EKP_STATS.get_ptr_mut(stat) {
        // SAFETY: a per-CPU array slot belongs to this CPU while the
        // program runs (programs do not migrate), so this is no data race.
        unsafe { *p += 1 };
    }
}

/// Reads `user_ip4`/`user_ip6` and `user_port`. Every access is a 4-byte
/// load of one field: the verifier rejects narrower accesses to
/// `user_port` and wider ones to `user_ip4`, and copying the whole context
/// would read fields that are invalid in some hooks.
#[inline(always)]
fn read_addr(sa: *const bpf_sock_addr, v6: bool) -> SockAddr {
    // SAFETY: `sa` is the context pointer the kernel passed to the program;
    // these fields are readable in every sock_addr hook.
    unsafe {
        let port = (*sa).user_port as u16;
        if !v6 {
            return SockAddr {
                addr: [(*sa).user_ip4, 0, 0, 0],
                port,
                family: FAMILY_V4,
                mapped: false,
            };
        }
        let a = [
            (*sa).user_ip6[0],
            (*sa).user_ip6[1],
            (*sa).user_ip6[2],
            (*sa).user_ip6[3],
        ];
        if a[0] == 0 && a[1] == 0 && a[2] == V4_MAPPED_MARKER {
            SockAddr {
                addr: [a[3], 0, 0, 0],
                port,
                family: FAMILY_V4,
                mapped: true,
            }
        } else {
            SockAddr {
                addr: a,
                port,
                family: FAMILY_V6,
                mapped: false,
            }
        }
    }
}

/// Writes an address back into the context, in the hook's family.
#[inline(always)]
fn write_addr(sa: *mut bpf_sock_addr, v6: bool, mapped: bool, addr: &[u32; 4], port: u16) {
    // SAFETY: `sa` is the context pointer; user_ip4/user_ip6/user_port are
    // writable in connect, sendmsg, recvmsg and getpeername hooks. Volatile
    // 4-byte stores keep LLVM from merging neighbouring stores into a wider
    // one the verifier would reject (`invalid bpf_context access`).
    unsafe {
        if !v6 {
            core::ptr::write_volatile(&mut (*sa).user_ip4, addr[0]);
        } else if mapped {
            core::ptr::write_volatile(&mut (*sa).user_ip6[0], 0);
            core::ptr::write_volatile(&mut (*sa).user_ip6[1], 0);
            core::ptr::write_volatile(&mut (*sa).user_ip6[2], V4_MAPPED_MARKER);
            core::ptr::write_volatile(&mut (*sa).user_ip6[3], addr[0]);
        } else {
            core::ptr::write_volatile(&mut (*sa).user_ip6[0], addr[0]);
            core::ptr::write_volatile(&mut (*sa).user_ip6[1], addr[1]);
            core::ptr::write_volatile(&mut (*sa).user_ip6[2], addr[2]);
            core::ptr::write_volatile(&mut (*sa).user_ip6[3], addr[3]);
        }
        core::ptr::write_volatile(&mut (*sa).user_port, port as u32);
    }
}

/// The protocol of the socket, if it is one services are defined for.
#[inline(always)]
fn socket_protocol(sa: *const bpf_sock_addr) -> Option<u8> {
    // SAFETY: `protocol` is a readable u32 in every sock_addr hook.
    let p = unsafe { (*sa).protocol };
    if p == PROTO_TCP as u32 || p == PROTO_UDP as u32 || p == PROTO_SCTP as u32 {
        Some(p as u8)
    } else {
        None
    }
}

/// A backend id from a slot of the service (`key` is its header's key,
/// `count` the header's [`ServiceValue::backend_count`]), or `None` if the
/// slot is missing (never expected: the daemon writes slots before the
/// count).
#[inline(always)]
pub(crate) fn random_slot(key: &ServiceKey, count: u32) -> Option<u32> {
    if count == 0 {
        return None;
    }
    // SAFETY: helper without arguments.
    let r = unsafe { bpf_get_prandom_u32() };
    // The slot is part of a map key, not an index, so the verifier needs
    // no bound here; numbers above 2^16 carry their high bits in `scope`.
    let slot_key = key.with_slot(r % count + 1);
    // SAFETY: the value is copied out at once.
    unsafe { EKP_SERVICES.get(&slot_key) }.map(|v| v.backend_id)
}

/// ClientIP session affinity: the backend this client used last, if the
/// entry has not timed out and the backend still exists. The client is its
/// network namespace (at connect time the socket has no source address).
#[inline(always)]
fn affinity_lookup(akey: &AffinityKey, timeout_s: u32, now: u64) -> Option<(u32, Backend)> {
    // SAFETY: the value is copied out at once.
    let v = unsafe { EKP_AFFINITY.get(akey) }?;
    let (backend_id, last_used) = (v.backend_id, v.last_used_ns);
    if now.wrapping_sub(last_used) > timeout_s as u64 * NSEC_PER_SEC {
        return None;
    }
    // SAFETY: the value is copied out at once.
    let be = unsafe { EKP_BACKENDS.get(&backend_id) }?;
    Some((backend_id, *be))
}

/// Service address → backend for connect*/sendmsg*.
#[inline(always)]
fn translate(ctx: &SockAddrContext, v6: bool, proto: u8) -> i32 {
    let sa = ctx.sock_addr;
    let dst = read_addr(sa, v6);
    let key = ServiceKey {
        addr: dst.addr,
        port: dst.port,
        proto,
        family: dst.family,
        slot: 0,
        scope: SCOPE_SOCKET,
        _pad: 0,
    };
    // SAFETY: the fields are copied out at once.
    let Some(hdr) = (unsafe { EKP_SERVICES.get(&key) }) else {
        return ALLOW; // not a service address
    };
    let (n, flags, timeout, service_id) =
        (hdr.backend_count(), hdr.flags, hdr.affinity_timeout, hdr.service_id);
    if n == 0 {
        count(STAT_NO_BACKEND);
        return REJECT;
    }

    let affinity = flags & SVC_FLAG_AFFINITY != 0;
    let akey = AffinityKey {
        // SAFETY: allowed in cgroup sock_addr programs (kernel >= 5.7).
        client_cookie: if affinity {
            unsafe { bpf_get_netns_cookie(ctx.as_ptr()) }
        } else {
            0
        },
        service_id,
        _pad: 0,
    };
    // SAFETY: helper without arguments.
    let now = if affinity {
        unsafe { bpf_ktime_get_ns() }
    } else {
        0
    };
    let sticky = if affinity {
        affinity_lookup(&akey, timeout, now)
    } else {
        None
    };
    let (backend_id, be) = match sticky {
        Some(hit) => {
            count(STAT_AFFINITY_HIT);
            hit
        }
        None => {
            let Some(id) = random_slot(&key, n) else {
                count(STAT_SLOT_MISSING);
                return REJECT;
            };
            // SAFETY: the value is copied out at once.
            let Some(be) = (unsafe { EKP_BACKENDS.get(&id) }) else {
                count(STAT_SLOT_MISSING);
                return REJECT;
            };
            (id, *be)
        }
    };
    if be.family != dst.family {
        // A daemon bug; never translate across families.
        count(STAT_SLOT_MISSING);
        return REJECT;
    }
    if affinity {
        let value = AffinityValue {
            backend_id,
            _pad: 0,
            last_used_ns: now,
        };
        // LRU map: a full map evicts the oldest entry; nothing to handle.
        let _ = EKP_AFFINITY.insert(&akey, &value, 0);
    }

    // SAFETY: allowed in cgroup sock_addr programs.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    lb_source::record(flags, cookie, &key, &be);
    let rkey = RevNatKey {
        cookie,
        addr: be.addr,
        port: be.port,
        family: be.family,
        _pad: [0; 5],
    };
    let rval = RevNatValue {
        addr: dst.addr,
        port: dst.port,
        _pad: 0,
    };
    // sendmsg runs per datagram: only write when the entry is new or
    // different, a lookup is much cheaper than an LRU update.
    // SAFETY: the value is compared at once.
    // Field by field: a derived `==` on arrays may become a bcmp call,
    // which BPF does not have.
    let known = unsafe { EKP_REVNAT.get(&rkey) }.is_some_and(|v| {
        v.port == rval.port
            && v.addr[0] == rval.addr[0]
            && v.addr[1] == rval.addr[1]
            && v.addr[2] == rval.addr[2]
            && v.addr[3] == rval.addr[3]
    });
    if !known {
        let _ = EKP_REVNAT.insert(&rkey, &rval, 0);
    }

    write_addr(sa, v6, dst.mapped, &be.addr, be.port);
    count(STAT_TRANSLATED);
    ALLOW
}

/// Backend → service address for recvmsg*/getpeername*, so the application
/// only ever sees the address it asked for.
#[inline(always)]
fn reverse(ctx: &SockAddrContext, v6: bool) -> i32 {
    let sa = ctx.sock_addr;
    let src = read_addr(sa, v6);
    // SAFETY: allowed in cgroup sock_addr programs.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let rkey = RevNatKey {
        cookie,
        addr: src.addr,
        port: src.port,
        family: src.family,
        _pad: [0; 5],
    };
    // SAFETY: the value is copied out at once.
    if let Some(v) = unsafe { EKP_REVNAT.get(&rkey) } {
        let (addr, port) = (v.addr, v.port);
        write_addr(sa, v6, src.mapped, &addr, port);
    }
    ALLOW
}

#[inline(always)]
fn on_connect(ctx: &SockAddrContext, v6: bool) -> i32 {
    match socket_protocol(ctx.sock_addr) {
        Some(proto) => translate(ctx, v6, proto),
        None => ALLOW,
    }
}

#[inline(always)]
fn on_sendmsg(ctx: &SockAddrContext, v6: bool) -> i32 {
    // The sendmsg hooks run for UDP (and UDP-lite) only.
    match socket_protocol(ctx.sock_addr) {
        Some(PROTO_UDP) => translate(ctx, v6, PROTO_UDP),
        _ => ALLOW,
    }
}

#[cgroup_sock_addr(connect4)]
pub fn ekp_connect4(ctx: SockAddrContext) -> i32 {
    on_connect(&ctx, false)
}

#[cgroup_sock_addr(connect6)]
pub fn ekp_connect6(ctx: SockAddrContext) -> i32 {
    on_connect(&ctx, true)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn ekp_sendmsg4(ctx: SockAddrContext) -> i32 {
    on_sendmsg(&ctx, false)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn ekp_sendmsg6(ctx: SockAddrContext) -> i32 {
    on_sendmsg(&ctx, true)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn ekp_recvmsg4(ctx: SockAddrContext) -> i32 {
    reverse(&ctx, false)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn ekp_recvmsg6(ctx: SockAddrContext) -> i32 {
    reverse(&ctx, true)
}

#[cgroup_sock_addr(getpeername4)]
pub fn ekp_getpeername4(ctx: SockAddrContext) -> i32 {
    reverse(&ctx, false)
}

#[cgroup_sock_addr(getpeername6)]
pub fn ekp_getpeername6(ctx: SockAddrContext) -> i32 {
    reverse(&ctx, true)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable in a verified program: there is no unwinding in BPF.
    loop {}
}
