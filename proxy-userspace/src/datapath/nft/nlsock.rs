//! The netlink side of nf_tables and ctnetlink: a `NETLINK_NETFILTER`
//! socket, nfnetlink message framing and the attribute codec. Hand-written
//! because the Rust nf_tables crates are GPL or cover too little, and the
//! netlink crates do not frame nfnetlink batches; see [`super::batch`] for
//! the nf_tables messages and [`super::conntrack`] for ctnetlink.

use std::io;
use std::os::fd::AsRawFd;

pub const NFPROTO_IPV4: u8 = 2;
pub const NFPROTO_IPV6: u8 = 10;

pub(super) const NLM_F_CAPPED: u16 = 0x100;
pub(super) const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub(super) const NFNL_MSG_BATCH_BEGIN: u16 = 16;
pub(super) const NFNL_MSG_BATCH_END: u16 = 17;

pub(super) const NLM_F_REQUEST: u16 = 0x1;
pub(super) const NLM_F_ACK: u16 = 0x4;
pub(super) const NLM_F_DUMP: u16 = 0x300;
pub(super) const NLM_F_CREATE: u16 = 0x400;
pub(super) const NLM_F_APPEND: u16 = 0x800;
pub(super) const NLMSG_ERROR: u16 = 2;
pub(super) const NLMSG_DONE: u16 = 3;
pub(super) const NLA_F_NESTED: u16 = 0x8000;

/// A netlink attribute writer over one growing buffer.
// Attributes shared by several objects.
pub(super) const NFTA_LIST_ELEM: u16 = 1;
pub(super) const NFTA_DATA_VALUE: u16 = 1;
pub(super) const NFTA_DATA_VERDICT: u16 = 2;
pub(super) const NFTA_VERDICT_CODE: u16 = 1;
pub(super) const NFTA_VERDICT_CHAIN: u16 = 2;

#[derive(Default)]
pub struct Attrs {
    pub buf: Vec<u8>,
}

