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
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{json, Value};

pub const NAMESPACE: &str = "bench";
pub const PROBE_IP: &str = "10.96.0.5";
pub const CHURN_ENDPOINTS: usize = 10;
/// Services per manifest file (two documents each), as in the issue 37
/// measurement: 50k services in 500 files.
const SERVICES_PER_FILE: usize = 100;
/// The service the last file of a rotation adds (see [`stage_rotated`]).
pub const ROTATED: &str = "rotated";
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
    if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}M", n / 1_000_000)
    } else if n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

/// `1k/10k`, `10k/100k`, `50k/250k`, `100k/1M` → a [`Scale`].
pub fn parse_scale(s: &str) -> Result<Scale> {
    let num = |t: &str| -> Result<usize> {
        let (digits, mult) = match (t.strip_suffix('k'), t.strip_suffix('M')) {
            (Some(d), _) => (d, 1000),
            (_, Some(d)) => (d, 1_000_000),
            _ => (t, 1),
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

/// A stable pseudo-random word for `(what, n)` (splitmix64): the uids and
/// pod-name suffixes of the generated objects, the same in every run.
fn word(what: u64, n: u64) -> u64 {
    let mut z = what
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(n)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A version-4 UUID as the API server writes `metadata.uid`.
fn uid(what: u64, n: u64) -> String {
    let (a, b) = (word(what, n), word(what + 1, n));
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | (b >> 48) & 0x3fff,
        b & 0xffff_ffff_ffff
    )
}

/// `len` characters of the alphabet Kubernetes generates names from.
fn name_suffix(what: u64, n: u64, len: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut w = word(what, n);
    (0..len)
        .map(|_| {
            let c = ALPHABET[(w % ALPHABET.len() as u64) as usize];
            w /= ALPHABET.len() as u64;
            char::from(c)
        })
        .collect()
}

const CREATED: &str = "2026-11-01T00:00:00Z";
/// Nodes the generated endpoints run on (none of them the bed's node).
const OTHER_NODES: usize = 50;
const ZONES: usize = 3;

/// A Service as `kubectl get -o json` shows one a Deployment's pods back:
/// the fields the API server fills in are there, so the sources parse
/// and drop what a real cluster sends.
fn service(n: u64, name: &str, ip: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid(1, n),
                        "creationTimestamp": CREATED, "labels": {"app": name}},
           "spec": {"clusterIP": ip, "clusterIPs": [ip], "type": "ClusterIP",
                    "selector": {"app": name}, "sessionAffinity": "None",
                    "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                    "internalTrafficPolicy": "Cluster",
                    "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]},
           "status": {"loadBalancer": {}}})
}

/// One endpoint of a generated slice: (address, node, index in the
/// cluster, for its pod's name and uid).
struct Ep<'a> {
    ip: String,
    node: &'a str,
    n: u64,
}

/// An EndpointSlice as the EndpointSlice controller writes it: owner,
/// managed-by label, trigger-time annotation, and per endpoint all three
/// conditions, the zone and the pod (`targetRef` with name and uid).
fn slice(n: u64, service: &str, endpoints: &[Ep<'_>]) -> Value {
    let template = name_suffix(3, n, 10);
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|e| {
            json!({"addresses": [e.ip], "nodeName": e.node,
                   "zone": format!("zone-{}", e.n % ZONES as u64),
                   "conditions": {"ready": true, "serving": true, "terminating": false},
                   "targetRef": {"kind": "Pod", "namespace": NAMESPACE,
                                 "name": format!("{service}-{template}-{}", name_suffix(4, e.n, 5)),
                                 "uid": uid(5, e.n)}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": format!("{service}-{}", name_suffix(7, n, 5)),
                        "generateName": format!("{service}-"),
                        "namespace": NAMESPACE, "uid": uid(8, n), "generation": 1,
                        "creationTimestamp": CREATED,
                        "labels": {"kubernetes.io/service-name": service,
                                   "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                                   "app": service},
                        "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": CREATED},
                        "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": service,
                                             "uid": uid(1, n), "controller": true,
                                             "blockOwnerDeletion": true}]},
           "addressType": "IPv4",
           "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
           "endpoints": endpoints})
}

