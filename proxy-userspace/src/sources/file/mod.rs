//! The file source: Service, EndpointSlice, Node and Pod objects from the
//! YAML/JSON manifests in one directory, followed as the files change.
//!
//! Each file is all-or-nothing: when a file fails to parse or holds an
//! invalid object, every error is logged with the file, document index and
//! reason, and the last good version of that file stays in effect. Other
//! files are unaffected.
//!
//! The source reads every file once at start, then only the files a
//! directory event names (writes, creates, removes, renames; never the
//! open/close events of its own reads) and sends the per-object changes
//! of those files. A periodic rescan stats the files and reads only those
//! whose stat changed, for file systems without inotify events.

mod dir;
mod fast_yaml;
mod manifest;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use dir::{ManifestDir, Update};
pub use manifest::{parse_manifest, ManifestError, MAX_MANIFEST_BYTES};

use super::{SourceMessage, SourceSender};
use crate::model::Change;

/// Quiet time after a file event before reading, so that a burst (an
/// editor's write-rename-chmod, a tool writing many files) becomes one
/// read of each file, while a single change waits no longer than this.
const QUIET: Duration = Duration::from_millis(2);
/// A steady stream of events is read at least this often.
const BURST_MAX: Duration = Duration::from_millis(50);
/// How long a file written in place (a write seen, its close not yet) is
/// waited for before it is read anyway.
const WRITE_MAX: Duration = Duration::from_millis(200);
/// Wait after the directory itself was removed or created before reading.
const DIR_SETTLE: Duration = Duration::from_millis(100);
/// Safety net for file systems without inotify events (network mounts):
/// a stat of each file, a read of those whose stat changed.
const RESCAN_INTERVAL: Duration = Duration::from_secs(5);
/// Changes sent per message during the initial read, so that the syncer
/// applies them while later files are parsed and no whole-directory batch
/// is held.
const INITIAL_BATCH: usize = 4096;
/// Files read together (in parallel) during the initial read and a large
/// burst: a bound on the objects held before they are sent (in the initial
/// read three chunks: one taken in, one loaded and waiting, one loading).
const CHUNK_FILES: usize = 256;
const CHUNK_BYTES: u64 = 4 << 20;
/// Queued directory events; when full, the next read is a rescan.
const EVENT_QUEUE: usize = 4096;
/// Test hook, read from the environment (deliberately not a flag): while
/// the file this names exists, the source holds back `Synced` after its
/// first read, like an API source whose initial list has not finished.
/// Integration tests use it to see readiness fail on `informer-sync`.
const HOLD_SYNCED_ENV: &str = "EBPF_KUBE_PROXY_TEST_HOLD_SOURCE";
/// How often a held-back source looks at the hold file again.
const HOLD_RECHECK: Duration = Duration::from_millis(100);

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

/// What a directory event asks of the source.
#[derive(Debug)]
enum Hint {
    /// Read this entry of the directory; `writing`: written in place and
    /// not closed yet.
    File { path: PathBuf, writing: bool },
    /// Stat every file (the directory itself changed, or events were lost).
    Rescan,
}

/// The files to read next, gathered from events.
#[derive(Debug, Default)]
struct Pending {
    files: BTreeMap<PathBuf, bool>,
    rescan: bool,
}

impl Pending {
    fn add(&mut self, hint: Hint) {
        match hint {
            Hint::File { path, writing } => {
                self.files.insert(path, writing);
            }
            Hint::Rescan => self.rescan = true,
        }
    }

    fn writing(&self) -> bool {
        self.files.values().any(|w| *w)
    }
}

/// Turns one notify event into hints (none for the source's own reads or
/// for other entries of the parent directory).
fn hints(dir: &Path, res: notify::Result<notify::Event>, rewatch: &AtomicBool) -> Vec<Hint> {
    let ev = match res {
        Ok(ev) => ev,
        Err(e) => {
            tracing::debug!(error = %e, "manifest directory watch error; rescanning");
            return vec![Hint::Rescan];
        }
    };
    let writing = match ev.kind {
        // Reading the files (ours included) raises open/close-nowrite
        // events; reacting to those re-read the directory forever.
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => false,
        EventKind::Access(_) => return Vec::new(),
        EventKind::Modify(ModifyKind::Data(_)) | EventKind::Create(CreateKind::File) => true,
        _ => false,
    };
    let mut out = Vec::new();
    if ev.need_rescan() {
        out.push(Hint::Rescan);
    }
    for path in ev.paths {
        if path == dir {
            // Removed, created or renamed: its watch must be set up again,
            // even if a new directory got the old one's inode.
            rewatch.store(true, Ordering::Relaxed);
            out.push(Hint::Rescan);
        } else if path.parent() == Some(dir) {
            out.push(Hint::File { path, writing });
        }
    }
    out
}

