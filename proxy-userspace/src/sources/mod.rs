//! Sources turn the outside world into [`SourceMessage`]s: typed object
//! changes, a `Synced` mark once the initial list is complete, and the
//! errors they ran into (for logs and metrics).

mod field;
pub mod file;
pub mod kube;
pub mod objects;
pub mod typed_json;
pub mod wire;

use tokio::sync::mpsc;

use crate::model::Change;

#[derive(Debug)]
pub enum SourceMessage {
    /// Object changes, applied together.
    Changes(Vec<Change>),
    /// Object changes of an update that goes on in the next message (a
    /// large burst of file changes, read a chunk at a time): applied, but
    /// no state is computed before the update's last message, a
    /// [`SourceMessage::Changes`].
    Part(Vec<Change>),
    /// The initial list is complete: from now on the state is whole.
    Synced,
    /// Manifests or objects that were rejected (the last good state stays).
    Errors(Vec<file::ManifestError>),
    /// An object was refused (logged by the source, naming it); its last
    /// good version stays. The file source reports its refusals as
    /// [`SourceMessage::Errors`].
    Rejected { reason: RejectReason },
    /// A watch failed; the last good state stays and the watch is retried
    /// with backoff. `reason` is `watch` or `relist_410`.
    WatchError {
        resource: &'static str,
        reason: &'static str,
        message: String,
    },
    /// A resource's watch failed (`stale: true`) or delivered again after a
    /// failure (`stale: false`).
    ResourceStale { resource: &'static str, stale: bool },
}

/// Why a source refused an object: the `reason` label of
/// `ebpf_kube_proxy_rejected_objects_total` (its help text lists them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RejectReason {
    /// Well-formed, but a value the API server would refuse (a port out of
    /// range, an address that is not one, an unknown protocol).
    InvalidObject,
    /// Not even of its kind's shape: a field of the wrong JSON type (a port
    /// given as a string, a list given as a scalar).
    Undecodable,
    /// A manifest document that is not YAML or JSON, or not a mapping: no
    /// object in it can be told apart (file source only).
    InvalidManifest,
}

impl RejectReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::InvalidObject => "invalid_object",
            RejectReason::Undecodable => "undecodable",
            RejectReason::InvalidManifest => "invalid_manifest",
        }
    }

    /// The reasons `source` (`file`, `kube`) can report, so that each
    /// series exists from the start at 0.
    pub fn of_source(source: &str) -> &'static [RejectReason] {
        match source {
            "file" => &[
                RejectReason::InvalidObject,
                RejectReason::Undecodable,
                RejectReason::InvalidManifest,
            ],
            _ => &[RejectReason::InvalidObject, RejectReason::Undecodable],
        }
    }
}

pub type SourceSender = mpsc::Sender<SourceMessage>;
pub type SourceReceiver = mpsc::Receiver<SourceMessage>;

/// Channel between a source and the syncer; bounded so a runaway source
/// waits for the syncer instead of growing memory.
pub fn channel() -> (SourceSender, SourceReceiver) {
    mpsc::channel(64)
}
