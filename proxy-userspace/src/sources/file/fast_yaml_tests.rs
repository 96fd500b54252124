//! YAML and JSON of the same objects decode to the same wire values and
//! the same model objects (or the same refusal), whichever YAML path reads
//! them: a seeded generator of Services and EndpointSlices in the shapes
//! the wire-type test covers (every field it reads, nulls, values of the
//! wrong shape, text that looks like numbers, booleans or comments),
//! written as YAML in every style the fast path reads and some it leaves
//! to the general one.

use std::path::Path;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use serde_json::{json, Value};

use super::super::manifest::{parse_manifest, ManifestError};
use super::*;
use crate::sources::objects::{decode_object, Decoded};

/// splitmix64: the same cases in every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<'t, T>(&mut self, items: &'t [T]) -> &'t T {
        &items[self.below(items.len())]
    }
}

/// The wire-type test's Service, every field the proxy reads.
fn service() -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": "web", "namespace": "a", "uid": "u", "resourceVersion": "1",
                        "creationTimestamp": "2026-11-01T00:00:00Z",
                        "labels": {"app": "web"}, "annotations": {"x": "y"}},
           "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"],
                    "ipFamilies": ["IPv4"], "externalIPs": ["192.0.2.1"],
                    "sessionAffinity": "ClientIP",
                    "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
                    "loadBalancerSourceRanges": ["10.0.0.0/8"], "healthCheckNodePort": 30001,
                    "internalTrafficPolicy": "Cluster", "externalTrafficPolicy": "Local",
                    "trafficDistribution": "PreferClose", "selector": {"app": "web"},
                    "ports": [{"name": "http", "port": 80, "nodePort": 30080,
                               "targetPort": "web", "appProtocol": "http", "protocol": "TCP"},
                              {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"}]},
           "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.9", "ipMode": "VIP"}]}}})
}

/// The wire-type test's EndpointSlice, every field the proxy reads.
fn slice() -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": "web-1", "namespace": "a",
                        "labels": {"kubernetes.io/service-name": "web", "app": "web"},
                        "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-01T00:00:00Z"},
                        "ownerReferences": [{"kind": "Service", "name": "web", "controller": true}]},
           "addressType": "IPv4",
           "ports": [{"name": "http", "port": 8080, "protocol": "TCP", "appProtocol": "http"}],
           "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true, "serving": true, "terminating": false},
                          "hints": {"forZones": [{"name": "z"}], "forNodes": [{"name": "n"}]},
                          "nodeName": "n", "zone": "z", "hostname": "h",
                          "targetRef": {"kind": "Pod", "namespace": "a", "name": "p", "uid": "u"}},
                         {"addresses": ["10.0.0.2", "10.0.0.3"], "conditions": {"ready": false},
                          "nodeName": "n2"}]})
}

/// The wire-type test's pointers, and a few more.
const SERVICE_POINTERS: &[&str] = &[
    "/metadata",
    "/metadata/name",
    "/metadata/namespace",
    "/metadata/creationTimestamp",
    "/metadata/labels",
    "/metadata/labels/app",
    "/metadata/annotations/x",
    "/spec",
    "/spec/type",
    "/spec/clusterIP",
    "/spec/clusterIPs",
    "/spec/clusterIPs/0",
    "/spec/ipFamilies/0",
    "/spec/externalIPs/0",
    "/spec/ports",
    "/spec/ports/0",
    "/spec/ports/0/name",
    "/spec/ports/0/port",
    "/spec/ports/0/targetPort",
    "/spec/ports/1/targetPort",
    "/spec/ports/0/nodePort",
    "/spec/sessionAffinity",
    "/spec/sessionAffinityConfig/clientIP",
    "/spec/sessionAffinityConfig/clientIP/timeoutSeconds",
    "/spec/healthCheckNodePort",
    "/spec/selector",
    "/status/loadBalancer/ingress/0",
    "/status/loadBalancer/ingress/0/ip",
    "/status/loadBalancer/ingress/0/ipMode",
];

