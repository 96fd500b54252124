#![no_std]
//! Map keys and values shared by the eBPF programs (`proxy-ebpf`) and the
//! daemon. The layout is the contract between the two sides.
//!
//! Rules every type here follows:
//! * `#[repr(C)]`, sizes a multiple of 4 (8 where a `u64` is inside), every
//!   padding byte an explicit `_pad` field that must be zero: the kernel
//!   hashes and compares keys byte by byte, so implicit padding would make
//!   equal keys differ;
//! * addresses and ports in **network byte order**, exactly as the kernel
//!   exposes them in `struct bpf_sock_addr` (`user_ip4`, `user_ip6[4]`,
//!   `user_port`); an IPv4 address occupies `addr[0]`, `addr[1..4]` are 0.
//!
//! Service layout (Cilium-style slots): for each (VIP, port, protocol) the
//! entry with slot number 0 is the header (backend count, flags, affinity
//! timeout, service id); slots `1..=count` hold backend ids. A slot number
//! has 23 bits: the low 16 in `ServiceKey::slot`, the high 7 in the upper
//! bits of `ServiceKey::scope` (see [`ServiceKey::with_slot`]); a count
//! above `u16::MAX` is kept in the header's `backend_id` (see
//! [`ServiceValue::backend_count`]). Services of at most 65,535 backends
//! are stored byte for byte as before, and a key of a higher slot has a
//! scope code earlier versions do not know, so they skip it. The daemon
//! writes backends and slots before raising a header's count and lowers the
//! count before removing slots, so a program never reads a half-written
//! service.

/// IANA protocol number of TCP, as found in `bpf_sock_addr.protocol`.
pub const PROTO_TCP: u8 = 6;
/// IANA protocol number of UDP.
pub const PROTO_UDP: u8 = 17;
/// IANA protocol number of SCTP.
pub const PROTO_SCTP: u8 = 132;

/// Address family markers stored in keys and backends.
pub const FAMILY_V4: u8 = 4;
pub const FAMILY_V6: u8 = 6;

/// Header flag: session affinity ClientIP.
pub const SVC_FLAG_AFFINITY: u16 = 1 << 0;
/// Header flag (node-external scope): only sources listed in
/// `EKP_SRC_RANGES` for this frontend may connect (loadBalancerSourceRanges).
pub const SVC_FLAG_SOURCE_RANGES: u16 = 1 << 1;
/// Header flag (node-external scope, `count == 0`): the service has no
/// usable endpoint at all, so a new flow is rejected (TCP RST, ICMP port
/// unreachable) as kube-proxy does; without it a `count == 0` frontend
/// (externalTrafficPolicy Local without a local endpoint) drops.
pub const SVC_FLAG_REJECT: u16 = 1 << 2;

/// `ServiceKey::scope`: which program reads the entry.
/// Socket-LB hooks: cluster IPs, and external / load-balancer IPs and node
/// ports reached from a socket on the node.
pub const SCOPE_SOCKET: u8 = 0;
/// tc programs: node ports, external IPs and load-balancer IPs reached by
/// packets arriving on a node interface (externalTrafficPolicy applies).
pub const SCOPE_EXTERNAL: u8 = 1;

/// `Backend::flags`: the endpoint runs on this node (no SNAT needed for
/// node-external traffic to it).
pub const BACKEND_F_LOCAL: u8 = 1 << 0;

/// Map names (also the pin file names under `--bpffs-root`).
pub const MAP_SERVICES: &str = "EKP_SERVICES";
pub const MAP_BACKENDS: &str = "EKP_BACKENDS";
pub const MAP_REVNAT: &str = "EKP_REVNAT";
pub const MAP_AFFINITY: &str = "EKP_AFFINITY";
pub const MAP_STATS: &str = "EKP_STATS";
pub const MAP_CT: &str = "EKP_CT";
pub const MAP_IFACES: &str = "EKP_IFACES";
pub const MAP_SRC_RANGES: &str = "EKP_SRC_RANGES";
pub const MAP_EXT_AFFINITY: &str = "EKP_EXT_AFFINITY";
pub const MAP_EXT_STATS: &str = "EKP_EXT_STATS";
pub const MAP_REJECT_RATE: &str = "EKP_REJECT_RATE";
pub const MAP_FRAGS: &str = "EKP_FRAGS";

