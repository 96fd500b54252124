//! Socket destruction for backends that left a service: two socket
//! iterator programs (`iter/tcp`, `iter/udp`) that call the kernel's
//! `bpf_sock_destroy` kfunc on the sockets the daemon listed.
//!
//! The daemon fills `EKP_SOCK_DESTROY` (socket cookie → the backend the
//! socket-LB hook connected it to, found in `EKP_REVNAT`), then reads each
//! iterator once per network namespace. A socket is destroyed only when
//! * its cookie is listed for this protocol, and
//! * it is still connected to that backend (connected state, peer port,
//!   and the peer address for IPv4 backends): an unconnected UDP socket
//!   that merely sent datagrams to the VIP re-balances per datagram and is
//!   left alone. An IPv6 peer address sits at an offset of `sock_common`
//!   that depends on the kernel build, so for IPv6 backends the port and
//!   the cookie (a socket the hooks sent to exactly that backend) decide.
//!
//! The program deletes the entry of every socket it destroyed: the daemon
//! counts the entries gone, and a socket shown twice (a read cut short by
//! a full buffer repeats the element) is handled once.
//!
//! aya-ebpf has no kfunc support and aya does not relocate extern
//! functions, so the call is one hand-encoded instruction
//! (`BPF_PSEUDO_KFUNC_CALL`) whose immediate is a marker the daemon
//! replaces with the kfunc's vmlinux BTF id before loading the object.

use aya_ebpf::{helpers::generated::bpf_get_socket_cookie, macros::map, maps::HashMap};
use proxy_common::{
    SockDestroyTarget, FAMILY_V4, MAX_SOCK_DESTROY, PROTO_TCP, PROTO_UDP, SOCK_DESTROY_KFUNC_MARKER,
};

#[map]
static EKP_SOCK_DESTROY: HashMap<u64, SockDestroyTarget> =
    HashMap::with_max_entries(MAX_SOCK_DESTROY, 0);

// Offsets in `struct sock_common`, stable since long before kernel 6.5
// (the first members never moved): skc_daddr, skc_dport, skc_state.
const SKC_DADDR: usize = 0;
const SKC_DPORT: usize = 12;
const SKC_STATE: usize = 18;

// TCP states (include/net/tcp_states.h).
const TCP_ESTABLISHED: u8 = 1;
const TCP_TIME_WAIT: u8 = 6;
const TCP_CLOSE: u8 = 7;
const TCP_LISTEN: u8 = 10;
const TCP_NEW_SYN_RECV: u8 = 12;

/// `bpf_sock_destroy(sk)`: `call` with src_reg = BPF_PSEUDO_KFUNC_CALL (2),
/// off = 0 (vmlinux BTF), imm = the marker (patched by the daemon).
/// Bytes: code 0x85, regs 0x20, off 0x0000, imm little-endian.
#[inline(always)]
unsafe fn sock_destroy(sk: u64) -> i64 {
    let ret: i64;
    core::arch::asm!(
        ".byte 0x85, 0x20, 0x00, 0x00",
        ".4byte {marker}",
        marker = const SOCK_DESTROY_KFUNC_MARKER,
        inlateout("r1") sk => _,
        lateout("r0") ret,
        lateout("r2") _, lateout("r3") _, lateout("r4") _, lateout("r5") _,
    );
    ret
}

/// The iterator context's first two members: `struct bpf_iter_meta *meta`
/// and the socket (`struct sock_common *` / `struct udp_sock *`).
#[repr(C)]
pub struct IterCtx {
    _meta: *const core::ffi::c_void,
    sk: u64,
}

#[inline(always)]
fn visit(ctx: *const IterCtx, proto: u8) -> i32 {
    // SAFETY: the kernel passes a valid iterator context; the socket
    // pointer is checked for null (the verifier insists) before any use.
    unsafe {
        let sk = core::ptr::read_volatile(&(*ctx).sk);
        if sk == 0 {
            return 0;
        }
        let cookie = bpf_get_socket_cookie(sk as *mut _);
        let Some(t) = EKP_SOCK_DESTROY.get(&cookie) else {
            return 0;
        };
        let (t_proto, t_port, t_family, t_addr) = (t.proto, t.port, t.family, t.addr[0]);
        // 0: a TCP and a UDP service on one address and port both lost
        // the backend.
        if t_proto != 0 && t_proto != proto {
            return 0;
        }
        let base = sk as *const u8;
        let state = core::ptr::read_volatile(base.add(SKC_STATE));
        let connected = if proto == PROTO_UDP {
            state == TCP_ESTABLISHED
        } else {
            !matches!(
                state,
                TCP_TIME_WAIT | TCP_CLOSE | TCP_LISTEN | TCP_NEW_SYN_RECV
            )
        };
        if !connected {
            return 0;
        }
        let dport = core::ptr::read_volatile(base.add(SKC_DPORT) as *const u16);
        if dport != t_port {
            return 0;
        }
        // An IPv4 peer is in skc_daddr for AF_INET sockets and for
        // dual-stack AF_INET6 sockets connected to a v4-mapped address.
        if t_family == FAMILY_V4
            && core::ptr::read_volatile(base.add(SKC_DADDR) as *const u32) != t_addr
        {
            return 0;
        }
        if sock_destroy(sk) == 0 {
            let _ = EKP_SOCK_DESTROY.remove(&cookie);
        }
    }
    0
}

#[no_mangle]
#[link_section = "iter/tcp"]
pub extern "C" fn ekp_sock_destroy_tcp(ctx: *const IterCtx) -> i32 {
    visit(ctx, PROTO_TCP)
}

#[no_mangle]
#[link_section = "iter/udp"]
pub extern "C" fn ekp_sock_destroy_udp(ctx: *const IterCtx) -> i32 {
    visit(ctx, PROTO_UDP)
}