/// Runs the file source until `cancel` fires: an initial read (then
/// `Synced`), then a read of the files each directory event names.
pub async fn run(
    mut manifests: ManifestDir,
    tx: SourceSender,
    cancel: CancellationToken,
) -> Result<(), FileSourceError> {
    let dir = std::path::absolute(manifests.dir()).unwrap_or_else(|_| manifests.dir().to_owned());
    let (event_tx, mut event_rx) = mpsc::channel::<Hint>(EVENT_QUEUE);
    let rewatch = Arc::new(AtomicBool::new(false));
    // Set when the queue was full: events were dropped, the next read is a
    // rescan.
    let overflow = Arc::new(AtomicBool::new(false));
    let mut watcher = {
        let (dir, rewatch, overflow) = (dir.clone(), rewatch.clone(), overflow.clone());
        notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            for hint in hints(&dir, res, &rewatch) {
                if event_tx.try_send(hint).is_err() {
                    overflow.store(true, Ordering::Relaxed);
                }
            }
        })
    }
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

    if !initial_read(&mut manifests, &tx).await {
        return Ok(());
    }
    if !hold_back_synced(&cancel).await {
        return Ok(());
    }
    tracing::info!(dir = %dir.display(), objects = manifests.object_count(), "file source synced");
    if tx.send(SourceMessage::Synced).await.is_err() {
        return Ok(());
    }

    loop {
        let mut pending = Pending::default();
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            hint = event_rx.recv() => {
                let Some(hint) = hint else { return Ok(()) };
                pending.add(hint);
                if !gather(&mut event_rx, &mut pending).await {
                    return Ok(());
                }
            }
            _ = tokio::time::sleep(RESCAN_INTERVAL) => pending.rescan = true,
        }
        let started = Instant::now();
        if overflow.swap(false, Ordering::Relaxed) {
            pending.rescan = true;
        }
        let again = rewatch.swap(false, Ordering::Relaxed);
        if again {
            // A directory removed or created again is usually being torn
            // down or filled (`kubectl cp`): let it settle first.
            tokio::time::sleep(DIR_SETTLE).await;
            while let Ok(hint) = event_rx.try_recv() {
                pending.add(hint);
            }
        }
        if let Err(e) = watch_dir(&mut watcher, &dir, &mut watched, again) {
            tracing::debug!(dir = %dir.display(), error = %e, "cannot watch the manifest directory yet");
        }
        // A ConfigMap volume swaps its `..data` symlink: the manifests'
        // links are unchanged, the files behind them new.
        let kubelet_swap = pending.files.keys().any(|p| {
            !manifests.is_manifest_path(p)
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(".."))
        });
        let (paths, errors) = if pending.rescan || kubelet_swap {
            let (mut stale, errors) = manifests.stale();
            stale.extend(pending.files.into_keys());
            (stale, errors)
        } else {
            (pending.files.into_keys().collect(), Vec::new())
        };
        if !read_burst(&mut manifests, paths, errors, &tx).await {
            return Ok(());
        }
        tracing::trace!(
            took_us = started.elapsed().as_micros() as u64,
            "burst handled"
        );
    }
}

