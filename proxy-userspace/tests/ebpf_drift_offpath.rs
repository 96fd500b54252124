//! The eBPF drift check away from the applies (issue 38 item 4), in the
//! real kernel (root only, and only when the binary embeds the eBPF object;
//! otherwise the tests say why and pass): a change is programmed at once
//! while a check reads 300,000 entries back, and what a check finds is
//! repaired by the full sync that follows.
//!
//! Each test has its own cgroup, bpffs directory and network namespace
//! (with only loopback: an echo server on 0.0.0.0 answers every
//! 127.0.0.0/8 backend), removed by a Drop guard even after a failure.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aya::maps::{HashMap, Map, MapData};
use ebpf_kube_proxy::apply::Applier;
use ebpf_kube_proxy::datapath::ebpf::{codec::Vip, linkstate, EbpfDatapath};
use proxy_common::{ServiceKey, ServiceValue, PROTO_TCP};

mod common;
use common::kernel::Env;

#[path = "../benches/common/ebpf_scale.rs"]
mod scale;

const SERVER_PORT: u16 = 9090;

const NS: &str = "ns";

fn env(tag: &str) -> Option<Env> {
    let mut env = Env::new("ebpf_drift_offpath", &format!("drift-{tag}"))?;
    env.add_ns(NS);
    env.serve(
        NS,
        common::kernel::ADDR_ECHO_SERVER,
        &[&SERVER_PORT.to_string()],
    );
    Some(env)
}

