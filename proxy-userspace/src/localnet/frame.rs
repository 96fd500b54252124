//! One revision of the state in wire form, made once and shared by every
//! stream: each service's `ServiceEndpoints` message is encoded once, and
//! a `Next` answer or a `Watch` frame is a sequence of references to those
//! bytes, so a waiting client costs a queue of pointers, not a copy.

use bytes::Bytes;
use prost::Message;
use proto::localnet::v1 as pb;
use tonic::Status;

use super::convert;
use super::wire::Encoded;
use crate::snapshot::Snapshot;

/// One revision: its number and its services, each encoded.
#[derive(Debug, Default)]
pub struct Frame {
    pub rev: u64,
    pub services: Vec<Bytes>,
}

impl Frame {
    /// Converts and encodes the snapshot's services (CPU work proportional
    /// to the state: run it off the async workers).
    pub fn from_snapshot(s: &Snapshot) -> Self {
        Frame {
            rev: s.rev,
            services: s
                .state
                .services
                .iter()
                .map(|s| Bytes::from(convert::service_endpoints(s).encode_to_vec()))
                .collect(),
        }
    }

    /// A `Next` answer: the `next` item, then every service.
    pub fn next_items(
        self: std::sync::Arc<Self>,
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
        self: std::sync::Arc<Self>,
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
        self: std::sync::Arc<Self>,
    ) -> impl Iterator<Item = Result<Encoded, Status>> + Send {
        (0..self.services.len()).map(move |i| Ok(Encoded::Service(self.services[i].clone())))
    }
}
