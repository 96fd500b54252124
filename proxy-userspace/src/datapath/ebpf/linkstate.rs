//! Whether a pinned bpf_link still attaches its program: a link can be
//! detached while its pin stays (`bpftool link detach`, BPF_LINK_DETACH,
//! or its cgroup or interface removed); the kernel then reports it with a
//! cgroup id (interface index) of 0. Raw bpf(2) calls: aya 0.14 has no
//! link info.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_DETACH: libc::c_long = 34;
const BPF_LINK_TYPE_CGROUP: u32 = 3;
const BPF_LINK_TYPE_TCX: u32 = 11;

/// The start of `struct bpf_link_info` (UAPI): type, id, prog_id, then
/// the type's union member; for cgroup links a u64 cgroup id, for TCX
/// links a u32 ifindex.
#[repr(C)]
#[derive(Default)]
struct LinkInfo {
    kind: u32,
    id: u32,
    prog_id: u32,
    _pad: u32,
    target: u64,
    rest: [u64; 6],
}

fn bpf(cmd: libc::c_long, attr: &mut [u64; 3]) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a zero-padded bpf_attr of the size passed, laid
    // out for `cmd` by the callers; pointers in it outlive the call.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), size_of::<[u64; 3]>()) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn open_pin(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut attr = [c.as_ptr() as u64, 0, 0];
    let fd = bpf(BPF_OBJ_GET, &mut attr)?;
    // SAFETY: BPF_OBJ_GET returned a new file descriptor we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `Some(true)` when the link pinned at `path` is a cgroup or TCX link
/// still attached, `Some(false)` when it is detached, `None` when it is
/// not such a link or cannot be read.
pub fn attached(path: &Path) -> Option<bool> {
    let fd = open_pin(path).ok()?;
    let mut info = LinkInfo::default();
    let mut attr = [
        u64::from(fd.as_raw_fd() as u32) | ((size_of::<LinkInfo>() as u64) << 32),
        &mut info as *mut LinkInfo as u64,
        0,
    ];
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).ok()?;
    match info.kind {
        BPF_LINK_TYPE_CGROUP => Some(info.target != 0),
        BPF_LINK_TYPE_TCX => Some(info.target as u32 != 0),
        _ => None,
    }
}

/// Detaches the link pinned at `path` and leaves the pin (what an
/// operator's `bpftool link detach` does; for tests).
pub fn detach(path: &Path) -> io::Result<()> {
    let fd = open_pin(path)?;
    let mut attr = [u64::from(fd.as_raw_fd() as u32), 0, 0];
    bpf(BPF_LINK_DETACH, &mut attr).map(|_| ())
}
