//! What the syncer publishes and every consumer follows: immutable
//! snapshots of the node-local state and of this node's pods on watch
//! channels (the newest value wins; a slow consumer skips revisions).

use std::sync::Arc;

use tokio::sync::watch;

use crate::model::{LocalState, ObjectKey, Pod};

/// One published LocalState. Revision 0 means "not synced yet".
#[derive(Debug, Default)]
pub struct Snapshot {
    pub rev: u64,
    pub state: Arc<LocalState>,
    /// The keys of the services that differ between this state and the one
    /// of revision `rev - 1` (added, changed or gone), sorted; `None`:
    /// not known. A consumer that holds `rev - 1` need look at nothing
    /// else; one that skipped a revision compares the states (unchanged
    /// services are the same `Arc`, so that is a pointer comparison per
    /// service).
    pub changed: Option<Arc<[ObjectKey]>>,
}

impl Snapshot {
    pub fn is_synced(&self) -> bool {
        self.rev >= 1
    }

    /// The services changed since revision `held`, if this snapshot can
    /// tell (it can when `held` is the revision just before it).
    pub fn changed_since(&self, held: Option<u64>) -> Option<&[ObjectKey]> {
        let changed = self.changed.as_deref()?;
        held.is_some_and(|h| h + 1 == self.rev).then_some(changed)
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

/// Follows a snapshot channel: [`Follower::next`] yields the newest value
/// at once, then after every change (a slow consumer skips intermediate
/// values), until `shutdown` or until the sender is gone. A consumer may
/// ask to be woken again after a delay even without a change (a retry, a
/// recheck) with [`Follower::again_after`]; a change arriving first wakes
/// it at once.
///
/// The one loop behind the datapath coordinator, the localnet and PodInfo
/// converters and the health-check node ports.
pub struct Follower<T> {
    rx: watch::Receiver<Arc<T>>,
    shutdown: tokio_util::sync::CancellationToken,
    started: bool,
    again: Option<std::time::Duration>,
}

impl<T> Follower<T> {
    pub fn new(rx: watch::Receiver<Arc<T>>, shutdown: tokio_util::sync::CancellationToken) -> Self {
        Self {
            rx,
            shutdown,
            started: false,
            again: None,
        }
    }

    /// The newest value; `None` once shut down or the sender is gone.
    pub async fn next(&mut self) -> Option<Arc<T>> {
        if std::mem::replace(&mut self.started, true) {
            let again = self.again.take();
            let wait = async {
                match again {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.shutdown.cancelled() => return None,
                changed = self.rx.changed() => changed.ok()?,
                () = wait => {}
            }
        }
        if self.shutdown.is_cancelled() {
            return None;
        }
        Some(self.rx.borrow_and_update().clone())
    }

    /// Wake the next [`Follower::next`] after `delay` even without a change.
    pub fn again_after(&mut self, delay: std::time::Duration) {
        self.again = Some(delay);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_follower_sees_the_newest_value_wakes_on_request_and_stops() {
        let (tx, rx) = watch::channel(Arc::new(0u32));
        let stop = tokio_util::sync::CancellationToken::new();
        let mut f = Follower::new(rx, stop.clone());
        assert_eq!(f.next().await.as_deref(), Some(&0));
        tx.send_replace(Arc::new(1));
        tx.send_replace(Arc::new(2));
        // Intermediate values are skipped.
        assert_eq!(f.next().await.as_deref(), Some(&2));
        // Without a change, only a requested wake-up returns.
        let quiet = tokio::time::timeout(Duration::from_millis(50), f.next()).await;
        assert!(quiet.is_err(), "woke without a change");
        f.again_after(Duration::from_millis(10));
        assert_eq!(f.next().await.as_deref(), Some(&2));
        stop.cancel();
        assert!(f.next().await.is_none());
        drop(tx);
    }
}
