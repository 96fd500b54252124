//! The maps in the kernel: runs [`plan::Op`]s against them (each op is
//! recorded in the view only once the kernel took it), reads them back to
//! rebuild the view on start, and opens them from their pins for `dump`.
//!
//! Consecutive writes to one map go to the kernel as one batch
//! ([`super::batch`]), in plan order.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use aya::maps::{HashMap, IterableMap, Map, MapData, MapError, PerCpuArray};
use aya::Ebpf;
use proxy_common::{
    AffinityKey, AffinityValue, Backend, ServiceKey, ServiceValue, MAP_AFFINITY, MAP_BACKENDS,
    MAP_EXT_STATS, MAP_SERVICES, MAP_STATS,
};

use super::batch::{self, BatchError};
use super::codec::{BackendAddr, Vip};
use super::plan::{Entry, Op, Peak, Programmed};
use super::{chain, EbpfError};

/// The maps the daemon writes.
pub struct KernelMaps {
    services: HashMap<MapData, ServiceKey, ServiceValue>,
    backends: HashMap<MapData, u32, Backend>,
    affinity: HashMap<MapData, AffinityKey, AffinityValue>,
    /// Capacities (max_entries) of the services and backends maps.
    pub capacity: Capacity,
}

/// Entries the services and backends maps hold at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    pub services: u32,
    pub backends: u32,
}

impl Capacity {
    /// The first map `peak` would overflow: (name, entries needed, capacity).
    pub fn overflow(&self, peak: &Peak) -> Option<(&'static str, usize, u32)> {
        [
            (MAP_SERVICES, peak.service_entries, self.services),
            (MAP_BACKENDS, peak.backends, self.backends),
        ]
        .into_iter()
        .find(|&(_, needed, capacity)| needed > capacity as usize)
    }
}

fn map_err(map: &'static str, op: &'static str, e: &MapError) -> EbpfError {
    EbpfError::Map {
        map,
        op,
        reason: chain(e),
    }
}

/// E2BIG from an update means the hash map is full.
fn read_err(map: &'static str, e: std::io::Error) -> EbpfError {
    map_err(
        map,
        "read",
        &MapError::SyscallError(aya::sys::SyscallError {
            call: "bpf_map_lookup_batch",
            io_error: e,
        }),
    )
}

fn update_err(map: &'static str, capacity: u32, e: &BatchError) -> EbpfError {
    if e.error.raw_os_error() == Some(libc::E2BIG) {
        EbpfError::MapFull {
            map,
            capacity,
            needed: None,
        }
    } else {
        EbpfError::Map {
            map,
            op: "update",
            reason: e.error.to_string(),
        }
    }
}

fn delete_err(map: &'static str, e: &BatchError) -> EbpfError {
    EbpfError::Map {
        map,
        op: "delete",
        reason: e.error.to_string(),
    }
}

