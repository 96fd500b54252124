//! Delta frames against full frames: random sequences of states, watchers
//! that take every revision and watchers that skip some, all rebuilding
//! through the client's `Watched::apply` exactly the state a full frame
//! carries.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use prost::Message;
use proto::localnet::v1 as pb;

use super::*;
use crate::localnet::client::Watched;
use crate::localnet::convert;
use crate::localnet::frame::Frame;
use crate::model::testing::service;
use crate::model::{LocalState, ServiceEndpoints};
use crate::snapshot::Snapshot;

const KEYS: u8 = 10;

/// One change to the state: service `key` set to a variant, removed, or
/// rebuilt as another allocation with the same content.
#[derive(Clone, Debug)]
enum Op {
    Set(u8, u8),
    Remove(u8),
    Rebuild(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..KEYS, 0..4u8).prop_map(|(k, v)| Op::Set(k, v)),
        2 => (0..KEYS).prop_map(Op::Remove),
        1 => (0..KEYS).prop_map(Op::Rebuild),
    ]
}

fn make(key: u8, variant: u8) -> Arc<ServiceEndpoints> {
    let ns = if key.is_multiple_of(2) { "a" } else { "b" };
    let mut s = service(ns, &format!("svc-{key}"), &[&format!("10.96.0.{variant}")]);
    s.local_ready_endpoints_v4 = u32::from(variant);
    Arc::new(s)
}

/// The snapshots of a run of steps, rev 1.., each carrying the keys that
/// differ from the one before (or not, when `hint` says no), unchanged
/// services shared as the model shares them.
fn snapshots(steps: &[(Vec<Op>, bool)]) -> Vec<Snapshot> {
    let mut held: BTreeMap<u8, (u8, Arc<ServiceEndpoints>)> = BTreeMap::new();
    let mut out = Vec::new();
    for (rev, (ops, hint)) in (1..).zip(steps) {
        let before = held.clone();
        for op in ops {
            match *op {
                Op::Set(k, v) => {
                    if held.get(&k).map(|(old, _)| *old) != Some(v) {
                        held.insert(k, (v, make(k, v)));
                    }
                }
                Op::Remove(k) => {
                    held.remove(&k);
                }
                Op::Rebuild(k) => {
                    if let Some((v, _)) = held.get(&k).cloned() {
                        held.insert(k, (v, make(k, v)));
                    }
                }
            }
        }
        let state = LocalState {
            services: {
                let mut s: Vec<_> = held.values().map(|(_, s)| s.clone()).collect();
                s.sort_by(|a, b| a.service.key.cmp(&b.service.key));
                s
            },
        };
        let mut changed: Vec<_> = (0..KEYS)
            .filter(|k| match (before.get(k), held.get(k)) {
                (Some((_, a)), Some((_, b))) => !Arc::ptr_eq(a, b),
                (a, b) => a.is_some() != b.is_some(),
            })
            .map(|k| make(k, 0).service.key.clone())
            .collect();
        changed.sort();
        out.push(Snapshot {
            rev,
            state: Arc::new(state),
            changed: hint.then(|| Arc::from(changed)),
        });
    }
    out
}

fn events(items: impl Iterator<Item = Result<Encoded, Status>>) -> Vec<pb::watch_event::Event> {
    items
        .flat_map(|e| e.expect("ok").messages())
        .map(|m| {
            pb::WatchEvent::decode(m.as_slice())
                .expect("decodes")
                .event
                .expect("set")
        })
        .collect()
}

/// Applies one frame's events (begin … end) to `w`.
fn apply(w: &mut Watched, mut events: Vec<pb::watch_event::Event>) {
    use pb::watch_event::Event;
    let Some(Event::End(_)) = events.pop() else {
        panic!("a frame ends with end")
    };
    let Event::Begin(begin) = events.remove(0) else {
        panic!("a frame starts with begin")
    };
    w.apply(&begin, events).expect("the frame applies");
}

fn expected(s: &Snapshot) -> Vec<pb::ServiceEndpoints> {
    s.state
        .services
        .iter()
        .map(|s| convert::service_endpoints(s))
        .collect()
}

