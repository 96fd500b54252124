//! [`decode_object_json`]: one JSON document's text decoded straight into
//! its kind's wire type ([`super::wire`], or k8s-openapi's), then
//! validated by [`super::objects`] as any other.
//!
//! The general path builds a `serde_json::Value` tree first (a map per
//! object, a string per key) and then the typed object from it; at 50,000
//! Services and their slices that tree is most of the cost of reading the
//! manifests. This path reads the top level's `apiVersion` and `kind`
//! (stopping as soon as it has both: they nearly always come first), then
//! decodes the typed object from the same text in one pass that also
//! refuses duplicate keys ([`strict`]), as the YAML reader does: typed
//! decoders would keep the last one silently.

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};

use super::objects::{decode_wire, for_kind, Decoded, ForKind, ObjectError, Project};
use crate::model::Object;

mod strict;

/// The decoded object, its validation error, or `None`: this text needs
/// the general path ([`super::objects::decode_object`] on its `Value`),
/// which then reports exactly what it always reported — a List, a kind or
/// version not decoded here, a duplicate key, JSON the typed decoder
/// refuses.
pub fn decode_object_json(text: &str) -> Option<Result<Decoded, ObjectError>> {
    let head = head(text)?;
    struct FromText<'t>(&'t str);
    impl ForKind for FromText<'_> {
        type Out = Option<Result<Object, ObjectError>>;
        fn run<P: Project>(self) -> Self::Out {
            typed::<P>(self.0)
        }
    }
    let object = for_kind(&head.api_version?, &head.kind?, FromText(text))??;
    Some(object.map(|o| Decoded::Object(Box::new(o))))
}

/// The whole of `text` as a `P`, refusing duplicate keys, then
/// validated; `None` when it does not decode.
fn typed<P: Project>(text: &str) -> Option<Result<Object, ObjectError>> {
    let mut de = serde_json::Deserializer::from_str(text);
    let wire = decode_wire::<P, _>(strict::strict(&mut de)).ok()?;
    de.end().ok()?;
    Some(P::project(wire))
}

/// The top-level `apiVersion` and `kind`, as far as they are strings.
#[derive(Default)]
struct Head {
    api_version: Option<String>,
    kind: Option<String>,
}

/// Reads keys of the top-level object until it has both `apiVersion` and
/// `kind`. `None` when the text is not an object; what comes after them is
/// left to the typed pass.
fn head(text: &str) -> Option<Head> {
    let mut head = Head::default();
    let mut de = serde_json::Deserializer::from_str(text);
    match de.deserialize_map(HeadVisitor(&mut head)) {
        Ok(()) => Some(head),
        Err(_) if head.api_version.is_some() && head.kind.is_some() => Some(head),
        Err(_) => None,
    }
}

/// Fills a [`Head`]; stops the read with an error once it is full.
struct HeadVisitor<'h>(&'h mut Head);

impl<'de> Visitor<'de> for HeadVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let slot = match key.as_ref() {
                "apiVersion" => &mut self.0.api_version,
                "kind" => &mut self.0.kind,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            // Not a string: the general path says why.
            *slot = Some(map.next_value::<String>()?);
            if self.0.api_version.is_some() && self.0.kind.is_some() {
                return Err(de::Error::custom("apiVersion and kind read"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::objects::decode_object;
    use super::*;

    fn same_as_general(text: &str) {
        let fast = decode_object_json(text).expect("takes the fast path");
        let general = decode_object(serde_json::from_str(text).unwrap());
        assert_eq!(format!("{fast:?}"), format!("{general:?}"), "{text}");
    }

    #[test]
    fn objects_decode_as_through_a_value() {
        same_as_general(
            r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"web","namespace":"a","labels":{"x":"1"}},
               "spec":{"clusterIP":"10.96.0.10","clusterIPs":["10.96.0.10"],"ports":[{"name":"http","port":80,"protocol":"TCP","targetPort":8080}]}}"#,
        );
        same_as_general(
            r#"{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"web-1","namespace":"a","labels":{"kubernetes.io/service-name":"web"}},
               "addressType":"IPv4","ports":[{"name":"http","port":8080,"protocol":"TCP"}],
               "endpoints":[{"addresses":["10.0.0.1"],"nodeName":"n1","conditions":{"ready":true}}]}"#,
        );
        same_as_general(r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"}}"#);
        // A validation error is the same error.
        same_as_general(
            r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"web"},"spec":{"ports":[{"port":70000}]}}"#,
        );
    }

    #[test]
    fn anything_unusual_takes_the_general_path() {
        for text in [
            // Duplicate keys, at the top and deeper.
            r#"{"apiVersion":"v1","kind":"Node","kind":"Node","metadata":{"name":"n1"}}"#,
            r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1","name":"n2"}}"#,
            // Lists, other kinds, odd heads.
            r#"{"apiVersion":"v1","kind":"List","items":[]}"#,
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"}}"#,
            r#"{"apiVersion":"v2","kind":"Service","metadata":{"name":"web"}}"#,
            r#"{"kind":"Service","metadata":{"name":"web"}}"#,
            r#"{"apiVersion":1,"kind":"Service"}"#,
            // Not the shape of its kind (the general path says why).
            r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"web"},"spec":{"ports":"x"}}"#,
            // Not JSON.
            r#"{"apiVersion":"v1","kind":"Node""#,
        ] {
            assert!(decode_object_json(text).is_none(), "{text}");
        }
    }

    #[test]
    fn many_labels_are_checked_too() {
        let labels: Vec<String> = (0..40).map(|i| format!(r#""k{i}":"v""#)).collect();
        let ok = format!(
            r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"n1","labels":{{{}}}}}}}"#,
            labels.join(",")
        );
        assert!(matches!(decode_object_json(&ok), Some(Ok(_))));
        let dup = ok.replace(r#""k39":"v""#, r#""k3":"v""#);
        assert!(decode_object_json(&dup).is_none());
    }
}
