//! The incremental model: the syncer's [`ClusterState`] plus the indexes
//! that tell which Services an object change touches, and the last
//! computed view of every Service. A change marks only the Services it
//! touches; [`Model::recompute`] recomputes just those with
//! [`compute`](super::compute)'s own per-Service function, so the work is
//! proportional to the change, not to the cluster, and every Service that
//! did not change is shared (the same `Arc`) with the previous state.
//!
//! What touches what:
//! * a Service: itself;
//! * an EndpointSlice: the Service its `kubernetes.io/service-name` label
//!   names, before and after the change (a relabelled slice moves);
//! * this node's Node: every Service when its zone changes (topology
//!   hints depend on it), none otherwise; other Nodes and Pods: none (Pods
//!   feed PodInfo, not the state).
//!
//! The result equals [`compute`](super::compute) of the same cluster state
//! (a property test checks random change sequences).

use std::collections::BTreeSet;
use std::sync::Arc;

// foldhash (randomly seeded), not SipHash: these tables take every
// object of a large cluster and their keys are short.
use hashbrown::HashMap;

use super::cluster::{Change, ClusterState, EndpointSlice, Node, Object, ObjectKey, ObjectKind};
use super::compute::{service_view, Env, NodeContext};
use super::local::{LocalState, ServiceEndpoints};

/// Above this many touched Services a recompute rebuilds the service list
/// in one merge instead of inserting and removing one at a time.
const MERGE_THRESHOLD: usize = 64;
/// From this many Services a recompute runs on every core (a thread costs
/// tens of microseconds; one view a few).
const PARALLEL_VIEWS: usize = 4096;

/// The cluster state with its indexes and the current per-Service view.
#[derive(Debug)]
pub struct Model {
    node: NodeContext,
    cluster: ClusterState,
    /// Service → the slices whose service-name label names it, sorted
    /// (slice keys sort by name within the Service's namespace: slice-name
    /// order). A sorted `Vec`, not a set: most Services have one or two
    /// slices, and a set's first node costs half a kilobyte.
    slices_of: HashMap<ObjectKey, Vec<ObjectKey>>,
    /// The current view, sorted by key: what [`Model::state`] hands out.
    services: Vec<Arc<ServiceEndpoints>>,
    /// Services touched since the last recompute.
    dirty: BTreeSet<ObjectKey>,
    /// Every Service is touched (nothing computed yet, or this node's
    /// zone changed): `dirty` is not kept meanwhile.
    all_dirty: bool,
}

/// What a recompute changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recomputed {
    /// Keys of the Services whose view differs from before (added,
    /// changed or gone), sorted.
    pub changed: Vec<ObjectKey>,
}

impl Model {
    pub fn new(node: NodeContext) -> Self {
        Model {
            node,
            cluster: ClusterState::default(),
            slices_of: HashMap::new(),
            services: Vec::new(),
            dirty: BTreeSet::new(),
            // A first sync computes every Service: 100k changes need not
            // each mark theirs.
            all_dirty: true,
        }
    }

    /// The objects as the sources reported them.
    pub fn cluster(&self) -> &ClusterState {
        &self.cluster
    }

    /// The state as of the last [`Model::recompute`]: one pointer per
    /// Service, shared with every earlier state that has the same Service.
    pub fn state(&self) -> LocalState {
        LocalState {
            services: self.services.clone(),
        }
    }

    /// Applies one change; returns whether the cluster state differs
    /// afterwards. Marks the Services the change touches.
    pub fn apply(&mut self, change: Change) -> bool {
        let r = change.object_ref();
        let slice_owner_before = match r.kind {
            ObjectKind::EndpointSlice => self
                .cluster
                .endpoint_slices
                .get(&r.key)
                .and_then(|s| s.service_key()),
            _ => None,
        };
        let zone_before = match r.kind {
            ObjectKind::Node => self.own_zone(),
            _ => None,
        };
        // A slice's owner afterwards is the new version's (none once
        // deleted): no second lookup once it is in place.
        let slice_owner_after = match &change {
            Change::Upsert(Object::EndpointSlice(s)) => s.service_key(),
            _ => None,
        };
        if !self.cluster.apply(change) {
            return false;
        }
        match r.kind {
            ObjectKind::Service => self.touch(r.key),
            ObjectKind::EndpointSlice => {
                if let Some(before) = slice_owner_before {
                    if let Some(slices) = self.slices_of.get_mut(&before) {
                        if let Ok(i) = slices.binary_search(&r.key) {
                            slices.remove(i);
                        }
                        if slices.is_empty() {
                            self.slices_of.remove(&before);
                        }
                    }
                    self.touch(before);
                }
                if let Some(after) = slice_owner_after {
                    let slices = self.slices_of.entry(after.clone()).or_default();
                    if let Err(i) = slices.binary_search(&r.key) {
                        // Room for one more, not four: most Services have one.
                        slices.reserve_exact(1);
                        slices.insert(i, r.key);
                    }
                    self.touch(after);
                }
            }
            ObjectKind::Node => {
                if r.key.name == self.node.node_name && self.own_zone() != zone_before {
                    self.all_dirty = true;
                }
            }
            ObjectKind::Pod => {}
        }
        true
    }

