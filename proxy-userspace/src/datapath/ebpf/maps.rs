//! The maps in the kernel: runs [`plan::Op`]s against them (each op is
//! recorded in the view only once the kernel took it), reads them back to
//! rebuild the view on start, and opens them from their pins for `dump`.

use std::path::Path;

use aya::maps::{HashMap, Map, MapData, MapError, PerCpuArray};
use aya::Ebpf;
use proxy_common::{
    AffinityKey, AffinityValue, Backend, ServiceKey, ServiceValue, MAP_AFFINITY, MAP_BACKENDS,
    MAP_SERVICES, MAP_STATS, MAX_BACKENDS, MAX_SERVICE_ENTRIES,
};

use super::codec::{BackendAddr, Vip};
use super::plan::{Op, Programmed};
use super::{chain, EbpfError};

/// The maps the daemon writes.
pub struct KernelMaps {
    services: HashMap<MapData, ServiceKey, ServiceValue>,
    backends: HashMap<MapData, u32, Backend>,
    affinity: HashMap<MapData, AffinityKey, AffinityValue>,
}

fn map_err(map: &'static str, op: &'static str, e: &MapError) -> EbpfError {
    EbpfError::Map {
        map,
        op,
        reason: chain(e),
    }
}

/// E2BIG from an update means the hash map is full.
fn update_err(map: &'static str, capacity: u32, e: MapError) -> EbpfError {
    match &e {
        MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::E2BIG) => {
            EbpfError::MapFull { map, capacity }
        }
        _ => map_err(map, "update", &e),
    }
}

/// Deleting what is not there is fine: the goal is reached.
fn delete_ok(r: Result<(), MapError>, map: &'static str) -> Result<(), EbpfError> {
    match r {
        Ok(()) => Ok(()),
        Err(MapError::SyscallError(s)) if s.io_error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        Err(MapError::KeyNotFound | MapError::ElementNotFound) => Ok(()),
        Err(e) => Err(map_err(map, "delete", &e)),
    }
}

fn hash_map<K: aya::Pod, V: aya::Pod>(
    map: Map,
    name: &'static str,
) -> Result<HashMap<MapData, K, V>, EbpfError> {
    HashMap::try_from(map).map_err(|e| map_err(name, "open", &e))
}

fn take(ebpf: &mut Ebpf, name: &'static str) -> Result<Map, EbpfError> {
    ebpf.take_map(name).ok_or(EbpfError::Map {
        map: name,
        op: "open",
        reason: "not in the eBPF object".to_owned(),
    })
}

/// Opens a pinned map.
pub fn open_pinned(root: &Path, name: &'static str) -> Result<Map, EbpfError> {
    let path = root.join(name);
    if !path.exists() {
        return Err(EbpfError::NotPinned(root.to_path_buf()));
    }
    let data = MapData::from_pin(&path).map_err(|e| map_err(name, "open pin", &e))?;
    Map::from_map_data(data).map_err(|e| map_err(name, "open pin", &e))
}

impl KernelMaps {
    pub fn take(ebpf: &mut Ebpf) -> Result<Self, EbpfError> {
        Ok(KernelMaps {
            services: hash_map(take(ebpf, MAP_SERVICES)?, MAP_SERVICES)?,
            backends: hash_map(take(ebpf, MAP_BACKENDS)?, MAP_BACKENDS)?,
            affinity: hash_map(take(ebpf, MAP_AFFINITY)?, MAP_AFFINITY)?,
        })
    }

    pub fn from_pins(root: &Path) -> Result<Self, EbpfError> {
        Ok(KernelMaps {
            services: hash_map(open_pinned(root, MAP_SERVICES)?, MAP_SERVICES)?,
            backends: hash_map(open_pinned(root, MAP_BACKENDS)?, MAP_BACKENDS)?,
            affinity: hash_map(open_pinned(root, MAP_AFFINITY)?, MAP_AFFINITY)?,
        })
    }

    pub fn service_entries(&self) -> Result<Vec<(ServiceKey, ServiceValue)>, EbpfError> {
        self.services
            .iter()
            .collect::<Result<_, _>>()
            .map_err(|e| map_err(MAP_SERVICES, "read", &e))
    }

    pub fn backend_entries(&self) -> Result<Vec<(u32, Backend)>, EbpfError> {
        self.backends
            .iter()
            .collect::<Result<_, _>>()
            .map_err(|e| map_err(MAP_BACKENDS, "read", &e))
    }

    pub fn affinity_entries(&self) -> Result<Vec<(AffinityKey, AffinityValue)>, EbpfError> {
        // An LRU entry can vanish between the key walk and the lookup.
        let mut out = Vec::new();
        for key in self.affinity.keys() {
            let key = key.map_err(|e| map_err(MAP_AFFINITY, "read", &e))?;
            if let Ok(v) = self.affinity.get(&key, 0) {
                out.push((key, v));
            }
        }
        Ok(out)
    }

