//! Drift in the nftables datapath: each family's table read back over
//! netlink (chains with their rule counts, sets and maps, the elements of
//! the maps, the endpoints by frontend and the hairpin set) against what the
//! datapath programmed.
//!
//! Rules are compared by count, not by content (a flushed chain, a
//! deleted or an added rule all change the count), in every chain, from
//! the chain dump alone: the kernel reports each chain's use count
//! (`NFTA_CHAIN_USE`: its rules plus the jumps and gotos to it from rules
//! and verdict map elements), and what was programmed says what each
//! should be ([`Uses`]). Only a chain whose use count differs has its
//! rules dumped and counted, to tell a rule added or removed from a
//! reference: dumping every rule of a table at 10,000 services takes the
//! kernel seconds. The elements of affinity sets are the kernel's own
//! (the rules add them), so only the sets themselves are compared.
//!
//! What was programmed is built again from the state last applied, one
//! service at a time; no copy of the table is kept between checks. Map
//! elements are compared as a [`Digest`] per map first, and listed on
//! both sides only for the maps whose digests differ: a clean check at
//! 50,000 services holds neither side's 600,000 elements.
//!
//! [`compare`] is pure; [`read`] does the netlink dumps.

use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::batch::{self, Family, NFT_GOTO, NFT_JUMP, NFT_RETURN, NF_ACCEPT, NF_DROP};
use super::expr::{key_bytes, key_text, KeyPart, Rule, Stmt, Verdict};
use super::nlsock::{attr_str, attrs, Attrs, Socket};
use super::rules::{self, ElementValue, TABLE};
use super::{has_table, NftDatapath, NftError};
use crate::datapath::drift::{Drift, DriftKind, ABSENT};
use crate::model::claims::Claims;
use crate::model::LocalState;

// enum nf_tables_msg_types
const GETCHAIN: u16 = 4;
const GETRULE: u16 = 7;
const GETSET: u16 = 10;
// enum nft_chain_attributes
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_USE: u16 = 6;
const GETSETELEM: u16 = 13;

/// An element's data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ElementData {
    /// A plain set's element.
    Set,
    /// A verdict map's: verdict code and chain.
    Verdict(i32, Option<String>),
    /// A data map's value bytes.
    Value(Vec<u8>),
}

/// An element's identity: its set or map (one of [`rules::BASE_SETS`])
/// and its key bytes.
pub type ElementKey = (&'static str, Vec<u8>);

/// What one family's table holds, as far as the check compares it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableContents {
    /// Chain name → number of rules, where counted (every chain on the
    /// programmed side; on the kernel's, the chains whose use count
    /// differs, see [`count_rules`]).
    pub chains: HashMap<String, Option<usize>>,
    /// Chain name → use count (`NFTA_CHAIN_USE`): rules plus references.
    pub uses: Uses,
    /// Set or map name → timeout in milliseconds (0: none).
    pub sets: HashMap<String, u64>,
    /// The elements of the sets of [`rules::BASE_SETS`].
    pub elements: HashMap<ElementKey, ElementData>,
}

/// What the datapath programmed in one family, with the service each
/// map element belongs to.
#[derive(Clone, Debug, Default)]
pub struct Expected {
    pub contents: TableContents,
    pub owners: HashMap<ElementKey, String>,
}

/// Chain name → use count: the kernel's `NFTA_CHAIN_USE`, which counts a
/// chain's rules and every jump or goto to it (from a rule or a verdict
/// map element).
pub type Uses = HashMap<String, u32>;

/// The chains every table has: the hooked and helper chains.
pub fn table_chains() -> impl Iterator<Item = &'static str> {
    rules::BASE_CHAINS
        .iter()
        .map(|c| c.0)
        .chain(rules::HELPER_CHAINS)
        .chain([rules::INFO_CHAIN])
}

/// Adds a reference to the chain a jump or goto names.
fn refer(uses: &mut Uses, v: &Verdict) {
    if let Verdict::Jump(c) | Verdict::Goto(c) = v {
        *uses.entry(c.clone()).or_default() += 1;
    }
}

