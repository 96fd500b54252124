//! A change to a big service: a few writes, planned from the change.

use super::*;

#[test]
fn one_endpoint_change_in_a_big_service_is_a_few_writes() {
    let mut k = FakeKernel::default();
    let mut view = Programmed::default();
    let addrs: Vec<String> = (0..1000)
        .map(|i| format!("10.1.{}.{}:80", i / 250, i % 250))
        .collect();
    let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
    let d0 = desired("10.96.0.10:80", &refs, None);
    sync(&mut k, &mut view, vec![Change::Upsert(&d0)]);
    let d1 = desired("10.96.0.10:80", &refs[1..], None);
    let p = sync(&mut k, &mut view, vec![Change::Upsert(&d1)]);
    assert!(p.ops.len() <= 4, "{:?}", p.ops);
    assert_eq!(k.resolved(&d1.vip), Some(d1.backends.clone()));
}

/// 100,000 endpoints in one service (issue 37: Kubernetes sets no limit):
/// planned whole, slots past 65,535 keyed with their high bits, the count
/// in the header; one endpoint changed is a few writes, not a rewrite.
#[test]
fn a_service_of_100k_backends_is_planned_and_one_change_is_a_few_writes() {
    let backends: Vec<BackendAddr> = (0..100_000u32)
        .map(|i| BackendAddr {
            ip: std::net::Ipv4Addr::from(0x0a00_0000 + i).into(),
            port: 80,
            local: false,
        })
        .collect();
    let mut d = desired("10.96.0.10:80", &[], None);
    d.backends = backends;
    let mut view = Programmed::default();
    let p = plan(&view, vec![Change::Upsert(&d)]);
    assert!(p.problems.is_empty(), "{:?}", p.problems);
    p.ops.iter().for_each(|op| view.apply(op));
    let header = p
        .ops
        .iter()
        .find_map(|op| match op {
            Op::PutHeader { header, .. } => Some(*header),
            _ => None,
        })
        .unwrap();
    assert_eq!(header.count, 100_000);
    let value = header.value();
    assert_eq!((value.count, value.backend_count()), (u16::MAX, 100_000));
    let top = vip("10.96.0.10:80").key(100_000);
    assert_ne!(top, vip("10.96.0.10:80").key(100_000 - 65_536));
    assert_eq!(Vip::from_key(&top), Some((d.vip, 100_000)));
    assert!(p.ops.contains(&Op::PutSlot {
        vip: d.vip,
        slot: 100_000,
        backend_id: 100_000
    }));
    // One endpoint leaves, another arrives.
    let mut d1 = d.clone();
    d1.backends.remove(70_000);
    d1.backends.push(BackendAddr {
        ip: "10.200.0.1".parse().unwrap(),
        port: 80,
        local: false,
    });
    d1.backends.sort_unstable();
    let whole = plan(&view, vec![Change::Upsert(&d1)]);
    assert!(whole.ops.len() <= 3, "{:?}", whole.ops);
    assert_eq!(whole.backends_looked_up, 100_000);
    // With what the service was written from, the same writes are planned
    // from the two backends that changed.
    let last = LastWritten::from_iter([(d.vip, d.backends.clone())]);
    let p = plan_from(&view, vec![Change::Upsert(&d1)], &last);
    assert_eq!(p.ops, whole.ops);
    assert_eq!(p.backends_looked_up, 2);
    p.ops.iter().for_each(|op| view.apply(op));
    assert_eq!(view.service(&d.vip).unwrap().slots.len(), 100_000);
}

/// What the VIP was written from does not match the view (another
/// writer, a lost write): the whole service is planned, as without it.
#[test]
fn a_patch_that_does_not_match_the_view_plans_the_whole_service() {
    let mut k = FakeKernel::default();
    let mut view = Programmed::default();
    let d0 = desired("10.96.0.10:80", &["10.1.0.1:80", "10.1.0.2:80"], None);
    sync(&mut k, &mut view, vec![Change::Upsert(&d0)]);
    let d1 = desired("10.96.0.10:80", &["10.1.0.2:80", "10.1.0.3:80"], None);
    for wrong in [
        vec![be("10.1.0.1:80")],
        vec![be("10.1.0.1:80"), be("10.1.0.9:80")],
        vec![be("10.1.0.1:80"), be("10.1.0.3:80")],
    ] {
        let last = LastWritten::from_iter([(d0.vip, wrong.clone())]);
        let p = plan_from(&view, vec![Change::Upsert(&d1)], &last);
        assert_eq!(
            p.ops,
            plan(&view, vec![Change::Upsert(&d1)]).ops,
            "{wrong:?}"
        );
        assert_eq!(p.backends_looked_up, 2, "{wrong:?}: planned whole");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]
    /// Planned from what each VIP was last written from, a sequence of
    /// changes makes exactly the ops of whole-service plans, and the
    /// kernel picks exactly the desired backends after each.
    #[test]
    fn patches_plan_what_whole_services_plan(
        steps in proptest::collection::vec(
            (0u8..3, proptest::collection::vec(0u8..60, 0..40), proptest::bool::ANY),
            1..12,
        ),
    ) {
        let mut k = FakeKernel::default();
        let mut view = Programmed::default();
        let mut last = LastWritten::new();
        for (v, backends, affinity) in steps {
            let mut d = indexed(v, &backends);
            d.affinity_timeout = affinity.then_some(30);
            let p = plan_from(&view, vec![Change::Upsert(&d)], &last);
            let whole = plan(&view, vec![Change::Upsert(&d)]);
            proptest::prop_assert_eq!(&p.ops, &whole.ops);
            k.run(&mut view, &p.ops);
            let gc = plan_gc(&view);
            k.run(&mut view, &gc);
            proptest::prop_assert_eq!(k.resolved(&d.vip), Some(d.backends.clone()));
            last.insert(d.vip, d.backends);
        }
    }
}