fn capacity_of(map: &Map, name: &'static str) -> Result<u32, EbpfError> {
    match map {
        Map::HashMap(data) => data
            .info()
            .map(|i| i.max_entries())
            .map_err(|e| map_err(name, "info", &e)),
        _ => Err(EbpfError::Map {
            map: name,
            op: "open",
            reason: "not a hash map".to_owned(),
        }),
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
        let maps = [
            take(ebpf, MAP_SERVICES)?,
            take(ebpf, MAP_BACKENDS)?,
            take(ebpf, MAP_AFFINITY)?,
        ];
        Self::new(maps)
    }

    pub fn from_pins(root: &Path) -> Result<Self, EbpfError> {
        let maps = [
            open_pinned(root, MAP_SERVICES)?,
            open_pinned(root, MAP_BACKENDS)?,
            open_pinned(root, MAP_AFFINITY)?,
        ];
        Self::new(maps)
    }

    fn new([services, backends, affinity]: [Map; 3]) -> Result<Self, EbpfError> {
        let capacity = Capacity {
            services: capacity_of(&services, MAP_SERVICES)?,
            backends: capacity_of(&backends, MAP_BACKENDS)?,
        };
        Ok(KernelMaps {
            services: hash_map(services, MAP_SERVICES)?,
            backends: hash_map(backends, MAP_BACKENDS)?,
            affinity: hash_map(affinity, MAP_AFFINITY)?,
            capacity,
        })
    }

    fn services_fd(&self) -> BorrowedFd<'_> {
        self.services.map().fd().as_fd()
    }

    fn backends_fd(&self) -> BorrowedFd<'_> {
        self.backends.map().fd().as_fd()
    }

    /// Writes service entries in order, in one batch.
    pub fn put_services(
        &mut self,
        keys: &[ServiceKey],
        values: &[ServiceValue],
    ) -> Result<(), EbpfError> {
        batch::update(self.services_fd(), keys, values)
            .map_err(|e| update_err(MAP_SERVICES, self.capacity.services, &e))
    }

    /// Writes backends in order, in one batch.
    pub fn put_backends(&mut self, ids: &[u32], values: &[Backend]) -> Result<(), EbpfError> {
        batch::update(self.backends_fd(), ids, values)
            .map_err(|e| update_err(MAP_BACKENDS, self.capacity.backends, &e))
    }

    pub fn service_entries(&self) -> Result<Vec<(ServiceKey, ServiceValue)>, EbpfError> {
        batch::lookup_all(self.services_fd()).map_err(|e| read_err(MAP_SERVICES, e))
    }

    pub fn backend_entries(&self) -> Result<Vec<(u32, Backend)>, EbpfError> {
        batch::lookup_all(self.backends_fd()).map_err(|e| read_err(MAP_BACKENDS, e))
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

    /// The writer's view of what the maps hold now, built as the entries
    /// are read (a chunk at a time, never the whole maps as a list).
    /// Entries that do not decode (unknown address family) are skipped
    /// with a warning.
    pub fn read_view(&self) -> Result<Programmed, EbpfError> {
        let mut view = Programmed::default();
        self.for_each_entry(|entry| view.add_entry(entry))?;
        view.finish_load();
        Ok(view)
    }

    /// Whether the maps hold exactly what `view` says, read a chunk at a
    /// time without building a second view: every entry agrees and the
    /// counts match (an entry the maps lack shows as a count short).
    pub fn matches(&self, view: &Programmed) -> Result<bool, EbpfError> {
        let (mut same, mut services, mut backends) = (true, 0usize, 0usize);
        self.for_each_entry(|entry| {
            match &entry {
                Entry::Service(..) => services += 1,
                Entry::Backend(..) => backends += 1,
            }
            same &= view.holds(&entry);
        })?;
        Ok(same && services == view.service_entry_count() && backends == view.backend_count())
    }

    /// Every decodable entry of the services and backends maps.
    fn for_each_entry(&self, mut f: impl FnMut(Entry)) -> Result<(), EbpfError> {
        batch::for_each_entry(self.backends_fd(), |id: &u32, b: &Backend| {
            match BackendAddr::from_value(b) {
                Some(addr) => f(Entry::Backend(*id, addr)),
                None => tracing::warn!(
                    id,
                    family = b.family,
                    "skipping an undecodable EKP_BACKENDS entry"
                ),
            }
        })
        .map_err(|e| read_err(MAP_BACKENDS, e))?;
        batch::for_each_entry(self.services_fd(), |k: &ServiceKey, v: &ServiceValue| {
            match Vip::from_key(k) {
                Some((vip, slot)) => f(Entry::Service(vip, slot, *v)),
                None => tracing::warn!(
                    family = k.family,
                    "skipping an undecodable EKP_SERVICES entry"
                ),
            }
        })
        .map_err(|e| read_err(MAP_SERVICES, e))
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

    /// Runs a run of ops of one [`Kind`]; how many the kernel took, and
    /// the error that stopped it.
    fn run(&mut self, kind: Kind, ops: &[Op]) -> (usize, Result<(), EbpfError>) {
        let all = |r, err: &dyn Fn(&BatchError) -> EbpfError| taken(ops.len(), r, err);
        match kind {
            Kind::PutBackends | Kind::PutServices => self.put(kind, ops),
            Kind::DeleteServices => {
                let keys: Vec<ServiceKey> = ops
                    .iter()
                    .filter_map(|op| match op {
                        Op::DeleteHeader { vip } => Some(vip.key(0)),
                        Op::DeleteSlot { vip, slot } => Some(vip.key(*slot)),
                        _ => None,
                    })
                    .collect();
                all(batch::delete(self.services_fd(), &keys), &|e| {
                    delete_err(MAP_SERVICES, e)
                })
            }
            Kind::DeleteBackends => {
                let ids: Vec<u32> = ops
                    .iter()
                    .filter_map(|op| match op {
                        Op::DeleteBackend { id } => Some(*id),
                        _ => None,
                    })
                    .collect();
                all(batch::delete(self.backends_fd(), &ids), &|e| {
                    delete_err(MAP_BACKENDS, e)
                })
            }
            Kind::Affinity => {
                for (i, op) in ops.iter().enumerate() {
                    if let Op::PurgeAffinity {
                        service_id,
                        backend_ids,
                    } = op
                    {
                        match self.purge_affinity(*service_id, backend_ids.as_deref()) {
                            Ok(n) => {
                                tracing::debug!(service_id, purged = n, "affinity entries purged")
                            }
                            Err(e) => return (i, Err(e)),
                        }
                    }
                }
                (ops.len(), Ok(()))
            }
        }
    }

    /// A run of writes (`PutBackends` or `PutServices`) as one batch.
    fn put(&self, kind: Kind, ops: &[Op]) -> (usize, Result<(), EbpfError>) {
        let all = |r, err: &dyn Fn(&BatchError) -> EbpfError| taken(ops.len(), r, err);
        if kind == Kind::PutBackends {
            let (ids, values): (Vec<u32>, Vec<Backend>) = ops
                .iter()
                .filter_map(|op| match op {
                    Op::PutBackend { id, addr } => Some((*id, addr.value())),
                    _ => None,
                })
                .unzip();
            let capacity = self.capacity.backends;
            return all(batch::update(self.backends_fd(), &ids, &values), &|e| {
                update_err(MAP_BACKENDS, capacity, e)
            });
        }
        let (keys, values): (Vec<ServiceKey>, Vec<ServiceValue>) = ops
            .iter()
            .filter_map(|op| match op {
                Op::PutSlot {
                    vip,
                    slot,
                    backend_id,
                } => Some((
                    vip.key(*slot),
                    ServiceValue {
                        backend_id: *backend_id,
                        ..ServiceValue::default()
                    },
                )),
                Op::PutHeader { vip, header } => Some((vip.key(0), header.value())),
                _ => None,
            })
            .unzip();
        let capacity = self.capacity.services;
        all(batch::update(self.services_fd(), &keys, &values), &|e| {
            update_err(MAP_SERVICES, capacity, e)
        })
    }

    /// Writes two runs at once, the second on another thread (the kernel
    /// takes a hash map's writes under per-bucket locks, so two writers
    /// share the work); what each took, and the error that stopped it.
    fn put_pair(&self, kind: Kind, a: &[Op], b: &[Op]) -> [(usize, Result<(), EbpfError>); 2] {
        std::thread::scope(|scope| {
            let second = scope.spawn(|| self.put(kind, b));
            let first = self.put(kind, a);
            // `put` panics only on a bug: pass it on.
            let second = second
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p));
            [first, second]
        })
    }
}

