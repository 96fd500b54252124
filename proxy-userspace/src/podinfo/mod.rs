//! The PodInfo gRPC bridge (SPEC §7, KEP-4188 with its proto fixed): the
//! conditions of the pods bound to this node, read-only, on a unix socket.
//!
//! Input: the syncer's [`crate::snapshot::PodSnapshot`] channel (this node's
//! pods, a revision that moves only when what PodInfo shows changes).
//! Output: `ListPodConditions`, `GetPodConditions` and
//! `WatchPodConditions`, admitted per client by a token bucket, and the
//! `pod_info_*` families on `/metrics`. [`client`] is the `podinfo` CLI.

pub mod client;
mod convert;
pub mod limiter;
pub mod metrics;
pub mod server;

pub use limiter::RateLimit;
pub use metrics::PodInfoMetrics;
pub use server::{PodInfoApi, PodInfoError, PodInfoListener};
