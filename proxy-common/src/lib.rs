#![no_std]
#![forbid(unsafe_code)]
//! Constants and (once the eBPF datapath lands) `#[repr(C)]` map types
//! shared by the kernel programs in `proxy-ebpf` and the daemon.
//!
//! Today this crate only carries the protocol numbers both sides agree on;
//! the map layouts are added together with the programs that read them.

/// IANA protocol number of TCP, as found in `bpf_sock_addr.protocol`.
pub const PROTO_TCP: u8 = 6;
/// IANA protocol number of UDP.
pub const PROTO_UDP: u8 = 17;
/// IANA protocol number of SCTP.
pub const PROTO_SCTP: u8 = 132;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_numbers_match_iana() {
        assert_eq!((PROTO_TCP, PROTO_UDP, PROTO_SCTP), (6, 17, 132));
    }
}