/// Reads the files one burst of events named and sends the changes. A
/// burst larger than a chunk of the initial read (a generator rewrote
/// every manifest) is read a chunk at a time as that one is, so only a
/// chunk's objects wait to be sent rather than a second copy of the
/// cluster; all but the last chunk's changes go as
/// [`SourceMessage::Part`], so no state is computed from half a burst (a
/// Service moved between two files of different chunks never goes
/// missing). False when the receiver is gone.
async fn read_burst(
    manifests: &mut ManifestDir,
    mut paths: Vec<PathBuf>,
    mut errors: Vec<ManifestError>,
    tx: &SourceSender,
) -> bool {
    paths.sort();
    paths.dedup();
    let chunks = chunks(paths);
    let last = chunks.len().saturating_sub(1);
    let mut parts_sent = false;
    for (i, chunk) in chunks.into_iter().enumerate() {
        let started = Instant::now();
        let update = manifests.update(chunk);
        if update.files_read > 0 {
            tracing::debug!(
                files = update.files_read,
                changes = update.changes.len(),
                took_us = started.elapsed().as_micros() as u64,
                "manifests read"
            );
        }
        errors.extend(update.errors);
        if !send_errors(tx, std::mem::take(&mut errors)).await {
            return false;
        }
        let changes = update.changes;
        let message = if i < last {
            (!changes.is_empty()).then(|| SourceMessage::Part(changes))
        } else {
            // The last chunk ends the update, even with no changes of its own.
            (parts_sent || !changes.is_empty()).then(|| SourceMessage::Changes(changes))
        };
        if let Some(message) = message {
            parts_sent = true;
            if tx.send(message).await.is_err() {
                return false;
            }
        }
    }
    send_errors(tx, errors).await
}

/// Waits for the end of a burst of events: [`QUIET`] without one, longer
/// while a file is being written in place. False when the watcher is gone.
async fn gather(event_rx: &mut mpsc::Receiver<Hint>, pending: &mut Pending) -> bool {
    let first = Instant::now();
    loop {
        let limit = if pending.writing() {
            WRITE_MAX
        } else {
            BURST_MAX
        };
        let left = limit.saturating_sub(first.elapsed());
        if left.is_zero() {
            return true;
        }
        let wait = if pending.writing() {
            left
        } else {
            QUIET.min(left)
        };
        match tokio::time::timeout(wait, event_rx.recv()).await {
            Ok(Some(hint)) => pending.add(hint),
            Ok(None) => return false,
            Err(_) if !pending.writing() => return true,
            Err(_) => {}
        }
    }
}

/// Reads every manifest, sending the changes in batches as they come.
/// False when the receiver is gone.
///
/// The files are read in chunks; a blocking thread loads (reads and
/// parses) the next chunk while this task takes in the last one, so the
/// parse, most of the work, never waits for the bookkeeping.
async fn initial_read(manifests: &mut ManifestDir, tx: &SourceSender) -> bool {
    let started = Instant::now();
    let (files, mut errors) = manifests.stale();
    let count = files.len();
    let jobs: Vec<_> = chunks(files)
        .into_iter()
        .map(|chunk| manifests.jobs(chunk))
        .collect();
    let (loads_tx, mut loads_rx) = mpsc::channel(1);
    // Ends with its last chunk, or at the next one once `loads_rx` is gone.
    tokio::task::spawn_blocking(move || {
        for chunk in jobs {
            if loads_tx.blocking_send(chunk.load()).is_err() {
                return;
            }
        }
    });
    let mut changes = Vec::new();
    let mut taking = Duration::ZERO;
    while let Some(loads) = loads_rx.recv().await {
        let take_started = Instant::now();
        let update = manifests.take(loads);
        taking += take_started.elapsed();
        errors.extend(update.errors);
        changes.extend(update.changes);
        if changes.len() >= INITIAL_BATCH
            && !send(
                tx,
                std::mem::take(&mut errors),
                std::mem::take(&mut changes),
            )
            .await
        {
            return false;
        }
    }
    tracing::debug!(
        files = count,
        took_ms = started.elapsed().as_millis() as u64,
        taking_in_ms = taking.as_millis() as u64,
        "manifests read"
    );
    send(tx, errors, changes).await
}

/// `files` in chunks of at most [`CHUNK_FILES`] files, closed once
/// they reach [`CHUNK_BYTES`].
fn chunks(files: Vec<PathBuf>) -> Vec<Vec<PathBuf>> {
    let mut chunks = Vec::new();
    let mut chunk = Vec::new();
    let mut chunk_bytes = 0;
    for file in files {
        chunk_bytes += std::fs::metadata(&file).map_or(0, |m| m.len());
        chunk.push(file);
        if chunk.len() >= CHUNK_FILES || chunk_bytes >= CHUNK_BYTES {
            chunks.push(std::mem::take(&mut chunk));
            chunk_bytes = 0;
        }
    }
    if !chunk.is_empty() {
        chunks.push(chunk);
    }
    chunks
}

