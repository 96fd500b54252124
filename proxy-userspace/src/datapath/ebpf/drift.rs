//! Drift in the eBPF datapath: the service and backend maps as read back
//! from the kernel against the writer's view of what it wrote
//! ([`Programmed`]), and the programs' link pins.
//!
//! The eBPF programs never write `EKP_SERVICES` or `EKP_BACKENDS` (only
//! reverse NAT, affinity and counters, which are not compared), so any
//! difference there was made by someone else. A link pin is the only
//! reference that keeps a program attached: a missing pin is a detached
//! program.
//!
//! [`compare`] is pure; reading the maps is [`super::maps::KernelMaps`].

use std::cell::OnceCell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use proxy_common::{MAP_BACKENDS, MAP_SERVICES};

use super::codec::{BackendAddr, Header, Vip};
use super::external::{self, NodeIface};
use super::loader::PROGRAMS;
use super::maps::KernelMaps;
use super::pins::LINKS_DIR;
use super::plan::Programmed;
use super::{desired, EbpfError};
use crate::datapath::drift::{Drift, DriftKind, ABSENT};
use crate::model::claims::Claims;
use crate::model::LocalState;

pub mod stale;

/// A link pin per program under `root`; one difference per missing one.
pub fn missing_links(root: &Path) -> Vec<Drift> {
    PROGRAMS
        .iter()
        .filter(|name| !root.join(LINKS_DIR).join(name).exists())
        .map(|name| missing_link(root, name))
        .collect()
}

/// Link pins under `root` whose link no longer attaches its program; one
/// difference each.
pub fn detached_links(root: &Path) -> Vec<Drift> {
    let Ok(dir) = std::fs::read_dir(root.join(LINKS_DIR)) else {
        return Vec::new();
    };
    let mut out: Vec<Drift> = dir
        .flatten()
        .filter(|e| super::linkstate::attached(&e.path()) == Some(false))
        .map(|e| {
            Drift::new(
                DriftKind::Link,
                format!(
                    "{}/{LINKS_DIR}/{}",
                    root.display(),
                    e.file_name().to_string_lossy()
                ),
                "",
                "pinned link (program attached)",
                "pinned link, detached (program not attached)",
            )
        })
        .collect();
    out.sort_by(|a, b| a.object.cmp(&b.object));
    out
}

/// The difference of a missing link pin `name`.
pub fn missing_link(root: &Path, name: &str) -> Drift {
    Drift::new(
        DriftKind::Link,
        format!("{}/{LINKS_DIR}/{name}", root.display()),
        "",
        "pinned link (program attached)",
        "no pin (program detached)",
    )
}

/// What a check found that the next full sync acts on.
#[derive(Debug, Default)]
pub struct Found {
    /// A link pin is missing: attach the programs again.
    pub relink: bool,
    /// The maps as read, when they differ from the view.
    pub view: Option<Programmed>,
    /// `EbpfDatapath::view_gen` when the check started.
    pub view_gen: u64,
}

/// Link pins, then the services and backends maps against `view`: read
/// once in batches without building anything, and a second time into a
/// view only when something differs. `owner` names the service of a VIP.
pub fn check(
    root: &Path,
    ifaces: &[NodeIface],
    maps: &KernelMaps,
    view: &Programmed,
    owner: &dyn Fn(&Vip) -> Option<String>,
) -> Result<(Vec<Drift>, Found), EbpfError> {
    let mut out = missing_links(root);
    out.extend(detached_links(root));
    out.extend(
        external::missing_pins(root, ifaces)
            .into_iter()
            .map(|name| missing_link(root, &name)),
    );
    let mut found = Found {
        relink: !out.is_empty(),
        ..Found::default()
    };
    if maps.matches(view)? {
        return Ok((out, found));
    }
    let read = maps.read_view()?;
    let in_maps = compare(view, &read, owner);
    if !in_maps.is_empty() {
        found.view = Some(read);
    }
    out.extend(in_maps);
    Ok((out, found))
}

