use super::*;
use crate::datapath::ebpf::codec::*;
use crate::datapath::ebpf::desired::*;
use crate::model::claims::Claims;
use crate::model::{testing, EndpointScopes};
use crate::model::{ObjectKey, ServiceEndpoints};
use proxy_common::{Backend, ServiceKey, FAMILY_V4, FAMILY_V6};
use proxy_common::{PROTO_TCP, SVC_FLAG_SOURCE_RANGES};

fn vip(s: &str) -> Vip {
    let a: std::net::SocketAddr = s.parse().unwrap();
    Vip {
        ip: a.ip(),
        port: a.port(),
        proto: PROTO_TCP,
        scope: Scope::Socket,
    }
}

fn be(s: &str) -> BackendAddr {
    let a: std::net::SocketAddr = s.parse().unwrap();
    BackendAddr {
        ip: a.ip(),
        port: a.port(),
        local: false,
    }
}

fn desired(v: &str, backends: &[&str], affinity: Option<u32>) -> DesiredService {
    let mut backends: Vec<BackendAddr> = backends.iter().map(|b| be(b)).collect();
    backends.sort_unstable();
    DesiredService {
        vip: vip(v),
        owner: ObjectKey::new("default", "svc"),
        affinity_timeout: affinity,
        source_ranges: None,
        backends,
        draining: vec![],
        reject: false,
    }
}

/// A fake kernel: the two maps, checked after every single op for what
/// the eBPF programs rely on.
#[derive(Default)]
struct FakeKernel {
    services: HashMap<ServiceKey, ServiceValue>,
    backends: HashMap<u32, Backend>,
    purged: Vec<(u32, Option<Vec<u32>>)>,
}

impl FakeKernel {
    fn run(&mut self, view: &mut Programmed, ops: &[Op]) {
        for op in ops {
            match op {
                Op::PutBackend { id, addr } => {
                    self.backends.insert(*id, addr.value());
                }
                Op::PutSlot {
                    vip,
                    slot,
                    backend_id,
                } => {
                    self.services.insert(
                        vip.key(*slot),
                        ServiceValue {
                            backend_id: *backend_id,
                            ..Default::default()
                        },
                    );
                }
                Op::PutHeader { vip, header } => {
                    self.services.insert(vip.key(0), header.value());
                }
                Op::DeleteHeader { vip } => {
                    self.services.remove(&vip.key(0));
                }
                Op::DeleteSlot { vip, slot } => {
                    self.services.remove(&vip.key(*slot));
                }
                Op::DeleteBackend { id } => {
                    self.backends.remove(id);
                }
                Op::PurgeAffinity {
                    service_id,
                    backend_ids,
                } => self.purged.push((*service_id, backend_ids.clone())),
            }
            view.apply(op);
            self.check_invariants(op);
        }
    }

    /// Every header's slots 1..=count exist and point at a backend.
    fn check_invariants(&self, after: &Op) {
        for (k, v) in &self.services {
            if k.slot != 0 {
                continue;
            }
            for slot in 1..=v.count {
                let sk = ServiceKey { slot, ..*k };
                let s = self
                    .services
                    .get(&sk)
                    .unwrap_or_else(|| panic!("after {after:?}: slot {slot} missing"));
                assert!(
                    self.backends.contains_key(&s.backend_id),
                    "after {after:?}: slot {slot} -> missing backend {}",
                    s.backend_id
                );
            }
        }
    }

    /// VIP -> backend addresses the kernel can pick (slots 1..=count).
    fn resolved(&self, v: &Vip) -> Option<Vec<BackendAddr>> {
        let h = self.services.get(&v.key(0))?;
        let mut out: Vec<BackendAddr> = (1..=h.backend_count())
            .map(|slot| {
                let id = self.services[&v.key(slot)].backend_id;
                BackendAddr::from_value(&self.backends[&id]).unwrap()
            })
            .collect();
        out.sort_unstable();
        Some(out)
    }
}

fn sync(k: &mut FakeKernel, view: &mut Programmed, changes: Vec<Change<'_>>) -> Plan {
    let p = plan(view, changes);
    k.run(view, &p.ops);
    let gc = plan_gc(view);
    k.run(view, &gc);
    let mut p = p;
    p.ops.extend(gc);
    p
}

