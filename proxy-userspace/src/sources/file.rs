//! The file source: Service, EndpointSlice, Node and Pod objects from the
//! YAML/JSON manifests in one directory, re-read when the directory changes.
//!
//! Each file is all-or-nothing: when a file fails to parse or holds an
//! invalid object, every error is logged with the file, document index and
//! reason, and the last good version of that file stays in effect. Other
//! files are unaffected.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::objects::{decode_object, Decoded};
use super::{RejectReason, SourceMessage, SourceSender};
use crate::model::{Change, ClusterState, Object};

/// File extensions read as manifests.
const EXTENSIONS: &[&str] = &["yaml", "yml", "json"];
/// Quiet time after a directory event before re-reading, so that an editor's
/// write-rename-chmod sequence becomes one re-read.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Safety net for file systems without inotify events (network mounts).
const RESCAN_INTERVAL: Duration = Duration::from_secs(5);
/// Largest manifest file read. 50,000 Services with 250,000 endpoints take
/// about 40 MiB of YAML; anything far beyond that is a mistake (a log or a
/// core dump with a .yaml name) that would only cost memory to parse.
pub const MAX_MANIFEST_BYTES: u64 = 128 << 20;
/// Test hook, read from the environment (deliberately not a flag): while
/// the file this names exists, the source holds back `Synced` after its
/// first read, like an API source whose initial list has not finished.
/// Integration tests use it to see readiness fail on `informer-sync`.
const HOLD_SYNCED_ENV: &str = "EBPF_KUBE_PROXY_TEST_HOLD_SOURCE";
/// How often a held-back source looks at the hold file again.
const HOLD_RECHECK: Duration = Duration::from_millis(100);

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

/// Start-up errors of the file source.
#[derive(Debug, thiserror::Error)]
pub enum FileSourceError {
    #[error("--manifests {dir}: {reason}")]
    Directory { dir: PathBuf, reason: String },
    #[error("--manifests {dir}: no .yaml, .yml or .json files in the directory")]
    Empty { dir: PathBuf },
    #[error("--manifests {dir}: cannot watch the directory: {reason}")]
    Watch { dir: PathBuf, reason: String },
}

