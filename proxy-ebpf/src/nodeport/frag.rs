//! Fragments of translated flows. Only a datagram's first fragment
//! carries the ports a flow is known by; the later ones carry the same
//! addresses, protocol and identification (IPv4's ID, the IPv6 fragment
//! header's). When the first fragment of a datagram is translated, its
//! ports are remembered under those in `EKP_FRAGS` (a small LRU), so the
//! later fragments find their flow's `EKP_CT` entry and get the same
//! addresses (their payload has no L4 header to rewrite). A later
//! fragment whose first was not translated costs this one lookup and is
//! passed on untouched, as is one that arrives before its first (the
//! fragments of a datagram leave a Linux sender in order).
//!
//! The kernel's reassembly is no option here: tc ingress runs before the
//! stack's defragmentation, and a packet to a node port addressed to the
//! node would be reassembled only on local delivery, where no program
//! sees it again.

use aya_ebpf::{macros::map, maps::LruHashMap};
use proxy_common::{FragKey, FragPorts, MAX_FRAGS};

use super::Pkt;

#[map]
static EKP_FRAGS: LruHashMap<FragKey, FragPorts> = LruHashMap::pinned(MAX_FRAGS, 0);

#[inline(always)]
fn key(p: &Pkt) -> FragKey {
    FragKey {
        saddr: p.saddr,
        daddr: p.daddr,
        id: p.frag_id,
        proto: p.proto,
        family: p.family,
        _pad: 0,
    }
}

/// Remembers the ports of a translated first fragment for the later ones.
/// Out of line (both): the key stays off the frames of the callers, which
/// sit on the deepest call chains.
#[inline(never)]
pub(super) fn remember(p: &Pkt) {
    let ports = FragPorts {
        sport: p.sport,
        dport: p.dport,
    };
    let _ = EKP_FRAGS.insert(&key(p), &ports, 0);
}

/// Gives a later fragment the ports its first fragment had; false when
/// that was not translated (or not seen).
#[inline(never)]
pub(super) fn place(p: &mut Pkt) -> bool {
    // SAFETY: the value is copied out at once.
    match unsafe { EKP_FRAGS.get(&key(p)) } {
        Some(v) => {
            p.sport = v.sport;
            p.dport = v.dport;
            true
        }
        None => false,
    }
}