/// Capacities in the object. The daemon creates `EKP_SERVICES` and
/// `EKP_BACKENDS` itself with `--ebpf-map-size` entries (unpreallocated)
/// before loading, so those two are only the object's defaults. The daemon
/// reports "map full" instead of truncating.
pub const MAX_SERVICE_ENTRIES: u32 = 262_144;
pub const MAX_BACKENDS: u32 = 262_144;
pub const MAX_REVNAT: u32 = 262_144;
pub const MAX_AFFINITY: u32 = 65_536;
/// Connection-tracking entries of node-external flows (two per flow).
pub const MAX_CT: u32 = 262_144;
/// Interfaces with node addresses the tc programs are attached to.
pub const MAX_IFACES: u32 = 1024;
/// loadBalancerSourceRanges entries, all services together.
pub const MAX_SRC_RANGES: u32 = 65_536;
/// Sources the tc programs' reject replies are rate-limited for (LRU).
pub const MAX_REJECT_SOURCES: u32 = 16_384;
/// Fragmented datagrams of translated flows whose later fragments the tc
/// programs can place at once (LRU; an entry lives while its datagram's
/// fragments pass, a few microseconds on a LAN).
pub const MAX_FRAGS: u32 = 8192;
/// Most backends one service can have: the largest 23-bit slot number.
pub const MAX_BACKENDS_PER_SERVICE: u32 = (1 << 23) - 1;

/// Bit of `ServiceKey::scope` that holds the scope; the bits above it hold
/// bits 16..23 of the slot number.
pub const SCOPE_MASK: u8 = 1;

/// Per-CPU counters in the `EKP_STATS` array, by index.
pub const STAT_TRANSLATED: u32 = 0;
pub const STAT_NO_BACKEND: u32 = 1;
pub const STAT_AFFINITY_HIT: u32 = 2;
pub const STAT_SLOT_MISSING: u32 = 3;
pub const STAT_COUNT: u32 = 4;

/// Per-CPU counters of the tc programs in the `EKP_EXT_STATS` array (a map
/// of its own: `EKP_STATS` keeps the size pinned by earlier versions).
/// A node-external packet was translated (new flow or conntrack hit).
pub const STAT_EXT_TRANSLATED: u32 = 0;
/// A node-external packet for a frontend without usable endpoint
/// (eTP=Local with no local endpoint) was dropped.
pub const STAT_EXT_NO_BACKEND: u32 = 1;
/// Dropped by loadBalancerSourceRanges.
pub const STAT_EXT_SOURCE_DENIED: u32 = 2;
/// No route to the backend, or no free SNAT port.
pub const STAT_EXT_UNROUTABLE: u32 = 3;
/// A new flow to a frontend without any usable endpoint was refused (TCP
/// RST or ICMP port unreachable sent back, unless rate-limited).
pub const STAT_EXT_REJECTED: u32 = 4;
/// A packet the tc program would forward itself arrived with TTL (hop
/// limit) 1 or 0: handed to the stack untranslated.
pub const STAT_EXT_TTL_EXCEEDED: u32 = 5;
/// Size of `EKP_EXT_STATS`, with room for later counters (a pinned array
/// of another size is replaced by the daemon, its counts lost).
pub const EXT_STAT_COUNT: u32 = 16;

/// Reject replies (TCP RST, ICMP errors) the tc programs send to one source:
/// a token bucket of `REJECT_BURST` replies refilled at one per
/// `REJECT_INTERVAL_NS`.
pub const REJECT_INTERVAL_NS: u64 = 10_000_000;
pub const REJECT_BURST: u64 = 50;

/// Key of `EKP_SERVICES`: one service port's VIP plus the slot number.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ServiceKey {
    /// VIP, network order; IPv4 in `addr[0]`.
    pub addr: [u32; 4],
    /// Service port, network order.
    pub port: u16,
    pub proto: u8,
    pub family: u8,
    /// Low 16 bits of the slot number: 0 = header, 1..=count = backend
    /// slots.
    pub slot: u16,
    /// [`SCOPE_SOCKET`] or [`SCOPE_EXTERNAL`] in bit 0 ([`SCOPE_MASK`]);
    /// bits 1..8 are bits 16..23 of the slot number.
    pub scope: u8,
    pub _pad: u8,
}

impl ServiceKey {
    /// This key (a header's) with the slot number `slot` (< 2^23).
    #[inline(always)]
    pub fn with_slot(&self, slot: u32) -> ServiceKey {
        ServiceKey {
            slot: slot as u16,
            scope: (self.scope & SCOPE_MASK) | (((slot >> 16) as u8) << 1),
            ..*self
        }
    }

    /// The whole slot number.
    #[inline(always)]
    pub fn slot_number(&self) -> u32 {
        self.slot as u32 | (((self.scope >> 1) as u32) << 16)
    }

