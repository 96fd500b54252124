//! eBPF map capacity in the real kernel (root only, and only when the
//! binary embeds the eBPF object; otherwise the tests say why and pass):
//! a 100k-service / 1M-endpoint state fits the default `--ebpf-map-size`;
//! pinned maps of another size are replaced while connections keep being
//! load-balanced; a state that would overflow a map is refused whole and
//! the programmed one keeps serving.
//!
//! Each test has its own cgroup, bpffs directory and network namespace
//! (with only loopback: an echo server on 0.0.0.0 answers every
//! 127.0.0.0/8 backend), removed by a Drop guard even after a failure.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ebpf_kube_proxy::apply::Applier;
use ebpf_kube_proxy::datapath::ebpf::{self, generation, loader, EbpfConfig, EbpfDatapath};
use ebpf_kube_proxy::datapath::{Datapath, DatapathError};
use ebpf_kube_proxy::model::LocalState;

mod common;
use common::kernel::{Env, Piped};

#[path = "../benches/common/ebpf_scale.rs"]
mod scale;

const SERVER_PORT: u16 = 9090;

/// argv: CGROUP_DIR HOST PORT STOP_FILE. Connects in a loop until
/// STOP_FILE exists; prints "first" after the first answer, then one JSON
/// line with the counts.
const LOOP: &str = r#"
import json, os, socket, sys
cg, host, port, stop = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with open(cg + "/cgroup.procs", "w") as f:
    f.write(str(os.getpid()))
ok = fail = 0
errors = []
while not os.path.exists(stop):
    try:
        s = socket.create_connection((host, port), timeout=2)
        s.sendall(b"x")
        r = s.recv(100)
        s.close()
        if r.startswith(b"ok:"):
            ok += 1
        else:
            fail += 1
    except OSError as e:
        fail += 1
        errors.append(str(e))
    if ok == 1 and fail == 0:
        print("first", flush=True)
print(json.dumps({"ok": ok, "fail": fail, "errors": errors[:5]}), flush=True)
"#;

/// The test's one namespace.
const NS: &str = "ns";

/// The test's environment with an echo server running, or `None` (and a
/// SKIP line) where the kernel test cannot run.
fn env(tag: &str) -> Option<Env> {
    let mut env = Env::new("ebpf_capacity", &format!("cap-{tag}"))?;
    env.add_ns(NS);
    env.serve(
        NS,
        common::kernel::ADDR_ECHO_SERVER,
        &[&SERVER_PORT.to_string()],
    );
    Some(env)
}

fn config(env: &Env, map_size: u32) -> EbpfConfig {
    // No node address is in 0.0.0.0/32: the tc programs attach to no
    // interface of the machine (this measures the socket hooks).
    env.config(map_size, &["0.0.0.0/32"])
}

