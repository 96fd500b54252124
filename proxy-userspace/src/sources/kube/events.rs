//! Watch events of a type the API does not define (not ADDED, MODIFIED,
//! DELETED, BOOKMARK or ERROR), taken out of the watch responses before
//! kube-rs reads them.
//!
//! kube-rs cannot decode such a line as an event; it reads it as an empty
//! `Status` and its watcher reports a watch failure with no text (and
//! backs off), so the event's type would be lost and the resource marked
//! stale. Instead each such line is dropped from the response here,
//! logged once (one line per event) with its type, and counted: the source reports it as a
//! rejected object (`undecodable`).
//!
//! The same layer asks for protobuf when `--kube-api-content-type` says
//! so (`Accept: application/vnd.kubernetes.protobuf, application/json`,
//! as client-go asks) and re-frames a protobuf answer for kube-rs
//! ([`super::pb_body`]); an answer in JSON (a server that does not
//! speak protobuf) is read as JSON.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use kube::client::{Body as KubeBody, DynBody};

use super::pb_body;

/// The event types of the watch protocol.
const KNOWN: [&str; 5] = ["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"];

/// Unknown events seen and not yet reported by the source.
#[derive(Debug, Default)]
pub struct UnknownEvents {
    pending: AtomicU64,
    pub(super) arrived: tokio::sync::Notify,
}

impl UnknownEvents {
    pub(super) fn record(&self, resource: &str, event_type: &str) {
        tracing::warn!(
            resource,
            event_type,
            "watch event of an unknown type; ignored"
        );
        self.pending.fetch_add(1, Ordering::SeqCst);
        self.arrived.notify_one();
    }

    /// The events seen since the last call.
    pub(super) fn take(&self) -> u64 {
        self.pending.swap(0, Ordering::SeqCst)
    }
}

/// The kube client's HTTP service with watch responses filtered, and
/// protobuf asked for and read when `protobuf`.
pub struct Filtered<S> {
    inner: S,
    unknown: Arc<UnknownEvents>,
    protobuf: bool,
}

impl<S> Filtered<S> {
    pub fn new(inner: S, unknown: Arc<UnknownEvents>, protobuf: bool) -> Self {
        Self {
            inner,
            unknown,
            protobuf,
        }
    }
}

/// What a protobuf-capable client accepts, as client-go's.
const ACCEPT_PROTOBUF: &str = "application/vnd.kubernetes.protobuf, application/json";

/// Whether `path` is a collection the source lists and watches.
fn is_watched_collection(path: &str) -> bool {
    ["/services", "/endpointslices", "/nodes", "/pods"]
        .iter()
        .any(|c| path.ends_with(c))
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> tower::Service<Request<KubeBody>> for Filtered<S>
where
    S: tower::Service<Request<KubeBody>, Response = Response<Box<DynBody>>>,
    S::Future: Send + 'static,
{
    type Response = Response<FilteredBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<KubeBody>) -> Self::Future {
        let watch = req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        let path = req.uri().path().to_owned();
        if self.protobuf && req.method() == http::Method::GET && is_watched_collection(&path) {
            req.headers_mut().insert(
                http::header::ACCEPT,
                http::HeaderValue::from_static(ACCEPT_PROTOBUF),
            );
        }
        let unknown = self.unknown.clone();
        let response = self.inner.call(req);
        Box::pin(async move {
            let response = response.await?;
            if !pb_body::is_protobuf(response.headers().get(http::header::CONTENT_TYPE)) {
                let filter = watch.then(|| Filter::Lines(LineFilter::new(&path, unknown)));
                return Ok(response.map(|inner| FilteredBody { inner, filter }));
            }
            let (mut parts, body) = response.into_parts();
            parts.headers.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            if watch && parts.status.is_success() {
                let filter = Some(Filter::Frames(pb_body::WatchFrames::new(&path, unknown)));
                return Ok(Response::from_parts(
                    parts,
                    FilteredBody {
                        inner: body,
                        filter,
                    },
                ));
            }
            // A list or an error: read whole, then re-framed.
            let json = match http_body_util::BodyExt::collect(body).await {
                Ok(collected) => {
                    pb_body::answer_to_json(&collected.to_bytes()).unwrap_or_else(|e| {
                        if parts.status.is_success() {
                            parts.status = http::StatusCode::INTERNAL_SERVER_ERROR;
                        }
                        pb_body::unreadable(parts.status.as_u16(), &e)
                    })
                }
                Err(e) => {
                    if parts.status.is_success() {
                        parts.status = http::StatusCode::BAD_GATEWAY;
                    }
                    pb_body::unreadable(parts.status.as_u16(), &format!("reading it: {e}"))
                }
            };
            parts.headers.remove(http::header::CONTENT_LENGTH);
            let full = http_body_util::Full::new(Bytes::from(json));
            let inner: Box<DynBody> = Box::new(http_body_util::BodyExt::map_err(
                full,
                |never: std::convert::Infallible| match never {},
            ));
            Ok(Response::from_parts(
                parts,
                FilteredBody {
                    inner,
                    filter: None,
                },
            ))
        })
    }
}

