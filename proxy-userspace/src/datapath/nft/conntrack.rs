//! Conntrack cleanup after a sync. UDP has no connection end, so a
//! client that keeps its source port keeps its conntrack entry, and with it
//! the DNAT to an endpoint that is gone, or a flow that was never NATed
//! because the service had no endpoints then. kube-proxy deletes those
//! entries; so does this, over ctnetlink ([`ct`]).
//!
//! A full sync (start-up, or the repair of a table flushed or deleted by
//! hand) also deletes the TCP and SCTP entries to a service address that
//! were never NATed: a connect from the node while the table was missing,
//! or while the repairing transaction is being applied (conntrack already
//! tracks it, its NAT rules are not live yet), leaves one, in SYN_SENT
//! for 120 s with a null NAT binding, and a later connect that gets the
//! same source port is a retransmission to conntrack, so it is not NATed
//! either and leaves by the node's default route (the
//! `drift-flushed-or-deleted-nft-table-repaired` flake). A service
//! address is nobody's own address, so such an entry never carries a
//! connection; TCP entries that were NATed stay, as in kube-proxy.
//!
//! [`plan`] and [`plan_startup`] are pure: states in, the deletions out;
//! [`run`] lists the family's entries of each protocol once and deletes
//! the matching ones.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use super::nlsock::{NFPROTO_IPV4, NFPROTO_IPV6};

use crate::model::{LocalState, Protocol, ServiceEndpoints};

const UDP: u8 = 17;
const TCP: u8 = 6;
const SCTP: u8 = 132;

/// Which entries to delete. An endpoint is its address and target port:
/// a targetPort change keeps the pod and moves the port, and the flows
/// DNATed to the old port must go with it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Flush {
    /// Entries for `vip:port` DNATed to `endpoint` (the endpoint is gone).
    Endpoint {
        vip: IpAddr,
        port: u16,
        endpoint: SocketAddr,
    },
    /// Node-port entries DNATed to `endpoint` (the endpoint is gone).
    NodePortEndpoint { port: u16, endpoint: SocketAddr },
    /// Every entry for `vip:port` (the service got its first endpoint; the
    /// entries hold flows from before).
    Service { vip: IpAddr, port: u16 },
    /// Entries for `vip:port` whose reply does not come from one of
    /// `endpoints` (at start-up: what an earlier run or no proxy left).
    Stale {
        vip: IpAddr,
        port: u16,
        endpoints: BTreeSet<SocketAddr>,
    },
    /// Entries of protocol `proto` (TCP or SCTP) for `vip:port` that were
    /// never NATed: their reply comes from `vip:port` itself.
    Unnated { vip: IpAddr, port: u16, proto: u8 },
}

impl Flush {
    fn family_v4(&self) -> bool {
        match self {
            Flush::Endpoint { vip, .. }
            | Flush::Service { vip, .. }
            | Flush::Stale { vip, .. }
            | Flush::Unnated { vip, .. } => vip.is_ipv4(),
            Flush::NodePortEndpoint { endpoint, .. } => endpoint.is_ipv4(),
        }
    }

    /// The protocol of the entries this flush deletes.
    fn proto(&self) -> u8 {
        match self {
            Flush::Unnated { proto, .. } => *proto,
            _ => UDP,
        }
    }

    /// Whether a conntrack entry is one this flush deletes: an entry of
    /// its protocol to the frontend whose reply comes from the endpoint's
    /// address and port (for [`Flush::Unnated`], from the frontend).
    pub fn matches(&self, e: &ct::Entry) -> bool {
        let to = |vip: &IpAddr, port: &u16| e.orig.dst == *vip && e.orig.dport == *port;
        let from = SocketAddr::new(e.reply.src, e.reply.sport);
        e.orig.proto == self.proto()
            && match self {
                Flush::Endpoint {
                    vip,
                    port,
                    endpoint,
                } => to(vip, port) && from == *endpoint,
                Flush::NodePortEndpoint { port, endpoint } => {
                    e.orig.dport == *port && from == *endpoint && e.orig.dst != endpoint.ip()
                }
                Flush::Service { vip, port } => to(vip, port),
                Flush::Stale {
                    vip,
                    port,
                    endpoints,
                } => to(vip, port) && !endpoints.contains(&from),
                Flush::Unnated { vip, port, .. } => {
                    to(vip, port) && from == SocketAddr::new(*vip, *port)
                }
            }
    }
}