/// A drift check away from the applies (see `EbpfDatapath::drift_check`).
pub struct OffPath {
    pub root: PathBuf,
    pub ifaces: Vec<NodeIface>,
    pub node_ips: Vec<IpAddr>,
    pub view: Arc<Programmed>,
    pub view_gen: u64,
    pub found: Arc<Mutex<Option<Found>>>,
}

impl OffPath {
    pub fn run(self, programmed: &LocalState, claims: &Claims) -> Result<Vec<Drift>, EbpfError> {
        let maps = KernelMaps::from_pins(&self.root)?;
        // Who owns a VIP: worked out from the programmed state only when
        // something differs.
        let owners: OnceCell<HashMap<Vip, String>> = OnceCell::new();
        let owner = |vip: &Vip| {
            owners
                .get_or_init(|| {
                    desired::desired_state(programmed, claims, &self.node_ips)
                        .into_iter()
                        .map(|d| (d.vip, d.owner.to_string()))
                        .collect()
                })
                .get(vip)
                .cloned()
        };
        let (mut drifts, mut found) = check(&self.root, &self.ifaces, &maps, &self.view, &owner)?;
        // Stale entries of the maps the programs write, deleted only while
        // no apply has written the view since the check took it (an apply
        // writes a copy of a view a check holds: this one is then the
        // only holder).
        let wanted = || desired::desired_state(programmed, claims, &self.node_ips);
        let live = stale::Live::new(&self.view, &wanted, &owner);
        let view = &self.view;
        drifts.extend(stale::sweep(&self.root, &live, &|| {
            Arc::strong_count(view) > 1
        })?);
        drop(live);
        // Let go of the view before the verdict: an apply then writes it
        // in place again.
        drop(self.view);
        if found.relink || found.view.is_some() {
            found.view_gen = self.view_gen;
            if let Ok(mut slot) = self.found.lock() {
                *slot = Some(found);
            }
        }
        Ok(drifts)
    }
}

fn header_text(h: &Header) -> String {
    let Header {
        count,
        flags,
        affinity_timeout,
        service_id,
    } = h;
    format!("header count={count} flags={flags:#x} affinity_timeout={affinity_timeout} service_id={service_id}")
}

fn slot_text(id: u32, view: &Programmed) -> String {
    match view.backend(id) {
        Some(addr) => format!("backend {id} ({addr})"),
        None => format!("backend {id}"),
    }
}

fn text<T>(v: Option<T>, f: impl FnOnce(T) -> String) -> String {
    v.map(f).unwrap_or_else(|| ABSENT.to_owned())
}