const SLICE_POINTERS: &[&str] = &[
    "/metadata/name",
    "/metadata/labels/app",
    "/metadata/annotations/endpoints.kubernetes.io~1last-change-trigger-time",
    "/metadata/ownerReferences",
    "/addressType",
    "/ports/0",
    "/ports/0/port",
    "/ports/0/name",
    "/endpoints",
    "/endpoints/0",
    "/endpoints/0/addresses",
    "/endpoints/0/addresses/0",
    "/endpoints/1/addresses/1",
    "/endpoints/0/conditions",
    "/endpoints/0/conditions/ready",
    "/endpoints/1/conditions/serving",
    "/endpoints/0/hints/forZones/0",
    "/endpoints/0/hints/forNodes/0/name",
    "/endpoints/0/nodeName",
    "/endpoints/0/targetRef",
    "/endpoints/0/targetRef/uid",
];

/// Values put at those pointers: wrong shapes, text YAML could take for
/// something else, numbers in and out of range.
fn replacement(rng: &mut Rng) -> Value {
    let texts = [
        "",
        "80",
        "-1",
        "true",
        "yes",
        "no",
        "null",
        "~",
        "1.5",
        "0x1f",
        "1e3",
        "0127",
        "a: b",
        "# x",
        "x #y",
        "it's",
        "say \"hi\"",
        "é ü",
        "line\nbreak",
        "10.0.0.9",
        "fd00::1",
        "2001:db8::2",
        "2026-11-01",
        "2026-11-01T00:00:00Z",
        "-",
        "5b6cc3d0-1b0c",
        "0b02996a-680e",
        "1bc4ad12",
        "0b101",
        "7e5",
        "web",
        "TCP",
        "UDP",
        "ClientIP",
        "Proxy",
        "IPv6",
        "[x]",
        "{x}",
        "a,b",
        " padded ",
        "tab\there",
    ];
    match rng.below(7) {
        0 => Value::Null,
        1 => json!(*rng.pick(&[0i64, 1, 53, 80, 65535, 70000, -5, 1 << 40])),
        2 => json!(rng.chance(50)),
        3 => json!(*rng.pick(&[0.5, 80.0])),
        4 => json!([rng.pick(&texts).to_string()]),
        5 => json!({"a": rng.pick(&texts).to_string()}),
        _ => json!(rng.pick(&texts).to_string()),
    }
}

fn mutated(rng: &mut Rng, mut doc: Value, pointers: &[&str]) -> Value {
    for _ in 0..rng.below(3) {
        let pointer = rng.pick(pointers);
        let (parent, last) = pointer.rsplit_once('/').expect("a pointer");
        let last = last.replace("~1", "/");
        let value = replacement(rng);
        match doc.pointer_mut(parent) {
            Some(Value::Array(items)) => {
                if let Some(item) = last.parse().ok().and_then(|i: usize| items.get_mut(i)) {
                    *item = value;
                }
            }
            Some(Value::Object(map)) => {
                if rng.chance(20) {
                    map.remove(&last);
                } else {
                    map.insert(last, value);
                }
            }
            _ => {}
        }
    }
    doc
}

/// YAML styles, chosen per collection and scalar.
struct Writer<'r> {
    rng: &'r mut Rng,
    out: String,
}

