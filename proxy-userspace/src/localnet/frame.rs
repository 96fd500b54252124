//! One revision of the state in wire form, made once and shared by every
//! stream: each service's `ServiceEndpoints` message is encoded once, and
//! a `Next` answer or a `Watch` frame is a sequence of references to those
//! bytes, so a waiting client costs a queue of pointers, not a copy.
//!
//! The model shares an unchanged service between states (the same `Arc`),
//! so a frame reuses the previous frame's bytes for it: a revision costs
//! encoding the services that changed.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use prost::Message;
use proto::localnet::v1 as pb;
use tonic::Status;

use super::convert;
use super::wire::Encoded;
use crate::model::ServiceEndpoints;
use crate::snapshot::Snapshot;

/// One revision: its number and its services, each encoded.
#[derive(Debug, Default)]
pub struct Frame {
    pub rev: u64,
    pub services: Vec<Bytes>,
    /// The model's services the bytes were made from, same order. Held so
    /// that their addresses identify them while this frame lives.
    sources: Vec<Arc<ServiceEndpoints>>,
}

impl Frame {
    /// Converts and encodes the snapshot's services, reusing `previous`'s
    /// bytes for every service it shares with it (CPU work proportional
    /// to what changed, still to be run off the async workers).
    pub fn from_snapshot(s: &Snapshot, previous: Option<&Frame>) -> Self {
        // Pointer identity is sound: `previous` keeps each of its services
        // alive, so no other service can be at the same address.
        let known: HashMap<*const ServiceEndpoints, &Bytes> = previous
            .map(|p| {
                p.sources
                    .iter()
                    .map(Arc::as_ptr)
                    .zip(&p.services)
                    .collect()
            })
            .unwrap_or_default();
        let services = s
            .state
            .services
            .iter()
            .map(|svc| match known.get(&Arc::as_ptr(svc)) {
                Some(bytes) => Bytes::clone(bytes),
                None => Bytes::from(convert::service_endpoints(svc).encode_to_vec()),
            })
            .collect();
        Frame {
            rev: s.rev,
            services,
            sources: s.state.services.clone(),
        }
    }

    /// A `Next` answer: the `next` item, then every service.
    pub fn next_items(
        self: Arc<Self>,
        instance_id: u64,
    ) -> impl Iterator<Item = Result<Encoded, Status>> + Send {
        let head = Encoded::message(&pb::NextItem {
            item: Some(pb::next_item::Item::Next(pb::NextFilter {
                instance_id,
                rev: self.rev,
            })),
        });
        std::iter::once(Ok(head)).chain(self.service_items())
    }

    /// A `Watch` frame: `begin`, every service, `end`.
    pub fn watch_items(
        self: Arc<Self>,
        instance_id: u64,
    ) -> impl Iterator<Item = Result<Encoded, Status>> + Send {
        use pb::watch_event::Event;
        let event = |e| {
            Ok(Encoded::message(&pb::WatchEvent { event: Some(e) }))
        };
        let begin = event(Event::Begin(pb::StateBegin {
            instance_id,
            rev: self.rev,
            service_count: u32::try_from(self.services.len()).unwrap_or(u32::MAX),
        }));
        let end = event(Event::End(pb::StateEnd {}));
        std::iter::once(begin)
            .chain(self.service_items())
            .chain(std::iter::once(end))
    }

    fn service_items(
        self: Arc<Self>,
    ) -> impl Iterator<Item = Result<Encoded, Status>> + Send {
        (0..self.services.len()).map(move |i| Ok(Encoded::Service(self.services[i].clone())))
    }
}
