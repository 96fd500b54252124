//! `--proxy-mode nftables`: a kube-proxy-nftables-shaped ruleset in the
//! tables `ip ebpf-kube-proxy` and `ip6 ebpf-kube-proxy` (see [`rules`] for
//! the layout), programmed as nf_tables netlink batches ([`netlink`]).
//!
//! Neither `nft` nor the `nftables` crate is on the sync path: `nft`
//! reads the whole table back before every change (seconds at 10,000
//! services) and parses text or JSON at tens of microseconds a rule. The
//! datapath knows what it programmed, so it writes the messages itself;
//! `nft` is used only by `dump` and `cleanup`.
//!
//! * The first apply (and the one after a failed transaction) refills
//!   each family's table in one transaction: rules flushed, maps flushed,
//!   leftovers deleted, everything re-added, built service by service
//!   (`fill.rs`). Conntrack entries are not touched, so established
//!   connections keep their NAT, and affinity sets that still apply keep
//!   their entries across a restart.
//! * Later applies build one transaction per family holding only the
//!   services that changed: their map elements, their chains whose rules
//!   changed (rewritten whole) and the removal of chains and sets no
//!   longer referenced. An endpoint change of a service without affinity
//!   is elements only (its frontends' counts and endpoints, see [`rules`]),
//!   unless its new endpoint count has no pick rules yet: then the pick
//!   chains are rewritten in the same transaction. A frontend of at
//!   least [`STABLE_SLOTS`] endpoints keeps each endpoint in the slot it
//!   was programmed in ([`slots`]): one endpoint of a 100,000-endpoint
//!   service changed is its slot, the last one and the count, not every
//!   slot after it in address order. What a changed service
//!   had is built again from the state last programmed (its services are
//!   shared, not copied): no per-service objects are kept between syncs
//!   (about 220 MiB at 50,000 services), only the endpoint addresses'
//!   hairpin counts and the few frontends a service lost to another.
//! * After a sync, UDP conntrack entries that point at removed endpoints,
//!   or hold a flow from before a service's first endpoint, are deleted
//!   over ctnetlink ([`conntrack`]); after a full sync, every UDP entry to
//!   a service address that does not reach a current endpoint.
//! * Forwarded packets conntrack finds invalid are dropped (`filter-forward`),
//!   as kube-proxy's iptables mode does, unless the kernel is told to be
//!   liberal about TCP windows (`nf_conntrack_tcp_be_liberal`, which
//!   `--conntrack-tcp-be-liberal` sets): then an out-of-window segment is
//!   not invalid and is reverse-NATed, and the drop is not needed. The
//!   sysctl is read at each full sync.
//! * A rejected transaction changes nothing (nf_tables commits all or
//!   nothing); the error names the failing command and the next apply is
//!   a full one.

pub mod batch;
pub mod conntrack;
pub mod drift;
mod dump;
pub mod expr;
mod fill;
mod hairpin;
pub mod nlsock;
mod partial;
pub mod rules;
mod slots;

