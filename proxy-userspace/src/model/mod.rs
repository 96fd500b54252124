//! The pure core: what the API server says ([`ClusterState`]) in, what this
//! node must program ([`LocalState`]) out. No I/O, no clock, no randomness.
//!
//! Sources build a [`ClusterState`] from typed objects; [`compute`] applies
//! kube-proxy's endpoint selection rules (SPEC §8) and returns a canonical,
//! sorted [`LocalState`], so equal inputs give equal output and a revision is
//! only bumped on a real change.

pub mod claims;
pub mod cluster;
pub mod compute;
pub mod incremental;
pub mod intern;
pub mod local;
pub mod target_ref;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod uid;

pub use cluster::*;
pub use compute::{compute, NodeContext};
pub use incremental::{Model, Recomputed};
pub use intern::{intern, ArcStr};
pub use local::*;
pub use target_ref::TargetRef;
pub use uid::Uid;
