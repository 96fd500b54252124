//! The localnet.v1 `Endpoints` service answered with bytes encoded once.
//!
//! tonic's generated server encodes every response message again for each
//! stream, so a revision sent to 100 clients was converted and encoded 100
//! times. Here a response is an [`Encoded`] message, prost bytes made once
//! per revision, and a large one goes into every stream as the same bytes
//! ([`super::body`]: not through tonic's per-stream buffer). Requests are
//! decoded with prost, so the wire format is the generated one byte for
//! byte (the unit tests below compare them).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use proto::localnet::v1 as pb;
use tokio_stream::Stream;
use tonic::codegen::{http, Body, BoxFuture, StdError};
use tonic::server::NamedService;
use tonic::{Request, Response, Status};

use super::body;

pub use proto::localnet::v1::endpoints_server::SERVICE_NAME;

/// One response message in wire form.
#[derive(Clone, Debug, PartialEq)]
pub enum Encoded {
    /// A whole message.
    Message(Bytes),
    /// A message whose only field is number 2 holding these bytes: an
    /// encoded `ServiceEndpoints` as `NextItem.endpoints` or as
    /// `WatchEvent.service` (both field 2), so one encoding serves both.
    Service(Bytes),
    /// Whole messages already in gRPC framing, each behind its
    /// [`GRPC_PREFIX`]-byte prefix: a frame's services laid out once and
    /// sent as they are by every stream.
    Framed(Bytes),
}

/// A gRPC message's prefix: the compression flag and the length.
pub const GRPC_PREFIX: usize = 5;

impl Encoded {
    pub fn message(m: &impl prost::Message) -> Self {
        Encoded::Message(m.encode_to_vec().into())
    }

    /// Writes the message's bytes (the messages with their prefixes for
    /// [`Encoded::Framed`]).
    pub fn write(&self, dst: &mut impl BufMut) {
        match self {
            Encoded::Message(b) | Encoded::Framed(b) => dst.put_slice(b),
            Encoded::Service(b) => {
                Self::write_service_header(b.len(), dst);
                dst.put_slice(b);
            }
        }
    }

    /// What comes before a service's `len` bytes in the message.
    pub fn write_service_header(len: usize, dst: &mut impl BufMut) {
        encode_key(2, WireType::LengthDelimited, dst);
        encode_varint(len as u64, dst);
    }

    /// The length of what [`Encoded::write`] writes.
    pub fn encoded_len(&self) -> usize {
        match self {
            Encoded::Message(b) | Encoded::Framed(b) => b.len(),
            Encoded::Service(b) => Self::service_len(b.len()),
        }
    }

    /// Each message written, without prefixes (tests read items with it).
    #[cfg(test)]
    pub(crate) fn messages(&self) -> Vec<Vec<u8>> {
        let Encoded::Framed(b) = self else {
            let mut out = Vec::new();
            self.write(&mut out);
            return vec![out];
        };
        let (mut rest, mut out) = (&b[..], Vec::new());
        while !rest.is_empty() {
            assert_eq!(rest[0], 0, "uncompressed");
            let len =
                u32::from_be_bytes(rest[1..GRPC_PREFIX].try_into().expect("4 bytes")) as usize;
            out.push(rest[GRPC_PREFIX..GRPC_PREFIX + len].to_vec());
            rest = &rest[GRPC_PREFIX + len..];
        }
        out
    }

    /// The length of the message around a service of `len` bytes.
    pub fn service_len(len: usize) -> usize {
        key_len(2) + encoded_len_varint(len as u64) + len
    }
}

pub type EncodedStream = Pin<Box<dyn Stream<Item = Result<Encoded, Status>> + Send>>;

/// The two calls of `localnet.v1.Endpoints`.
#[tonic::async_trait]
pub trait Endpoints: Clone + Send + Sync + 'static {
    async fn next(
        &self,
        request: Request<pb::NextFilter>,
    ) -> Result<Response<EncodedStream>, Status>;
    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<EncodedStream>, Status>;
}

/// The HTTP/2 service routing `/localnet.v1.Endpoints/*` to `T`.
#[derive(Clone, Debug)]
pub struct EndpointsServer<T> {
    api: T,
}

impl<T> EndpointsServer<T> {
    pub fn new(api: T) -> Self {
        Self { api }
    }
}

impl<T> NamedService for EndpointsServer<T> {
    const NAME: &'static str = SERVICE_NAME;
}

impl<T, B> tower::Service<http::Request<B>> for EndpointsServer<T>
where
    T: Endpoints,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let api = self.api.clone();
        match req.uri().path() {
            "/localnet.v1.Endpoints/Next" => Box::pin(async move {
                let answer = match body::request::<pb::NextFilter, B>(req).await {
                    Ok(r) => api.next(r).await,
                    Err(status) => Err(status),
                };
                Ok(body::response(answer))
            }),
            "/localnet.v1.Endpoints/Watch" => Box::pin(async move {
                let answer = match body::request::<pb::WatchRequest, B>(req).await {
                    Ok(r) => api.watch(r).await,
                    Err(status) => Err(status),
                };
                Ok(body::response(answer))
            }),
            _ => Box::pin(async { Ok(Status::unimplemented("").into_http()) }),
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    fn service() -> pb::ServiceEndpoints {
        pb::ServiceEndpoints {
            service: Some(pb::Service {
                namespace: "default".into(),
                name: "web".into(),
                ..Default::default()
            }),
            endpoints: vec![pb::Endpoint {
                ip: "10.0.0.1".into(),
                local: true,
                ..Default::default()
            }],
            local_ready_endpoints_v4: 1,
            local_ready_endpoints_v6: 0,
        }
    }

    fn written(e: &Encoded) -> Vec<u8> {
        let mut out = Vec::new();
        e.write(&mut out);
        assert_eq!(out.len(), e.encoded_len());
        out
    }

    #[test]
    fn a_pre_encoded_service_is_the_generated_next_item_and_watch_event() {
        let s = service();
        let encoded = Encoded::Service(s.encode_to_vec().into());
        let next = pb::NextItem {
            item: Some(pb::next_item::Item::Endpoints(s.clone())),
        };
        let event = pb::WatchEvent {
            event: Some(pb::watch_event::Event::Service(s)),
        };
        assert_eq!(written(&encoded), next.encode_to_vec());
        assert_eq!(written(&encoded), event.encode_to_vec());
    }

    #[test]
    fn an_empty_service_still_sets_the_field() {
        let encoded = Encoded::Service(Bytes::new());
        let next = pb::NextItem {
            item: Some(pb::next_item::Item::Endpoints(Default::default())),
        };
        assert_eq!(written(&encoded), next.encode_to_vec());
    }

    #[test]
    fn a_whole_message_is_written_as_prost_encodes_it() {
        let begin = pb::WatchEvent {
            event: Some(pb::watch_event::Event::Begin(pb::StateBegin {
                instance_id: 7,
                rev: 3,
                service_count: 2,
                ..Default::default()
            })),
        };
        assert_eq!(written(&Encoded::message(&begin)), begin.encode_to_vec());
    }
}
