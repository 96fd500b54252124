//! nf_tables over netlink: one batch per sync, written by us, sent on a
//! `NETLINK_NETFILTER` socket. No `nft` process, no cache dump: the
//! datapath knows what it programmed, so a one-service change costs a few
//! small messages whatever the table's size.
//!
//! Only what the proxy's ruleset needs is here: tables, chains, rules (the
//! expressions come from [`super::expr`]), named sets and maps with their
//! elements, and dumps of chain and set names.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub const NFPROTO_IPV4: u8 = 2;
pub const NFPROTO_IPV6: u8 = 10;

const NETLINK_NETFILTER: i32 = 12;
const NETLINK_CAP_ACK: i32 = 10;
const NETLINK_EXT_ACK: i32 = 11;
const NLM_F_CAPPED: u16 = 0x100;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLA_F_NESTED: u16 = 0x8000;

// enum nf_tables_msg_types
const NEWTABLE: u16 = 0;
const GETTABLE: u16 = 1;
const DELTABLE: u16 = 2;
const NEWCHAIN: u16 = 3;
const GETCHAIN: u16 = 4;
const DELCHAIN: u16 = 5;
const NEWRULE: u16 = 6;
const DELRULE: u16 = 8;
const NEWSET: u16 = 9;
const GETSET: u16 = 10;
const DELSET: u16 = 11;
const NEWSETELEM: u16 = 12;
const DELSETELEM: u16 = 14;

// Attributes shared by several objects.
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

/// Set flags (`enum nft_set_flags`).
pub const NFT_SET_MAP: u32 = 0x8;
pub const NFT_SET_TIMEOUT: u32 = 0x10;
pub const NFT_SET_EVAL: u32 = 0x20;
/// The data type of verdict maps.
pub const NFT_DATA_VERDICT: u32 = 0xffff_ff00;

/// Verdict codes (netfilter's and nf_tables' own).
pub const NF_DROP: i32 = 0;
pub const NF_ACCEPT: i32 = 1;
pub const NFT_JUMP: i32 = -3;
pub const NFT_GOTO: i32 = -4;
pub const NFT_RETURN: i32 = -5;

/// A netlink attribute writer over one growing buffer.
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

/// A verdict-map or set element: its key bytes and, for maps, a verdict.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Element {
    pub key: Vec<u8>,
    pub verdict: Option<(i32, Option<String>)>,
}

/// A set to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetSpec {
    pub name: String,
    pub flags: u32,
    pub key_type: u32,
    pub key_len: u32,
    /// Milliseconds; 0 = none.
    pub timeout_ms: u64,
}

/// One nf_tables transaction. Each message keeps a one-line description
/// so a rejected batch names the failing part.
pub struct Batch {
    buf: Vec<u8>,
    seq: u32,
    first_seq: u32,
    descriptions: Vec<String>,
    set_id: u32,
}

impl Default for Batch {
    fn default() -> Self {
        Self::new()
    }
}

impl Batch {
    pub fn new() -> Batch {
        let first_seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(1);
        let mut b = Batch {
            buf: Vec::new(),
            seq: first_seq,
            first_seq,
            descriptions: Vec::new(),
            set_id: 1,
        };
        b.header(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, 0, &[], "batch begin");
        b
    }

