//! The soak's end state: what the fake API server holds is what localnet
//! publishes and what the datapath serves.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::churn::{slot_ip, slot_name, ALL_CHURN_PORTS, SLOTS};
use super::NS;
use crate::e2e::bed::Bed;
use crate::e2e::fake_apiserver::FakeApiServer;
use crate::e2e::scenarios::client::request_from;

/// How long localnet may take to catch up once the API server is healthy:
/// the watches may be backing off (kube-rs: up to 30 s, with jitter).
const CONVERGE_WITHIN: Duration = Duration::from_secs(90);
/// Requests per service port with endpoints: with 3 endpoints chosen at
/// random, one is missed by all 40 with p = 3·(2/3)^40 ≈ 3e-7.
const REQUESTS_PER_PORT: usize = 40;
const DATAPATH_ROUNDS: usize = 5;

/// One Service as both sides must show it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct SvcView {
    cluster_ip: String,
    /// (name, protocol, port, targetPort).
    ports: BTreeSet<(String, String, u64, u64)>,
    endpoints: BTreeSet<String>,
}

/// A Service as the API server holds it, with its slices' port numbers.
struct Expected {
    view: SvcView,
    /// Port name → endpoint port.
    slice_ports: BTreeMap<String, u64>,
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or("").to_owned()
}

fn expected(api: &FakeApiServer) -> BTreeMap<String, Expected> {
    let slices = api.objects("EndpointSlice");
    let mut out = BTreeMap::new();
    for svc in api.objects("Service") {
        let (ns, name) = (
            text(&svc["metadata"]["namespace"]),
            text(&svc["metadata"]["name"]),
        );
        let mut e = Expected {
            view: SvcView {
                cluster_ip: text(&svc["spec"]["clusterIP"]),
                ..SvcView::default()
            },
            slice_ports: BTreeMap::new(),
        };
        for p in svc["spec"]["ports"].as_array().into_iter().flatten() {
            e.view.ports.insert((
                text(&p["name"]),
                p["protocol"].as_str().unwrap_or("TCP").to_owned(),
                p["port"].as_u64().unwrap_or(0),
                p["targetPort"].as_u64().unwrap_or(0),
            ));
        }
        let own = slices.iter().filter(|s| {
            text(&s["metadata"]["namespace"]) == ns
                && s["metadata"]["labels"]["kubernetes.io/service-name"].as_str()
                    == Some(name.as_str())
        });
        for slice in own {
            for p in slice["ports"].as_array().into_iter().flatten() {
                e.slice_ports
                    .insert(text(&p["name"]), p["port"].as_u64().unwrap_or(0));
            }
            for ep in slice["endpoints"].as_array().into_iter().flatten() {
                if ep["conditions"]["ready"].as_bool() == Some(true) {
                    e.view.endpoints.insert(text(&ep["addresses"][0]));
                }
            }
        }
        out.insert(format!("{ns}/{name}"), e);
    }
    out
}

