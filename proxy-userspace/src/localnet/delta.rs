//! Delta `Watch` frames (the opt-in extension described in
//! `proto/localnet/v1/localnet.proto`): what changed between two frames,
//! as the wire events a delta watcher is sent.
//!
//! A delta is built once per revision against the previous frame and
//! shared by every delta watcher that holds that frame; its events are
//! references to the frames' bytes (an upsert is the new frame's encoded
//! service, not a copy). A watcher that skipped revisions gets a delta of
//! its own, from the frame it last received, which its stream holds.
//!
//! A delta reads frames through [`Revision`], which the frames implement:
//! this module does not depend on theirs.

use std::cmp::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use proto::localnet::v1 as pb;
use tonic::Status;

use super::wire::Encoded;
use crate::model::{ObjectKey, ServiceEndpoints};

/// One revision of the state in wire form, as a delta reads it.
pub trait Revision {
    fn rev(&self) -> u64;
    /// Each service's encoded `ServiceEndpoints`, in the order of the
    /// services' keys.
    fn services(&self) -> &[Bytes];
    /// The model's services the bytes were made from, same order.
    fn sources(&self) -> &[Arc<ServiceEndpoints>];
    /// The delta from the previous revision, made with this one.
    fn delta(&self) -> Option<&Arc<Delta>>;
}

impl<R: Revision> Revision for Arc<R> {
    fn rev(&self) -> u64 {
        (**self).rev()
    }
    fn services(&self) -> &[Bytes] {
        (**self).services()
    }
    fn sources(&self) -> &[Arc<ServiceEndpoints>] {
        (**self).sources()
    }
    fn delta(&self) -> Option<&Arc<Delta>> {
        (**self).delta()
    }
}

/// Where the service `key` is in `r`.
fn position(r: &impl Revision, key: &ObjectKey) -> Option<usize> {
    r.sources()
        .binary_search_by(|s| s.service.key.cmp(key))
        .ok()
}

/// One event of a delta frame.
#[derive(Clone, Debug, PartialEq)]
enum Change {
    /// An added or changed service: its encoded `ServiceEndpoints`.
    Upsert(Bytes),
    /// A whole encoded `WatchEvent` naming a removed service.
    Removed(Bytes),
}

/// The change from the frame of `base_rev` to the frame of `rev`.
#[derive(Debug, PartialEq)]
pub struct Delta {
    pub base_rev: u64,
    pub rev: u64,
    /// In the order of the services' keys.
    changes: Vec<Change>,
    upserts: u32,
    removed: u32,
}

impl Delta {
    /// The delta from `old` to `new`. `changed`, when given, lists every
    /// key that may differ (the snapshot's `changed_since(old.rev)`,
    /// sorted): only those are looked at. Without it the frames are
    /// walked side by side, an unchanged service costing one pointer
    /// comparison (the model shares it between states).
    pub fn between(
        old: &impl Revision,
        new: &impl Revision,
        changed: Option<&[ObjectKey]>,
    ) -> Self {
        let mut d = Delta {
            base_rev: old.rev(),
            rev: new.rev(),
            changes: Vec::new(),
            upserts: 0,
            removed: 0,
        };
        match changed {
            Some(keys) => {
                for key in keys {
                    match position(new, key) {
                        Some(i) => d.upsert(new.services()[i].clone()),
                        None if position(old, key).is_some() => d.remove(key),
                        // Added and removed again in between: nothing to say.
                        None => {}
                    }
                }
            }
            None => d.walk(old, new),
        }
        d
    }

    /// What a delta watcher holding `held` is sent to reach `frame`: the
    /// frame's own delta (shared) when `held` is the frame before it, else
    /// one made for this watcher.
    pub fn for_watcher(held: &impl Revision, frame: &impl Revision) -> Arc<Delta> {
        match frame.delta() {
            Some(d) if d.base_rev == held.rev() => d.clone(),
            _ => Arc::new(Delta::between(held, frame, None)),
        }
    }

    /// Merge of the two frames' key-sorted services.
    fn walk(&mut self, old: &impl Revision, new: &impl Revision) {
        let (old_sources, new_sources) = (old.sources(), new.sources());
        let (old_services, new_services) = (old.services(), new.services());
        let (mut i, mut j) = (0, 0);
        loop {
            let order = match (old_sources.get(i), new_sources.get(j)) {
                (None, None) => return,
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some(a), Some(b)) if Arc::ptr_eq(a, b) => {
                    i += 1;
                    j += 1;
                    continue;
                }
                (Some(a), Some(b)) => a.service.key.cmp(&b.service.key),
            };
            match order {
                Ordering::Less => {
                    self.remove(&old_sources[i].service.key);
                    i += 1;
                }
                Ordering::Greater => {
                    self.upsert(new_services[j].clone());
                    j += 1;
                }
                Ordering::Equal => {
                    // Another allocation; the same content is possible (a
                    // model that rebuilt it) and then the bytes say so.
                    if old_services[i] != new_services[j] {
                        self.upsert(new_services[j].clone());
                    }
                    i += 1;
                    j += 1;
                }
            }
        }
    }

    fn upsert(&mut self, service: Bytes) {
        self.upserts += 1;
        self.changes.push(Change::Upsert(service));
    }

    fn remove(&mut self, key: &ObjectKey) {
        self.removed += 1;
        let event = pb::WatchEvent {
            event: Some(pb::watch_event::Event::Removed(pb::ServiceKey {
                namespace: key.namespace.to_string(),
                name: key.name.to_string(),
            })),
        };
        self.changes.push(Change::Removed(
            prost::Message::encode_to_vec(&event).into(),
        ));
    }

    /// The delta frame: `begin` (with `base_rev`), the changes, `end`.
    pub fn watch_items(
        self: Arc<Self>,
        instance_id: u64,
    ) -> impl Iterator<Item = Result<Encoded, Status>> + Send {
        use pb::watch_event::Event;
        let event = |e| Ok(Encoded::message(&pb::WatchEvent { event: Some(e) }));
        let begin = event(Event::Begin(pb::StateBegin {
            instance_id,
            rev: self.rev,
            service_count: self.upserts,
            base_rev: self.base_rev,
            removed_count: self.removed,
        }));
        let end = event(Event::End(pb::StateEnd {}));
        let changes = (0..self.changes.len()).map(move |i| {
            Ok(match &self.changes[i] {
                Change::Upsert(b) => Encoded::Service(b.clone()),
                Change::Removed(b) => Encoded::Message(b.clone()),
            })
        });
        std::iter::once(begin)
            .chain(changes)
            .chain(std::iter::once(end))
    }
}

#[cfg(test)]
#[path = "delta_tests.rs"]
mod tests;