impl Attrs {
    pub fn bytes(&mut self, kind: u16, data: &[u8]) -> &mut Self {
        let len = 4 + data.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
        self
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    /// A NUL-terminated string attribute.
    pub fn str(&mut self, kind: u16, s: &str) -> &mut Self {
        let mut data = Vec::with_capacity(s.len() + 1);
        data.extend_from_slice(s.as_bytes());
        data.push(0);
        self.bytes(kind, &data)
    }

    /// A big-endian u32 (nf_tables' integer attributes are network order).
    pub fn be32(&mut self, kind: u16, v: u32) -> &mut Self {
        self.bytes(kind, &v.to_be_bytes())
    }

    pub fn be64(&mut self, kind: u16, v: u64) -> &mut Self {
        self.bytes(kind, &v.to_be_bytes())
    }

    /// A nested attribute filled by `f`.
    pub fn nest(&mut self, kind: u16, f: impl FnOnce(&mut Attrs)) -> &mut Self {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        self.buf
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        f(self);
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self
    }

    /// `NFTA_DATA_VALUE` inside a nest of `kind`.
    pub fn data_value(&mut self, kind: u16, value: &[u8]) -> &mut Self {
        self.nest(kind, |a| {
            a.bytes(NFTA_DATA_VALUE, value);
        })
    }

    /// `NFTA_DATA_VERDICT` inside a nest of `kind`.
    pub fn data_verdict(&mut self, kind: u16, code: i32, chain: Option<&str>) -> &mut Self {
        self.nest(kind, |a| {
            a.nest(NFTA_DATA_VERDICT, |v| {
                v.be32(NFTA_VERDICT_CODE, code as u32);
                if let Some(c) = chain {
                    v.str(NFTA_VERDICT_CHAIN, c);
                }
            });
        })
    }

    /// One expression (`NFTA_LIST_ELEM` { name, data }) of a rule.
    pub fn expr(&mut self, name: &str, f: impl FnOnce(&mut Attrs)) -> &mut Self {
        self.nest(NFTA_LIST_ELEM, |e| {
            e.str(1, name);
            e.nest(2, f);
        })
    }
}

/// Appends one nfnetlink message: `struct nlmsghdr`, `struct nfgenmsg`
/// (family, version 0, `res_id` big endian), then `attrs`.
pub(super) fn push_message(
    buf: &mut Vec<u8>,
    kind: u16,
    flags: u16,
    seq: u32,
    family: u8,
    res_id: u16,
    attrs: &[u8],
) {
    let len = 16 + 4 + attrs.len();
    buf.extend_from_slice(&(len as u32).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.push(family);
    buf.push(0);
    buf.extend_from_slice(&res_id.to_be_bytes());
    buf.extend_from_slice(attrs);
}

/// The error of an `NLMSG_ERROR` payload (0 for an ack).
pub(super) fn errno_of(payload: &[u8]) -> i32 {
    let head = payload.get(..4).and_then(|b| <[u8; 4]>::try_from(b).ok());
    negated_errno(i32::from_ne_bytes(head.unwrap_or([0; 4])))
}

/// The errno of the error field of an `NLMSG_ERROR`, which the kernel
/// sends negated. A value with no positive counterpart (`i32::MIN`) is no
/// errno: it reads as a protocol error instead of overflowing.
pub(super) fn negated_errno(field: i32) -> i32 {
    field.checked_neg().unwrap_or(libc::EPROTO)
}

/// A `NETLINK_NETFILTER` socket (netlink-sys) connected to the kernel.
pub(super) struct Socket {
    sock: netlink_sys::Socket,
}

impl Socket {
    pub(super) fn open() -> io::Result<Socket> {
        let sock = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_NETFILTER)?;
        sock.connect(&netlink_sys::SocketAddr::new(0, 0))?;
        // Extended acks carry the kernel's own words for a rejection, and
        // capped acks do not echo the request back (best effort: older
        // kernels lack them).
        let _ = sock.set_ext_ack(true);
        let _ = sock.set_cap_ack(true);
        Ok(Socket { sock })
    }

    pub(super) fn send(&self, buf: &[u8]) -> io::Result<()> {
        // A batch is one datagram: the send buffer must hold it whole.
        // netlink-sys sets the receive buffer only; SO_SNDBUFFORCE (root)
        // lifts the sysctl cap that SO_SNDBUF obeys.
        let size = libc::c_int::try_from(buf.len() + 4096).unwrap_or(libc::c_int::MAX);
        // SAFETY: setsockopt with a valid int option value on an open fd.
        unsafe {
            libc::setsockopt(
                self.sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUFFORCE,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            );
        }
        self.sock.send(buf, 0)?;
        Ok(())
    }

    pub(super) fn recv(&self, mut buf: &mut [u8], flags: i32) -> io::Result<usize> {
        self.sock.recv(&mut buf, flags)
    }

    /// The kernel answers a batch while `send` runs, so what is queued
    /// now is the whole answer: (seq, errno, extended ack message).
    pub(super) fn read_acks(&self) -> io::Result<Vec<(u32, i32, String)>> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = match self.recv(&mut buf, libc::MSG_DONTWAIT) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            };
            out.extend(acks(&buf[..n]));
        }
        Ok(out)
    }

    /// A dump request; calls `each` with every answer's attributes.
    pub(super) fn dump(&self, kind: u16, family: u8, each: impl FnMut(&[u8])) -> io::Result<()> {
        self.dump_filtered(kind, family, &[], each)
    }

    /// A dump request carrying `attributes` (a filter, such as the table
    /// and chain of `GETRULE`); calls `each` with every answer's attributes.
    pub(super) fn dump_filtered(
        &self,
        kind: u16,
        family: u8,
        attributes: &[u8],
        mut each: impl FnMut(&[u8]),
    ) -> io::Result<()> {
        let mut b = Vec::new();
        push_message(
            &mut b,
            (NFNL_SUBSYS_NFTABLES << 8) | kind,
            NLM_F_REQUEST | NLM_F_DUMP,
            1,
            family,
            0,
            attributes,
        );
        self.send(&b)?;
        let mut buf = vec![0u8; 1 << 20];
        // Bounded: a dump ends with NLMSG_DONE; the cap only guards
        // against a kernel that never says so.
        for _ in 0..1_000_000 {
            let n = self.recv(&mut buf, 0)?;
            if let Some(end) = dump_datagram(&buf[..n], &mut each) {
                return end;
            }
        }
        Err(io::Error::other("netlink dump did not end"))
    }
}

