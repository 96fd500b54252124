//! Pins of other builds under `--bpffs-root` (issue 38 item 2). The maps
//! and links outlive the daemon, so a rollback meets the pins of the newer
//! build it replaces: a map or a link this build does not make (the newer
//! `EKP_FRAGS`, `links/ekp_lb_source_egress`) would stay forever, a link
//! with its program still attached. At each start, once its own programs
//! are attached (so nothing this build serves has a gap), the daemon
//! removes every pin under its root that [`KnownPins`] does not name,
//! detaching links first, and logs each one; `cleanup` does the same
//! after removing its own pins.
//!
//! Never under the bpffs mount itself (`--bpffs-root /sys/fs/bpf`): the
//! pins there are anyone's.

use std::io;
use std::path::{Path, PathBuf};

use super::pins::{remove_if_exists, KnownPins};
use super::{linkstate, EbpfError, BPFFS_MOUNT};

/// Directories deeper than this are not walked (bpffs allows any depth;
/// this bounds the walk).
const MAX_DEPTH: usize = 8;

/// What was removed, by path relative to the root, sorted.
pub fn remove_unknown(root: &Path, known: &KnownPins) -> Result<Vec<String>, EbpfError> {
    let mut removed = Vec::new();
    if root == Path::new(BPFFS_MOUNT) {
        tracing::debug!(
            root = %root.display(),
            "not looking for other builds' pins at the bpffs mount itself"
        );
        return Ok(removed);
    }
    walk(root, root, known, 0, &mut removed)?;
    Ok(removed)
}

fn entries(dir: &Path) -> Vec<(PathBuf, bool)> {
    let Ok(list) = std::fs::read_dir(dir) else {
        return vec![];
    };
    let mut out: Vec<(PathBuf, bool)> = list
        .filter_map(Result::ok)
        .map(|e| (e.path(), e.file_type().is_ok_and(|t| t.is_dir())))
        .collect();
    out.sort();
    out
}

fn walk(
    root: &Path,
    dir: &Path,
    known: &KnownPins,
    depth: usize,
    removed: &mut Vec<String>,
) -> Result<(), EbpfError> {
    for (path, is_dir) in entries(dir) {
        let rel = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
        if known.contains(&rel) {
            if is_dir && depth < MAX_DEPTH {
                walk(root, &path, known, depth + 1, removed)?;
            }
        } else {
            remove(root, &path, is_dir, depth, removed)?;
        }
    }
    Ok(())
}

/// Removes a pin (a link detached first) or a directory and everything
/// in it.
fn remove(
    root: &Path,
    path: &Path,
    is_dir: bool,
    depth: usize,
    removed: &mut Vec<String>,
) -> Result<(), EbpfError> {
    let name = path
        .strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string();
    if is_dir {
        if depth < MAX_DEPTH {
            for (inner, inner_dir) in entries(path) {
                remove(root, &inner, inner_dir, depth + 1, removed)?;
            }
        }
        std::fs::remove_dir(path).map_err(|e| EbpfError::Pin {
            path: path.to_path_buf(),
            reason: format!("removing another build's directory: {e}"),
        })?;
        tracing::info!(
            name,
            "removed a directory of another build under the bpffs root"
        );
        removed.push(name);
        return Ok(());
    }
    // A link's pin may not be its last reference (a process holding its
    // fd): detach it explicitly, so its program stops running now.
    let kind = match linkstate::detach(path) {
        Ok(()) => "link (detached)",
        // Not a link (a map, a program): BPF_LINK_DETACH says EINVAL.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => "pin",
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            tracing::warn!(name, error = %e, "could not detach another build's link; removing its pin");
            "link"
        }
    };
    if remove_if_exists(path)? {
        tracing::info!(
            name,
            kind,
            "removed a pin of another build under the bpffs root"
        );
        removed.push(name);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_builds_pins_are_known_and_others_are_not() {
        let known = KnownPins::of(super::super::OBJECT);
        for name in [
            "EKP_SERVICES",
            "EKP_BACKENDS",
            "EKP_SERVICES_next",
            "EKP_FRAGS",
            "EKP_CT",
            "links",
            "links/ekp_connect4",
            "links/ekp_getpeername6_new",
            "links/ekp_lb_source_egress",
            "links/ekp_tc_ingress_if3",
            "links/ekp_tc_egress_if12_new",
        ] {
            assert!(known.contains(Path::new(name)), "{name} is this build's");
        }
        for name in [
            "EKP_OLD_MAP",
            "EKP_SERVICES_old",
            "links/ekp_connect4_v2",
            "links/ekp_tc_ingress_if",
            "links/ekp_tc_ingress_ifx",
            "links/other_if3",
            "links/EKP_SERVICES",
            "progs",
            "progs/ekp_connect4",
            "maps/EKP_SERVICES",
            "links/ekp_connect4/x",
        ] {
            assert!(!known.contains(Path::new(name)), "{name} is not");
        }
    }

    /// A map the object pins by name is known without a list here, but
    /// its layout is checked only if `loader::MAPS` has it.
    #[test]
    fn every_map_the_object_pins_is_in_the_loaders_list() {
        if !super::super::object_embedded() {
            eprintln!("SKIP: no eBPF object embedded (cargo xtask build-ebpf --release)");
            return;
        }
        let obj = aya_obj::Object::parse(super::super::OBJECT).expect("the embedded object");
        let listed: Vec<&str> = super::super::loader::MAPS.iter().map(|m| m.0).collect();
        let mut pinned: Vec<&str> = obj
            .maps
            .iter()
            .filter(|(_, m)| m.pinning() == aya_obj::maps::PinningType::ByName)
            .map(|(n, _)| n.as_str())
            .collect();
        pinned.sort();
        assert!(!pinned.is_empty());
        for name in pinned {
            assert!(
                listed.contains(&name),
                "{name} is pinned by the object but not in loader::MAPS"
            );
        }
    }
}