impl Writer<'_> {
    fn document(rng: &mut Rng, doc: &Value) -> String {
        let mut w = Writer {
            rng,
            out: String::new(),
        };
        if w.rng.chance(30) {
            w.out.push_str("# a manifest\n");
        }
        w.block_map(doc, 0, false);
        w.out
    }

    fn indent(&mut self, n: usize) {
        self.out.extend(std::iter::repeat_n(' ', n));
    }

    fn end_line(&mut self) {
        if self.rng.chance(5) {
            self.out.push_str("  # note");
        }
        self.out.push('\n');
        if self.rng.chance(3) {
            self.out.push('\n');
        }
    }

    /// The entries of `map` at `indent`; `mid_line`: the first one follows
    /// a `- ` already written.
    fn block_map(&mut self, map: &Value, indent: usize, mut mid_line: bool) {
        let Value::Object(map) = map else {
            unreachable!()
        };
        for (key, value) in map {
            if !mid_line {
                self.indent(indent);
            }
            mid_line = false;
            let key = self.scalar(&Value::String(key.clone()));
            self.out.push_str(&key);
            self.out.push(':');
            self.block_value(value, indent, false);
        }
    }

    /// The value after `key:` (or `-`, `in_seq`) at `indent`.
    fn block_value(&mut self, value: &Value, indent: usize, in_seq: bool) {
        match value {
            Value::Object(m) if !m.is_empty() && !self.rng.chance(20) => {
                self.end_line();
                self.block_map(value, indent + 2, false);
            }
            Value::Array(items) if !items.is_empty() && !self.rng.chance(20) => {
                self.end_line();
                // kubectl's sequence at its key's column, or indented (as
                // it must be under a `-`).
                let at = if !in_seq && self.rng.chance(70) {
                    indent
                } else {
                    indent + 2
                };
                for item in items {
                    self.indent(at);
                    self.out.push('-');
                    match item {
                        Value::Object(m) if !m.is_empty() && !self.rng.chance(20) => {
                            self.out.push(' ');
                            self.block_map(item, at + 2, true);
                        }
                        other => self.block_value(other, at, true),
                    }
                }
            }
            Value::Null if self.rng.chance(50) => self.end_line(),
            other => {
                self.out.push(' ');
                let text = self.flow(other);
                self.out.push_str(&text);
                self.end_line();
            }
        }
    }

    fn flow(&mut self, value: &Value) -> String {
        match value {
            Value::Object(m) => {
                let items: Vec<String> = m
                    .iter()
                    .map(|(k, v)| {
                        let k = self.scalar(&Value::String(k.clone()));
                        format!("{k}: {}", self.flow(v))
                    })
                    .collect();
                format!("{{{}}}", items.join(", "))
            }
            Value::Array(items) => {
                let items: Vec<String> = items.iter().map(|v| self.flow(v)).collect();
                format!("[{}]", items.join(", "))
            }
            other => self.scalar(other),
        }
    }

    fn scalar(&mut self, value: &Value) -> String {
        match value {
            Value::Null => self.rng.pick(&["null", "~", "Null"]).to_string(),
            Value::String(s) => {
                let plain_safe = !s.is_empty()
                    && s.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-./:".contains(c))
                    && s.starts_with(|c: char| c.is_ascii_alphabetic())
                    && !s.contains(": ")
                    && !s.ends_with(':')
                    && !matches!(
                        s.to_ascii_lowercase().as_str(),
                        "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "y" | "n"
                    );
                let printable = !s.chars().any(char::is_control);
                match self.rng.below(4) {
                    0 | 1 if plain_safe => s.clone(),
                    2 if printable => format!("'{}'", s.replace('\'', "''")),
                    _ => Value::String(s.clone()).to_string(),
                }
            }
            other => other.to_string(),
        }
    }
}

/// `P`'s wire value read from JSON text (the generated objects have no
/// duplicate keys for the JSON path's check to find).
fn wire_from_json<P: Project>(json: &str) -> Result<String, ()>
where
    for<'a> P::Wire<'a>: std::fmt::Debug,
{
    let mut de = serde_json::Deserializer::from_str(json);
    let wire = decode_wire::<P, _>(&mut de).map_err(|_| ())?;
    Ok(format!("{wire:?}"))
}

/// `P`'s wire value read from YAML by the general parser (through its
/// value) and by the fast path (`None`: left to the general one).
fn wire_from_yaml<P: Project>(yaml: &str) -> (Result<String, ()>, Option<String>)
where
    for<'a> P::Wire<'a>: std::fmt::Debug,
{
    let value = crate::yaml::documents(yaml)
        .unwrap_or_else(|e| panic!("{yaml}: {e}"))
        .remove(0);
    let general = decode_wire::<P, _>(&value)
        .map(|w| format!("{w:?}"))
        .map_err(|_| ());
    let docs = fast::documents(yaml).expect("one document");
    let fast = fast::from_document::<Wire<P>>(docs[0])
        .ok()
        .map(|Wire(w)| format!("{w:?}"));
    (general, fast)
}