/// The endpoints (address and target port) serving UDP port `name` in
/// any scope.
fn udp_endpoints(se: Option<&ServiceEndpoints>, name: &str) -> BTreeSet<SocketAddr> {
    se.into_iter()
        .flat_map(|se| &se.endpoints)
        .filter_map(|ep| {
            ep.ports
                .iter()
                .find(|p| {
                    p.name == name
                        && p.protocol == Protocol::Udp
                        && (p.scopes.internal || p.scopes.external)
                })
                .map(|p| SocketAddr::new(ep.ip, p.port))
        })
        .collect()
}

/// The deletions one service change calls for.
pub fn plan(old: Option<&ServiceEndpoints>, new: Option<&ServiceEndpoints>) -> Vec<Flush> {
    let mut out = BTreeSet::new();
    for se in old.iter().chain(new.iter()) {
        let svc = &se.service;
        let vips: Vec<IpAddr> = svc
            .cluster_ips
            .iter()
            .chain(svc.external_ips.iter())
            .chain(svc.load_balancer_ips.iter())
            .collect();
        for pm in svc.ports.iter().filter(|p| p.protocol == Protocol::Udp) {
            let before = udp_endpoints(old, &pm.name);
            let after = udp_endpoints(new, &pm.name);
            for endpoint in before.difference(&after) {
                for vip in vips.iter().filter(|v| v.is_ipv4() == endpoint.is_ipv4()) {
                    out.insert(Flush::Endpoint {
                        vip: *vip,
                        port: pm.port,
                        endpoint: *endpoint,
                    });
                }
                if pm.node_port != 0 {
                    out.insert(Flush::NodePortEndpoint {
                        port: pm.node_port,
                        endpoint: *endpoint,
                    });
                }
            }
            if before.is_empty() && !after.is_empty() {
                for vip in &vips {
                    out.insert(Flush::Service {
                        vip: *vip,
                        port: pm.port,
                    });
                }
            }
        }
    }
    out.into_iter().collect()
}

/// The deletions a full sync calls for: for every UDP service port with
/// endpoints, the entries to its addresses that do not reach one of them
/// (DNATed by an earlier ruleset, or never NATed); for every TCP and SCTP
/// service port, the entries to its addresses that were never NATed (made
/// while the table was missing or not yet committed).
pub fn plan_startup(state: &LocalState) -> Vec<Flush> {
    let mut out = Vec::new();
    for se in &state.services {
        let svc = &se.service;
        let vips = || {
            svc.cluster_ips
                .iter()
                .chain(svc.external_ips.iter())
                .chain(svc.load_balancer_ips.iter())
        };
        for pm in &svc.ports {
            let proto = match pm.protocol {
                Protocol::Udp => {
                    let endpoints = udp_endpoints(Some(se), &pm.name);
                    if !endpoints.is_empty() {
                        out.extend(vips().map(|vip| Flush::Stale {
                            vip,
                            port: pm.port,
                            endpoints: endpoints.clone(),
                        }));
                    }
                    continue;
                }
                Protocol::Tcp => TCP,
                Protocol::Sctp => SCTP,
            };
            out.extend(vips().map(|vip| Flush::Unnated {
                vip,
                port: pm.port,
                proto,
            }));
        }
    }
    out
}

/// The sysctl that makes conntrack accept TCP segments outside the window.
const TCP_BE_LIBERAL: &str = "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal";

/// Whether conntrack is liberal about TCP windows in this thread's network
/// namespace (`nf_conntrack_tcp_be_liberal` is 1, as
/// `--conntrack-tcp-be-liberal` sets it). Unreadable (no conntrack module
/// yet): not liberal.
pub fn tcp_be_liberal() -> bool {
    match std::fs::read_to_string(TCP_BE_LIBERAL) {
        Ok(v) => v.trim() != "0",
        Err(e) => {
            tracing::debug!(path = TCP_BE_LIBERAL, error = %e, "conntrack TCP window setting unreadable; taken as strict");
            false
        }
    }
}