/// localnet's current state: (instance id, rev, services).
fn localnet(bed: &Bed) -> Result<(String, String, BTreeMap<String, SvcView>)> {
    let out = Command::new("timeout")
        .arg("10")
        .arg(&bed.daemon_bin)
        .args(["localnet", "watch", "--once", "-o", "json", "--target"])
        .arg(format!("unix:{}", bed.localnet_socket.display()))
        .output()
        .context("running localnet watch")?;
    if !out.status.success() {
        bail!(
            "localnet watch: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let state: Value = serde_json::from_slice(&out.stdout).context("localnet watch -o json")?;
    let mut services = BTreeMap::new();
    for s in state["services"].as_array().into_iter().flatten() {
        let svc = &s["service"];
        let mut view = SvcView {
            cluster_ip: text(&svc["ips"]["cluster_ips"]["v4"][0]),
            ..SvcView::default()
        };
        for p in svc["ports"].as_array().into_iter().flatten() {
            let proto = text(&p["protocol"]);
            view.ports.insert((
                text(&p["name"]),
                proto.trim_start_matches("PROTOCOL_").to_owned(),
                p["port"].as_u64().unwrap_or(0),
                p["target_port"].as_u64().unwrap_or(0),
            ));
        }
        for ep in s["endpoints"].as_array().into_iter().flatten() {
            view.endpoints.insert(text(&ep["ip"]));
        }
        services.insert(
            format!("{}/{}", text(&svc["namespace"]), text(&svc["name"])),
            view,
        );
    }
    Ok((text(&state["instance_id"]), text(&state["rev"]), services))
}

/// What differs, one line per service.
fn diff(want: &BTreeMap<String, Expected>, have: &BTreeMap<String, SvcView>) -> Vec<String> {
    let keys: BTreeSet<&String> = want.keys().chain(have.keys()).collect();
    keys.into_iter()
        .filter_map(|k| match (want.get(k).map(|e| &e.view), have.get(k)) {
            (Some(w), Some(h)) if w == h => None,
            (w, h) => Some(format!("{k}: API server {w:?}, localnet {h:?}")),
        })
        .collect()
}

pub(super) struct Verified {
    converged_after: Option<Duration>,
    localnet_diff: Vec<String>,
    instance: String,
    rev: String,
    services: usize,
    served_ports: usize,
    refused_ports: usize,
    deleted: usize,
    rounds: usize,
    datapath: Vec<String>,
}

impl Verified {
    pub(super) fn print(&self) {
        match self.converged_after {
            Some(d) => println!(
                "  final state         localnet matched the API server's {} services {:.1} s after the churn stopped (instance {}, rev {})",
                self.services,
                d.as_secs_f64(),
                self.instance,
                self.rev
            ),
            None => println!(
                "  final state         localnet did NOT match the API server within {CONVERGE_WITHIN:?} (instance {}, rev {})",
                self.instance, self.rev
            ),
        }
        println!(
            "  datapath            {} service ports answered from exactly their endpoints, {} without endpoints unanswered, {} deleted services gone ({} round(s))",
            self.served_ports, self.refused_ports, self.deleted, self.rounds
        );
    }

    pub(super) fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.converged_after.is_none() {
            out.push(format!(
                "localnet did not match the API server within {CONVERGE_WITHIN:?}: {}",
                self.localnet_diff.join(" | ")
            ));
        }
        out.extend(self.datapath.iter().cloned());
        out
    }
}

pub(super) fn final_state(bed: &Bed, api: &FakeApiServer) -> Result<Verified> {
    let want = expected(api);
    let started = Instant::now();
    let mut v = Verified {
        converged_after: None,
        localnet_diff: Vec::new(),
        instance: String::new(),
        rev: String::new(),
        services: want.len(),
        served_ports: 0,
        refused_ports: 0,
        deleted: 0,
        rounds: 0,
        datapath: Vec::new(),
    };
    while started.elapsed() < CONVERGE_WITHIN {
        match localnet(bed) {
            Ok((instance, rev, have)) => {
                (v.instance, v.rev) = (instance, rev);
                v.localnet_diff = diff(&want, &have);
                if v.localnet_diff.is_empty() {
                    v.converged_after = Some(started.elapsed());
                    break;
                }
            }
            Err(e) => v.localnet_diff = vec![format!("{e:#}")],
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // localnet first, the kernel a moment later: a few rounds.
    for round in 1..=DATAPATH_ROUNDS {
        v.rounds = round;
        (v.served_ports, v.refused_ports, v.deleted) = (0, 0, 0);
        v.datapath = datapath(bed, &want, &mut v)?;
        if v.datapath.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    Ok(v)
}

/// Every service port answers from exactly its endpoints (or not at all
/// without them); every churned service the API server no longer has is
/// gone from the datapath. Returns the problems.
fn datapath(bed: &Bed, want: &BTreeMap<String, Expected>, v: &mut Verified) -> Result<Vec<String>> {
    let pod_of = |ip: &str| {
        bed.pods
            .iter()
            .find(|p| p.ipv4 == ip)
            .map_or_else(|| ip.to_owned(), |p| p.name.clone())
    };
    let mut problems = Vec::new();
    for (key, e) in want {
        for (name, proto, port, _) in &e.view.ports {
            let target = format!("{}:{port}", e.view.cluster_ip);
            let proto = proto.to_lowercase();
            let wanted: BTreeSet<String> = match e.slice_ports.get(name) {
                Some(p) => e
                    .view
                    .endpoints
                    .iter()
                    .map(|ip| format!("{} port={p}", pod_of(ip)))
                    .collect(),
                None => BTreeSet::new(),
            };
            if wanted.is_empty() {
                let (answers, _) = requests(bed, &proto, &target, 2, 500)?;
                if !answers.is_empty() {
                    problems.push(format!(
                        "{key} {target}/{proto} has no endpoints but answered from {answers:?}"
                    ));
                }
                v.refused_ports += 1;
                continue;
            }
            let (answers, errors) = requests(bed, &proto, &target, REQUESTS_PER_PORT, 1000)?;
            let got: BTreeSet<String> = answers.keys().cloned().collect();
            if got != wanted || !errors.is_empty() {
                problems.push(format!(
                    "{key} {target}/{proto}: answered by {answers:?}, expected exactly {wanted:?}; errors {:?}",
                    errors.first()
                ));
            }
            v.served_ports += 1;
        }
    }
    for i in 0..SLOTS {
        if want.contains_key(&format!("{NS}/{}", slot_name(i))) {
            continue;
        }
        for (proto, port) in ALL_CHURN_PORTS {
            let target = format!("{}:{port}", slot_ip(i));
            let (answers, _) = requests(bed, proto, &target, 2, 300)?;
            if !answers.is_empty() {
                problems.push(format!(
                    "deleted service {} still answers on {target}/{proto}: {answers:?}",
                    slot_name(i)
                ));
            }
        }
        v.deleted += 1;
    }
    Ok(problems)
}

/// `count` requests from the node: ("pod port=N" → answers, error lines).
fn requests(
    bed: &Bed,
    proto: &str,
    target: &str,
    count: usize,
    timeout_ms: u64,
) -> Result<(BTreeMap<String, usize>, Vec<String>)> {
    let timeout = Duration::from_millis(timeout_ms);
    let r = request_from(bed, None, proto, target, count, timeout)?;
    Ok((r.answers, r.errors))
}

/// Waits (up to 10 s) until one request to `target` is answered.
pub(super) fn wait_until_answered(bed: &Bed, proto: &str, target: &str) -> Result<()> {
    let proto = proto.to_lowercase();
    let started = Instant::now();
    loop {
        let (answers, errors) = requests(bed, &proto, target, 1, 1000)?;
        if !answers.is_empty() {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(10) {
            bail!("{target}/{proto} not served within 10 s: {errors:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
