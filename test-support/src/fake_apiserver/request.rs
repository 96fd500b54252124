//! What a request asks for: its query, label and field selectors, and
//! the `continue` token of a list page.

use std::collections::HashMap;

use hyper::Request;
use serde_json::Value;

/// A `continue` token this server wrote: the list's resourceVersion and
/// the key of the last object sent. Later pages are read from the objects
/// as they are then (an API server reads them at the list's revision); a
/// watch from the list's resourceVersion replays what changed meanwhile,
/// so a client ends up with the same objects either way.
pub(super) fn parse_continue(token: &str) -> Option<(u64, (String, String))> {
    let mut parts = token.splitn(3, '/');
    let rv = parts.next()?.parse().ok()?;
    let ns = parts.next()?.to_owned();
    let name = parts.next()?.to_owned();
    Some((rv, (ns, name)))
}

pub(super) fn query(req: &Request<hyper::body::Incoming>) -> HashMap<String, String> {
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_owned(), percent_decode(v)))
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Label selector terms: `k`, `!k`, `k=v`, `k==v`, `k!=v`.
pub(super) fn labels_match(selector: &str, o: &Value) -> bool {
    let labels = &o["metadata"]["labels"];
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        if let Some((k, v)) = term.split_once("!=") {
            labels[k].as_str() != Some(v)
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            labels[k].as_str() == Some(v)
        } else if let Some(k) = term.strip_prefix('!') {
            labels.get(k).is_none()
        } else {
            labels.get(term).is_some()
        }
    })
}

/// Field selectors the proxy uses: `metadata.name=`, `spec.nodeName=`.
pub(super) fn fields_match(selector: &str, o: &Value) -> bool {
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        let Some((field, want)) = term.split_once('=') else {
            return false;
        };
        let pointer = format!("/{}", field.replace('.', "/"));
        o.pointer(&pointer).and_then(Value::as_str).unwrap_or("") == want
    })
}
