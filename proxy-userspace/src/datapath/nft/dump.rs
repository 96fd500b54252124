//! `dump` of the nftables datapath: our tables read back with `nft` and
//! decoded per service (its map elements and chains, as `nft` prints them).

use std::collections::BTreeMap;

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
        for o in &objects {
            if let Some(map) = o.get("map") {
                let name = map["name"].as_str().unwrap_or_default();
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
    fn map_keys_render_like_nft() {
        assert_eq!(
            render_value(&json!({"concat": ["10.96.0.10", "tcp", 80]})),
            "10.96.0.10 . tcp . 80"
        );
    }
}
