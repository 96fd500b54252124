//! The fast path for a file of YAML documents (`kubectl get -o yaml`
//! output, hand-written manifests): each document decoded straight into
//! its kind's wire type by [`crate::yaml::fast`], then validated by
//! [`super::super::objects`] as any other. No `Value` tree is built.
//!
//! It answers `None` as soon as one document needs the general path —
//! YAML outside the fast reader's subset, a duplicate key, a List, a kind
//! or version not decoded here, a document its type refuses, an invalid
//! object — and the general path then reads the whole file and reports
//! exactly what it always reported.

use std::path::Path;

use serde::de::IgnoredAny;

use super::super::objects::{decode_wire, for_kind, ForKind, Project};
use crate::model::Object;
use crate::yaml::fast;

/// Every object of the file (kinds the proxy does not read left out), or
/// `None`: read it with the general path.
pub fn parse_yaml_objects(file: &Path, content: &str) -> Option<Vec<Object>> {
    let mut objects = Vec::new();
    for (doc_index, doc) in fast::documents(content)?.into_iter().enumerate() {
        if let Some(object) = decode(file, doc_index, doc)? {
            objects.push(object);
        }
    }
    Some(objects)
}

/// One document: `Some(None)` for a kind the proxy does not read.
fn decode(file: &Path, doc_index: usize, doc: &str) -> Option<Option<Object>> {
    let api_version = fast::top_level_string(doc, "apiVersion")?;
    let kind = fast::top_level_string(doc, "kind")?;
    if api_version.is_empty() || kind.is_empty() {
        return None;
    }
    struct FromYaml<'t>(&'t str);
    impl ForKind for FromYaml<'_> {
        type Out = Option<Object>;
        fn run<P: Project>(self) -> Self::Out {
            let wire = fast::from_document::<Wire<P>>(self.0).ok()?;
            P::project(wire.0).ok()
        }
    }
    match for_kind(&api_version, &kind, FromYaml(doc)) {
        Some(object) => Some(Some(object?)),
        // The general path reports these, or expands the List.
        None if matches!(&*kind, "Service" | "EndpointSlice" | "Node" | "Pod")
            || kind.ends_with("List") =>
        {
            None
        }
        None => {
            // Still read whole: a broken or ambiguous document fails the
            // file on the general path, whatever its kind.
            fast::from_document::<IgnoredAny>(doc).ok()?;
            tracing::debug!(file = %file.display(), doc_index, %api_version, %kind, "ignoring object of a kind the proxy does not consume");
            Some(None)
        }
    }
}

/// `P`'s wire type read as [`decode_wire`] reads it.
struct Wire<'de, P: Project>(P::Wire<'de>);

impl<'de, P: Project> serde::Deserialize<'de> for Wire<'de, P> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        decode_wire::<P, D>(d).map(Wire)
    }
}

#[cfg(test)]
#[path = "fast_yaml_tests.rs"]
mod tests;
