//! Socket destruction: when a backend leaves a service, the sockets the
//! socket-LB hooks connected to it are destroyed with the kernel's
//! `bpf_sock_destroy` kfunc (kernel 6.5 or newer), so a TCP client gets an
//! error at once instead of hanging on a dead peer, and a connected UDP
//! client learns that its peer is gone.
//!
//! * [`removed_and_added`] reads a plan: the (VIP, backend) pairs it takes
//!   out of services and puts in.
//! * [`SockDestroyer`] owns the two iterator programs (`iter/tcp`,
//!   `iter/udp` in `proxy-ebpf/src/sockdestroy.rs`) and runs them on a
//!   worker thread, off the apply path. Pending pairs live in a shared set:
//!   a pair put back before the worker ran is dropped from it.
//! * A run lists, from `EKP_REVNAT`, the cookies of sockets the hooks sent
//!   to a removed backend for a VIP that lost it, writes them to
//!   `EKP_SOCK_DESTROY`, and reads each iterator once in every network
//!   namespace of the processes in the hooked cgroup (an iterator sees only
//!   the namespace of the thread that created it, so the worker thread
//!   `setns()`es into each one and back). The program checks that the
//!   socket is still connected to that backend before destroying it.
//!
//! aya 0.14 does not resolve kfunc calls, so [`prepare_object`] writes the
//! kfunc's vmlinux BTF id into the object's hand-encoded call instruction
//! before the object is loaded.
//!
//! Errors are logged at warn and counted; they never fail an apply.

use std::collections::{HashMap as StdHashMap, HashSet};
use std::fs::File;
use std::io::Read;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};

use aya::maps::{HashMap, MapData};
use aya::programs::{Iter, ProgramFd};
use aya::{Btf, Ebpf};
use aya_obj::generated::{bpf_attach_type, bpf_attr, bpf_cmd};
use prometheus::{IntCounter, Opts};
use proxy_common::{
    RevNatKey, RevNatValue, SockDestroyTarget, MAP_REVNAT, MAP_SOCK_DESTROY, MAX_SOCK_DESTROY,
    PROG_SOCK_DESTROY_TCP, PROG_SOCK_DESTROY_UDP, PROTO_TCP, PROTO_UDP, SOCK_DESTROY_KFUNC_MARKER,
};

use super::chain;
use super::codec::{encode_ip, BackendAddr, Scope, Vip};
use super::plan::{Change, Op, Programmed};

/// The kfunc the iterators call.
const KFUNC: &str = "bpf_sock_destroy";
/// Most cgroup directories and processes looked at to find namespaces.
const MAX_CGROUP_DIRS: usize = 100_000;

/// A VIP and a backend's address.
pub type Pair = (Vip, SocketAddr);

/// A backend as `EKP_REVNAT` keys hold it: address words, port (network
/// order), family marker.
type BackendKey = ([u32; 4], u16, u8);
/// A VIP as `EKP_REVNAT` values hold it (no family, no protocol).
type VipKey = ([u32; 4], u16);

#[derive(Debug, thiserror::Error)]
pub enum SockDestroyError {
    #[error("map {map}: {op}: {reason}")]
    Map {
        map: &'static str,
        op: &'static str,
        reason: String,
    },
    #[error("iterator {program}: {reason}")]
    Iterator {
        program: &'static str,
        reason: String,
    },
    #[error("network namespace of pid {pid}: {reason}")]
    Netns { pid: u32, reason: String },
}

/// The object with the kfunc call patched, 8-byte aligned for the ELF
/// parser.
pub struct PreparedObject {
    words: Vec<u64>,
    len: usize,
    pub btf: Btf,
}

impl PreparedObject {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialised bytes; u8 has no
        // alignment or validity requirement.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }
}