/// Starts the connect loop against `host:80`; returns once it got a first
/// answer.
fn connect_loop(env: &mut Env, host: &str, stop: &Path) -> Piped {
    let mut cmd = env.python(NS, LOOP);
    cmd.arg(&env.cgroup).args([host, "80"]).arg(stop);
    let mut out = env.spawn(cmd);
    assert_eq!(out.line().trim(), "first", "the loop's first connection");
    out
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

/// Service `i` answered by the echo server on these loopback addresses.
fn local_service(i: usize, addrs: &[&str]) -> ebpf_kube_proxy::model::ServiceEndpoints {
    let ips: Vec<IpAddr> = addrs.iter().map(|a| a.parse().unwrap()).collect();
    scale::service(i, &ips, SERVER_PORT)
}

fn max_entries(pin: &Path) -> u32 {
    aya::maps::MapData::from_pin(pin)
        .and_then(|m| m.info())
        .map(|i| i.max_entries())
        .expect("reading a pinned map's info")
}

#[test]
fn a_hundred_thousand_services_with_a_million_endpoints_are_programmed() {
    let Some(env) = env("big") else { return };
    let (services, endpoints) = (100_000, 1_000_000);
    let sampled = 77_777;
    let base = scale::state(services, endpoints);
    // The sampled service keeps its 10 endpoints, on loopback addresses.
    let addrs: Vec<String> = (1..=10).map(|n| format!("127.0.0.{n}")).collect();
    let addrs: Vec<&str> = addrs.iter().map(String::as_str).collect();
    let state = scale::with_service(&base, local_service(sampled, &addrs));
    drop(base);
    let endpoint_count: usize = state.services.iter().map(|s| s.endpoints.len()).sum();
    assert_eq!(
        (state.services.len(), endpoint_count),
        (services, endpoints)
    );

    let dp = EbpfDatapath::open(&config(&env, generation::DEFAULT_MAP_SIZE)).expect("open");
    let mut dp = Applier::new(Box::new(dp));
    let started = Instant::now();
    dp.apply(&Arc::new(state)).expect("programming 100k/1M");
    eprintln!(
        "100k services / 1M endpoints programmed in {:?}",
        started.elapsed()
    );
    let entries = dp.datapath().map_entries();
    assert_eq!(
        entries,
        vec![
            ("EKP_SERVICES", services + endpoints),
            ("EKP_BACKENDS", endpoints)
        ]
    );
    let reply = connect(&env, &scale::vip(sampled).to_string());
    assert!(reply.starts_with("ok:127.0.0."), "{reply}");
}

#[test]
fn pinned_maps_of_a_smaller_capacity_are_replaced_without_a_gap() {
    let Some(mut env) = env("swap") else { return };
    let small = 4096;
    let state: LocalState = {
        let mut s = scale::state(500, 1500);
        s = scale::with_service(&s, local_service(7, &["127.0.0.1", "127.0.0.2"]));
        s
    };
    let vip = scale::vip(7).to_string();
    let services = env.bpffs.join("EKP_SERVICES");
    {
        let dp = EbpfDatapath::open(&config(&env, small)).expect("open small");
        let mut dp = Applier::new(Box::new(dp));
        dp.apply(&Arc::new(state.clone())).expect("apply");
    }
    assert_eq!(max_entries(&services), small);
    assert!(connect(&env, &vip).starts_with("ok:"));

    let stop = std::env::temp_dir().join(format!("ekp-cap-swap-{}.stop", std::process::id()));
    let _ = std::fs::remove_file(&stop);
    let mut out = connect_loop(&mut env, &vip, &stop);
    std::thread::sleep(Duration::from_millis(300));
    let big = 1 << 16;
    let started = Instant::now();
    let dp = EbpfDatapath::open(&config(&env, big)).expect("re-open with a larger map size");
    eprintln!(
        "maps replaced by a new generation in {:?}",
        started.elapsed()
    );
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(&stop, b"").unwrap();
    let line = out.line();
    let _ = std::fs::remove_file(&stop);
    let counts: serde_json::Value = serde_json::from_str(&line).expect(&line);
    assert_eq!(
        counts["fail"], 0,
        "a connection failed during the swap: {line}"
    );
    assert!(counts["ok"].as_u64().unwrap_or(0) > 10, "{line}");

    assert_eq!(max_entries(&services), big, "the new generation is pinned");
    assert_eq!(max_entries(&env.bpffs.join("EKP_BACKENDS")), big);
    assert!(!generation::next_pin(&env.bpffs, "EKP_SERVICES").exists());
    assert_eq!(loader::attached_programs(&env.cgroup).unwrap(), 8);
    // The new generation holds what the old one did: nothing to write.
    let mut dp = Applier::new(Box::new(dp));
    let applied = dp.apply(&Arc::new(state)).expect("apply after the swap");
    assert_eq!(applied.stats.services_changed, 0);
    assert!(connect(&env, &vip).starts_with("ok:"));
}

#[test]
fn a_state_that_overflows_a_map_is_refused_and_the_programmed_state_kept() {
    let Some(env) = env("full") else { return };
    let registry = prometheus::Registry::new();
    let mut raw = EbpfDatapath::open(&config(&env, 1024)).expect("open");
    raw.register_metrics(&registry).expect("metrics");
    let mut dp = Applier::new(Box::new(raw));
    let s1 = scale::with_service(&scale::state(100, 300), local_service(5, &["127.0.0.1"]));
    dp.apply(&Arc::new(s1.clone())).expect("apply what fits");
    let before = ebpf::dump::read(&env.bpffs).expect("dump");

    // The echo service moves to 127.0.0.2, and a service with 2000
    // endpoints arrives: the services map (1024) cannot hold it.
    let s2 = scale::with_service(&s1, local_service(5, &["127.0.0.2"]));
    let s2 = scale::with_service(&s2, scale::nth_service(100, 2000));
    for attempt in 0..2 {
        let err = dp.apply(&Arc::new(s2.clone())).expect_err("overflow");
        let text = err.to_string();
        assert!(
            matches!(
                err,
                DatapathError::Ebpf(ebpf::EbpfError::MapFull {
                    map: "EKP_SERVICES",
                    capacity: 1024,
                    needed: Some(n),
                }) if n > 2000
            ),
            "attempt {attempt}: {text}"
        );
        assert!(text.contains("--ebpf-map-size"), "{text}");
    }
    let after = ebpf::dump::read(&env.bpffs).expect("dump");
    assert_eq!(
        format!("{:?}", after.services),
        format!("{:?}", before.services)
    );
    assert_eq!(after.backends, before.backends);
    assert_eq!(connect(&env, &scale::vip(5).to_string()), "ok:127.0.0.1");
    let metrics = String::from_utf8(
        prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap()
            .into_bytes(),
    )
    .unwrap();
    assert!(
        metrics.contains("ebpf_kube_proxy_datapath_map_full_total{map=\"EKP_SERVICES\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("ebpf_kube_proxy_datapath_map_capacity{map=\"EKP_BACKENDS\"} 1024"),
        "{metrics}"
    );

    // Without the big service it fits again.
    let s3 = scale::with_service(&s1, local_service(5, &["127.0.0.2"]));
    dp.apply(&Arc::new(s3)).expect("apply what fits");
    assert_eq!(connect(&env, &scale::vip(5).to_string()), "ok:127.0.0.2");
}

#[test]
fn a_partial_sync_larger_than_a_chunk_programs_what_a_full_sync_would() {
    let Some(env) = env("rotate") else { return };
    let dp = EbpfDatapath::open(&config(&env, 1 << 16)).expect("open");
    let mut dp = Applier::new(Box::new(dp));
    // 10,000 services (more than two chunks) with two endpoints each;
    // service 7 answered on loopback.
    let (services, per) = (10_000, 2);
    let before = scale::with_service(
        &scale::state(services, services * per),
        local_service(7, &["127.0.0.1"]),
    );
    dp.apply(&Arc::new(before)).expect("first apply");

    // Every pod rotated: each service's endpoints replaced. Services
    // 9000.. are deleted, and a new service takes over the address of
    // deleted service 9000 in the same update.
    let rotated = |i: usize| -> Vec<IpAddr> {
        (0..per)
            .map(|j| scale::backend(1_000_000 + i * per + j))
            .collect()
    };
    let mut heir = local_service(9000, &["127.0.0.3"]);
    heir.service.key = ebpf_kube_proxy::model::ObjectKey::new("ns-heir", "heir");
    let after = LocalState::new(
        (0..9000)
            .map(|i| match i {
                7 => local_service(7, &["127.0.0.2"]),
                _ => scale::service(i, &rotated(i), scale::BACKEND_PORT),
            })
            .chain([heir]),
    );
    let applied = dp.apply(&Arc::new(after)).expect("the rotation");
    assert!(!applied.full, "a partial sync");

    // The kernel holds exactly the new state: the deleted services'
    // entries and every old backend gone, each slot on a new one.
    let kernel = ebpf::dump::read(&env.bpffs).expect("dump");
    let vips: std::collections::BTreeSet<String> =
        kernel.services.iter().map(|s| s.address.clone()).collect();
    let expected: std::collections::BTreeSet<String> =
        (0..=9000).map(|i| scale::vip(i).to_string()).collect();
    let stray: Vec<&String> = vips.difference(&expected).take(3).collect();
    let missing: Vec<&String> = expected.difference(&vips).take(3).collect();
    assert!(
        stray.is_empty() && missing.is_empty(),
        "VIPs in the kernel not in the state: {stray:?}…; missing: {missing:?}…"
    );
    let slots: Vec<&str> = kernel
        .services
        .iter()
        .flat_map(|s| &s.slots)
        .map(|slot| slot.backend.as_deref().unwrap_or("missing"))
        .collect();
    assert_eq!((slots.len(), kernel.backends), (18_000, 18_000));
    // The old backends are 100.0.0.0 onwards, the rotated ones 100.15.66.64.
    assert!(
        slots
            .iter()
            .all(|b| b.starts_with("127.0.0.") || b.starts_with("100.15.")),
        "a slot is not on a new backend: {:?}",
        slots.iter().find(|b| !b.starts_with("100.15."))
    );
    let drifts = dp.verify().expect("drift check");
    assert!(drifts.is_empty(), "{drifts:?}");
    assert_eq!(connect(&env, &scale::vip(7).to_string()), "ok:127.0.0.2");
    assert_eq!(connect(&env, &scale::vip(9000).to_string()), "ok:127.0.0.3");
    assert!(
        !connect(&env, &scale::vip(9001).to_string()).starts_with("ok:"),
        "a deleted service still answers"
    );
}
