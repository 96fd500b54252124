//! Datapaths program a [`LocalState`] into the node. Each implementation
//! computes the difference between the previous and the next state and
//! touches only what changed.
//!
//! This build ships the `none` datapath only: it programs nothing and
//! reports every state as applied. The eBPF and nftables datapaths are
//! refused at start-up rather than faked.

pub mod none;

use std::fmt;

use crate::model::LocalState;

/// Which datapath runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProxyMode {
    /// eBPF, falling back to nftables when eBPF cannot load.
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
}

pub trait Datapath: Send {
    fn mode(&self) -> ProxyMode;
    /// Programs `next`, given that `prev` is what is programmed now.
    fn apply(&mut self, prev: &LocalState, next: &LocalState) -> Result<ApplyStats, DatapathError>;
}

/// Number of services whose content differs between two sorted states.
pub fn changed_services(prev: &LocalState, next: &LocalState) -> usize {
    let mut changed = 0;
    let (mut a, mut b) = (
        prev.services.iter().peekable(),
        next.services.iter().peekable(),
    );
    loop {
        match (a.peek(), b.peek()) {
            (None, None) => return changed,
            (Some(_), None) => {
                changed += 1;
                a.next();
            }
            (None, Some(_)) => {
                changed += 1;
                b.next();
            }
            (Some(x), Some(y)) => match x.service.key.cmp(&y.service.key) {
                std::cmp::Ordering::Less => {
                    changed += 1;
                    a.next();
                }
                std::cmp::Ordering::Greater => {
                    changed += 1;
                    b.next();
                }
                std::cmp::Ordering::Equal => {
                    if x != y {
                        changed += 1;
                    }
                    a.next();
                    b.next();
                }
            },
        }
    }
}