/// Copies `object` with every `bpf_sock_destroy` call instruction pointing
/// at the running kernel's kfunc. `None` (with the reason logged) when the
/// kernel has no such kfunc or no BTF: the datapath then runs without
/// socket destruction.
pub fn prepare_object(object: &[u8]) -> Option<PreparedObject> {
    let btf = match Btf::from_sys_fs() {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %chain(&e), "no kernel BTF: sockets of removed backends will not be destroyed");
            return None;
        }
    };
    let id = match btf.id_by_type_name_kind(KFUNC, aya_obj::btf::BtfKind::Func) {
        Ok(id) => id,
        Err(e) => {
            tracing::warn!(error = %chain(&e), "the kernel has no bpf_sock_destroy kfunc (6.5 or newer is needed): sockets of removed backends will not be destroyed");
            return None;
        }
    };
    let mut bytes = object.to_vec();
    let patched = patch_kfunc_calls(&mut bytes, id);
    if patched == 0 {
        tracing::warn!("the eBPF object has no bpf_sock_destroy call: sockets of removed backends will not be destroyed");
        return None;
    }
    let len = bytes.len();
    let mut words = vec![0u64; len.div_ceil(8)];
    for (w, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        *w = u64::from_ne_bytes(b);
    }
    Some(PreparedObject { words, len, btf })
}

/// Replaces the marker immediate of each kfunc call instruction
/// (`call`, src_reg = BPF_PSEUDO_KFUNC_CALL, off = 0) by `id`; the number
/// replaced. Instructions are 8-byte aligned within their section and
/// sections are 8-byte aligned in the file, so only aligned offsets count.
pub fn patch_kfunc_calls(object: &mut [u8], id: u32) -> usize {
    let mut call = [0x85u8, 0x20, 0, 0, 0, 0, 0, 0];
    call[4..].copy_from_slice(&SOCK_DESTROY_KFUNC_MARKER.to_le_bytes());
    let mut n = 0;
    for insn in object.chunks_exact_mut(8) {
        if insn == call {
            insn[4..].copy_from_slice(&id.to_le_bytes());
            n += 1;
        }
    }
    n
}

/// The pairs a plan removes from socket-LB services and the pairs it
/// puts in, worked out from its slot writes against the view before it
/// runs. Backends are compared by address and port only: a backend moved
/// from one slot to another of the same VIP, or written again with other
/// flags, is in neither. VIPs of the tc programs are left out (their
/// connections are not sockets on this node).
pub fn removed_and_added(view: &Programmed, ops: &[Op]) -> (Vec<Pair>, Vec<Pair>) {
    let mut new_backends: StdHashMap<u32, BackendAddr> = StdHashMap::new();
    let mut old: StdHashMap<(Vip, u32), u32> = StdHashMap::new();
    let mut put: Vec<(Vip, u32)> = Vec::new();
    for op in ops {
        match op {
            Op::PutBackend { id, addr } => {
                new_backends.insert(*id, *addr);
            }
            Op::PutSlot {
                vip,
                slot,
                backend_id,
            } if vip.scope == Scope::Socket => {
                old.entry((*vip, *slot))
                    .or_insert_with(|| slot_value(view, vip, *slot));
                put.push((*vip, *backend_id));
            }
            Op::DeleteSlot { vip, slot } if vip.scope == Scope::Socket => {
                old.entry((*vip, *slot))
                    .or_insert_with(|| slot_value(view, vip, *slot));
            }
            _ => {}
        }
    }
    let addr = |id: u32| view.backend(id).or_else(|| new_backends.get(&id).copied());
    let pair = |(vip, id): (Vip, u32)| {
        let a = addr(id)?;
        Some((vip, SocketAddr::new(a.ip, a.port)))
    };
    let was: HashSet<Pair> = old
        .into_iter()
        .filter(|(_, id)| *id != 0)
        .filter_map(|((vip, _), id)| pair((vip, id)))
        .collect();
    let put: HashSet<Pair> = put.into_iter().filter_map(pair).collect();
    let removed = was.difference(&put).copied().collect();
    let added = put.difference(&was).copied().collect();
    (removed, added)
}

/// TCP connections to an endpoint that terminates but still serves are
/// left to drain, as kube-proxy leaves their conntrack entries: they are
/// destroyed only once the endpoint stops serving or leaves the slice.
/// UDP sockets go at once (the stale-UDP problem is about exactly those).
#[derive(Debug, Default)]
pub struct Draining {
    by_vip: StdHashMap<Vip, Vec<SocketAddr>>,
}

fn socket_addrs(b: &[BackendAddr]) -> Vec<SocketAddr> {
    b.iter().map(|b| SocketAddr::new(b.ip, b.port)).collect()
}