pub use dump::{chains_of_listing, dump_tables, dump_text, render_tables, TableDump};

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use super::{
    ApplyStats, Datapath, DatapathConfig, DatapathError, Drift, DriftCheck, Dump, ProxyMode,
    ServiceChange,
};
use crate::model::claims::{Claims, Frontend, FrontendIp};
use crate::model::{LocalState, ObjectKey, Protocol, ServiceEndpoints};
use crate::net::Cidr;
use batch::{Batch, Element};
use expr::{key_bytes, key_text, KeyPart};
use rules::{ElementKey, ElementValue, Family, ServiceObjects, SlotList, TABLE};
pub use slots::{stable_order, STABLE_SLOTS};

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("running nft: {0}")]
    Exec(String),
    #[error("nf_tables rejected the transaction ({family}): {reason}")]
    Rejected {
        family: &'static str,
        reason: String,
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

/// Sends `batch` as one transaction of family `f`.
pub fn commit(f: Family, batch: Batch) -> Result<(), NftError> {
    let started = Instant::now();
    let (messages, bytes) = (batch.len(), batch.bytes());
    batch.commit().map_err(|e| NftError::Rejected {
        family: f.nft(),
        reason: e.to_string(),
    })?;
    tracing::debug!(family = f.nft(), messages, bytes, elapsed = ?started.elapsed(), "nftables transaction committed");
    Ok(())
}

fn element(key: &[KeyPart], value: Option<&ElementValue>) -> Element {
    let (verdict, data) = match value {
        Some(ElementValue::Verdict(v)) => {
            let (code, chain) = v.code();
            (Some((code, chain.map(str::to_owned))), None)
        }
        Some(ElementValue::Data(parts)) => (None, Some(key_bytes(parts))),
        None => (None, None),
    };
    Element {
        key: key_bytes(key),
        verdict,
        data,
    }
}

/// The frontend a map element answers for (`None`: not a frontend map):
/// its key is the frontend, or the frontend and an endpoint slot.
fn element_frontend(ek: &ElementKey) -> Option<Frontend> {
    key_frontend(&ek.1)
}

/// The frontend a key starts with (see [`element_frontend`]).
fn key_frontend(key: &[KeyPart]) -> Option<Frontend> {
    let (ip, protocol, port) = match key {
        [KeyPart::Addr(ip), KeyPart::Proto(p), KeyPart::Port(port)]
        | [KeyPart::Addr(ip), KeyPart::Proto(p), KeyPart::Port(port), KeyPart::Mark(_)] => {
            (FrontendIp::Ip(*ip), *p, *port)
        }
        [KeyPart::Proto(p), KeyPart::Port(port)]
        | [KeyPart::Proto(p), KeyPart::Port(port), KeyPart::Mark(_)] => {
            (FrontendIp::NodePort, *p, *port)
        }
        _ => return None,
    };
    Some(Frontend {
        ip,
        protocol: Protocol::from_ip_number(protocol)?,
        port,
    })
}

fn hairpin_element(ip: IpAddr) -> Element {
    element(&[KeyPart::Addr(ip), KeyPart::Addr(ip)], None)
}

/// Adds `rules` to `chain`.
fn add_rules(batch: &mut Batch, f: Family, chain: &str, rules: &[expr::Rule]) {
    for r in rules {
        batch.add_rule(f.nfproto_u8(), TABLE, chain, &r.encode(f), || r.text(f));
    }
}

/// Elements grouped per map, for one message per map (and chunk).
fn grouped<'a>(
    items: impl IntoIterator<Item = (&'a ElementKey, Option<&'a ElementValue>)>,
) -> BTreeMap<&'static str, (Vec<Element>, Vec<String>)> {
    let mut out: BTreeMap<&'static str, (Vec<Element>, Vec<String>)> = BTreeMap::new();
    for ((map, key), verdict) in items {
        let e = out.entry(map).or_default();
        e.0.push(element(key, verdict));
        if e.1.len() < 3 {
            e.1.push(key_text(key));
        }
    }
    out
}

fn describe(map: &str, keys: &[String], total: usize) -> String {
    let more = if total > keys.len() {
        format!(", … {} in all", total)
    } else {
        String::new()
    };
    format!("element {map} {{ {}{more} }}", keys.join(", "))
}

/// How many commands of the last transaction [`NftDatapath::last_transaction`]
/// keeps: those the batch keeps a description of.
pub const LAST_TRANSACTION_KEPT: usize = batch::COMMANDS_DESCRIBED;

/// A change of at least [`REFILL_AT`] services that is also at least one
/// [`REFILL_SHARE`]th of the state (every pod rotated, a namespace's worth
/// of services replaced) is programmed by refilling the table: one
/// transaction of the new state is smaller and quicker than one deleting
/// and adding that much. A partial sync holds each changed element twice
/// (deleted and added) before it is encoded, the refill streams the state
/// into the batch: at 50k services / 250k endpoints a partial sync of
/// every service peaked at 464 MiB, the refill at 271 MiB.
const REFILL_AT: usize = 4_096;
const REFILL_SHARE: usize = 8;

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

