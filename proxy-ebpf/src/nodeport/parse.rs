//! Parsing: a packet's addresses, ports, TCP flags and fragment fields,
//! by direct packet access where the headers are in the linear part.

use aya_ebpf::programs::TcContext;
use proxy_common::{FAMILY_V4, FAMILY_V6, PROTO_TCP, PROTO_UDP};

use super::{
    icmp, Pkt, ETH_HLEN, ETH_P_IP, ETH_P_IPV6, FRAG_FIRST, FRAG_LATER, FRAG_NONE, IPV4_DADDR,
    IPV4_SADDR, IPV6_DADDR, IPV6_HLEN, IPV6_SADDR,
};

/// IPv6 fragment header.
const IPPROTO_FRAGMENT: u8 = 44;

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
pub(super) fn parse(ctx: &TcContext) -> Option<Pkt> {
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