impl Draining {
    /// Records what the changed VIPs drain now; returns the pairs whose
    /// drain ended (to destroy).
    pub fn update(&mut self, changes: &[Change<'_>]) -> Vec<Pair> {
        let mut ended = Vec::new();
        for c in changes {
            let (vip, now, picked) = match c {
                Change::Upsert(d) => (d.vip, socket_addrs(&d.draining), &d.backends[..]),
                Change::Remove(vip) => (*vip, Vec::new(), &[][..]),
            };
            if vip.scope != Scope::Socket || vip.proto != proxy_common::PROTO_TCP {
                continue;
            }
            let before = if now.is_empty() {
                self.by_vip.remove(&vip)
            } else {
                self.by_vip.insert(vip, now.clone())
            };
            ended.extend(
                before
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|a| {
                        !now.contains(a)
                            && picked
                                .binary_search_by(|b| (b.ip, b.port).cmp(&(a.ip(), a.port())))
                                .is_err()
                    })
                    .map(|a| (vip, a)),
            );
        }
        ended
    }

    /// Whether the pair's TCP connections are draining (kept).
    pub fn keeps(&self, (vip, backend): &Pair) -> bool {
        self.by_vip.get(vip).is_some_and(|d| d.contains(backend))
    }
}

fn slot_value(view: &Programmed, vip: &Vip, slot: u32) -> u32 {
    let i = (slot as usize).wrapping_sub(1);
    view.service(vip)
        .and_then(|s| s.slots.get(i).copied())
        .unwrap_or(0)
}

/// `ebpf_kube_proxy_sockets_destroyed_total` and its error counter.
#[derive(Clone)]
pub struct SockDestroyMetrics {
    pub destroyed: IntCounter,
    pub errors: IntCounter,
}

impl SockDestroyMetrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        Ok(SockDestroyMetrics {
            destroyed: IntCounter::with_opts(Opts::new(
                "ebpf_kube_proxy_sockets_destroyed_total",
                "[ALPHA] Sockets (TCP and connected UDP) that socket-LB had connected to a backend which then left its service, destroyed so the application sees an error instead of a dead peer.",
            ))?,
            errors: IntCounter::with_opts(Opts::new(
                "ebpf_kube_proxy_socket_destroy_errors_total",
                "[ALPHA] Failed attempts to destroy the sockets of removed backends (see the daemon's warnings); the sockets stay as they were.",
            ))?,
        })
    }

    pub fn register(&self, registry: &prometheus::Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.destroyed.clone()))?;
        registry.register(Box::new(self.errors.clone()))
    }
}

/// Pairs waiting for the worker.
type Pending = Arc<Mutex<HashSet<Pair>>>;

/// The handle the datapath keeps: hands pairs to the worker thread.
pub struct SockDestroyer {
    pending: Pending,
    wake: Sender<()>,
}

impl std::fmt::Debug for SockDestroyer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SockDestroyer").finish_non_exhaustive()
    }
}

impl SockDestroyer {
    /// Loads the iterator programs of `ebpf` (loaded from `prepared`),
    /// takes the maps they use and starts the worker. `cgroup` is where the
    /// hooks are attached: its processes' namespaces are searched.
    pub fn start(
        ebpf: &mut Ebpf,
        prepared: &PreparedObject,
        cgroup: PathBuf,
        metrics: SockDestroyMetrics,
    ) -> Result<SockDestroyer, SockDestroyError> {
        let mut fds = Vec::new();
        for (name, kind) in [
            (PROG_SOCK_DESTROY_TCP, "tcp"),
            (PROG_SOCK_DESTROY_UDP, "udp"),
        ] {
            let err = |reason: String| SockDestroyError::Iterator {
                program: name,
                reason,
            };
            let prog: &mut Iter = ebpf
                .program_mut(name)
                .ok_or_else(|| err("not in the object".to_owned()))?
                .try_into()
                .map_err(|e: aya::programs::ProgramError| err(chain(&e)))?;
            prog.load(kind, &prepared.btf).map_err(|e| match e {
                aya::programs::ProgramError::LoadError {
                    io_error,
                    verifier_log,
                } => err(format!("{io_error}; verifier log: {verifier_log}")),
                other => err(chain(&other)),
            })?;
            // The worker thread keeps its own handle: the Ebpf stays with
            // the datapath.
            let fd = prog.fd().map_err(|e| err(chain(&e)))?;
            fds.push((name, fd.try_clone().map_err(|e| err(e.to_string()))?));
        }
        let targets = take_map(ebpf, MAP_SOCK_DESTROY)?;
        let revnat = take_map(ebpf, MAP_REVNAT)?;
        let pending: Pending = Arc::default();
        let (wake, rx) = mpsc::channel();
        let worker = Worker {
            programs: fds,
            targets,
            revnat,
            cgroup,
            metrics,
            pending: pending.clone(),
        };
        std::thread::Builder::new()
            .name("ekp-sockdestroy".to_owned())
            .spawn(move || worker.run(rx))
            .map_err(|e| SockDestroyError::Iterator {
                program: PROG_SOCK_DESTROY_TCP,
                reason: format!("starting the worker thread: {e}"),
            })?;
        Ok(SockDestroyer { pending, wake })
    }