/// One connection to `host:80` from the test cgroup: the reply.
fn connect(env: &Env, host: &str) -> String {
    let script = "import os,socket,sys\nopen(sys.argv[1]+'/cgroup.procs','w').write(str(os.getpid()))\ntry:\n s=socket.create_connection((sys.argv[2],80),timeout=3); s.sendall(b'x'); print(s.recv(100).decode())\nexcept OSError as e:\n print('error:', e)\n";
    let out = env
        .python(NS, script)
        .arg(&env.cgroup)
        .arg(host)
        .output()
        .expect("running a client");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn local_service(i: usize, addr: &str) -> ebpf_kube_proxy::model::ServiceEndpoints {
    let ip: IpAddr = addr.parse().unwrap();
    scale::service(i, &[ip], SERVER_PORT)
}

#[test]
fn a_change_is_programmed_at_once_while_a_drift_check_runs() {
    let Some(env) = env("busy") else { return };
    let config = env.config(1 << 20, &["0.0.0.0/32"]);
    let base = scale::state(30_000, 270_000);
    let before = scale::with_service(&base, local_service(7, "127.0.0.1"));
    let after = scale::with_service(&base, local_service(7, "127.0.0.2"));
    drop(base);
    let mut dp = Applier::new(Box::new(EbpfDatapath::open(&config).expect("open")));
    dp.apply(&Arc::new(before)).expect("apply");
    let vip = scale::vip(7).to_string();
    assert_eq!(connect(&env, &vip), "ok:127.0.0.1");

    let check = dp
        .drift_check()
        .expect("the eBPF datapath checks away from the applies");
    let started = Instant::now();
    let running = std::thread::spawn(move || {
        let verdict = check();
        (verdict, started.elapsed())
    });
    // Give the check a head start into its reading of the maps.
    std::thread::sleep(Duration::from_millis(20));
    let applied = dp.apply(&Arc::new(after)).expect("apply during the check");
    let applied_at = started.elapsed();
    assert_eq!(applied.stats.services_changed, 1);
    let answered = connect(&env, &vip);
    let (verdict, check_took) = running.join().expect("the check thread");
    eprintln!("change programmed at {applied_at:?}; the check took {check_took:?}");
    assert_eq!(answered, "ok:127.0.0.2");
    assert!(
        applied_at < check_took,
        "the apply waited for the check: programmed at {applied_at:?}, check ended at {check_took:?}"
    );
    // What the check saw differ can only be the service just changed and
    // its backends (a backend the view does not know yet has no owner: the
    // coordinator checks again for those).
    let drifts = verdict.expect("the check ran");
    assert!(
        drifts
            .iter()
            .all(|d| d.service.as_deref() == Some("ns-7/svc-7")
                || (d.service.is_none() && d.object == "EKP_BACKENDS")),
        "{drifts:?}"
    );
    // In place, nothing differs.
    let left = dp.verify().expect("verify");
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn what_a_check_beside_the_applies_finds_is_repaired_by_the_next_full_sync() {
    let Some(env) = env("repair") else { return };
    let config = env.config(1 << 16, &["0.0.0.0/32"]);
    let state = Arc::new(scale::with_service(
        &scale::state(100, 300),
        local_service(7, "127.0.0.1"),
    ));
    let mut dp = Applier::new(Box::new(EbpfDatapath::open(&config).expect("open")));
    dp.apply(&state).expect("apply");
    let vip = scale::vip(7).to_string();
    assert_eq!(connect(&env, &vip), "ok:127.0.0.1");

    // Someone deletes the service's slot by hand: connections fail.
    let pin = MapData::from_pin(env.bpffs.join("EKP_SERVICES")).expect("pinned services map");
    let mut services: HashMap<MapData, ServiceKey, ServiceValue> =
        HashMap::try_from(Map::HashMap(pin)).expect("a hash map");
    let v = Vip {
        ip: IpAddr::V4(scale::vip(7)),
        port: 80,
        proto: PROTO_TCP,
        scope: ebpf_kube_proxy::datapath::ebpf::codec::Scope::Socket,
    };
    services.remove(&v.key(1)).expect("deleting slot 1");
    assert!(!connect(&env, &vip).starts_with("ok:"));

    let check = dp.drift_check().expect("a check beside the applies");
    let drifts = check().expect("the check ran");
    assert_eq!(drifts.len(), 1, "{drifts:?}");
    assert!(drifts[0].key.contains("slot 1"), "{drifts:?}");
    dp.drift_found();
    let applied = dp.apply(&state).expect("the repairing full sync");
    assert!(applied.full);
    assert_eq!(connect(&env, &vip), "ok:127.0.0.1");
    let left = dp.verify().expect("verify");
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_link_detached_but_still_pinned_is_drift_and_attached_again() {
    let Some(env) = env("detached") else { return };
    let config = env.config(1 << 16, &["0.0.0.0/32"]);
    let state = Arc::new(scale::with_service(
        &scale::state(10, 30),
        local_service(7, "127.0.0.1"),
    ));
    let mut dp = Applier::new(Box::new(EbpfDatapath::open(&config).expect("open")));
    dp.apply(&state).expect("apply");
    let vip = scale::vip(7).to_string();
    assert_eq!(connect(&env, &vip), "ok:127.0.0.1");

    // Detached as `bpftool link detach` does: the pin stays, the hook goes.
    let pin = env.bpffs.join("links/ekp_connect4");
    assert_eq!(linkstate::attached(&pin), Some(true));
    linkstate::detach(&pin).expect("BPF_LINK_DETACH");
    assert!(pin.exists());
    assert_eq!(linkstate::attached(&pin), Some(false));
    assert!(!connect(&env, &vip).starts_with("ok:"));

    let check = dp.drift_check().expect("a check beside the applies");
    let drifts = check().expect("the check ran");
    assert_eq!(drifts.len(), 1, "{drifts:?}");
    assert!(
        drifts[0].object.ends_with("links/ekp_connect4"),
        "{drifts:?}"
    );
    assert!(drifts[0].found.contains("detached"), "{drifts:?}");
    dp.drift_found();
    dp.apply(&state).expect("the repairing full sync");
    assert_eq!(linkstate::attached(&pin), Some(true));
    assert_eq!(connect(&env, &vip), "ok:127.0.0.1");
    let left = dp.verify().expect("verify");
    assert!(left.is_empty(), "{left:?}");
}
