//! What the syncer publishes and every consumer follows: immutable
//! snapshots of the node-local state and of this node's pods on watch
//! channels (the newest value wins; a slow consumer skips revisions).

use std::sync::Arc;

use tokio::sync::watch;

use crate::model::{LocalState, Pod};

/// One published LocalState. Revision 0 means "not synced yet".
#[derive(Debug, Default)]
pub struct Snapshot {
    pub rev: u64,
    pub state: Arc<LocalState>,
}

impl Snapshot {
    pub fn is_synced(&self) -> bool {
        self.rev >= 1
    }
}

pub type SnapshotSender = watch::Sender<Arc<Snapshot>>;
pub type SnapshotReceiver = watch::Receiver<Arc<Snapshot>>;

/// A channel whose initial value is the unsynced snapshot (rev 0).
pub fn snapshot_channel() -> (SnapshotSender, SnapshotReceiver) {
    watch::channel(Arc::new(Snapshot::default()))
}

/// The pods bound to this node as the PodInfo API serves them (SPEC §7),
/// sorted by (namespace, name). `revision` moves only when one of them is
/// added, removed or changed; nothing is published before the source has
/// synced.
#[derive(Debug, Default)]
pub struct PodSnapshot {
    pub synced: bool,
    pub revision: u64,
    pub pods: Arc<Vec<Pod>>,
}

pub type PodSnapshotSender = watch::Sender<Arc<PodSnapshot>>;
pub type PodSnapshotReceiver = watch::Receiver<Arc<PodSnapshot>>;

/// A channel whose initial value is the unsynced pod snapshot.
pub fn pod_snapshot_channel() -> (PodSnapshotSender, PodSnapshotReceiver) {
    watch::channel(Arc::new(PodSnapshot::default()))
}