    /// [`SCOPE_SOCKET`] or [`SCOPE_EXTERNAL`].
    #[inline(always)]
    pub fn scope_code(&self) -> u8 {
        self.scope & SCOPE_MASK
    }
}

/// Value of `EKP_SERVICES`. In the header (slot 0) `count`, `flags`,
/// `affinity_timeout` and `service_id` are set, and `backend_id` is 0
/// unless the service has more than `u16::MAX` backends: then `count` is
/// `u16::MAX` and `backend_id` holds the count (read it with
/// [`ServiceValue::backend_count`]). In a slot only `backend_id` is set.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ServiceValue {
    pub backend_id: u32,
    /// Number of backend slots; 0 = no usable endpoint (connect refused).
    pub count: u16,
    pub flags: u16,
    /// Session affinity timeout in seconds (with `SVC_FLAG_AFFINITY`).
    pub affinity_timeout: u32,
    /// Stable id of the service port, for affinity entries.
    pub service_id: u32,
}

impl ServiceValue {
    /// A header's backend count (the larger of `count` and `backend_id`).
    #[inline(always)]
    pub fn backend_count(&self) -> u32 {
        let wide = self.backend_id;
        let narrow = self.count as u32;
        if wide > narrow {
            wide
        } else {
            narrow
        }
    }

    /// A header holding `count` backends.
    pub fn header(count: u32, flags: u16, affinity_timeout: u32, service_id: u32) -> ServiceValue {
        let narrow = if count > u16::MAX as u32 {
            u16::MAX
        } else {
            count as u16
        };
        ServiceValue {
            backend_id: if count > u16::MAX as u32 { count } else { 0 },
            count: narrow,
            flags,
            affinity_timeout,
            service_id,
        }
    }
}

/// Value of `EKP_BACKENDS` (key: backend id, `u32`, never 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Backend {
    /// Network order; IPv4 in `addr[0]`.
    pub addr: [u32; 4],
    /// Network order.
    pub port: u16,
    pub family: u8,
    /// [`BACKEND_F_LOCAL`].
    pub flags: u8,
}

/// Key of `EKP_REVNAT`: the socket and the backend it was sent to.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct RevNatKey {
    pub cookie: u64,
    pub addr: [u32; 4],
    pub port: u16,
    pub family: u8,
    pub _pad: [u8; 5],
}

/// Value of `EKP_REVNAT`: the VIP the application asked for.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct RevNatValue {
    pub addr: [u32; 4],
    pub port: u16,
    pub _pad: u16,
}

/// Key of `EKP_AFFINITY`: the client (its network namespace cookie, since
/// a socket has no source address yet at connect time) and service port.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AffinityKey {
    pub client_cookie: u64,
    pub service_id: u32,
    pub _pad: u32,
}

/// Value of `EKP_AFFINITY`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AffinityValue {
    pub backend_id: u32,
    pub _pad: u32,
    /// `bpf_ktime_get_ns()` of the last use.
    pub last_used_ns: u64,
}

/// Key of `EKP_CT`, the tc programs' connection tracking: a packet's
/// 5-tuple as it is on the wire where the program sees it. Each flow has
/// two entries: the client's direction (seen on ingress) and the reply
/// direction (seen on egress for a local backend, on ingress for a remote
/// one behind SNAT).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct CtKey {
    pub saddr: [u32; 4],
    pub daddr: [u32; 4],
    /// Network order.
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub family: u8,
    pub _pad: u16,
}

/// `CtValue::flags`: forward the rewritten packet with a FIB lookup and
/// redirect (it carries a node address as source or destination, which
/// the stack would drop as a martian).
pub const CT_F_REDIRECT: u8 = 1 << 0;
/// `CtValue::flags`: a FIN or RST was seen; the entry expires sooner.
pub const CT_F_CLOSING: u8 = 1 << 1;
/// `CtValue::flags`: the client's direction (the other entry is the reply).
pub const CT_F_ORIGINAL: u8 = 1 << 2;

/// Source ports of SNATed node-external flows (host order), above Linux's
/// default ephemeral range (32768–60999): a reply to such a flow is told
/// from the node's own traffic by its destination port alone, so packets
/// that are no service's cost one map lookup.
pub const SNAT_PORT_MIN: u16 = 61000;
pub const SNAT_PORT_MAX: u16 = 65535;

/// Idle timeouts of `EKP_CT` entries, seconds.
pub const CT_TIMEOUT_TCP: u32 = 21_600;
pub const CT_TIMEOUT_TCP_CLOSING: u32 = 10;
pub const CT_TIMEOUT_OTHER: u32 = 60;