    /// Queues the sockets of `removed` for destruction and forgets queued
    /// pairs that `added` puts back. Never blocks for long: the worker
    /// holds the lock only to take the set.
    /// Whether pairs wait for the worker: only then do added pairs matter
    /// (a plan that removes nothing need not list what it adds).
    pub fn has_pending(&self) -> bool {
        !self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    pub fn submit(&self, removed: Vec<Pair>, added: &[Pair]) {
        if removed.is_empty() && added.is_empty() {
            return;
        }
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for a in added {
            p.remove(a);
        }
        let any = !removed.is_empty();
        p.extend(removed);
        drop(p);
        if any {
            // The worker is gone only if it panicked; its pairs then wait
            // for the next datapath load.
            let _ = self.wake.send(());
        }
    }
}

fn take_map<K: aya::Pod, V: aya::Pod>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<HashMap<MapData, K, V>, SockDestroyError> {
    let map = ebpf.take_map(name).ok_or(SockDestroyError::Map {
        map: name,
        op: "open",
        reason: "not in the object".to_owned(),
    })?;
    HashMap::try_from(map).map_err(|e| SockDestroyError::Map {
        map: name,
        op: "open",
        reason: chain(&e),
    })
}

struct Worker {
    /// The loaded iterator programs, TCP's first.
    programs: Vec<(&'static str, ProgramFd)>,
    targets: HashMap<MapData, u64, SockDestroyTarget>,
    revnat: HashMap<MapData, RevNatKey, RevNatValue>,
    cgroup: PathBuf,
    metrics: SockDestroyMetrics,
    pending: Pending,
}

impl Worker {
    fn run(mut self, wake: Receiver<()>) {
        // Ends when the datapath drops its handle (a reload starts a new
        // worker).
        while wake.recv().is_ok() {
            while wake.try_recv().is_ok() {}
            let pairs: Vec<Pair> = {
                let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                p.drain().collect()
            };
            if pairs.is_empty() {
                continue;
            }
            let started = std::time::Instant::now();
            match self.destroy(&pairs) {
                Ok(n) => {
                    self.metrics.destroyed.inc_by(n);
                    tracing::debug!(
                        pairs = pairs.len(),
                        destroyed = n,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "sockets of removed backends destroyed"
                    );
                }
                Err((n, e)) => {
                    self.metrics.destroyed.inc_by(n);
                    self.metrics.errors.inc();
                    tracing::warn!(error = %e, destroyed = n, "destroying the sockets of removed backends");
                }
            }
        }
    }