/// Parses one manifest file into objects. Any error rejects the whole file.
/// The entry fuzz/ drives.
pub fn parse_manifest(file: &Path, content: &str) -> Result<Vec<Object>, Vec<ManifestError>> {
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
fn read_manifest(path: &Path) -> std::io::Result<String> {
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

#[derive(Debug, Default)]
struct FileEntry {
    /// Hash of the content last read (good or bad), to skip unchanged files.
    fingerprint: u64,
    /// Objects of the last good version; empty if none was ever good.
    objects: Vec<Object>,
}

/// The manifests of one directory, each file at its last good version.
#[derive(Debug)]
pub struct ManifestDir {
    dir: PathBuf,
    files: BTreeMap<PathBuf, FileEntry>,
    /// The read error last reported per path (the directory included), so
    /// a file that stays unreadable is reported once, not at every rescan.
    unreadable: BTreeMap<PathBuf, String>,
}

impl ManifestDir {
    /// Checks that the directory exists and holds at least one manifest.
    pub fn open(dir: &Path) -> Result<Self, FileSourceError> {
        let meta = std::fs::metadata(dir).map_err(|e| FileSourceError::Directory {
            dir: dir.to_owned(),
            reason: e.to_string(),
        })?;
        if !meta.is_dir() {
            return Err(FileSourceError::Directory {
                dir: dir.to_owned(),
                reason: "not a directory".to_owned(),
            });
        }
        let this = Self {
            dir: dir.to_owned(),
            files: BTreeMap::new(),
            unreadable: BTreeMap::new(),
        };
        if this
            .list()
            .map_err(|e| FileSourceError::Directory {
                dir: dir.to_owned(),
                reason: e.to_string(),
            })?
            .is_empty()
        {
            return Err(FileSourceError::Empty {
                dir: dir.to_owned(),
            });
        }
        Ok(this)
    }

    fn list(&self) -> std::io::Result<Vec<PathBuf>> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let hidden = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_none_or(|n| n.starts_with('.'));
            let manifest = path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| EXTENSIONS.contains(&e));
            // `is_file` follows symlinks (ConfigMap volumes are symlinks). A
            // symlink that leads nowhere (dangling, or a loop) is listed too,
            // so that reading it reports why.
            let broken_link = || path.is_symlink() && std::fs::metadata(&path).is_err();
            if !hidden && manifest && (path.is_file() || broken_link()) {
                files.push(path);
            }
        }
        files.sort();
        Ok(files)
    }

    /// Re-reads changed files. Returns the errors of files that changed and
    /// failed (each failing version, and each read error, is reported once).
    pub fn rescan(&mut self) -> Vec<ManifestError> {
        let mut errors = Vec::new();
        let listed = match self.list() {
            Ok(l) => {
                self.unreadable.remove(&self.dir);
                l
            }
            Err(e) => {
                // Keep everything as it was: a vanished directory is far more
                // likely a mount hiccup than a wish to drop every service.
                let dir = self.dir.clone();
                errors.extend(self.read_failed(dir, e.to_string()));
                return errors;
            }
        };
        self.files.retain(|path, _| listed.contains(path));
        self.unreadable
            .retain(|path, _| *path == self.dir || listed.contains(path));
        for path in listed {
            let content = match read_manifest(&path) {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    self.files.remove(&path);
                    continue;
                }
                Err(e) => {
                    errors.extend(self.read_failed(path, e.to_string()));
                    continue;
                }
            };
            self.unreadable.remove(&path);
            let fingerprint = {
                let mut h = DefaultHasher::new();
                content.hash(&mut h);
                h.finish()
            };
            let entry = self.files.entry(path.clone()).or_default();
            if entry.fingerprint == fingerprint && fingerprint != 0 {
                continue;
            }
            entry.fingerprint = fingerprint;
            match parse_manifest(&path, &content) {
                Ok(objects) => entry.objects = objects,
                Err(errs) => errors.extend(errs),
            }
        }
        errors
    }

    /// A read error for `path`, unless the same one was reported last time.
    /// The file's last good version stays in effect.
    fn read_failed(&mut self, path: PathBuf, reason: String) -> Option<ManifestError> {
        if self.unreadable.get(&path) == Some(&reason) {
            return None;
        }
        self.unreadable.insert(path.clone(), reason.clone());
        Some(ManifestError::Read { file: path, reason })
    }

    /// The merged state of every file; on a duplicate object the file that
    /// sorts last wins.
    pub fn cluster_state(&self) -> ClusterState {
        let mut state = ClusterState::default();
        let mut origin: BTreeMap<crate::model::ObjectRef, &Path> = BTreeMap::new();
        for (path, entry) in &self.files {
            for o in &entry.objects {
                let r = o.object_ref();
                if let Some(prev) = origin.insert(r.clone(), path) {
                    tracing::warn!(object = %r, first = %prev.display(), second = %path.display(), "object defined twice; the later file wins");
                }
                state.apply(Change::Upsert(o.clone()));
            }
        }
        state
    }
}

