//! The most entries the maps hold while plans run.

use super::*;

/// `peak` is what the fake kernel's maps hold at their fullest while the
/// plan runs: checked on a plan that removes one service, grows another
/// and adds a third.
#[test]
fn peak_is_the_most_entries_the_maps_hold_while_a_plan_runs() {
    let mut k = FakeKernel::default();
    let mut view = Programmed::default();
    let a = desired("10.96.0.1:80", &["10.0.0.1:80", "10.0.0.2:80"], None);
    let b = desired("10.96.0.2:80", &["10.0.0.3:80"], None);
    sync(
        &mut k,
        &mut view,
        vec![Change::Upsert(&a), Change::Upsert(&b)],
    );
    assert_eq!(
        peak(&view, &[]),
        Peak {
            service_entries: 5,
            backends: 3
        }
    );
    let b2 = desired("10.96.0.2:80", &["10.0.0.3:80", "10.0.0.4:80"], None);
    let c = desired("10.96.0.3:80", &["10.0.0.5:80", "10.0.0.1:80"], None);
    let p = plan(
        &view,
        vec![
            Change::Remove(a.vip),
            Change::Upsert(&b2),
            Change::Upsert(&c),
        ],
    );
    let want = peak(&view, &p.ops);
    let (mut most_services, mut most_backends) = (0, 0);
    for op in &p.ops {
        k.run(&mut view, std::slice::from_ref(op));
        most_services = most_services.max(k.services.len());
        most_backends = most_backends.max(k.backends.len());
    }
    assert_eq!(
        want,
        Peak {
            service_entries: most_services,
            backends: most_backends
        }
    );
    // a's 3 entries go first (5 → 2), b grows by one slot, c adds three.
    assert_eq!(want.service_entries, 6);
    assert_eq!(want.backends, 5);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
    /// Whatever was programmed before and however the full sync is cut
    /// into plans, the maps never hold more than `peak_bound` says (the
    /// chunked full sync checks capacity against it once, up front).
    #[test]
    fn chunked_full_sync_stays_within_the_peak_bound(
        before in proptest::collection::btree_map(0u8..24, proptest::collection::vec(0u8..40, 0..6), 0..16),
        after in proptest::collection::btree_map(0u8..24, proptest::collection::vec(0u8..40, 0..6), 0..16),
        chunk in 1usize..6,
    ) {
        let mut k = FakeKernel::default();
        let mut view = Programmed::default();
        let old: Vec<DesiredService> = before.iter().map(|(v, b)| indexed(*v, b)).collect();
        sync(&mut k, &mut view, old.iter().map(Change::Upsert).collect());
        let new: Vec<DesiredService> = after.iter().map(|(v, b)| indexed(*v, b)).collect();
        let stale: Vec<Vip> = view
            .services()
            .map(|(vip, _)| *vip)
            .filter(|vip| !new.iter().any(|d| d.vip == *vip))
            .collect();
        let bound = peak_bound(&view, &stale, &new);
        let (mut most_services, mut most_backends) = (k.services.len(), k.backends.len());
        let mut run = |k: &mut FakeKernel, view: &mut Programmed, changes: Vec<Change<'_>>| {
            for op in plan(view, changes).ops {
                k.run(view, std::slice::from_ref(&op));
                most_services = most_services.max(k.services.len());
                most_backends = most_backends.max(k.backends.len());
            }
        };
        run(&mut k, &mut view, stale.iter().map(|v| Change::Remove(*v)).collect());
        for part in new.chunks(chunk) {
            run(&mut k, &mut view, part.iter().map(Change::Upsert).collect());
        }
        let gc = plan_gc(&view);
        k.run(&mut view, &gc);
        proptest::prop_assert!(most_services <= bound.service_entries, "{most_services} > {bound:?}");
        proptest::prop_assert!(most_backends <= bound.backends, "{most_backends} > {bound:?}");
        // The chunks end where one plan ends: exactly the new services.
        let entries: usize = new.iter().map(|d| 1 + d.backends.len()).sum();
        proptest::prop_assert_eq!(k.services.len(), entries);
    }
}
