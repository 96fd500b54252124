//! The soak's writer: churns services and EndpointSlices through the fake
//! API server and makes that server flap, every choice from one seeded
//! generator.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{Timeline, NS};
use crate::e2e::bed::{Bed, TCP_PORTS, UDP_PORTS};
use crate::e2e::fake_apiserver::FakeApiServer;

/// SplitMix64: small, seeded, reproducible (no dependency for a test tool).
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A generator of its own for another thread, derived from this one.
    pub(super) fn fork(&mut self) -> Rng {
        Rng(self.next_u64())
    }

    /// Uniform in `lo..hi` (`lo` when empty).
    pub(super) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.range(0, items.len() as u64) as usize]
    }
}

/// (address, node name) of each pod of the bed.
pub(super) fn pod_endpoints(bed: &Bed) -> Vec<(String, String)> {
    bed.pods
        .iter()
        .enumerate()
        .map(|(i, p)| (p.ipv4.clone(), format!("node-{}", i + 1)))
        .collect()
}

/// A ClusterIP Service of the soak namespace; ports are
/// (name, protocol, port, targetPort).
pub(super) fn service_object(name: &str, ip: &str, ports: &[(&str, &str, u16, u16)]) -> Value {
    let ports: Vec<Value> = ports
        .iter()
        .map(|(n, proto, port, target)| {
            json!({"name": n, "protocol": proto, "port": port, "targetPort": target})
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name, "namespace": NS},
           "spec": {"clusterIP": ip, "clusterIPs": [ip], "type": "ClusterIP", "ports": ports}})
}

/// The one EndpointSlice of `svc`; ports are (name, protocol, port), every
/// member ready.
pub(super) fn slice_object(
    svc: &str,
    ports: &[(&str, &str, u16)],
    members: &[(String, String)],
) -> Value {
    let ports: Vec<Value> = ports
        .iter()
        .map(|(n, proto, port)| json!({"name": n, "protocol": proto, "port": port}))
        .collect();
    let endpoints: Vec<Value> = members
        .iter()
        .map(|(ip, node)| json!({"addresses": [ip], "nodeName": node, "conditions": {"ready": true}}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": slice_name(svc), "namespace": NS,
                        "labels": {"kubernetes.io/service-name": svc}},
           "addressType": "IPv4", "ports": ports, "endpoints": endpoints})
}

fn slice_name(svc: &str) -> String {
    format!("{svc}-s1")
}

/// Churned services: `churn-NN` at 10.96.2.(10+NN).
pub(super) const SLOTS: usize = 16;

pub(super) fn slot_name(i: usize) -> String {
    format!("churn-{i:02}")
}

pub(super) fn slot_ip(i: usize) -> String {
    format!("10.96.2.{}", 10 + i)
}

/// The port sets a churned Service moves between.
const PORT_SETS: &[&[(&str, &str, u16, u16)]] = &[
    &[("http", "TCP", 80, 8080)],
    &[("http", "TCP", 81, 8080)],
    &[("http", "TCP", 80, 8080), ("dns", "UDP", 53, 5353)],
    &[("dns", "UDP", 53, 5353)],
];

/// Where a deleted churned service would have answered.
pub(super) const ALL_CHURN_PORTS: &[(&str, u16)] = &[("tcp", 80), ("tcp", 81), ("udp", 53)];

#[derive(Clone, Copy, Default)]
struct Slot {
    service: bool,
    slice: bool,
}

/// How the API server misbehaves for a while.
#[derive(Clone, Copy)]
enum Flap {
    /// Every request answered 500.
    Failing,
    /// Connections closed at once.
    Down,
    Compact,
    DropWatches,
    Restart,
}

const FLAPS: &[Flap] = &[
    Flap::Failing,
    Flap::Down,
    Flap::Compact,
    Flap::DropWatches,
    Flap::Restart,
];
/// A flap every 5–15 s; outages last 1–5 s.
const FLAP_EVERY_MS: (u64, u64) = (5_000, 15_000);
const OUTAGE_MS: (u64, u64) = (1_000, 5_000);

pub(super) struct Churn {
    rng: Rng,
    pods: Vec<(String, String)>,
    slots: [Slot; SLOTS],
    writes: u64,
    ops: u64,
    /// Per flap kind, in [`FLAPS`] order.
    flaps: [u64; 5],
}

impl Churn {
    pub(super) fn new(pods: Vec<(String, String)>, rng: Rng) -> Churn {
        Churn {
            rng,
            pods,
            slots: [Slot::default(); SLOTS],
            writes: 0,
            ops: 0,
            flaps: [0; 5],
        }
    }

