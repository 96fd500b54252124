//! `--proxy-mode nftables`: a kube-proxy-nftables-shaped ruleset in the
//! tables `ip ebpf-kube-proxy` and `ip6 ebpf-kube-proxy` (see [`rules`] for
//! the layout), programmed as nft JSON through `nft -j -f -`.
//!
//! `nft` is run directly rather than through the `nftables` crate's helper:
//! that helper lets nft's stderr through to ours, and that text is what
//! names the failing part of a rejected transaction.
//!
//! * The first apply (and the one after a failed transaction) replaces both
//!   tables in one transaction: add, delete, re-create. Conntrack entries
//!   are not touched, so established connections keep their NAT.
//! * Later applies build one transaction per LocalState change holding only
//!   the services that changed: their map elements, their chains (rewritten
//!   whole) and the removal of chains and sets no longer referenced.
//! * After a partial sync, UDP conntrack entries that point at removed
//!   endpoints, or hold a reject from before a service's first endpoint,
//!   are deleted ([`conntrack`]).
//! * A rejected transaction changes nothing (nft applies all or nothing);
//!   the error names the failing command and the next apply is a full one.

pub mod conntrack;
pub mod rules;

use std::collections::{BTreeMap, HashMap};
#[cfg(test)]
use std::net::IpAddr;
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
    use std::io::Write;
    use std::process::{Command, Stdio};
    let payload = json!({ "nftables": commands }).to_string();
    let mut child = Command::new("nft")
        .args(["-j", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| NftError::Exec(format!("nft -j -f -: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A write error shows up as nft's own failure below.
        let _ = stdin.write_all(payload.as_bytes());
    }
    let out = child
        .wait_with_output()
        .map_err(|e| NftError::Exec(format!("nft -j -f -: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(NftError::Rejected {
        family: family.nft(),
        failing: failing_commands(&stderr, commands),
        stderr: stderr.trim().to_owned(),
    })
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

/// `kubeproxy_sync_proxy_rules_nftables_*` (SPEC §5.1), nftables mode only.
#[derive(Clone, Debug)]
struct NftMetrics {
    sync_failures: prometheus::IntCounterVec,
}

impl NftMetrics {
    fn register(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        let family =
            |name: &str, help: &str| -> Result<prometheus::IntCounterVec, prometheus::Error> {
                let c = prometheus::IntCounterVec::new(
                    prometheus::Opts::new(name, format!("[ALPHA] {help}")),
                    &["ip_family"],
                )?;
                registry.register(Box::new(c.clone()))?;
                // Both families are programmed: both series exist from the start.
                for f in Family::ALL {
                    c.with_label_values(&[f.label()]);
                }
                Ok(c)
            };
        // Stale chains are removed in the sync transaction itself, so a
        // failed cleanup is a failed sync and this stays 0; the family is
        // kept for dashboards written for kube-proxy.
        family(
            "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
            "Cumulative proxy nftables cleanup failures",
        )?;
        Ok(NftMetrics {
            sync_failures: family(
                "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
                "Cumulative proxy nftables sync failures",
            )?,
        })
    }
}

/// The nftables datapath of a running daemon.
#[derive(Debug)]
pub struct NftDatapath {
    metrics: Option<NftMetrics>,
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
            metrics: None,
            cluster_cidrs,
            programmed: HashMap::new(),
            element_owner: HashMap::new(),
            full_next: true,
        })
    }

    /// Replaces the family's table with `next` in one transaction.
    fn full_sync(&mut self, f: Family, next: &LocalState) -> Result<(), NftError> {
        // The table is flushed and refilled, never deleted: deleting it
        // would unhook the base chains for a moment, and a new connection
        // arriving then (a daemon restart) would miss its DNAT.
        let existing = existing_objects(f)?;
        let base = rules::base_objects(f);
        let mut cmds = vec![add(rules::table_obj(f)), flush(rules::table_obj(f))];
        for map in &existing.maps {
            cmds.push(flush(rules::map_ref(f, map)));
        }
        let base_chains: Vec<&str> = base
            .iter()
            .filter_map(|o| o["chain"]["name"].as_str())
            .collect();
        let mut wanted_chains: std::collections::HashSet<String> =
            base_chains.iter().map(|c| (*c).to_owned()).collect();
        let mut tail: Vec<Value> = Vec::new();
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
                tail.push(add(rules::set_obj(f, name, *timeout)));
            }
            for (name, chain_rules) in &objs.chains {
                tail.push(add(rules::chain_obj(f, name)));
                wanted_chains.insert(name.clone());
                rule_cmds.extend(chain_rules.iter().map(|r| add(rules::rule_obj(f, name, r))));
            }
            for ((map, _), (k, v)) in &objs.elements {
                elements.entry(map).or_default().push(json!([k, v]));
            }
            programmed.push((key.clone(), objs));
        }
        // Left over from an earlier run: rules are gone with the flush, so
        // nothing references them any more.
        for chain in &existing.chains {
            if !wanted_chains.contains(chain) {
                cmds.push(delete(rules::chain_obj(f, chain)));
            }
        }
        // Affinity sets are always re-created: the kernel marks a set that
        // a rule updates as dynamic, and adding it again as declared (nft
        // 1.0.6 JSON has no `dynamic` flag) fails with "File exists".
        // Affinity entries are lost on restart, as with kube-proxy.
        for set in &existing.sets {
            cmds.push(delete(rules::set_ref(f, set)));
        }
        cmds.extend(base.into_iter().map(add));
        cmds.extend(tail);
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

    fn register_metrics(
        &mut self,
        registry: &prometheus::Registry,
    ) -> Result<(), prometheus::Error> {
        self.metrics = Some(NftMetrics::register(registry)?);
        Ok(())
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
            let synced = if full {
                self.full_sync(f, next)
            } else {
                self.partial_sync(f, &changed)
            };
            if let Err(e) = synced {
                if let Some(m) = &self.metrics {
                    m.sync_failures.with_label_values(&[f.label()]).inc();
                }
                return Err(e.into());
            }
        }
        self.full_next = false;
        if !full {
            let flushes: Vec<conntrack::Flush> = changed
                .iter()
                .flat_map(|(key, new)| conntrack::plan(prev.service(key), *new))
                .collect();
            conntrack::run(&flushes);
        }
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

/// What a family's table holds now (empty when there is no table).
#[derive(Debug, Default)]
struct Existing {
    chains: Vec<String>,
    sets: Vec<String>,
    maps: Vec<String>,
}

fn existing_objects(f: Family) -> Result<Existing, NftError> {
    let mut existing = Existing::default();
    let Some(text) = nft_output(&["-j", "list", "table", f.nft(), rules::TABLE])? else {
        return Ok(existing);
    };
    let doc: Value = serde_json::from_str(&text).map_err(|e| NftError::Output(e.to_string()))?;
    for o in doc["nftables"].as_array().into_iter().flatten() {
        if let Some(name) = o["chain"]["name"].as_str() {
            existing.chains.push(name.to_owned());
        } else if let Some(name) = o["set"]["name"].as_str() {
            existing.sets.push(name.to_owned());
        } else if let Some(name) = o["map"]["name"].as_str() {
            existing.maps.push(name.to_owned());
        }
    }
    Ok(existing)
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
                    // Elements without a service chain are the no-endpoint
                    // verdicts (reject-chain, drop).
                    let target = match elem[1]["goto"]["target"].as_str() {
                        Some(t) => t.to_owned(),
                        None => elem[1].to_string(),
                    };
                    let service =
                        rules::service_of(&target).unwrap_or_else(|| "(no endpoints)".to_owned());
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

    /// Runs `f` on a thread in a new, empty network namespace (the `nft`
    /// it spawns inherits it), or returns `None` when not root.
    fn in_private_netns<T: Send>(f: impl FnOnce() -> T + Send) -> Option<T> {
        // SAFETY: getuid has no preconditions.
        if unsafe { libc::getuid() } != 0
            || std::process::Command::new("nft")
                .arg("--version")
                .output()
                .is_err()
        {
            eprintln!("skipped: needs root and nft");
            return None;
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: unshare only moves this scoped test thread into a
                // fresh network namespace; the host's rules are never seen.
                assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
                f()
            })
            .join()
            .unwrap()
        })
        .into()
    }

    fn listing() -> String {
        nft_output(&["list", "table", "ip", rules::TABLE])
            .unwrap()
            .unwrap_or_default()
    }

    #[test]
    fn syncs_replace_then_update_only_what_changed_and_recover_after_a_failure() {
        use rules::tests::{endpoint, web};
        in_private_netns(|| {
            let empty = LocalState::default();
            let two = LocalState {
                services: vec![web(
                    vec![endpoint("10.244.1.11", true), endpoint("10.244.1.12", true)],
                    Some(30),
                )],
            };
            let one = LocalState {
                services: vec![web(vec![endpoint("10.244.1.11", true)], Some(30))],
            };
            let mut dp = NftDatapath::open(Vec::new()).unwrap();
            dp.apply(&empty, &two).unwrap();
            let text = listing();
            assert!(
                text.contains("10.96.0.10 . tcp . 80 : goto svc-default/web/tcp/http"),
                "{text}"
            );
            assert!(text.contains("dnat to 10.244.1.12:8080"), "{text}");
            assert!(text.contains("numgen random mod 2"), "{text}");

            // One endpoint goes: its chain and affinity set go with it.
            assert_eq!(dp.apply(&two, &one).unwrap().services_changed, 1);
            let text = listing();
            assert!(!text.contains("10.244.1.12"), "{text}");
            assert!(text.contains("dnat to 10.244.1.11:8080"), "{text}");

            // Someone deletes the table: the partial sync is rejected with
            // the reason, the next one rebuilds everything.
            nft_output(&["delete", "table", "ip", rules::TABLE]).unwrap();
            let err = dp.apply(&one, &two).unwrap_err().to_string();
            assert!(err.contains("nft rejected the transaction (ip)"), "{err}");
            dp.apply(&one, &two).unwrap();
            assert!(listing().contains("dnat to 10.244.1.12:8080"));

            // No endpoints: rejected early, not dispatched.
            let none = LocalState {
                services: vec![web(vec![], None)],
            };
            dp.apply(&two, &none).unwrap();
            let text = listing();
            assert!(
                text.contains("10.96.0.10 . tcp . 80 : goto reject-chain"),
                "{text}"
            );
            assert!(!text.contains("svc-default/web"), "{text}");

            // A restarted daemon refills the table in place and drops what
            // the state no longer has.
            NftDatapath::open(Vec::new())
                .unwrap()
                .apply(&empty, &two)
                .unwrap();
            NftDatapath::open(Vec::new())
                .unwrap()
                .apply(&empty, &one)
                .unwrap();
            let text = listing();
            assert!(text.contains("dnat to 10.244.1.11:8080"), "{text}");
            assert!(!text.contains("10.244.1.12"), "{text}");
            assert!(!text.contains("reject-chain\n"), "{text}");

            let dump = dump_text().unwrap();
            assert!(
                dump.contains("service default/web\n  service-ips: 10.96.0.10 . tcp . 80 -> svc-default/web/tcp/http"),
                "{dump}"
            );
            assert!(
                dump.contains("  chain ep-default/web/tcp/http/10.244.1.11:8080"),
                "{dump}"
            );

            assert_eq!(cleanup().unwrap(), ["ip", "ip6"]);
            assert!(!is_programmed());
        });
    }

    /// Timing of a full and a one-endpoint sync at scale; run with
    /// `EKP_NFT_SCALE=SERVICES cargo test -p proxy-userspace --lib
    /// nft_sync_timing -- --ignored --nocapture` (10 endpoints each).
    #[test]
    #[ignore = "timing, needs root"]
    fn nft_sync_timing() {
        use rules::tests::{endpoint, web};
        let services: u32 = std::env::var("EKP_NFT_SCALE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000);
        let state = |n_eps: u32| LocalState {
            services: (0..services)
                .map(|i| {
                    let mut se = web(
                        (0..n_eps.min(10))
                            .map(|e| {
                                endpoint(
                                    &format!(
                                        "10.{}.{}.{}",
                                        100 + i / 65536,
                                        (i / 256) % 256,
                                        (i % 256) / 26 * 10 + e
                                    ),
                                    true,
                                )
                            })
                            .collect(),
                        None,
                    );
                    se.service.key.name = format!("svc{i:06}");
                    se.service.cluster_ips = crate::model::IpSet::from_ips(&[IpAddr::V4(
                        std::net::Ipv4Addr::from(0x0a60_0000 + i),
                    )]);
                    se
                })
                .collect(),
        };
        in_private_netns(|| {
            let full = state(10);
            let mut dp = NftDatapath::open(Vec::new()).unwrap();
            let t = Instant::now();
            dp.apply(&LocalState::default(), &full).unwrap();
            let full_time = t.elapsed();
            let mut one = full.clone();
            one.services[0].endpoints.pop();
            let t = Instant::now();
            dp.apply(&full, &one).unwrap();
            println!(
                "{services} services x 10 endpoints: full sync {full_time:?}, one endpoint removed {:?}",
                t.elapsed()
            );
            cleanup().unwrap();
        });
    }

    #[test]
    fn map_keys_render_like_nft() {
        assert_eq!(
            render_value(&json!({"concat": ["10.96.0.10", "tcp", 80]})),
            "10.96.0.10 . tcp . 80"
        );
    }
}
