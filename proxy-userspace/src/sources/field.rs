//! Field paths as the API server names them in its errors
//! (`spec.ports[0].port`, `metadata.labels[app.kubernetes.io/name]`): for
//! the fields [`super::objects`] checks, and for the field a decoder
//! refused.

use std::fmt::Write as _;

/// A checked field's path, spelled out only when the check refuses it: a
/// start at 50k Services checks some 350k list items and refuses none.
#[derive(Clone, Copy)]
pub(super) enum Field {
    Path(&'static str),
    /// `{list}[{index}]{rest}`, e.g. `spec.ports[0].protocol`.
    Item {
        list: &'static str,
        index: usize,
        rest: &'static str,
    },
}

impl Field {
    pub(super) fn item(list: &'static str, index: usize, rest: &'static str) -> Self {
        Field::Item { list, index, rest }
    }
}

impl From<Field> for String {
    fn from(field: Field) -> String {
        match field {
            Field::Path(path) => path.to_owned(),
            Field::Item { list, index, rest } => format!("{list}[{index}]{rest}"),
        }
    }
}

/// A decoding error's path as the API server names fields:
/// `spec.ports[0].port`, and a map key that is not a plain field name in
/// brackets, `metadata.labels[app.kubernetes.io/name]` (not
/// `serde_path_to_error`'s dotted `metadata.labels.app.kubernetes.io/name`).
pub(super) fn field_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => {
                let _ = write!(out, "[{index}]");
            }
            Segment::Map { key }
                if !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric()) =>
            {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Map { key } => {
                let _ = write!(out, "[{key}]");
            }
            Segment::Enum { variant } => {
                let _ = write!(out, ".{variant}");
            }
            Segment::Unknown => out.push_str(".?"),
        }
    }
    out
}
