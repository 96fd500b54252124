//! `dump` of the nftables datapath: our tables read back with `nft` and
//! decoded per service (its map elements and chains, as `nft` prints them;
//! the endpoints each frontend picks from, one line per frontend).

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::rules::{self, Family, TABLE};
use super::{nft_output, NftError};

/// One table of ours, decoded per service for `dump`: the map elements
/// that dispatch to each service and its chains, as `nft` prints them.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TableDump {
    /// `ip` or `ip6`.
    pub family: &'static str,
    pub table: &'static str,
    /// Which mode runs, and why (the info chain's comment).
    pub datapath: Option<String>,
    /// `namespace/name` (or `(no endpoints)`) → its map elements and
    /// chains, one line each as nft prints them.
    pub services: BTreeMap<String, Vec<String>>,
}

/// The tables of ours in this network namespace, read back from the kernel.
pub fn dump_tables() -> Result<Vec<TableDump>, NftError> {
    let mut out = Vec::new();
    for f in Family::ALL {
        let Some(json_text) = nft_output(&["-j", "list", "table", f.nft(), TABLE])? else {
            continue;
        };
        let listing = nft_output(&["list", "table", f.nft(), TABLE])?.unwrap_or_default();
        let doc: Value =
            serde_json::from_str(&json_text).map_err(|e| NftError::Output(e.to_string()))?;
        let objects = doc["nftables"].as_array().cloned().unwrap_or_default();
        let mut per_service: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let pick_maps: Vec<&str> = rules::PICKS.iter().flat_map(|p| [p.2, p.3]).collect();
        for o in &objects {
            if let Some(map) = o.get("map") {
                let name = map["name"].as_str().unwrap_or_default();
                if pick_maps.contains(&name) {
                    continue;
                }
                for elem in map["elem"].as_array().into_iter().flatten() {
                    // Elements without a service chain are the no-endpoint
                    // verdicts (reject-chain, drop).
                    let target = match elem[1]["goto"]["target"].as_str() {
                        Some(t) => t.to_owned(),
                        None => render_value(&elem[1]),
                    };
                    let service =
                        rules::service_of(&target).unwrap_or_else(|| "(no endpoints)".to_owned());
                    per_service
                        .entry(service)
                        .or_default()
                        .push(format!("{name}: {} -> {target}", render_value(&elem[0])));
                }
            }
        }
        for (service, line) in frontend_endpoints(&objects) {
            per_service.entry(service).or_default().push(line);
        }
        for (chain, lines) in chains_of_listing(&listing) {
            if let Some(service) = rules::service_of(&chain) {
                let entry = per_service.entry(service).or_default();
                entry.push(format!("chain {chain}"));
                entry.extend(lines.iter().map(|l| format!("  {l}")));
            }
        }
        out.push(TableDump {
            family: f.nft(),
            table: TABLE,
            datapath: info_of_listing(&listing),
            services: per_service,
        });
    }
    Ok(out)
}

/// The elements of map `name` in a `nft -j` listing.
fn map_elements<'a>(objects: &'a [Value], name: &'a str) -> impl Iterator<Item = &'a Value> {
    objects
        .iter()
        .filter_map(|o| o.get("map"))
        .filter(move |m| m["name"] == name)
        .flat_map(|m| m["elem"].as_array().into_iter().flatten())
}

/// A count or slot (`mark`) from `nft -j`, which prints its host-order
/// bytes as a big-endian number.
fn mark_of(v: &Value) -> Option<u32> {
    let n = u32::try_from(v.as_u64()?).ok()?;
    Some(u32::from_ne_bytes(n.to_be_bytes()))
}

/// One line per frontend that picks from the shared maps, with the
/// service it belongs to (by the dispatch maps):
/// `internal-endpoints: 10.96.0.10 . tcp . 80 -> 10.244.1.11 . 8080, …`,
/// the endpoints by slot; a count that does not match them is shown.
fn frontend_endpoints(objects: &[Value]) -> Vec<(String, String)> {
    let mut owner: HashMap<String, String> = HashMap::new();
    for map in [rules::SERVICE_IPS, rules::SERVICE_NODEPORTS] {
        for elem in map_elements(objects, map) {
            if let Some(service) = elem[1]["goto"]["target"]
                .as_str()
                .and_then(rules::service_of)
            {
                owner.insert(render_value(&elem[0]), service);
            }
        }
    }
    let mut out = Vec::new();
    for (_, _, counts_map, endpoints_map) in rules::PICKS {
        let counts: BTreeMap<String, Option<u32>> = map_elements(objects, counts_map)
            .map(|e| (render_value(&e[0]), mark_of(&e[1])))
            .collect();
        let mut slots: BTreeMap<String, BTreeMap<u32, String>> = BTreeMap::new();
        for e in map_elements(objects, endpoints_map) {
            let Some((slot, frontend)) = e[0]["concat"].as_array().and_then(|p| p.split_last())
            else {
                continue;
            };
            let frontend: Vec<String> = frontend.iter().map(render_value).collect();
            slots
                .entry(frontend.join(" . "))
                .or_default()
                .insert(mark_of(slot).unwrap_or(u32::MAX), render_value(&e[1]));
        }
        let frontends: std::collections::BTreeSet<&String> =
            counts.keys().chain(slots.keys()).collect();
        for frontend in frontends {
            let endpoints: Vec<&str> = slots
                .get(frontend)
                .map(|s| s.values().map(String::as_str).collect())
                .unwrap_or_default();
            let mut line = format!("{endpoints_map}: {frontend} -> {}", endpoints.join(", "));
            let count = counts.get(frontend).copied().flatten();
            if count != Some(endpoints.len() as u32) {
                let count = count.map_or_else(|| "none".to_owned(), |c| c.to_string());
                line.push_str(&format!(" ({counts_map}: {count})"));
            }
            let service = owner
                .get(frontend)
                .cloned()
                .unwrap_or_else(|| "(unowned endpoints)".to_owned());
            out.push((service, line));
        }
    }
    out
}

