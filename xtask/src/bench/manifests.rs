//! The benchmark cluster: N ClusterIP services with their EndpointSlices,
//! as manifest files for the file source and as API objects for the fake
//! API server, plus two small services the measurements drive:
//!
//! * `probe` (10.96.0.5:80) → the bed's real pods: the restart-under-load
//!   client connects to it;
//! * `churn` (10.96.0.6:80) → [`CHURN_ENDPOINTS`] endpoints: each
//!   one-endpoint change replaces one of its addresses.
//!
//! Generated services take 10.96.1.0 onwards (10.96.0.0/12 holds 1M) and
//! their endpoints 10.128.0.0 onwards, on another node.

use std::net::Ipv4Addr;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{json, Value};

pub const NAMESPACE: &str = "bench";
pub const PROBE_IP: &str = "10.96.0.5";
pub const CHURN_ENDPOINTS: usize = 10;
/// Services per manifest file (two documents each; the file source takes
/// at most 1,024 documents per file).
const SERVICES_PER_FILE: usize = 500;
/// The file holding `probe` and `churn`: rewritten for each change.
pub const CHURN_FILE: &str = "scenario.yaml";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scale {
    pub services: usize,
    pub endpoints: usize,
}

impl Scale {
    pub fn label(&self) -> String {
        format!("{}/{}", short(self.services), short(self.endpoints))
    }

    /// Services in the published state: the generated ones, probe, churn.
    pub fn total_services(&self) -> usize {
        self.services + 2
    }

    fn endpoints_of(&self, service: usize) -> usize {
        let per = self.endpoints / self.services;
        per + usize::from(service < self.endpoints % self.services)
    }
}

fn short(n: usize) -> String {
    if n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

/// `1k/10k`, `10k/100k`, `50k/250k` → a [`Scale`].
pub fn parse_scale(s: &str) -> Result<Scale> {
    let num = |t: &str| -> Result<usize> {
        let (digits, mult) = match t.strip_suffix('k') {
            Some(d) => (d, 1000),
            None => (t, 1),
        };
        Ok(digits
            .parse::<usize>()
            .with_context(|| format!("bad number {t:?}"))?
            * mult)
    };
    let (svc, eps) = s
        .split_once('/')
        .with_context(|| format!("scale {s:?}: expected SERVICES/ENDPOINTS, e.g. 10k/100k"))?;
    let scale = Scale {
        services: num(svc)?,
        endpoints: num(eps)?,
    };
    anyhow::ensure!(
        scale.services > 0 && scale.endpoints >= scale.services,
        "scale {s:?}: needs at least one endpoint per service"
    );
    Ok(scale)
}

fn offset_ip(base: Ipv4Addr, offset: usize) -> String {
    let offset = u32::try_from(offset).unwrap_or(u32::MAX);
    Ipv4Addr::from(u32::from(base).wrapping_add(offset)).to_string()
}

fn service(name: &str, ip: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name, "namespace": NAMESPACE},
           "spec": {"clusterIP": ip, "clusterIPs": [ip], "type": "ClusterIP",
                    "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}})
}

fn slice(service: &str, endpoints: &[(String, &str)]) -> Value {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(ip, node)| json!({"addresses": [ip], "nodeName": node, "conditions": {"ready": true}}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": format!("{service}-1"), "namespace": NAMESPACE,
                        "labels": {"kubernetes.io/service-name": service}},
           "addressType": "IPv4",
           "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
           "endpoints": endpoints})
}

/// The generated services `from..to` and their slices.
fn generated(scale: Scale, from: usize, to: usize) -> Vec<Value> {
    let mut out = Vec::with_capacity(2 * (to - from));
    let mut first_endpoint: usize = (0..from).map(|i| scale.endpoints_of(i)).sum();
    for i in from..to {
        let name = format!("svc-{i}");
        out.push(service(&name, &offset_ip(Ipv4Addr::new(10, 96, 1, 0), i)));
        let n = scale.endpoints_of(i);
        let eps: Vec<(String, &str)> = (first_endpoint..first_endpoint + n)
            .map(|e| (offset_ip(Ipv4Addr::new(10, 128, 0, 0), e), "node-2"))
            .collect();
        first_endpoint += n;
        out.push(slice(&name, &eps));
    }
    out
}

