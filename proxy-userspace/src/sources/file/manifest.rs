//! One manifest file: read (bounded, UTF-8, symlinks followed) and parsed
//! into typed objects, all or nothing, with errors naming the file, the
//! document and the reason.

use std::path::{Path, PathBuf};

use super::super::objects::{decode_object, Decoded};
use super::super::typed_json::decode_object_json;
use super::super::RejectReason;
use crate::model::Object;

/// Largest manifest file read. 50,000 Services with 250,000 endpoints take
/// about 40 MiB of YAML; anything far beyond that is a mistake (a log or a
/// core dump with a .yaml name) that would only cost memory to parse.
pub const MAX_MANIFEST_BYTES: u64 = 128 << 20;

/// Why a manifest (or one document in it) was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("{file}: cannot read: {reason}")]
    Read { file: PathBuf, reason: String },
    #[error("{file}: document {doc_index}: malformed: {reason}")]
    Decode {
        file: PathBuf,
        doc_index: usize,
        reason: String,
    },
    #[error("{file}: document {doc_index}{}: invalid {object}: {reason}", item.map(|i| format!(" items[{i}]")).unwrap_or_default())]
    Invalid {
        file: PathBuf,
        doc_index: usize,
        item: Option<usize>,
        object: String,
        reason: String,
        /// `InvalidObject` or `Undecodable`.
        rejected: RejectReason,
    },
}

impl ManifestError {
    /// Short reason class for metrics (`read`, `decode`, `invalid_object`).
    pub fn reason_class(&self) -> &'static str {
        match self {
            ManifestError::Read { .. } => "read",
            ManifestError::Decode { .. } => "decode",
            ManifestError::Invalid { .. } => "invalid_object",
        }
    }

    /// What a refused object counts under on `/metrics`; `None` for a file
    /// that could not be read (no object in it was seen).
    pub fn reject_reason(&self) -> Option<RejectReason> {
        match self {
            ManifestError::Read { .. } => None,
            ManifestError::Decode { .. } => Some(RejectReason::InvalidManifest),
            ManifestError::Invalid { rejected, .. } => Some(*rejected),
        }
    }
}

/// Parses one manifest file into objects. Any error rejects the whole file.
/// The entry fuzz/ drives.
pub fn parse_manifest(file: &Path, content: &str) -> Result<Vec<Object>, Vec<ManifestError>> {
    if let Some(objects) = parse_json_objects(content) {
        return Ok(objects);
    }
    let is_json = file.extension().is_some_and(|e| e == "json");
    if !is_json {
        if let Some(objects) = super::fast_yaml::parse_yaml_objects(file, content) {
            return Ok(objects);
        }
    }
    let documents = split_documents(file, content).map_err(|e| vec![e])?;
    let mut objects = Vec::new();
    let mut errors = Vec::new();
    for (doc_index, doc) in documents {
        let is_list = doc
            .get("kind")
            .and_then(|k| k.as_str())
            .is_some_and(|k| k == "List" || k.ends_with("List"))
            && doc.get("items").is_some();
        let items: Vec<(Option<usize>, serde_json::Value)> = if is_list {
            match doc.get("items") {
                Some(serde_json::Value::Array(items)) => items
                    .iter()
                    .cloned()
                    .enumerate()
                    .map(|(i, v)| (Some(i), v))
                    .collect(),
                _ => {
                    errors.push(ManifestError::Decode {
                        file: file.to_owned(),
                        doc_index,
                        reason: "items of a List must be an array".to_owned(),
                    });
                    continue;
                }
            }
        } else {
            vec![(None, doc)]
        };
        for (item, value) in items {
            let object = describe(&value);
            match decode_object(value) {
                Ok(Decoded::Object(o)) => objects.push(*o),
                Ok(Decoded::Ignored { api_version, kind }) => {
                    tracing::debug!(file = %file.display(), doc_index, %api_version, %kind, "ignoring object of a kind the proxy does not consume");
                }
                Err(e) => errors.push(ManifestError::Invalid {
                    file: file.to_owned(),
                    doc_index,
                    item,
                    object,
                    reason: e.to_string(),
                    rejected: e.reject_reason(),
                }),
            }
        }
    }
    if errors.is_empty() {
        Ok(objects)
    } else {
        Err(errors)
    }
}

