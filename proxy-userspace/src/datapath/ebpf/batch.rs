//! Batched map writes and reads: `BPF_MAP_UPDATE_BATCH`,
//! `BPF_MAP_DELETE_BATCH` and `BPF_MAP_LOOKUP_BATCH` through a raw bpf(2)
//! call, because aya 0.14 exposes only the one-element calls (reading
//! 550k entries back after a restart was two syscalls per entry). A full sync of 50k services / 250k endpoints is
//! about 550k map writes; one syscall each cost most of the sync, a batch
//! is one syscall per run of writes to the same map.
//!
//! The kernel handles a batch's elements one after the other, in order,
//! each visible as soon as it is written, exactly as the same writes done
//! one by one: the ordering rules of [`super::plan`] hold within a batch.
//! On an error it reports how many elements it had handled.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
const BPF_MAP_DELETE_BATCH: libc::c_long = 27;

/// The `batch` member of `union bpf_attr` (UAPI).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// A failed batch: how many elements the kernel handled before `error`.
#[derive(Debug)]
pub struct BatchError {
    pub done: usize,
    pub error: io::Error,
}

fn call(cmd: libc::c_long, attr: &mut BatchAttr, len: usize) -> Result<(), BatchError> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: `attr` is a valid BPF_MAP_*_BATCH attribute of the size
    // passed; `keys` (and `values`) point at `count` elements of the map's
    // key (value) size that outlive the call; the kernel only reads them
    // and writes `count` back into `attr`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut BatchAttr,
            size_of::<BatchAttr>(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(BatchError {
            error: io::Error::last_os_error(),
            done: (attr.count as usize).min(len),
        })
    }
}

fn count(len: usize) -> Result<u32, BatchError> {
    u32::try_from(len).map_err(|_| BatchError {
        done: 0,
        error: io::Error::from_raw_os_error(libc::E2BIG),
    })
}

/// Writes `keys[i] → values[i]`, in order (`BPF_ANY`).
pub fn update<K: aya::Pod, V: aya::Pod>(
    fd: BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
) -> Result<(), BatchError> {
    assert_eq!(keys.len(), values.len(), "one value per key");
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count: count(keys.len())?,
        map_fd: fd.as_raw_fd() as u32,
        ..BatchAttr::default()
    };
    call(BPF_MAP_UPDATE_BATCH, &mut attr, keys.len())
}

/// Deletes `keys`, in order; a key that is not there is skipped (the
/// goal, its absence, is reached).
pub fn delete<K: aya::Pod>(fd: BorrowedFd<'_>, keys: &[K]) -> Result<(), BatchError> {
    let mut from = 0;
    while from < keys.len() {
        let rest = &keys[from..];
        let mut attr = BatchAttr {
            keys: rest.as_ptr() as u64,
            count: count(rest.len())?,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        match call(BPF_MAP_DELETE_BATCH, &mut attr, rest.len()) {
            Ok(()) => return Ok(()),
            Err(e) if e.error.raw_os_error() == Some(libc::ENOENT) => from += e.done + 1,
            Err(e) => {
                return Err(BatchError {
                    done: from + e.done,
                    error: e.error,
                })
            }
        }
    }
    Ok(())
}

/// Entries one lookup call asks for: far more than a hash bucket holds
/// (the kernel refuses a call that cannot take a whole bucket).
const LOOKUP_CHUNK: usize = 8192;

/// Every entry of a hash map, read in chunks. Entries written or deleted
/// meanwhile may or may not be seen (as with a key-by-key walk).
pub fn lookup_all<K: aya::Pod, V: aya::Pod>(fd: BorrowedFd<'_>) -> io::Result<Vec<(K, V)>> {
    let mut out = Vec::new();
    for_each_entry(fd, |k: &K, v: &V| out.push((*k, *v)))?;
    Ok(out)
}

/// Hands every entry of a hash map to `f`, read in chunks of
/// [`LOOKUP_CHUNK`], so that only one chunk is in memory at a time.
pub fn for_each_entry<K: aya::Pod, V: aya::Pod>(
    fd: BorrowedFd<'_>,
    mut f: impl FnMut(&K, &V),
) -> io::Result<()> {
    // The position token: a bucket index for hash maps (u32); room for
    // more, as the kernel writes up to the key size for some map types.
    let mut token = [0u64; 8];
    let mut first = true;
    // SAFETY: K and V are plain data (`aya::Pod`): any bytes the kernel
    // writes are valid values.
    let mut keys: Vec<K> = vec![unsafe { std::mem::zeroed() }; LOOKUP_CHUNK];
    let mut values: Vec<V> = vec![unsafe { std::mem::zeroed() }; LOOKUP_CHUNK];
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { token.as_mut_ptr() as u64 },
            out_batch: token.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: LOOKUP_CHUNK as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        first = false;
        let result = call(BPF_MAP_LOOKUP_BATCH, &mut attr, LOOKUP_CHUNK);
        let got = (attr.count as usize).min(LOOKUP_CHUNK);
        for (k, v) in keys[..got].iter().zip(&values[..got]) {
            f(k, v);
        }
        match result {
            Ok(()) => {}
            // The end of the map.
            Err(e) if e.error.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            Err(e) => return Err(e.error),
        }
    }
}

/// How many entries a hash map (plain or LRU) holds, read in batches of
/// [`LOOKUP_CHUNK`] into buffers of the map's key and value sizes (taken
/// from the map, so any layout can be counted). Entries written or
/// deleted meanwhile may or may not be counted.
pub fn count_entries(fd: BorrowedFd<'_>, key_size: usize, value_size: usize) -> io::Result<usize> {
    let mut token = [0u64; 8];
    let mut first = true;
    let mut keys = vec![0u8; LOOKUP_CHUNK * key_size.max(1)];
    let mut values = vec![0u8; LOOKUP_CHUNK * value_size.max(1)];
    let mut total = 0;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { token.as_mut_ptr() as u64 },
            out_batch: token.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: LOOKUP_CHUNK as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        first = false;
        let result = call(BPF_MAP_LOOKUP_BATCH, &mut attr, LOOKUP_CHUNK);
        total += (attr.count as usize).min(LOOKUP_CHUNK);
        match result {
            Ok(()) => {}
            Err(e) if e.error.raw_os_error() == Some(libc::ENOENT) => return Ok(total),
            Err(e) => return Err(e.error),
        }
    }
}
