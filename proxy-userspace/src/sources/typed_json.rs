//! [`decode_object_json`]: one JSON document's text decoded straight into
//! its typed API object, then validated by [`super::objects`] as any other.
//!
//! The general path builds a `serde_json::Value` tree first (a map per
//! object, a string per key) and then the typed object from it; at 50,000
//! Services and their slices that tree is most of the cost of reading the
//! manifests. This path walks the text once to read `apiVersion` and
//! `kind` and to refuse duplicate keys (as the YAML reader does: typed
//! decoders would keep the last one silently), then decodes the typed
//! object from the same text.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use smallvec::SmallVec;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;

use super::objects::{Decoded, ObjectError, Project};

/// The decoded object, its validation error, or `None`: this text needs
/// the general path ([`super::objects::decode_object`] on its `Value`),
/// which then reports exactly what it always reported — a List, a kind or
/// version not decoded here, a duplicate key, JSON the typed decoder
/// refuses.
pub fn decode_object_json(text: &str) -> Option<Result<Decoded, ObjectError>> {
    let mut de = serde_json::Deserializer::from_str(text);
    let head = Head::deserialize(&mut de).ok()?;
    de.end().ok()?;
    let object = match (head.api_version.as_deref()?, head.kind.as_deref()?) {
        ("v1", "Service") => typed::<core::Service>(text)?.project(),
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            typed::<discovery::EndpointSlice>(text)?.project()
        }
        ("v1", "Node") => typed::<core::Node>(text)?.project(),
        ("v1", "Pod") => typed::<core::Pod>(text)?.project(),
        _ => return None,
    };
    Some(object.map(|o| Decoded::Object(Box::new(o))))
}

fn typed<T: serde::de::DeserializeOwned>(text: &str) -> Option<T> {
    serde_json::from_str(text).ok()
}

/// The top-level `apiVersion` and `kind` of a document with no duplicate
/// key at any depth.
struct Head {
    api_version: Option<String>,
    kind: Option<String>,
}

impl<'de> Deserialize<'de> for Head {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(HeadVisitor)
    }
}

struct HeadVisitor;

impl<'de> Visitor<'de> for HeadVisitor {
    type Value = Head;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Head, A::Error> {
        let mut head = Head {
            api_version: None,
            kind: None,
        };
        let mut keys = Keys::default();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            let slot = match key.as_ref() {
                "apiVersion" => Some(&mut head.api_version),
                "kind" => Some(&mut head.kind),
                _ => None,
            };
            match slot {
                // Not a string: leave it to the general path's message.
                Some(slot) => *slot = map.next_value::<Option<String>>().ok().flatten(),
                None => map.next_value::<NoDuplicates>().map(|_| ())?,
            }
            keys.insert(key)?;
        }
        Ok(head)
    }
}

/// Any JSON value, checked for duplicate keys and otherwise skipped.
struct NoDuplicates;

impl<'de> Deserialize<'de> for NoDuplicates {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoDuplicatesVisitor)
    }
}

struct NoDuplicatesVisitor;

impl<'de> Visitor<'de> for NoDuplicatesVisitor {
    type Value = NoDuplicates;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }

    fn visit_i64<E>(self, _: i64) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }

    fn visit_u64<E>(self, _: u64) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }

    fn visit_f64<E>(self, _: f64) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }

    fn visit_str<E>(self, _: &str) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }

    fn visit_unit<E>(self) -> Result<NoDuplicates, E> {
        Ok(NoDuplicates)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<NoDuplicates, A::Error> {
        while seq.next_element::<NoDuplicates>()?.is_some() {}
        Ok(NoDuplicates)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NoDuplicates, A::Error> {
        let mut keys = Keys::default();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            map.next_value::<NoDuplicates>()?;
            keys.insert(key)?;
        }
        Ok(NoDuplicates)
    }
}

/// The keys of one object so far. Objects are small (a linear scan, on
/// the stack: a quarter of a million endpoints each hold a few nested
/// objects, and a heap block per object was most of this pass's time),
/// except label maps, which get a set past a few keys.
#[derive(Default)]
struct Keys<'de> {
    few: SmallVec<[Cow<'de, str>; Keys::FEW]>,
    many: std::collections::HashSet<Cow<'de, str>>,
}

impl Keys<'_> {
    const FEW: usize = 16;
}

impl<'de> Keys<'de> {
    fn insert<E: de::Error>(&mut self, key: Cow<'de, str>) -> Result<(), E> {
        let fresh = if self.few.len() < Self::FEW {
            let fresh = !self.few.contains(&key);
            self.few.push(key);
            fresh
        } else {
            !self.few.contains(&key) && self.many.insert(key)
        };
        if fresh {
            Ok(())
        } else {
            Err(E::custom("duplicate key"))
        }
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
