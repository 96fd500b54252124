//! nf_tables transactions: one [`Batch`] per sync, written by us, sent on
//! the netlink socket of [`super::nlsock`]. No `nft` process, no cache
//! dump: the datapath knows what it programmed, so a one-service change
//! costs a few small messages whatever the table's size.
//!
//! Only what the proxy's ruleset needs is here: tables, chains, rules (the
//! expressions come from [`super::expr`]), named sets and maps with their
//! elements, and dumps of chain and set names.

use std::io;
use std::net::IpAddr;

use super::nlsock::*;

// nft's datatype numbers of addresses, for set key types.
pub(super) const TYPE_IPV4: u32 = 7;
pub(super) const TYPE_IPV6: u32 = 8;

/// An nf_tables address family the proxy programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    /// The nftables family name.
    pub fn nft(self) -> &'static str {
        match self {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        }
    }

    /// The `ip_family` metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    /// `NFPROTO_IPV4` / `NFPROTO_IPV6`.
    pub fn nfproto(self) -> u32 {
        u32::from(self.nfproto_u8())
    }

    pub fn nfproto_u8(self) -> u8 {
        match self {
            Family::V4 => NFPROTO_IPV4,
            Family::V6 => NFPROTO_IPV6,
        }
    }

    /// Address length in bytes.
    pub fn addr_len(self) -> u32 {
        match self {
            Family::V4 => 4,
            Family::V6 => 16,
        }
    }

    pub(super) fn addr_type(self) -> u32 {
        match self {
            Family::V4 => TYPE_IPV4,
            Family::V6 => TYPE_IPV6,
        }
    }

    pub(super) fn of(ip: &IpAddr) -> Family {
        if ip.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }
}

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

/// Elements per message: a message must stay well under the 64 KiB an
/// attribute length can describe, so big element lists go in chunks.
pub const ELEMENTS_PER_MESSAGE: usize = 512;

/// A set or map element: its key bytes and, in a verdict map, a
/// verdict; in a data map, its value bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Element {
    pub key: Vec<u8>,
    pub verdict: Option<(i32, Option<String>)>,
    pub data: Option<Vec<u8>>,
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
    /// A data map's value type and length in bytes (`None` with
    /// [`NFT_SET_MAP`]: a verdict map).
    pub data: Option<(u32, u32)>,
}

/// How many of a batch's first commands keep a description as they were
/// added (a rule with its nft text, an element list with its first keys):
/// the ones [`Batch::descriptions`] gives. A later command that the kernel
/// rejects is described from its own bytes ([`describe_message`]: what it
/// does to which chain, set or map). At 50,000 services the texts of all
/// 100,000 commands were 10 MiB held through the commit, on top of the
/// transaction.
pub const COMMANDS_DESCRIBED: usize = 64;

/// One nf_tables transaction. Its first [`COMMANDS_DESCRIBED`] messages
/// keep a one-line description, the others are described from their
/// bytes, so a rejected batch names the failing part.
pub struct Batch {
    buf: Vec<u8>,
    seq: u32,
    first_seq: u32,
    /// Messages, begin included.
    messages: usize,
    descriptions: Descriptions,
    set_id: u32,
}

/// One line per message, all in one buffer: a `String` each costs more
/// than its text at 100,000 messages.
#[derive(Default)]
struct Descriptions {
    text: String,
    /// Where each line ends in `text`.
    ends: Vec<usize>,
}

impl Descriptions {
    fn push(&mut self, line: &str) {
        self.text.push_str(line);
        self.ends.push(self.text.len());
    }

    fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = i.checked_sub(1).map_or(0, |p| self.ends[p]);
        self.text.get(start..end)
    }
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
            messages: 0,
            descriptions: Descriptions::default(),
            set_id: 1,
        };
        b.header(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, 0, &[], || {
            "batch begin".into()
        });
        b
    }

    /// The number of commands in the batch (begin/end excluded).
    pub fn len(&self) -> usize {
        self.messages - 1
    }

    /// The size of the batch's messages in bytes.
    pub fn bytes(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What each of the first [`COMMANDS_DESCRIBED`] commands does
    /// (`add rule …`, `delete element …`), begin and end left out.
    pub fn descriptions(&self) -> impl Iterator<Item = &str> {
        (1..=self.len()).map_while(|i| self.descriptions.get(i))
    }

    /// What message `index` (0: begin) does: as added, or read back from
    /// its bytes past the first [`COMMANDS_DESCRIBED`] commands.
    fn describe(&self, index: usize) -> Option<String> {
        if let Some(what) = self.descriptions.get(index) {
            return Some(what.to_owned());
        }
        let seq = self.first_seq.wrapping_add(u32::try_from(index).ok()?);
        let (kind, _, _, payload) = messages(&self.buf).into_iter().find(|m| m.2 == seq)?;
        Some(describe_message(kind, payload))
    }

    /// Appends a message; `what` describes it, asked for only while the
    /// batch keeps descriptions (see [`COMMANDS_DESCRIBED`]).
    fn header(
        &mut self,
        kind: u16,
        flags: u16,
        family: u8,
        attrs: &[u8],
        what: impl FnOnce() -> String,
    ) {
        let res_id = if kind == NFNL_MSG_BATCH_BEGIN || kind == NFNL_MSG_BATCH_END {
            NFNL_SUBSYS_NFTABLES
        } else {
            0
        };
        push_message(&mut self.buf, kind, flags, self.seq, family, res_id, attrs);
        self.seq = self.seq.wrapping_add(1);
        // Begin, then the first COMMANDS_DESCRIBED commands.
        if self.messages <= COMMANDS_DESCRIBED {
            self.descriptions.push(&what());
        }
        self.messages += 1;
    }

    fn msg(
        &mut self,
        kind: u16,
        flags: u16,
        family: u8,
        attrs: Attrs,
        what: impl FnOnce() -> String,
    ) {
        self.header(
            (NFNL_SUBSYS_NFTABLES << 8) | kind,
            NLM_F_REQUEST | flags,
            family,
            &attrs.buf,
            what,
        );
    }

    pub fn add_table(&mut self, family: u8, table: &str) {
        let mut a = Attrs::default();
        a.str(1, table);
        self.msg(NEWTABLE, NLM_F_CREATE, family, a, || {
            format!("add table {table}")
        });
    }

    pub fn delete_table(&mut self, family: u8, table: &str) {
        let mut a = Attrs::default();
        a.str(1, table);
        self.msg(DELTABLE, 0, family, a, || format!("delete table {table}"));
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
        self.msg(NEWCHAIN, NLM_F_CREATE, family, a, || {
            format!("add chain {name}")
        });
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
        self.msg(NEWCHAIN, NLM_F_CREATE, family, a, || {
            format!("add chain {name}")
        });
    }

    pub fn delete_chain(&mut self, family: u8, table: &str, name: &str) {
        let mut a = Attrs::default();
        a.str(1, table).str(3, name);
        self.msg(DELCHAIN, 0, family, a, || format!("delete chain {name}"));
    }

    /// Removes every rule of `chain`, or of the whole table with `None`.
    pub fn flush_rules(&mut self, family: u8, table: &str, chain: Option<&str>) {
        let mut a = Attrs::default();
        a.str(1, table);
        if let Some(c) = chain {
            a.str(2, c);
        }
        self.msg(DELRULE, 0, family, a, || {
            format!("flush chain {}", chain.unwrap_or("(all)"))
        });
    }

    /// Appends a rule; `exprs` holds its encoded expression list and
    /// `text` gives its nft form for the description.
    pub fn add_rule(
        &mut self,
        family: u8,
        table: &str,
        chain: &str,
        exprs: &Attrs,
        text: impl FnOnce() -> String,
    ) {
        let mut a = Attrs::default();
        a.str(1, table).str(2, chain);
        a.nest(4, |l| l.buf.extend_from_slice(&exprs.buf));
        self.msg(NEWRULE, NLM_F_CREATE | NLM_F_APPEND, family, a, || {
            format!("add rule {chain} {}", text())
        });
    }

    pub fn add_set(&mut self, family: u8, table: &str, set: &SetSpec) {
        let mut a = Attrs::default();
        a.str(1, table)
            .str(2, &set.name)
            .be32(3, set.flags)
            .be32(4, set.key_type)
            .be32(5, set.key_len);
        match set.data {
            Some((data_type, data_len)) => {
                a.be32(6, data_type).be32(7, data_len);
            }
            None if set.flags & NFT_SET_MAP != 0 => {
                a.be32(6, NFT_DATA_VERDICT);
            }
            None => {}
        }
        a.be32(10, self.set_id);
        self.set_id += 1;
        if set.timeout_ms > 0 {
            a.be64(11, set.timeout_ms);
        }
        self.msg(NEWSET, NLM_F_CREATE, family, a, || {
            format!("add set {}", set.name)
        });
    }

    pub fn delete_set(&mut self, family: u8, table: &str, name: &str) {
        let mut a = Attrs::default();
        a.str(1, table).str(2, name);
        self.msg(DELSET, 0, family, a, || format!("delete set {name}"));
    }

    /// Removes every element of a set or map.
    pub fn flush_set(&mut self, family: u8, table: &str, name: &str) {
        let mut a = Attrs::default();
        a.str(1, table).str(2, name);
        self.msg(DELSETELEM, 0, family, a, || format!("flush set {name}"));
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
        for chunk in elems.chunks(ELEMENTS_PER_MESSAGE) {
            let mut a = Attrs::default();
            a.str(1, table).str(2, set);
            a.nest(3, |list| {
                for e in chunk {
                    list.nest(NFTA_LIST_ELEM, |el| {
                        el.data_value(1, &e.key);
                        if let Some((code, chain)) = &e.verdict {
                            el.data_verdict(2, *code, chain.as_deref());
                        }
                        if let Some(data) = &e.data {
                            el.data_value(2, data);
                        }
                    });
                }
            });
            let flags = if kind == NEWSETELEM { NLM_F_CREATE } else { 0 };
            self.msg(kind, flags, family, a, || what.clone());
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
        self.header(NFNL_MSG_BATCH_END, NLM_F_REQUEST, 0, &[], || {
            "batch end".into()
        });
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
                .describe(idx)
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

/// The names of the tables of `family`.
pub fn list_tables(family: u8) -> io::Result<Vec<String>> {
    let sock = Socket::open()?;
    let mut out = Vec::new();
    sock.dump(GETTABLE, family, |a| out.extend(table_name(a)))?;
    Ok(out)
}

/// The name in one table of a `GETTABLE` dump. The entry fuzz/ drives.
pub fn table_name(attributes: &[u8]) -> Option<String> {
    attrs(attributes)
        .into_iter()
        .find(|(k, _)| *k == 1)
        .map(|(_, v)| attr_str(v))
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
    sock.dump(GETCHAIN, family, |a| chains.extend(chain_of(a, table)))?;
    let mut sets = Vec::new();
    sock.dump(GETSET, family, |a| sets.extend(set_of(a, table)))?;
    Ok((chains, sets))
}

/// The chain name in one object of a `GETCHAIN` dump when it belongs to
/// `table`. The entry fuzz/ drives.
pub fn chain_of(attributes: &[u8], table: &str) -> Option<String> {
    let a = attrs(attributes);
    let t = a.iter().find(|(k, _)| *k == 1).map(|(_, v)| attr_str(v))?;
    let n = a.iter().find(|(k, _)| *k == 3).map(|(_, v)| attr_str(v))?;
    (t == table).then_some(n)
}

/// One object of a `GETSET` dump when it is a named set of `table`
/// (anonymous `__` sets left out). The entry fuzz/ drives.
pub fn set_of(attributes: &[u8], table: &str) -> Option<SetInfo> {
    let a = attrs(attributes);
    let t = a.iter().find(|(k, _)| *k == 1).map(|(_, v)| attr_str(v))?;
    let n = a.iter().find(|(k, _)| *k == 2).map(|(_, v)| attr_str(v))?;
    let timeout = a
        .iter()
        .find(|(k, _)| *k == 11)
        .and_then(|(_, v)| <[u8; 8]>::try_from(*v).ok())
        .map(u64::from_be_bytes)
        .unwrap_or(0);
    (t == table && !n.starts_with("__")).then_some(SetInfo {
        name: n,
        timeout_ms: timeout,
    })
}

/// What an nf_tables message of `kind` does, read from its payload (the
/// nfgenmsg header, then the attributes): the verb and the chain, set or
/// map it names, and how many elements it carries.
pub(super) fn describe_message(kind: u16, payload: &[u8]) -> String {
    let fields = attrs(payload.get(4..).unwrap_or_default());
    let text = |n: u16| {
        fields
            .iter()
            .find(|(k, _)| *k == n)
            .map(|(_, v)| attr_str(v))
    };
    let name = |n: u16| text(n).unwrap_or_default();
    let elements = || {
        fields
            .iter()
            .find(|(k, _)| *k == 3)
            .map_or(0, |(_, list)| attrs(list).len())
    };
    match kind & 0xff {
        NEWTABLE => format!("add table {}", name(1)),
        DELTABLE => format!("delete table {}", name(1)),
        NEWCHAIN => format!("add chain {}", name(3)),
        DELCHAIN => format!("delete chain {}", name(3)),
        NEWRULE => format!("add rule {}", name(2)),
        DELRULE => format!("flush chain {}", text(2).as_deref().unwrap_or("(all)")),
        NEWSET => format!("add set {}", name(2)),
        DELSET => format!("delete set {}", name(2)),
        NEWSETELEM => format!("add element {} ({} elements)", name(2), elements()),
        DELSETELEM => match elements() {
            0 => format!("flush set {}", name(2)),
            n => format!("delete element {} ({n} elements)", name(2)),
        },
        other => format!("nf_tables message {other}"),
    }
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
        b.header(NFNL_MSG_BATCH_END, NLM_F_REQUEST, 0, &[], || "end".into());
        set_ack_on_last_command(&mut b.buf);
        let msgs = messages(&b.buf);
        let flags: Vec<u16> = msgs.iter().map(|m| m.1 & NLM_F_ACK).collect();
        assert_eq!(flags, [0, 0, NLM_F_ACK, 0]);
        assert_eq!(b.descriptions.get(2), Some("add table u"));
    }

    #[test]
    fn commands_past_the_described_ones_are_described_from_their_bytes() {
        let mut b = Batch::new();
        b.add_table(NFPROTO_IPV4, "t");
        for i in 0..COMMANDS_DESCRIBED {
            b.add_chain(NFPROTO_IPV4, "t", &format!("c{i}"), None);
        }
        let rule = Attrs::default();
        b.add_rule(NFPROTO_IPV4, "t", "late", &rule, || {
            unreachable!("no text kept")
        });
        let elems = [
            Element {
                key: vec![1, 2, 3, 4],
                verdict: None,
                data: None,
            },
            Element {
                key: vec![5, 6, 7, 8],
                verdict: None,
                data: None,
            },
        ];
        b.add_elements(NFPROTO_IPV4, "t", "late-set", &elems, "not kept".to_owned());
        b.flush_set(NFPROTO_IPV4, "t", "late-set");
        b.delete_elements(
            NFPROTO_IPV4,
            "t",
            "late-set",
            &elems[..1],
            "not kept".to_owned(),
        );
        b.flush_rules(NFPROTO_IPV4, "t", None);
        assert_eq!(b.len(), COMMANDS_DESCRIBED + 6);
        assert_eq!(b.descriptions().count(), COMMANDS_DESCRIBED);
        assert_eq!(b.describe(1).as_deref(), Some("add table t"));
        assert_eq!(
            b.describe(COMMANDS_DESCRIBED).as_deref(),
            Some("add chain c62")
        );
        let late: Vec<String> = (COMMANDS_DESCRIBED + 1..=COMMANDS_DESCRIBED + 6)
            .map(|i| b.describe(i).unwrap())
            .collect();
        assert_eq!(
            late,
            [
                "add chain c63",
                "add rule late",
                "add element late-set (2 elements)",
                "flush set late-set",
                "delete element late-set (1 elements)",
                "flush chain (all)",
            ]
        );
        assert_eq!(b.describe(COMMANDS_DESCRIBED + 7), None);
    }
}
