//! The API server's protobuf answers, re-framed for kube-rs' watcher.
//!
//! The watcher (its lists with `continue`, its watches with bookmarks, its
//! 410 relists and backoff) reads JSON only. Rather than a second watcher,
//! a protobuf answer is re-framed as the JSON the watcher reads, with each
//! object left in protobuf: a list becomes `{"apiVersion", "kind",
//! "metadata", "items": [...]}` and a watch frame one line `{"type",
//! "object"}`, each object a JSON string holding [`MARK`] and the
//! object's message in base64 ([`super::raw::RawObject`] takes it as
//! such and [`super::pb`] decodes it). Bookmarks carry their
//! resourceVersion and `Status` objects (an ERROR event, an error answer)
//! are turned into JSON: the watcher reads them.
//!
//! An answer that is not what it says (no envelope, a list that does not
//! decode, a watch frame that does not) becomes an error the watcher
//! reports and retries with backoff; the last good state stays.

use std::sync::Arc;

use base64::Engine as _;
use bytes::{Buf, Bytes, BytesMut};
use prost::Message;
use proto::k8s as pb;
use serde_json::json;

use super::events::UnknownEvents;

/// What starts the JSON string of an object carried in protobuf, after
/// its opening quote: an escaped NUL (no API object is a string, let
/// alone one starting with NUL) and a name.
pub(super) const MARK: &str = "\\u0000k8s-pb:";

const BASE64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// A watch frame longer than this is refused (etcd stores objects of at
/// most 1.5 MiB; a length past this is a stream out of step).
const MAX_FRAME: usize = 64 << 20;

/// `bytes` as the JSON string [`object_bytes`] reads back.
pub(super) fn push_object(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'"');
    out.extend_from_slice(MARK.as_bytes());
    let start = out.len();
    out.resize(start + bytes.len().div_ceil(3) * 4, 0);
    let n = BASE64
        .encode_slice(bytes, &mut out[start..])
        .expect("sized for the encoding");
    out.truncate(start + n);
    out.push(b'"');
}

/// The protobuf bytes of an object carried as [`push_object`] wrote it,
/// given the object's JSON text; `None` when it is not one.
pub(super) fn object_bytes(json: &str) -> Option<Result<Bytes, String>> {
    let b64 = json
        .strip_prefix('"')?
        .strip_prefix(MARK)?
        .strip_suffix('"')?;
    Some(
        BASE64
            .decode(b64)
            .map(Bytes::from)
            .map_err(|e| format!("protobuf object in base64: {e}")),
    )
}

/// Whether a response's `Content-Type` is the protobuf encoding.
pub(super) fn is_protobuf(content_type: Option<&http::HeaderValue>) -> bool {
    content_type
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with(pb::CONTENT_TYPE))
}

fn status_json(code: i32, reason: &str, message: &str) -> serde_json::Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

/// A `Status` message as JSON.
fn status_of(message: &Bytes) -> Result<serde_json::Value, String> {
    let s = pb::Status::decode(message.clone()).map_err(|e| format!("protobuf Status: {e}"))?;
    Ok(json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
              "status": s.status.unwrap_or_default(), "message": s.message.unwrap_or_default(),
              "reason": s.reason.unwrap_or_default(), "code": s.code.unwrap_or(0)}))
}