/// Logs and sends errors, then changes. False when the receiver is gone.
async fn send(tx: &SourceSender, errors: Vec<ManifestError>, changes: Vec<Change>) -> bool {
    send_errors(tx, errors).await
        && (changes.is_empty() || tx.send(SourceMessage::Changes(changes)).await.is_ok())
}

/// Logs and sends errors. False when the receiver is gone.
async fn send_errors(tx: &SourceSender, errors: Vec<ManifestError>) -> bool {
    for e in &errors {
        tracing::error!(error = %e, "manifest not applied; keeping the last good version of the file");
    }
    errors.is_empty() || tx.send(SourceMessage::Errors(errors)).await.is_ok()
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

    fn file(name: &str, writing: bool) -> Hint {
        Hint::File {
            path: PathBuf::from(name),
            writing,
        }
    }

    #[tokio::test]
    async fn a_burst_of_events_is_one_read_and_a_single_change_waits_a_few_ms() {
        let (tx, mut rx) = mpsc::channel(64);
        // One event: read after the quiet time, not the old 100 ms.
        let started = Instant::now();
        let mut pending = Pending::default();
        pending.add(file("a.yaml", false));
        assert!(gather(&mut rx, &mut pending).await);
        assert!(
            started.elapsed() < Duration::from_millis(50),
            "{:?}",
            started.elapsed()
        );

        // A burst (each event within the quiet time of the previous): one
        // set of files to read.
        let sender = tokio::spawn({
            let tx = tx.clone();
            async move {
                for i in 0..20 {
                    tx.send(file(&format!("f{i}.yaml"), false)).await.unwrap();
                    tx.send(Hint::Rescan).await.unwrap();
                }
            }
        });
        let mut pending = Pending::default();
        pending.add(rx.recv().await.unwrap());
        assert!(gather(&mut rx, &mut pending).await);
        sender.await.unwrap();
        assert_eq!(pending.files.len(), 20);
        assert!(pending.rescan);
    }

    #[tokio::test]
    async fn a_file_written_in_place_is_read_after_its_close() {
        let (tx, mut rx) = mpsc::channel(64);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            tx.send(file("a.yaml", true)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(30)).await;
            tx.send(file("a.yaml", false)).await.unwrap();
            // Held open so that the gather ends by its timers, not a
            // closed channel.
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        let started = Instant::now();
        let mut pending = Pending::default();
        pending.add(file("a.yaml", true));
        assert!(gather(&mut rx, &mut pending).await);
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(60),
            "read before the close: {took:?}"
        );
        assert!(took < WRITE_MAX, "{took:?}");
        assert!(!pending.writing());
    }

    #[test]
    fn own_reads_raise_no_hint_and_the_directory_itself_rewatches() {
        use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
        let dir = Path::new("/m");
        let rewatch = AtomicBool::new(false);
        let ev = |kind, paths: &[&str]| {
            let mut e = notify::Event::new(kind);
            for p in paths {
                e = e.add_path(PathBuf::from(p));
            }
            Ok(e)
        };
        let read = EventKind::Access(AccessKind::Close(AccessMode::Read));
        assert!(hints(dir, ev(read, &["/m/a.yaml"]), &rewatch).is_empty());
        assert!(hints(
            dir,
            ev(
                EventKind::Access(AccessKind::Open(AccessMode::Any)),
                &["/m"]
            ),
            &rewatch
        )
        .is_empty());
        assert!(!rewatch.load(Ordering::Relaxed));
        let rename = EventKind::Modify(ModifyKind::Name(RenameMode::Both));
        let h = hints(
            dir,
            ev(rename, &["/m/.a.yaml.tmp", "/m/a.yaml", "/other/x"]),
            &rewatch,
        );
        let names: Vec<String> = h
            .iter()
            .map(|h| match h {
                Hint::File { path, .. } => path.display().to_string(),
                Hint::Rescan => "rescan".to_owned(),
            })
            .collect();
        assert_eq!(names, ["/m/.a.yaml.tmp", "/m/a.yaml"]);
        let removed = EventKind::Remove(notify::event::RemoveKind::Folder);
        assert!(matches!(
            hints(dir, ev(removed, &["/m"]), &rewatch)[..],
            [Hint::Rescan]
        ));
        assert!(rewatch.load(Ordering::Relaxed));
    }
}