/// Adds `rule` to `chain`'s use count and its jumps to their targets'.
fn count_rule(c: &mut TableContents, chain: &str, rule: &Rule) {
    if let Some(n) = c.chains.entry(chain.to_owned()).or_insert(Some(0)) {
        *n += 1;
    }
    *c.uses.entry(chain.to_owned()).or_default() += 1;
    for stmt in &rule.stmts {
        if let Stmt::Verdict(v) = stmt {
            refer(&mut c.uses, v);
        }
    }
}

/// The elements of one set, summed up: how many, and the wrapping sum of
/// their hashes (order-free). Equal digests on both sides mean equal
/// sets, short of a 64-bit collision; only sets whose digests differ are
/// read and compared element by element, so a clean check holds no copy
/// of the table's elements on either side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Digest {
    pub count: usize,
    pub sum: u64,
}

impl Digest {
    fn add(&mut self, key: &[u8], data: DataRef<'_>) {
        let mut h = std::hash::DefaultHasher::new();
        key.hash(&mut h);
        data.hash(&mut h);
        self.count += 1;
        self.sum = self.sum.wrapping_add(h.finish());
    }
}

/// An element's data, borrowed: what a [`Digest`] hashes.
#[derive(Hash)]
enum DataRef<'a> {
    Set,
    Verdict(i32, Option<&'a str>),
    Value(&'a [u8]),
}

impl ElementData {
    fn as_ref(&self) -> DataRef<'_> {
        match self {
            ElementData::Set => DataRef::Set,
            ElementData::Verdict(code, chain) => DataRef::Verdict(*code, chain.as_deref()),
            ElementData::Value(v) => DataRef::Value(v),
        }
    }
}

/// The digest of every set of [`rules::BASE_SETS`].
pub type Digests = HashMap<&'static str, Digest>;

/// What `dp` programmed in family `f`, given the state it last
/// programmed and its claims: every service's objects built again, one
/// at a time. The elements of the sets `detail` names are listed (with
/// the service each belongs to); every set's are summed up in the
/// digests.
pub fn expected(
    dp: &NftDatapath,
    state: &LocalState,
    claims: &Claims,
    f: Family,
    detail: &BTreeSet<&str>,
) -> (Expected, Digests) {
    let mut c = TableContents::default();
    for name in table_chains() {
        c.chains.insert(name.to_owned(), Some(0));
        c.uses.insert(name.to_owned(), 0);
    }
    let counts = dp.pick_counts.get(&f).cloned().unwrap_or_default();
    let base = rules::base_rules(f, &dp.nodeport_addresses, dp.drop_invalid);
    for (chain, rule) in base.into_iter().chain(rules::pick_rules(&counts)) {
        count_rule(&mut c, chain, &rule);
    }
    c.sets = rules::BASE_SETS
        .iter()
        .map(|s| ((*s).to_owned(), 0))
        .collect();
    let mut digests: Digests = rules::BASE_SETS
        .iter()
        .map(|s| (*s, Digest::default()))
        .collect();
    let mut owners = HashMap::new();
    for se in &state.services {
        let (mut objs, _) = dp.owned_objects(se, f, claims);
        dp.programmed_slots(&se.service.key, f, &mut objs);
        let slot_elements: Vec<_> = objs.slots.iter().flat_map(|l| l.elements()).collect();
        objs.elements.extend(slot_elements);
        for (name, rules) in objs.chains {
            c.chains.insert(name.clone(), Some(0));
            c.uses.entry(name.clone()).or_default();
            for rule in &rules {
                count_rule(&mut c, &name, rule);
            }
        }
        for (name, secs) in objs.sets {
            c.sets.insert(name, u64::from(secs) * 1000);
        }
        for ((map, key), value) in &objs.elements {
            if let ElementValue::Verdict(v) = value {
                refer(&mut c.uses, v);
            }
            let k = key_bytes(key);
            let data = element_data(value);
            digests.entry(map).or_default().add(&k, data.as_ref());
            if detail.contains(map) {
                c.elements.insert((*map, k.clone()), data);
                owners.insert((*map, k), se.service.key.to_string());
            }
        }
    }
    for ip in dp.hairpin_refs.addrs(f) {
        let key = key_bytes(&[KeyPart::Addr(ip), KeyPart::Addr(ip)]);
        digests
            .entry(rules::HAIRPIN)
            .or_default()
            .add(&key, DataRef::Set);
        if detail.contains(rules::HAIRPIN) {
            c.elements.insert((rules::HAIRPIN, key), ElementData::Set);
        }
    }
    (
        Expected {
            contents: c,
            owners,
        },
        digests,
    )
}