    /// Marks a Service for the next recompute.
    fn touch(&mut self, key: ObjectKey) {
        if !self.all_dirty {
            self.dirty.insert(key);
        }
    }

    fn own_zone(&self) -> Option<String> {
        self.cluster
            .nodes
            .get(&self.node.node_name)
            .and_then(Node::zone)
            .map(str::to_owned)
    }

    /// Recomputes the Services touched since the last call and returns
    /// which of them changed; [`Model::state`] then returns the new state.
    pub fn recompute(&mut self) -> Recomputed {
        let touched: Vec<ObjectKey> = if std::mem::take(&mut self.all_dirty) {
            self.dirty.clear();
            let mut all: BTreeSet<ObjectKey> = self.cluster.services.keys().cloned().collect();
            all.extend(self.services.iter().map(|s| s.service.key.clone()));
            all.into_iter().collect()
        } else {
            std::mem::take(&mut self.dirty).into_iter().collect()
        };
        let env = Env::new(&self.cluster, &self.node);
        let views = self.views(touched, &env);
        let mut changed = Vec::new();
        if views.len() > MERGE_THRESHOLD {
            self.merge(views, &mut changed);
        } else {
            for (key, view) in views {
                self.place(key, view, &mut changed);
            }
        }
        Recomputed { changed }
    }

    /// The views of `touched`, in its order. A full recompute (a first
    /// sync, a relist) is split across the machine's cores: each view
    /// reads only the cluster state.
    fn views(
        &self,
        touched: Vec<ObjectKey>,
        env: &Env,
    ) -> Vec<(ObjectKey, Option<ServiceEndpoints>)> {
        let one = |key: ObjectKey| {
            let view = self.view(&key, env);
            (key, view)
        };
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
        if touched.len() < PARALLEL_VIEWS || threads < 2 {
            return touched.into_iter().map(one).collect();
        }
        let per = touched.len().div_ceil(threads);
        let mut chunks: Vec<Vec<ObjectKey>> = Vec::with_capacity(threads);
        let mut rest = touched.into_iter();
        for _ in 0..threads {
            chunks.push(rest.by_ref().take(per).collect());
        }
        std::thread::scope(|scope| {
            let mut chunks = chunks.into_iter();
            let mine = chunks.next().unwrap_or_default();
            let others: Vec<_> = chunks
                .map(|c| scope.spawn(move || c.into_iter().map(one).collect::<Vec<_>>()))
                .collect();
            let mut out: Vec<_> = mine.into_iter().map(one).collect();
            for h in others {
                match h.join() {
                    Ok(part) => out.extend(part),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            out
        })
    }

    /// One Service's view from the current cluster state.
    fn view(&self, key: &ObjectKey, env: &Env) -> Option<ServiceEndpoints> {
        let svc = self.cluster.services.get(key)?;
        let slices: Vec<&EndpointSlice> = self
            .slices_of
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|k| self.cluster.endpoint_slices.get(k).map(|s| &**s))
            .collect();
        service_view(svc, &slices, env)
    }

    /// Puts one recomputed view in place (binary search, insert/remove).
    fn place(
        &mut self,
        key: ObjectKey,
        view: Option<ServiceEndpoints>,
        changed: &mut Vec<ObjectKey>,
    ) {
        let at = self.services.binary_search_by(|s| s.service.key.cmp(&key));
        match (at, view) {
            (Ok(i), Some(v)) => {
                if *self.services[i] != v {
                    self.services[i] = Arc::new(v);
                    changed.push(key);
                }
            }
            (Ok(i), None) => {
                self.services.remove(i);
                changed.push(key);
            }
            (Err(i), Some(v)) => {
                self.services.insert(i, Arc::new(v));
                changed.push(key);
            }
            (Err(_), None) => {}
        }
    }

    /// Merges many recomputed views (sorted by key) into the service list
    /// in one pass.
    fn merge(
        &mut self,
        views: Vec<(ObjectKey, Option<ServiceEndpoints>)>,
        changed: &mut Vec<ObjectKey>,
    ) {
        use std::cmp::Ordering;
        let old = std::mem::take(&mut self.services);
        let mut out: Vec<Arc<ServiceEndpoints>> = Vec::with_capacity(old.len() + views.len());
        let mut old = old.into_iter().peekable();
        for (key, view) in views {
            while let Some(o) = old.next_if(|o| o.service.key < key) {
                out.push(o);
            }
            let existing = old.next_if(|o| o.service.key.cmp(&key) == Ordering::Equal);
            match (existing, view) {
                (Some(o), Some(v)) if *o == v => out.push(o),
                (_, Some(v)) => {
                    out.push(Arc::new(v));
                    changed.push(key);
                }
                (Some(_), None) => changed.push(key),
                (None, None) => {}
            }
        }
        out.extend(old);
        self.services = out;
    }
}

#[cfg(test)]
#[path = "incremental_tests.rs"]
mod tests;
