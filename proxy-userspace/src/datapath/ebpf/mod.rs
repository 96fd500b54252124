//! `--proxy-mode ebpf`: socket-level load balancing in cgroup sock_addr
//! hooks (`proxy-ebpf`), programmed through pinned maps.
//!
//! * [`EbpfDatapath::open`] checks the prerequisites (object embedded,
//!   capabilities, BTF, cgroup v2, bpffs), loads the programs, reuses the
//!   maps pinned under `--bpffs-root` by an earlier daemon (or creates
//!   them), attaches the programs to `--cgroup-path` with pinned links and
//!   only then lets go of the previous daemon's links, so traffic is never
//!   without a hook. It reads the maps back ([`plan::Programmed`]) so the
//!   first apply only writes what differs: established connections and
//!   their reverse-NAT entries survive a restart.
//! * [`Datapath::apply`] turns the services that changed between two
//!   LocalStates into ordered map writes ([`plan`]) and runs them
//!   ([`maps`]).
//! * [`dump`] decodes the pinned maps; [`cleanup`] removes links and pins.
//! * [`Datapath::verify`] reads the maps back and looks at the link pins
//!   ([`drift`]); after a difference the next full apply plans against
//!   what the kernel holds and, when a link pin was gone, loads and
//!   attaches the programs again first.
//!
//! A service without a usable endpoint keeps a header with count 0: the
//! hook refuses connect()/sendmsg() at once with EPERM, the socket-level
//! equivalent of kube-proxy's REJECT.

pub mod backend_table;
pub mod batch;
pub mod cleanup;
pub mod codec;
pub mod counters;
pub mod ctflush;
pub mod desired;
pub mod drift;
pub mod dump;
pub mod external;
pub mod foreign;
pub mod generation;
pub mod lb_source;
pub mod linkstate;
pub mod loader;
pub mod maps;
pub mod pins;
pub mod plan;
pub mod pressure;
pub mod sockdestroy;
mod write;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

// foldhash (randomly seeded), not SipHash: keyed by every service or VIP.
use hashbrown::HashMap;
use smallvec::SmallVec;

use crate::model::{LocalState, ObjectKey};

use super::{
    ApplyStats, Datapath, DatapathConfig, DatapathError, Drift, DriftCheck, Dump, ProxyMode,
    ServiceChange,
};
use crate::model::claims::Claims;
use codec::Vip;
use desired::DesiredService;
use external::{ExtMaps, NodeIface};
use maps::KernelMaps;
use plan::Programmed;

pub use loader::{cleanup, CleanupReport};
pub use write::PlanCost;

/// The eBPF object, copied into OUT_DIR by build.rs; empty when it had not
/// been built (`cargo xtask build-ebpf --release`).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/proxy-ebpf.o"));

/// Whether this binary carries the eBPF programs.
pub fn object_embedded() -> bool {
    !OBJECT.is_empty()
}

/// Where the datapath lives on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EbpfConfig {
    /// bpffs directory for pinned maps and links.
    pub bpffs_root: PathBuf,
    /// cgroup v2 directory to attach to; `None` = the cgroup v2 root.
    pub cgroup_path: Option<PathBuf>,
    /// Entries of the services and backends maps (`--ebpf-map-size`).
    pub map_size: u32,
    /// `--nodeport-addresses`: the node addresses node ports are served on
    /// and whose interfaces get the tc programs (empty = every address).
    pub nodeport_addresses: Vec<crate::net::Cidr>,
}