/// The fast path for a file of JSON documents (generated manifests,
/// `kubectl get -o json` output): each decoded straight into its typed
/// object. `None` as soon as one document needs the general path (a List,
/// a kind the proxy ignores, anything to report), which then reads the
/// whole file as it always did.
fn parse_json_objects(content: &str) -> Option<Vec<Object>> {
    crate::yaml::json_texts(content)?
        .into_iter()
        .map(|text| match decode_object_json(text)? {
            Ok(Decoded::Object(o)) => Some(*o),
            Ok(Decoded::Ignored { .. }) | Err(_) => None,
        })
        .collect()
}

/// `Kind namespace/name` for error messages, from whatever the document has.
fn describe(v: &serde_json::Value) -> String {
    let get = |p: &str| v.pointer(p).and_then(|x| x.as_str()).unwrap_or("");
    let kind = match get("/kind") {
        "" => "object",
        k => k,
    };
    match (get("/metadata/namespace"), get("/metadata/name")) {
        (_, "") => kind.to_owned(),
        ("", name) => format!("{kind} {name}"),
        (ns, name) => format!("{kind} {ns}/{name}"),
    }
}

/// Splits a file into non-empty documents with their index in the file.
fn split_documents(
    file: &Path,
    content: &str,
) -> Result<Vec<(usize, serde_json::Value)>, ManifestError> {
    let is_json = file.extension().is_some_and(|e| e == "json");
    if is_json {
        return serde_json::from_str(content)
            .map(|v| vec![(0, v)])
            .map_err(|e| ManifestError::Decode {
                file: file.to_owned(),
                doc_index: 0,
                reason: e.to_string(),
            });
    }
    let values = crate::yaml::documents(content).map_err(|e| ManifestError::Decode {
        file: file.to_owned(),
        doc_index: 0,
        reason: e.to_string(),
    })?;
    let mut docs = Vec::new();
    for (doc_index, value) in values.into_iter().enumerate() {
        match value {
            serde_json::Value::Object(_) => docs.push((doc_index, value)),
            _ => {
                return Err(ManifestError::Decode {
                    file: file.to_owned(),
                    doc_index,
                    reason: "a manifest document must be a mapping".to_owned(),
                })
            }
        }
    }
    Ok(docs)
}

/// Reads a manifest: at most [`MAX_MANIFEST_BYTES`], UTF-8, and only a
/// regular file (a symlink is followed; a dangling one or a loop is an
/// error naming it, not a file that silently does not exist).
pub(super) fn read_manifest(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => std::io::Error::other("symlink loop"),
        Some(libc::ENOENT) if path.symlink_metadata().is_ok() => {
            std::io::Error::other("dangling symlink")
        }
        _ => e,
    })?;
    let len = file.metadata()?.len();
    if len > MAX_MANIFEST_BYTES {
        return Err(std::io::Error::other(format!(
            "{len} bytes, more than the {} MiB a manifest may have",
            MAX_MANIFEST_BYTES >> 20
        )));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // The file may grow between the stat and the read: stop one byte past
    // the cap to tell.
    file.take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(std::io::Error::other(format!(
            "more than the {} MiB a manifest may have",
            MAX_MANIFEST_BYTES >> 20
        )));
    }
    String::from_utf8(bytes).map_err(|e| {
        std::io::Error::other(format!(
            "not UTF-8 (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SVC: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n";

    #[test]
    fn multi_document_yaml_and_lists_are_read() {
        let content = format!(
            "{SVC}---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata: {{name: n1}}\n---\n"
        );
        let objects = parse_manifest(Path::new("a.yaml"), &content).unwrap();
        assert_eq!(objects.len(), 2);
    }

    #[test]
    fn errors_carry_file_document_and_reason() {
        let content = format!("{SVC}---\napiVersion: v1\nkind: Service\nmetadata: {{name: bad}}\nspec: {{ports: [{{port: 0}}]}}\n");
        let errs = parse_manifest(Path::new("m.yaml"), &content).unwrap_err();
        assert_eq!(errs.len(), 1);
        let msg = errs[0].to_string();
        assert!(
            msg.starts_with("m.yaml: document 1: invalid Service bad:"),
            "{msg}"
        );
        assert!(msg.contains("spec.ports[0].port"), "{msg}");

        let errs = parse_manifest(Path::new("m.yaml"), "a: [b\n").unwrap_err();
        assert!(
            matches!(errs[0], ManifestError::Decode { doc_index: 0, .. }),
            "{errs:?}"
        );
    }
}
