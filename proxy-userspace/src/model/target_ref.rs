//! `endpoints[].targetRef` as the model keeps it. Every endpoint carries
//! one (a quarter of a million in a large cluster), shared between the
//! slice's endpoint and the published one, so it is one heap block: the
//! kind, namespace and uid in a header and the name's bytes right after
//! it, behind a thin pointer (triomphe's `ThinArc`). An `Arc` of the
//! fields with the name in a box of its own took two blocks, ~120 bytes
//! with the allocator's overhead; this takes one of ~96.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

use triomphe::ThinArc;

use super::{ArcStr, Uid};

/// A reference to the object behind an endpoint (most often its Pod).
/// Cloning it shares it.
#[derive(Clone)]
pub struct TargetRef(ThinArc<Head, u8>);

struct Head {
    kind: ArcStr,
    namespace: ArcStr,
    uid: Uid,
}

impl TargetRef {
    pub fn new(kind: ArcStr, namespace: ArcStr, name: &str, uid: Uid) -> TargetRef {
        let head = Head {
            kind,
            namespace,
            uid,
        };
        TargetRef(ThinArc::from_header_and_slice(head, name.as_bytes()))
    }

    pub fn kind(&self) -> &ArcStr {
        &self.0.header.header.kind
    }

    pub fn namespace(&self) -> &ArcStr {
        &self.0.header.header.namespace
    }

    pub fn name(&self) -> &str {
        // Built from a `&str` in `new` and never changed.
        std::str::from_utf8(&self.0.slice).expect("a target's name is the UTF-8 it was built from")
    }

    pub fn uid(&self) -> &Uid {
        &self.0.header.header.uid
    }

    fn fields(&self) -> (&str, &str, &str, &Uid) {
        (self.kind(), self.namespace(), self.name(), self.uid())
    }
}

impl PartialEq for TargetRef {
    fn eq(&self, other: &Self) -> bool {
        self.0.ptr() == other.0.ptr() || self.fields() == other.fields()
    }
}

impl Eq for TargetRef {}

impl PartialOrd for TargetRef {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TargetRef {
    fn cmp(&self, other: &Self) -> Ordering {
        self.fields().cmp(&other.fields())
    }
}

impl Hash for TargetRef {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.fields().hash(state);
    }
}

impl fmt::Debug for TargetRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TargetRef")
            .field("kind", &self.kind())
            .field("namespace", &self.namespace())
            .field("name", &self.name())
            .field("uid", self.uid())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_back_as_built_and_compares_by_value() {
        let uid = "0d4c8f3e-5b1a-4c2e-9f7d-3a6b8e1c2d4f";
        let a = TargetRef::new("Pod".into(), "ns".into(), "web-7d4b9-x2x9z", Uid::new(uid));
        assert_eq!(
            (a.kind().as_str(), a.namespace().as_str(), a.name()),
            ("Pod", "ns", "web-7d4b9-x2x9z")
        );
        assert_eq!(a.uid().to_string(), uid);
        let same = TargetRef::new("Pod".into(), "ns".into(), "web-7d4b9-x2x9z", Uid::new(uid));
        assert_eq!(a, same);
        assert_eq!(a.clone(), a);
        let other = TargetRef::new("Pod".into(), "ns".into(), "web-7d4b9-x2x9y", Uid::new(uid));
        assert_ne!(a, other);
        assert!(other < a);
        let empty = TargetRef::new("".into(), "".into(), "", Uid::new(""));
        assert_eq!((empty.name(), empty.uid().to_string()), ("", String::new()));
    }
}
