//! The sized maps (`EKP_SERVICES`, `EKP_BACKENDS`): their capacity comes
//! from `--ebpf-map-size`, and a pinned pair of another capacity (an
//! earlier run with another setting, or an earlier version's fixed
//! 262,144) is replaced by a new generation without a gap in service.
//!
//! **Sizing.** One number for both maps, default [`DEFAULT_MAP_SIZE`]
//! (2^21): 100k services with 1M endpoints need about 1.1M service entries
//! (a header per service port plus a slot per endpoint) and 1M backends.
//! The maps are created here, not by the loader, with `BPF_F_NO_PREALLOC`:
//! a preallocated hash map allocates every element up front (about
//! 100 bytes each, 2 × 2^21 elements ≈ 400 MiB of kernel memory whatever
//! the cluster), while without it the kernel allocates an element on
//! insert and up front only the bucket array, 16 bytes per
//! roundup_pow_of_two(max_entries): 32 MiB per map at the default, about
//! what the earlier preallocated 262,144-entry maps cost. The programs
//! only look these maps up, which is as fast either way. Sizing from the
//! state instead would mean a map swap whenever the cluster grows past
//! it; a fixed, cheap, large capacity never needs one while running.
//!
//! **Replacing a generation** ([`prepare`] then [`promote`]): new maps are
//! created and pinned under `<name>_next`, filled with what the pinned
//! maps hold (batched), the programs are loaded against them, attached
//! with new links that replace the old links (see
//! [`super::loader::load_and_attach`]: the new link is attached before
//! the old one's pin goes, so some program always runs; while both run,
//! the old one translates and the new one sees a backend address and
//! leaves it), and finally the `_next` pins are renamed over the old ones.
//! `bpf_link_update` would swap a link's program in place, but aya 0.14
//! exposes it only for XDP/TC links and the attach-then-replace the
//! loader already does keeps the hooks covered just as well. A pinned
//! state that does not fit the new capacity is refused before anything
//! is attached: the running maps and programs stay as they are.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use aya::maps::{HashMap, IterableMap, MapData, MapError};
use proxy_common::{Backend, ServiceKey, ServiceValue, MAP_BACKENDS, MAP_SERVICES};

use super::batch;
use super::{chain, EbpfError};

/// Default `--ebpf-map-size`.
pub const DEFAULT_MAP_SIZE: u32 = 1 << 21;
/// Largest `--ebpf-map-size` (bucket arrays of 256 MiB per map).
pub const MAX_MAP_SIZE: u32 = 1 << 24;
/// `BPF_F_NO_PREALLOC` (UAPI): allocate hash map elements on insert.
pub const BPF_F_NO_PREALLOC: u32 = 1;

/// The maps whose capacity `--ebpf-map-size` sets.
pub const SIZED_MAPS: [&str; 2] = [MAP_SERVICES, MAP_BACKENDS];

/// Pin path of the next generation of a sized map.
pub fn next_pin(root: &Path, name: &str) -> PathBuf {
    root.join(format!("{name}_next"))
}

/// What is pinned for the sized maps, against the wanted capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pinned {
    /// Nothing pinned: the maps are created.
    None,
    /// Pinned with the wanted capacity and flags: reused as they are.
    Fits,
    /// Pinned with another capacity or preallocated: replaced.
    Other { max_entries: u32, flags: u32 },
}

fn pin_err(path: &Path, e: impl std::fmt::Display) -> EbpfError {
    EbpfError::Pin {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

fn map_err(map: &'static str, op: &'static str, e: &MapError) -> EbpfError {
    EbpfError::Map {
        map,
        op,
        reason: chain(e),
    }
}

/// Looks at the pinned sized maps (their key and value sizes were checked
/// by the caller).
pub fn inspect(root: &Path, size: u32) -> Result<Pinned, EbpfError> {
    let mut out = Pinned::None;
    for name in SIZED_MAPS {
        let path = root.join(name);
        if !path.exists() {
            continue;
        }
        let info = MapData::from_pin(&path)
            .and_then(|m| m.info())
            .map_err(|e| pin_err(&path, chain(&e)))?;
        let (max_entries, flags) = (info.max_entries(), info.map_flags());
        if max_entries != size || flags & BPF_F_NO_PREALLOC == 0 {
            return Ok(Pinned::Other { max_entries, flags });
        }
        out = Pinned::Fits;
    }
    Ok(out)
}

fn create<K: aya::Pod, V: aya::Pod>(
    name: &'static str,
    path: &Path,
    size: u32,
) -> Result<HashMap<MapData, K, V>, EbpfError> {
    remove_if_exists(path)?;
    let map = HashMap::<MapData, K, V>::create(size, BPF_F_NO_PREALLOC)
        .map_err(|e| map_err(name, "create", &e))?;
    map.map().pin(path).map_err(|e| pin_err(path, chain(&e)))?;
    Ok(map)
}

fn remove_if_exists(path: &Path) -> Result<(), EbpfError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(pin_err(path, e)),
        _ => Ok(()),
    }
}

