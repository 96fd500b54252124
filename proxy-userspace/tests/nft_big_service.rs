//! A service with thousands of endpoints on the nftables datapath against
//! the real kernel (root and `nft` needed, a network namespace of its
//! own): a change of one of its endpoints rewrites that endpoint's slot
//! in the endpoints map, not every slot after it, and connections to the
//! service still reach only its current endpoints.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use ebpf_kube_proxy::datapath::nft::batch::Family;
use ebpf_kube_proxy::datapath::nft::rules::{self, TABLE};
use ebpf_kube_proxy::datapath::nft::{self, NftDatapath};
use ebpf_kube_proxy::datapath::{Datapath, ServiceChange};
use ebpf_kube_proxy::model::claims::Claims;
use ebpf_kube_proxy::model::testing;
use ebpf_kube_proxy::model::{EndpointScopes, LocalState, ServiceEndpoints};

mod common;
use common::netns::{in_private_netns, ip};

/// Endpoints of the big service (the slice is 1,000; this is
/// five of them).
const ENDPOINTS: u32 = 5_000;
/// Small services beside it.
const SMALL: usize = 200;

/// Endpoint `i` of the big service: 10.244.0.0 + i + 1.
fn addr(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 244, 0, 0)) + i + 1)
}

/// `default/big` (10.96.0.10:80 → 8080) with endpoints `ips`, and the
/// small services `ns/svc-<i>` of two endpoints each.
fn state(ips: &BTreeSet<Ipv4Addr>) -> LocalState {
    let scopes = EndpointScopes {
        cluster: true,
        local: true,
        internal: true,
        external: true,
    };
    let mut big = testing::service("default", "big", &["10.96.0.10"]).with_endpoints(
        ips.iter()
            .map(|a| testing::endpoint_at(IpAddr::V4(*a), 8080, scopes)),
    );
    big.service.uid = Default::default();
    let small = (0..SMALL).map(|i| {
        let vip = format!("10.96.{}.{}", 1 + i / 250, i % 250 + 1);
        let mut se: ServiceEndpoints = testing::service("ns", &format!("svc-{i}"), &[&vip])
            .with_endpoints((0..2).map(|j| {
                testing::endpoint(&format!("10.250.{}.{}", i / 250, i % 250 + j), 8080, scopes)
            }));
        se.service.uid = Default::default();
        se
    });
    LocalState::new(std::iter::once(big).chain(small))
}

/// `nft -j` prints a `mark` as its host-order bytes read big-endian.
fn mark(v: &serde_json::Value) -> u32 {
    u32::from_ne_bytes((v.as_u64().unwrap() as u32).to_be_bytes())
}