    /// The sockets to destroy: cookie → target, from the reverse-NAT map.
    fn targets_of(
        &self,
        pairs: &[Pair],
    ) -> Result<StdHashMap<u64, SockDestroyTarget>, SockDestroyError> {
        // Backend key → the VIPs (address words, port, protocol) that lost it.
        let mut lost: StdHashMap<BackendKey, Vec<(VipKey, u8)>> = StdHashMap::new();
        for (vip, be) in pairs {
            let (baddr, bfam) = encode_ip(be.ip());
            let (vaddr, _) = encode_ip(vip.ip);
            lost.entry((baddr, be.port().to_be(), bfam))
                .or_default()
                .push(((vaddr, vip.port.to_be()), vip.proto));
        }
        let mut out = StdHashMap::new();
        for kv in self.revnat.iter() {
            let (k, v) = match kv {
                Ok(kv) => kv,
                // An LRU entry evicted while walking: skip it.
                Err(aya::maps::MapError::KeyNotFound) => continue,
                Err(e) => {
                    return Err(SockDestroyError::Map {
                        map: MAP_REVNAT,
                        op: "read",
                        reason: chain(&e),
                    })
                }
            };
            let Some(vips) = lost.get(&(k.addr, k.port, k.family)) else {
                continue;
            };
            for ((vaddr, vport), proto) in vips {
                if *vaddr == v.addr && *vport == v.port {
                    let t = out.entry(k.cookie).or_insert(SockDestroyTarget {
                        addr: k.addr,
                        port: k.port,
                        family: k.family,
                        proto: *proto,
                    });
                    // Both a TCP and a UDP VIP on this address and port
                    // lost the backend: the socket is one of the two.
                    if t.proto != *proto {
                        t.proto = 0;
                    }
                }
            }
        }
        Ok(out)
    }

    /// Destroys the sockets of `pairs`; the number destroyed, also with an
    /// error (what was done before it).
    fn destroy(&mut self, pairs: &[Pair]) -> Result<u64, (u64, SockDestroyError)> {
        let targets = self.targets_of(pairs).map_err(|e| (0, e))?;
        if targets.is_empty() {
            return Ok(0);
        }
        let namespaces = netns_of_cgroup(&self.cgroup);
        let mut destroyed = 0;
        let all: Vec<(u64, SockDestroyTarget)> = targets.into_iter().collect();
        for batch in all.chunks(MAX_SOCK_DESTROY as usize) {
            let (n, error) = self.destroy_batch(batch, &namespaces);
            destroyed += n;
            if let Some(e) = error {
                return Err((destroyed, e));
            }
        }
        Ok(destroyed)
    }

