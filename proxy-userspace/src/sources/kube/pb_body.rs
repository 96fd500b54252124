//! The API server's protobuf answers, re-framed for kube-rs' watcher.
//!
//! The watcher (its lists with `continue`, its watches with bookmarks, its
//! 410 relists and backoff) reads JSON only. Rather than a second watcher,
//! a protobuf answer is re-framed as the JSON the watcher reads, with each
//! object left in protobuf and out of the JSON: a list becomes
//! `{"apiVersion", "kind", "metadata", "items": [...]}` and a watch frame
//! one line `{"type", "object"}`, each object a short JSON string, a
//! token ([`MARK`], then the numbers of the answer and of the object)
//! naming the object's message, which waits in [`CARRIED`] for
//! [`super::raw::RawObject`] to take it as the watcher reads the JSON
//! ([`super::pb`] then reads the message). The JSON stays a few bytes an
//! object and no message is copied: an item is a slice of the answer. Bookmarks carry their
//! resourceVersion and `Status` objects (an ERROR event, an error answer)
//! are turned into JSON: the watcher reads them.
//!
//! An answer that is not what it says (no envelope, a list that does not
//! decode, a watch frame that does not) becomes an error the watcher
//! reports and retries with backoff; the last good state stays.

use std::sync::Arc;

use std::collections::VecDeque;
use std::sync::Mutex;

use bytes::{Buf, Bytes, BytesMut};
use prost::Message;
use proto::k8s as pb;
use serde_json::json;

use super::events::UnknownEvents;

/// What starts the JSON string of an object carried in protobuf, after
/// its opening quote: an escaped NUL (no API object is a string, let
/// alone one starting with NUL) and a name.
pub(super) const MARK: &str = "\\u0000k8s-pb:";

/// A watch frame longer than this is refused (etcd stores objects of at
/// most 1.5 MiB; a length past this is a stream out of step).
const MAX_FRAME: usize = 64 << 20;

/// The messages of answers re-framed and not read yet.
static CARRIED: Mutex<Carried> = Mutex::new(Carried {
    next: 0,
    answers: VecDeque::new(),
});

/// Answers whose messages are held at most. kube-rs reads a list's JSON
/// as soon as it has the body, and a watch response's lines before it
/// asks for the next chunk, so each watch holds one or two and a list
/// one: an answer is dropped here only when what was to read it went
/// away (a watch ended with lines unread), and a token of an answer gone
/// is refused as undecodable, never read as something else.
const MAX_ANSWERS: usize = 64;

struct Carried {
    next: u64,
    answers: VecDeque<Answer>,
}

/// One answer's messages, each taken once.
struct Answer {
    id: u64,
    items: Vec<Option<Bytes>>,
    left: usize,
}

impl Carried {
    /// Holds `items` as the answer `id`.
    fn hold(&mut self, id: u64, items: Vec<Bytes>) {
        if items.is_empty() {
            return;
        }
        if self.answers.len() >= MAX_ANSWERS {
            self.answers.pop_front();
        }
        self.answers.push_back(Answer {
            id,
            left: items.len(),
            items: items.into_iter().map(Some).collect(),
        });
    }

    fn take(&mut self, id: u64, index: usize) -> Option<Bytes> {
        let at = self.answers.iter().rposition(|a| a.id == id)?;
        let answer = &mut self.answers[at];
        let item = answer.items.get_mut(index)?.take()?;
        answer.left -= 1;
        if answer.left == 0 {
            self.answers.remove(at);
        }
        Some(item)
    }
}

fn carried() -> std::sync::MutexGuard<'static, Carried> {
    // Nothing panics while holding it; a poisoned lock holds whole answers.
    CARRIED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The number of a new answer.
fn answer_id() -> u64 {
    let mut c = carried();
    c.next += 1;
    c.next
}

/// The token of object `index` of answer `id`, as a JSON string.
fn push_token(out: &mut Vec<u8>, id: u64, index: usize) {
    use std::io::Write as _;
    write!(out, "\"{MARK}{id}:{index}\"").expect("a Vec grows as needed");
}

/// `bytes` carried as one object: its token, as a JSON string, for
/// [`object_bytes`] to take back (tests build carried objects with it).
#[cfg(test)]
pub(super) fn push_object(out: &mut Vec<u8>, bytes: &[u8]) {
    let id = answer_id();
    carried().hold(id, vec![Bytes::copy_from_slice(bytes)]);
    push_token(out, id, 0);
}

