//! One Service with 100,000 endpoints through the real socket hooks (root
//! only, and only when the binary embeds the eBPF object; otherwise the
//! test says why and passes). Kubernetes sets no per-service limit; the
//! eBPF datapath used to refuse more than 4,096 backends, and a slot
//! number beyond 65,535 needs the high bits the key keeps in its scope
//! byte. Connections must be answered by backends in slots past 4,096 and
//! past 65,535, and one endpoint changed must be a handful of writes
//! planned from the change: the backends the plan looks up are the
//! changed ones, not the service's 100,000 (the figure that cannot flake,
//! where a duration could).
//!
//! The test has its own cgroup, bpffs directory and network namespace
//! (with only loopback: an echo server on 0.0.0.0 answers every
//! 127.0.0.0/8 backend and says which address it was reached on),
//! removed by a Drop guard even after a failure.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use ebpf_kube_proxy::datapath::ebpf::{self, generation, EbpfDatapath};
use ebpf_kube_proxy::datapath::{Datapath, ServiceChange};
use ebpf_kube_proxy::model::claims::Claims;
use ebpf_kube_proxy::model::LocalState;

mod common;
use common::kernel::Env;

#[path = "../benches/common/ebpf_scale.rs"]
mod scale;

const SERVER_PORT: u16 = 9090;

/// argv: CGROUP_DIR HOST N. N connections to HOST:80 from the cgroup; one
/// JSON list of the replies (or errors).
const CLIENT: &str = r#"
import json, os, socket, sys
cg, host, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(cg + "/cgroup.procs", "w") as f:
    f.write(str(os.getpid()))
out = []
for _ in range(n):
    try:
        s = socket.create_connection((host, 80), timeout=3)
        s.sendall(b"x")
        out.append(s.recv(100).decode())
        s.close()
    except OSError as e:
        out.append("error: " + str(e))
print(json.dumps(out))
"#;

const NS: &str = "ns";

/// Backend `i` of the big service: 127.1.0.0 onwards (loopback answers).
fn loopback(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x7f01_0000 + i))
}

