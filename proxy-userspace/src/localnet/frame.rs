//! One revision of the state in wire form, made once and shared by every
//! stream: each service's `ServiceEndpoints` message is encoded once, and
//! a `Next` answer or a `Watch` frame is a sequence of references to those
//! bytes, so a waiting client costs a queue of pointers, not a copy.
//!
//! The model shares an unchanged service between states (the same `Arc`),
//! so a frame reuses the previous frame's bytes for it: a revision costs
//! encoding the services that changed. The frame also holds the delta
//! from the previous frame for delta watchers (`super::delta`), made once.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use proto::localnet::v1 as pb;
use tonic::Status;

use super::convert;
use super::delta::{Delta, Revision};
use super::wire::{Encoded, GRPC_PREFIX};
use crate::grpc_unix::MAX_MESSAGE_BYTES;
use crate::model::ServiceEndpoints;
use crate::snapshot::Snapshot;

/// One revision: its number and its services, each encoded.
#[derive(Debug, Default)]
pub struct Frame {
    pub rev: u64,
    /// Each service's `ServiceEndpoints` bytes: slices of `wire`, past
    /// the services `wire` holds their own allocations.
    pub services: Vec<Bytes>,
    /// The first `wired` services as the gRPC messages every `Next`
    /// answer and `Watch` frame carries (5-byte prefix, field 2 header,
    /// the service), back to back: a stream sends this one allocation,
    /// so HTTP/2 cuts it into full DATA frames and nothing is copied per
    /// stream.
    wire: Bytes,
    /// How many services `wire` holds: all but one longer than a gRPC
    /// message may be and those after it (which end the stream with an
    /// error when their turn comes, as before).
    wired: usize,
    /// The model's services the bytes were made from, same order. Held so
    /// that their addresses identify them while this frame lives.
    sources: Vec<Arc<ServiceEndpoints>>,
    /// The change from the previous frame, shared by every delta watcher
    /// that holds that one. `None` for the first frame.
    pub delta: Option<Arc<Delta>>,
}

impl Frame {
    /// Converts and encodes the snapshot's services, reusing `previous`'s
    /// bytes for every service it shares with it (CPU work proportional
    /// to what changed, still to be run off the async workers).
    pub fn from_snapshot(s: &Snapshot, previous: Option<&Frame>) -> Self {
        // Pointer identity is sound: `previous` keeps each of its services
        // alive, so no other service can be at the same address.
        let known: HashMap<*const ServiceEndpoints, &Bytes> = previous
            .map(|p| p.sources.iter().map(Arc::as_ptr).zip(&p.services).collect())
            .unwrap_or_default();
        let encoded: Vec<Bytes> = s
            .state
            .services
            .iter()
            .map(|svc| match known.get(&Arc::as_ptr(svc)) {
                Some(bytes) => Bytes::clone(bytes),
                None => Bytes::from(convert::service_endpoints(svc).encode_to_vec()),
            })
            .collect();
        let (wire, services, wired) = wired(encoded);
        let mut frame = Frame {
            rev: s.rev,
            services,
            wire,
            wired,
            sources: s.state.services.clone(),
            delta: None,
        };
        if let Some(p) = previous.filter(|p| p.rev >= 1) {
            let changed = s.changed_since(Some(p.rev));
            frame.delta = Some(Arc::new(Delta::between(p, &frame, changed)));
        }
        frame
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
        let event = |e| Ok(Encoded::message(&pb::WatchEvent { event: Some(e) }));
        let begin = event(Event::Begin(pb::StateBegin {
            instance_id,
            rev: self.rev,
            service_count: u32::try_from(self.services.len()).unwrap_or(u32::MAX),
            ..Default::default()
        }));
        let end = event(Event::End(pb::StateEnd {}));
        std::iter::once(begin)
            .chain(self.service_items())
            .chain(std::iter::once(end))
    }

