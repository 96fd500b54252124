//! Datapaths program a [`LocalState`] into the node. Each implementation
//! computes the difference between the previous and the next state and
//! touches only what changed.
//!
//! This build ships the `ebpf` datapath (socket-level load balancing, see
//! [`ebpf`]), `nftables` (a kube-proxy-nftables-shaped ruleset, see
//! [`nft`]) and `none` (programs nothing, publishes the state). `auto`
//! tries eBPF and falls back to nftables with the reason in
//! [`DatapathChoice`].

pub mod drift;
pub mod ebpf;
pub mod nft;
pub mod none;

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::model::claims::Claims;
use crate::model::{LocalState, ObjectKey, ServiceEndpoints};
use crate::net::Cidr;
pub use drift::{Drift, DriftKind};

/// Which datapath runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProxyMode {
    /// eBPF, falling back to nftables when eBPF cannot load. kube-proxy's
    /// `iptables`, `ipvs` and `kernelspace` mean this too (with a warning):
    /// this proxy replaces those datapaths.
    #[value(alias = "iptables", alias = "ipvs", alias = "kernelspace")]
    Auto,
    Ebpf,
    Nftables,
    /// Publish state only (localnet API); program nothing.
    None,
}

impl ProxyMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyMode::Auto => "auto",
            ProxyMode::Ebpf => "ebpf",
            ProxyMode::Nftables => "nftables",
            ProxyMode::None => "none",
        }
    }
}

impl fmt::Display for ProxyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one apply did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyStats {
    pub services_changed: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    #[error("{mode} datapath: {reason}")]
    Apply { mode: ProxyMode, reason: String },
    #[error("ebpf datapath: {0}")]
    Ebpf(ebpf::EbpfError),
}

/// One service to reprogram: its version in the next state (`None`: gone).
#[derive(Clone, Copy, Debug)]
pub struct ServiceChange<'a> {
    pub key: &'a ObjectKey,
    pub next: Option<&'a ServiceEndpoints>,
}

/// A drift check detached from its datapath: it owns a copy of what the
/// datapath programmed (the state, the claims, the datapath's own record)
/// and reads the kernel back on a thread of its own, while the datapath
/// goes on applying.
pub type DriftCheck = Box<dyn FnOnce() -> Result<Vec<Drift>, DatapathError> + Send>;

/// A datapath translates states into kernel writes; *when* and *what* to
/// program is decided by the apply coordinator ([`crate::apply`]). Both
/// calls program only the frontends `claims` says a service owns.
pub trait Datapath: Send {
    fn mode(&self) -> ProxyMode;
    /// Programs `next` whole, whatever is in the kernel now (start-up,
    /// adoption after a restart, and after any failure).
    fn program_all(
        &mut self,
        next: &LocalState,
        claims: &Claims,
    ) -> Result<ApplyStats, DatapathError>;
    /// Programs `changed` only, given that `prev` is what is programmed.
    fn program_changes(
        &mut self,
        prev: &LocalState,
        next: &LocalState,
        changed: &[ServiceChange<'_>],
        claims: &Claims,
    ) -> Result<ApplyStats, DatapathError>;
    /// Reads back what the kernel holds and compares it with what this
    /// datapath last programmed (`programmed` with `claims`, from the
    /// last successful apply): every difference, in a stable order
    /// (`Ok(vec![])`: none). The coordinator calls it on the
    /// `--sync-period` timer and on SIGHUP, only after a successful apply,
    /// and answers any difference with [`Datapath::program_all`]: that
    /// full sync must repair what was found (so it must not trust a record
    /// of its own that the kernel contradicts).
    fn verify(
        &mut self,
        _programmed: &LocalState,
        _claims: &Claims,
    ) -> Result<Vec<Drift>, DatapathError> {
        Ok(Vec::new())
    }
    /// [`Datapath::verify`] of `programmed` with `claims` (what the last
    /// successful apply programmed) as a [`DriftCheck`] that runs away
    /// from the datapath, so that applies need not wait for it; `None`
    /// when this datapath checks only in place (the coordinator then
    /// calls [`Datapath::verify`]).
    fn drift_check(&self, _programmed: Arc<LocalState>, _claims: Claims) -> Option<DriftCheck> {
        None
    }
    /// The node's addresses or interfaces changed (rtnetlink): follow
    /// them. `Ok(true)` when the programmed frontends depend on them (node
    /// ports on node addresses), so that a full sync must follow.
    fn node_addresses_changed(&mut self) -> Result<bool, DatapathError> {
        Ok(false)
    }
    /// Registers the families only this datapath has (the nftables ones of
    /// SPEC §5.1) on `/metrics`.
    fn register_metrics(
        &mut self,
        _registry: &prometheus::Registry,
    ) -> Result<(), prometheus::Error> {
        Ok(())
    }
    /// Entries per kernel map (or nftables map/set) after the last apply,
    /// for `ebpf_kube_proxy_datapath_map_entries{map}`.
    fn map_entries(&self) -> Vec<(&'static str, usize)> {
        Vec::new()
    }
    /// What this datapath has programmed, read straight from the kernel (no
    /// daemon needed, SPEC §10.7); `None` when it programmed nothing.
    fn dump(config: &DatapathConfig) -> Result<Option<Dump>, DatapathError>
    where
        Self: Sized;
    /// Removes everything this datapath left in the kernel, whether or not
    /// it is the one `--proxy-mode` names; one report line per thing.
    fn cleanup(config: &DatapathConfig) -> Result<Vec<String>, DatapathError>
    where
        Self: Sized;
}

/// What `dump` found programmed.
#[derive(Debug)]
pub enum Dump {
    /// The pinned eBPF maps, decoded.
    Ebpf(ebpf::dump::MapDump),
    /// The nftables tables, decoded per service.
    Nftables(Vec<nft::TableDump>),
}

/// Which datapath runs, and why when it is not the one asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatapathChoice {
    /// The datapath that runs.
    pub mode: ProxyMode,
    /// `--proxy-mode` as given.
    pub requested: ProxyMode,
    /// Why `mode` differs from `requested` (auto's fallback).
    pub fallback_reason: Option<String>,
    /// The cause's class for metrics labels (see [`ebpf::EbpfError::class`]).
    pub fallback_class: Option<&'static str>,
}

