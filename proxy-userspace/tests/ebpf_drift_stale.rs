//! The eBPF drift check finds and removes stale entries of the maps the
//! programs write (issue 38 item 4): reverse NAT, ClientIP affinity of
//! both scopes and the tc programs' conntrack entries that point at a
//! backend or service no longer programmed, while the entries of live
//! backends and the flows of an endpoint that terminates but still
//! serves stay. In the real kernel (root only, and only when the binary
//! embeds the eBPF object; otherwise the test says why and passes), with
//! its own cgroup, bpffs directory and network namespace, removed by a
//! Drop guard even after a failure.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

use aya::maps::{HashMap, Map, MapData};
use aya::Pod;
use ebpf_kube_proxy::apply::Applier;
use ebpf_kube_proxy::datapath::ebpf::codec::{encode_ip, Scope, Vip};
use ebpf_kube_proxy::datapath::ebpf::drift::stale;
use ebpf_kube_proxy::datapath::ebpf::maps::KernelMaps;
use ebpf_kube_proxy::datapath::ebpf::{desired, EbpfDatapath};
use ebpf_kube_proxy::model::claims::Claims;
use ebpf_kube_proxy::model::{testing, EndpointConditions, EndpointScopes, LocalState};
use proxy_common::{
    AffinityKey, AffinityValue, Backend, CtKey, CtValue, ExtAffinityKey, RevNatKey, RevNatValue,
    ServiceKey, ServiceValue, CT_F_ORIGINAL, FAMILY_V4, PROTO_TCP,
};

mod common;
use common::kernel::Env;

const PORT: u16 = 9090;
const CLUSTER_IP: &str = "10.96.0.70";
const EXTERNAL_IP: &str = "192.0.2.70";

/// `ns/web` on CLUSTER_IP:80 and EXTERNAL_IP:80 with ClientIP affinity:
/// 127.0.0.1 ready, 127.0.0.2 ready unless `removed`, 127.0.0.3 ready, or
/// terminating but serving once `removed`.
fn state(removed: bool) -> LocalState {
    let ep = |ip: &str, ready: bool| {
        let scopes = if ready {
            testing::ALL_SCOPES
        } else {
            EndpointScopes::default()
        };
        let mut e = testing::endpoint(ip, PORT, scopes);
        e.conditions = EndpointConditions {
            ready,
            serving: true,
            terminating: !ready,
        };
        e
    };
    let mut eps = vec![ep("127.0.0.1", true), ep("127.0.0.3", !removed)];
    if !removed {
        eps.push(ep("127.0.0.2", true));
    }
    let mut web = testing::service("ns", "web", &[CLUSTER_IP])
        .with_external_ips(&[EXTERNAL_IP])
        .with_affinity(600)
        .with_endpoints(eps);
    web.service.uid = Default::default();
    web.service.ports[0].target_port = PORT;
    LocalState::new([web])
}

fn map<K: Pod, V: Pod>(env: &Env, name: &str) -> HashMap<MapData, K, V> {
    let pin = MapData::from_pin(env.bpffs.join(name)).expect("a pinned map");
    let map = match name {
        "EKP_SERVICES" | "EKP_BACKENDS" => Map::HashMap(pin),
        _ => Map::LruHashMap(pin),
    };
    HashMap::try_from(map).expect("a hash map")
}

fn v4(ip: &str) -> [u32; 4] {
    encode_ip(ip.parse().unwrap()).0
}

fn vip(ip: &str, scope: Scope) -> Vip {
    Vip {
        ip: ip.parse().unwrap(),
        port: 80,
        proto: PROTO_TCP,
        scope,
    }
}