    /// Every service: the shared wire bytes, then any service too long
    /// for them one by one.
    fn service_items(self: Arc<Self>) -> impl Iterator<Item = Result<Encoded, Status>> + Send {
        let wire = (!self.wire.is_empty()).then(|| Ok(Encoded::Framed(self.wire.clone())));
        let rest = (self.wired..self.services.len())
            .map(move |i| Ok(Encoded::Service(self.services[i].clone())));
        wire.into_iter().chain(rest)
    }
}

/// Lays the services out as back-to-back gRPC messages in one buffer
/// (up to the first one longer than a message may be); returns it, the
/// services as slices of it (the rest as they were) and how many it
/// holds. One copy of the state per revision, made once.
fn wired(encoded: Vec<Bytes>) -> (Bytes, Vec<Bytes>, usize) {
    let wired = encoded
        .iter()
        .position(|b| Encoded::service_len(b.len()) > MAX_MESSAGE_BYTES)
        .unwrap_or(encoded.len());
    let total: usize = encoded[..wired]
        .iter()
        .map(|b| GRPC_PREFIX + Encoded::service_len(b.len()))
        .sum();
    let mut buf = BytesMut::with_capacity(total);
    let mut ranges = Vec::with_capacity(wired);
    for b in &encoded[..wired] {
        buf.put_u8(0);
        buf.put_u32(Encoded::service_len(b.len()) as u32);
        Encoded::write_service_header(b.len(), &mut buf);
        let start = buf.len();
        buf.put_slice(b);
        ranges.push(start..buf.len());
    }
    let wire = buf.freeze();
    let services = ranges
        .into_iter()
        .map(|r| wire.slice(r))
        .chain(encoded.into_iter().skip(wired))
        .collect();
    (wire, services, wired)
}

