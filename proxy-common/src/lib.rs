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
//! entry with `slot == 0` is the header (backend count, flags, affinity
//! timeout, service id); slots `1..=count` hold backend ids. The daemon
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

/// Map names (also the pin file names under `--bpffs-root`).
pub const MAP_SERVICES: &str = "EKP_SERVICES";
pub const MAP_BACKENDS: &str = "EKP_BACKENDS";
pub const MAP_REVNAT: &str = "EKP_REVNAT";
pub const MAP_AFFINITY: &str = "EKP_AFFINITY";
pub const MAP_STATS: &str = "EKP_STATS";

/// Capacities in the object. The daemon creates `EKP_SERVICES` and
/// `EKP_BACKENDS` itself with `--ebpf-map-size` entries (unpreallocated)
/// before loading, so those two are only the object's defaults. The daemon
/// reports "map full" instead of truncating.
pub const MAX_SERVICE_ENTRIES: u32 = 262_144;
pub const MAX_BACKENDS: u32 = 262_144;
pub const MAX_REVNAT: u32 = 262_144;
pub const MAX_AFFINITY: u32 = 65_536;
/// Most backends one service can have; also bounds the slot lookup.
pub const MAX_BACKENDS_PER_SERVICE: u16 = 4096;

/// Per-CPU counters in the `EKP_STATS` array, by index.
pub const STAT_TRANSLATED: u32 = 0;
pub const STAT_NO_BACKEND: u32 = 1;
pub const STAT_AFFINITY_HIT: u32 = 2;
pub const STAT_SLOT_MISSING: u32 = 3;
pub const STAT_COUNT: u32 = 4;

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
    /// 0 = header, 1..=count = backend slots.
    pub slot: u16,
    pub _pad: u16,
}

/// Value of `EKP_SERVICES`. In the header (`slot == 0`) `count`, `flags`,
/// `affinity_timeout` and `service_id` are set and `backend_id` is 0; in a
/// slot only `backend_id` is set.
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

/// Value of `EKP_BACKENDS` (key: backend id, `u32`, never 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Backend {
    /// Network order; IPv4 in `addr[0]`.
    pub addr: [u32; 4],
    /// Network order.
    pub port: u16,
    pub family: u8,
    pub _pad: u8,
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
    unsafe impl aya::Pod for super::SockDestroyTarget {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};

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
        assert_eq!(size_of::<SockDestroyTarget>(), 20);
    }
}