/// Runs of at least this many writes are split in two and written from two
/// threads: filling the maps with 250,000 endpoints is ~0.7 s of kernel
/// time on one core.
const PARALLEL_WRITES: usize = 16_384;

/// Where a run of writes may be cut in two so that no service is ever
/// seen half-written: backends anywhere (each is one entry, read only
/// through slots written after them); service entries only right after a
/// header, since a service's slots go before its header in a run.
fn split_point(kind: Kind, run: &[Op]) -> Option<usize> {
    if run.len() < PARALLEL_WRITES {
        return None;
    }
    let mid = run.len() / 2;
    match kind {
        Kind::PutBackends => Some(mid),
        Kind::PutServices => run[mid..]
            .iter()
            .position(|op| matches!(op, Op::PutHeader { .. }))
            .map(|i| mid + i + 1)
            .filter(|&at| at < run.len()),
        _ => None,
    }
}

/// How many of a run of `len` ops the kernel took, and its error named by
/// `err`.
fn taken(
    len: usize,
    r: Result<(), BatchError>,
    err: &dyn Fn(&BatchError) -> EbpfError,
) -> (usize, Result<(), EbpfError>) {
    match r {
        Ok(()) => (len, Ok(())),
        Err(e) => (e.done, Err(err(&e))),
    }
}

