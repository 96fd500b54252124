//! The syncer: applies source changes to the incremental [`Model`],
//! recomputes the services they touch and publishes the new [`LocalState`]
//! as an immutable [`Snapshot`], with the keys that changed, under a
//! revision that only moves when the content changes (SPEC §6.1).
//!
//! Nothing is published before the source has synced: until then every
//! consumer sees revision 0 ("no state").

use std::sync::Arc;

use crate::model::{Change, ClusterState, Model, Node, NodeContext, Pod};
use crate::snapshot::{PodSnapshot, PodSnapshotSender, Snapshot, SnapshotSender};
use crate::sources::{SourceMessage, SourceReceiver};
use crate::status::{ChangeBatch, ChangeNote, Status};

/// Publishes this node's pods when they differ from the last published
/// ones. The model `Pod` holds only what PodInfo shows, so equality is
/// exactly "the PodInfo content changed".
fn publish_pods(cluster: &ClusterState, node_name: &str, out: &PodSnapshotSender) {
    let local = || {
        cluster
            .pods
            .values()
            .filter(|p| p.node_name.as_deref() == Some(node_name))
    };
    let current = out.borrow().clone();
    if current.synced && current.pods.iter().eq(local()) {
        return;
    }
    let revision = current.revision + 1;
    let pods: Vec<Pod> = local().cloned().collect();
    tracing::debug!(revision, pods = pods.len(), "new pod list");
    out.send_replace(Arc::new(PodSnapshot {
        synced: true,
        revision,
        pods: Arc::new(pods),
    }));
}

/// Applies `changes` to the model, noting each one that changed it in
/// `queued`; whether any did.
fn apply(model: &mut Model, changes: Vec<Change>, queued: &mut ChangeBatch) -> bool {
    let mut dirty = false;
    for c in changes {
        let note = ChangeNote::of(&c);
        if model.apply(c) {
            dirty = true;
            queued.add(note);
        }
    }
    dirty
}

/// Applies every message from `rx` until the source hangs up. Bursts are
/// coalesced: all queued messages are applied before one recompute.
/// Runs on its own thread because recomputing is CPU-bound. Reports queued
/// changes, computed revisions and the source's progress to `status`.
pub fn run(
    mut rx: SourceReceiver,
    node: NodeContext,
    out: SnapshotSender,
    pods_out: PodSnapshotSender,
    status: Arc<Status>,
) {
    let mut model = Model::new(node.clone());
    let mut synced = false;
    let mut rev = 0u64;
    // What was applied since the last state was computed: whether it
    // changed the model, and the changes for the queue metrics.
    let mut dirty = false;
    let mut queued = ChangeBatch::default();
    // Inside an update sent in parts: nothing is computed from half of
    // it, neither the state nor the pods nor the node's eligibility.
    let mut holding = false;
    while let Some(first) = rx.blocking_recv() {
        let mut msg = Some(first);
        while let Some(m) = msg.take() {
            match m {
                SourceMessage::Changes(changes) => {
                    holding = false;
                    dirty |= apply(&mut model, changes, &mut queued);
                }
                SourceMessage::Part(changes) => {
                    holding = true;
                    dirty |= apply(&mut model, changes, &mut queued);
                }
                SourceMessage::Synced => {
                    if !synced {
                        synced = true;
                        dirty = true;
                        status.source_synced();
                    }
                }
                SourceMessage::Errors(errors) => {
                    for e in &errors {
                        status.source_error(e.reason_class());
                        if let Some(reason) = e.reject_reason() {
                            status.object_rejected(reason);
                        }
                    }
                }
                SourceMessage::Rejected { reason } => {
                    status.source_error(reason.as_str());
                    status.object_rejected(reason);
                }
                SourceMessage::WatchError { reason, .. } => status.source_error(reason),
                SourceMessage::ResourceStale { resource, stale } => {
                    status.set_resource_in_sync(resource, !stale)
                }
            }
            msg = rx.try_recv().ok();
        }
        if holding || !dirty {
            continue;
        }
        dirty = false;
        status.changes_queued(std::mem::take(&mut queued));
        let cluster = model.cluster();
        status.set_node_eligible(Node::eligible(cluster.nodes.get(&node.node_name)));
        if !synced {
            continue;
        }
        publish_pods(cluster, &node.node_name, &pods_out);
        let recomputed = model.recompute();
        if rev >= 1 && recomputed.changed.is_empty() {
            tracing::debug!(rev, "recomputed state is unchanged");
            status.state_computed(rev, None);
            continue;
        }
        let next = Arc::new(model.state());
        rev += 1;
        // Published first: once the metric or the log names `rev`, every
        // consumer (a new localnet call) can see it.
        out.send_replace(Arc::new(Snapshot {
            rev,
            state: next.clone(),
            changed: Some(recomputed.changed.into()),
        }));
        status.state_computed(rev, Some(&next));
        tracing::info!(
            rev,
            services = next.services.len(),
            endpoints = next.endpoint_count(),
            "new local state"
        );
    }
}