/// A response body; a watch response's is passed through [`LineFilter`]
/// (JSON) or [`pb_body::WatchFrames`] (protobuf).
pub struct FilteredBody {
    inner: Box<DynBody>,
    filter: Option<Filter>,
}

enum Filter {
    Lines(LineFilter),
    Frames(pb_body::WatchFrames),
}

impl Filter {
    fn push(&mut self, data: &[u8]) -> Bytes {
        match self {
            Filter::Lines(f) => f.push(data),
            Filter::Frames(f) => f.push(data),
        }
    }

    fn finish(&mut self) -> Bytes {
        match self {
            Filter::Lines(f) => f.finish(),
            Filter::Frames(f) => f.finish(),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Filter::Lines(f) => f.is_empty(),
            Filter::Frames(f) => f.is_empty(),
        }
    }
}

impl Body for FilteredBody {
    type Data = Bytes;
    type Error = <DynBody as Body>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        loop {
            let polled = Pin::new(&mut this.inner).poll_frame(cx);
            let Some(filter) = this.filter.as_mut() else {
                return polled;
            };
            match polled {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        let out = filter.push(&data);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(other) => return Poll::Ready(Some(Ok(other))),
                },
                Poll::Ready(None) => {
                    let rest = filter.finish();
                    return Poll::Ready((!rest.is_empty()).then(|| Ok(Frame::data(rest))));
                }
                other => return other,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream() && self.filter.as_ref().is_none_or(Filter::is_empty)
    }

    fn size_hint(&self) -> SizeHint {
        match self.filter {
            None => self.inner.size_hint(),
            Some(_) => SizeHint::default(),
        }
    }
}

/// What is known of the line being read.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Line {
    /// Its type is not read yet: the line is held.
    Undecided,
    Pass,
    Drop,
}

/// Splits a watch response into lines and drops those whose event type is
/// unknown. The API server writes `{"type":"…",` first, so a line is held
/// only until its type is read; a line written otherwise is held whole and
/// its type read by a JSON parse.
struct LineFilter {
    resource: String,
    unknown: Arc<UnknownEvents>,
    line: Line,
    held: Vec<u8>,
}

const PREFIX: &[u8] = br#"{"type":""#;

impl LineFilter {
    fn new(resource: &str, unknown: Arc<UnknownEvents>) -> Self {
        Self {
            resource: resource.to_owned(),
            unknown,
            line: Line::Undecided,
            held: Vec::new(),
        }
    }

    fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// What of `data` goes on to kube-rs.
    fn push(&mut self, mut data: &[u8]) -> Bytes {
        let mut out = BytesMut::new();
        while !data.is_empty() {
            let (part, ended) = match memchr(data) {
                Some(i) => (&data[..=i], true),
                None => (data, false),
            };
            data = &data[part.len()..];
            match self.line {
                Line::Pass => out.extend_from_slice(part),
                Line::Drop => {}
                Line::Undecided => {
                    self.held.extend_from_slice(part);
                    self.line = self.decide(ended);
                    if self.line == Line::Pass {
                        out.extend_from_slice(&self.held);
                    }
                    if self.line != Line::Undecided {
                        self.held.clear();
                    }
                }
            }
            if ended {
                self.line = Line::Undecided;
            }
        }
        out.freeze()
    }

    /// The rest at the end of the response: an unfinished line goes on.
    fn finish(&mut self) -> Bytes {
        Bytes::from(std::mem::take(&mut self.held))
    }

    fn decide(&mut self, ended: bool) -> Line {
        let held = &self.held;
        let event_type = if held.starts_with(PREFIX) {
            let rest = &held[PREFIX.len()..];
            match rest.iter().position(|&b| b == b'"') {
                Some(end) => String::from_utf8_lossy(&rest[..end]).into_owned(),
                None if ended => return Line::Pass,
                None => return Line::Undecided,
            }
        } else if !ended {
            // Too short to tell, or another layout: the whole line is
            // needed.
            return Line::Undecided;
        } else {
            #[derive(serde::Deserialize)]
            struct TypeOnly {
                #[serde(rename = "type")]
                event_type: Option<String>,
            }
            match serde_json::from_slice::<TypeOnly>(held) {
                Ok(TypeOnly {
                    event_type: Some(t),
                }) => t,
                // Not an event: kube-rs says what it is.
                _ => return Line::Pass,
            }
        };
        if KNOWN.contains(&event_type.as_str()) {
            return Line::Pass;
        }
        self.unknown.record(&self.resource, &event_type);
        Line::Drop
    }
}

fn memchr(data: &[u8]) -> Option<usize> {
    data.iter().position(|&b| b == b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter_all(chunks: &[&[u8]]) -> (Vec<u8>, u64) {
        let unknown = Arc::new(UnknownEvents::default());
        let mut f = LineFilter::new("/api/v1/services", unknown.clone());
        let mut out = Vec::new();
        for c in chunks {
            out.extend_from_slice(&f.push(c));
        }
        out.extend_from_slice(&f.finish());
        (out, unknown.take())
    }

    #[test]
    fn lines_of_unknown_types_are_dropped_and_counted_wherever_chunks_split() {
        let text = concat!(
            r#"{"type":"ADDED","object":{"kind":"Service"}}"#,
            "\n",
            r#"{"type":"RESYNC","object":{"kind":"Service"}}"#,
            "\n",
            r#"{"object":{"kind":"Service"},"type":"WEIRD"}"#,
            "\n",
            r#"{"object":{"kind":"Service"},"type":"MODIFIED"}"#,
            "\n",
            r#"{"type":"BOOKMARK","object":{}}"#,
            "\n",
            r#"{"kind":"Status","code":500}"#,
            "\n",
            r#"{"type":"DELETED","obj"#
        );
        let expected = concat!(
            r#"{"type":"ADDED","object":{"kind":"Service"}}"#,
            "\n",
            r#"{"object":{"kind":"Service"},"type":"MODIFIED"}"#,
            "\n",
            r#"{"type":"BOOKMARK","object":{}}"#,
            "\n",
            r#"{"kind":"Status","code":500}"#,
            "\n",
            r#"{"type":"DELETED","obj"#
        );
        let bytes = text.as_bytes();
        assert_eq!(
            filter_all(&[bytes]),
            (expected.as_bytes().to_vec(), 2),
            "in one piece"
        );
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(
            filter_all(&singles),
            (expected.as_bytes().to_vec(), 2),
            "a byte at a time"
        );
    }
}