#[test]
fn key_and_backend_are_network_byte_order() {
    let k = vip("10.96.0.10:80").key(0);
    assert_eq!(k.addr[0].to_ne_bytes(), [10, 96, 0, 10]);
    assert_eq!(k.addr[1..], [0, 0, 0]);
    assert_eq!(k.port.to_ne_bytes(), [0, 80]);
    assert_eq!((k.proto, k.family, k.slot, k._pad), (6, FAMILY_V4, 0, 0));
    let b = be("10.244.1.5:8080").value();
    assert_eq!(b.addr[0].to_ne_bytes(), [10, 244, 1, 5]);
    assert_eq!(b.port.to_ne_bytes(), 8080u16.to_be_bytes());
    assert_eq!(b.family, FAMILY_V4);
}

#[test]
fn v6_keys_round_trip() {
    let v = vip("[fd00:10:96::a]:443");
    let k = v.key(3);
    assert_eq!(k.family, FAMILY_V6);
    assert_eq!(k.addr[0].to_ne_bytes(), [0xfd, 0x00, 0x00, 0x10]);
    assert_eq!(k.addr[3].to_ne_bytes(), [0, 0, 0, 0x0a]);
    assert_eq!(Vip::from_key(&k), Some((v, 3)));
    let b = be("[fd00::1]:8080");
    assert_eq!(BackendAddr::from_value(&b.value()), Some(b));
    assert_eq!(v.to_string(), "[fd00:10:96::a]:443/TCP");
}

#[test]
fn new_service_writes_backends_then_slots_then_header() {
    let mut k = FakeKernel::default();
    let mut view = Programmed::default();
    let d = desired("10.96.0.10:80", &["10.0.0.1:8080", "10.0.0.2:8080"], None);
    let p = sync(&mut k, &mut view, vec![Change::Upsert(&d)]);
    let v = d.vip;
    let header = Header {
        count: 2,
        flags: 0,
        affinity_timeout: 0,
        service_id: 1,
    };
    assert_eq!(
        p.ops,
        vec![
            Op::PutBackend {
                id: 1,
                addr: be("10.0.0.1:8080")
            },
            Op::PutBackend {
                id: 2,
                addr: be("10.0.0.2:8080")
            },
            Op::PutSlot {
                vip: v,
                slot: 1,
                backend_id: 1
            },
            Op::PutSlot {
                vip: v,
                slot: 2,
                backend_id: 2
            },
            Op::PutHeader { vip: v, header },
        ]
    );
    assert_eq!(k.resolved(&v), Some(d.backends.clone()));
    // Applying the same state again writes nothing.
    let again = sync(&mut k, &mut view, vec![Change::Upsert(&d)]);
    assert_eq!(again.ops, vec![]);
    assert_eq!(again.vips_changed, 0);
}

#[test]
fn plan_table() {
    struct Case {
        name: &'static str,
        before: Vec<&'static str>,
        after: Vec<&'static str>,
        affinity: (Option<u32>, Option<u32>),
        /// Op kinds in order: B+ backend, S+ slot, H header, S- slot
        /// delete, B- backend delete, A purge affinity.
        kinds: &'static str,
    }
    let cases = [
        Case {
            name: "grow by one",
            before: vec!["10.0.0.1:80"],
            after: vec!["10.0.0.1:80", "10.0.0.2:80"],
            affinity: (None, None),
            kinds: "B+ S+ H",
        },
        Case {
            name: "shrink the last",
            before: vec!["10.0.0.1:80", "10.0.0.2:80"],
            after: vec!["10.0.0.1:80"],
            affinity: (None, None),
            kinds: "H S- B-",
        },
        Case {
            name: "shrink the first of three: the last slot moves into the hole",
            before: vec!["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"],
            after: vec!["10.0.0.2:80", "10.0.0.3:80"],
            affinity: (None, None),
            kinds: "S+ H S- B-",
        },
        Case {
            name: "replace one: the new backend takes the slot",
            before: vec!["10.0.0.1:80", "10.0.0.2:80"],
            after: vec!["10.0.0.1:80", "10.0.0.3:80"],
            affinity: (None, None),
            kinds: "B+ S+ B-",
        },
        Case {
            name: "all endpoints gone: count 0 refuses connections",
            before: vec!["10.0.0.1:80"],
            after: vec![],
            affinity: (None, None),
            kinds: "H S- B-",
        },
        Case {
            name: "affinity: a removed backend's entries are purged",
            before: vec!["10.0.0.1:80", "10.0.0.2:80"],
            after: vec!["10.0.0.1:80"],
            affinity: (Some(10800), Some(10800)),
            kinds: "H S- A B-",
        },
        Case {
            name: "affinity switched on: header only",
            before: vec!["10.0.0.1:80"],
            after: vec!["10.0.0.1:80"],
            affinity: (None, Some(60)),
            kinds: "H",
        },
        Case {
            name: "affinity switched off: all entries purged",
            before: vec!["10.0.0.1:80"],
            after: vec!["10.0.0.1:80"],
            affinity: (Some(60), None),
            kinds: "H A",
        },
    ];
    for c in cases {
        let mut k = FakeKernel::default();
        let mut view = Programmed::default();
        let d0 = desired("10.96.0.10:80", &c.before, c.affinity.0);
        sync(&mut k, &mut view, vec![Change::Upsert(&d0)]);
        let d1 = desired("10.96.0.10:80", &c.after, c.affinity.1);
        let p = sync(&mut k, &mut view, vec![Change::Upsert(&d1)]);
        let kinds: Vec<&str> = p
            .ops
            .iter()
            .map(|op| match op {
                Op::PutBackend { .. } => "B+",
                Op::PutSlot { .. } => "S+",
                Op::PutHeader { .. } => "H",
                Op::DeleteSlot { .. } => "S-",
                Op::DeleteHeader { .. } => "H-",
                Op::DeleteBackend { .. } => "B-",
                Op::PurgeAffinity { .. } => "A",
            })
            .collect();
        assert_eq!(kinds.join(" "), c.kinds, "{}", c.name);
        assert_eq!(k.resolved(&d1.vip), Some(d1.backends.clone()), "{}", c.name);
        assert_eq!(
            k.backends.len(),
            c.after.len(),
            "{}: no leaked backends",
            c.name
        );
    }
}