    /// The number of commands in the batch (begin/end excluded).
    pub fn len(&self) -> usize {
        self.descriptions.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn header(&mut self, kind: u16, flags: u16, family: u8, attrs: &[u8], what: &str) {
        let res_id = if kind == NFNL_MSG_BATCH_BEGIN || kind == NFNL_MSG_BATCH_END {
            NFNL_SUBSYS_NFTABLES
        } else {
            0
        };
        push_message(&mut self.buf, kind, flags, self.seq, family, res_id, attrs);
        self.seq = self.seq.wrapping_add(1);
        self.descriptions.push(what.to_owned());
    }

    fn msg(&mut self, kind: u16, flags: u16, family: u8, attrs: Attrs, what: String) {
        self.header(
            (NFNL_SUBSYS_NFTABLES << 8) | kind,
            NLM_F_REQUEST | flags,
            family,
            &attrs.buf,
            &what,
        );
    }

    pub fn add_table(&mut self, family: u8, table: &str) {
        let mut a = Attrs::default();
        a.str(1, table);
        self.msg(
            NEWTABLE,
            NLM_F_CREATE,
            family,
            a,
            format!("add table {table}"),
        );
    }

    pub fn delete_table(&mut self, family: u8, table: &str) {
        let mut a = Attrs::default();
        a.str(1, table);
        self.msg(DELTABLE, 0, family, a, format!("delete table {table}"));
    }

    /// `add chain`; `hook` = (type, hook number, priority) for base chains.
    pub fn add_chain(
        &mut self,
        family: u8,
        table: &str,
        name: &str,
        hook: Option<(&str, u32, i32)>,
    ) {
        let mut a = Attrs::default();
        a.str(1, table).str(3, name);
        if let Some((kind, hooknum, prio)) = hook {
            a.nest(4, |h| {
                h.be32(1, hooknum).be32(2, prio as u32);
            });
            a.be32(5, NF_ACCEPT as u32).str(7, kind);
        }
        self.msg(
            NEWCHAIN,
            NLM_F_CREATE,
            family,
            a,
            format!("add chain {name}"),
        );
    }

    /// A regular chain carrying `comment` (nft shows it in listings).
    pub fn add_commented_chain(&mut self, family: u8, table: &str, name: &str, comment: &str) {
        let mut a = Attrs::default();
        a.str(1, table).str(3, name);
        // libnftnl's user-data TLV: type 0 (comment), u8 length, the
        // NUL-terminated text; 255 bytes at most.
        let mut text: String = comment.chars().take(200).collect();
        while text.len() > 250 {
            text.pop();
        }
        let mut udata = vec![0u8, (text.len() + 1) as u8];
        udata.extend_from_slice(text.as_bytes());
        udata.push(0);
        a.bytes(12, &udata);
        self.msg(
            NEWCHAIN,
            NLM_F_CREATE,
            family,
            a,
            format!("add chain {name}"),
        );
    }

    pub fn delete_chain(&mut self, family: u8, table: &str, name: &str) {
        let mut a = Attrs::default();
        a.str(1, table).str(3, name);
        self.msg(DELCHAIN, 0, family, a, format!("delete chain {name}"));
    }

    /// Removes every rule of `chain`, or of the whole table with `None`.
    pub fn flush_rules(&mut self, family: u8, table: &str, chain: Option<&str>) {
        let mut a = Attrs::default();
        a.str(1, table);
        if let Some(c) = chain {
            a.str(2, c);
        }
        self.msg(
            DELRULE,
            0,
            family,
            a,
            format!("flush chain {}", chain.unwrap_or("(all)")),
        );
    }

    /// Appends a rule; `exprs` holds its encoded expression list and
    /// `text` its nft form for error messages.
    pub fn add_rule(&mut self, family: u8, table: &str, chain: &str, exprs: &Attrs, text: &str) {
        let mut a = Attrs::default();
        a.str(1, table).str(2, chain);
        a.nest(4, |l| l.buf.extend_from_slice(&exprs.buf));
        self.msg(
            NEWRULE,
            NLM_F_CREATE | NLM_F_APPEND,
            family,
            a,
            format!("add rule {chain} {text}"),
        );
    }

    pub fn add_set(&mut self, family: u8, table: &str, set: &SetSpec) {
        let mut a = Attrs::default();
        a.str(1, table)
            .str(2, &set.name)
            .be32(3, set.flags)
            .be32(4, set.key_type)
            .be32(5, set.key_len);
        if set.flags & NFT_SET_MAP != 0 {
            a.be32(6, NFT_DATA_VERDICT);
        }
        a.be32(10, self.set_id);
        self.set_id += 1;
        if set.timeout_ms > 0 {
            a.be64(11, set.timeout_ms);
        }
        self.msg(
            NEWSET,
            NLM_F_CREATE,
            family,
            a,
            format!("add set {}", set.name),
        );
    }

    pub fn delete_set(&mut self, family: u8, table: &str, name: &str) {
        let mut a = Attrs::default();
        a.str(1, table).str(2, name);
        self.msg(DELSET, 0, family, a, format!("delete set {name}"));
    }

    /// Removes every element of a set or map.
    pub fn flush_set(&mut self, family: u8, table: &str, name: &str) {
        let mut a = Attrs::default();
        a.str(1, table).str(2, name);
        self.msg(DELSETELEM, 0, family, a, format!("flush set {name}"));
    }

    fn elements(
        &mut self,
        kind: u16,
        family: u8,
        table: &str,
        set: &str,
        elems: &[Element],
        what: String,
    ) {
        // A message must stay well under the 64 KiB an attribute length
        // can describe: big element lists go in chunks.
        for chunk in elems.chunks(512) {
            let mut a = Attrs::default();
            a.str(1, table).str(2, set);
            a.nest(3, |list| {
                for e in chunk {
                    list.nest(NFTA_LIST_ELEM, |el| {
                        el.data_value(1, &e.key);
                        if let Some((code, chain)) = &e.verdict {
                            el.data_verdict(2, *code, chain.as_deref());
                        }
                    });
                }
            });
            let flags = if kind == NEWSETELEM { NLM_F_CREATE } else { 0 };
            self.msg(kind, flags, family, a, what.clone());
        }
    }

    pub fn add_elements(
        &mut self,
        family: u8,
        table: &str,
        set: &str,
        elems: &[Element],
        what: String,
    ) {
        self.elements(NEWSETELEM, family, table, set, elems, what);
    }

    pub fn delete_elements(
        &mut self,
        family: u8,
        table: &str,
        set: &str,
        elems: &[Element],
        what: String,
    ) {
        self.elements(DELSETELEM, family, table, set, elems, what);
    }

    /// Sends the batch as one transaction: all of it applies, or none.
    pub fn commit(mut self) -> Result<(), CommitError> {
        if self.is_empty() {
            return Ok(());
        }
        // The last command asks for an ack, so the answer always holds
        // at least one message once the kernel is done.
        self.header(NFNL_MSG_BATCH_END, NLM_F_REQUEST, 0, &[], "batch end");
        set_ack_on_last_command(&mut self.buf);
        let sock = Socket::open().map_err(CommitError::Io)?;
        sock.send(&self.buf).map_err(CommitError::Io)?;
        let mut failures = Vec::new();
        let mut acked = false;
        for (seq, errno, ext) in sock.read_acks().map_err(CommitError::Io)? {
            if errno == 0 {
                acked = true;
                continue;
            }
            let idx = seq.wrapping_sub(self.first_seq) as usize;
            let what = self
                .descriptions
                .get(idx)
                .cloned()
                .unwrap_or_else(|| format!("message {seq}"));
            let mut reason = io::Error::from_raw_os_error(errno).to_string();
            if !ext.is_empty() {
                reason.push_str(&format!(" ({ext})"));
            }
            failures.push(format!("{what}: {reason}"));
        }
        if !failures.is_empty() {
            return Err(CommitError::Rejected(failures));
        }
        if !acked {
            return Err(CommitError::Io(io::Error::other(
                "the kernel did not answer the batch",
            )));
        }
        Ok(())
    }
}

/// Appends one nfnetlink message: `struct nlmsghdr`, `struct nfgenmsg`
/// (family, version 0, `res_id` big endian), then `attrs`.
fn push_message(
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
fn errno_of(payload: &[u8]) -> i32 {
    let head = payload.get(..4).and_then(|b| <[u8; 4]>::try_from(b).ok());
    -i32::from_ne_bytes(head.unwrap_or([0; 4]))
}

/// Sets NLM_F_ACK on the last message before the batch end.
fn set_ack_on_last_command(buf: &mut [u8]) {
    let mut off = 0;
    let mut last_cmd = None;
    while off + 16 <= buf.len() {
        let len = u32::from_ne_bytes(buf[off..off + 4].try_into().unwrap_or([0; 4])) as usize;
        let kind = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
        if kind != NFNL_MSG_BATCH_BEGIN && kind != NFNL_MSG_BATCH_END {
            last_cmd = Some(off);
        }
        if len == 0 {
            break;
        }
        off += len;
    }
    if let Some(off) = last_cmd {
        let flags = u16::from_ne_bytes([buf[off + 6], buf[off + 7]]) | NLM_F_ACK;
        buf[off + 6..off + 8].copy_from_slice(&flags.to_ne_bytes());
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("netlink: {0}")]
    Io(io::Error),
    #[error("{}", .0.join("; "))]
    Rejected(Vec<String>),
}

struct Socket {
    fd: OwnedFd,
}

impl Socket {
    fn open() -> io::Result<Socket> {
        // SAFETY: plain socket(2); the descriptor is owned right away.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                NETLINK_NETFILTER,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let one: libc::c_int = 1;
        // Extended acks carry the kernel's own words for a rejection, and
        // capped acks do not echo the request back (best effort: older
        // kernels lack them).
        for opt in [NETLINK_EXT_ACK, NETLINK_CAP_ACK] {
            // SAFETY: setsockopt with a valid int option value.
            unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_NETLINK,
                    opt,
                    (&one as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as u32,
                );
            }
        }
        Ok(Socket { fd })
    }

    fn send(&self, buf: &[u8]) -> io::Result<()> {
        // A batch is one datagram: the send buffer must hold it whole.
        let size = libc::c_int::try_from(buf.len() + 4096).unwrap_or(libc::c_int::MAX);
        // SAFETY: setsockopt with a valid int option value.
        unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUFFORCE,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            );
        }
        // SAFETY: a zeroed sockaddr_nl addresses the kernel.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: buf and addr outlive the call.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                0,
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn recv(&self, buf: &mut [u8], flags: i32) -> io::Result<usize> {
        // SAFETY: buf is valid for writes of its length.
        let n = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                flags,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// The kernel answers a batch while `send` runs, so what is queued
    /// now is the whole answer: (seq, errno, extended ack message).
    fn read_acks(&self) -> io::Result<Vec<(u32, i32, String)>> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = match self.recv(&mut buf, libc::MSG_DONTWAIT) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            };
            for (kind, flags, seq, payload) in messages(&buf[..n]) {
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
        }
        Ok(out)
    }

    /// A dump request; calls `each` with every answer's attributes.
    fn dump(&self, kind: u16, family: u8, each: impl FnMut(&[u8])) -> io::Result<()> {
        self.dump_subsys(NFNL_SUBSYS_NFTABLES, kind, family, each)
    }

    fn dump_subsys(
        &self,
        subsys: u16,
        kind: u16,
        family: u8,
        mut each: impl FnMut(&[u8]),
    ) -> io::Result<()> {
        let mut b = Vec::new();
        push_message(
            &mut b,
            (subsys << 8) | kind,
            NLM_F_REQUEST | NLM_F_DUMP,
            1,
            family,
            0,
            &[],
        );
        self.send(&b)?;
        let mut buf = vec![0u8; 1 << 20];
        // Bounded: a dump ends with NLMSG_DONE; the cap only guards
        // against a kernel that never says so.
        for _ in 0..1_000_000 {
            let n = self.recv(&mut buf, 0)?;
            for (k, _flags, _seq, payload) in messages(&buf[..n]) {
                match k {
                    NLMSG_DONE => return Ok(()),
                    NLMSG_ERROR => {
                        let errno = errno_of(payload);
                        if errno != 0 {
                            return Err(io::Error::from_raw_os_error(errno));
                        }
                    }
                    _ if payload.len() >= 4 => each(&payload[4..]),
                    _ => {}
                }
            }
        }
        Err(io::Error::other("netlink dump did not end"))
    }
}