#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    #[error("this binary was built without the eBPF object; run `cargo xtask build-ebpf --release` first, then rebuild")]
    NoObject,
    #[error("missing capabilities {missing}: the eBPF datapath needs CAP_BPF (load programs and maps), CAP_NET_ADMIN (attach them to the cgroup) and CAP_PERFMON (the verifier accepts their pointer arithmetic only with it), or CAP_SYS_ADMIN, which covers all three")]
    Capabilities { missing: String },
    #[error("the kernel has no BTF (/sys/kernel/btf/vmlinux is missing; a kernel built with CONFIG_DEBUG_INFO_BTF=y is needed)")]
    NoBtf,
    #[error("no cgroup v2 filesystem is mounted (none in /proc/self/mountinfo); mount one, e.g. `mount -t cgroup2 none /sys/fs/cgroup`, or pass --cgroup-path")]
    NoCgroup2,
    #[error("--cgroup-path {}: {reason}", path.display())]
    CgroupPath { path: PathBuf, reason: String },
    #[error("bpffs {}: {reason}", path.display())]
    Bpffs { path: PathBuf, reason: String },
    #[error("pinned map {} does not match this binary ({reason}); run `ebpf-kube-proxy cleanup --bpffs-root {}` to start over (service connections in flight lose their reverse NAT)", path.display(), root.display())]
    IncompatiblePin {
        path: PathBuf,
        root: PathBuf,
        reason: String,
    },
    #[error(
        "the kernel verifier rejected program {program} ({error}); verifier log (end):\n{log}"
    )]
    Verifier {
        program: String,
        error: std::io::Error,
        log: String,
    },
    #[error("loading the eBPF object: {0}")]
    Load(String),
    #[error("attaching {program} to cgroup {}: {reason}", cgroup.display())]
    Attach {
        program: String,
        cgroup: PathBuf,
        reason: String,
    },
    #[error("attaching {program} to interface {iface} (TCX): {reason}")]
    AttachTc {
        program: String,
        iface: String,
        reason: String,
    },
    #[error("{0}")]
    NodeAddresses(#[from] crate::node_addrs::NodeAddrsError),
    #[error("pinning {}: {reason}", path.display())]
    Pin { path: PathBuf, reason: String },
    #[error("map {map} is full: {} entries needed, it holds {capacity}; the state does not fit (raise --ebpf-map-size); the services it could not hold were left as they were", needed.map_or_else(|| "more".to_owned(), |n| n.to_string()))]
    MapFull {
        map: &'static str,
        capacity: u32,
        /// Entries the state needs, when known before writing.
        needed: Option<usize>,
    },
    #[error("map {map}: {op}: {reason}")]
    Map {
        map: &'static str,
        op: &'static str,
        reason: String,
    },
    #[error("{vip} has {count} endpoints, more than the {max} one service can have; it was left as it was")]
    TooManyBackends { vip: Vip, count: usize, max: u32 },
    #[error("no pinned maps under {} (is the eBPF datapath running? see --bpffs-root)", .0.display())]
    NotPinned(PathBuf),
}

impl EbpfError {
    /// A short class of the cause for metrics labels: `no_btf`,
    /// `no_cgroup2`, `verifier`, `permission` or `other`.
    pub fn class(&self) -> &'static str {
        match self {
            EbpfError::NoBtf => "no_btf",
            EbpfError::NoCgroup2 | EbpfError::CgroupPath { .. } => "no_cgroup2",
            EbpfError::Verifier { .. } => "verifier",
            EbpfError::Capabilities { .. } => "permission",
            _ => "other",
        }
    }
}

impl From<EbpfError> for DatapathError {
    fn from(e: EbpfError) -> Self {
        DatapathError::Ebpf(e)
    }
}

/// The error text with its causes, `a: b: c`.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        let t = err.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = err.source();
    }
    s
}

/// The eBPF datapath of a running daemon.
pub struct EbpfDatapath {
    maps: KernelMaps,
    ext: ExtMaps,
    /// The loaded object, to attach the tc programs to new interfaces.
    ebpf: aya::Ebpf,
    /// Interfaces the tc programs serve, and the node ports' addresses.
    ifaces: Vec<NodeIface>,
    node_ips: Vec<IpAddr>,
    /// Shared with a drift check running beside the applies (written
    /// through `Arc::make_mut`: a copy only while a check holds it).
    view: Arc<Programmed>,
    /// Counts the writes to `view`, to tell whether a check's reading of
    /// the kernel is still the view's.
    view_gen: u64,
    /// What the last check away from the applies found, for the full
    /// sync that repairs it.
    found: Arc<Mutex<Option<drift::Found>>>,
    /// The VIPs each service has programmed (those it owns); most
    /// services have one, kept inline.
    owned: HashMap<ObjectKey, SmallVec<[Vip; 1]>>,
    /// `--bpffs-root`, where the maps are pinned.
    root: PathBuf,
    /// Where the programs attach, to attach them again.
    config: EbpfConfig,
    /// A link pin was found missing: the next full apply loads and
    /// attaches the programs again.
    relink: bool,
    metrics: counters::CapacityMetrics,
    /// `ebpf_kube_proxy_datapath_map_pressure`, sampled on a thread that
    /// ends when `alive` goes with the datapath.
    pressure: pressure::PressureMetrics,
    alive: Arc<()>,
    /// Destroys the sockets of removed backends; `None` when the kernel
    /// cannot (no `bpf_sock_destroy`) or the iterators failed to load.
    sock_destroyer: Option<sockdestroy::SockDestroyer>,
    sock_destroy_metrics: sockdestroy::SockDestroyMetrics,
    /// Endpoints whose TCP connections drain (not destroyed yet).
    draining: sockdestroy::Draining,
    /// What the big VIPs were last written from: their next change is
    /// planned from the difference.
    written_from: write::WrittenFrom,
    last_plan: write::PlanCost,
}