/// The protobuf message of an object carried as a token, given the
/// object's JSON text; `None` when it is not one. A token is taken once.
pub(super) fn object_bytes(json: &str) -> Option<Result<Bytes, String>> {
    let token = json
        .strip_prefix('"')?
        .strip_prefix(MARK)?
        .strip_suffix('"')?;
    let taken = token
        .split_once(':')
        .and_then(|(id, index)| Some((id.parse().ok()?, index.parse().ok()?)))
        .and_then(|(id, index)| carried().take(id, index));
    Some(taken.ok_or_else(|| format!("protobuf object {token:?} is not held (any more)")))
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
    let id = answer_id();
    let mut out = Vec::with_capacity(head.len() + 16 + list.items.len() * 32);
    // `{...}` → `{...,"items":[a,b]}`
    out.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
    out.extend_from_slice(b",\"items\":[");
    for i in 0..list.items.len() {
        if i > 0 {
            out.push(b',');
        }
        push_token(&mut out, id, i);
    }
    out.extend_from_slice(b"]}");
    carried().hold(id, list.items);
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
        let mut objects = (answer_id(), Vec::new());
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
                Ok(event) => self.event(event, &mut out, &mut objects),
                Err(e) => {
                    self.fail(&mut out, &format!("WatchEvent: {e}"));
                    break;
                }
            }
        }
        carried().hold(objects.0, objects.1);
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

    /// Writes `event`'s line; its object joins `objects` (the answer
    /// number this chunk's objects are held under, and them).
    fn event(&mut self, event: pb::WatchEvent, out: &mut Vec<u8>, objects: &mut (u64, Vec<Bytes>)) {
        let event_type = event.r#type.unwrap_or_default();
        let raw = event.object.and_then(|o| o.raw).unwrap_or_default();
        match event_type.as_str() {
            "ADDED" | "MODIFIED" | "DELETED" => {
                out.extend_from_slice(b"{\"type\":\"");
                out.extend_from_slice(event_type.as_bytes());
                out.extend_from_slice(b"\",\"object\":");
                push_token(out, objects.0, objects.1.len());
                objects.1.push(raw);
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
    fn an_object_travels_past_the_json_unchanged_and_once() {
        for bytes in [&b""[..], b"\0", b"k8s\0\x01\xff", &[7u8; 1000][..]] {
            let mut out = Vec::new();
            push_object(&mut out, bytes);
            let text = String::from_utf8(out).expect("a token is ASCII");
            // It is one short JSON string.
            let s: String = serde_json::from_str(&text).expect("a JSON string");
            assert!(s.starts_with("\0k8s-pb:") && s.len() < 40, "{s:?}");
            let back = object_bytes(&text).expect("marked").expect("held");
            assert_eq!(&back[..], bytes);
            let again = object_bytes(&text).expect("marked").unwrap_err();
            assert!(again.ends_with("is not held (any more)"), "{again}");
        }
        assert!(object_bytes(r#""plain""#).is_none());
        assert!(object_bytes(r#"{"a":1}"#).is_none());
        let forged = format!("\"{MARK}x:1\"");
        assert!(object_bytes(&forged).expect("marked").is_err());
    }

    #[test]
    fn a_lists_items_are_slices_of_the_answer() {
        let items: Vec<Bytes> = (0..3u8).map(|i| Bytes::from(vec![i; 10])).collect();
        let list = pb::RawList {
            metadata: Some(pb::ListMeta {
                resource_version: Some("9".into()),
                ..pb::ListMeta::default()
            }),
            items,
        };
        let body = Bytes::from(pb::enveloped("v1", "ServiceList", &list.encode_to_vec()));
        let json = answer_to_json(&body).expect("a list");
        let v: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
        assert_eq!(v["metadata"]["resourceVersion"], "9");
        let items = v["items"].as_array().expect("items");
        assert_eq!(items.len(), 3);
        let range = body.as_ptr_range();
        for (i, item) in items.iter().enumerate() {
            let back = object_bytes(&item.to_string())
                .expect("marked")
                .expect("held");
            assert_eq!(&back[..], &[i as u8; 10][..]);
            assert!(range.contains(&back.as_ptr()), "item {i} was copied");
        }
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
            let deleted = lines[1]["object"].to_string();
            assert_eq!(&object_bytes(&deleted).unwrap().unwrap()[..], &object[..]);
        }
    }
}