fn element_data(value: &ElementValue) -> ElementData {
    match value {
        ElementValue::Verdict(v) => {
            let (code, chain) = v.code();
            ElementData::Verdict(code, chain.map(str::to_owned))
        }
        ElementValue::Data(parts) => ElementData::Value(key_bytes(parts)),
    }
}

/// Every difference in both families of `dp`'s tables, given the state
/// it last programmed and its claims. The elements are compared by
/// [`Digest`] first; only the sets that differ are listed on both sides.
pub fn verify(
    dp: &NftDatapath,
    state: &LocalState,
    claims: &Claims,
) -> Result<Vec<Drift>, NftError> {
    let mut out = Vec::new();
    let none = BTreeSet::new();
    for f in Family::ALL {
        let Some((mut found, found_digests)) = read(f, &none)? else {
            out.extend(compare(f, &Expected::default(), None));
            continue;
        };
        let (mut expected, digests) = expected(dp, state, claims, f, &none);
        let differing: BTreeSet<&str> = rules::BASE_SETS
            .into_iter()
            .filter(|s| found.sets.contains_key(*s))
            .filter(|s| found_digests.get(s) != digests.get(s))
            .collect();
        if !differing.is_empty() {
            drop((found, expected));
            let Some((again, _)) = read(f, &differing)? else {
                out.extend(compare(f, &Expected::default(), None));
                continue;
            };
            found = again;
            expected = self::expected(dp, state, claims, f, &differing).0;
        }
        count_rules(f, &expected.contents, &mut found)?;
        out.extend(compare(f, &expected, Some(&found)));
    }
    Ok(out)
}

/// The chains of `found` whose use count is not the one `expected`
/// holds, with their rules counted in `found`; the other chains' rules
/// are not read. How many chains were read.
pub fn count_rules(
    f: Family,
    expected: &TableContents,
    found: &mut TableContents,
) -> Result<usize, NftError> {
    let mut suspects: Vec<String> = found
        .uses
        .iter()
        .filter(|(name, used)| expected.uses.get(*name).is_some_and(|want| want != *used))
        .map(|(name, _)| name.clone())
        .collect();
    if suspects.is_empty() {
        return Ok(0);
    }
    suspects.sort_unstable();
    let fam = f.nfproto_u8();
    let err = |what: &str, e: io::Error| {
        NftError::Exec(format!(
            "reading back the rules of {} {TABLE} {what}: {e}",
            f.nft()
        ))
    };
    let sock = Socket::open().map_err(|e| err("(netlink socket)", e))?;
    for chain in &suspects {
        let mut n = 0;
        let mut filter = Attrs::default();
        filter.str(1, TABLE).str(2, chain);
        sock.dump_filtered(GETRULE, fam, &filter.buf, |a| {
            n += usize::from(rule_chain(a).is_some_and(|c| c == *chain));
        })
        .map_err(|e| err(chain, e))?;
        found.chains.insert(chain.clone(), Some(n));
    }
    tracing::debug!(
        family = %f.nft(),
        chains = suspects.len(),
        "nftables drift check: rules counted where the use count differs"
    );
    Ok(suspects.len())
}