/// Runs the deletions: one listing of each family's entries of each
/// protocol concerned, then the matching ones deleted. Failures are
/// logged, never fatal: the rules are in place, a stale entry only lasts
/// until the flow idles out.
pub fn run(flushes: &[Flush]) {
    let protos: BTreeSet<u8> = flushes.iter().map(Flush::proto).collect();
    for (v4, proto) in [true, false]
        .into_iter()
        .flat_map(|v4| protos.iter().map(move |p| (v4, *p)))
    {
        let these: Vec<&Flush> = flushes
            .iter()
            .filter(|f| f.family_v4() == v4 && f.proto() == proto)
            .collect();
        if these.is_empty() {
            continue;
        }
        let family = if v4 { NFPROTO_IPV4 } else { NFPROTO_IPV6 };
        let entries = match ct::list(family, proto) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, proto, "conntrack cleanup skipped: listing conntrack entries failed");
                continue;
            }
        };
        let doomed: Vec<ct::Entry> = entries
            .into_iter()
            .filter(|e| these.iter().any(|f| f.matches(e)))
            .collect();
        if doomed.is_empty() {
            continue;
        }
        match ct::delete(family, &doomed) {
            Ok(n) => tracing::debug!(deleted = n, proto, "conntrack entries deleted"),
            Err(e) => tracing::warn!(error = %e, proto, "conntrack cleanup failed"),
        }
    }
}

/// ctnetlink (conntrack over netlink): list and delete entries. The
/// messages are netlink-packet-netfilter's; the socket is the one the
/// nf_tables batches use.
pub mod ct {
    use std::io;
    use std::net::IpAddr;