/// `dump`'s text form of [`dump_tables`].
pub fn dump_text() -> Result<String, NftError> {
    Ok(render_tables(&dump_tables()?))
}

pub fn render_tables(tables: &[TableDump]) -> String {
    let mut out = String::new();
    for t in tables {
        out.push_str(&format!("table {} {}\n", t.family, t.table));
        if let Some(note) = &t.datapath {
            out.push_str(&format!("datapath: {note}\n"));
        }
        for (service, lines) in &t.services {
            out.push_str(&format!("service {service}\n"));
            for l in lines {
                out.push_str("  ");
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    if out.is_empty() {
        out.push_str("no ebpf-kube-proxy nftables table in this network namespace\n");
    }
    out
}

/// The comment of the info chain: which mode runs, and why.
fn info_of_listing(listing: &str) -> Option<String> {
    let start = listing.find(&format!("chain {} {{", rules::INFO_CHAIN))?;
    let rest = &listing[start..];
    let end = rest.find('}')?;
    let comment = rest[..end].split("comment \"").nth(1)?;
    Some(comment.trim_end().trim_end_matches('"').to_owned())
}

/// Chain name → its rules, from `nft list table` text.
pub fn chains_of_listing(listing: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut current: Option<(String, Vec<String>)> = None;
    for line in listing.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("chain ").and_then(|r| r.strip_suffix(" {")) {
            current = Some((name.to_owned(), Vec::new()));
        } else if t == "}" {
            if let Some(c) = current.take() {
                out.push(c);
            }
        } else if let Some((_, rules)) = current.as_mut() {
            if !t.is_empty() && !t.starts_with("type ") && !t.starts_with("comment ") {
                rules.push(t.to_owned());
            }
        }
    }
    out
}

fn render_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Object(o) => match o.get("concat").and_then(Value::as_array) {
            Some(parts) => parts
                .iter()
                .map(render_value)
                .collect::<Vec<_>>()
                .join(" . "),
            None => match o.keys().next() {
                // {"drop": null} and friends.
                Some(k) if o.len() == 1 && o[k].is_null() => k.clone(),
                _ => v.to_string(),
            },
        },
        _ => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_frontend_shows_its_endpoints_by_slot_under_its_service() {
        // nft -j prints a mark's host-order bytes as a big-endian number.
        let mark = |n: u32| json!(u32::from_be_bytes(n.to_ne_bytes()));
        let objects = vec![
            json!({"map": {"name": "service-ips", "elem": [
                [{"concat": ["10.96.0.10", "tcp", 80]}, {"goto": {"target": "svc-default/web/tcp/http"}}]
            ]}}),
            json!({"map": {"name": "internal-counts", "elem": [
                [{"concat": ["10.96.0.10", "tcp", 80]}, mark(2)]
            ]}}),
            json!({"map": {"name": "internal-endpoints", "elem": [
                [{"concat": ["10.96.0.10", "tcp", 80, mark(1)]}, {"concat": ["10.244.1.12", 8080]}],
                [{"concat": ["10.96.0.10", "tcp", 80, mark(0)]}, {"concat": ["10.244.1.11", 8080]}]
            ]}}),
            json!({"map": {"name": "external-nodeport-counts", "elem": [
                [{"concat": ["tcp", 30080]}, mark(3)]
            ]}}),
        ];
        assert_eq!(
            frontend_endpoints(&objects),
            [
                (
                    "default/web".to_owned(),
                    "internal-endpoints: 10.96.0.10 . tcp . 80 -> 10.244.1.11 . 8080, 10.244.1.12 . 8080".to_owned()
                ),
                (
                    "(unowned endpoints)".to_owned(),
                    "external-nodeport-endpoints: tcp . 30080 ->  (external-nodeport-counts: 3)".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn map_keys_render_like_nft() {
        assert_eq!(
            render_value(&json!({"concat": ["10.96.0.10", "tcp", 80]})),
            "10.96.0.10 . tcp . 80"
        );
    }
}
