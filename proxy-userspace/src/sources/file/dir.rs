//! The manifest directory as the file source keeps it between changes: per
//! file a fingerprint and the objects its last good version defines, per
//! object the files that define it. Reading some files turns into the
//! per-object changes that take the consumer from "every file at its last
//! good version" before the read to the same after it, the file that sorts
//! last winning an object defined twice (within a file, its last document).
//!
//! The objects themselves are not kept (the syncer has them): each object
//! is remembered by its reference and a hash of its content. The one case
//! that needs an object not at hand, a duplicate whose winning definition
//! goes away so an earlier file's takes over, reads that earlier file again.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{BuildHasher, Hash};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::LazyLock;

// foldhash (randomly seeded), not SipHash: these tables take every
// object of a large cluster and their keys are short.
use hashbrown::{HashMap, HashSet};
use smallvec::SmallVec;

use super::manifest::{parse_manifest, read_manifest, ManifestError};
use super::FileSourceError;
use crate::model::{Change, Object, ObjectRef};

/// File extensions read as manifests.
const EXTENSIONS: &[&str] = &["yaml", "yml", "json"];
/// Threads that read and parse files at once (YAML parsing is most of the
/// initial read).
const LOAD_THREADS: usize = 4;

/// What a stat says about a file: any difference means "read it again".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stat {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stat {
    /// Follows symlinks: a ConfigMap volume's `..data` swap changes the
    /// inode behind an unchanged link.
    fn of(path: &Path) -> Option<Stat> {
        let m = std::fs::metadata(path).ok()?;
        Some(Stat {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

#[derive(Debug, Default)]
struct FileEntry {
    /// At the last read; `None` when it failed, so a rescan tries again.
    stat: Option<Stat>,
    /// Hash of the content last read, good or bad: the same content is not
    /// parsed again, and a broken version is reported once.
    content: Option<u64>,
    /// The objects of the last good version and the hash of each.
    objects: Vec<(Arc<ObjectRef>, u64)>,
}

/// One file's definition of an object.
#[derive(Debug)]
struct Def {
    file: Arc<Path>,
    hash: u64,
}

/// The definitions of one object.
type Defs = SmallVec<[Def; 1]>;

/// What reading some files changed.
#[derive(Debug, Default)]
pub struct Update {
    /// Deletes first, then upserts, each in object order.
    pub changes: Vec<Change>,
    /// Errors of files that changed and failed (each failing version, and
    /// each read error, is reported once).
    pub errors: Vec<ManifestError>,
    /// Files read.
    pub files_read: usize,
}

/// How a file is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Parsed when its content changed.
    Changed,
    /// Parsed even when unchanged: one of its objects takes over from a
    /// definition that went away.
    Objects,
}

enum Read {
    /// Not a manifest any more (removed, renamed away, not a file).
    Gone,
    /// Unchanged, or failed: the last good version stays.
    Kept,
    Parsed {
        changed: bool,
        objects: Vec<(Arc<ObjectRef>, u64, Object)>,
    },
}

/// An object with its reference and the hash of its content.
type Hashed = (ObjectRef, u64, Object);

/// One file as found on disk, before it is compared with what is known.
enum Loaded {
    /// Not a manifest any more (removed, renamed away, not a file).
    Gone,
    Failed(std::io::Error),
    Read {
        stat: Option<Stat>,
        hash: u64,
        /// `None`: the content is the one known, not parsed again.
        parsed: Option<Result<Vec<Hashed>, Vec<ManifestError>>>,
    },
}

/// Reads and parses one file; `known` is the hash of the content last
/// read, which is parsed again only for `Mode::Objects`. Touches no state,
/// so that files are loaded in parallel.
fn load(path: &Path, known: Option<u64>, mode: Mode) -> Loaded {
    if !is_file_or_broken_link(path) {
        return Loaded::Gone;
    }
    let stat = Stat::of(path);
    let content = match read_manifest(path) {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Loaded::Gone,
        Err(e) => return Loaded::Failed(e),
    };
    let hash = hash_of(&content);
    let parsed = (known != Some(hash) || mode == Mode::Objects)
        .then(|| parse_manifest(path, &content).map(dedupe));
    Loaded::Read { stat, hash, parsed }
}

/// Files to read, made by [`ManifestDir::jobs`]: each path with the hash
/// of its content last read.
pub struct Jobs(Vec<(PathBuf, Option<u64>, Mode)>);

/// What [`Jobs::load`] found, for [`ManifestDir::take`].
pub struct Loads(Vec<(PathBuf, Mode, Loaded)>);

impl Jobs {
    /// Reads and parses the files on up to [`LOAD_THREADS`] threads.
    /// Touches no state: it may run on any thread, ahead of the `take` of
    /// earlier loads.
    pub fn load(self) -> Loads {
        Loads(load_all(self.0))
    }
}

/// Loads `jobs` on up to [`LOAD_THREADS`] threads, results in job order.
fn load_all(jobs: Vec<(PathBuf, Option<u64>, Mode)>) -> Vec<(PathBuf, Mode, Loaded)> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(LOAD_THREADS)
        .min(jobs.len());
    if threads <= 1 {
        return jobs
            .into_iter()
            .map(|(path, known, mode)| {
                let loaded = load(&path, known, mode);
                (path, mode, loaded)
            })
            .collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut results: Vec<(usize, Loaded)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((path, known, mode)) = jobs.get(i) else {
                            return done;
                        };
                        done.push((i, load(path, *known, *mode)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            // A worker panics only if `load` does, a bug: pass it on.
            .flat_map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    results.sort_by_key(|(i, _)| *i);
    jobs.into_iter()
        .zip(results)
        .map(|((path, _, mode), (_, loaded))| (path, mode, loaded))
        .collect()
}

/// One entry per object, the file's last document defining it winning,
/// each with the hash of its content.
fn dedupe(objects: Vec<Object>) -> Vec<Hashed> {
    let mut index: HashMap<ObjectRef, usize> = HashMap::with_capacity(objects.len());
    let mut out: Vec<Option<Hashed>> = Vec::with_capacity(objects.len());
    for o in objects {
        let r = o.object_ref();
        if let Some(i) = index.insert(r.clone(), out.len()) {
            out[i] = None;
        }
        out.push(Some((r, hash_of(&o), o)));
    }
    out.into_iter().flatten().collect()
}

/// The manifests of one directory, each file at its last good version.
#[derive(Debug)]
pub struct ManifestDir {
    dir: PathBuf,
    files: BTreeMap<Arc<Path>, FileEntry>,
    /// Per object, the files defining it in path order: the last one wins.
    /// Nearly every object has one, kept inline.
    defs: HashMap<Arc<ObjectRef>, Defs>,
    /// The read error last reported per path (the directory included), so
    /// a file that stays unreadable is reported once, not at every rescan.
    unreadable: BTreeMap<PathBuf, String>,
}

impl ManifestDir {
    /// Checks that the directory exists and holds at least one manifest.
    /// A relative `dir` is made absolute first: directory events name
    /// absolute paths, and a file they name is a manifest only when its
    /// parent is this directory.
    pub fn open(dir: &Path) -> Result<Self, FileSourceError> {
        let dir = &std::path::absolute(dir).map_err(|e| FileSourceError::Directory {
            dir: dir.to_owned(),
            reason: e.to_string(),
        })?;
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
            defs: HashMap::new(),
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

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether `path` is a manifest of this directory by its name: directly
    /// in it, not hidden (editors' `.x.swp`, `.#x`, the `.x.tmp` of an
    /// atomic write), with a manifest extension (not `x.yaml~`).
    pub fn is_manifest_path(&self, path: &Path) -> bool {
        let hidden = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_none_or(|n| n.starts_with('.'));
        let manifest = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| EXTENSIONS.contains(&e));
        path.parent() == Some(self.dir.as_path()) && !hidden && manifest
    }

    fn list(&self) -> std::io::Result<Vec<PathBuf>> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if self.is_manifest_path(&path) && is_file_or_broken_link(&path) {
                files.push(path);
            }
        }
        files.sort();
        Ok(files)
    }

    /// The files a rescan must read: new ones, changed ones (by stat), the
    /// ones that failed to read, and the ones gone. Lists the directory,
    /// stats each manifest and reads none. A directory that cannot be
    /// listed is an error (reported once) and nothing to read: a vanished
    /// directory is far more likely a mount hiccup than a wish to drop
    /// every service.
    pub fn stale(&mut self) -> (Vec<PathBuf>, Vec<ManifestError>) {
        let listed = match self.list() {
            Ok(l) => {
                self.unreadable.remove(&self.dir);
                l
            }
            Err(e) => {
                let dir = self.dir.clone();
                return (
                    Vec::new(),
                    self.read_failed(dir, e.to_string()).into_iter().collect(),
                );
            }
        };
        let present: BTreeSet<&Path> = listed.iter().map(PathBuf::as_path).collect();
        let dir = self.dir.clone();
        self.unreadable
            .retain(|path, _| *path == dir || present.contains(path.as_path()));
        let mut stale: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|p| !present.contains(&***p))
            .map(|p| p.to_path_buf())
            .collect();
        for path in &listed {
            let known = self.files.get(path.as_path()).and_then(|e| e.stat);
            if known.is_none() || known != Stat::of(path) {
                stale.push(path.clone());
            }
        }
        stale.sort();
        (stale, Vec::new())
    }

    /// The safety net for file systems without inotify: reads only what
    /// [`Self::stale`] names.
    pub fn rescan(&mut self) -> Update {
        let (stale, errors) = self.stale();
        let mut update = self.update(stale);
        update.errors.splice(0..0, errors);
        update
    }

    /// Reads the files at `paths` (those an event named, whatever their stat
    /// says: two writes within one clock tick leave the same mtime) and
    /// returns the changes. Paths that are not manifests are skipped.
    pub fn update(&mut self, paths: impl IntoIterator<Item = PathBuf>) -> Update {
        let jobs = self.jobs(paths);
        self.take(jobs.load())
    }

    /// What reading the files at `paths` needs to know (the manifests
    /// among them, and the hash of each one's content last read), for
    /// [`Jobs::load`] to read them on another thread. [`Self::take`]
    /// must take the loads in the order the jobs were made, and jobs made
    /// before an earlier `take` must name other files than it read (the
    /// initial read's chunks do).
    pub fn jobs(&self, paths: impl IntoIterator<Item = PathBuf>) -> Jobs {
        self.jobs_of(
            paths
                .into_iter()
                .filter(|p| self.is_manifest_path(p))
                .map(|p| (p, Mode::Changed))
                .collect(),
        )
    }

    fn jobs_of(&self, todo: BTreeMap<PathBuf, Mode>) -> Jobs {
        Jobs(
            todo.into_iter()
                .map(|(path, mode)| {
                    let known = self.files.get(path.as_path()).and_then(|e| e.content);
                    (path, known, mode)
                })
                .collect(),
        )
    }

    /// Takes in what [`Jobs::load`] found and returns the changes. Files
    /// whose objects it needs (a definition changed hands to a file not
    /// read) are read here.
    pub fn take(&mut self, loads: Loads) -> Update {
        let mut update = Update::default();
        // The winner of each object touched, before this update.
        let mut before: HashMap<Arc<ObjectRef>, Option<(Arc<Path>, u64)>> = HashMap::new();
        // The objects of each file parsed, by reference.
        let mut parsed: HashMap<Arc<Path>, HashMap<Arc<ObjectRef>, Object>> = HashMap::new();
        let mut read_for_objects: HashSet<PathBuf> = HashSet::new();
        let mut loads = loads.0;
        loop {
            for (path, mode, loaded) in loads {
                update.files_read += 1;
                if mode == Mode::Objects {
                    read_for_objects.insert(path.clone());
                }
                match self.account(&path, loaded, &mut update.errors) {
                    // Removed with the whole directory: far more likely a
                    // mount hiccup or a re-provisioning than a wish to drop
                    // every service; the rescan reports the directory.
                    Read::Gone if !self.dir.is_dir() => {}
                    Read::Gone => {
                        if let Some((file, _)) = self.files.get_key_value(path.as_path()) {
                            let file = file.clone();
                            self.set_objects(&file, None, &mut before);
                        }
                    }
                    Read::Kept => {}
                    Read::Parsed { changed, objects } => {
                        let file = self.file_key(&path);
                        if changed {
                            let defs = objects.iter().map(|(r, h, _)| (r.clone(), *h)).collect();
                            self.set_objects(&file, Some(defs), &mut before);
                        }
                        parsed.insert(file, objects.into_iter().map(|(r, _, o)| (r, o)).collect());
                    }
                }
            }
            // An object whose definition changed hands to a file not read
            // now: read that file for it.
            let mut todo = BTreeMap::new();
            for (r, was) in &before {
                let Some((file, hash)) = self.winner(r) else {
                    continue;
                };
                let have = parsed.get(&file).is_some_and(|o| o.contains_key(r));
                if was.as_ref().map(|w| w.1) != Some(hash)
                    && !have
                    && !read_for_objects.contains(&*file)
                {
                    todo.insert(file.to_path_buf(), Mode::Objects);
                }
            }
            if todo.is_empty() {
                break;
            }
            loads = self.jobs_of(todo).load().0;
        }
        let mut deletes = Vec::new();
        let mut upserts = Vec::new();
        for (r, was) in before {
            match (was, self.winner(&r)) {
                (None, None) => {}
                (Some(_), None) => deletes.push((*r).clone()),
                (was, Some((file, hash))) => {
                    if was.map(|w| w.1) == Some(hash) {
                        continue;
                    }
                    match parsed.get_mut(&file).and_then(|o| o.remove(&r)) {
                        Some(o) => upserts.push(o),
                        // Its file is broken now: its last good version is
                        // in effect but was not kept. Rare enough (a
                        // duplicate, and its file broken meanwhile) to keep
                        // the previous definition and say so.
                        None => {
                            tracing::warn!(object = %r, file = %file.display(), "object defined twice: the definition that takes over is in a file that does not parse now; keeping the previous one")
                        }
                    }
                }
            }
        }
        deletes.sort();
        upserts.sort_by_cached_key(Object::object_ref);
        update.changes = deletes
            .into_iter()
            .map(Change::Delete)
            .chain(upserts.into_iter().map(Change::Upsert))
            .collect();
        update
    }

    /// Takes in what [`load`] found; errors go to `errors` (each failure
    /// reported once).
    fn account(&mut self, path: &Path, loaded: Loaded, errors: &mut Vec<ManifestError>) -> Read {
        let (stat, hash, parsed) = match loaded {
            Loaded::Gone => {
                self.unreadable.remove(path);
                return Read::Gone;
            }
            Loaded::Failed(e) => {
                if let Some(entry) = self.files.get_mut(path) {
                    entry.stat = None;
                }
                errors.extend(self.read_failed(path.to_owned(), e.to_string()));
                return Read::Kept;
            }
            Loaded::Read { stat, hash, parsed } => (stat, hash, parsed),
        };
        self.unreadable.remove(path);
        let file = self.file_key(path);
        let entry = self.files.entry(file).or_default();
        entry.stat = stat;
        let changed = entry.content != Some(hash);
        entry.content = Some(hash);
        match parsed {
            None => Read::Kept,
            Some(Ok(objects)) => Read::Parsed {
                changed,
                objects: objects
                    .into_iter()
                    .map(|(r, h, o)| (self.shared_ref(r), h, o))
                    .collect(),
            },
            Some(Err(errs)) => {
                if changed {
                    errors.extend(errs);
                }
                Read::Kept
            }
        }
    }

    /// `r` as the `Arc` in `defs` when known, so each is stored once.
    fn shared_ref(&self, r: ObjectRef) -> Arc<ObjectRef> {
        self.defs
            .get_key_value(&r)
            .map(|(k, _)| k.clone())
            .unwrap_or_else(|| Arc::new(r))
    }

    /// The shared key of `path` in `files` (a new one if unknown).
    fn file_key(&self, path: &Path) -> Arc<Path> {
        self.files
            .get_key_value(path)
            .map(|(k, _)| k.clone())
            .unwrap_or_else(|| Arc::from(path))
    }

    /// Replaces the objects `file` defines (`None`: the file is gone),
    /// noting in `before` the winner of each object touched, first time.
    fn set_objects(
        &mut self,
        file: &Arc<Path>,
        new: Option<Vec<(Arc<ObjectRef>, u64)>>,
        before: &mut HashMap<Arc<ObjectRef>, Option<(Arc<Path>, u64)>>,
    ) {
        let old = match new {
            None => self
                .files
                .remove(file)
                .map(|e| e.objects)
                .unwrap_or_default(),
            Some(new) => std::mem::replace(
                &mut self.files.entry(file.clone()).or_default().objects,
                new,
            ),
        };
        let mut old_refs: HashSet<&Arc<ObjectRef>> = HashSet::new();
        for (r, _) in &old {
            old_refs.insert(r);
            before
                .entry(r.clone())
                .or_insert_with(|| winner(&self.defs, r));
            if let Some(defs) = self.defs.get_mut(r) {
                defs.retain(|d| d.file != *file);
                if defs.is_empty() {
                    self.defs.remove(r);
                }
            }
        }
        let Some(entry) = self.files.get(file) else {
            return;
        };
        for (r, hash) in &entry.objects {
            before
                .entry(r.clone())
                .or_insert_with(|| winner(&self.defs, r));
            let defs = self.defs.entry(r.clone()).or_default();
            let at = defs.partition_point(|d| d.file < *file);
            if !defs.is_empty() && !old_refs.contains(r) {
                let others: Vec<String> =
                    defs.iter().map(|d| d.file.display().to_string()).collect();
                tracing::warn!(object = %r, file = %file.display(), ?others, "object defined twice; the file that sorts last wins");
            }
            defs.insert(
                at,
                Def {
                    file: file.clone(),
                    hash: *hash,
                },
            );
        }
    }

    fn winner(&self, r: &ObjectRef) -> Option<(Arc<Path>, u64)> {
        winner(&self.defs, r)
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

    /// Objects known (each counted once, duplicates too).
    pub fn object_count(&self) -> usize {
        self.defs.len()
    }
}

fn winner(defs: &HashMap<Arc<ObjectRef>, Defs>, r: &ObjectRef) -> Option<(Arc<Path>, u64)> {
    defs.get(r)
        .and_then(|d| d.last())
        .map(|d| (d.file.clone(), d.hash))
}

/// `is_file` follows symlinks (ConfigMap volumes are symlinks). A symlink
/// that leads nowhere (dangling, or a loop) counts too, so that reading it
/// reports why.
fn is_file_or_broken_link(path: &Path) -> bool {
    path.is_file() || (path.is_symlink() && std::fs::metadata(path).is_err())
}

/// The content hash of a file or an object: foldhash, seeded once per
/// process so hashes compare across threads and reads. SipHash (the std
/// default) cost 3 % of a 50k-service start over 126 MB of manifests; a
/// collision can only make the source skip one changed file until its
/// next write, and the writer of the manifests is trusted anyway.
fn hash_of<T: Hash + ?Sized>(value: &T) -> u64 {
    static SEED: LazyLock<hashbrown::DefaultHashBuilder> = LazyLock::new(Default::default);
    SEED.hash_one(value)
}

#[cfg(test)]
#[path = "dir_tests.rs"]
mod tests;