/// The model's object (or the refusal) from JSON and from a YAML manifest.
fn outcomes(json: &Value, yaml: &str) -> (String, String) {
    let from_json = match decode_object(json.clone()) {
        Ok(Decoded::Object(o)) => format!("{o:?}"),
        Ok(Decoded::Ignored { .. }) => unreachable!(),
        Err(e) => e.to_string(),
    };
    let from_yaml = match parse_manifest(Path::new("m.yaml"), yaml) {
        Ok(objects) => format!("{:?}", objects[0]),
        Err(errors) => match &errors[..] {
            [ManifestError::Invalid { reason, .. }] => reason.clone(),
            other => panic!("{yaml}: {other:?}"),
        },
    };
    (from_json, from_yaml)
}

fn check<P: Project>(rng: &mut Rng, doc: &Value, counts: &mut [usize; 3])
where
    for<'a> P::Wire<'a>: std::fmt::Debug,
{
    let json = doc.to_string();
    let yaml = Writer::document(rng, doc);
    let from_json = wire_from_json::<P>(&json);
    let (general, fast) = wire_from_yaml::<P>(&yaml);
    assert_eq!(general, from_json, "general YAML path:\n{yaml}\n{json}");
    if let Some(fast) = fast {
        assert_eq!(Ok(fast), from_json, "fast YAML path:\n{yaml}\n{json}");
        counts[0] += 1;
    }
    counts[1 + usize::from(from_json.is_ok())] += 1;
    let (a, b) = outcomes(doc, &yaml);
    assert_eq!(a, b, "{yaml}\n{json}");
}

#[test]
fn yaml_and_json_of_the_same_objects_decode_the_same() {
    let mut rng = Rng(37);
    // Read by the fast path, refused, read at all.
    let mut counts = [0; 3];
    for _ in 0..1000 {
        let doc = mutated(&mut rng, service(), SERVICE_POINTERS);
        check::<core::Service>(&mut rng, &doc, &mut counts);
        let doc = mutated(&mut rng, slice(), SLICE_POINTERS);
        check::<discovery::EndpointSlice>(&mut rng, &doc, &mut counts);
    }
    let [fast, refused, read] = counts;
    assert!(
        fast > 1000 && refused > 300 && read > 1000,
        "{fast} read by the fast path, {refused} refused, {read} read"
    );
}

#[test]
fn a_kubectl_style_file_takes_the_fast_path() {
    let mut rng = Rng(1);
    let docs: Vec<String> = (0..20)
        .map(|i| {
            let doc = if i % 2 == 0 { service() } else { slice() };
            let mut doc = doc;
            doc["metadata"]["name"] = json!(format!("o-{i}"));
            // As the API server writes them: some start with digits.
            doc["metadata"]["uid"] = json!(format!("{i}b02996a-1b0c-45de-9e54-fbdcf88db106"));
            Writer::document(&mut rng, &doc)
        })
        .collect();
    let text = format!("---\n{}", docs.join("---\n"));
    let fast = parse_yaml_objects(Path::new("m.yaml"), &text).unwrap_or_else(|| {
        panic!(
            "{text}\n{:?}",
            parse_manifest(Path::new("m.yaml"), &text).map(|o| o.len())
        )
    });
    assert_eq!(fast.len(), 20);
    // And a kind the proxy does not read is left out, as the general path does.
    let with_other = format!("{text}---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: d}}\nspec: {{replicas: 3}}\n");
    let objects = parse_yaml_objects(Path::new("m.yaml"), &with_other).expect("the fast path");
    assert_eq!(format!("{objects:?}"), format!("{fast:?}"));
    // A document the fast path leaves to the general one sends the whole
    // file there, which reads it as before.
    let with_anchor = format!(
        "{text}---
apiVersion: v1
kind: Node
metadata: {{name: &n n1}}
"
    );
    assert!(parse_yaml_objects(Path::new("m.yaml"), &with_anchor).is_none());
    assert_eq!(
        parse_manifest(Path::new("m.yaml"), &with_anchor)
            .unwrap()
            .len(),
        21
    );
}
