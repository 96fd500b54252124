//! Sources turn the outside world into [`SourceMessage`]s: typed object
//! changes, a `Synced` mark once the initial list is complete, and the
//! errors they ran into (for logs and metrics).

pub mod file;
pub mod kube;
pub mod objects;

use tokio::sync::mpsc;

use crate::model::Change;

#[derive(Debug)]
pub enum SourceMessage {
    /// Object changes, applied together.
    Changes(Vec<Change>),
    /// The initial list is complete: from now on the state is whole.
    Synced,
    /// Manifests or objects that were rejected (the last good state stays).
    Errors(Vec<file::ManifestError>),
    /// A watch failed or delivered an invalid object; the last good state
    /// stays and the watch is retried with backoff. `reason` is one of
    /// `watch`, `relist_410`, `invalid_object`.
    WatchError {
        resource: &'static str,
        reason: &'static str,
        message: String,
    },
    /// A resource's watch failed (`stale: true`) or delivered again after a
    /// failure (`stale: false`).
    ResourceStale { resource: &'static str, stale: bool },
}

pub type SourceSender = mpsc::Sender<SourceMessage>;
pub type SourceReceiver = mpsc::Receiver<SourceMessage>;

/// Channel between a source and the syncer; bounded so a runaway source
/// waits for the syncer instead of growing memory.
pub fn channel() -> (SourceSender, SourceReceiver) {
    mpsc::channel(64)
}