/// Value of `EKP_CT`: the tuple the packet is rewritten to.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct CtValue {
    pub saddr: [u32; 4],
    pub daddr: [u32; 4],
    pub sport: u16,
    pub dport: u16,
    pub flags: u8,
    pub _pad: [u8; 3],
    /// `bpf_ktime_get_ns()` when the entry was last refreshed.
    pub last_seen_ns: u64,
    /// Backend id the flow was sent to (0 for reply entries).
    pub backend_id: u32,
    /// `service_id` of the frontend header (for dump and affinity).
    pub service_id: u32,
}

/// Value of `EKP_IFACES` (key: ifindex, `u32`): the node's addresses on an
/// interface the tc programs serve, the SNAT source for remote backends
/// reached through it. 0 = none of that family.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct IfaceValue {
    /// Network order.
    pub v4: u32,
    pub v6: [u32; 4],
}

/// Data of the `EKP_SRC_RANGES` LPM trie key (the trie's `prefix_len`
/// comes before it): a frontend and a source prefix. The prefix length
/// covers [`SRC_RANGE_FRONTEND_BITS`] for the frontend part (`addr`,
/// `port`, `proto`, `family`) plus the source prefix's own length.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SrcRangeKey {
    pub addr: [u32; 4],
    pub port: u16,
    pub proto: u8,
    pub family: u8,
    pub src: [u32; 4],
}

/// Bits of [`SrcRangeKey`] before `src`.
pub const SRC_RANGE_FRONTEND_BITS: u32 = 160;

/// Key of `EKP_EXT_AFFINITY`: an outside client (its address) and the
/// frontend's service id.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ExtAffinityKey {
    pub client: [u32; 4],
    pub service_id: u32,
    pub family: u8,
    pub _pad: [u8; 3],
}

/// Key of `EKP_REJECT_RATE`: a source address (IPv4 in `addr[0]`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct RejectKey {
    pub addr: [u32; 4],
    pub family: u8,
    pub _pad: [u8; 3],
}

/// Value of `EKP_REJECT_RATE`: the source's token bucket.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct RejectTokens {
    /// Credit in nanoseconds, at most `REJECT_BURST * REJECT_INTERVAL_NS`.
    pub credit_ns: u64,
    pub last_ns: u64,
}

/// Key of `EKP_FRAGS`: one fragmented IP datagram as it arrives, by its
/// addresses, protocol and identification (IPv4's 16 bits in the low half
/// of `id`, as read in network order; IPv6's fragment header's 32 bits).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FragKey {
    pub saddr: [u32; 4],
    pub daddr: [u32; 4],
    pub id: u32,
    pub proto: u8,
    pub family: u8,
    pub _pad: u16,
}

/// Value of `EKP_FRAGS`: the ports of the datagram's first fragment (the
/// later ones carry no L4 header), network order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FragPorts {
    pub sport: u16,
    pub dport: u16,
}

// --- Socket destruction (iter/tcp, iter/udp programs) ---

/// Map of the sockets to destroy: socket cookie → [`SockDestroyTarget`].
/// Not pinned: the daemon fills it for one run of the iterators and empties
/// it afterwards.
pub const MAP_SOCK_DESTROY: &str = "EKP_SOCK_DESTROY";
/// Sockets one run of the iterators can target; the daemon splits bigger
/// sets into several runs.
pub const MAX_SOCK_DESTROY: u32 = 16_384;
/// Program names of the socket iterators.
pub const PROG_SOCK_DESTROY_TCP: &str = "ekp_sock_destroy_tcp";
pub const PROG_SOCK_DESTROY_UDP: &str = "ekp_sock_destroy_udp";
/// Immediate of the hand-encoded `bpf_sock_destroy` kfunc call in the
/// object; the daemon replaces it with the kfunc's vmlinux BTF id before
/// loading (aya does not resolve kfuncs).
pub const SOCK_DESTROY_KFUNC_MARKER: u32 = 0x5eed_d357;