/// Every difference between `expected` (what the writer recorded) and
/// `found` (the maps read back): services by VIP (header, then slots),
/// then backends by id. `owner` names the service of a VIP; it is asked
/// only about VIPs that differ.
pub fn compare(
    expected: &Programmed,
    found: &Programmed,
    owner: &dyn Fn(&Vip) -> Option<String>,
) -> Vec<Drift> {
    let mut out = Vec::new();
    // One lookup per entry; only what differs is sorted.
    let mut vips: Vec<Vip> = expected
        .services()
        .filter(|(vip, s)| found.service(vip) != Some(*s))
        .chain(
            found
                .services()
                .filter(|(vip, _)| expected.service(vip).is_none()),
        )
        .map(|(vip, _)| *vip)
        .collect();
    vips.sort_unstable();
    for vip in &vips {
        let (e, f) = (expected.service(vip), found.service(vip));
        let (eh, fh) = (e.and_then(|s| s.header), f.and_then(|s| s.header));
        if eh != fh {
            out.push(
                Drift::new(
                    DriftKind::MapEntry,
                    MAP_SERVICES,
                    format!("{vip} slot 0"),
                    text(eh.as_ref(), header_text),
                    text(fh.as_ref(), header_text),
                )
                .for_service(owner(vip)),
            );
        }
        let (es, fs) = (
            e.map(|s| s.slots.as_slice()).unwrap_or_default(),
            f.map(|s| s.slots.as_slice()).unwrap_or_default(),
        );
        for i in 0..es.len().max(fs.len()) {
            // 0: no entry in that slot.
            let (a, b) = (
                es.get(i).copied().filter(|id| *id != 0),
                fs.get(i).copied().filter(|id| *id != 0),
            );
            if a != b {
                out.push(
                    Drift::new(
                        DriftKind::MapEntry,
                        MAP_SERVICES,
                        format!("{vip} slot {}", i + 1),
                        text(a, |id| slot_text(id, expected)),
                        text(b, |id| slot_text(id, found)),
                    )
                    .for_service(owner(vip)),
                );
            }
        }
    }
    let mut ids: Vec<u32> = expected
        .backends()
        .filter(|(id, addr)| found.backend(*id) != Some(*addr))
        .chain(
            found
                .backends()
                .filter(|(id, _)| expected.backend(*id).is_none()),
        )
        .map(|(id, _)| id)
        .collect();
    ids.sort_unstable();
    let mut users: Option<HashMap<u32, Vip>> = None;
    for id in ids {
        let (a, b) = (expected.backend(id), found.backend(id));
        // Which service uses it, worked out once and only when needed.
        let users = users.get_or_insert_with(|| backend_users(expected));
        let addr = |x: BackendAddr| x.to_string();
        out.push(
            Drift::new(
                DriftKind::MapEntry,
                MAP_BACKENDS,
                format!("id {id}"),
                text(a, addr),
                text(b, addr),
            )
            .for_service(users.get(&id).and_then(owner)),
        );
    }
    out
}