impl std::fmt::Debug for EbpfDatapath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EbpfDatapath")
            .field("services", &self.view.service_entry_count())
            .field("backends", &self.view.backend_count())
            .finish_non_exhaustive()
    }
}

impl EbpfDatapath {
    /// Loads and attaches the programs, adopting pinned maps and links of
    /// an earlier run. Nothing in the maps changes until the first apply.
    pub fn open(config: &EbpfConfig) -> Result<Self, EbpfError> {
        if !object_embedded() {
            return Err(EbpfError::NoObject);
        }
        let ifaces = node_ifaces(config)?;
        let mut attached = loader::load_and_attach(OBJECT, config, &ifaces)?;
        attached.ext.sync_ifaces(&ifaces)?;
        warn_if_ephemeral_ports_overlap();
        let view = attached.maps.read_view()?;
        let sock_destroy_metrics = sockdestroy::SockDestroyMetrics::new()
            .map_err(|e| EbpfError::Load(format!("metrics: {e}")))?;
        let sock_destroyer = start_sock_destroyer(&mut attached, &sock_destroy_metrics);
        tracing::info!(
            cgroup = %attached.cgroup.display(),
            interfaces = %iface_names(&ifaces),
            bpffs_root = %config.bpffs_root.display(),
            adopted_service_entries = view.service_entry_count(),
            adopted_backends = view.backend_count(),
            replaced_links = attached.replaced_links,
            "eBPF datapath attached"
        );
        let metrics = counters::CapacityMetrics::new()
            .map_err(|e| EbpfError::Load(format!("metrics: {e}")))?;
        let dp = EbpfDatapath {
            maps: attached.maps,
            ext: attached.ext,
            ebpf: attached.ebpf,
            node_ips: external::node_ips(&ifaces),
            ifaces,
            view: Arc::new(view),
            view_gen: 0,
            found: Arc::default(),
            owned: HashMap::new(),
            root: config.bpffs_root.clone(),
            config: config.clone(),
            relink: false,
            metrics,
            pressure: pressure::PressureMetrics::new()
                .map_err(|e| EbpfError::Load(format!("metrics: {e}")))?,
            alive: Arc::new(()),
            sock_destroyer,
            sock_destroy_metrics,
            draining: sockdestroy::Draining::default(),
            written_from: write::WrittenFrom::default(),
            last_plan: write::PlanCost::default(),
        };
        dp.show_capacity();
        Ok(dp)
    }

    /// Loads and attaches the programs again (the pinned maps are reused),
    /// replacing every link, and reads the maps back.
    fn relink(&mut self) -> Result<(), EbpfError> {
        let ifaces = node_ifaces(&self.config)?;
        let mut attached = loader::load_and_attach(OBJECT, &self.config, &ifaces)?;
        attached.ext.sync_ifaces(&ifaces)?;
        self.view = Arc::new(attached.maps.read_view()?);
        self.view_gen += 1;
        self.sock_destroyer = start_sock_destroyer(&mut attached, &self.sock_destroy_metrics);
        self.maps = attached.maps;
        self.ext = attached.ext;
        self.ebpf = attached.ebpf;
        self.node_ips = external::node_ips(&ifaces);
        self.ifaces = ifaces;
        self.relink = false;
        self.show_capacity();
        tracing::info!(
            cgroup = %attached.cgroup.display(),
            replaced_links = attached.replaced_links,
            "eBPF programs attached again"
        );
        Ok(())
    }

    fn show_capacity(&self) {
        let c = self.maps.capacity;
        for (map, n) in [
            (proxy_common::MAP_SERVICES, c.services),
            (proxy_common::MAP_BACKENDS, c.backends),
        ] {
            self.metrics
                .capacity
                .with_label_values(&[map])
                .set(i64::from(n));
        }
    }

    /// Follows the node's addresses: attaches the tc programs to
    /// interfaces that gained a selected address, detaches them from those
    /// that lost all; `true` when the node ports' addresses changed, so
    /// that the next full sync moves the node ports.
    fn follow_node_addresses(&mut self) -> Result<bool, EbpfError> {
        let ifaces = node_ifaces(&self.config)?;
        if ifaces == self.ifaces {
            return Ok(false);
        }
        let added: Vec<NodeIface> = ifaces
            .iter()
            .filter(|i| !self.ifaces.iter().any(|o| o.ifindex == i.ifindex))
            .cloned()
            .collect();
        external::attach(&mut self.ebpf, &self.root, &added)?;
        external::detach_others(&self.root, &ifaces)?;
        self.ext.sync_ifaces(&ifaces)?;
        let node_ips = external::node_ips(&ifaces);
        tracing::info!(
            interfaces = %iface_names(&ifaces),
            addresses = ?node_ips,
            "node addresses changed; tc programs follow"
        );
        let moved = node_ips != self.node_ips;
        self.ifaces = ifaces;
        self.node_ips = node_ips;
        Ok(moved)
    }

