//! The localnet.v1 `Endpoints` service answered with bytes encoded once.
//!
//! tonic's generated server encodes every response message again for each
//! stream, so a revision sent to 100 clients was converted and encoded 100
//! times. This server is the generated one with another codec: a response
//! is an [`Encoded`] message, prost bytes made once per revision and copied
//! as they are into every stream. Requests are decoded with prost as
//! before, so the wire format is the generated one byte for byte (the
//! unit tests below compare them).

use std::convert::Infallible;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes};
use prost::encoding::{encode_key, encode_varint, WireType};
use proto::localnet::v1 as pb;
use tokio_stream::Stream;
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::codegen::{http, Body, BoxFuture, StdError};
use tonic::server::{Grpc, NamedService, ServerStreamingService};
use tonic::{Request, Response, Status};

use crate::grpc_unix::MAX_MESSAGE_BYTES;

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
}

impl Encoded {
    pub fn message(m: &impl prost::Message) -> Self {
        Encoded::Message(m.encode_to_vec().into())
    }

    /// Writes the message's bytes.
    pub fn write(&self, dst: &mut impl BufMut) {
        match self {
            Encoded::Message(b) => dst.put_slice(b),
            Encoded::Service(b) => {
                encode_key(2, WireType::LengthDelimited, dst);
                encode_varint(b.len() as u64, dst);
                dst.put_slice(b);
            }
        }
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
            "/localnet.v1.Endpoints/Next" => {
                Box::pin(async move { Ok(grpc().server_streaming(Next(api), req).await) })
            }
            "/localnet.v1.Endpoints/Watch" => {
                Box::pin(async move { Ok(grpc().server_streaming(Watch(api), req).await) })
            }
            _ => Box::pin(async { Ok(Status::unimplemented("").into_http()) }),
        }
    }
}

fn grpc<Req: prost::Message + Default + Send + 'static>() -> Grpc<EncodedCodec<Req>> {
    Grpc::new(EncodedCodec(PhantomData))
        .apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), Some(MAX_MESSAGE_BYTES))
}

struct Next<T>(T);

impl<T: Endpoints> ServerStreamingService<pb::NextFilter> for Next<T> {
    type Response = Encoded;
    type ResponseStream = EncodedStream;
    type Future = BoxFuture<Response<EncodedStream>, Status>;

    fn call(&mut self, request: Request<pb::NextFilter>) -> Self::Future {
        let api = self.0.clone();
        Box::pin(async move { api.next(request).await })
    }
}

struct Watch<T>(T);

impl<T: Endpoints> ServerStreamingService<pb::WatchRequest> for Watch<T> {
    type Response = Encoded;
    type ResponseStream = EncodedStream;
    type Future = BoxFuture<Response<EncodedStream>, Status>;

    fn call(&mut self, request: Request<pb::WatchRequest>) -> Self::Future {
        let api = self.0.clone();
        Box::pin(async move { api.watch(request).await })
    }
}

/// Decodes requests with prost, writes [`Encoded`] responses as they are.
struct EncodedCodec<Req>(PhantomData<Req>);

impl<Req: prost::Message + Default + Send + 'static> Codec for EncodedCodec<Req> {
    type Encode = Encoded;
    type Decode = Req;
    type Encoder = EncodedWriter;
    type Decoder = tonic_prost::ProstDecoder<Req>;

    fn encoder(&mut self) -> Self::Encoder {
        EncodedWriter
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::default()
    }
}

struct EncodedWriter;

/// tonic copies a stream's messages into a buffer and sends it once it
/// holds [`YIELD_AT`] bytes. Its default buffer (8 KiB, sent at 32 KiB)
/// is reallocated and copied as it doubles for every chunk sent: a full
/// `Watch` frame (~18 MiB at 50k services) to 100 watchers spent a third
/// of the daemon's time in those copies and allocations. A buffer that
/// starts at the size it is sent at is allocated once per chunk.
const BUFFER_BYTES: usize = 64 * 1024;
const YIELD_AT: usize = BUFFER_BYTES - 4 * 1024;

impl Encoder for EncodedWriter {
    type Item = Encoded;
    type Error = Status;

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        tonic::codec::BufferSettings::new(BUFFER_BYTES, YIELD_AT)
    }

    fn encode(&mut self, item: Encoded, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.write(dst);
        Ok(())
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