/// The nftables datapath of a running daemon. A clone is what a drift
/// check running beside the applies compares with.
#[derive(Clone, Debug)]
pub struct NftDatapath {
    metrics: Option<NftMetrics>,
    cluster_cidrs: Vec<Cidr>,
    /// `--masquerade-all`: every connection to a ClusterIP is masqueraded.
    masquerade_all: bool,
    /// The frontends a service claims but did not own when it was last
    /// programmed (only services that lost one). With the state last
    /// programmed, they give back exactly what a service has in the
    /// table, so nothing else per service is kept.
    unowned: HashMap<ObjectKey, Vec<Frontend>>,
    /// Elements per family and map after the last sync.
    map_counts: HashMap<(Family, &'static str), usize>,
    /// How many services DNAT to an address (its `hairpin` element lives
    /// while this is above 0).
    hairpin_refs: hairpin::HairpinRefs,
    /// `--nodeport-addresses` (empty: every local address).
    nodeport_addresses: Vec<Cidr>,
    /// The endpoint counts the pick chains have rules for, per family.
    pick_counts: HashMap<Family, BTreeSet<u32>>,
    /// The slot lists as programmed of the services with a frontend of
    /// at least [`STABLE_SLOTS`] endpoints that changed since the last
    /// full sync (their slots are not in address order). Every other
    /// service's slots are in address order, built again from the state.
    slot_orders: HashMap<(ObjectKey, Family), Vec<SlotList>>,
    /// The commands of the last transaction per family (the first
    /// [`LAST_TRANSACTION_KEPT`]) and their number.
    last_transaction: HashMap<Family, (usize, Vec<String>)>,
    /// Why this datapath runs (the requested mode, auto's fallback
    /// reason): kept in the table for `dump`.
    note: String,
    /// Whether the last full sync put the `ct state invalid drop` rule in
    /// `filter-forward` (the kernel was not liberal about TCP windows).
    drop_invalid: bool,
}

impl NftDatapath {
    /// Checks that nf_tables answers; nothing is programmed until the
    /// first apply.
    pub fn open(cluster_cidrs: Vec<Cidr>) -> Result<Self, NftError> {
        batch::list_objects(Family::V4.nfproto_u8(), TABLE).map_err(|e| {
            let hint = match e.raw_os_error() {
                Some(libc::EPERM) => {
                    " (missing capabilities CAP_NET_ADMIN: the nftables datapath needs it)"
                }
                _ => "",
            };
            NftError::Exec(format!("nf_tables over netlink: {e}{hint}"))
        })?;
        tracing::info!(table = TABLE, "nftables datapath ready");
        Ok(NftDatapath {
            metrics: None,
            cluster_cidrs,
            masquerade_all: false,
            unowned: HashMap::new(),
            map_counts: HashMap::new(),
            hairpin_refs: hairpin::HairpinRefs::default(),
            note: "proxy-mode nftables".to_owned(),
            nodeport_addresses: Vec::new(),
            pick_counts: HashMap::new(),
            slot_orders: HashMap::new(),
            last_transaction: HashMap::new(),
            drop_invalid: true,
        })
    }

    /// Masquerade every connection to a ClusterIP (kube-proxy's
    /// `--masquerade-all`), not only those from outside `--cluster-cidr`.
    pub fn with_masquerade_all(mut self, all: bool) -> Self {
        self.masquerade_all = all;
        self
    }

    /// Node ports answer only on local addresses inside `cidrs`.
    pub fn with_nodeport_addresses(mut self, cidrs: Vec<Cidr>) -> Self {
        self.nodeport_addresses = cidrs;
        self
    }

    /// What the last transaction sent for family `f` did: its number of
    /// commands and the first [`LAST_TRANSACTION_KEPT`] of them as
    /// `add rule …`, `delete element endpoints { … }`.
    pub fn last_transaction(&self, f: Family) -> Option<&(usize, Vec<String>)> {
        self.last_transaction.get(&f)
    }

    /// Sends `b`, keeping what it did.
    fn send(&mut self, f: Family, b: Batch) -> Result<(), NftError> {
        let kept = b.descriptions().take(LAST_TRANSACTION_KEPT);
        self.last_transaction
            .insert(f, (b.len(), kept.map(str::to_owned).collect()));
        commit(f, b)
    }

    /// Records why nftables runs; `dump` shows it from the table.
    pub fn with_note(mut self, note: String) -> Self {
        self.note = note;
        self
    }

    /// Refills the family's table with `next` in one transaction.
    ///
    /// The table is flushed and refilled, not deleted, so the affinity
    /// entries a restarted daemon can keep survive. When the kernel refuses
    /// that (a table left by another version with objects of the same name
    /// but another type), the table is deleted and re-created in one
    /// transaction instead: still no moment without rules.
    fn full_sync(&mut self, f: Family, next: &LocalState, claims: &Claims) -> Result<(), NftError> {
        match self.fill(f, next, claims, false) {
            Err(NftError::Rejected { reason, .. }) => {
                tracing::warn!(family = f.nft(), %reason, "refilling the nftables table in place was refused; re-creating it");
                self.fill(f, next, claims, true)
            }
            other => other,
        }
    }