/// Where the loader finds the sized maps, after [`prepare`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prepared {
    /// (map name, pin path) for the loader.
    pub pins: Vec<(&'static str, PathBuf)>,
    /// A new generation waits under `_next` pins for [`promote`].
    pub replacing: Option<(u32, u32)>,
}

/// Makes sure sized maps of `size` entries are pinned for the loader:
/// reuses fitting ones, creates missing ones, or builds the next
/// generation filled with the current one's entries. Nothing that serves
/// traffic changes here.
pub fn prepare(root: &Path, size: u32) -> Result<Prepared, EbpfError> {
    let pinned = inspect(root, size)?;
    let at = |name| match pinned {
        Pinned::Other { .. } => next_pin(root, name),
        _ => root.join(name),
    };
    let pins = SIZED_MAPS.iter().map(|&n| (n, at(n))).collect();
    match pinned {
        Pinned::None | Pinned::Fits => {
            // Either may be missing (one removed by hand): a new, empty one.
            if !at(MAP_SERVICES).exists() {
                create::<ServiceKey, ServiceValue>(MAP_SERVICES, &at(MAP_SERVICES), size)?;
            }
            if !at(MAP_BACKENDS).exists() {
                create::<u32, Backend>(MAP_BACKENDS, &at(MAP_BACKENDS), size)?;
            }
        }
        Pinned::Other { max_entries, flags } => {
            tracing::info!(
                from = max_entries,
                from_flags = flags,
                to = size,
                "eBPF services/backends maps: building a new generation of the wanted size"
            );
            let result = copy_generation(root, size);
            if result.is_err() {
                discard_next(root);
            }
            result?;
            return Ok(Prepared {
                pins,
                replacing: Some((max_entries, size)),
            });
        }
    }
    Ok(Prepared {
        pins,
        replacing: None,
    })
}

/// Entries of a pinned map, read one by one (the kernel's batch lookup
/// for hash maps needs a bucket-sized buffer dance; this runs once per
/// generation).
fn entries<K: aya::Pod, V: aya::Pod>(
    root: &Path,
    name: &'static str,
) -> Result<(Vec<K>, Vec<V>), EbpfError> {
    let map = super::maps::open_pinned(root, name)?;
    let map: HashMap<MapData, K, V> =
        HashMap::try_from(map).map_err(|e| map_err(name, "open", &e))?;
    let mut keys = Vec::new();
    let mut values = Vec::new();
    for kv in map.iter() {
        let (k, v) = kv.map_err(|e| map_err(name, "read", &e))?;
        keys.push(k);
        values.push(v);
    }
    Ok((keys, values))
}

fn fill<K: aya::Pod, V: aya::Pod>(
    root: &Path,
    name: &'static str,
    size: u32,
) -> Result<(), EbpfError> {
    let (keys, values) = entries::<K, V>(root, name)?;
    if keys.len() > size as usize {
        return Err(EbpfError::MapFull {
            map: name,
            capacity: size,
            needed: Some(keys.len()),
        });
    }
    let next = create::<K, V>(name, &next_pin(root, name), size)?;
    batch::update(next.map().fd().as_fd(), &keys, &values).map_err(|e| EbpfError::Map {
        map: name,
        op: "copy into the new generation",
        reason: e.error.to_string(),
    })
}

fn copy_generation(root: &Path, size: u32) -> Result<(), EbpfError> {
    // Backends first, as everywhere: no slot may name a missing backend.
    fill::<u32, Backend>(root, MAP_BACKENDS, size)?;
    fill::<ServiceKey, ServiceValue>(root, MAP_SERVICES, size)
}

/// Removes a next generation that will not be used.
pub fn discard_next(root: &Path) {
    for name in SIZED_MAPS {
        let _ = std::fs::remove_file(next_pin(root, name));
    }
}

/// Renames the next generation's pins over the current ones, once the
/// programs that use it are attached. The old maps go when the last
/// program using them is released.
pub fn promote(root: &Path) -> Result<(), EbpfError> {
    for name in SIZED_MAPS {
        let (next, pin) = (next_pin(root, name), root.join(name));
        std::fs::rename(&next, &pin)
            .map_err(|e| pin_err(&pin, format!("renaming {} over it: {e}", next.display())))?;
    }
    Ok(())
}
