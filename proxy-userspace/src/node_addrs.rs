//! This node's addresses and the interfaces holding them, read over
//! rtnetlink, and a stream of changes to them.
//!
//! NodePorts are served on the addresses `--nodeport-addresses` selects
//! ([`select`]); the tc datapath attaches to the interfaces holding them,
//! and the health-check node ports bind them. [`list`] reads every address
//! of the current network namespace with one `RTM_GETADDR` and one
//! `RTM_GETLINK` dump; [`Watcher`] waits on the link and address multicast
//! groups for "something changed" (bursts coalesced), after which the
//! caller lists again; [`subscribe`] combines the two into a task that
//! publishes each new list on a `tokio::sync::watch` channel.
//!
//! Interfaces count whatever their state: attaching to a down interface is
//! harmless, and following up/down would detach and re-attach on every
//! flap. Addresses the kernel does not yet (or will never) own — IPv6
//! duplicate address detection still running, or failed — are left out
//! until DAD ends, which the kernel announces as an address change.

use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use netlink_packet_core::{
    NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload, NlasIterator, Parseable,
    NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkExtentMask, LinkHeader, LinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::protocols::NETLINK_ROUTE;
use netlink_sys::{Socket, SocketAddr};
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::net::Cidr;

/// One address of this node and the interface holding it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeAddress {
    pub ifindex: u32,
    pub ifname: String,
    pub addr: IpAddr,
    pub prefix_len: u8,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeAddrsError {
    #[error("opening an rtnetlink socket: {0}")]
    Socket(#[source] io::Error),
    #[error("rtnetlink {what} dump: {source}")]
    Dump {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("rtnetlink dumps were interrupted by changes {0} times in a row")]
    Interrupted(usize),
    #[error("subscribing to rtnetlink link and address changes: {0}")]
    Subscribe(#[source] io::Error),
    #[error("reading rtnetlink change notifications: {0}")]
    Watch(#[source] io::Error),
}

const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const RTM_NEWLINK: u16 = 16;
const RTM_NEWADDR: u16 = 20;
const IFLA_IFNAME: u16 = 3;
/// `struct ifinfomsg`, before a link message's attributes.
const IFINFOMSG_LEN: usize = 16;
/// Room for the largest datagram the kernel sends a dump reader (it caps
/// dump skbs at 32 KiB).
const RECV_BUF: usize = 64 * 1024;
/// A dump the kernel flags as interrupted (the tables changed while it
/// ran) is read again, this many times at most.
const DUMP_ATTEMPTS: usize = 10;
/// Bounds one dump: it ends with `NLMSG_DONE`; the cap only guards against
/// a kernel that never says so.
const MAX_DUMP_DATAGRAMS: usize = 1_000_000;

/// Every usable address of the current network namespace (of the calling
/// thread), with its interface, sorted by interface index then address.
///
/// Blocking, but short: two dumps on a fresh socket. An address whose
/// interface vanished between the two dumps is left out; the change that
/// removed it wakes any [`Watcher`] subscribed before the call.
pub fn list() -> Result<Vec<NodeAddress>, NodeAddrsError> {
    let mut sock = Socket::new(NETLINK_ROUTE).map_err(NodeAddrsError::Socket)?;
    sock.bind_auto().map_err(NodeAddrsError::Socket)?;
    sock.connect(&SocketAddr::new(0, 0))
        .map_err(NodeAddrsError::Socket)?;
    let mut seq = 0;
    for _ in 0..DUMP_ATTEMPTS {
        seq += 1;
        let (addrs, addrs_intr) = dump_addresses(&sock, seq)?;
        seq += 1;
        let (names, links_intr) = dump_link_names(&sock, seq)?;
        if addrs_intr || links_intr {
            continue;
        }
        let mut out: Vec<NodeAddress> = addrs
            .into_iter()
            .filter_map(|(ifindex, addr, prefix_len)| {
                let ifname = names
                    .binary_search_by_key(&ifindex, |(i, _)| *i)
                    .ok()
                    .map(|i| names[i].1.clone())?;
                Some(NodeAddress {
                    ifindex,
                    ifname,
                    addr,
                    prefix_len,
                })
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        return Ok(out);
    }
    Err(NodeAddrsError::Interrupted(DUMP_ATTEMPTS))
}

/// The addresses NodePorts are served on: those inside `cidrs` (every one
/// when `cidrs` is empty), never loopback (127.0.0.0/8, ::1) nor IPv6
/// link-local (fe80::/10, which needs a zone to mean anything). Keeps the
/// order of `all`.
pub fn select(all: &[NodeAddress], cidrs: &[Cidr]) -> Vec<NodeAddress> {
    all.iter()
        .filter(|a| !a.addr.is_loopback() && !is_ipv6_link_local(&a.addr))
        .filter(|a| cidrs.is_empty() || cidrs.iter().any(|c| c.contains(&a.addr)))
        .cloned()
        .collect()
}

fn is_ipv6_link_local(ip: &IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

/// (ifindex, address, prefix length) of every usable address; true when
/// the kernel flagged the dump as interrupted.
#[allow(clippy::type_complexity)]
fn dump_addresses(
    sock: &Socket,
    seq: u32,
) -> Result<(Vec<(u32, IpAddr, u8)>, bool), NodeAddrsError> {
    let request = RouteNetlinkMessage::GetAddress(AddressMessage::default());
    let mut out = Vec::new();
    let intr = dump(sock, seq, request, |kind, payload| {
        if kind != RTM_NEWADDR {
            return;
        }
        match AddressMessage::parse(payload) {
            Ok(msg) => out.extend(usable_address(&msg)),
            Err(e) => tracing::debug!(error = %e, "skipping an undecodable rtnetlink address"),
        }
    })
    .map_err(|source| NodeAddrsError::Dump {
        what: "address",
        source,
    })?;
    Ok((out, intr))
}

/// The address a message announces, unless DAD has not passed for it.
fn usable_address(msg: &AddressMessage) -> Option<(u32, IpAddr, u8)> {
    let mut local = None;
    let mut address = None;
    // IFA_FLAGS, when present, is the full 32-bit set the header's byte
    // truncates.
    let mut flags = AddressFlags::from_bits_retain(u32::from(msg.header.flags.bits()));
    for attr in &msg.attributes {
        match attr {
            AddressAttribute::Local(ip) => local = Some(*ip),
            AddressAttribute::Address(ip) => address = Some(*ip),
            AddressAttribute::Flags(f) => flags = *f,
            _ => {}
        }
    }
    if flags.intersects(AddressFlags::Tentative | AddressFlags::Dadfailed) {
        return None;
    }
    // On a point-to-point IPv4 interface IFA_ADDRESS is the peer and
    // IFA_LOCAL this end; elsewhere they are equal or only IFA_ADDRESS is
    // sent (IPv6).
    let ip = local.or(address)?;
    Some((msg.header.index, ip, msg.header.prefix_len))
}

/// (ifindex, name) of every interface, sorted by ifindex; true when the
/// kernel flagged the dump as interrupted. Only the name is decoded, so an
/// attribute this crate version does not know cannot fail the listing.
fn dump_link_names(sock: &Socket, seq: u32) -> Result<(Vec<(u32, String)>, bool), NodeAddrsError> {
    let mut msg = LinkMessage::default();
    // Statistics are most of a link message and not needed here.
    msg.attributes
        .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
    let request = RouteNetlinkMessage::GetLink(msg);
    let mut out = Vec::new();
    let intr = dump(sock, seq, request, |kind, payload| {
        if kind != RTM_NEWLINK {
            return;
        }
        match link_name(payload) {
            Some(entry) => out.push(entry),
            None => tracing::debug!("skipping an rtnetlink link without a readable name"),
        }
    })
    .map_err(|source| NodeAddrsError::Dump {
        what: "link",
        source,
    })?;
    out.sort_unstable();
    Ok((out, intr))
}

fn link_name(payload: &[u8]) -> Option<(u32, String)> {
    let header = LinkHeader::parse(payload).ok()?;
    let attrs = payload.get(IFINFOMSG_LEN..)?;
    for nla in NlasIterator::new(attrs) {
        let nla = nla.ok()?;
        if nla.kind() == IFLA_IFNAME {
            let value = nla.value();
            let name = value.split(|b| *b == 0).next().unwrap_or(value);
            return Some((header.index, String::from_utf8_lossy(name).into_owned()));
        }
    }
    None
}

/// Sends a dump request and calls `each(type, payload)` for every answer.
/// Returns whether any answer carried `NLM_F_DUMP_INTR`.
fn dump(
    sock: &Socket,
    seq: u32,
    request: RouteNetlinkMessage,
    mut each: impl FnMut(u16, &[u8]),
) -> io::Result<bool> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = seq;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(request));
    packet.finalize();
    let mut out = vec![0u8; packet.buffer_len()];
    packet.serialize(&mut out);
    sock.send(&out, 0)?;

    let mut interrupted = false;
    let mut buf = vec![0u8; RECV_BUF];
    for _ in 0..MAX_DUMP_DATAGRAMS {
        let n = sock.recv(&mut &mut buf[..], 0)?;
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            let msg = NetlinkBuffer::new_checked(rest)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            let len = msg.length() as usize;
            let (kind, flags, payload) = (msg.message_type(), msg.flags(), msg.payload());
            rest = rest.get(len.next_multiple_of(4)..).unwrap_or_default();
            if msg.sequence_number() != seq || kind == NLMSG_NOOP {
                continue;
            }
            interrupted |= flags & NLM_F_DUMP_INTR != 0;
            match kind {
                // NLMSG_DONE carries the dump's own result.
                NLMSG_DONE => return errno_result(payload).map(|()| interrupted),
                NLMSG_ERROR => errno_result(payload)?,
                _ => each(kind, payload),
            }
        }
    }
    Err(io::Error::other("the dump did not end"))
}

/// The negated errno that opens an `NLMSG_ERROR` or `NLMSG_DONE` payload.
fn errno_result(payload: &[u8]) -> io::Result<()> {
    let code = payload
        .get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map_or(0, i32::from_ne_bytes);
    if code < 0 {
        Err(io::Error::from_raw_os_error(
            code.checked_neg().unwrap_or(libc::EPROTO),
        ))
    } else {
        Ok(())
    }
}

/// How long a burst of notifications must stay quiet before
/// [`Watcher::changed`] returns.
const QUIET: Duration = Duration::from_millis(50);
/// The longest [`Watcher::changed`] holds back a change during a burst
/// that does not end.
const MAX_COALESCE: Duration = Duration::from_millis(500);

/// A subscription to link and address changes of the network namespace it
/// was created in. Subscribe before the [`list`] it should follow, so no
/// change falls between the two.
pub struct Watcher {
    sock: AsyncFd<Socket>,
    buf: Vec<u8>,
}

impl Watcher {
    /// Must be called inside a tokio runtime.
    pub fn new() -> Result<Self, NodeAddrsError> {
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(NodeAddrsError::Subscribe)?;
        sock.bind_auto().map_err(NodeAddrsError::Subscribe)?;
        for group in [
            libc::RTNLGRP_LINK,
            libc::RTNLGRP_IPV4_IFADDR,
            libc::RTNLGRP_IPV6_IFADDR,
        ] {
            sock.add_membership(group)
                .map_err(NodeAddrsError::Subscribe)?;
        }
        sock.set_non_blocking(true)
            .map_err(NodeAddrsError::Subscribe)?;
        // SAFETY: the netlink socket owns its descriptor, closes it only
        // when dropped (after the AsyncFd deregisters it), and nothing
        // replaces it while registered.
        let sock = unsafe { AsyncFd::register(sock) }
            .map_err(|e| NodeAddrsError::Subscribe(e.into_parts().1))?;
        Ok(Watcher {
            sock,
            buf: vec![0u8; RECV_BUF],
        })
    }

    /// Waits until a link or address changed, then until the burst it
    /// opens is over (quiet for 50 ms, or 500 ms at most). What changed is
    /// not said: list again.
    pub async fn changed(&mut self) -> Result<(), NodeAddrsError> {
        while !self.drain().await? {}
        let deadline = tokio::time::Instant::now() + MAX_COALESCE;
        loop {
            let quiet = (tokio::time::Instant::now() + QUIET).min(deadline);
            match tokio::time::timeout_at(quiet, self.drain()).await {
                Ok(r) => {
                    r?;
                }
                Err(_) => return Ok(()),
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(());
            }
        }
    }

    /// Waits until the socket is readable and reads everything queued;
    /// true when anything (or an overrun) was seen.
    async fn drain(&mut self) -> Result<bool, NodeAddrsError> {
        let mut guard = self.sock.readable().await.map_err(NodeAddrsError::Watch)?;
        let mut seen = false;
        loop {
            match guard.get_inner().recv(&mut &mut self.buf[..], 0) {
                Ok(_) => seen = true,
                // The socket overran: notifications were lost, which only
                // means something changed.
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => seen = true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    guard.clear_ready();
                    return Ok(seen);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(NodeAddrsError::Watch(e)),
            }
        }
    }
}

/// The node's addresses, as [`subscribe`] publishes them.
pub type NodeAddresses = Arc<Vec<NodeAddress>>;

/// How long [`subscribe`]'s task waits to list again after a failed list.
const RETRY: Duration = Duration::from_secs(1);

/// Lists the addresses now, then returns a receiver holding them and the
/// task that publishes each changed list until `cancel` (spawn it where the
/// caller's tasks live). The receiver only wakes when the list differs.
/// Must be called inside a tokio runtime, in the network namespace to
/// follow. The task fails only if the notification socket does.
pub fn subscribe(
    cancel: CancellationToken,
) -> Result<
    (
        watch::Receiver<NodeAddresses>,
        impl std::future::Future<Output = Result<(), NodeAddrsError>>,
    ),
    NodeAddrsError,
> {
    let mut watcher = Watcher::new()?;
    let (tx, rx) = watch::channel(Arc::new(list()?));
    let task = async move {
        let mut retry = false;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return Ok(()),
                r = watcher.changed() => r?,
                () = tokio::time::sleep(RETRY), if retry => {}
            }
            // A dump is a few small datagrams: cheap enough to run here
            // rather than on a blocking thread (which could sit in another
            // network namespace).
            match list() {
                Ok(now) => {
                    retry = false;
                    tx.send_if_modified(|old| {
                        let differs = **old != now;
                        if differs {
                            tracing::debug!(addresses = now.len(), "node addresses changed");
                            *old = Arc::new(now);
                        }
                        differs
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "listing the node's addresses; trying again");
                    retry = true;
                }
            }
        }
    };
    Ok((rx, task))
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::Emitable;

    use super::*;

    fn addr(ifname: &str, ip: &str) -> NodeAddress {
        NodeAddress {
            ifindex: 1,
            ifname: ifname.to_owned(),
            addr: ip.parse().unwrap(),
            prefix_len: 24,
        }
    }

    #[test]
    fn select_keeps_the_addresses_nodeports_are_served_on() {
        let all = vec![
            addr("lo", "127.0.0.1"),
            addr("lo", "127.1.2.3"),
            addr("lo", "::1"),
            addr("eth0", "10.0.0.5"),
            addr("eth0", "fe80::1"),
            addr("eth0", "febf::1"),
            addr("eth0", "fd00::5"),
            addr("eth1", "192.168.1.7"),
            addr("eth1", "2001:db8::7"),
        ];
        let ips = |cidrs: &str| -> Vec<String> {
            let cidrs = crate::net::parse_cidr_list(cidrs).unwrap();
            select(&all, &cidrs)
                .iter()
                .map(|a| format!("{}@{}", a.addr, a.ifname))
                .collect()
        };
        let cases: &[(&str, &[&str])] = &[
            (
                "",
                &[
                    "10.0.0.5@eth0",
                    "fd00::5@eth0",
                    "192.168.1.7@eth1",
                    "2001:db8::7@eth1",
                ],
            ),
            ("0.0.0.0/0", &["10.0.0.5@eth0", "192.168.1.7@eth1"]),
            ("::/0", &["fd00::5@eth0", "2001:db8::7@eth1"]),
            ("10.0.0.0/8", &["10.0.0.5@eth0"]),
            (
                "10.0.0.5/32,2001:db8::/32",
                &["10.0.0.5@eth0", "2001:db8::7@eth1"],
            ),
            // Loopback and link-local stay out even when asked for.
            ("127.0.0.0/8,::1/128,fe80::/10", &[]),
            ("172.16.0.0/12", &[]),
        ];
        for (cidrs, want) in cases {
            assert_eq!(ips(cidrs), *want, "--nodeport-addresses={cidrs:?}");
        }
    }

    #[test]
    fn link_local_is_fe80_slash_10() {
        for (ip, want) in [
            ("fe80::1", true),
            ("febf:ffff::1", true),
            ("fec0::1", false),
            ("fe7f::1", false),
            ("169.254.0.1", false),
        ] {
            assert_eq!(is_ipv6_link_local(&ip.parse().unwrap()), want, "{ip}");
        }
    }

    #[test]
    fn an_address_is_its_local_end_once_dad_passed() {
        let msg = |attrs: Vec<AddressAttribute>| {
            let mut m = AddressMessage::default();
            m.header.index = 7;
            m.header.prefix_len = 24;
            m.attributes = attrs;
            m
        };
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        // Point-to-point: IFA_ADDRESS is the peer.
        let ptp = msg(vec![
            AddressAttribute::Address(ip("10.0.0.2")),
            AddressAttribute::Local(ip("10.0.0.1")),
        ]);
        assert_eq!(usable_address(&ptp), Some((7, ip("10.0.0.1"), 24)));
        let v6 = msg(vec![AddressAttribute::Address(ip("fd00::1"))]);
        assert_eq!(usable_address(&v6), Some((7, ip("fd00::1"), 24)));
        for flags in [AddressFlags::Tentative, AddressFlags::Dadfailed] {
            let mut m = msg(vec![AddressAttribute::Address(ip("fd00::1"))]);
            m.attributes.push(AddressAttribute::Flags(flags));
            assert_eq!(usable_address(&m), None, "{flags:?}");
        }
        let deprecated = msg(vec![
            AddressAttribute::Address(ip("fd00::1")),
            AddressAttribute::Flags(AddressFlags::Deprecated),
        ]);
        assert!(usable_address(&deprecated).is_some());
        assert_eq!(usable_address(&msg(vec![])), None);
    }

    #[test]
    fn link_names_come_from_ifla_ifname() {
        let mut m = LinkMessage::default();
        m.header.index = 3;
        m.attributes.push(LinkAttribute::Mtu(1500));
        m.attributes.push(LinkAttribute::IfName("eth0".to_owned()));
        let mut buf = vec![0u8; m.buffer_len()];
        m.emit(&mut buf);
        assert_eq!(link_name(&buf), Some((3, "eth0".to_owned())));
        let mut nameless = LinkMessage::default();
        nameless.header.index = 3;
        let mut buf = vec![0u8; nameless.buffer_len()];
        nameless.emit(&mut buf);
        assert_eq!(link_name(&buf), None);
    }

    #[test]
    fn errno_results() {
        assert!(errno_result(&0i32.to_ne_bytes()).is_ok());
        assert!(errno_result(&[]).is_ok());
        let e = errno_result(&(-libc::EPERM).to_ne_bytes()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        let e = errno_result(&i32::MIN.to_ne_bytes()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPROTO));
    }
}