    /// The objects of `se` in family `f`, without the map elements of
    /// frontends another service owns; and those frontends.
    fn owned_objects(
        &self,
        se: &ServiceEndpoints,
        f: Family,
        claims: &Claims,
    ) -> (ServiceObjects, Vec<Frontend>) {
        let mut objs = rules::service_objects(se, f, &self.cluster_cidrs, self.masquerade_all);
        let mut lost = Vec::new();
        let mut owned = |fr: Option<Frontend>| match fr {
            Some(fr) if !claims.owns(&se.service.key, &fr) => {
                if !lost.contains(&fr) {
                    lost.push(fr);
                }
                false
            }
            _ => true,
        };
        objs.elements.retain(|ek, _| owned(element_frontend(ek)));
        objs.slots.retain(|l| owned(key_frontend(&l.frontend)));
        (objs, lost)
    }

    /// Puts the slot lists of `key` as programmed in `objs` when they are
    /// not in address order (see [`NftDatapath::slot_orders`]).
    fn programmed_slots(&self, key: &ObjectKey, f: Family, objs: &mut ServiceObjects) {
        if self.slot_orders.is_empty() {
            return;
        }
        if let Some(lists) = self.slot_orders.get(&(key.clone(), f)) {
            objs.slots = lists.clone();
        }
    }

    /// What the service `key` of `prev` (the state last programmed) has in
    /// family `f`: its objects built again, without the frontends it did
    /// not own then.
    fn programmed_objects(&self, prev: &LocalState, key: &ObjectKey, f: Family) -> ServiceObjects {
        let Some(se) = prev.service(key) else {
            return ServiceObjects::default();
        };
        let mut objs = rules::service_objects(se, f, &self.cluster_cidrs, self.masquerade_all);
        if let Some(lost) = self.unowned.get(key) {
            objs.elements
                .retain(|ek, _| element_frontend(ek).is_none_or(|fr| !lost.contains(&fr)));
            objs.slots
                .retain(|l| key_frontend(&l.frontend).is_none_or(|fr| !lost.contains(&fr)));
        }
        self.programmed_slots(key, f, &mut objs);
        objs
    }

    /// Adds `lost` to the frontends `key` does not own.
    fn note_unowned(&mut self, key: &ObjectKey, lost: Vec<Frontend>) {
        if lost.is_empty() {
            return;
        }
        let known = self.unowned.entry(key.clone()).or_default();
        for fr in lost {
            if !known.contains(&fr) {
                known.push(fr);
            }
        }
    }
}

impl Datapath for NftDatapath {
    fn mode(&self) -> ProxyMode {
        ProxyMode::Nftables
    }

    fn map_entries(&self) -> Vec<(&'static str, usize)> {
        let mut counts: BTreeMap<&'static str, usize> =
            rules::BASE_SETS.iter().map(|m| (*m, 0)).collect();
        for ((_, map), n) in &self.map_counts {
            *counts.entry(map).or_default() += n;
        }
        *counts.entry(rules::HAIRPIN).or_default() = self.hairpin_refs.len();
        counts.into_iter().collect()
    }

    fn register_metrics(
        &mut self,
        registry: &prometheus::Registry,
    ) -> Result<(), prometheus::Error> {
        self.metrics = Some(NftMetrics::register(registry)?);
        Ok(())
    }

    /// A full sync refills both tables from scratch, so it repairs
    /// whatever [`drift::verify`] finds.
    fn verify(
        &mut self,
        programmed: &LocalState,
        claims: &Claims,
    ) -> Result<Vec<Drift>, DatapathError> {
        Ok(drift::verify(self, programmed, claims)?)
    }

    /// The check owns a clone of this datapath's record (pick counts,
    /// hairpin references, lost frontends) taken with `programmed`, so
    /// the applies that follow do not change what it compares with.
    fn drift_check(&self, programmed: Arc<LocalState>, claims: Claims) -> Option<DriftCheck> {
        let dp = self.clone();
        Some(Box::new(move || {
            Ok(drift::verify(&dp, &programmed, &claims)?)
        }))
    }

    fn dump(_: &DatapathConfig) -> Result<Option<Dump>, DatapathError> {
        if !is_programmed() {
            return Ok(None);
        }
        Ok(Some(Dump::Nftables(dump_tables()?)))
    }