    /// The writer's view of what the maps hold now. Entries that do not
    /// decode (unknown address family) are skipped with a warning.
    pub fn read_view(&self) -> Result<Programmed, EbpfError> {
        let mut services = Vec::new();
        for (k, v) in self.service_entries()? {
            match Vip::from_key(&k) {
                Some((vip, slot)) => services.push((vip, slot, v)),
                None => tracing::warn!(
                    family = k.family,
                    "skipping an undecodable EKP_SERVICES entry"
                ),
            }
        }
        let mut backends = Vec::new();
        for (id, b) in self.backend_entries()? {
            match BackendAddr::from_value(&b) {
                Some(addr) => backends.push((id, addr)),
                None => tracing::warn!(
                    id,
                    family = b.family,
                    "skipping an undecodable EKP_BACKENDS entry"
                ),
            }
        }
        Ok(Programmed::from_entries(services, backends))
    }

    /// Deletes the affinity entries of one service, all or those pointing at
    /// the given backends. Returns how many went.
    fn purge_affinity(
        &mut self,
        service_id: u32,
        backend_ids: Option<&[u32]>,
    ) -> Result<usize, EbpfError> {
        let doomed: Vec<AffinityKey> = self
            .affinity_entries()?
            .into_iter()
            .filter(|(k, v)| {
                k.service_id == service_id
                    && backend_ids.is_none_or(|ids| ids.contains(&v.backend_id))
            })
            .map(|(k, _)| k)
            .collect();
        for k in &doomed {
            delete_ok(self.affinity.remove(k), MAP_AFFINITY)?;
        }
        Ok(doomed.len())
    }

    fn run(&mut self, op: &Op) -> Result<(), EbpfError> {
        match op {
            Op::PutBackend { id, addr } => self
                .backends
                .insert(id, addr.value(), 0)
                .map_err(|e| update_err(MAP_BACKENDS, MAX_BACKENDS, e)),
            Op::PutSlot {
                vip,
                slot,
                backend_id,
            } => {
                let v = ServiceValue {
                    backend_id: *backend_id,
                    ..ServiceValue::default()
                };
                self.services
                    .insert(vip.key(*slot), v, 0)
                    .map_err(|e| update_err(MAP_SERVICES, MAX_SERVICE_ENTRIES, e))
            }
            Op::PutHeader { vip, header } => self
                .services
                .insert(vip.key(0), header.value(), 0)
                .map_err(|e| update_err(MAP_SERVICES, MAX_SERVICE_ENTRIES, e)),
            Op::DeleteHeader { vip } => delete_ok(self.services.remove(&vip.key(0)), MAP_SERVICES),
            Op::DeleteSlot { vip, slot } => {
                delete_ok(self.services.remove(&vip.key(*slot)), MAP_SERVICES)
            }
            Op::DeleteBackend { id } => delete_ok(self.backends.remove(id), MAP_BACKENDS),
            Op::PurgeAffinity {
                service_id,
                backend_ids,
            } => {
                let n = self.purge_affinity(*service_id, backend_ids.as_deref())?;
                tracing::debug!(service_id, purged = n, "affinity entries purged");
                Ok(())
            }
        }
    }
}

/// Runs `ops` in order, recording each in `view` once the kernel took it;
/// stops at the first error (the view then says exactly what is there).
pub fn execute(ops: &[Op], view: &mut Programmed, maps: &mut KernelMaps) -> Result<(), EbpfError> {
    for op in ops {
        maps.run(op)?;
        view.apply(op);
    }
    Ok(())
}

/// Per-CPU counters summed over CPUs, by `STAT_*` index.
pub fn read_stats(root: &Path) -> Result<Vec<u64>, EbpfError> {
    let map = open_pinned(root, MAP_STATS)?;
    let stats: PerCpuArray<MapData, u64> =
        PerCpuArray::try_from(map).map_err(|e| map_err(MAP_STATS, "open", &e))?;
    let mut out = Vec::new();
    for values in stats.iter() {
        let values = values.map_err(|e| map_err(MAP_STATS, "read", &e))?;
        out.push(values.iter().sum());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aya::sys::SyscallError;

    fn syscall(errno: i32) -> MapError {
        MapError::SyscallError(SyscallError {
            call: "bpf_map_update_elem",
            io_error: std::io::Error::from_raw_os_error(errno),
        })
    }

    #[test]
    fn a_full_map_is_reported_by_name() {
        let e = update_err(MAP_SERVICES, MAX_SERVICE_ENTRIES, syscall(libc::E2BIG));
        assert!(matches!(
            e,
            EbpfError::MapFull {
                map: MAP_SERVICES,
                capacity: MAX_SERVICE_ENTRIES
            }
        ));
        assert!(e.to_string().starts_with("map EKP_SERVICES is full"), "{e}");
        let other = update_err(MAP_BACKENDS, MAX_BACKENDS, syscall(libc::EINVAL));
        assert!(other.to_string().contains("EKP_BACKENDS"), "{other}");
    }

    #[test]
    fn deleting_what_is_gone_is_fine() {
        let enoent = MapError::SyscallError(SyscallError {
            call: "bpf_map_delete_elem",
            io_error: std::io::Error::from_raw_os_error(libc::ENOENT),
        });
        assert!(delete_ok(Err(enoent), MAP_SERVICES).is_ok());
        assert!(delete_ok(Err(syscall(libc::EPERM)), MAP_SERVICES).is_err());
    }
}
