//! A server-streaming gRPC call answered without copying the shared bytes.
//!
//! tonic's server copies every response message into a per-stream buffer
//! before HTTP/2 sends it: a service message of 9 MB (one Service with
//! 100,000 endpoints) went to 100 waiting clients as 100 copies held
//! until each client read it (VmHWM 771–857 MiB, 102 MiB with one
//! client). Here a large pre-encoded service goes to the connection as a
//! clone of the frame's [`Bytes`] behind its own 5-byte gRPC prefix and
//! field header; small messages are gathered into one buffer per chunk as
//! tonic does. Requests (one unary message, uncompressed) are decoded
//! with prost; the wire format is what tonic writes, and grpcio and
//! tonic clients read it (tests/grpc_clients.rs, the localnet tests).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http_body::Frame;
use http_body_util::BodyExt;
use tonic::codegen::{http, Body, StdError};
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

use super::wire::{Encoded, EncodedStream};
use crate::grpc_unix::MAX_MESSAGE_BYTES;

/// A service message at least this long is sent as the frame's own bytes
/// (a clone of the shared [`Bytes`]), not copied into the stream's
/// buffer.
pub const SHARED_AT: usize = 16 * 1024;
/// Small messages are gathered and sent once this many bytes wait (as
/// tonic's default yield threshold).
const YIELD_AT: usize = 32 * 1024;

/// Reads the one request message of a unary-request call.
pub async fn request<Req, B>(req: http::Request<B>) -> Result<Request<Req>, Status>
where
    Req: prost::Message + Default,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<StdError> + Send + 'static,
{
    let (parts, body) = req.into_parts();
    if let Some(enc) = parts.headers.get("grpc-encoding") {
        if enc.as_bytes() != b"identity" {
            return Err(Status::unimplemented(format!(
                "Content is compressed with `{}` which isn't supported",
                String::from_utf8_lossy(enc.as_bytes())
            )));
        }
    }
    let limited = http_body_util::Limited::new(body, MAX_MESSAGE_BYTES + 5);
    let bytes = limited
        .collect()
        .await
        .map_err(|e| Status::internal(format!("reading the request: {e}")))?
        .to_bytes();
    let (flag, len) = match bytes.get(..5) {
        Some(h) => (h[0], u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize),
        None => return Err(Status::internal("Missing request message.")),
    };
    if flag != 0 {
        return Err(Status::unimplemented(
            "compressed requests are not supported",
        ));
    }
    if bytes.len() != 5 + len {
        return Err(Status::internal(
            "the request is not exactly one whole message",
        ));
    }
    let message = Req::decode(bytes.slice(5..))
        .map_err(|e| Status::internal(format!("decoding the request: {e}")))?;
    Ok(Request::from_parts(
        MetadataMap::from_headers(parts.headers),
        parts.extensions,
        message,
    ))
}

/// The HTTP response of a server-streaming call whose handler answered
/// `response`.
pub fn response(
    response: Result<tonic::Response<EncodedStream>, Status>,
) -> http::Response<tonic::body::Body> {
    let (metadata, stream, extensions) = match response {
        Ok(r) => r.into_parts(),
        Err(status) => return status.into_http(),
    };
    let mut res = http::Response::new(tonic::body::Body::new(EncodedBody::new(stream)));
    *res.headers_mut() = metadata.into_headers();
    *res.extensions_mut() = extensions;
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    res
}

/// The body of a streaming response: gRPC-framed [`Encoded`] messages,
/// then the status as trailers.
pub struct EncodedBody {
    stream: Option<EncodedStream>,
    /// Small messages gathered for the next chunk.
    buf: BytesMut,
    /// Chunks ready to go, in order.
    ready: VecDeque<Bytes>,
    trailers: Option<http::HeaderMap>,
}

impl EncodedBody {
    pub fn new(stream: EncodedStream) -> Self {
        EncodedBody {
            stream: Some(stream),
            buf: BytesMut::new(),
            ready: VecDeque::new(),
            trailers: None,
        }
    }

    fn flush(&mut self) {
        if !self.buf.is_empty() {
            self.ready.push_back(self.buf.split().freeze());
        }
    }

    /// Frames one message: a large service is queued as its own bytes,
    /// messages already framed as they are.
    fn push(&mut self, item: Encoded) -> Result<(), Status> {
        if let Encoded::Framed(b) = item {
            self.flush();
            self.ready.push_back(b);
            return Ok(());
        }
        let len = item.encoded_len();
        if len > MAX_MESSAGE_BYTES {
            return Err(Status::out_of_range(format!(
                "Error, encoded message length too large: found {len} bytes, the limit is: {MAX_MESSAGE_BYTES} bytes"
            )));
        }
        self.buf.reserve(5 + len.min(YIELD_AT));
        self.buf.put_u8(0);
        self.buf.put_u32(len as u32);
        match item {
            Encoded::Service(b) if b.len() >= SHARED_AT => {
                Encoded::write_service_header(b.len(), &mut self.buf);
                self.flush();
                self.ready.push_back(b);
            }
            other => {
                other.write(&mut self.buf);
                if self.buf.len() >= YIELD_AT {
                    self.flush();
                }
            }
        }
        Ok(())
    }