/// The generated services `from..to` and their slices; `rotated`: every
/// pod replaced (a rolling restart of every workload), so every endpoint
/// has a new address, pod name and uid.
fn generated(scale: Scale, from: usize, to: usize, rotated: bool) -> Vec<Value> {
    let (base, pod) = match rotated {
        false => (Ipv4Addr::new(10, 128, 0, 0), 0),
        true => (Ipv4Addr::new(10, 160, 0, 0), 1 << 32),
    };
    let mut out = Vec::with_capacity(2 * (to - from));
    let mut first_endpoint: usize = (0..from).map(|i| scale.endpoints_of(i)).sum();
    let nodes: Vec<String> = (0..OTHER_NODES)
        .map(|k| format!("node-{}", k + 2))
        .collect();
    for i in from..to {
        let name = format!("svc-{i}");
        out.push(service(
            i as u64,
            &name,
            &offset_ip(Ipv4Addr::new(10, 96, 1, 0), i),
        ));
        let n = scale.endpoints_of(i);
        let eps: Vec<Ep<'_>> = (first_endpoint..first_endpoint + n)
            .map(|e| Ep {
                ip: offset_ip(base, e),
                node: &nodes[e % OTHER_NODES],
                n: pod + e as u64,
            })
            .collect();
        first_endpoint += n;
        out.push(slice(i as u64, &name, &eps));
    }
    out
}

/// `probe` and `churn`; `generation` picks which churn endpoint differs
/// from the first version (0: none), so every change is one endpoint.
pub fn driven(pods: &[String], generation: usize) -> Vec<Value> {
    // Indices past any generated object's, for their uids and pod names.
    const DRIVEN: u64 = 1 << 40;
    let probe_eps: Vec<Ep<'_>> = (0..)
        .zip(pods)
        .map(|(k, p)| Ep {
            ip: p.clone(),
            node: "node-1",
            n: DRIVEN + k,
        })
        .collect();
    let churn_eps: Vec<Ep<'_>> = (0..CHURN_ENDPOINTS)
        .map(|k| {
            // Generation g moved endpoint g % N to a fresh address; the
            // latest generation that moved endpoint k decides its address.
            let last_move = (generation + CHURN_ENDPOINTS - k) % CHURN_ENDPOINTS;
            let host = match generation.checked_sub(last_move) {
                Some(j) if j >= 1 => 100 + j,
                _ => k + 1,
            };
            Ep {
                ip: offset_ip(Ipv4Addr::new(10, 127, 0, 0), host),
                node: "node-2",
                n: DRIVEN + 1000 + host as u64,
            }
        })
        .collect();
    vec![
        service(DRIVEN, "probe", PROBE_IP),
        slice(DRIVEN, "probe", &probe_eps),
        service(DRIVEN + 1, "churn", "10.96.0.6"),
        slice(DRIVEN + 1, "churn", &churn_eps),
    ]
}

/// Issue 37's big service: `big` at [`BIG_IP`], its endpoints from
/// 10.176.0.0 (inside the generated endpoints' route), on the other nodes.
pub const BIG_IP: &str = "10.96.0.8";
/// Endpoints of the big service's slices, as the EndpointSlice controller
/// caps them (`--max-endpoints-per-slice` ≤ 1,000).
pub const BIG_PER_SLICE: usize = 1000;

/// The big service's Service object.
pub fn big_service() -> Value {
    service(1 << 42, "big", BIG_IP)
}

/// Slice `k` of the big service; `moved`: its first endpoint moved to the
/// `moved`th fresh address (0: where it started), so each rewrite with a
/// new `moved` changes exactly one endpoint.
pub fn big_slice(k: usize, moved: usize) -> Value {
    let nodes: Vec<String> = (0..OTHER_NODES)
        .map(|n| format!("node-{}", n + 2))
        .collect();
    let first = k * BIG_PER_SLICE;
    let eps: Vec<Ep<'_>> = (first..first + BIG_PER_SLICE)
        .map(|e| {
            let ip = match (e == first, moved) {
                (true, m) if m > 0 => offset_ip(Ipv4Addr::new(10, 184, 0, 0), m),
                _ => offset_ip(Ipv4Addr::new(10, 176, 0, 0), e),
            };
            Ep {
                ip,
                node: &nodes[e % OTHER_NODES],
                n: (1 << 42) + e as u64,
            }
        })
        .collect();
    let mut s = slice((1 << 42) + k as u64, "big", &eps);
    // The slice names of one service differ by their generated suffix.
    s["metadata"]["name"] = json!(format!("big-{k:03}"));
    s
}

/// Writes `objects` as `name` in `dir` atomically (written beside it, then
/// renamed into place).
pub fn write_atomically(dir: &Path, name: &str, objects: &[Value]) -> Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, documents(objects))
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join(name)).with_context(|| format!("renaming {name} into place"))
}