/// `probe` and `churn`; `generation` picks which churn endpoint differs
/// from the first version (0: none), so every change is one endpoint.
pub fn driven(pods: &[String], generation: usize) -> Vec<Value> {
    let probe_eps: Vec<(String, &str)> = pods.iter().map(|p| (p.clone(), "node-1")).collect();
    let churn_eps: Vec<(String, &str)> = (0..CHURN_ENDPOINTS)
        .map(|k| {
            // Generation g moved endpoint g % N to a fresh address; the
            // latest generation that moved endpoint k decides its address.
            let last_move = (generation + CHURN_ENDPOINTS - k) % CHURN_ENDPOINTS;
            let host = match generation.checked_sub(last_move) {
                Some(j) if j >= 1 => 100 + j,
                _ => k + 1,
            };
            (offset_ip(Ipv4Addr::new(10, 127, 0, 0), host), "node-2")
        })
        .collect();
    vec![
        service("probe", PROBE_IP),
        slice("probe", &probe_eps),
        service("churn", "10.96.0.6"),
        slice("churn", &churn_eps),
    ]
}

fn documents(objects: &[Value]) -> String {
    let mut text = String::new();
    for o in objects {
        text.push_str("---\n");
        text.push_str(&o.to_string());
        text.push('\n');
    }
    text
}

/// Writes the whole cluster into `dir` (the file source's directory).
pub fn write_files(dir: &Path, scale: Scale, pods: &[String]) -> Result<()> {
    let mut from = 0;
    while from < scale.services {
        let to = (from + SERVICES_PER_FILE).min(scale.services);
        let path = dir.join(format!("services-{from:06}.yaml"));
        std::fs::write(&path, documents(&generated(scale, from, to)))
            .with_context(|| format!("writing {}", path.display()))?;
        from = to;
    }
    write_driven(dir, pods, 0)
}

/// Rewrites the file of `probe` and `churn` atomically (rename into place,
/// as kubectl-less deployments do).
pub fn write_driven(dir: &Path, pods: &[String], generation: usize) -> Result<()> {
    let tmp = dir.join(format!(".{CHURN_FILE}.tmp"));
    std::fs::write(&tmp, documents(&driven(pods, generation)))
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join(CHURN_FILE)).context("renaming the churn file into place")
}

/// Every object of the cluster, for the fake API server.
pub fn objects(scale: Scale, pods: &[String]) -> Vec<Value> {
    let mut out = vec![json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}})];
    out.extend(generated(scale, 0, scale.services));
    out.extend(driven(pods, 0));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_parse_and_label() {
        let s = parse_scale("50k/250k").unwrap();
        assert_eq!((s.services, s.endpoints), (50_000, 250_000));
        assert_eq!(s.label(), "50k/250k");
        assert!(parse_scale("10k").is_err());
        assert!(parse_scale("10/5").is_err());
    }

    #[test]
    fn every_endpoint_is_generated_once() {
        let scale = parse_scale("7/23").unwrap();
        let objects = generated(scale, 0, 7);
        let eps: Vec<&Value> = objects
            .iter()
            .filter(|o| o["kind"] == "EndpointSlice")
            .flat_map(|o| o["endpoints"].as_array().unwrap())
            .collect();
        assert_eq!(eps.len(), 23);
        let distinct: std::collections::BTreeSet<String> =
            eps.iter().map(|e| e["addresses"][0].to_string()).collect();
        assert_eq!(distinct.len(), 23);
        // A chunk starts where the previous one ended.
        let tail = generated(scale, 3, 7);
        assert_eq!(tail[1], objects[7]);
    }

    #[test]
    fn each_change_moves_exactly_one_churn_endpoint() {
        let pods = vec!["10.244.1.11".to_owned()];
        let addrs = |g| -> Vec<String> {
            driven(&pods, g)[3]["endpoints"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["addresses"][0].to_string())
                .collect()
        };
        for g in 1..25 {
            let (before, after) = (addrs(g - 1), addrs(g));
            let differ = before.iter().zip(&after).filter(|(a, b)| a != b).count();
            assert_eq!(differ, 1, "generation {g}");
        }
    }
}