    fn cleanup(_: &DatapathConfig) -> Result<Vec<String>, DatapathError> {
        Ok(vec![match cleanup() {
            Ok(removed) if removed.is_empty() => "nftables: no ebpf-kube-proxy table".to_owned(),
            Ok(removed) => format!(
                "nftables: removed table ebpf-kube-proxy ({})",
                removed.join(", ")
            ),
            // No nf_tables in this kernel: nothing of ours can be there.
            Err(e) => format!("nftables: skipped ({e})"),
        }])
    }

    fn program_all(
        &mut self,
        next: &LocalState,
        claims: &Claims,
    ) -> Result<ApplyStats, DatapathError> {
        let started = Instant::now();
        // Refilled by the sync; on a failure the next apply is full again.
        self.unowned.clear();
        // A full sync writes every list in address order.
        self.slot_orders.clear();
        self.drop_invalid = !conntrack::tcp_be_liberal();
        for f in Family::ALL {
            let synced = self.full_sync(f, next, claims);
            self.count_failure(f, &synced);
            synced?;
        }
        // A full sync (start-up, or after a failure) does not know what
        // the kernel's conntrack table holds: every UDP service is checked.
        conntrack::run(&conntrack::plan_startup(next));
        tracing::debug!(services = next.services.len(), elapsed = ?started.elapsed(), "nftables full sync");
        Ok(ApplyStats {
            services_changed: next.services.len(),
        })
    }

    /// Only the changed services, in one transaction per family; when they
    /// are many (see [`REFILL_AT`]), a full sync instead.
    fn program_changes(
        &mut self,
        prev: &LocalState,
        next: &LocalState,
        changed: &[ServiceChange<'_>],
        claims: &Claims,
    ) -> Result<ApplyStats, DatapathError> {
        if changed.len() >= REFILL_AT && changed.len() * REFILL_SHARE >= next.services.len() {
            tracing::debug!(
                services_changed = changed.len(),
                "many services changed: refilling the table instead"
            );
            return self.program_all(next, claims);
        }
        let started = Instant::now();
        let mut lost: HashMap<ObjectKey, Vec<Frontend>> = HashMap::new();
        for f in Family::ALL {
            let synced = self.partial_sync(f, prev, changed, claims);
            self.count_failure(f, &synced);
            for (key, frontends) in synced? {
                lost.entry(key).or_default().extend(frontends);
            }
        }
        // Both families took the change: the record follows it.
        for (key, frontends) in lost {
            self.unowned.remove(&key);
            self.note_unowned(&key, frontends);
        }
        let flushes: Vec<conntrack::Flush> = changed
            .iter()
            .flat_map(|c| conntrack::plan(prev.service(c.key), c.next))
            .collect();
        conntrack::run(&flushes);
        tracing::debug!(services_changed = changed.len(), elapsed = ?started.elapsed(), "nftables partial sync");
        Ok(ApplyStats {
            services_changed: changed.len(),
        })
    }
}

impl NftDatapath {
    /// `kubeproxy_sync_proxy_rules_nftables_sync_failures_total`.
    fn count_failure<T>(&self, f: Family, synced: &Result<T, NftError>) {
        if let (Err(_), Some(m)) = (synced, &self.metrics) {
            m.sync_failures.with_label_values(&[f.label()]).inc();
        }
    }
}

/// Runs `nft` with `args` inside the current network namespace, returning
/// stdout.
pub fn nft_output(args: &[&str]) -> Result<Option<String>, NftError> {
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
    Family::ALL.iter().any(|f| has_table(*f).unwrap_or(false))
}

fn has_table(f: Family) -> Result<bool, NftError> {
    batch::list_tables(f.nfproto_u8())
        .map(|tables| tables.iter().any(|t| t == TABLE))
        .map_err(|e| NftError::Exec(format!("listing nf_tables tables: {e}")))
}

/// Deletes both tables (over netlink: no `nft` needed); returns the
/// families whose table was there.
pub fn cleanup() -> Result<Vec<&'static str>, NftError> {
    let mut removed = Vec::new();
    for f in Family::ALL {
        if has_table(f)? {
            let mut b = Batch::new();
            b.delete_table(f.nfproto_u8(), TABLE);
            commit(f, b)?;
            removed.push(f.nft());
        }
    }
    Ok(removed)
}