#[test]
fn removing_a_service_deletes_header_first_and_frees_backends() {
    let mut k = FakeKernel::default();
    let mut view = Programmed::default();
    let d = desired("10.96.0.10:80", &["10.0.0.1:80", "10.0.0.2:80"], Some(5));
    sync(&mut k, &mut view, vec![Change::Upsert(&d)]);
    let p = sync(&mut k, &mut view, vec![Change::Remove(d.vip)]);
    assert_eq!(p.ops[0], Op::DeleteHeader { vip: d.vip });
    assert!(p.ops.contains(&Op::PurgeAffinity {
        service_id: 1,
        backend_ids: None
    }));
    assert!(k.services.is_empty() && k.backends.is_empty());
    assert!(view.service(&d.vip).is_none());
    assert_eq!((view.service_entry_count(), view.backend_count()), (0, 0));
}

#[test]
fn an_address_moving_between_services_in_one_plan_is_rewritten_not_lost() {
    let mut k = FakeKernel::default();
    let mut view = Programmed::default();
    let a = desired("10.96.0.10:80", &["10.0.0.1:80", "10.0.0.2:80"], None);
    sync(&mut k, &mut view, vec![Change::Upsert(&a)]);
    let b = DesiredService {
        owner: ObjectKey::new("default", "other"),
        ..desired("10.96.0.10:80", &["10.0.0.2:80", "10.0.0.3:80"], None)
    };
    let p = sync(
        &mut k,
        &mut view,
        vec![Change::Remove(a.vip), Change::Upsert(&b)],
    );
    assert!(
        !p.ops.contains(&Op::DeleteHeader { vip: a.vip }),
        "{:?}",
        p.ops
    );
    assert_eq!(k.resolved(&b.vip), Some(b.backends.clone()));
    // And the other way round: upsert, then remove.
    sync(
        &mut k,
        &mut view,
        vec![Change::Upsert(&a), Change::Remove(a.vip)],
    );
    assert_eq!(k.resolved(&a.vip), None);
    assert!(k.services.is_empty() && k.backends.is_empty());
}

#[test]
fn shared_backends_are_written_once_and_kept_while_used() {
    let mut k = FakeKernel::default();
    let mut view = Programmed::default();
    let a = desired("10.96.0.10:80", &["10.0.0.1:80"], None);
    let b = desired("10.96.0.11:80", &["10.0.0.1:80"], None);
    let p = sync(
        &mut k,
        &mut view,
        vec![Change::Upsert(&a), Change::Upsert(&b)],
    );
    let puts = p
        .ops
        .iter()
        .filter(|o| matches!(o, Op::PutBackend { .. }))
        .count();
    assert_eq!(puts, 1);
    sync(&mut k, &mut view, vec![Change::Remove(a.vip)]);
    assert_eq!(k.backends.len(), 1, "still used by b");
    assert_eq!(k.resolved(&b.vip), Some(b.backends.clone()));
}