/// A chain of `table` in one object of a `GETCHAIN` dump, with its use
/// count.
fn chain_use(attributes: &[u8], table: &str) -> Option<(String, u32)> {
    let a = attrs(attributes);
    let get = |kind: u16| a.iter().find(|(k, _)| *k == kind).map(|(_, v)| *v);
    let t = get(NFTA_CHAIN_TABLE).map(attr_str)?;
    let name = get(NFTA_CHAIN_NAME).map(attr_str)?;
    let used = get(NFTA_CHAIN_USE)
        .and_then(|v| <[u8; 4]>::try_from(v).ok())
        .map_or(0, u32::from_be_bytes);
    (t == table).then_some((name, used))
}

/// The table of family `f` as the kernel holds it, with the elements of
/// the sets `detail` names, and the digest of every set of
/// [`rules::BASE_SETS`]; `None` when absent.
pub fn read(
    f: Family,
    detail: &BTreeSet<&str>,
) -> Result<Option<(TableContents, Digests)>, NftError> {
    let fam = f.nfproto_u8();
    let err = |what: &str, e: io::Error| {
        NftError::Exec(format!(
            "reading back table {} {TABLE}: {what}: {e}",
            f.nft()
        ))
    };
    if !has_table(f)? {
        return Ok(None);
    }
    let sock = Socket::open().map_err(|e| err("netlink socket", e))?;
    let mut c = TableContents::default();
    sock.dump(GETCHAIN, fam, |a| {
        if let Some((name, used)) = chain_use(a, TABLE) {
            c.chains.insert(name.clone(), None);
            c.uses.insert(name, used);
        }
    })
    .map_err(|e| err("chains", e))?;
    sock.dump(GETSET, fam, |a| {
        if let Some(s) = batch::set_of(a, TABLE) {
            c.sets.insert(s.name, s.timeout_ms);
        }
    })
    .map_err(|e| err("sets", e))?;
    let mut digests = Digests::new();
    for set in rules::BASE_SETS {
        if !c.sets.contains_key(set) {
            continue;
        }
        let digest = digests.entry(set).or_default();
        let listed = detail.contains(set);
        let mut filter = Attrs::default();
        filter.str(1, TABLE).str(2, set);
        sock.dump_filtered(GETSETELEM, fam, &filter.buf, |a| {
            for (key, data) in elements_of(a) {
                digest.add(&key, data.as_ref());
                if listed {
                    c.elements.insert((set, key), data);
                }
            }
        })
        .map_err(|e| err(set, e))?;
    }
    Ok(Some((c, digests)))
}

/// The chain of one object of a `GETRULE` dump of our table.
fn rule_chain(attributes: &[u8]) -> Option<String> {
    let a = attrs(attributes);
    let table = a.iter().find(|(k, _)| *k == 1).map(|(_, v)| attr_str(v))?;
    let chain = a.iter().find(|(k, _)| *k == 2).map(|(_, v)| attr_str(v))?;
    (table == TABLE).then_some(chain)
}

fn nested(buf: &[u8], kind: u16) -> Option<&[u8]> {
    attrs(buf)
        .into_iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, v)| v)
}

/// The elements in one object of a `GETSETELEM` dump: key bytes and data.
pub fn elements_of(attributes: &[u8]) -> Vec<(Vec<u8>, ElementData)> {
    let Some(list) = nested(attributes, 3) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (kind, elem) in attrs(list) {
        if kind != 1 {
            continue;
        }
        let Some(key) = nested(elem, 1).and_then(|k| nested(k, 1)) else {
            continue;
        };
        let data = match nested(elem, 2) {
            None => ElementData::Set,
            Some(d) => match (nested(d, 2), nested(d, 1)) {
                (Some(v), _) => {
                    let code = nested(v, 1)
                        .and_then(|c| <[u8; 4]>::try_from(c).ok())
                        .map(i32::from_be_bytes)
                        .unwrap_or(i32::MIN);
                    ElementData::Verdict(code, nested(v, 2).map(attr_str))
                }
                (None, Some(value)) => ElementData::Value(value.to_vec()),
                (None, None) => ElementData::Set,
            },
        };
        out.push((key.to_vec(), data));
    }
    out
}