/// Runs the file source until `cancel` fires: an initial read (then
/// `Synced`), then a re-read on every directory change.
pub async fn run(
    mut manifests: ManifestDir,
    tx: SourceSender,
    cancel: CancellationToken,
) -> Result<(), FileSourceError> {
    let dir = std::path::absolute(&manifests.dir).unwrap_or_else(|_| manifests.dir.clone());
    let (event_tx, mut event_rx) = mpsc::channel::<()>(1);
    let ours = dir.clone();
    // Set when an event is about the directory itself (removed, created,
    // renamed): its watch must be set up again, even if a new directory
    // got the old one's inode.
    let rewatch = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dir_event = rewatch.clone();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        // Writes, creates, removes and renames only: reading the files
        // (ours included) raises open/close-nowrite events, and reacting to
        // those re-read the directory forever, a core busy on an idle node.
        // The parent's events count only when they are about the directory.
        let relevant = res.as_ref().is_ok_and(|ev| {
            !matches!(ev.kind, notify::EventKind::Access(_))
                && ev.paths.iter().any(|p| p.starts_with(&ours))
        });
        if let Ok(ev) = &res {
            if ev.paths.contains(&ours) {
                dir_event.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        if relevant {
            // A full channel already means "re-read pending".
            let _ = event_tx.try_send(());
        }
    })
    .map_err(|e| FileSourceError::Watch {
        dir: dir.clone(),
        reason: e.to_string(),
    })?;
    // The directory's inotify watch dies with the directory; watching its
    // parent too tells when it is created again (`kubectl cp`, a
    // re-provisioned host path), so the watch can follow at once.
    if let Some(parent) = dir.parent() {
        if let Err(e) = watcher.watch(parent, RecursiveMode::NonRecursive) {
            tracing::debug!(parent = %parent.display(), error = %e, "not watching the manifest directory's parent; a re-created directory is noticed by the periodic rescan");
        }
    }
    let mut watched = None;
    watch_dir(&mut watcher, &dir, &mut watched, false).map_err(|e| FileSourceError::Watch {
        dir: dir.clone(),
        reason: e.to_string(),
    })?;

    let mut current = ClusterState::default();
    let mut first = true;
    loop {
        let again = rewatch.swap(false, std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = watch_dir(&mut watcher, &dir, &mut watched, again) {
            tracing::debug!(dir = %dir.display(), error = %e, "cannot watch the manifest directory yet");
        }
        let errors = manifests.rescan();
        for e in &errors {
            tracing::error!(error = %e, "manifest not applied; keeping the last good version of the file");
        }
        if !errors.is_empty() {
            let _ = tx.send(SourceMessage::Errors(errors)).await;
        }
        let next = manifests.cluster_state();
        let changes = current.diff(&next);
        current = next;
        if !changes.is_empty() && tx.send(SourceMessage::Changes(changes)).await.is_err() {
            return Ok(());
        }
        if first {
            first = false;
            if !hold_back_synced(&cancel).await {
                return Ok(());
            }
            tracing::info!(dir = %dir.display(), objects = current.objects().count(), "file source synced");
            if tx.send(SourceMessage::Synced).await.is_err() {
                return Ok(());
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            ev = event_rx.recv() => {
                if ev.is_none() {
                    return Ok(());
                }
                tokio::time::sleep(DEBOUNCE).await;
                while event_rx.try_recv().is_ok() {}
            }
            _ = tokio::time::sleep(RESCAN_INTERVAL) => {}
        }
    }
}

/// (Re-)establishes the watch on `dir` when the directory there is not the
/// one watched (`watched`: its device and inode) or `again` says it was
/// removed or created meanwhile.
fn watch_dir(
    watcher: &mut impl Watcher,
    dir: &Path,
    watched: &mut Option<(u64, u64)>,
    again: bool,
) -> notify::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let now = std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()));
    if now.is_none() || (now == *watched && !again) {
        return Ok(());
    }
    if watched.is_some() {
        let _ = watcher.unwatch(dir);
        tracing::info!(dir = %dir.display(), "manifest directory created again; watching it");
    }
    watcher.watch(dir, RecursiveMode::NonRecursive)?;
    *watched = now;
    Ok(())
}