    use netlink_packet_core::{
        DefaultNla, NetlinkHeader, NetlinkMessage, NetlinkPayload, Nla, NLM_F_ACK, NLM_F_DUMP,
        NLM_F_REQUEST,
    };
    use netlink_packet_netfilter::conntrack::{
        ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Tuple as CtTuple,
    };
    use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterMessageInner};

    use super::super::nlsock::Socket;

    /// Attribute type of the conntrack zone (not typed by the codec).
    const CTA_ZONE: u16 = 18;
    /// Message types below this are netlink's own (noop, error, done).
    const NLMSG_MIN_TYPE: u16 = 0x10;
    /// The nfnetlink subsystem of conntrack entries (high byte of the type).
    const NFNL_SUBSYS_CTNETLINK: u8 = 1;

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

    fn tuple(parts: &[CtTuple]) -> Option<Tuple> {
        let (mut src, mut dst, mut proto, mut sport, mut dport) = (None, None, None, 0, 0);
        for part in parts {
            match part {
                CtTuple::Ip(ips) => {
                    for ip in ips {
                        match ip {
                            IPTuple::SourceAddress(a) => src = Some(*a),
                            IPTuple::DestinationAddress(a) => dst = Some(*a),
                            _ => {}
                        }
                    }
                }
                CtTuple::Proto(ps) => {
                    for p in ps {
                        match p {
                            ProtoTuple::Protocol(p) => proto = Some(u8::from(*p)),
                            ProtoTuple::SourcePort(n) => sport = *n,
                            ProtoTuple::DestinationPort(n) => dport = *n,
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

    fn entry(attrs: &[ConntrackAttribute]) -> Option<Entry> {
        let (mut orig, mut reply, mut zone) = (None, None, None);
        for a in attrs {
            match a {
                ConntrackAttribute::CtaTupleOrig(t) => orig = tuple(t),
                ConntrackAttribute::CtaTupleReply(t) => reply = tuple(t),
                ConntrackAttribute::Other(nla) if nla.kind() == CTA_ZONE => {
                    let mut v = [0u8; 2];
                    if nla.value_len() == 2 {
                        nla.emit_value(&mut v);
                        zone = Some(u16::from_be_bytes(v));
                    }
                }
                _ => {}
            }
        }
        Some(Entry {
            orig: orig?,
            reply: reply?,
            zone,
        })
    }

    fn message(family: u8, flags: u16, seq: u32, msg: ConntrackMessage) -> Vec<u8> {
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = seq;
        let mut packet = NetlinkMessage::new(
            header,
            NetlinkPayload::from(NetfilterMessage::new(
                NetfilterHeader::new(family.into(), 0, 0),
                msg,
            )),
        );
        packet.finalize();
        let mut buf = vec![0; packet.buffer_len()];
        packet.serialize(&mut buf);
        buf
    }

    /// Every conntrack entry of `family` (`NFPROTO_IPV4`/`NFPROTO_IPV6`)
    /// with protocol `proto`.
    pub fn list(family: u8, proto: u8) -> io::Result<Vec<Entry>> {
        let sock = Socket::open()?;
        sock.send(&message(
            family,
            NLM_F_REQUEST | NLM_F_DUMP,
            1,
            ConntrackMessage::Get(vec![]),
        ))?;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 1 << 20];
        // Bounded: a dump ends with NLMSG_DONE; the cap only guards
        // against a kernel that never says so.
        for _ in 0..1_000_000 {
            let n = sock.recv(&mut buf, 0)?;
            if list_datagram(&buf[..n], family, proto, &mut out)? {
                return Ok(out);
            }
        }
        Err(io::Error::other("conntrack dump did not end"))
    }

    /// One datagram of the answer to [`list`]: appends its entries of
    /// `family` and `proto` to `out`; true once the dump is done. The
    /// entry fuzz/ drives.
    pub fn list_datagram(
        mut rest: &[u8],
        family: u8,
        proto: u8,
        out: &mut Vec<Entry>,
    ) -> io::Result<bool> {
        let v4 = family == super::NFPROTO_IPV4;
        while !rest.is_empty() {
            if let Some(len) = foreign_message(rest) {
                rest = &rest[len.next_multiple_of(4).min(rest.len())..];
                continue;
            }
            let packet = NetlinkMessage::<NetfilterMessage>::deserialize(rest)
                .map_err(|e| io::Error::other(format!("undecodable ctnetlink message: {e}")))?;
            let len = (packet.header.length as usize).clamp(16, rest.len());
            rest = &rest[len.next_multiple_of(4).min(rest.len())..];
            match packet.payload {
                NetlinkPayload::Done(_) => return Ok(true),
                NetlinkPayload::Error(e) => {
                    if let Some(code) = e.code {
                        let errno = crate::datapath::nft::nlsock::negated_errno(code.get());
                        return Err(io::Error::from_raw_os_error(errno));
                    }
                }
                NetlinkPayload::InnerMessage(NetfilterMessage {
                    inner: NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)),
                    ..
                }) => {
                    if let Some(e) = entry(&attrs) {
                        if e.orig.proto == proto && e.orig.src.is_ipv4() == v4 {
                            out.push(e);
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(false)
    }

    /// The length of the first message of `datagram` when it is neither a
    /// netlink control message nor ctnetlink's: a conntrack dump has no use
    /// for it, and it never reaches the decoder, whose nf_tables parsers
    /// index nested attributes unchecked and panic on a short one (found by
    /// fuzz/, target netlink).
    fn foreign_message(datagram: &[u8]) -> Option<usize> {
        let header = datagram.get(..16)?;
        let len = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let kind = u16::from_ne_bytes([header[4], header[5]]);
        let subsystem = (kind >> 8) as u8;
        (kind >= NLMSG_MIN_TYPE && subsystem != NFNL_SUBSYS_CTNETLINK)
            .then(|| len.clamp(16, datagram.len()))
    }

    fn ct_tuple(t: &Tuple) -> Vec<CtTuple> {
        vec![
            CtTuple::Ip(vec![
                IPTuple::SourceAddress(t.src),
                IPTuple::DestinationAddress(t.dst),
            ]),
            CtTuple::Proto(vec![
                ProtoTuple::Protocol(t.proto.into()),
                ProtoTuple::SourcePort(t.sport),
                ProtoTuple::DestinationPort(t.dport),
            ]),
        ]
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
                let mut attrs = vec![ConntrackAttribute::CtaTupleOrig(ct_tuple(&e.orig))];
                if let Some(z) = e.zone {
                    attrs.push(ConntrackAttribute::Other(DefaultNla::new(
                        CTA_ZONE,
                        z.to_be_bytes().to_vec(),
                    )));
                }
                buf.extend(message(
                    family,
                    NLM_F_REQUEST | NLM_F_ACK,
                    i as u32 + 1,
                    ConntrackMessage::Delete(attrs),
                ));
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

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_delete_request_decodes_to_the_tuple_and_zone_it_was_built_from() {
            let e = Entry {
                orig: Tuple {
                    src: "10.0.0.1".parse().unwrap(),
                    dst: "10.96.0.10".parse().unwrap(),
                    proto: 17,
                    sport: 40000,
                    dport: 53,
                },
                reply: Tuple {
                    src: "10.244.1.5".parse().unwrap(),
                    dst: "10.0.0.1".parse().unwrap(),
                    proto: 17,
                    sport: 53,
                    dport: 40000,
                },
                zone: Some(7),
            };
            let mut attrs = vec![
                ConntrackAttribute::CtaTupleOrig(ct_tuple(&e.orig)),
                ConntrackAttribute::CtaTupleReply(ct_tuple(&e.reply)),
            ];
            attrs.push(ConntrackAttribute::Other(DefaultNla::new(
                CTA_ZONE,
                vec![0, 7],
            )));
            let bytes = message(2, NLM_F_REQUEST, 1, ConntrackMessage::New(attrs));
            let back = NetlinkMessage::<NetfilterMessage>::deserialize(&bytes).unwrap();
            let NetlinkPayload::InnerMessage(NetfilterMessage {
                inner: NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)),
                ..
            }) = back.payload
            else {
                panic!("not a conntrack message: {back:?}");
            };
            assert_eq!(entry(&attrs), Some(e));
        }

        /// An `NLMSG_ERROR` answering a dump request, with `field` as its
        /// error field.
        fn error_datagram(field: i32) -> Vec<u8> {
            let mut b = Vec::new();
            b.extend_from_slice(&36u32.to_ne_bytes());
            b.extend_from_slice(&2u16.to_ne_bytes()); // NLMSG_ERROR
            b.extend_from_slice(&[0; 10]); // flags, seq, pid
            b.extend_from_slice(&field.to_ne_bytes());
            // The request it answers: a ctnetlink GET dump.
            b.extend_from_slice(&20u32.to_ne_bytes());
            b.extend_from_slice(&0x0101u16.to_ne_bytes());
            b.extend_from_slice(&0x0301u16.to_ne_bytes());
            b.extend_from_slice(&[0; 8]);
            b
        }

        #[test]
        fn a_dump_error_is_the_kernels_errno_and_a_bogus_one_a_protocol_error() {
            let list = |field| {
                let mut out = Vec::new();
                let err = list_datagram(
                    &error_datagram(field),
                    super::super::NFPROTO_IPV4,
                    super::super::UDP,
                    &mut out,
                )
                .unwrap_err();
                assert!(out.is_empty());
                err.raw_os_error()
            };
            assert_eq!(list(-libc::EPERM), Some(libc::EPERM));
            // Found by fuzz/ (target netlink): negating i32::MIN overflowed.
            assert_eq!(list(i32::MIN), Some(libc::EPROTO));
        }

        #[test]
        fn a_message_of_another_subsystem_is_skipped_not_decoded() {
            // Found by fuzz/ (target netlink): an nf_tables NEWSET whose
            // NFTA_SET_EXPR holds an attribute of length 0 panicked in the
            // decoder.
            let mut datagram = Vec::new();
            datagram.extend_from_slice(&32u32.to_ne_bytes());
            datagram.extend_from_slice(&0x0a09u16.to_ne_bytes()); // NFT_MSG_NEWSET
            datagram.extend_from_slice(&[0; 10]);
            datagram.extend_from_slice(&[2, 0, 0, 0]); // nfgenmsg
            datagram.extend_from_slice(&12u16.to_ne_bytes());
            datagram.extend_from_slice(&17u16.to_ne_bytes()); // NFTA_SET_EXPR
            datagram.extend_from_slice(&[0; 8]);
            let mut out = Vec::new();
            let (v4, udp) = (super::super::NFPROTO_IPV4, super::super::UDP);
            assert!(!list_datagram(&datagram, v4, udp, &mut out).unwrap());
            // What follows it is still read: here, the end of the dump.
            let mut done = 20u32.to_ne_bytes().to_vec();
            done.extend_from_slice(&3u16.to_ne_bytes()); // NLMSG_DONE
            done.extend_from_slice(&[0; 14]);
            datagram.extend_from_slice(&done);
            assert!(list_datagram(&datagram, v4, udp, &mut out).unwrap());
            assert!(out.is_empty());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::nft::rules::service::tests::{endpoint, web};
    use crate::model::Protocol;

    fn udp(mut se: ServiceEndpoints) -> ServiceEndpoints {
        se.service.ports[0].protocol = Protocol::Udp;
        for ep in &mut se.endpoints {
            ep.ports.modify(|p| p[0].protocol = Protocol::Udp);
        }
        se
    }

    #[test]
    fn a_removed_udp_endpoint_loses_its_conntrack_entries() {
        let old = udp(web(
            vec![endpoint("10.244.1.11", true), endpoint("10.244.1.12", true)],
            None,
        ));
        let new = udp(web(vec![endpoint("10.244.1.11", true)], None));
        let flushes = plan(Some(&old), Some(&new));
        assert_eq!(
            flushes,
            [Flush::Endpoint {
                vip: "10.96.0.10".parse().unwrap(),
                port: 80,
                endpoint: "10.244.1.12:8080".parse().unwrap()
            }]
        );
        let entry = |reply_src: &str, reply_port: u16| ct::Entry {
            orig: ct::Tuple {
                src: "10.244.2.5".parse().unwrap(),
                dst: "10.96.0.10".parse().unwrap(),
                proto: UDP,
                sport: 40000,
                dport: 80,
            },
            reply: ct::Tuple {
                src: reply_src.parse().unwrap(),
                dst: "10.244.2.5".parse().unwrap(),
                proto: UDP,
                sport: reply_port,
                dport: 40000,
            },
            zone: None,
        };
        assert!(flushes[0].matches(&entry("10.244.1.12", 8080)));
        assert!(!flushes[0].matches(&entry("10.244.1.11", 8080)));
        assert!(!flushes[0].matches(&entry("10.244.1.12", 8081)));
        let mut tcp = entry("10.244.1.12", 8080);
        tcp.orig.proto = 6;
        assert!(!flushes[0].matches(&tcp));
    }

    #[test]
    fn a_target_port_change_flushes_the_old_port_of_the_same_pod() {
        let mut old = udp(web(vec![endpoint("10.244.1.11", true)], None));
        old.service.ports[0].node_port = 30080;
        let mut new = old.clone();
        new.endpoints[0].ports.modify(|p| p[0].port = 8081);
        let old_ep: SocketAddr = "10.244.1.11:8080".parse().unwrap();
        assert_eq!(
            plan(Some(&old), Some(&new)),
            [
                Flush::Endpoint {
                    vip: "10.96.0.10".parse().unwrap(),
                    port: 80,
                    endpoint: old_ep
                },
                Flush::NodePortEndpoint {
                    port: 30080,
                    endpoint: old_ep
                }
            ]
        );
    }

    #[test]
    fn a_first_udp_endpoint_clears_the_cached_rejects() {
        let old = udp(web(vec![], None));
        let new = udp(web(vec![endpoint("10.244.1.11", true)], None));
        assert_eq!(
            plan(Some(&old), Some(&new)),
            [Flush::Service {
                vip: "10.96.0.10".parse().unwrap(),
                port: 80
            }]
        );
    }

    #[test]
    fn at_start_entries_not_reaching_a_current_endpoint_go() {
        let se = udp(web(vec![endpoint("10.244.1.11", true)], None));
        let state = LocalState::new([se]);
        let flushes = plan_startup(&state);
        assert_eq!(
            flushes,
            [Flush::Stale {
                vip: "10.96.0.10".parse().unwrap(),
                port: 80,
                endpoints: ["10.244.1.11:8080".parse().unwrap()].into()
            }]
        );
        let empty = LocalState::new([udp(web(vec![], None))]);
        assert!(plan_startup(&empty).is_empty());
    }

    #[test]
    fn a_full_sync_deletes_the_tcp_entries_to_a_service_that_were_never_natted() {
        let se = web(vec![endpoint("10.244.1.11", true)], None);
        let flushes = plan_startup(&LocalState::new([se]));
        let vip: IpAddr = "10.96.0.10".parse().unwrap();
        assert_eq!(
            flushes,
            [Flush::Unnated {
                vip,
                port: 80,
                proto: TCP
            }]
        );
        let entry = |reply_src: &str, reply_port: u16| ct::Entry {
            orig: ct::Tuple {
                src: "10.0.1.1".parse().unwrap(),
                dst: vip,
                proto: TCP,
                sport: 41010,
                dport: 80,
            },
            reply: ct::Tuple {
                src: reply_src.parse().unwrap(),
                dst: "10.0.1.1".parse().unwrap(),
                proto: TCP,
                sport: reply_port,
                dport: 41010,
            },
            zone: None,
        };
        // A SYN sent while the table was missing: never NATed.
        assert!(flushes[0].matches(&entry("10.96.0.10", 80)));
        // NATed to an endpoint, current or not: kept, as kube-proxy does.
        assert!(!flushes[0].matches(&entry("10.244.1.11", 8080)));
        assert!(!flushes[0].matches(&entry("10.244.1.99", 8080)));
        let mut udp = entry("10.96.0.10", 80);
        udp.orig.proto = UDP;
        assert!(!flushes[0].matches(&udp));
    }

    #[test]
    fn tcp_services_need_no_cleanup_after_a_partial_sync() {
        let old = web(vec![endpoint("10.244.1.12", true)], None);
        assert!(plan(Some(&old), None).is_empty());
    }
}