impl Revision for Frame {
    fn rev(&self) -> u64 {
        self.rev
    }
    fn services(&self) -> &[Bytes] {
        &self.services
    }
    fn sources(&self) -> &[Arc<ServiceEndpoints>] {
        &self.sources
    }
    fn delta(&self) -> Option<&Arc<Delta>> {
        self.delta.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testing::{endpoint, service, state};
    use crate::model::EndpointScopes;

    fn snapshot(rev: u64, state: crate::model::LocalState) -> Snapshot {
        Snapshot {
            rev,
            state: Arc::new(state),
            changed: None,
        }
    }

    fn decoded(frame: &Frame) -> Vec<pb::ServiceEndpoints> {
        frame
            .services
            .iter()
            .map(|b| pb::ServiceEndpoints::decode(b.clone()).expect("decodes"))
            .collect()
    }

    #[test]
    fn each_service_is_its_converted_message() {
        let s = snapshot(
            1,
            state(vec![
                service("prod", "web", &["10.96.0.10"]).with_endpoints([endpoint(
                    "10.244.0.1",
                    8080,
                    EndpointScopes::default(),
                )]),
                service("default", "api", &["10.96.0.11"]),
            ]),
        );
        let frame = Frame::from_snapshot(&s, None);
        let expected: Vec<_> = s
            .state
            .services
            .iter()
            .map(|s| convert::service_endpoints(s))
            .collect();
        assert_eq!(frame.rev, 1);
        assert_eq!(decoded(&frame), expected);
    }

    #[test]
    fn a_shared_service_reuses_the_previous_bytes_and_a_changed_one_is_encoded() {
        let first = snapshot(
            1,
            state(vec![
                service("default", "api", &["10.96.0.11"]),
                service("prod", "web", &["10.96.0.10"]),
            ]),
        );
        let mut frame1 = Frame::from_snapshot(&first, None);
        let mut next = (*first.state).clone();
        next.services[1] = Arc::new(service("prod", "web", &["10.96.0.12"]));
        let second = snapshot(2, next);
        let fresh = Frame::from_snapshot(&second, None);
        // The bytes the next frame takes for the unchanged service are
        // the previous frame's, whatever they are: not encoded again.
        frame1.services[0] = Bytes::from_static(b"\x0a\x00");
        let frame2 = Frame::from_snapshot(&second, Some(&frame1));
        assert_eq!(
            frame2.services[0], frame1.services[0],
            "the unchanged service was encoded again"
        );
        assert_eq!(frame2.services[1], fresh.services[1]);
        assert_ne!(frame2.services[1], frame1.services[1]);
    }

    #[test]
    fn every_stream_sends_the_services_as_one_shared_allocation_of_grpc_messages() {
        let s = snapshot(
            1,
            state(vec![
                service("default", "api", &["10.96.0.11"]),
                service("prod", "web", &["10.96.0.10"]),
            ]),
        );
        let frame = Arc::new(Frame::from_snapshot(&s, None));
        let wire = |items: Vec<Result<Encoded, Status>>| match &items[1] {
            Ok(Encoded::Framed(b)) => b.clone(),
            other => panic!("the services are not one framed item: {other:?}"),
        };
        let a = wire(frame.clone().watch_items(1).collect());
        let b = wire(frame.clone().watch_items(1).collect());
        let c = wire(frame.clone().next_items(1).collect());
        assert_eq!(a.as_ptr(), b.as_ptr(), "copied per stream");
        assert_eq!(a.as_ptr(), c.as_ptr(), "Next and Watch differ");
        // The frame's services are slices of it, each behind its message
        // header.
        let messages = Encoded::Framed(a.clone()).messages();
        assert_eq!(messages.len(), 2);
        for (m, svc) in messages.iter().zip(&frame.services) {
            let mut header = Vec::new();
            Encoded::write_service_header(svc.len(), &mut header);
            assert_eq!(*m, [header, svc.to_vec()].concat());
            let inside = svc.as_ptr() as usize - a.as_ptr() as usize;
            assert!(inside < a.len(), "a service is not a slice of the wire");
        }
    }

    #[test]
    fn a_service_longer_than_a_message_and_those_after_it_stay_out_of_the_wire() {
        let small = Bytes::from_static(b"\x0a\x00");
        let huge = Bytes::from(vec![0u8; MAX_MESSAGE_BYTES]);
        let (wire, services, n) = wired(vec![small.clone(), huge.clone(), small.clone()]);
        assert_eq!(n, 1);
        assert_eq!(services, [small.clone(), huge, small.clone()]);
        assert_eq!(
            Encoded::Framed(wire).messages(),
            [Encoded::Service(small).messages()[0].clone()]
        );
    }

    #[test]
    fn next_and_watch_items_carry_the_frame() {
        let s = snapshot(3, state(vec![service("default", "api", &["10.96.0.11"])]));
        let frame = Arc::new(Frame::from_snapshot(&s, None));
        let bytes = |e: Result<Encoded, Status>| e.expect("ok").messages();
        let next: Vec<_> = frame.clone().next_items(9).flat_map(bytes).collect();
        let items: Vec<_> = next
            .iter()
            .map(|b| pb::NextItem::decode(b.as_slice()).expect("decodes").item)
            .collect();
        let api = convert::service_endpoints(&s.state.services[0]);
        assert_eq!(
            items,
            [
                Some(pb::next_item::Item::Next(pb::NextFilter {
                    instance_id: 9,
                    rev: 3
                })),
                Some(pb::next_item::Item::Endpoints(api.clone())),
            ]
        );
        use pb::watch_event::Event;
        let events: Vec<_> = frame
            .watch_items(9)
            .flat_map(bytes)
            .map(|b| pb::WatchEvent::decode(b.as_slice()).expect("decodes").event)
            .collect();
        assert_eq!(
            events,
            [
                Some(Event::Begin(pb::StateBegin {
                    instance_id: 9,
                    rev: 3,
                    service_count: 1,
                    ..Default::default()
                })),
                Some(Event::Service(api)),
                Some(Event::End(pb::StateEnd {})),
            ]
        );
    }
}
