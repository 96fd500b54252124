//! The directory state: reads, rescans, duplicates and takeovers.

use super::super::MAX_MANIFEST_BYTES;
use super::*;
use crate::model::{ClusterState, ObjectKey};

const SVC: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n";

fn svc(name: &str, ip: &str) -> String {
    format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec: {{clusterIP: {ip}, ports: [{{port: 80}}]}}\n")
}

fn service_ref(name: &str) -> ObjectRef {
    ObjectRef {
        kind: crate::model::ObjectKind::Service,
        key: ObjectKey::new("default", name),
    }
}

/// A manifest directory and the state a consumer of its changes holds.
struct Seen {
    m: ManifestDir,
    state: ClusterState,
}

impl Seen {
    fn open(dir: &Path) -> Self {
        Seen {
            m: ManifestDir::open(dir).unwrap(),
            state: ClusterState::default(),
        }
    }

    fn apply(&mut self, update: Update) -> Update {
        for c in &update.changes {
            self.state.apply(c.clone());
        }
        update
    }

    fn rescan(&mut self) -> Vec<ManifestError> {
        let u = self.m.rescan();
        self.apply(u).errors
    }

    fn update(&mut self, paths: &[PathBuf]) -> Update {
        let u = self.m.update(paths.iter().cloned());
        self.apply(u)
    }

    fn cluster_state(&self) -> ClusterState {
        self.state.clone()
    }
}

/// The state of a directory whose files all parse, as the source read
/// it before it followed changes: every file in path order, a later
/// definition replacing an earlier one.
fn whole_read(dir: &Path) -> ClusterState {
    let m = ManifestDir::open(dir).unwrap();
    let mut state = ClusterState::default();
    for path in m.list().unwrap() {
        let content = std::fs::read_to_string(&path).unwrap();
        for o in parse_manifest(&path, &content).unwrap() {
            state.apply(Change::Upsert(o));
        }
    }
    state
}

#[test]
fn a_change_to_one_file_among_many_reads_it_alone_and_sends_only_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let content = |f: usize, ip_of_1: &str| {
        [
            svc(&format!("s{f}-0"), &format!("10.96.{f}.0")),
            svc(&format!("s{f}-1"), ip_of_1),
            svc(&format!("s{f}-2"), &format!("10.96.{f}.2")),
        ]
        .join("---\n")
    };
    for f in 0..20 {
        std::fs::write(
            d.join(format!("f{f:02}.yaml")),
            content(f, &format!("10.96.{f}.1")),
        )
        .unwrap();
    }
    let mut seen = Seen::open(d);
    assert!(seen.rescan().is_empty());
    assert_eq!(seen.state.services.len(), 60);

    let f7 = d.join("f07.yaml");
    std::fs::write(&f7, content(7, "10.96.200.1")).unwrap();
    let u = seen.update(std::slice::from_ref(&f7));
    assert_eq!(u.files_read, 1);
    assert!(u.errors.is_empty());
    let refs: Vec<ObjectRef> = u.changes.iter().map(Change::object_ref).collect();
    assert_eq!(refs, [service_ref("s7-1")], "{:?}", u.changes);
    assert!(matches!(u.changes[0], Change::Upsert(_)));

    // One object out of the file: one delete.
    std::fs::write(
        &f7,
        [svc("s7-0", "10.96.7.0"), svc("s7-2", "10.96.7.2")].join("---\n"),
    )
    .unwrap();
    let u = seen.update(std::slice::from_ref(&f7));
    assert_eq!(u.changes, [Change::Delete(service_ref("s7-1"))]);
    assert_eq!(seen.state, whole_read(d));

    // The same content again (a touch, a chmod): nothing.
    assert!(seen.update(std::slice::from_ref(&f7)).changes.is_empty());
    // The periodic rescan reads nothing that did not change.
    assert_eq!(seen.m.rescan().files_read, 0);
}

#[test]
fn the_rescan_reads_only_files_whose_stat_changed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for f in 0..10 {
        std::fs::write(
            d.join(format!("f{f}.yaml")),
            svc(&format!("s{f}"), &format!("10.96.0.{f}")),
        )
        .unwrap();
    }
    let mut seen = Seen::open(d);
    let u = seen.m.rescan();
    assert_eq!(u.files_read, 10);
    seen.apply(u);
    std::fs::write(d.join("f3.yaml"), svc("s3", "10.96.0.103")).unwrap();
    std::fs::remove_file(d.join("f5.yaml")).unwrap();
    let u = seen.m.rescan();
    assert_eq!(u.files_read, 2, "the changed file and the removed one");
    let refs: Vec<ObjectRef> = u.changes.iter().map(Change::object_ref).collect();
    assert_eq!(refs, [service_ref("s5"), service_ref("s3")]);
    seen.apply(u);
    assert_eq!(seen.state, whole_read(d));
}