    /// Counts the entries of the maps the programs write and sets
    /// `ebpf_kube_proxy_datapath_map_pressure` (done every 30 s on a
    /// thread of its own once metrics are registered).
    pub fn sample_map_pressure(&self) -> Vec<pressure::Fill> {
        self.pressure.update(&self.root)
    }

    /// Takes what a drift check beside the applies found: a detached
    /// program is attached again, and the maps as read replace the view
    /// when nothing was written since the check read them (else the view
    /// stays, and a difference still there is found by the next check).
    fn take_found(&mut self) {
        let found = self.found.lock().map(|mut f| f.take()).unwrap_or_default();
        let Some(found) = found else { return };
        self.relink |= found.relink;
        match found.view {
            Some(view) if found.view_gen == self.view_gen => {
                self.view = Arc::new(view);
                self.view_gen += 1;
            }
            Some(_) => tracing::debug!(
                "the drift check's reading of the maps is outdated by an apply; not used"
            ),
            None => {}
        }
    }

    fn own(&mut self, d: &DesiredService) {
        let vips = self.owned.entry(d.owner.clone()).or_default();
        if !vips.contains(&d.vip) {
            vips.push(d.vip);
        }
    }
}

impl Datapath for EbpfDatapath {
    fn mode(&self) -> ProxyMode {
        ProxyMode::Ebpf
    }

    fn register_metrics(
        &mut self,
        registry: &prometheus::Registry,
    ) -> Result<(), prometheus::Error> {
        registry.register(Box::new(counters::StatsCollector::new(self.root.clone())?))?;
        self.sock_destroy_metrics.register(registry)?;
        self.pressure.register(registry)?;
        self.pressure.update(&self.root);
        if let Err(e) = self.pressure.spawn(self.root.clone(), &self.alive) {
            tracing::warn!(error = %e, "cannot start the eBPF map pressure sampler");
        }
        self.metrics.register(registry)
    }

    fn map_entries(&self) -> Vec<(&'static str, usize)> {
        vec![
            (proxy_common::MAP_SERVICES, self.view.service_entry_count()),
            (proxy_common::MAP_BACKENDS, self.view.backend_count()),
        ]
    }

    fn dump(config: &DatapathConfig) -> Result<Option<Dump>, DatapathError> {
        if !is_pinned(&config.bpffs_root) {
            return Ok(None);
        }
        Ok(Some(Dump::Ebpf(dump::read(&config.bpffs_root)?)))
    }

    fn cleanup(config: &DatapathConfig) -> Result<Vec<String>, DatapathError> {
        let root = &config.bpffs_root;
        let report = loader::cleanup(root)?;
        let mut lines = vec![if report.links.is_empty() && report.maps.is_empty() {
            format!("{}: no eBPF links or maps pinned", root.display())
        } else {
            format!(
                "{}: removed links [{}] (programs detached) and maps [{}]",
                root.display(),
                report.links.join(" "),
                report.maps.join(" ")
            )
        }];
        if !report.foreign.is_empty() {
            lines.push(format!(
                "{}: removed pins of another build [{}]",
                root.display(),
                report.foreign.join(" ")
            ));
        }
        Ok(lines)
    }

    fn verify(&mut self, _: &LocalState, _: &Claims) -> Result<Vec<Drift>, DatapathError> {
        // Who owns a VIP: worked out only when something differs.
        let owners: std::cell::OnceCell<HashMap<Vip, &ObjectKey>> = std::cell::OnceCell::new();
        let owned = &self.owned;
        let owner = |vip: &Vip| {
            owners
                .get_or_init(|| {
                    owned
                        .iter()
                        .flat_map(|(key, vips)| vips.iter().map(move |vip| (*vip, key)))
                        .collect()
                })
                .get(vip)
                .map(ToString::to_string)
        };
        let (out, found) = drift::check(&self.root, &self.ifaces, &self.maps, &self.view, &owner)?;
        self.relink |= found.relink;
        if let Some(view) = found.view {
            // The next full apply plans against what is really there.
            self.view = Arc::new(view);
            self.view_gen += 1;
        }
        Ok(out)
    }