/// Waits while the [`HOLD_SYNCED_ENV`] file exists; false when cancelled.
async fn hold_back_synced(cancel: &CancellationToken) -> bool {
    let Some(hold) = std::env::var_os(HOLD_SYNCED_ENV).map(PathBuf::from) else {
        return true;
    };
    while hold.exists() {
        tokio::select! {
            _ = cancel.cancelled() => return false,
            _ = tokio::time::sleep(HOLD_RECHECK) => {}
        }
    }
    true
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

    #[test]
    fn a_broken_file_keeps_its_last_good_version_and_others_apply() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), SVC).unwrap();
        std::fs::write(
            dir.path().join("b.json"),
            r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"}}"#,
        )
        .unwrap();
        let mut m = ManifestDir::open(dir.path()).unwrap();
        assert!(m.rescan().is_empty());
        assert_eq!(m.cluster_state().services.len(), 1);

        std::fs::write(dir.path().join("a.yaml"), "kind: Service\n  bad: indent").unwrap();
        std::fs::remove_file(dir.path().join("b.json")).unwrap();
        let errors = m.rescan();
        assert_eq!(errors.len(), 1);
        let state = m.cluster_state();
        assert_eq!(state.services.len(), 1, "last good a.yaml stays");
        assert!(state.nodes.is_empty(), "removed file is dropped");
        assert!(
            m.rescan().is_empty(),
            "an unchanged broken file is reported once"
        );
    }

    #[test]
    fn unreadable_files_are_named_once_and_keep_their_last_good_version() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("a.yaml"), SVC).unwrap();
        let mut m = ManifestDir::open(d).unwrap();
        assert!(m.rescan().is_empty());

        // A symlink loop, a dangling symlink, a file that is not UTF-8 and
        // one over the size cap (sparse: no disk is used).
        symlink(d.join("loop.yaml"), d.join("loop.yaml")).unwrap();
        symlink(d.join("gone"), d.join("dangling.yaml")).unwrap();
        std::fs::write(
            d.join("latin1.yaml"),
            b"kind: Service\nmetadata: {name: caf\xe9}\n",
        )
        .unwrap();
        let big = std::fs::File::create(d.join("big.yaml")).unwrap();
        big.set_len(MAX_MANIFEST_BYTES + 1).unwrap();
        // a.yaml's new version is unreadable too: a symlink into the loop.
        std::fs::remove_file(d.join("a.yaml")).unwrap();
        symlink(d.join("loop.yaml"), d.join("a.yaml")).unwrap();

        let mut messages: Vec<String> = m.rescan().iter().map(ToString::to_string).collect();
        messages.sort();
        let expect = |file: &str, reason: &str| {
            let file = d.join(file).display().to_string();
            assert!(
                messages
                    .iter()
                    .any(|m| m.starts_with(&file) && m.contains(reason)),
                "{file}: {reason} not in {messages:#?}"
            );
        };
        expect("loop.yaml", "symlink loop");
        expect("dangling.yaml", "dangling symlink");
        expect("latin1.yaml", "not UTF-8 (invalid byte at offset 34)");
        expect("big.yaml", "more than the 128 MiB a manifest may have");
        expect("a.yaml", "symlink loop");
        assert_eq!(messages.len(), 5, "{messages:#?}");
        assert_eq!(
            m.cluster_state().services.len(),
            1,
            "a.yaml's last good version stays"
        );
        assert!(m.rescan().is_empty(), "the same errors are not repeated");

        // Fixed: applied at once; broken again: reported again.
        std::fs::remove_file(d.join("a.yaml")).unwrap();
        std::fs::write(d.join("a.yaml"), SVC.replace("web", "web2")).unwrap();
        assert!(m.rescan().is_empty());
        assert!(m.cluster_state().services.keys().any(|k| k.name == "web2"));
        std::fs::remove_file(d.join("a.yaml")).unwrap();
        symlink(d.join("gone"), d.join("a.yaml")).unwrap();
        assert_eq!(m.rescan().len(), 1);
    }

    #[test]
    fn missing_or_empty_directory_is_a_startup_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = ManifestDir::open(dir.path()).unwrap_err();
        assert!(
            err.to_string().contains("no .yaml, .yml or .json files"),
            "{err}"
        );
        let err = ManifestDir::open(&dir.path().join("nope")).unwrap_err();
        assert!(err.to_string().starts_with("--manifests "), "{err}");
    }
}
