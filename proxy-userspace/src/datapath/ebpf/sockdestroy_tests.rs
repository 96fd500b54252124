//! Unit tests of [`super`]: which sockets an apply destroys, drains, and
//! the kfunc call patching.

use super::*;
use crate::datapath::ebpf::codec::Header;
use crate::datapath::ebpf::desired::DesiredService;
use proxy_common::ServiceValue;
use std::net::IpAddr;

fn vip(last: u8) -> Vip {
    Vip {
        ip: IpAddr::from([10, 96, 0, last]),
        port: 80,
        proto: PROTO_TCP,
        scope: Scope::Socket,
    }
}

fn be(last: u8) -> BackendAddr {
    BackendAddr {
        ip: IpAddr::from([10, 0, 0, last]),
        port: 8080,
        local: false,
    }
}

fn sa(last: u8) -> SocketAddr {
    SocketAddr::new(IpAddr::from([10, 0, 0, last]), 8080)
}

/// A view with `vip(1)` → backends 1, 2, 3 in slots 1..=3.
fn view() -> Programmed {
    let header = Header {
        count: 3,
        flags: 0,
        affinity_timeout: 0,
        service_id: 1,
    };
    let slot = |id| ServiceValue {
        backend_id: id,
        ..ServiceValue::default()
    };
    Programmed::from_entries(
        [
            (vip(1), 0, header.value()),
            (vip(1), 1, slot(1)),
            (vip(1), 2, slot(2)),
            (vip(1), 3, slot(3)),
        ],
        [(1, be(1)), (2, be(2)), (3, be(3))],
    )
}

#[test]
fn a_backend_whose_slot_is_refilled_from_the_last_one_is_the_only_one_removed() {
    let v = view();
    let ops = vec![
        Op::PutSlot {
            vip: vip(1),
            slot: 1,
            backend_id: 3,
        },
        Op::DeleteSlot {
            vip: vip(1),
            slot: 3,
        },
    ];
    let (removed, added) = removed_and_added(&v, &ops);
    assert_eq!(removed, vec![(vip(1), sa(1))]);
    assert!(added.is_empty(), "{added:?}");
}

#[test]
fn a_replaced_backend_is_removed_and_its_successor_added() {
    let v = view();
    let ops = vec![
        Op::PutBackend { id: 9, addr: be(9) },
        Op::PutSlot {
            vip: vip(1),
            slot: 2,
            backend_id: 9,
        },
    ];
    assert_eq!(
        removed_and_added(&v, &ops),
        (vec![(vip(1), sa(2))], vec![(vip(1), sa(9))])
    );
}

#[test]
fn a_backend_written_again_with_other_flags_is_not_removed() {
    let v = view();
    let ops = vec![
        Op::PutBackend {
            id: 9,
            addr: BackendAddr {
                local: true,
                ..be(2)
            },
        },
        Op::PutSlot {
            vip: vip(1),
            slot: 2,
            backend_id: 9,
        },
    ];
    assert_eq!(removed_and_added(&v, &ops), (vec![], vec![]));
}

#[test]
fn vips_of_the_tc_programs_are_left_out() {
    let v = view();
    let external = Vip {
        scope: Scope::External,
        ..vip(1)
    };
    let ops = vec![Op::DeleteSlot {
        vip: external,
        slot: 1,
    }];
    assert_eq!(removed_and_added(&v, &ops), (vec![], vec![]));
}

#[test]
fn the_kfunc_marker_is_patched_only_at_instruction_boundaries() {
    let marker = SOCK_DESTROY_KFUNC_MARKER.to_le_bytes();
    let call = [0x85, 0x20, 0, 0, marker[0], marker[1], marker[2], marker[3]];
    let mut obj = vec![0u8; 4];
    obj.extend_from_slice(&call); // misaligned: not an instruction
    obj.extend_from_slice(&[0; 4]);
    obj.extend_from_slice(&call);
    assert_eq!(patch_kfunc_calls(&mut obj, 0x1234), 1);
    assert_eq!(&obj[16..24], &[0x85, 0x20, 0, 0, 0x34, 0x12, 0, 0]);
    assert_eq!(&obj[4..12], &call);
}

fn desired(v: Vip, backends: &[u8], draining: &[u8]) -> DesiredService {
    DesiredService {
        vip: v,
        owner: crate::model::ObjectKey::new("default", "svc"),
        affinity_timeout: None,
        source_ranges: None,
        backends: backends.iter().map(|b| be(*b)).collect(),
        draining: draining.iter().map(|b| be(*b)).collect(),
        reject: false,
    }
}

/// A terminating endpoint that still serves keeps its TCP connections
/// until it stops serving; UDP connections are never kept.
#[test]
fn tcp_connections_drain_until_the_endpoint_stops_serving() {
    let mut d = Draining::default();
    let (serving, terminating) = (desired(vip(1), &[1, 2], &[]), desired(vip(1), &[2], &[1]));
    assert!(d.update(&[Change::Upsert(&serving)]).is_empty());
    assert!(d.update(&[Change::Upsert(&terminating)]).is_empty());
    assert!(d.keeps(&(vip(1), sa(1))));
    assert!(!d.keeps(&(vip(1), sa(2))), "not draining: picked");
    let gone = desired(vip(1), &[2], &[]);
    assert_eq!(d.update(&[Change::Upsert(&gone)]), [(vip(1), sa(1))]);
    assert!(!d.keeps(&(vip(1), sa(1))));

    // A removed VIP ends its drains.
    assert!(d.update(&[Change::Upsert(&terminating)]).is_empty());
    assert_eq!(d.update(&[Change::Remove(vip(1))]), [(vip(1), sa(1))]);

    let udp = Vip {
        proto: proxy_common::PROTO_UDP,
        ..vip(2)
    };
    let udp_terminating = desired(udp, &[2], &[1]);
    assert!(d.update(&[Change::Upsert(&udp_terminating)]).is_empty());
    assert!(!d.keeps(&(udp, sa(1))), "UDP sockets go at once");
}