/// What the datapaths need from the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatapathConfig {
    pub mode: ProxyMode,
    pub bpffs_root: PathBuf,
    /// `None`: the cgroup v2 root.
    pub cgroup_path: Option<PathBuf>,
    /// `--ebpf-map-size`: entries of the eBPF services and backends maps.
    pub ebpf_map_size: u32,
    /// `--cluster-cidr`: nftables masquerades traffic to services from
    /// outside these.
    pub cluster_cidrs: Vec<Cidr>,
    /// `--masquerade-all`: nftables masquerades every connection to a
    /// ClusterIP. eBPF socket-LB rewrites the destination at connect() and
    /// translates no packet, so there is nothing to masquerade.
    pub masquerade_all: bool,
    /// `--nodeport-addresses`: node ports answer only on local addresses
    /// inside these (empty: every local address).
    pub nodeport_addresses: Vec<Cidr>,
}

/// Test hook, read from the environment: `auto` behaves as if eBPF could
/// not be loaded, so the fallback to nftables can be exercised on a
/// machine where eBPF works.
pub const FORCE_EBPF_FAILURE_ENV: &str = "EBPF_KUBE_PROXY_TEST_FORCE_EBPF_FAILURE";

/// Starts the datapath `--proxy-mode` asks for. `ebpf` fails when eBPF
/// cannot be loaded; `auto` then logs one line with the cause and runs
/// nftables.
pub fn select(
    config: &DatapathConfig,
) -> Result<(Box<dyn Datapath>, DatapathChoice), DatapathError> {
    let ebpf_config = ebpf::EbpfConfig {
        bpffs_root: config.bpffs_root.clone(),
        cgroup_path: config.cgroup_path.clone(),
        map_size: config.ebpf_map_size,
        nodeport_addresses: config.nodeport_addresses.clone(),
    };
    let choice = |mode, fallback: Option<&ebpf::EbpfError>| DatapathChoice {
        mode,
        requested: config.mode,
        fallback_reason: fallback.map(|e| format!("eBPF datapath unavailable: {e}")),
        fallback_class: fallback.map(ebpf::EbpfError::class),
    };
    match config.mode {
        ProxyMode::Ebpf => {
            let dp = ebpf::EbpfDatapath::open(&ebpf_config)?;
            Ok((Box::new(dp), choice(ProxyMode::Ebpf, None)))
        }
        ProxyMode::Auto => {
            let opened = if std::env::var_os(FORCE_EBPF_FAILURE_ENV).is_some() {
                Err(ebpf::EbpfError::Load(format!(
                    "forced by {FORCE_EBPF_FAILURE_ENV} (test hook)"
                )))
            } else {
                ebpf::EbpfDatapath::open(&ebpf_config)
            };
            match opened {
                Ok(dp) => Ok((Box::new(dp), choice(ProxyMode::Ebpf, None))),
                Err(e) => {
                    tracing::warn!(reason = %e, class = e.class(), "proxy-mode auto: eBPF datapath unavailable, falling back to nftables");
                    let dp = nft::NftDatapath::open(config.cluster_cidrs.clone())?
                        .with_masquerade_all(config.masquerade_all)
                        .with_nodeport_addresses(config.nodeport_addresses.clone())
                        .with_note(format!(
                            "proxy-mode auto fell back to nftables: eBPF datapath unavailable: {e}"
                        ));
                    Ok((Box::new(dp), choice(ProxyMode::Nftables, Some(&e))))
                }
            }
        }
        ProxyMode::None => Ok((Box::new(none::NoneDatapath), choice(ProxyMode::None, None))),
        ProxyMode::Nftables => {
            let dp = nft::NftDatapath::open(config.cluster_cidrs.clone())?
                .with_masquerade_all(config.masquerade_all)
                .with_nodeport_addresses(config.nodeport_addresses.clone());
            Ok((Box::new(dp), choice(ProxyMode::Nftables, None)))
        }
    }
}