#[test]
fn adopted_view_reconciles_without_rewriting_what_is_right() {
    // A previous daemon programmed the maps; a new one reads them back.
    let mut k = FakeKernel::default();
    let mut old = Programmed::default();
    let d = desired("10.96.0.10:80", &["10.0.0.1:80", "10.0.0.2:80"], None);
    let gone = desired("10.96.0.99:80", &["10.0.0.9:80"], None);
    sync(
        &mut k,
        &mut old,
        vec![Change::Upsert(&d), Change::Upsert(&gone)],
    );
    let mut view = Programmed::from_entries(
        k.services
            .iter()
            .map(|(key, v)| {
                let (vip, slot) = Vip::from_key(key).unwrap();
                (vip, slot, *v)
            })
            .collect::<Vec<_>>(),
        k.backends
            .iter()
            .map(|(id, b)| (*id, BackendAddr::from_value(b).unwrap()))
            .collect::<Vec<_>>(),
    );
    let p = sync(
        &mut k,
        &mut view,
        vec![Change::Upsert(&d), Change::Remove(gone.vip)],
    );
    // Nothing of the kept service is rewritten.
    assert!(
        p.ops.iter().all(
            |o| !matches!(o, Op::PutSlot { vip, .. } | Op::PutHeader { vip, .. } if *vip == d.vip)
        ),
        "{:?}",
        p.ops
    );
    assert_eq!(k.resolved(&d.vip), Some(d.backends.clone()));
    assert_eq!(k.resolved(&gone.vip), None);
    assert_eq!(k.backends.len(), 2);
    // New ids do not collide with adopted ones.
    let e = desired("10.96.0.12:80", &["10.0.0.3:80"], None);
    let p = sync(&mut k, &mut view, vec![Change::Upsert(&e)]);
    match &p.ops[0] {
        Op::PutBackend { id, .. } => assert_eq!(*id, 4, "ids 1-3 were adopted"),
        other => panic!("{other:?}"),
    }
}

/// Entries read back in any order: a slot read before its backend still
/// counts, so the backend is not collected as unused.
#[test]
fn a_backend_read_after_its_slot_is_not_collected() {
    let mut k = FakeKernel::default();
    let mut old = Programmed::default();
    let d = desired("10.96.0.10:80", &["10.0.0.1:80"], None);
    sync(&mut k, &mut old, vec![Change::Upsert(&d)]);
    let mut view = Programmed::default();
    for (key, v) in &k.services {
        let (vip, slot) = Vip::from_key(key).unwrap();
        view.add_entry(Entry::Service(vip, slot, *v));
    }
    for (id, b) in &k.backends {
        view.add_entry(Entry::Backend(*id, BackendAddr::from_value(b).unwrap()));
    }
    view.finish_load();
    assert_eq!(view.backend_count(), 1);
    assert_eq!(plan_gc(&view), vec![], "its one slot refers to it");
}

#[test]
fn stable_slots_keep_positions() {
    assert_eq!(stable_slots(&[1, 2, 3], &[1, 2, 3]), vec![1, 2, 3]);
    assert_eq!(stable_slots(&[1, 2, 3], &[2, 3]), vec![3, 2]);
    assert_eq!(stable_slots(&[1, 2, 3], &[1, 2]), vec![1, 2]);
    assert_eq!(stable_slots(&[1, 2], &[1, 2, 4]), vec![1, 2, 4]);
    assert_eq!(stable_slots(&[1, 2, 3], &[1, 3, 4]), vec![1, 4, 3]);
    assert_eq!(stable_slots(&[1, 0, 3], &[1, 3]), vec![1, 3]);
    assert_eq!(stable_slots(&[5, 5], &[5]), vec![5]);
    assert_eq!(stable_slots(&[], &[7, 8]), vec![7, 8]);
    assert_eq!(stable_slots(&[7, 8], &[]), Vec::<u32>::new());
}

/// A desired service from small indexes: VIP `10.96.0.v:80`, backends
/// `10.0.0.b:80`.
fn indexed(v: u8, backends: &[u8]) -> DesiredService {
    let names: Vec<String> = backends.iter().map(|b| format!("10.0.0.{b}:80")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut d = desired(&format!("10.96.0.{v}:80"), &refs, None);
    d.backends.dedup();
    d
}

mod desired;
mod patch;
mod peak;