#[test]
fn a_service_with_100k_endpoints_answers_from_slots_past_65535() {
    let Some(mut env) = Env::new("ebpf_big_service", "big-svc") else {
        return;
    };
    env.add_ns(NS);
    env.serve(
        NS,
        common::kernel::ADDR_ECHO_SERVER,
        &[&SERVER_PORT.to_string()],
    );
    let config = env.config(generation::DEFAULT_MAP_SIZE, &["0.0.0.0/32"]);

    // 1,000 small services next to one of 100,000 endpoints.
    let big = 1000;
    let n = 100_000u32;
    let ips: Vec<IpAddr> = (0..n).map(loopback).collect();
    let state = scale::with_service(
        &scale::state(1000, 3000),
        scale::service(big, &ips, SERVER_PORT),
    );
    let mut dp = EbpfDatapath::open(&config).expect("open");
    let started = Instant::now();
    dp.program_all(&state, &Claims::of(&state))
        .expect("a service of 100,000 endpoints is programmed");
    eprintln!(
        "1,000 services + one of 100,000 endpoints programmed in {:?}",
        started.elapsed()
    );

    // Which slot each backend address sits in, as the kernel holds it.
    let vip = scale::vip(big).to_string();
    let kernel = ebpf::dump::read(&env.bpffs).expect("dump");
    let svc = kernel
        .services
        .iter()
        .find(|s| s.address == vip && s.scope == "socket")
        .expect("the big service is in the map");
    assert_eq!((svc.count, svc.slots.len()), (n, n as usize));
    let slot_of: HashMap<String, u32> = svc
        .slots
        .iter()
        .map(|s| {
            let b = s.backend.clone().expect("every slot's backend exists");
            let ip = b
                .rsplit_once(':')
                .map_or(b.clone(), |(ip, _)| ip.to_owned());
            (ip, s.slot)
        })
        .collect();
    assert_eq!(slot_of.len(), n as usize, "each backend in one slot");

    // Connections through the socket hook: every one answered, some by
    // backends beyond slot 4,096 and beyond slot 65,535 (a third of the
    // slots: 400 connections miss them all with probability 1e-70).
    let replies = env.python_json(NS, CLIENT, &[env.cgroup.to_str().unwrap(), &vip, "400"]);
    let slots: Vec<u32> = replies
        .as_array()
        .expect("a JSON list")
        .iter()
        .map(|r| {
            let r = r.as_str().unwrap_or_default();
            let ip = r
                .strip_prefix("ok:")
                .unwrap_or_else(|| panic!("a connection failed: {r}"));
            *slot_of
                .get(ip)
                .unwrap_or_else(|| panic!("answered by {ip}, not a backend of the service"))
        })
        .collect();
    assert!(slots.iter().any(|&s| s > 4096), "{slots:?}");
    assert!(slots.iter().any(|&s| s > 65_535), "{slots:?}");

    // One endpoint leaves and another arrives: a few map writes (the
    // new backend, its slot, the old backend's removal), not 100,000.
    let mut moved = ips.clone();
    let gone = moved.remove(80_000);
    let new = IpAddr::V4(Ipv4Addr::new(127, 3, 0, 1));
    moved.push(new);
    let next = scale::with_service(&state, scale::service(big, &moved, SERVER_PORT));
    let started = Instant::now();
    let stats = change(&mut dp, &state, &next, big);
    eprintln!(
        "one endpoint of 100,000 changed in {:?}: {:?}",
        started.elapsed(),
        dp.last_plan()
    );
    assert_eq!(stats.services_changed, 1);
    let cost = dp.last_plan();
    assert!(cost.ops <= 3, "{cost:?}");
    assert_eq!(cost.backends_looked_up, 2, "planned from the change");
    let kernel = ebpf::dump::read(&env.bpffs).expect("dump");
    let svc = kernel
        .services
        .iter()
        .find(|s| s.address == vip && s.scope == "socket")
        .unwrap();
    assert_eq!(svc.count, n);
    let slot = |ip: &IpAddr| {
        svc.slots
            .iter()
            .find(|s| s.backend.as_deref() == Some(&format!("{ip}:{SERVER_PORT}")))
            .map(|s| s.slot)
    };
    assert_eq!(slot(&gone), None);
    assert_eq!(
        slot(&new),
        slot_of.get(&gone.to_string()).copied(),
        "the new backend takes the slot of the one that left"
    );
    let drifts = dp.verify(&next, &Claims::of(&next)).expect("drift check");
    assert!(drifts.is_empty(), "{drifts:?}");

    // One slice of 1,000 rewritten, three times: 1,000 endpoints go,
    // 1,000 arrive, and only they are looked up.
    let mut prev = next;
    for round in 0..3u32 {
        let lo = 1_000 * round as usize;
        let mut ips: Vec<IpAddr> = moved.clone();
        ips.drain(lo..lo + 1_000);
        ips.extend((0..1_000).map(|i| loopback(200_000 + round * 1_000 + i)));
        let next = scale::with_service(&prev, scale::service(big, &ips, SERVER_PORT));
        let started = Instant::now();
        change(&mut dp, &prev, &next, big);
        let cost = dp.last_plan();
        eprintln!(
            "one slice of 1,000 rewritten in {:?}: {cost:?}",
            started.elapsed()
        );
        assert!(cost.ops <= 2_000 + 1_000 + 1, "{cost:?}");
        assert_eq!(cost.backends_looked_up, 2_000, "planned from the change");
        let kernel = ebpf::dump::read(&env.bpffs).expect("dump");
        let svc = kernel
            .services
            .iter()
            .find(|s| s.address == vip && s.scope == "socket")
            .unwrap();
        assert_eq!(svc.count, n);
        let mut got: Vec<String> = svc.slots.iter().filter_map(|s| s.backend.clone()).collect();
        let mut want: Vec<String> = ips.iter().map(|ip| format!("{ip}:{SERVER_PORT}")).collect();
        got.sort_unstable();
        want.sort_unstable();
        assert!(got == want, "round {round}: the kernel's backends differ");
        moved = ips;
        prev = next;
    }
}

/// Programs the change of service `big` from `prev` to `next`.
fn change(
    dp: &mut EbpfDatapath,
    prev: &LocalState,
    next: &LocalState,
    big: usize,
) -> ebpf_kube_proxy::datapath::ApplyStats {
    let se = next
        .services
        .iter()
        .find(|s| s.service.key.name == format!("svc-{big}"))
        .expect("the big service");
    let changed = [ServiceChange {
        key: &se.service.key,
        next: Some(se),
    }];
    dp.program_changes(prev, next, &changed, &Claims::of(next))
        .expect("a change of the big service")
}
