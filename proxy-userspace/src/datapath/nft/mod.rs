//! `--proxy-mode nftables`: a kube-proxy-nftables-shaped ruleset in the
//! tables `ip ebpf-kube-proxy` and `ip6 ebpf-kube-proxy` (see [`rules`] for
//! the layout), programmed through `nft -j -f -` with the `nftables` crate.
//!
//! * The first apply (and the one after a failed transaction) replaces both
//!   tables in one transaction: add, delete, re-create. Conntrack entries
//!   are not touched, so established connections keep their NAT.
//! * Later applies build one transaction per LocalState change holding only
//!   the services that changed: their map elements, their chains (rewritten
//!   whole) and the removal of chains and sets no longer referenced.
//! * A rejected transaction changes nothing (nft applies all or nothing);
//!   the error names the failing command and the next apply is a full one.

pub mod rules;

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use serde_json::{json, Value};

use super::{for_each_changed, ApplyStats, Datapath, DatapathError, ProxyMode};
use crate::model::{LocalState, ObjectKey};
use crate::net::Cidr;
use rules::{Family, ServiceObjects};

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("running nft: {0}")]
    Exec(String),
    #[error("nft rejected the transaction ({family}): {stderr}{failing}")]
    Rejected {
        family: &'static str,
        stderr: String,
        /// The commands nft pointed at, when it named an index.
        failing: String,
    },
    #[error("nft output: {0}")]
    Output(String),
}

impl From<NftError> for DatapathError {
    fn from(e: NftError) -> Self {
        DatapathError::Apply {
            mode: ProxyMode::Nftables,
            reason: e.to_string(),
        }
    }
}

/// Runs one JSON transaction (`{"nftables": [commands]}`) with `nft -j -f -`.
fn run_transaction(family: Family, commands: &[Value]) -> Result<(), NftError> {
    if commands.is_empty() {
        return Ok(());
    }
    let payload = json!({ "nftables": commands }).to_string();
    match nftables::helper::apply_ruleset_raw::<str, str, _>(
        &payload,
        None,
        std::iter::empty::<&str>(),
    ) {
        Ok(_) => Ok(()),
        Err(nftables::helper::NftablesError::NftFailed { stderr, .. }) => Err(NftError::Rejected {
            family: family.nft(),
            failing: failing_commands(&stderr, commands),
            stderr: stderr.trim().to_owned(),
        }),
        Err(e) => Err(NftError::Exec(e.to_string())),
    }
}

/// nft names the failing command as "... command array at index N ...";
/// shows that command so a bad object is visible in the log.
fn failing_commands(stderr: &str, commands: &[Value]) -> String {
    let mut out = String::new();
    for part in stderr.split("index ").skip(1) {
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        if let Some(cmd) = digits.parse::<usize>().ok().and_then(|i| commands.get(i)) {
            out.push_str(&format!("; failing command: {cmd}"));
        }
    }
    out
}

fn add(obj: Value) -> Value {
    json!({ "add": obj })
}

fn flush(obj: Value) -> Value {
    json!({ "flush": obj })
}

fn delete(obj: Value) -> Value {
    json!({ "delete": obj })
}