    /// Writes at `rate` per second and flaps the API server until
    /// `deadline`; leaves the server healthy.
    pub(super) fn run(
        &mut self,
        api: &FakeApiServer,
        rate: f64,
        deadline: Instant,
        stop: &AtomicBool,
        timeline: &Timeline,
    ) {
        let interval = (rate > 0.0).then(|| Duration::from_secs_f64(1.0 / rate));
        let mut next_write = Instant::now();
        let mut next_flap = Instant::now() + self.ms(FLAP_EVERY_MS);
        let mut heal_at: Option<Instant> = None;
        while Instant::now() < deadline && !stop.load(Ordering::SeqCst) {
            let now = Instant::now();
            if heal_at.is_some_and(|h| now >= h) {
                api.set_down(false);
                api.set_failing(None);
                heal_at = None;
                timeline.note("api: healthy again".to_owned());
            }
            if heal_at.is_none() && now >= next_flap {
                heal_at = self.flap(api, timeline).map(|d| now + d);
                next_flap = now + self.ms(FLAP_EVERY_MS);
            }
            if let Some(interval) = interval {
                if now >= next_write {
                    self.step(api);
                    // Behind by more than a second (a slow machine): do not
                    // burst to catch up.
                    next_write = (next_write + interval).max(now - Duration::from_secs(1));
                }
            }
            let mut wake = next_flap.min(deadline);
            if let Some(h) = heal_at {
                wake = wake.min(h);
            }
            if interval.is_some() {
                wake = wake.min(next_write);
            }
            let nap = wake.saturating_duration_since(Instant::now());
            std::thread::sleep(nap.min(Duration::from_millis(200)));
        }
        api.set_down(false);
        api.set_failing(None);
        timeline.note("api: healthy, churn stopped".to_owned());
    }

    fn ms(&mut self, (lo, hi): (u64, u64)) -> Duration {
        Duration::from_millis(self.rng.range(lo, hi))
    }

    /// Starts one flap; returns how long it lasts when it is an outage.
    fn flap(&mut self, api: &FakeApiServer, timeline: &Timeline) -> Option<Duration> {
        let i = self.rng.range(0, FLAPS.len() as u64) as usize;
        self.flaps[i] += 1;
        match FLAPS[i] {
            Flap::Failing => {
                let d = self.ms(OUTAGE_MS);
                api.set_failing(Some(500));
                timeline.note(format!("api: 500s for {d:?}"));
                Some(d)
            }
            Flap::Down => {
                let d = self.ms(OUTAGE_MS);
                api.set_down(true);
                timeline.note(format!("api: down (connections closed) for {d:?}"));
                Some(d)
            }
            Flap::Compact => {
                api.compact();
                timeline.note("api: history compacted (410 on resume)".to_owned());
                None
            }
            Flap::DropWatches => {
                api.drop_watches();
                timeline.note("api: watches dropped".to_owned());
                None
            }
            Flap::Restart => {
                api.restart();
                timeline.note("api: restarted (new resourceVersion history)".to_owned());
                None
            }
        }
    }

    /// One churn operation on a random slot.
    fn step(&mut self, api: &FakeApiServer) {
        self.ops += 1;
        let i = self.rng.range(0, SLOTS as u64) as usize;
        let (name, ip) = (slot_name(i), slot_ip(i));
        let slot = self.slots[i];
        if !slot.service {
            // Created; the slice first or second, or not at all yet.
            let with_slice = self.rng.chance(80);
            let slice_first = self.rng.chance(50);
            if with_slice && slice_first {
                self.apply_slice(api, &name, i);
            }
            self.apply_service(api, &name, &ip, i);
            if with_slice && !slice_first {
                self.apply_slice(api, &name, i);
            }
            return;
        }
        match self.rng.range(0, 100) {
            0..45 => self.apply_slice(api, &name, i),
            45..65 => self.apply_service(api, &name, &ip, i),
            65..75 if slot.slice => {
                api.delete("EndpointSlice", NS, &slice_name(&name));
                self.slots[i].slice = false;
                self.writes += 1;
            }
            65..75 => self.apply_slice(api, &name, i),
            _ => {
                api.delete("Service", NS, &name);
                self.slots[i].service = false;
                self.writes += 1;
                // Half the time the slice stays behind, orphaned.
                if slot.slice && self.rng.chance(50) {
                    api.delete("EndpointSlice", NS, &slice_name(&name));
                    self.slots[i].slice = false;
                    self.writes += 1;
                }
            }
        }
    }

    fn apply_service(&mut self, api: &FakeApiServer, name: &str, ip: &str, i: usize) {
        let ports = *self.rng.pick(PORT_SETS);
        api.apply(service_object(name, ip, ports));
        self.slots[i].service = true;
        self.writes += 1;
    }

    /// A slice with a random subset of the pods (maybe none) and random
    /// endpoint ports among those netexec serves.
    fn apply_slice(&mut self, api: &FakeApiServer, name: &str, i: usize) {
        let members: Vec<(String, String)> = self
            .pods
            .clone()
            .into_iter()
            .filter(|_| self.rng.chance(60))
            .collect();
        let http = *self.rng.pick(TCP_PORTS);
        let dns = *self.rng.pick(UDP_PORTS);
        api.apply(slice_object(
            name,
            &[("http", "TCP", http), ("dns", "UDP", dns)],
            &members,
        ));
        self.slots[i].slice = true;
        self.writes += 1;
    }

    pub(super) fn print(&self, resource_version: u64) {
        let names = ["500s", "down", "410 compact", "watches dropped", "restart"];
        let flaps: Vec<String> = names
            .iter()
            .zip(self.flaps)
            .map(|(n, c)| format!("{c} {n}"))
            .collect();
        println!(
            "  churn               {} operations, {} API writes; API server at resourceVersion {resource_version}",
            self.ops, self.writes
        );
        println!("  API server flaps    {}", flaps.join(", "));
    }
}