/// How the manifest files are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// As `kubectl get -o yaml` writes them: block style, keys sorted,
    /// strings quoted only where YAML would read something else, lists of
    /// scalars (addresses, cluster IPs) as flow lists.
    #[default]
    Yaml,
    /// One JSON object per document (the file source's fast path).
    Json,
}

/// The objects as one multi-document file in `format`.
pub fn documents_as(objects: &[Value], format: Format) -> String {
    let mut text = String::new();
    for o in objects {
        text.push_str("---\n");
        match format {
            Format::Json => {
                text.push_str(&o.to_string());
                text.push('\n');
            }
            Format::Yaml => yaml_block(&mut text, o, 0),
        }
    }
    text
}

fn documents(objects: &[Value]) -> String {
    documents_as(objects, Format::default())
}

/// The entries of the mapping `map` at `indent`, each on its own line.
fn yaml_block(out: &mut String, map: &Value, indent: usize) {
    let Value::Object(map) = map else {
        unreachable!("documents and nested objects are mappings")
    };
    for (i, (key, value)) in map.iter().enumerate() {
        // The first entry of a mapping in a sequence follows its `- `.
        if i > 0 || !out.ends_with("- ") {
            push_indent(out, indent);
        }
        out.push_str(&yaml_scalar_text(key));
        out.push(':');
        yaml_value(out, value, indent);
    }
}

/// A mapping's value after its `key:` at `indent`.
fn yaml_value(out: &mut String, value: &Value, indent: usize) {
    match value {
        Value::Object(m) if m.is_empty() => out.push_str(" {}\n"),
        Value::Object(_) => {
            out.push('\n');
            yaml_block(out, value, indent + 2);
        }
        Value::Array(items) if items.iter().all(|v| !v.is_object() && !v.is_array()) => {
            let items: Vec<String> = items.iter().map(yaml_scalar).collect();
            out.push_str(&format!(" [{}]\n", items.join(", ")));
        }
        Value::Array(items) => {
            out.push('\n');
            // kubectl writes a sequence at its key's indentation.
            for item in items {
                push_indent(out, indent);
                out.push_str("- ");
                yaml_block(out, item, indent + 2);
            }
        }
        scalar => {
            out.push(' ');
            out.push_str(&yaml_scalar(scalar));
            out.push('\n');
        }
    }
}

fn push_indent(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

fn yaml_scalar(v: &Value) -> String {
    match v {
        Value::String(s) => yaml_scalar_text(s),
        other => other.to_string(),
    }
}

/// `s` plain when YAML reads it back as this string, else double-quoted
/// (timestamps, numbers, booleans, anything with punctuation).
fn yaml_scalar_text(s: &str) -> String {
    let plain = s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '/'))
        && s.parse::<f64>().is_err()
        // 0x1f, 0o17, 1_000: numbers to some YAML readers.
        && (!s.starts_with(|c: char| c.is_ascii_digit()) || s.contains(['-', '.']))
        && !matches!(
            s.to_ascii_lowercase().as_str(),
            "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "y" | "n"
        );
    if plain {
        s.to_owned()
    } else {
        Value::String(s.to_owned()).to_string()
    }
}

/// The generated services' files: (name, first service, end).
fn service_files(scale: Scale) -> impl Iterator<Item = (String, usize, usize)> {
    (0..scale.services)
        .step_by(SERVICES_PER_FILE)
        .map(move |from| {
            let to = (from + SERVICES_PER_FILE).min(scale.services);
            (format!("services-{from:06}.yaml"), from, to)
        })
}

/// Writes the whole cluster into `dir` (the file source's directory), as
/// kubectl-style YAML.
pub fn write_files(dir: &Path, scale: Scale, pods: &[String]) -> Result<()> {
    write_files_as(dir, scale, pods, Format::default())
}

/// [`write_files`] in `format`.
pub fn write_files_as(dir: &Path, scale: Scale, pods: &[String], format: Format) -> Result<()> {
    for (name, from, to) in service_files(scale) {
        let path = dir.join(name);
        std::fs::write(
            &path,
            documents_as(&generated(scale, from, to, false), format),
        )
        .with_context(|| format!("writing {}", path.display()))?;
    }
    write_driven(dir, pods, 0)
}