/// The nftables datapath of a running daemon.
#[derive(Debug)]
pub struct NftDatapath {
    cluster_cidrs: Vec<Cidr>,
    /// What each service has programmed, per family.
    programmed: HashMap<(ObjectKey, Family), ServiceObjects>,
    /// Which service a map element belongs to: the first service in
    /// LocalState order wins an address two services claim.
    element_owner: HashMap<(Family, &'static str, String), ObjectKey>,
    full_next: bool,
}

impl NftDatapath {
    /// Checks that `nft` runs; nothing is programmed until the first apply.
    pub fn open(cluster_cidrs: Vec<Cidr>) -> Result<Self, NftError> {
        let out = std::process::Command::new("nft")
            .arg("--version")
            .output()
            .map_err(|e| {
                NftError::Exec(format!(
                    "nft --version: {e} (Debian: apt-get install nftables)"
                ))
            })?;
        if !out.status.success() {
            return Err(NftError::Exec(format!(
                "nft --version: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        tracing::info!(version = %String::from_utf8_lossy(&out.stdout).trim(), table = rules::TABLE, "nftables datapath ready");
        Ok(NftDatapath {
            cluster_cidrs,
            programmed: HashMap::new(),
            element_owner: HashMap::new(),
            full_next: true,
        })
    }

    /// Replaces the family's table with `next` in one transaction.
    fn full_sync(&mut self, f: Family, next: &LocalState) -> Result<(), NftError> {
        let mut cmds = vec![
            add(rules::table_obj(f)),
            delete(rules::table_obj(f)),
            add(rules::table_obj(f)),
        ];
        cmds.extend(rules::base_objects(f).into_iter().map(add));
        let mut owners = HashMap::new();
        let mut programmed = Vec::new();
        let mut elements: BTreeMap<&'static str, Vec<Value>> = BTreeMap::new();
        let mut rule_cmds = Vec::new();
        for se in &next.services {
            let key = &se.service.key;
            let mut objs = rules::service_objects(se, f, &self.cluster_cidrs);
            objs.elements.retain(|(map, k), _| {
                match owners.entry((f, *map, k.clone())) {
                    std::collections::hash_map::Entry::Occupied(_) => {
                        tracing::warn!(service = %key, element = %k, "two services claim one address; the first one is programmed");
                        false
                    }
                    std::collections::hash_map::Entry::Vacant(v) => {
                        v.insert(key.clone());
                        true
                    }
                }
            });
            for (name, timeout) in &objs.sets {
                cmds.push(add(rules::set_obj(f, name, *timeout)));
            }
            for (name, chain_rules) in &objs.chains {
                cmds.push(add(rules::chain_obj(f, name)));
                rule_cmds.extend(chain_rules.iter().map(|r| add(rules::rule_obj(f, name, r))));
            }
            for ((map, _), (k, v)) in &objs.elements {
                elements.entry(map).or_default().push(json!([k, v]));
            }
            programmed.push((key.clone(), objs));
        }
        cmds.extend(rule_cmds);
        for (map, elems) in elements {
            cmds.push(add(rules::element_obj(f, map, elems)));
        }
        run_transaction(f, &cmds)?;
        self.programmed.retain(|(_, fam), _| *fam != f);
        self.element_owner.retain(|(fam, _, _), _| *fam != f);
        self.element_owner.extend(owners);
        for (key, objs) in programmed {
            self.programmed.insert((key, f), objs);
        }
        Ok(())
    }

    /// One transaction with only the services that changed.
    fn partial_sync(
        &mut self,
        f: Family,
        changed: &[(ObjectKey, Option<&crate::model::ServiceEndpoints>)],
    ) -> Result<(), NftError> {
        // Commands grouped by phase; the phases run in this order inside
        // the one transaction, so nothing is deleted while referenced.
        let (mut del_elems, mut flushes, mut del_chains, mut del_sets) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut add_sets, mut add_chains, mut add_rules, mut add_elems) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut results = Vec::new();
        let mut owners = self.element_owner.clone();
        for (key, next) in changed {
            let old = self
                .programmed
                .get(&(key.clone(), f))
                .cloned()
                .unwrap_or_default();
            let mut new = next
                .map(|se| rules::service_objects(se, f, &self.cluster_cidrs))
                .unwrap_or_default();
            new.elements.retain(|(map, k), _| {
                match owners.get(&(f, *map, k.clone())) {
                    Some(owner) if owner != key && !old.elements.contains_key(&(*map, k.clone())) => {
                        tracing::warn!(service = %key, element = %k, "two services claim one address; the first one is programmed");
                        false
                    }
                    _ => true,
                }
            });
            for ((map, k), (key_json, verdict)) in &old.elements {
                if new.elements.get(&(*map, k.clone())).map(|(_, v)| v) != Some(verdict) {
                    del_elems.push(delete(rules::element_obj(f, map, vec![key_json.clone()])));
                }
                if !new.elements.contains_key(&(*map, k.clone())) {
                    owners.remove(&(f, *map, k.clone()));
                }
            }
            for ((map, k), (key_json, verdict)) in &new.elements {
                if old.elements.get(&(*map, k.clone())).map(|(_, v)| v) != Some(verdict) {
                    add_elems.push(add(rules::element_obj(
                        f,
                        map,
                        vec![json!([key_json, verdict])],
                    )));
                }
                owners.insert((f, *map, k.clone()), key.clone());
            }
            // Chains of a changed service are rewritten whole: a chain
            // whose text did not change may still point at a set that is
            // re-created with a new timeout.
            for name in old.chains.keys() {
                flushes.push(flush(rules::chain_obj(f, name)));
                if !new.chains.contains_key(name) {
                    del_chains.push(delete(rules::chain_obj(f, name)));
                }
            }
            for (name, timeout) in &old.sets {
                if new.sets.get(name) != Some(timeout) {
                    del_sets.push(delete(rules::set_ref(f, name)));
                }
            }
            for (name, timeout) in &new.sets {
                if old.sets.get(name) != Some(timeout) {
                    add_sets.push(add(rules::set_obj(f, name, *timeout)));
                }
            }
            for (name, chain_rules) in &new.chains {
                add_chains.push(add(rules::chain_obj(f, name)));
                add_rules.extend(chain_rules.iter().map(|r| add(rules::rule_obj(f, name, r))));
            }
            results.push((key.clone(), new));
        }
        let cmds: Vec<Value> = [
            del_elems, flushes, del_chains, del_sets, add_sets, add_chains, add_rules, add_elems,
        ]
        .into_iter()
        .flatten()
        .collect();
        run_transaction(f, &cmds)?;
        self.element_owner = owners;
        for (key, objs) in results {
            if objs == ServiceObjects::default() {
                self.programmed.remove(&(key, f));
            } else {
                self.programmed.insert((key, f), objs);
            }
        }
        Ok(())
    }
}

impl Datapath for NftDatapath {
    fn mode(&self) -> ProxyMode {
        ProxyMode::Nftables
    }

    fn apply(&mut self, prev: &LocalState, next: &LocalState) -> Result<ApplyStats, DatapathError> {
        let started = Instant::now();
        let mut changed = Vec::new();
        for_each_changed(prev, next, |key, new| changed.push((key.clone(), new)));
        let full = self.full_next;
        // A failure leaves the kernel as it was (one transaction) but our
        // bookkeeping may no longer match it: start over next time.
        self.full_next = true;
        for f in Family::ALL {
            if full {
                self.full_sync(f, next)?;
            } else {
                self.partial_sync(f, &changed)?;
            }
        }
        self.full_next = false;
        tracing::debug!(full, services_changed = changed.len(), elapsed = ?started.elapsed(), "nftables synced");
        Ok(ApplyStats {
            services_changed: if full {
                next.services.len()
            } else {
                changed.len()
            },
        })
    }
}

/// Runs `nft` with `args` inside the current network namespace, returning
/// stdout.
fn nft_output(args: &[&str]) -> Result<Option<String>, NftError> {
    let out = std::process::Command::new("nft")
        .args(args)
        .output()
        .map_err(|e| NftError::Exec(format!("nft {}: {e}", args.join(" "))))?;
    if out.status.success() {
        return Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned()));
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    // "No such file or directory": the table is not there.
    if stderr.contains("No such file or directory") {
        return Ok(None);
    }
    Err(NftError::Exec(format!(
        "nft {}: {}",
        args.join(" "),
        stderr.trim()
    )))
}

/// Whether this network namespace has one of the proxy's tables.
pub fn is_programmed() -> bool {
    Family::ALL.iter().any(|f| {
        matches!(
            nft_output(&["list", "table", f.nft(), rules::TABLE]),
            Ok(Some(_))
        )
    })
}

/// Deletes both tables; returns the families whose table was there.
pub fn cleanup() -> Result<Vec<&'static str>, NftError> {
    let mut removed = Vec::new();
    for f in Family::ALL {
        if nft_output(&["delete", "table", f.nft(), rules::TABLE])?.is_some() {
            removed.push(f.nft());
        }
    }
    Ok(removed)
}

/// `dump`: both tables decoded per service: the map elements that
/// dispatch to it and its chains, as `nft` prints them.
pub fn dump_text() -> Result<String, NftError> {
    let mut out = String::new();
    for f in Family::ALL {
        let Some(json_text) = nft_output(&["-j", "list", "table", f.nft(), rules::TABLE])? else {
            continue;
        };
        let doc: Value =
            serde_json::from_str(&json_text).map_err(|e| NftError::Output(e.to_string()))?;
        let objects = doc["nftables"].as_array().cloned().unwrap_or_default();
        let mut per_service: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut chains: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for o in &objects {
            if let Some(rule) = o.get("rule") {
                let chain = rule["chain"].as_str().unwrap_or_default().to_owned();
                chains
                    .entry(chain)
                    .or_default()
                    .push(render_expr(&rule["expr"]));
            }
        }
        for o in &objects {
            if let Some(map) = o.get("map") {
                let name = map["name"].as_str().unwrap_or_default();
                for elem in map["elem"].as_array().into_iter().flatten() {
                    let target = elem[1]["goto"]["target"].as_str().unwrap_or_default();
                    let service = rules::service_of(target).unwrap_or_else(|| {
                        if target == "reject-chain" {
                            "(no endpoints)".to_owned()
                        } else {
                            target.to_owned()
                        }
                    });
                    per_service
                        .entry(service)
                        .or_default()
                        .push(format!("  {name}: {} -> {target}", render_value(&elem[0])));
                }
            }
        }
        for (chain, lines) in &chains {
            if let Some(service) = rules::service_of(chain) {
                let entry = per_service.entry(service).or_default();
                entry.push(format!("  chain {chain}"));
                entry.extend(lines.iter().map(|l| format!("    {l}")));
            }
        }
        out.push_str(&format!("table {} {}\n", f.nft(), rules::TABLE));
        for (service, lines) in per_service {
            out.push_str(&format!("service {service}\n"));
            for l in lines {
                out.push_str(&l);
                out.push('\n');
            }
        }
    }
    if out.is_empty() {
        out.push_str("no ebpf-kube-proxy nftables table in this network namespace\n");
    }
    Ok(out)
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
            None => v.to_string(),
        },
        _ => v.to_string(),
    }
}

/// A compact one-line form of a rule's JSON expression list.
fn render_expr(expr: &Value) -> String {
    expr.as_array()
        .map(|stmts| {
            stmts
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejected_transaction_names_the_failing_command() {
        let cmds = vec![
            json!({"add": {"table": {}}}),
            json!({"add": {"chain": {"name": "bad"}}}),
        ];
        let text = failing_commands("Error: Parsing command array at index 1 failed.", &cmds);
        assert!(text.contains("\"bad\""), "{text}");
    }

    #[test]
    fn map_keys_render_like_nft() {
        assert_eq!(
            render_value(&json!({"concat": ["10.96.0.10", "tcp", 80]})),
            "10.96.0.10 . tcp . 80"
        );
    }
}