fn steps() -> impl Strategy<Value = Vec<(Vec<Op>, bool)>> {
    prop::collection::vec((prop::collection::vec(op(), 0..5), any::<bool>()), 1..25)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// The converter may skip snapshots (`skip`), a slow watcher may skip
    /// frames (`read`): every watcher still ends each frame it reads with
    /// exactly that revision's state.
    #[test]
    fn applying_deltas_gives_each_state(
        steps in steps(),
        skip in prop::collection::vec(prop::bool::weighted(0.2), 25),
        read in prop::collection::vec(prop::bool::weighted(0.6), 25),
    ) {
        let snaps = snapshots(&steps);
        let mut previous: Option<Arc<Frame>> = None;
        let (mut every, mut slow) = (Watched::default(), Watched::default());
        let mut slow_held: Option<Arc<Frame>> = None;
        for (i, s) in snaps.iter().enumerate() {
            // The last snapshot is always converted: it is the newest.
            if skip[i] && i + 1 < snaps.len() {
                continue;
            }
            let frame = Arc::new(Frame::from_snapshot(s, previous.as_deref()));
            let want = expected(s);

            // A watcher at the previous frame gets the frame's own delta.
            let items = match &previous {
                None => events(frame.clone().watch_items(7)),
                Some(p) => {
                    let d = Delta::for_watcher(p, &frame);
                    prop_assert!(Arc::ptr_eq(&d, frame.delta.as_ref().unwrap()), "not shared");
                    events(d.watch_items(7))
                }
            };
            apply(&mut every, items);
            prop_assert_eq!((every.instance_id, every.rev), (7, s.rev));
            prop_assert_eq!(&every.state().services, &want);

            if read[i] || i + 1 == snaps.len() {
                let items = match &slow_held {
                    None => events(frame.clone().watch_items(7)),
                    Some(h) => events(Delta::for_watcher(h, &frame).watch_items(7)),
                };
                apply(&mut slow, items);
                prop_assert_eq!(&slow.state().services, &want);
                slow_held = Some(frame.clone());
            }
            previous = Some(frame);
        }
    }
}

fn frame_of(rev: u64, services: Vec<Arc<ServiceEndpoints>>, previous: Option<&Frame>) -> Frame {
    let s = Snapshot {
        rev,
        state: Arc::new(LocalState { services }),
        changed: None,
    };
    Frame::from_snapshot(&s, previous)
}

#[test]
fn a_delta_carries_changed_services_as_the_frames_bytes_and_removed_keys() {
    use pb::watch_event::Event;
    let (a, b, c) = (make(0, 1), make(2, 1), make(4, 1));
    let first = frame_of(4, vec![a.clone(), b.clone(), c], None);
    let b2 = make(2, 2);
    let d = make(6, 1);
    let second = frame_of(5, vec![a, b2.clone(), d.clone()], Some(&first));
    let delta = second
        .delta
        .clone()
        .expect("a delta from the previous frame");
    // The changed service's bytes are the frame's, not a copy.
    assert!(
        matches!(&delta.changes[0], Change::Upsert(bytes) if bytes.as_ptr() == second.services[1].as_ptr())
    );
    assert_eq!(
        events(delta.watch_items(9)),
        [
            Event::Begin(pb::StateBegin {
                instance_id: 9,
                rev: 5,
                service_count: 2,
                base_rev: 4,
                removed_count: 1,
            }),
            Event::Service(convert::service_endpoints(&b2)),
            Event::Removed(pb::ServiceKey {
                namespace: "a".into(),
                name: "svc-4".into(),
            }),
            Event::Service(convert::service_endpoints(&d)),
            Event::End(pb::StateEnd {}),
        ]
    );
}

#[test]
fn a_delta_with_nothing_changed_is_an_empty_frame_of_the_new_revision() {
    let a = make(0, 1);
    let first = frame_of(1, vec![a.clone()], None);
    let second = frame_of(2, vec![a], Some(&first));
    let mut w = Watched::default();
    apply(&mut w, events(Arc::new(first).watch_items(3)));
    let items = events(second.delta.clone().unwrap().watch_items(3));
    assert_eq!(items.len(), 2, "begin and end only: {items:?}");
    apply(&mut w, items);
    assert_eq!((w.rev, w.service_count()), (2, 1));
}

#[test]
fn a_delta_on_another_revision_is_refused_and_changes_nothing() {
    let first = frame_of(1, vec![make(0, 1)], None);
    let second = frame_of(2, vec![make(0, 2)], Some(&first));
    let third = frame_of(3, vec![], Some(&second));
    let mut w = Watched::default();
    apply(&mut w, events(Arc::new(first).watch_items(3)));
    let before = w.clone();
    let mut items = events(third.delta.clone().unwrap().watch_items(3));
    items.pop();
    let pb::watch_event::Event::Begin(begin) = items.remove(0) else {
        panic!("begin")
    };
    assert!(
        w.apply(&begin, items).is_err(),
        "a delta on rev 2 applied to rev 1"
    );
    assert_eq!(w, before);
}