/// A whole protobuf answer (a list, or a `Status`) as JSON.
pub(super) fn answer_to_json(body: &Bytes) -> Result<Vec<u8>, String> {
    let opened = pb::open(body).map_err(|e| format!("protobuf answer: {e}"))?;
    if opened.kind == "Status" {
        return Ok(status_of(&opened.raw)?.to_string().into_bytes());
    }
    if !opened.kind.ends_with("List") {
        return Err(format!(
            "protobuf answer holds a {} {}, not a list",
            opened.api_version, opened.kind
        ));
    }
    let list = pb::RawList::decode(opened.raw.clone())
        .map_err(|e| format!("protobuf {}: {e}", opened.kind))?;
    let meta = list.metadata.unwrap_or_default();
    let mut metadata = json!({"resourceVersion": meta.resource_version.unwrap_or_default()});
    if let Some(c) = meta.r#continue.filter(|c| !c.is_empty()) {
        metadata["continue"] = json!(c);
    }
    if let Some(n) = meta.remaining_item_count {
        metadata["remainingItemCount"] = json!(n);
    }
    let head = json!({"apiVersion": opened.api_version, "kind": opened.kind, "metadata": metadata})
        .to_string();
    let items_len: usize = list.items.iter().map(|i| i.len() * 4 / 3 + 24).sum();
    let mut out = Vec::with_capacity(head.len() + 16 + items_len);
    // `{...}` → `{...,"items":[a,b]}`
    out.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in list.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_object(&mut out, item);
    }
    out.extend_from_slice(b"]}");
    Ok(out)
}

/// An answer that could not be read, as the JSON `Status` of an error.
pub(super) fn unreadable(code: u16, message: &str) -> Vec<u8> {
    status_json(
        i32::from(code),
        "InternalError",
        &format!("the API server's protobuf answer could not be read: {message}"),
    )
    .to_string()
    .into_bytes()
}

/// A protobuf watch stream (length-prefixed `WatchEvent` frames) turned
/// into JSON lines as chunks come in.
pub(super) struct WatchFrames {
    resource: String,
    unknown: Arc<UnknownEvents>,
    buf: BytesMut,
    /// The stream is out of step: the rest is dropped.
    failed: bool,
}