    /// The same comparison as [`Datapath::verify`], on a blocking thread
    /// with the maps opened from their pins and the view as it is now
    /// (shared, not copied); applies go on meanwhile. What it finds is
    /// left for the full sync that repairs it ([`EbpfDatapath::take_found`]).
    fn drift_check(&self, programmed: Arc<LocalState>, claims: Claims) -> Option<DriftCheck> {
        let check = drift::OffPath {
            root: self.root.clone(),
            ifaces: self.ifaces.clone(),
            node_ips: self.node_ips.clone(),
            view: self.view.clone(),
            view_gen: self.view_gen,
            found: self.found.clone(),
        };
        Some(Box::new(move || Ok(check.run(&programmed, &claims)?)))
    }

    fn node_addresses_changed(&mut self) -> Result<bool, DatapathError> {
        Ok(self.follow_node_addresses()?)
    }

    /// Every owned VIP of `next` against the whole view; VIPs in the maps
    /// that `next` does not have are removed.
    fn program_all(
        &mut self,
        next: &LocalState,
        claims: &Claims,
    ) -> Result<ApplyStats, DatapathError> {
        self.take_found();
        if self.relink {
            self.relink()?;
        }
        let (stats, wanted) = self.apply_full(next, claims)?;
        // Source ranges left by an earlier daemon for frontends that are
        // gone (their headers were not in the maps to remove).
        for vip in self.ext.vips_with_ranges() {
            if !wanted.contains(&vip) {
                self.ext.trim_ranges(&vip, &[])?;
            }
        }
        Ok(stats)
    }

    /// Only the changed services. Every removal goes first, and a VIP that
    /// another changed service now owns is overwritten, not removed, so an
    /// address handed from one service to another never has a gap.
    fn program_changes(
        &mut self,
        _prev: &LocalState,
        _next: &LocalState,
        changed: &[ServiceChange<'_>],
        claims: &Claims,
    ) -> Result<ApplyStats, DatapathError> {
        Ok(self.apply_partial(changed, claims)?)
    }
}

/// Starts socket destruction with the object `attached` loaded; `None`
/// (logged) when this kernel cannot destroy sockets.
fn start_sock_destroyer(
    attached: &mut loader::Attached,
    metrics: &sockdestroy::SockDestroyMetrics,
) -> Option<sockdestroy::SockDestroyer> {
    let prepared = attached.sock_destroy.take()?;
    let started = sockdestroy::SockDestroyer::start(
        &mut attached.ebpf,
        &prepared,
        attached.cgroup.clone(),
        metrics.clone(),
    );
    started
        .inspect_err(|e| {
            tracing::warn!(error = %chain(e), "socket iterators not loaded: sockets of removed backends will not be destroyed");
        })
        .ok()
}

/// The interfaces holding the node addresses `--nodeport-addresses`
/// selects.
fn node_ifaces(config: &EbpfConfig) -> Result<Vec<NodeIface>, EbpfError> {
    let all = crate::node_addrs::list()?;
    Ok(external::group(&crate::node_addrs::select(
        &all,
        &config.nodeport_addresses,
    )))
}

/// The tc programs SNAT to ports in `SNAT_PORT_MIN..=SNAT_PORT_MAX`,
/// above the kernel's default ephemeral range: a node whose own
/// connections may take ports there could pick one that a SNATed flow to
/// the same backend holds.
fn warn_if_ephemeral_ports_overlap() {
    let Ok(range) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range") else {
        return;
    };
    let mut it = range
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok());
    if let (Some(low), Some(high)) = (it.next(), it.next()) {
        let (min, max) = (
            u32::from(proxy_common::SNAT_PORT_MIN),
            u32::from(proxy_common::SNAT_PORT_MAX),
        );
        if low <= max && high >= min {
            tracing::warn!(
                ip_local_port_range = %format!("{low} {high}"),
                snat_ports = %format!("{min}-{max}"),
                "the node's ephemeral ports overlap the ports node-external flows are SNATed to; set net.ipv4.ip_local_port_range below {min}"
            );
        }
    }
}

/// The interfaces the tc programs are attached to, for the log.
fn iface_names(ifaces: &[NodeIface]) -> String {
    let names: Vec<&str> = ifaces
        .iter()
        .filter(|i| i.attachable())
        .map(|i| i.name.as_str())
        .collect();
    names.join(",")
}

/// The default pin directory's parent, mounted as bpffs when needed.
pub const BPFFS_MOUNT: &str = "/sys/fs/bpf";

/// Whether `root` holds pinned maps of this datapath.
pub fn is_pinned(root: &Path) -> bool {
    root.join(proxy_common::MAP_SERVICES).exists()
}