/// A VIP whose slots use each backend id (the first one, by VIP).
fn backend_users(view: &Programmed) -> HashMap<u32, Vip> {
    let mut out: HashMap<u32, Vip> = HashMap::new();
    for (vip, s) in view.services() {
        for &id in &s.slots {
            let e = out.entry(id).or_insert(*vip);
            if *vip < *e {
                *e = *vip;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use proxy_common::ServiceValue;

    use super::*;

    fn vip(ip: &str) -> Vip {
        Vip {
            ip: ip.parse().unwrap(),
            port: 80,
            proto: 6,
            scope: super::super::codec::Scope::Socket,
        }
    }

    fn backend(ip: &str) -> BackendAddr {
        BackendAddr {
            ip: ip.parse::<IpAddr>().unwrap(),
            port: 8080,
            local: false,
        }
    }

    fn header(count: u32, service_id: u32) -> ServiceValue {
        Header {
            count,
            flags: 0,
            affinity_timeout: 0,
            service_id,
        }
        .value()
    }

    fn slot(backend_id: u32) -> ServiceValue {
        ServiceValue {
            backend_id,
            ..ServiceValue::default()
        }
    }

    type ServiceEntries = Vec<(Vip, u32, ServiceValue)>;
    type BackendEntries = Vec<(u32, BackendAddr)>;

    /// `web` 10.96.0.10 → backends 1, 2; `db` 10.96.0.20 → backend 3.
    fn entries() -> (ServiceEntries, BackendEntries) {
        let (web, db) = (vip("10.96.0.10"), vip("10.96.0.20"));
        (
            vec![
                (web, 0, header(2, 1)),
                (web, 1, slot(1)),
                (web, 2, slot(2)),
                (db, 0, header(1, 2)),
                (db, 1, slot(3)),
            ],
            vec![
                (1, backend("10.244.1.11")),
                (2, backend("10.244.1.12")),
                (3, backend("10.244.1.13")),
            ],
        )
    }

    fn compare(expected: &Programmed, found: &Programmed) -> Vec<Drift> {
        let owners = HashMap::from([
            (vip("10.96.0.10"), "default/web"),
            (vip("10.96.0.20"), "default/db"),
        ]);
        super::compare(expected, found, &|v| owners.get(v).map(|s| s.to_string()))
    }

    fn with(edit: impl FnOnce(&mut ServiceEntries, &mut BackendEntries)) -> Programmed {
        let (mut s, mut b) = entries();
        edit(&mut s, &mut b);
        Programmed::from_entries(s, b)
    }

    fn expected() -> Programmed {
        with(|_, _| {})
    }

    #[test]
    fn maps_as_programmed_have_no_drift() {
        assert_eq!(compare(&expected(), &expected()), vec![]);
    }

    #[test]
    fn a_header_deleted_by_hand_names_the_service_and_what_was_there() {
        let found = with(|s, _| s.retain(|(v, slot, _)| !(*v == vip("10.96.0.10") && *slot == 0)));
        let d = compare(&expected(), &found);
        assert_eq!(
            d,
            vec![Drift {
                kind: DriftKind::MapEntry,
                object: "EKP_SERVICES".into(),
                key: "10.96.0.10:80/TCP slot 0".into(),
                service: Some("default/web".into()),
                expected: "header count=2 flags=0x0 affinity_timeout=0 service_id=1".into(),
                found: "absent".into(),
                repaired: false,
            }]
        );
    }

    #[test]
    fn a_slot_pointed_elsewhere_shows_both_backends() {
        let found = with(|s, _| {
            for e in s.iter_mut() {
                if e.0 == vip("10.96.0.10") && e.1 == 2 {
                    e.2 = slot(3);
                }
            }
        });
        let d = compare(&expected(), &found);
        assert_eq!(d.len(), 1, "{d:#?}");
        assert_eq!(d[0].key, "10.96.0.10:80/TCP slot 2");
        assert_eq!(d[0].expected, "backend 2 (10.244.1.12:8080)");
        assert_eq!(d[0].found, "backend 3 (10.244.1.13:8080)");
    }

    #[test]
    fn a_changed_backend_and_an_unexpected_service_are_both_reported() {
        let found = with(|s, b| {
            b[2].1 = backend("10.244.9.9");
            s.push((vip("10.96.0.99"), 0, header(0, 7)));
        });
        let d = compare(&expected(), &found);
        let summary: Vec<(String, String, Option<String>, String, String)> = d
            .into_iter()
            .map(|d| (d.object, d.key, d.service, d.expected, d.found))
            .collect();
        assert_eq!(
            summary,
            vec![
                (
                    "EKP_SERVICES".into(),
                    "10.96.0.99:80/TCP slot 0".into(),
                    None,
                    "absent".into(),
                    "header count=0 flags=0x0 affinity_timeout=0 service_id=7".into()
                ),
                (
                    "EKP_BACKENDS".into(),
                    "id 3".into(),
                    Some("default/db".into()),
                    "10.244.1.13:8080".into(),
                    "10.244.9.9:8080".into()
                ),
            ]
        );
    }

    #[test]
    fn emptied_maps_report_every_entry() {
        let found = Programmed::default();
        let d = compare(&expected(), &found);
        // 2 headers, 3 slots, 3 backends.
        assert_eq!(d.len(), 8, "{d:#?}");
        assert!(d.iter().all(|d| d.found == ABSENT));
    }

    #[test]
    fn a_missing_link_pin_is_a_detached_program() {
        let dir = std::env::temp_dir().join(format!("ekp-drift-links-{}", std::process::id()));
        std::fs::create_dir_all(dir.join(LINKS_DIR)).unwrap();
        for name in &PROGRAMS[1..] {
            std::fs::write(dir.join(LINKS_DIR).join(name), "").unwrap();
        }
        let d = missing_links(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(d.len(), 1, "{d:#?}");
        assert_eq!(d[0].kind, DriftKind::Link);
        assert!(
            d[0].object.ends_with("links/ekp_connect4"),
            "{}",
            d[0].object
        );
    }
}
