//! One list answer read as the source reads it, for the bench
//! (`examples/kube_wire.rs`, `cargo xtask bench --only kube-wire`): the
//! decode CPU of a protobuf list against a JSON one.

use bytes::Bytes;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;

use super::raw::{RawObject, Watched};
use super::{check_all, pb_body, CHECK_BATCH};

/// What a list answer gave: objects accepted and refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListRead {
    pub accepted: usize,
    pub refused: usize,
}

/// Reads `body`, the answer to a list of `resource` (`services`,
/// `endpointslices`, `nodes` or `pods`) in protobuf or JSON (told by its
/// first bytes, as the response's Content-Type tells the source), through
/// the steps a list takes in the source: a protobuf answer re-framed for
/// the watcher, the text read as kube-rs reads it, each item checked,
/// [`CHECK_BATCH`] at a time.
pub fn read_list(resource: &str, body: Bytes) -> Result<ListRead, String> {
    match resource {
        "services" => read::<core::Service>(body),
        "endpointslices" => read::<discovery::EndpointSlice>(body),
        "nodes" => read::<core::Node>(body),
        "pods" => read::<core::Pod>(body),
        other => Err(format!("{other} is not a resource the source reads")),
    }
}

fn read<K: Watched>(body: Bytes) -> Result<ListRead, String> {
    let body = if body.starts_with(&proto::k8s::MAGIC) {
        Bytes::from(pb_body::answer_to_json(&body)?)
    } else {
        body
    };
    // As kube-rs reads an answer: text, then JSON.
    let text = String::from_utf8(body.to_vec()).map_err(|e| e.to_string())?;
    let list: kube::core::ObjectList<RawObject<K>> =
        serde_json::from_str(&text).map_err(|e| e.to_string())?;
    drop(text);
    let mut read = ListRead::default();
    let mut items = list.items.into_iter().peekable();
    while items.peek().is_some() {
        let batch: Vec<_> = items.by_ref().take(CHECK_BATCH).collect();
        for checked in check_all(batch) {
            match checked.decoded {
                Ok(_) => read.accepted += 1,
                Err(_) => read.refused += 1,
            }
        }
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;
    use test_support::fake_apiserver::{pb, service_object};

    #[test]
    fn a_list_reads_alike_in_protobuf_and_json() {
        let mut bad = service_object("default", "bad", "10.96.0.9");
        bad["spec"]["ports"][0]["port"] = serde_json::json!(70_000);
        let objects = [
            service_object("default", "a", "10.96.0.1"),
            service_object("default", "b", "10.96.0.2"),
            bad,
        ];
        let items: Vec<Bytes> = objects
            .iter()
            .map(|o| Bytes::from(pb::object_message("Service", o)))
            .collect();
        let protobuf = pb::list("v1", "ServiceList", "7", None, &items);
        let json = serde_json::json!({"apiVersion": "v1", "kind": "ServiceList",
                                      "metadata": {"resourceVersion": "7"}, "items": objects});
        let want = ListRead {
            accepted: 2,
            refused: 1,
        };
        assert_eq!(read_list("services", Bytes::from(protobuf)), Ok(want));
        assert_eq!(
            read_list("services", Bytes::from(json.to_string())),
            Ok(want)
        );
        assert!(read_list("services", Bytes::from_static(b"k8s\0\xff")).is_err());
    }
}