impl WatchFrames {
    pub(super) fn new(resource: &str, unknown: Arc<UnknownEvents>) -> Self {
        WatchFrames {
            resource: resource.to_owned(),
            unknown,
            buf: BytesMut::new(),
            failed: false,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The JSON lines of the frames `data` completes.
    pub(super) fn push(&mut self, data: &[u8]) -> Bytes {
        let mut out = Vec::new();
        if self.failed {
            return Bytes::new();
        }
        self.buf.extend_from_slice(data);
        while self.buf.len() >= 4 {
            let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            if len > MAX_FRAME {
                self.fail(
                    &mut out,
                    &format!("a frame of {len} bytes, more than {MAX_FRAME}"),
                );
                break;
            }
            if self.buf.len() < 4 + len {
                break;
            }
            self.buf.advance(4);
            let frame = self.buf.split_to(len).freeze();
            match pb::WatchEvent::decode(frame) {
                Ok(event) => self.event(event, &mut out),
                Err(e) => {
                    self.fail(&mut out, &format!("WatchEvent: {e}"));
                    break;
                }
            }
        }
        Bytes::from(out)
    }

    /// The end of the stream: a frame cut short is dropped, as kube-rs
    /// drops a JSON line cut short.
    pub(super) fn finish(&mut self) -> Bytes {
        self.buf.clear();
        Bytes::new()
    }

    fn fail(&mut self, out: &mut Vec<u8>, message: &str) {
        self.failed = true;
        self.buf.clear();
        tracing::warn!(resource = %self.resource, error = message, "protobuf watch stream out of step; ending it");
        let status = status_json(
            500,
            "InternalError",
            &format!("protobuf watch stream: {message}"),
        );
        out.extend_from_slice(
            json!({"type": "ERROR", "object": status})
                .to_string()
                .as_bytes(),
        );
        out.push(b'\n');
    }

    fn event(&mut self, event: pb::WatchEvent, out: &mut Vec<u8>) {
        let event_type = event.r#type.unwrap_or_default();
        let raw = event.object.and_then(|o| o.raw).unwrap_or_default();
        match event_type.as_str() {
            "ADDED" | "MODIFIED" | "DELETED" => {
                out.extend_from_slice(b"{\"type\":\"");
                out.extend_from_slice(event_type.as_bytes());
                out.extend_from_slice(b"\",\"object\":");
                push_object(out, &raw);
                out.extend_from_slice(b"}\n");
            }
            "BOOKMARK" => {
                let line = match pb::open(&raw) {
                    Ok(o) => {
                        let rv = super::pb::head(&o.raw)
                            .and_then(|h| h.resource_version)
                            .unwrap_or_default();
                        json!({"type": "BOOKMARK", "object": {"kind": o.kind, "apiVersion": o.api_version,
                               "metadata": {"resourceVersion": rv}}})
                    }
                    Err(e) => json!({"type": "ERROR", "object":
                        status_json(500, "InternalError", &format!("protobuf bookmark: {e}"))}),
                };
                out.extend_from_slice(line.to_string().as_bytes());
                out.push(b'\n');
            }
            "ERROR" => {
                let status = pb::open(&raw)
                    .map_err(|e| e.to_string())
                    .and_then(|o| status_of(&o.raw))
                    .unwrap_or_else(|e| {
                        status_json(500, "InternalError", &format!("protobuf ERROR event: {e}"))
                    });
                out.extend_from_slice(
                    json!({"type": "ERROR", "object": status})
                        .to_string()
                        .as_bytes(),
                );
                out.push(b'\n');
            }
            other => self.unknown.record(&self.resource, other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_travels_through_its_json_string_unchanged() {
        for bytes in [&b""[..], b"\0", b"k8s\0\x01\xff", &[7u8; 1000][..]] {
            let mut out = Vec::new();
            push_object(&mut out, bytes);
            let text = String::from_utf8(out).expect("base64 is ASCII");
            // It is one JSON string.
            let s: String = serde_json::from_str(&text).expect("a JSON string");
            assert!(s.starts_with("\0k8s-pb:"), "{s:?}");
            let back = object_bytes(&text).expect("marked").expect("decodes");
            assert_eq!(&back[..], bytes);
        }
        assert!(object_bytes(r#""plain""#).is_none());
        assert!(object_bytes(r#"{"a":1}"#).is_none());
    }

    fn frame(event: &pb::WatchEvent) -> Vec<u8> {
        let body = event.encode_to_vec();
        let mut out = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn frames_become_lines_wherever_chunks_split_and_a_bad_frame_ends_the_stream() {
        let object = pb::enveloped("v1", "Service", b"\x0a\x02\x0a\x00");
        let event = |t: &str| pb::WatchEvent {
            r#type: Some(t.to_owned()),
            object: Some(pb::RawExtension {
                raw: Some(Bytes::from(object.clone())),
            }),
        };
        let mut stream = Vec::new();
        stream.extend(frame(&event("ADDED")));
        stream.extend(frame(&event("RESYNC")));
        stream.extend(frame(&event("DELETED")));
        // Not a WatchEvent: field 1 with wire type 7.
        stream.extend([0, 0, 0, 2, 0x0f, 0x00]);
        stream.extend(frame(&event("MODIFIED")));
        for chunk in [stream.len(), 1, 5] {
            let unknown = Arc::new(UnknownEvents::default());
            let mut frames = WatchFrames::new("/api/v1/services", unknown.clone());
            let mut out = Vec::new();
            for c in stream.chunks(chunk) {
                out.extend_from_slice(&frames.push(c));
            }
            out.extend_from_slice(&frames.finish());
            let lines: Vec<serde_json::Value> = String::from_utf8(out)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            let types: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
            assert_eq!(types, ["ADDED", "DELETED", "ERROR"], "chunks of {chunk}");
            assert_eq!(unknown.take(), 1);
            let message = lines[2]["object"]["message"].as_str().unwrap();
            assert!(
                message.starts_with("protobuf watch stream: WatchEvent"),
                "{message}"
            );
            let item = lines[0]["object"].to_string();
            let back = object_bytes(&item).unwrap().unwrap();
            assert_eq!(&back[..], &object[..]);
        }
    }
}