/// The elements of map `name` for frontend 10.96.0.10, as `nft -j`
/// prints them: key parts → value.
fn elements(name: &str) -> Vec<(serde_json::Value, serde_json::Value)> {
    let text = nft::nft_output(&["-j", "list", "map", "ip", TABLE, name])
        .unwrap()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    doc["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o.get("map"))
        .flat_map(|m| m["elem"].as_array().cloned().unwrap_or_default())
        .map(|e| (e[0]["concat"].clone(), e[1].clone()))
        .filter(|(k, _)| k[0] == "10.96.0.10")
        .collect()
}

/// What the kernel holds for the big service: its count and its
/// endpoints by slot.
fn programmed() -> (u32, BTreeMap<u32, Ipv4Addr>) {
    let count = elements(rules::INTERNAL_COUNTS);
    assert_eq!(count.len(), 1, "{count:?}");
    let slots = elements(rules::INTERNAL_ENDPOINTS)
        .into_iter()
        .map(|(k, v)| {
            assert_eq!(v["concat"][1], 8080, "{v}");
            (
                mark(&k[3]),
                v["concat"][0].as_str().unwrap().parse().unwrap(),
            )
        })
        .collect();
    (mark(&count[0].1), slots)
}

/// Programs the big service's change from `prev` to `next`; returns how
/// long it took.
fn change(dp: &mut NftDatapath, prev: &LocalState, next: &LocalState) -> Duration {
    let big = &next.services[0];
    assert_eq!(big.service.key.name, "big");
    let changed = [ServiceChange {
        key: &big.service.key,
        next: Some(big),
    }];
    let started = Instant::now();
    dp.program_changes(prev, next, &changed, &Claims::of(next))
        .unwrap();
    started.elapsed()
}

/// The endpoints `n` connections to 10.96.0.10:80 reached (the local
/// address each was accepted on: every 10.244/16 address is local).
fn reached(listener: &TcpListener, n: usize) -> BTreeSet<Ipv4Addr> {
    let mut out = BTreeSet::new();
    for _ in 0..n {
        let _c = TcpStream::connect_timeout(
            &SocketAddr::from(([10, 96, 0, 10], 80)),
            Duration::from_secs(2),
        )
        .unwrap();
        let (s, _) = listener.accept().unwrap();
        match s.local_addr().unwrap().ip() {
            IpAddr::V4(a) => out.insert(a),
            other => panic!("reached {other}"),
        };
    }
    out
}

#[test]
fn one_endpoint_of_a_big_service_changed_rewrites_its_slot_only() {
    in_private_netns(|| {
        ip(&["link", "set", "lo", "up"]);
        // Service and endpoint addresses are all this namespace's own.
        ip(&["route", "add", "local", "10.0.0.0/8", "dev", "lo"]);
        let listener = TcpListener::bind("0.0.0.0:8080").unwrap();

        let mut ips: BTreeSet<Ipv4Addr> = (0..ENDPOINTS).map(addr).collect();
        let mut prev = state(&ips);
        let mut dp = NftDatapath::open(Vec::new()).unwrap();
        dp.program_all(&prev, &Claims::of(&prev)).unwrap();
        let (count, mut slots) = programmed();
        assert_eq!(count, ENDPOINTS);
        assert_eq!(slots.values().copied().collect::<BTreeSet<_>>(), ips);

        // The lowest address moves to a new one above all others, one
        // from the middle goes, then one comes back below all others:
        // each time at most the slot it had and the last slot change.
        let steps: [(&str, Option<u32>, Option<Ipv4Addr>); 3] = [
            ("moved", Some(0), Some(Ipv4Addr::new(10, 245, 0, 1))),
            ("removed", Some(ENDPOINTS / 2), None),
            ("added", None, Some(Ipv4Addr::new(10, 243, 0, 1))),
        ];
        for (what, gone, new) in steps {
            if let Some(i) = gone {
                assert!(ips.remove(&addr(i)));
            }
            ips.extend(new);
            let next = state(&ips);
            let took = change(&mut dp, &prev, &next);
            let (n, commands) = dp.last_transaction(Family::V4).unwrap().clone();
            eprintln!("{what}: programmed in {took:?}, {n} commands: {commands:?}");
            let (count, after) = programmed();
            assert_eq!(count as usize, ips.len(), "{what}");
            assert_eq!(
                after.values().copied().collect::<BTreeSet<_>>(),
                ips,
                "{what}: the kernel's endpoints"
            );
            let differing = (0..ENDPOINTS + 2)
                .filter(|s| slots.get(s) != after.get(s))
                .count();
            assert!(
                differing <= 2,
                "{what}: {differing} slots of {} rewritten",
                ips.len()
            );
            // No element of another service, no rule, no chain.
            assert!(n <= 6, "{what}: {commands:#?}");
            let hit = reached(&listener, 50);
            assert!(hit.is_subset(&ips), "{what}: reached {hit:?}");
            (prev, slots) = (next, after);
        }

        // A full sync (a restart) writes address order again, and the
        // next change still costs one slot.
        let mut dp = NftDatapath::open(Vec::new()).unwrap();
        dp.program_all(&prev, &Claims::of(&prev)).unwrap();
        let (_, slots) = programmed();
        let last = *ips.iter().next_back().unwrap();
        ips.remove(&last);
        ips.insert(Ipv4Addr::new(10, 246, 0, 1));
        let next = state(&ips);
        change(&mut dp, &prev, &next);
        let (_, after) = programmed();
        let differing = slots
            .iter()
            .filter(|(s, a)| after.get(s) != Some(a))
            .count();
        assert_eq!(differing, 1);
        nft::cleanup().unwrap();
    });
}