/// Value of `EKP_SOCK_DESTROY`: the backend the socket must still be
/// connected to, and its protocol, for the iterator to destroy it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SockDestroyTarget {
    /// Network order; IPv4 in `addr[0]`.
    pub addr: [u32; 4],
    /// Network order.
    pub port: u16,
    pub family: u8,
    pub proto: u8,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: every type is #[repr(C)], made of integers and integer arrays
    // with explicit padding fields, so any bit pattern is valid and there are
    // no uninitialised bytes.
    unsafe impl aya::Pod for super::ServiceKey {}
    unsafe impl aya::Pod for super::ServiceValue {}
    unsafe impl aya::Pod for super::Backend {}
    unsafe impl aya::Pod for super::RevNatKey {}
    unsafe impl aya::Pod for super::RevNatValue {}
    unsafe impl aya::Pod for super::AffinityKey {}
    unsafe impl aya::Pod for super::AffinityValue {}
    unsafe impl aya::Pod for super::CtKey {}
    unsafe impl aya::Pod for super::CtValue {}
    unsafe impl aya::Pod for super::IfaceValue {}
    unsafe impl aya::Pod for super::SrcRangeKey {}
    unsafe impl aya::Pod for super::ExtAffinityKey {}
    unsafe impl aya::Pod for super::RejectKey {}
    unsafe impl aya::Pod for super::RejectTokens {}
    unsafe impl aya::Pod for super::FragKey {}
    unsafe impl aya::Pod for super::FragPorts {}
    unsafe impl aya::Pod for super::SockDestroyTarget {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    #[test]
    fn slot_numbers_use_23_bits_and_keep_the_scope() {
        let base = ServiceKey {
            scope: SCOPE_EXTERNAL,
            ..ServiceKey::default()
        };
        for slot in [0, 1, 65_535, 65_536, 100_000, MAX_BACKENDS_PER_SERVICE] {
            let k = base.with_slot(slot);
            assert_eq!(k.slot_number(), slot);
            assert_eq!(k.scope_code(), SCOPE_EXTERNAL);
            assert_eq!(k.with_slot(0), base, "slot 0 is the header's key");
        }
        // A slot below 2^16 is stored as it always was.
        assert_eq!(base.with_slot(4096).scope, SCOPE_EXTERNAL);
        assert_eq!(base.with_slot(4096).slot, 4096);
    }

    #[test]
    fn a_header_count_beyond_u16_lives_in_backend_id() {
        let small = ServiceValue::header(4096, 1, 2, 3);
        assert_eq!((small.count, small.backend_id), (4096, 0));
        assert_eq!(small.backend_count(), 4096);
        let big = ServiceValue::header(100_000, 1, 2, 3);
        assert_eq!((big.count, big.backend_id), (u16::MAX, 100_000));
        assert_eq!(big.backend_count(), 100_000);
        assert_eq!(ServiceValue::header(0, 0, 0, 0).backend_count(), 0);
    }

    #[test]
    fn protocol_numbers_match_iana() {
        assert_eq!((PROTO_TCP, PROTO_UDP, PROTO_SCTP), (6, 17, 132));
    }

    /// The layout is shared with the kernel side: any change here must be a
    /// deliberate change of both sides (and of pinned maps across upgrades).
    #[test]
    fn layouts_are_fixed_and_without_implicit_padding() {
        assert_eq!(size_of::<ServiceKey>(), 24);
        assert_eq!(offset_of!(ServiceKey, port), 16);
        assert_eq!(offset_of!(ServiceKey, proto), 18);
        assert_eq!(offset_of!(ServiceKey, family), 19);
        assert_eq!(offset_of!(ServiceKey, slot), 20);
        assert_eq!(size_of::<ServiceValue>(), 16);
        assert_eq!(offset_of!(ServiceValue, affinity_timeout), 8);
        assert_eq!(size_of::<Backend>(), 20);
        assert_eq!(size_of::<RevNatKey>(), 32);
        assert_eq!(offset_of!(RevNatKey, addr), 8);
        assert_eq!(align_of::<RevNatKey>(), 8);
        assert_eq!(size_of::<RevNatValue>(), 20);
        assert_eq!(size_of::<AffinityKey>(), 16);
        assert_eq!(size_of::<AffinityValue>(), 16);
        assert_eq!(offset_of!(AffinityValue, last_used_ns), 8);
        assert_eq!(offset_of!(ServiceKey, scope), 22);
        assert_eq!(size_of::<CtKey>(), 40);
        assert_eq!(size_of::<CtValue>(), 56);
        assert_eq!(offset_of!(CtValue, last_seen_ns), 40);
        assert_eq!(size_of::<IfaceValue>(), 20);
        assert_eq!(size_of::<SrcRangeKey>(), 36);
        assert_eq!(offset_of!(SrcRangeKey, src), 20);
        assert_eq!(SRC_RANGE_FRONTEND_BITS as usize, 20 * 8);
        assert_eq!(size_of::<ExtAffinityKey>(), 24);
        assert_eq!(size_of::<SockDestroyTarget>(), 20);
        assert_eq!(size_of::<FragKey>(), 40);
        assert_eq!(offset_of!(FragKey, id), 32);
        assert_eq!(size_of::<FragPorts>(), 4);
    }
}