/// The kinds of the parts of a key or a data value.
#[derive(Clone, Copy)]
enum Part {
    Addr,
    Proto,
    Port,
    Mark,
}

fn key_shape(set: &str) -> &'static [Part] {
    use Part::*;
    match set {
        rules::SERVICE_IPS
        | rules::NO_ENDPOINT_SERVICES
        | rules::INTERNAL_COUNTS
        | rules::EXTERNAL_COUNTS => &[Addr, Proto, Port],
        rules::SERVICE_NODEPORTS
        | rules::NO_ENDPOINT_NODEPORTS
        | rules::INTERNAL_NODEPORT_COUNTS
        | rules::EXTERNAL_NODEPORT_COUNTS => &[Proto, Port],
        rules::INTERNAL_ENDPOINTS | rules::EXTERNAL_ENDPOINTS => &[Addr, Proto, Port, Mark],
        rules::INTERNAL_NODEPORT_ENDPOINTS | rules::EXTERNAL_NODEPORT_ENDPOINTS => {
            &[Proto, Port, Mark]
        }
        rules::HAIRPIN => &[Addr, Addr],
        _ => &[],
    }
}

fn data_shape(set: &str) -> &'static [Part] {
    if rules::PICKS.iter().any(|p| p.3 == set) {
        &[Part::Addr, Part::Port]
    } else {
        &[Part::Mark]
    }
}

/// `bytes` read as `shape` in family `f`, as `nft` prints it; the bytes
/// in hex when they do not have that shape.
fn display(f: Family, shape: &[Part], bytes: &[u8]) -> String {
    let mut parts = Vec::new();
    let mut at = 0;
    for part in shape {
        let len = match part {
            Part::Addr => f.addr_len() as usize,
            Part::Proto => 1,
            Part::Port => 2,
            Part::Mark => 4,
        };
        let Some(b) = bytes.get(at..at + len) else {
            break;
        };
        parts.push(match (part, b) {
            (Part::Proto, [p]) => KeyPart::Proto(*p),
            (Part::Port, [hi, lo]) => KeyPart::Port(u16::from_be_bytes([*hi, *lo])),
            (Part::Mark, [a, b, c, d]) => KeyPart::Mark(u32::from_ne_bytes([*a, *b, *c, *d])),
            (Part::Addr, [a, b, c, d]) => KeyPart::Addr(IpAddr::V4(Ipv4Addr::new(*a, *b, *c, *d))),
            (_, b) => match <[u8; 16]>::try_from(b) {
                Ok(o) => KeyPart::Addr(IpAddr::V6(Ipv6Addr::from(o))),
                Err(_) => break,
            },
        });
        // Every part of a concatenation takes whole 4-byte registers.
        at += len.next_multiple_of(4);
    }
    if shape.is_empty() || parts.len() != shape.len() || at != bytes.len() {
        return bytes.iter().map(|b| format!("{b:02x}")).collect();
    }
    key_text(&parts)
}

/// A key as `nft` prints it, from its bytes in `set` of family `f`.
pub fn key_display(f: Family, set: &str, bytes: &[u8]) -> String {
    display(f, key_shape(set), bytes)
}

/// An element's data in `set` of family `f`, as `nft` prints it.
pub fn data_display(f: Family, set: &str, d: &ElementData) -> String {
    let (code, chain) = match d {
        ElementData::Set => return "present".to_owned(),
        ElementData::Value(bytes) => return display(f, data_shape(set), bytes),
        ElementData::Verdict(code, chain) => (code, chain),
    };
    let chain = chain.as_deref().unwrap_or("?");
    match *code {
        NF_ACCEPT => "accept".to_owned(),
        NF_DROP => "drop".to_owned(),
        NFT_RETURN => "return".to_owned(),
        NFT_JUMP => format!("jump {chain}"),
        NFT_GOTO => format!("goto {chain}"),
        other => format!("verdict {other}"),
    }
}

