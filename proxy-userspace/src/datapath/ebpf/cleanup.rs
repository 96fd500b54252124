//! Removing the eBPF datapath from the node (`cleanup`: links, pins, its
//! own bpffs mount) and counting what is attached to a cgroup on the
//! socket hooks (`attached_programs`, anyone's programs, for `cleanup` and
//! the tests to see the hooks really went).

use std::fs::File;
use std::io;
use std::path::Path;

use super::generation;
use super::loader::{absolute, mounts, MAPS};
use super::pins::{remove_if_exists, KnownPins, LINKS_DIR};
use super::{foreign, EbpfError, BPFFS_MOUNT};

/// What [`cleanup`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleanupReport {
    pub links: Vec<String>,
    pub maps: Vec<String>,
    /// Pins of other builds (`foreign.rs`), relative to the root.
    pub foreign: Vec<String>,
    pub unmounted: bool,
}

/// Waits (bounded) until the kernel has released the links with these ids:
/// with the last pin and fd gone a link is detached, but asynchronously,
/// and a connection made meanwhile would still be load-balanced. Listing
/// links needs CAP_SYS_ADMIN: without it (the daemon's least-privilege
/// set) the list is empty and this returns at once.
fn wait_links_released(ids: &[u32]) {
    if ids.is_empty() {
        return;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let alive = aya::programs::loaded_links()
            .filter_map(Result::ok)
            .any(|l| ids.contains(&l.id()));
        if !alive || std::time::Instant::now() > deadline {
            if alive {
                tracing::warn!("detached links still listed by the kernel after 2 s");
            }
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Detaches the programs (removing their link pins, the last reference:
/// the kernel then unloads them) and removes the map pins and the
/// directory. Idempotent; a missing directory is not an error.
pub fn cleanup(bpffs_root: &Path) -> Result<CleanupReport, EbpfError> {
    let root = absolute(bpffs_root);
    let mut report = CleanupReport::default();
    if !root.exists() {
        return Ok(report);
    }
    let links_dir = root.join(LINKS_DIR);
    if let Ok(entries) = std::fs::read_dir(&links_dir) {
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut link_ids = Vec::new();
        for name in names {
            let path = links_dir.join(&name);
            // The link's id, to see below that the kernel let it go.
            if let Ok(pinned) = aya::programs::links::PinnedLink::from_pin(&path) {
                let link: aya::programs::links::FdLink = pinned.into();
                if let Ok(info) = link.info() {
                    link_ids.push(info.id());
                }
            }
            if remove_if_exists(&path)? {
                report.links.push(name);
            }
        }
        wait_links_released(&link_ids);
    }
    // What another build left (a rollback): links detached, pins removed.
    report.foreign = foreign::remove_unknown(&root, &KnownPins::of(super::OBJECT))?;
    remove_dir_if_exists(&links_dir)?;
    for (name, ..) in MAPS {
        if remove_if_exists(&root.join(name))? {
            report.maps.push(name.to_owned());
        }
    }
    generation::discard_next(&root);
    let mounts = mounts();
    let own_mount = root != Path::new(BPFFS_MOUNT)
        && mounts
            .iter()
            .any(|m| m.mount_point == root && m.fs_type == "bpf");
    if own_mount {
        let target = std::ffi::CString::new(root.as_os_str().as_encoded_bytes()).map_err(|_| {
            EbpfError::Bpffs {
                path: root.clone(),
                reason: "path contains a NUL byte".to_owned(),
            }
        })?;
        // SAFETY: `target` is a valid NUL-terminated path for the call.
        let rc = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        report.unmounted = rc == 0;
    }
    remove_dir_if_exists(&root)?;
    Ok(report)
}

/// `bpf_attach_type` values of the hooks in [`PROGRAMS`]' order
/// (`BPF_CGROUP_INET4_CONNECT` … `BPF_CGROUP_INET6_GETPEERNAME`, UAPI).
const HOOK_ATTACH_TYPES: [u32; 8] = [10, 11, 14, 15, 19, 20, 29, 30];
const BPF_PROG_QUERY: libc::c_long = 16;

/// The `query` member of `union bpf_attr` (BPF_PROG_QUERY).
#[repr(C)]
#[derive(Default)]
struct ProgQueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// How many programs are attached directly to `cgroup` on the hooks this
/// datapath uses (anyone's, not only ours).
pub fn attached_programs(cgroup: &Path) -> Result<u32, EbpfError> {
    use std::os::fd::AsRawFd;
    let err = |reason: String| EbpfError::CgroupPath {
        path: cgroup.to_path_buf(),
        reason,
    };
    let dir = File::open(cgroup).map_err(|e| err(format!("opening: {e}")))?;
    let fd = u32::try_from(dir.as_raw_fd()).map_err(|_| err("bad fd".to_owned()))?;
    let mut total = 0;
    for attach_type in HOOK_ATTACH_TYPES {
        let mut attr = ProgQueryAttr {
            target_fd: fd,
            attach_type,
            ..ProgQueryAttr::default()
        };
        // SAFETY: `attr` is a valid, writable BPF_PROG_QUERY attribute of
        // the size passed; with prog_ids = 0 the kernel only writes
        // prog_cnt (and attach_flags/revision) into it.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_QUERY,
                &mut attr as *mut ProgQueryAttr,
                size_of::<ProgQueryAttr>(),
            )
        };
        if rc != 0 {
            return Err(err(format!(
                "BPF_PROG_QUERY: {}",
                io::Error::last_os_error()
            )));
        }
        total += attr.prog_cnt;
    }
    Ok(total)
}

fn remove_dir_if_exists(path: &Path) -> Result<(), EbpfError> {
    match std::fs::remove_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(EbpfError::Pin {
            path: path.to_path_buf(),
            reason: format!("removing the directory: {e} (something else is pinned there)"),
        }),
    }
}
