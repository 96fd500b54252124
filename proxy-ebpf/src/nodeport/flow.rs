//! Flows: the conntrack entry of a packet (`EKP_CT`), and a new flow to a
//! frontend (backend pick, both directions recorded, or the refusal).

use aya_ebpf::{
    bindings::BPF_NOEXIST, helpers::generated::bpf_get_prandom_u32, maps::lpm_trie::Key,
    programs::TcContext,
};
use proxy_common::{
    AffinityValue, Backend, CtKey, CtValue, ExtAffinityKey, ServiceKey, ServiceValue,
    SrcRangeKey, BACKEND_F_LOCAL, CT_F_CLOSING, CT_F_ORIGINAL, CT_F_REDIRECT, CT_TIMEOUT_OTHER,
    CT_TIMEOUT_TCP, CT_TIMEOUT_TCP_CLOSING, FAMILY_V4, PROTO_TCP, SNAT_PORT_MAX, SNAT_PORT_MIN,
    SRC_RANGE_FRONTEND_BITS, STAT_EXT_NO_BACKEND, STAT_EXT_REJECTED, STAT_EXT_SOURCE_DENIED,
    STAT_EXT_UNROUTABLE, SVC_FLAG_AFFINITY, SVC_FLAG_REJECT, SVC_FLAG_SOURCE_RANGES,
};

use super::rewrite::{route, translate};
use super::{
    coarse_now_ns, count, frontend_key, reject, Pkt, Tuple, CT_REFRESH_NS, DROP, EKP_CT,
    EKP_EXT_AFFINITY, EKP_IFACES, EKP_SRC_RANGES, SNAT_PORT_TRIES, TCP_FIN, TCP_RST, TCX_NEXT,
};
use crate::{random_slot, EKP_BACKENDS, NSEC_PER_SEC};

/// A packet of a tracked flow: translated as its entry says. `None` when
/// the flow is not tracked (or its entry has expired).
#[inline(never)]
pub(super) fn known_flow(ctx: &TcContext, p: &Pkt, egress: bool) -> Option<i32> {
    let v = ct_lookup(p)?;
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
fn ct_lookup(p: &Pkt) -> Option<CtValue> {
    let ptr = EKP_CT.get_ptr_mut(ct_key(p))?;
    // Read only now: a packet of no tracked flow (most of what leaves
    // the node) costs the lookup alone.
    let now = coarse_now_ns();
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
    // Saturating: an entry written by a new flow (with the precise clock)
    // may be up to a tick ahead of the coarse one.
    let idle = now.saturating_sub(v.last_seen_ns);
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
pub(super) fn new_flow(ctx: &TcContext, p: &Pkt, hdr: &ServiceValue, now: u64) -> i32 {
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
pub(super) fn no_endpoint(ctx: &TcContext, p: &Pkt, hdr: &ServiceValue, now: u64) -> i32 {
    if hdr.flags & SVC_FLAG_REJECT != 0 {
        count(STAT_EXT_REJECTED);
        return reject::reject(ctx, p, now);
    }
    count(STAT_EXT_NO_BACKEND);
    DROP
}