#[test]
fn rename_into_place_is_read_and_editor_files_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("a.yaml"), SVC).unwrap();
    let mut seen = Seen::open(d);
    assert!(seen.rescan().is_empty());

    // An editor's swap, backup and lock files, vim's write test and an
    // atomic writer's temporary file, each a valid manifest.
    let others = [".a.yaml.swp", "a.yaml~", ".#a.yaml", "4913", ".a.yaml.tmp"];
    for name in others {
        std::fs::write(d.join(name), svc("other", "10.96.0.9")).unwrap();
    }
    let paths: Vec<PathBuf> = others.iter().map(|n| d.join(n)).collect();
    let u = seen.update(&paths);
    assert_eq!(u.files_read, 0);
    assert!(u.changes.is_empty());
    assert_eq!(seen.m.rescan().files_read, 0);

    // The temporary file renamed over a.yaml: the events name both.
    std::fs::rename(d.join(".a.yaml.tmp"), d.join("a.yaml")).unwrap();
    let u = seen.update(&[d.join(".a.yaml.tmp"), d.join("a.yaml")]);
    assert_eq!(u.files_read, 1);
    assert_eq!(
        u.changes.iter().map(Change::object_ref).collect::<Vec<_>>(),
        [service_ref("web"), service_ref("other")]
    );
    assert!(matches!(u.changes[0], Change::Delete(_)), "{:?}", u.changes);
    assert!(matches!(u.changes[1], Change::Upsert(_)), "{:?}", u.changes);
    assert_eq!(seen.state, whole_read(d));

    // Renamed away (to a name that is not a manifest): gone.
    std::fs::rename(d.join("a.yaml"), d.join("a.yaml.bak")).unwrap();
    let u = seen.update(&[d.join("a.yaml"), d.join("a.yaml.bak")]);
    assert_eq!(u.changes, [Change::Delete(service_ref("other"))]);
}

#[test]
fn a_relative_directory_reads_the_files_events_name_by_absolute_path() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("a.yaml"), SVC).unwrap();
    // `--manifests` as typed in a shell: relative to the working directory.
    let cwd = std::env::current_dir().unwrap();
    let up = "../".repeat(cwd.components().count().saturating_sub(1));
    let relative = PathBuf::from(format!("{up}{}", d.strip_prefix("/").unwrap().display()));
    assert!(relative.is_relative());
    let mut seen = Seen::open(&relative);
    assert!(seen.rescan().is_empty());

    // The source watches the absolute form of the directory, so the
    // watcher names files by it.
    let watched = std::path::absolute(&relative).unwrap();
    std::fs::write(d.join(".a.yaml.tmp"), svc("other", "10.96.0.9")).unwrap();
    std::fs::rename(d.join(".a.yaml.tmp"), d.join("a.yaml")).unwrap();
    let u = seen.update(&[watched.join(".a.yaml.tmp"), watched.join("a.yaml")]);
    assert_eq!(u.files_read, 1, "a file named by absolute path was skipped");
    assert_eq!(seen.state, whole_read(d));
}

#[test]
fn files_removed_with_their_directory_keep_their_objects() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("m");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("a.yaml"), SVC).unwrap();
    let mut seen = Seen::open(&d);
    assert!(seen.rescan().is_empty());
    std::fs::remove_dir_all(&d).unwrap();
    // The events name the file first, then the directory.
    assert!(seen.update(&[d.join("a.yaml")]).changes.is_empty());
    let errors = seen.rescan();
    assert!(
        matches!(errors[..], [ManifestError::Read { .. }]),
        "{errors:?}"
    );
    assert_eq!(seen.state.services.len(), 1);
    // Created again with other files: those are the state.
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("b.yaml"), svc("other", "10.96.0.2")).unwrap();
    assert!(seen.rescan().is_empty());
    assert_eq!(seen.state, whole_read(&d));
}

#[test]
fn an_object_defined_twice_comes_from_the_file_that_sorts_last() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (a, b) = (d.join("a.yaml"), d.join("b.yaml"));
    std::fs::write(
        &a,
        [svc("web", "10.96.0.1"), svc("x", "10.96.1.1")].join("---\n"),
    )
    .unwrap();
    // Within a file, the last document wins.
    std::fs::write(
        &b,
        [svc("web", "10.96.0.9"), svc("web", "10.96.0.2")].join("---\n"),
    )
    .unwrap();
    let mut seen = Seen::open(d);
    assert!(seen.rescan().is_empty());
    assert_eq!(seen.state, whole_read(d));
    let ip = |seen: &Seen| {
        seen.state.services[&ObjectKey::new("default", "web")].cluster_ips[0].to_string()
    };
    assert_eq!(ip(&seen), "10.96.0.2");

    // The losing definition changes: nothing to send.
    std::fs::write(
        &a,
        [svc("web", "10.96.0.3"), svc("x", "10.96.1.1")].join("---\n"),
    )
    .unwrap();
    assert!(seen.update(std::slice::from_ref(&a)).changes.is_empty());
    assert_eq!(ip(&seen), "10.96.0.2");

    // The winning definition goes: the other file's takes over.
    std::fs::write(&b, svc("y", "10.96.2.1")).unwrap();
    let u = seen.update(std::slice::from_ref(&b));
    assert_eq!(u.files_read, 2, "a.yaml read again for its definition");
    assert_eq!(ip(&seen), "10.96.0.3");
    assert_eq!(seen.state, whole_read(d));

    // Defined again in the later file, then that file removed.
    std::fs::write(&b, svc("web", "10.96.0.4")).unwrap();
    seen.update(std::slice::from_ref(&b));
    assert_eq!(ip(&seen), "10.96.0.4");
    std::fs::remove_file(&b).unwrap();
    seen.update(std::slice::from_ref(&b));
    assert_eq!(ip(&seen), "10.96.0.3");
    assert_eq!(seen.state, whole_read(d));

    // The only definition goes: deleted.
    std::fs::write(&a, svc("x", "10.96.1.1")).unwrap();
    let u = seen.update(std::slice::from_ref(&a));
    assert_eq!(u.changes, [Change::Delete(service_ref("web"))]);
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
    let mut m = Seen::open(dir.path());
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
    let mut m = Seen::open(d);
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