    /// Lists `batch` in the map, runs the iterators in every namespace and
    /// empties the map again. The program deletes the entry of each socket
    /// it destroyed, so the entries found missing afterwards are the count
    /// (exact even when a read is cut short and an element shown again).
    fn destroy_batch(
        &mut self,
        batch: &[(u64, SockDestroyTarget)],
        namespaces: &[Netns],
    ) -> (u64, Option<SockDestroyError>) {
        let mut tcp = false;
        let mut udp = false;
        let mut inserted = Vec::with_capacity(batch.len());
        let mut first_error = None;
        for (cookie, t) in batch {
            if let Err(e) = self.targets.insert(cookie, t, 0) {
                first_error = Some(SockDestroyError::Map {
                    map: MAP_SOCK_DESTROY,
                    op: "insert",
                    reason: chain(&e),
                });
                break;
            }
            inserted.push(*cookie);
            tcp |= t.proto != PROTO_UDP;
            udp |= t.proto != PROTO_TCP;
        }
        let programs: Vec<&(&'static str, ProgramFd)> = self
            .programs
            .iter()
            .filter(|(name, _)| {
                if *name == PROG_SOCK_DESTROY_TCP {
                    tcp
                } else {
                    udp
                }
            })
            .collect();
        for ns in namespaces {
            let r = in_netns(ns, || {
                programs
                    .iter()
                    .try_for_each(|(name, fd)| run_iterator(name, fd))
            });
            // One namespace failing (say its processes exited) must not
            // keep the others' sockets alive.
            if let Err(e) = r {
                first_error.get_or_insert(e);
            }
        }
        let mut destroyed = 0;
        for cookie in &inserted {
            match self.targets.remove(cookie) {
                Ok(()) => {}
                // aya reports a missing key as ENOENT from the syscall.
                Err(e) if super::pins::errno_in(&e) == Some(libc::ENOENT) => destroyed += 1,
                Err(aya::maps::MapError::KeyNotFound) => destroyed += 1,
                Err(e) => {
                    first_error.get_or_insert(SockDestroyError::Map {
                        map: MAP_SOCK_DESTROY,
                        op: "delete",
                        reason: chain(&e),
                    });
                }
            }
        }
        (destroyed, first_error)
    }
}

/// Reads the iterator to its end in the calling thread's network
/// namespace (it prints nothing; running it is the point). The link and
/// the iterator are created with raw `bpf()` calls: aya offers them only
/// through the `Ebpf` that owns the program, which the datapath keeps.
fn run_iterator(program: &'static str, prog: &ProgramFd) -> Result<(), SockDestroyError> {
    let err = |what: &str, e: std::io::Error| SockDestroyError::Iterator {
        program,
        reason: format!("{what}: {e}"),
    };
    // SAFETY: an all-zero bpf_attr is the documented "no options" value.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // Writes to union fields of plain integers (no unsafe needed).
    attr.link_create.__bindgen_anon_1.prog_fd = prog.as_fd().as_raw_fd() as u32;
    attr.link_create.attach_type = bpf_attach_type::BPF_TRACE_ITER as u32;
    let link = bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr).map_err(|e| err("bpf_link_create", e))?;
    // SAFETY: as above.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    attr.iter_create.link_fd = link.as_raw_fd() as u32;
    let iter = bpf(bpf_cmd::BPF_ITER_CREATE, &mut attr).map_err(|e| err("bpf_iter_create", e))?;
    let mut out = Vec::new();
    File::from(iter)
        .read_to_end(&mut out)
        .map_err(|e| err("reading", e))?;
    Ok(())
}

/// The `bpf()` system call for a command that returns a new descriptor.
fn bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a valid bpf_attr of the size passed; the kernel
    // reads only the member `cmd` uses.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            attr as *mut bpf_attr,
            size_of::<bpf_attr>(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: on success the kernel returned a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// One network namespace: its file and a pid in it (for messages).
struct Netns {
    file: File,
    pid: u32,
    /// The worker thread's own namespace (no setns needed).
    own: bool,
}

/// The distinct network namespaces of the processes in `cgroup` and the
/// cgroups below it (the hooks apply to all of them).
fn netns_of_cgroup(cgroup: &Path) -> Vec<Netns> {
    let own = std::fs::metadata("/proc/thread-self/ns/net")
        .ok()
        .map(|m| (m.dev(), m.ino()));
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut dirs = vec![cgroup.to_path_buf()];
    let mut visited = 0;
    while let Some(dir) = dirs.pop() {
        visited += 1;
        if visited > MAX_CGROUP_DIRS {
            tracing::warn!(cgroup = %cgroup.display(), "more than {MAX_CGROUP_DIRS} cgroups below the hooked one; the rest are not searched for sockets to destroy");
            break;
        }
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                let path = format!("/proc/{pid}/ns/net");
                // The process may exit at any point: skip it then.
                let Ok(meta) = std::fs::metadata(&path) else {
                    continue;
                };
                let key = (meta.dev(), meta.ino());
                if !seen.insert(key) {
                    continue;
                }
                if let Ok(file) = File::open(&path) {
                    out.push(Netns {
                        file,
                        pid,
                        own: Some(key) == own,
                    });
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(e.path());
                }
            }
        }
    }
    out
}

/// Runs `f` with the calling thread in the namespace `ns`, then returns
/// the thread to its own namespace.
fn in_netns<T>(
    ns: &Netns,
    f: impl FnOnce() -> Result<T, SockDestroyError>,
) -> Result<T, SockDestroyError> {
    if ns.own {
        return f();
    }
    let err = |what: &str| SockDestroyError::Netns {
        pid: ns.pid,
        reason: format!("{what}: {}", std::io::Error::last_os_error()),
    };
    let home = File::open("/proc/thread-self/ns/net").map_err(|e| SockDestroyError::Netns {
        pid: ns.pid,
        reason: format!("opening this thread's namespace: {e}"),
    })?;
    // SAFETY: setns on a namespace fd changes only this thread's network
    // namespace; the worker thread runs nothing else.
    if unsafe { libc::setns(ns.file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(err("setns"));
    }
    let r = f();
    // SAFETY: as above, back to the thread's own namespace.
    if unsafe { libc::setns(home.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        // Later namespaces would be searched from the wrong place; the
        // worker stays usable because every run goes through setns.
        tracing::warn!(error = %std::io::Error::last_os_error(), "returning the socket-destroy thread to its network namespace");
    }
    r
}

#[cfg(test)]
#[path = "sockdestroy_tests.rs"]
mod tests;