/// The acks in one datagram: (seq, errno, extended ack message). The
/// entry fuzz/ drives.
pub fn acks(buf: &[u8]) -> Vec<(u32, i32, String)> {
    let mut out = Vec::new();
    for (kind, flags, seq, payload) in messages(buf) {
        if kind != NLMSG_ERROR || payload.len() < 4 {
            continue;
        }
        let errno = errno_of(payload);
        let ext = if flags & NLM_F_CAPPED != 0 {
            ext_ack_message(payload)
        } else {
            String::new()
        };
        out.push((seq, errno, ext));
    }
    out
}

/// One datagram of a dump's answer: calls `each` with every object's
/// attributes; `Some` once the dump has ended (done, or the kernel's
/// error). The entry fuzz/ drives.
pub fn dump_datagram(buf: &[u8], mut each: impl FnMut(&[u8])) -> Option<io::Result<()>> {
    for (kind, _flags, _seq, payload) in messages(buf) {
        match kind {
            NLMSG_DONE => return Some(Ok(())),
            NLMSG_ERROR => {
                let errno = errno_of(payload);
                if errno != 0 {
                    return Some(Err(io::Error::from_raw_os_error(errno)));
                }
            }
            _ if payload.len() >= 4 => each(&payload[4..]),
            _ => {}
        }
    }
    None
}

/// (type, flags, seq, payload) of each message in a datagram. The entry
/// fuzz/ drives.
pub fn messages(mut buf: &[u8]) -> Vec<(u16, u16, u32, &[u8])> {
    let mut out = Vec::new();
    while buf.len() >= 16 {
        let len = u32::from_ne_bytes(buf[0..4].try_into().unwrap_or([0; 4])) as usize;
        if len < 16 || len > buf.len() {
            break;
        }
        let kind = u16::from_ne_bytes([buf[4], buf[5]]);
        let flags = u16::from_ne_bytes([buf[6], buf[7]]);
        let seq = u32::from_ne_bytes(buf[8..12].try_into().unwrap_or([0; 4]));
        out.push((kind, flags, seq, &buf[16..len]));
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
    }
    out
}

/// The attributes of a buffer: (type without flags, payload). The entry
/// fuzz/ drives.
pub fn attrs(mut buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while buf.len() >= 4 {
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        if len < 4 || len > buf.len() {
            break;
        }
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & 0x3fff;
        out.push((kind, &buf[4..len]));
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
    }
    out
}

pub(super) fn attr_str(v: &[u8]) -> String {
    String::from_utf8_lossy(v.split(|b| *b == 0).next().unwrap_or_default()).into_owned()
}

/// NLMSGERR_ATTR_MSG from an extended ack, if any.
pub(super) fn ext_ack_message(payload: &[u8]) -> String {
    // struct nlmsgerr: error (4) + the request's header (16), then (a
    // capped ack) the TLVs.
    if payload.len() <= 20 {
        return String::new();
    }
    attrs(&payload[20..])
        .into_iter()
        .find(|(k, _)| *k == 1)
        .map(|(_, v)| attr_str(v))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_field_that_is_no_negated_errno_is_a_protocol_error() {
        // Found by fuzz/ (target netlink): -i32::MIN overflowed.
        assert_eq!(errno_of(&i32::MIN.to_ne_bytes()), libc::EPROTO);
        assert_eq!(errno_of(&(-libc::ENOENT).to_ne_bytes()), libc::ENOENT);
        assert_eq!(errno_of(&0i32.to_ne_bytes()), 0);
        assert_eq!(errno_of(&[]), 0);
    }
}