/// Every generated service's file rewritten with its pods rotated (every
/// endpoint changed), each under a hidden name beside the one it replaces:
/// (staged, final) paths, for [`rename_all`] to put in place at once. The
/// last file also gains the service [`ROTATED`]: once the state has it,
/// the daemon has taken in every file renamed before.
pub fn stage_rotated(dir: &Path, scale: Scale) -> Result<Vec<(PathBuf, PathBuf)>> {
    let files: Vec<_> = service_files(scale).collect();
    let last = files.len().saturating_sub(1);
    files
        .into_iter()
        .enumerate()
        .map(|(k, (name, from, to))| {
            let tmp = dir.join(format!(".{name}.tmp"));
            let mut objects = generated(scale, from, to, true);
            if k == last {
                objects.push(service(1 << 41, ROTATED, "10.96.0.7"));
            }
            std::fs::write(&tmp, documents(&objects))
                .with_context(|| format!("writing {}", tmp.display()))?;
            Ok((tmp, dir.join(name)))
        })
        .collect()
}

/// Renames each staged file over its final path: one burst of renames.
pub fn rename_all(staged: &[(PathBuf, PathBuf)]) -> Result<()> {
    for (tmp, path) in staged {
        std::fs::rename(tmp, path).with_context(|| format!("renaming {}", path.display()))?;
    }
    Ok(())
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
    out.extend(generated(scale, 0, scale.services, false));
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
        let m = parse_scale("100k/1M").unwrap();
        assert_eq!((m.services, m.endpoints), (100_000, 1_000_000));
        assert_eq!(m.label(), "100k/1M");
        assert!(parse_scale("10k").is_err());
        assert!(parse_scale("10/5").is_err());
    }

    #[test]
    fn yaml_is_written_as_kubectl_writes_it() {
        let scale = parse_scale("1/2").unwrap();
        let text = documents_as(&generated(scale, 0, 1, false), Format::Yaml);
        for part in [
            "---\napiVersion: v1\nkind: Service\nmetadata:\n  creationTimestamp: \"2026-11-01T00:00:00Z\"\n",
            "  clusterIPs: [10.96.1.0]\n",
            "  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n    targetPort: 8080\n",
            "status:\n  loadBalancer: {}\n---\naddressType: IPv4\n",
            "endpoints:\n- addresses: [10.128.0.0]\n  conditions:\n    ready: true\n",
            "  generation: 1\n",
            "    kubernetes.io/service-name: svc-0\n",
        ] {
            assert!(text.contains(part), "{part:?} not in\n{text}");
        }
        for (s, written) in [
            ("0x1f", "\"0x1f\""),
            ("1e3", "\"1e3\""),
            ("yes", "\"yes\""),
            ("", "\"\""),
            ("a b", "\"a b\""),
            ("10.0.0.1", "10.0.0.1"),
            ("6e789e6a-a1b9", "6e789e6a-a1b9"),
        ] {
            assert_eq!(yaml_scalar_text(s), written);
        }
    }

    #[test]
    fn every_endpoint_is_generated_once() {
        let scale = parse_scale("7/23").unwrap();
        let objects = generated(scale, 0, 7, false);
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
        let tail = generated(scale, 3, 7, false);
        assert_eq!(tail[1], objects[7]);
    }

    #[test]
    fn a_rotation_changes_every_endpoint_and_no_service() {
        let scale = parse_scale("7/23").unwrap();
        let (before, after) = (generated(scale, 0, 7, false), generated(scale, 0, 7, true));
        for (b, a) in before.iter().zip(&after) {
            if b["kind"] == "Service" {
                assert_eq!(b, a);
                continue;
            }
            let eps = |o: &Value| o["endpoints"].as_array().unwrap().clone();
            for (eb, ea) in eps(b).iter().zip(&eps(a)) {
                assert_ne!(eb["addresses"], ea["addresses"]);
                assert_ne!(eb["targetRef"]["uid"], ea["targetRef"]["uid"]);
                assert_ne!(eb["targetRef"]["name"], ea["targetRef"]["name"]);
            }
        }
    }

    #[test]
    fn a_big_slice_rewritten_moves_one_endpoint() {
        let addrs = |m| -> Vec<String> {
            big_slice(7, m)["endpoints"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["addresses"][0].to_string())
                .collect()
        };
        assert_eq!(addrs(0).len(), BIG_PER_SLICE);
        assert_eq!(addrs(0)[1], "\"10.176.27.89\"", "slice 7 starts at 7,000");
        for m in 1..4 {
            let (before, after) = (addrs(m - 1), addrs(m));
            let differ = before.iter().zip(&after).filter(|(a, b)| a != b).count();
            assert_eq!(differ, 1, "move {m}");
        }
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