    fn finish(&mut self, status: Status) {
        self.flush();
        self.stream = None;
        let mut trailers = http::HeaderMap::new();
        if status.add_header(&mut trailers).is_err() {
            trailers.insert("grpc-status", http::HeaderValue::from_static("13"));
        }
        self.trailers = Some(trailers);
    }
}

impl Body for EncodedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        loop {
            if let Some(b) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
            let Some(stream) = this.stream.as_mut() else {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            };
            match stream.as_mut().poll_next(cx) {
                Poll::Ready(Some(Ok(item))) => {
                    if let Err(status) = this.push(item) {
                        this.finish(status);
                    }
                }
                Poll::Ready(Some(Err(status))) => this.finish(status),
                Poll::Ready(None) => this.finish(Status::ok("")),
                // Send what is gathered rather than hold it back.
                Poll::Pending if !this.buf.is_empty() => this.flush(),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.stream.is_none() && self.ready.is_empty() && self.trailers.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use proto::localnet::v1 as pb;

    /// Reads a whole body: its data chunks and its trailers.
    async fn drain(mut body: EncodedBody) -> (Vec<Bytes>, http::HeaderMap) {
        let (mut chunks, mut trailers) = (Vec::new(), http::HeaderMap::new());
        while let Some(frame) = body.frame().await {
            let frame = frame.expect("no error");
            match frame.into_data() {
                Ok(d) => chunks.push(d),
                Err(f) => trailers = f.into_trailers().expect("trailers"),
            }
        }
        (chunks, trailers)
    }

    /// The gRPC messages in `bytes`.
    fn messages(mut bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            assert_eq!(bytes[0], 0, "uncompressed");
            let len = u32::from_be_bytes(bytes[1..5].try_into().unwrap()) as usize;
            out.push(bytes[5..5 + len].to_vec());
            bytes = &bytes[5 + len..];
        }
        out
    }

    fn big_service() -> pb::ServiceEndpoints {
        pb::ServiceEndpoints {
            endpoints: (0..5_000)
                .map(|i| pb::Endpoint {
                    ip: format!("10.0.{}.{}", i / 250, i % 250),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_large_service_goes_out_as_the_shared_bytes_and_reads_as_tonic_writes_it() {
        let big = Bytes::from(big_service().encode_to_vec());
        assert!(big.len() >= SHARED_AT);
        let begin = pb::WatchEvent {
            event: Some(pb::watch_event::Event::Begin(pb::StateBegin {
                rev: 4,
                service_count: 1,
                ..Default::default()
            })),
        };
        let items: Vec<Result<Encoded, Status>> = vec![
            Ok(Encoded::message(&begin)),
            Ok(Encoded::Service(big.clone())),
            Ok(Encoded::Service(Bytes::from_static(b""))),
        ];
        let body = EncodedBody::new(Box::pin(tokio_stream::iter(items)));
        let (chunks, trailers) = drain(body).await;
        // The service's bytes are the frame's own allocation.
        assert!(
            chunks.iter().any(|c| c.as_ptr() == big.as_ptr()),
            "the shared bytes were copied"
        );
        let all: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        let event = |e| pb::WatchEvent { event: Some(e) }.encode_to_vec();
        assert_eq!(
            messages(&all),
            [
                begin.encode_to_vec(),
                event(pb::watch_event::Event::Service(big_service())),
                event(pb::watch_event::Event::Service(Default::default())),
            ]
        );
        assert_eq!(trailers["grpc-status"], "0");
    }

    #[tokio::test]
    async fn an_error_ends_the_stream_with_its_status() {
        let items: Vec<Result<Encoded, Status>> = vec![
            Ok(Encoded::Service(Bytes::from_static(b"\x0a\x00"))),
            Err(Status::unavailable("server shutting down")),
        ];
        let (chunks, trailers) = drain(EncodedBody::new(Box::pin(tokio_stream::iter(items)))).await;
        assert_eq!(messages(&chunks.concat()).len(), 1);
        assert_eq!(trailers["grpc-status"], "14");
        // Percent-encoded, as the gRPC spec says.
        assert_eq!(trailers["grpc-message"], "server%20shutting%20down");
    }
}