fn chain_text(n: Option<&Option<usize>>) -> String {
    match n {
        None => ABSENT.to_owned(),
        Some(Some(n)) => format!("chain, {n} rules"),
        Some(None) => "chain".to_owned(),
    }
}

fn timeout_text(ms: u64) -> String {
    if ms == 0 {
        "no timeout".to_owned()
    } else {
        format!("timeout {}s", ms / 1000)
    }
}

/// The keys whose values differ between `a` and `b` (absent on one side
/// included), sorted: one lookup per entry, no union built.
fn differing<'a, K: Ord + Hash + Eq, V: PartialEq>(
    a: &'a HashMap<K, V>,
    b: &'a HashMap<K, V>,
) -> Vec<&'a K> {
    let mut out: Vec<&K> = a
        .iter()
        .filter(|(k, v)| b.get(*k) != Some(*v))
        .map(|(k, _)| k)
        .collect();
    out.extend(b.keys().filter(|k| !a.contains_key(*k)));
    out.sort_unstable();
    out
}

/// Every difference in family `f` between what was programmed and what
/// the kernel holds (`None`: no table). A missing chain or set is one
/// difference, not one per rule or element in it.
pub fn compare(f: Family, expected: &Expected, found: Option<&TableContents>) -> Vec<Drift> {
    let object = |name: &str| format!("{} {TABLE} {name}", f.nft());
    let Some(found) = found else {
        return vec![Drift::new(
            DriftKind::Table,
            format!("{} {TABLE}", f.nft()),
            "",
            "present",
            ABSENT,
        )];
    };
    let e = &expected.contents;
    let mut out = Vec::new();
    // The table's own chains first, then the services': a flushed table
    // at many services still names its hooked chains in the lines logged.
    let mut chains = differing(&e.chains, &found.chains);
    chains.sort_by_key(|name| rules::service_of(name).is_some());
    for name in chains {
        let (kind, want, got) = match (e.chains.get(name), found.chains.get(name)) {
            // Rules are compared where both sides counted them.
            (Some(Some(a)), Some(Some(b))) => {
                (DriftKind::Rules, format!("{a} rules"), format!("{b} rules"))
            }
            (Some(_), Some(_)) => continue,
            (a, b) => (DriftKind::Chain, chain_text(a), chain_text(b)),
        };
        out.push(
            Drift::new(kind, object(name), "", want, got).for_service(rules::service_of(name)),
        );
    }
    for name in differing(&e.sets, &found.sets) {
        let text = |t: Option<&u64>| t.map_or_else(|| ABSENT.to_owned(), |ms| timeout_text(*ms));
        out.push(
            Drift::new(
                DriftKind::Set,
                object(name),
                "",
                text(e.sets.get(name)),
                text(found.sets.get(name)),
            )
            .for_service(rules::service_of(name)),
        );
    }
    // Elements only where the set is in both: a missing set is reported
    // above, and an unexpected one is not ours to read.
    let comparable = |set: &str| e.sets.contains_key(set) && found.sets.contains_key(set);
    for k in differing(&e.elements, &found.elements) {
        let (set, bytes) = k;
        if !comparable(set) {
            continue;
        }
        let (a, b) = (e.elements.get(k), found.elements.get(k));
        let service = expected.owners.get(k).cloned().or_else(|| match b {
            Some(ElementData::Verdict(_, Some(chain))) => rules::service_of(chain),
            _ => None,
        });
        let text = |d: Option<&ElementData>| {
            d.map_or_else(|| ABSENT.to_owned(), |d| data_display(f, set, d))
        };
        out.push(
            Drift::new(
                DriftKind::Element,
                object(set),
                key_display(f, set, bytes),
                text(a),
                text(b),
            )
            .for_service(service),
        );
    }
    out
}

#[cfg(test)]
#[path = "drift_tests.rs"]
mod tests;