/// Ops that go to the kernel together: consecutive ops of one kind are
/// one batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    PutBackends,
    PutServices,
    DeleteServices,
    DeleteBackends,
    Affinity,
}

fn kind(op: &Op) -> Kind {
    match op {
        Op::PutBackend { .. } => Kind::PutBackends,
        Op::PutSlot { .. } | Op::PutHeader { .. } => Kind::PutServices,
        Op::DeleteHeader { .. } | Op::DeleteSlot { .. } => Kind::DeleteServices,
        Op::DeleteBackend { .. } => Kind::DeleteBackends,
        Op::PurgeAffinity { .. } => Kind::Affinity,
    }
}

/// Runs `ops` in order, recording each in `view` once the kernel took it;
/// stops at the first error (the view then says exactly what is there).
pub fn execute(ops: &[Op], view: &mut Programmed, maps: &mut KernelMaps) -> Result<(), EbpfError> {
    let mut rest = ops;
    while let Some(first) = rest.first() {
        let k = kind(first);
        let len = rest.iter().take_while(|op| kind(op) == k).count();
        let (run, next) = rest.split_at(len);
        if let Some(at) = split_point(k, run) {
            let (a, b) = run.split_at(at);
            let [(done_a, result_a), (done_b, result_b)] = maps.put_pair(k, a, b);
            for op in a[..done_a].iter().chain(&b[..done_b]) {
                view.apply(op);
            }
            result_a?;
            result_b?;
        } else {
            let (done, result) = maps.run(k, run);
            for op in &run[..done] {
                view.apply(op);
            }
            result?;
        }
        rest = next;
    }
    Ok(())
}

/// Per-CPU counters summed over CPUs, by `STAT_*` index.
pub fn read_stats(root: &Path) -> Result<Vec<u64>, EbpfError> {
    read_counters(root, MAP_STATS)
}

/// The tc programs' counters (`EKP_EXT_STATS`), summed over CPUs.
pub fn read_ext_stats(root: &Path) -> Result<Vec<u64>, EbpfError> {
    read_counters(root, MAP_EXT_STATS)
}

fn read_counters(root: &Path, name: &'static str) -> Result<Vec<u64>, EbpfError> {
    let map = open_pinned(root, name)?;
    let stats: PerCpuArray<MapData, u64> =
        PerCpuArray::try_from(map).map_err(|e| map_err(name, "open", &e))?;
    let mut out = Vec::new();
    for values in stats.iter() {
        let values = values.map_err(|e| map_err(name, "read", &e))?;
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

    fn batch(errno: i32) -> BatchError {
        BatchError {
            done: 3,
            error: std::io::Error::from_raw_os_error(errno),
        }
    }

    #[test]
    fn a_full_map_is_reported_by_name() {
        let e = update_err(MAP_SERVICES, 1024, &batch(libc::E2BIG));
        assert!(matches!(
            e,
            EbpfError::MapFull {
                map: MAP_SERVICES,
                capacity: 1024,
                needed: None,
            }
        ));
        assert!(e.to_string().starts_with("map EKP_SERVICES is full"), "{e}");
        let other = update_err(MAP_BACKENDS, 1024, &batch(libc::EINVAL));
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