/// (type, flags, seq, payload) of each message in a datagram.
fn messages(mut buf: &[u8]) -> Vec<(u16, u16, u32, &[u8])> {
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

/// The attributes of a buffer: (type without flags, payload).
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

fn attr_str(v: &[u8]) -> String {
    String::from_utf8_lossy(v.split(|b| *b == 0).next().unwrap_or_default()).into_owned()
}

/// NLMSGERR_ATTR_MSG from an extended ack, if any.
fn ext_ack_message(payload: &[u8]) -> String {
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

/// ctnetlink (conntrack over netlink), for the UDP cleanup.
pub mod ct {
    use super::*;

    const SUBSYS: u16 = 1;
    const MSG_GET: u16 = 1;
    const MSG_DELETE: u16 = 2;
    const CTA_TUPLE_ORIG: u16 = 1;
    const CTA_TUPLE_REPLY: u16 = 2;
    const CTA_ZONE: u16 = 18;

    /// One address/port tuple.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Tuple {
        pub src: IpAddr,
        pub dst: IpAddr,
        pub proto: u8,
        pub sport: u16,
        pub dport: u16,
    }

    /// A conntrack entry: its original and reply directions.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Entry {
        pub orig: Tuple,
        pub reply: Tuple,
        pub zone: Option<u16>,
    }

    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    fn tuple(buf: &[u8]) -> Option<Tuple> {
        let (mut src, mut dst, mut proto, mut sport, mut dport) = (None, None, None, 0, 0);
        for (k, v) in attrs(buf) {
            match k {
                1 => {
                    for (ik, iv) in attrs(v) {
                        let ip = match iv.len() {
                            4 => <[u8; 4]>::try_from(iv)
                                .ok()
                                .map(|b| IpAddr::V4(Ipv4Addr::from(b))),
                            16 => <[u8; 16]>::try_from(iv)
                                .ok()
                                .map(|b| IpAddr::V6(Ipv6Addr::from(b))),
                            _ => None,
                        };
                        match ik {
                            1 | 3 => src = ip,
                            2 | 4 => dst = ip,
                            _ => {}
                        }
                    }
                }
                2 => {
                    for (pk, pv) in attrs(v) {
                        match (pk, pv.len()) {
                            (1, 1) => proto = Some(pv[0]),
                            (2, 2) => sport = u16::from_be_bytes([pv[0], pv[1]]),
                            (3, 2) => dport = u16::from_be_bytes([pv[0], pv[1]]),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        Some(Tuple {
            src: src?,
            dst: dst?,
            proto: proto?,
            sport,
            dport,
        })
    }

    fn parse(buf: &[u8]) -> Option<Entry> {
        let a = attrs(buf);
        let find = |kind| a.iter().find(|(k, _)| *k == kind).map(|(_, v)| *v);
        Some(Entry {
            orig: tuple(find(CTA_TUPLE_ORIG)?)?,
            reply: tuple(find(CTA_TUPLE_REPLY)?)?,
            zone: find(CTA_ZONE)
                .filter(|v| v.len() == 2)
                .map(|v| u16::from_be_bytes([v[0], v[1]])),
        })
    }

    /// Every conntrack entry of `family` (`NFPROTO_IPV4`/`NFPROTO_IPV6`)
    /// with protocol `proto`.
    pub fn list(family: u8, proto: u8) -> io::Result<Vec<Entry>> {
        let sock = Socket::open()?;
        let mut out = Vec::new();
        sock.dump_subsys(SUBSYS, MSG_GET, family, |a| {
            if let Some(e) = parse(a) {
                if e.orig.proto == proto && e.orig.src.is_ipv4() == (family == NFPROTO_IPV4) {
                    out.push(e);
                }
            }
        })?;
        Ok(out)
    }

    fn encode_tuple(a: &mut Attrs, kind: u16, t: &Tuple) {
        a.nest(kind, |n| {
            n.nest(1, |ip| match (t.src, t.dst) {
                (IpAddr::V4(s), IpAddr::V4(d)) => {
                    ip.bytes(1, &s.octets()).bytes(2, &d.octets());
                }
                (IpAddr::V6(s), IpAddr::V6(d)) => {
                    ip.bytes(3, &s.octets()).bytes(4, &d.octets());
                }
                _ => {}
            });
            n.nest(2, |p| {
                p.bytes(1, &[t.proto])
                    .bytes(2, &t.sport.to_be_bytes())
                    .bytes(3, &t.dport.to_be_bytes());
            });
        });
    }

    /// Deletes `entries`; returns how many the kernel still had.
    pub fn delete(family: u8, entries: &[Entry]) -> io::Result<usize> {
        let sock = Socket::open()?;
        let mut deleted = 0;
        // A few hundred per datagram keeps the answers within the
        // socket's receive buffer.
        for chunk in entries.chunks(256) {
            let mut buf = Vec::new();
            for (i, e) in chunk.iter().enumerate() {
                let mut a = Attrs::default();
                encode_tuple(&mut a, CTA_TUPLE_ORIG, &e.orig);
                if let Some(z) = e.zone {
                    a.bytes(CTA_ZONE, &z.to_be_bytes());
                }
                push_message(
                    &mut buf,
                    (SUBSYS << 8) | MSG_DELETE,
                    NLM_F_REQUEST | NLM_F_ACK,
                    i as u32 + 1,
                    family,
                    0,
                    &a.buf,
                );
            }
            sock.send(&buf)?;
            for (_, errno, _) in sock.read_acks()? {
                // ENOENT: gone already (it timed out, or another delete).
                if errno == 0 {
                    deleted += 1;
                } else if errno != libc::ENOENT {
                    return Err(io::Error::from_raw_os_error(errno));
                }
            }
        }
        Ok(deleted)
    }
}

/// The names of the tables of `family`.
pub fn list_tables(family: u8) -> io::Result<Vec<String>> {
    let sock = Socket::open()?;
    let mut out = Vec::new();
    sock.dump(GETTABLE, family, |a| {
        if let Some((_, v)) = attrs(a).into_iter().find(|(k, _)| *k == 1) {
            out.push(attr_str(v));
        }
    })?;
    Ok(out)
}

/// A set as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetInfo {
    pub name: String,
    pub timeout_ms: u64,
}

/// The chains and sets of `table` in `family` (empty when it is absent).
pub fn list_objects(family: u8, table: &str) -> io::Result<(Vec<String>, Vec<SetInfo>)> {
    let sock = Socket::open()?;
    let mut chains = Vec::new();
    sock.dump(GETCHAIN, family, |a| {
        let a = attrs(a);
        let t = a.iter().find(|(k, _)| *k == 1).map(|(_, v)| attr_str(v));
        let n = a.iter().find(|(k, _)| *k == 3).map(|(_, v)| attr_str(v));
        if let (Some(t), Some(n)) = (t, n) {
            if t == table {
                chains.push(n);
            }
        }
    })?;
    let mut sets = Vec::new();
    sock.dump(GETSET, family, |a| {
        let a = attrs(a);
        let t = a.iter().find(|(k, _)| *k == 1).map(|(_, v)| attr_str(v));
        let n = a.iter().find(|(k, _)| *k == 2).map(|(_, v)| attr_str(v));
        let timeout = a
            .iter()
            .find(|(k, _)| *k == 11)
            .and_then(|(_, v)| <[u8; 8]>::try_from(*v).ok())
            .map(u64::from_be_bytes)
            .unwrap_or(0);
        if let (Some(t), Some(n)) = (t, n) {
            if t == table && !n.starts_with("__") {
                sets.push(SetInfo {
                    name: n,
                    timeout_ms: timeout,
                });
            }
        }
    })?;
    Ok((chains, sets))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_padded_and_nests_carry_their_length() {
        let mut a = Attrs::default();
        a.str(1, "ab").nest(2, |n| {
            n.be32(1, 7);
        });
        assert_eq!(
            a.buf,
            [
                7, 0, 1, 0, b'a', b'b', 0, 0, // "ab\0" padded to 8
                12, 0, 2, 0x80, // nested, 4 + 8
                8, 0, 1, 0, 0, 0, 0, 7,
            ]
        );
        let parsed = attrs(&a.buf);
        assert_eq!(parsed[0], (1, &b"ab\0"[..]));
        assert_eq!(parsed[1].0, 2);
    }

    #[test]
    fn the_last_command_asks_for_the_ack() {
        let mut b = Batch::new();
        b.add_table(NFPROTO_IPV4, "t");
        b.add_table(NFPROTO_IPV4, "u");
        b.header(NFNL_MSG_BATCH_END, NLM_F_REQUEST, 0, &[], "end");
        set_ack_on_last_command(&mut b.buf);
        let msgs = messages(&b.buf);
        let flags: Vec<u16> = msgs.iter().map(|m| m.1 & NLM_F_ACK).collect();
        assert_eq!(flags, [0, 0, NLM_F_ACK, 0]);
        assert_eq!(b.descriptions[2], "add table u");
    }
}
