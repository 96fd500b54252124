//! YAML in and out through serde-saphyr, with one set of parser options for
//! every input the daemon reads (manifests, the KubeProxyConfiguration):
//! duplicate keys are an error, `yes`/`on` stay strings (YAML 1.2 booleans
//! only, as the API server reads them), alias expansion and nesting are
//! bounded by the parser's budget, and an error is one line naming where.
//!
//! A multi-document stream is budgeted per document: one manifest file may
//! hold any number of objects (the file size is capped by the file
//! source), while each document stays bounded as a single one is.

pub mod fast;
mod json;

pub use json::texts as json_texts;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use serde_saphyr::Error;

fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        with_snippet: false,
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
    }
}

/// One YAML document.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, Error> {
    serde_saphyr::from_str_with_options(text, options())
}

/// Every document of a multi-document stream, empty ones left out; the
/// first error fails the whole stream.
///
/// A stream whose every document is one JSON object (generated manifests,
/// `kubectl get -o json` output between `---` lines) is read by serde_json,
/// some forty times faster than the YAML parser; JSON is YAML, so the
/// values are the same. Anything else, and any JSON the fast path refuses
/// (a duplicate key among them), goes through the YAML parser, so errors
/// read the same either way.
pub fn documents(text: &str) -> Result<Vec<serde_json::Value>, Error> {
    if let Some(docs) = json::documents(text) {
        return Ok(docs);
    }
    let mut reader = text.as_bytes();
    serde_saphyr::read_with_options::<_, serde_json::Value>(&mut reader, options())
        .filter(|d| !matches!(d, Ok(serde_json::Value::Null)))
        .collect()
}

/// A value as a YAML document.
pub fn to_string<T: Serialize>(value: &T) -> Result<String, serde_saphyr::SerializeError> {
    serde_saphyr::to_string(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_keys_are_an_error_naming_the_key() {
        let err = from_str::<serde_json::Value>("a: 1\nb: 2\na: 3\n").unwrap_err();
        assert!(err.to_string().contains('a'), "{err}");
    }

    #[test]
    fn yaml_1_1_booleans_stay_strings() {
        let v: serde_json::Value = from_str("x: yes\ny: true\n").unwrap();
        assert_eq!(v, serde_json::json!({"x": "yes", "y": true}));
    }

    #[test]
    fn empty_documents_are_skipped() {
        let docs = documents("---\na: 1\n---\n---\nb: 2\n").unwrap();
        assert_eq!(
            docs,
            [serde_json::json!({"a": 1}), serde_json::json!({"b": 2})]
        );
    }

    #[test]
    fn a_stream_may_hold_more_documents_than_one_documents_budget() {
        let text = "a: 1\n---\n".repeat(5000);
        assert_eq!(documents(&text).unwrap().len(), 5000);
    }

    #[test]
    fn an_error_in_a_later_document_fails_the_stream() {
        assert!(documents("a: 1\n---\nb: [\n").is_err());
        assert!(documents("a: 1\n---\nb: 1\nb: 2\n").is_err());
    }

    #[test]
    fn an_alias_bomb_is_refused() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let p = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        assert!(from_str::<serde_json::Value>(&text).is_err());
    }

    #[test]
    fn round_trips_through_json_values() {
        let v = serde_json::json!({"kind": "Service", "spec": {"ports": [{"port": 80}]}});
        let text = to_string(&v).unwrap();
        assert_eq!(from_str::<serde_json::Value>(&text).unwrap(), v);
    }
}