/// A tracked flow from `client`:40000 to EXTERNAL_IP:80 sent to
/// `backend`: its original and reply entries.
fn flow(client: &str, backend: &str, backend_id: u32) -> [(CtKey, CtValue); 2] {
    let (c, f, b) = (v4(client), v4(EXTERNAL_IP), v4(backend));
    let (cport, fport, bport) = (40000u16.to_be(), 80u16.to_be(), PORT.to_be());
    let key = |saddr, daddr, sport, dport| CtKey {
        saddr,
        daddr,
        sport,
        dport,
        proto: PROTO_TCP,
        family: FAMILY_V4,
        _pad: 0,
    };
    let value = |saddr, daddr, sport, dport, flags, backend_id| CtValue {
        saddr,
        daddr,
        sport,
        dport,
        flags,
        backend_id,
        ..CtValue::default()
    };
    [
        (
            key(c, f, cport, fport),
            value(c, b, cport, bport, CT_F_ORIGINAL, backend_id),
        ),
        (key(b, c, bport, cport), value(f, c, fport, cport, 0, 0)),
    ]
}

#[test]
fn stale_entries_of_a_removed_backend_are_removed_and_live_ones_stay() {
    let Some(env) = Env::new("ebpf_drift_stale", "stale") else {
        return;
    };
    let config = env.config(1 << 16, &["0.0.0.0/32"]);
    let mut dp = Applier::new(Box::new(EbpfDatapath::open(&config).expect("open")));
    dp.apply(&Arc::new(state(false))).expect("apply");

    let backends: HashMap<MapData, u32, Backend> = map(&env, "EKP_BACKENDS");
    let ids: BTreeMap<Ipv4Addr, u32> = backends
        .iter()
        .map(|e| e.unwrap())
        .map(|(id, b)| (Ipv4Addr::from(b.addr[0].to_ne_bytes()), id))
        .collect();
    let id = |last: u8| ids[&Ipv4Addr::new(127, 0, 0, last)];
    let (live, gone) = (id(1), id(2));
    let services: HashMap<MapData, ServiceKey, ServiceValue> = map(&env, "EKP_SERVICES");
    let service_id = |v: Vip| services.get(&v.key(0), 0).expect("a header").service_id;
    let (socket_sid, ext_sid) = (
        service_id(vip(CLUSTER_IP, Scope::Socket)),
        service_id(vip(EXTERNAL_IP, Scope::External)),
    );

    // 127.0.0.2 leaves the service; 127.0.0.3 terminates but serves.
    dp.apply(&Arc::new(state(true))).expect("apply");

    // What the programs would have written for clients of the three
    // backends (and of a service id that never existed), planted by hand.
    let mut revnat: HashMap<MapData, RevNatKey, RevNatValue> = map(&env, "EKP_REVNAT");
    let rkey = |cookie, backend: &str| RevNatKey {
        cookie,
        addr: v4(backend),
        port: PORT.to_be(),
        family: FAMILY_V4,
        _pad: [0; 5],
    };
    let rval = RevNatValue {
        addr: v4(CLUSTER_IP),
        port: 80u16.to_be(),
        _pad: 0,
    };
    for (cookie, b) in [(1, "127.0.0.1"), (2, "127.0.0.2"), (3, "127.0.0.3")] {
        revnat.insert(rkey(cookie, b), rval, 0).unwrap();
    }
    let mut affinity: HashMap<MapData, AffinityKey, AffinityValue> = map(&env, "EKP_AFFINITY");
    let akey = |cookie, service_id| AffinityKey {
        client_cookie: cookie,
        service_id,
        _pad: 0,
    };
    let aval = |backend_id| AffinityValue {
        backend_id,
        ..AffinityValue::default()
    };
    for (k, v) in [
        (akey(11, socket_sid), live),
        (akey(12, socket_sid), gone),
        (akey(13, 0xdead), live),
    ] {
        affinity.insert(k, aval(v), 0).unwrap();
    }
    let mut ext_affinity: HashMap<MapData, ExtAffinityKey, AffinityValue> =
        map(&env, "EKP_EXT_AFFINITY");
    let ekey = |client: &str| ExtAffinityKey {
        client: v4(client),
        service_id: ext_sid,
        family: FAMILY_V4,
        _pad: [0; 3],
    };
    ext_affinity
        .insert(ekey("198.51.100.1"), aval(live), 0)
        .unwrap();
    ext_affinity
        .insert(ekey("198.51.100.2"), aval(gone), 0)
        .unwrap();
    let mut ct: HashMap<MapData, CtKey, CtValue> = map(&env, "EKP_CT");
    let flows = [
        flow("198.51.100.1", "127.0.0.1", live),
        flow("198.51.100.2", "127.0.0.2", gone),
        flow("198.51.100.3", "127.0.0.3", id(3)),
    ];
    for (k, v) in flows.iter().flatten() {
        ct.insert(k, v, 0).unwrap();
    }

    // Judged while an apply wrote the view meanwhile: nothing is deleted
    // nor reported (the next check looks again).
    let view = KernelMaps::from_pins(&env.bpffs)
        .and_then(|m| m.read_view())
        .expect("the maps read back");
    let removed = state(true);
    let wanted = || desired::desired_state(&removed, &Claims::of(&removed), &[]);
    let live_view = stale::Live::new(&view, &wanted, &|_| None);
    let outdated = stale::sweep(&env.bpffs, &live_view, &|| false).expect("a sweep");
    assert!(outdated.is_empty(), "{outdated:#?}");
    assert!(revnat.get(&rkey(2, "127.0.0.2"), 0).is_ok());
    assert!(ext_affinity.get(&ekey("198.51.100.2"), 0).is_ok());
    assert!(ct.get(&flows[1][0].0, 0).is_ok());

    let check = dp.drift_check().expect("a check beside the applies");
    let drifts = check().expect("the check ran");
    let mut by_map: BTreeMap<String, usize> = BTreeMap::new();
    for d in &drifts {
        *by_map.entry(d.object.clone()).or_default() += 1;
    }
    assert_eq!(
        by_map,
        BTreeMap::from([
            ("EKP_AFFINITY".to_owned(), 2),
            ("EKP_CT".to_owned(), 1),
            ("EKP_EXT_AFFINITY".to_owned(), 1),
            ("EKP_REVNAT".to_owned(), 1),
        ]),
        "{drifts:#?}"
    );
    assert!(drifts.iter().all(|d| d.repaired), "{drifts:#?}");
    let ct_drift = drifts.iter().find(|d| d.object == "EKP_CT").unwrap();
    assert_eq!(ct_drift.service.as_deref(), Some("ns/web"), "{ct_drift:#?}");
    assert!(ct_drift.found.contains("127.0.0.2:9090"), "{ct_drift:#?}");

    // Gone: what pointed at 127.0.0.2 or the unknown service.
    assert!(revnat.get(&rkey(2, "127.0.0.2"), 0).is_err());
    assert!(affinity.get(&akey(12, socket_sid), 0).is_err());
    assert!(affinity.get(&akey(13, 0xdead), 0).is_err());
    assert!(ext_affinity.get(&ekey("198.51.100.2"), 0).is_err());
    for (k, _) in &flows[1] {
        assert!(ct.get(k, 0).is_err(), "{k:?} left");
    }
    // Kept: the live backend's, and the terminating-but-serving one's
    // flow and socket.
    assert!(revnat.get(&rkey(1, "127.0.0.1"), 0).is_ok());
    assert!(revnat.get(&rkey(3, "127.0.0.3"), 0).is_ok());
    assert_eq!(
        affinity.get(&akey(11, socket_sid), 0).unwrap().backend_id,
        live
    );
    assert_eq!(
        ext_affinity
            .get(&ekey("198.51.100.1"), 0)
            .unwrap()
            .backend_id,
        live
    );
    for (k, v) in flows[0].iter().chain(&flows[2]) {
        assert_eq!(ct.get(k, 0).ok().as_ref(), Some(v), "{k:?}");
    }

    // Nothing is left for a second check, nor for the full sync.
    let again = dp.drift_check().unwrap()().expect("a second check");
    assert!(again.is_empty(), "{again:#?}");
    let left = dp.verify().expect("verify");
    assert!(left.is_empty(), "{left:?}");
}
