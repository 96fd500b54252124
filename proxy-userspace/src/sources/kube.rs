//! The Kubernetes source (`--source kube`): list+watch Services,
//! EndpointSlices, this node's Node and the Pods bound to this node through
//! kube-rs watchers, and turn their events into [`SourceMessage`]s.
//!
//! Never partial: a (re)list is buffered from `Init` to `InitDone` and then
//! applied as one batch (with deletes for objects that vanished meanwhile),
//! so a dropped watch or a 410 Gone never publishes half a list. What is
//! buffered is what changed: a listed object at the resourceVersion the
//! model already has is not even decoded ([`known`]). `Synced` is
//! sent once every resource has completed its first list. Watch errors are
//! retried with kube-rs' default backoff (exponential with jitter); during an
//! outage the last state keeps serving.
//!
//! Objects are read as protobuf (`--kube-api-content-type`, by default;
//! [`pb`], [`pb_body`]) or raw JSON and checked one by one, so a bad object
//! (one the API server should have refused, or one no typed client can
//! decode) is refused alone, logged with its kind, namespace and name, and
//! keeps its last good version, also across a relist; every other object of
//! its resource keeps flowing. A delete needs only the name.
//!
//! A list's items are kept as their text as the watcher reads them off
//! the wire and checked a batch at a time ([`CHECK_BATCH`], on two
//! threads) while the watcher reads the next page (a list served in one
//! piece is checked as it is read, once a few MB of text wait: see
//! `raw::WAITING_MAX`). Only the model's object is kept, never the API
//! objects themselves (managed fields, annotations, status the proxy does
//! not read). Watch events are checked as they come.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

mod events;
mod known;
mod list_read;
mod pb;
mod pb_body;
mod raw;

pub use list_read::{read_list, ListRead};

use super::{RejectReason, SourceMessage, SourceSender};
use crate::config::KubeContentType;
use crate::model::cluster::proxy_label_selector;
use crate::model::{Change, Object, ObjectKey, ObjectKind, ObjectRef};
use known::Known;
use raw::{Checked, RawObject, Rejection, Watched};

#[derive(Debug, thiserror::Error)]
pub enum KubeSourceError {
    #[error("--kubeconfig {path}: {reason}")]
    Kubeconfig { path: PathBuf, reason: String },
    #[error("Kubernetes client configuration: {0} (set --kubeconfig or run in a pod)")]
    Config(String),
    #[error("--master {url}: {reason}")]
    Master { url: String, reason: String },
    #[error("Kubernetes client: {0}")]
    Client(String),
}

/// The API server a client talks to, for messages that must name it.
#[derive(Clone, Debug)]
pub struct ApiServer {
    pub url: String,
    /// The address came from the in-cluster environment
    /// (`KUBERNETES_SERVICE_HOST`), not a kubeconfig or `--master`.
    pub in_cluster: bool,
    /// Watch events of unknown types the client's responses held.
    unknown_events: Arc<events::UnknownEvents>,
}

/// How long the start-up check waits for the API server to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

impl ApiServer {
    /// Asks the API server for its version once; when it cannot be reached
    /// says so at error level, naming the address and the usual fix. The
    /// watches keep retrying either way.
    pub async fn probe(&self, client: &Client) {
        let outcome = tokio::time::timeout(PROBE_TIMEOUT, client.apiserver_version()).await;
        let reason = match outcome {
            Ok(Ok(v)) => {
                tracing::info!(url = %self.url, version = %v.git_version, "API server reachable");
                return;
            }
            Ok(Err(e)) => crate::datapath::ebpf::chain(&e),
            Err(_) => format!("no answer within {PROBE_TIMEOUT:?}"),
        };
        let hint = if self.in_cluster {
            "without kube-proxy the in-cluster address (KUBERNETES_SERVICE_HOST) is a ClusterIP that nothing serves yet: give the control plane's own address in the ebpf-kube-proxy-apiserver ConfigMap (deploy/apiserver.yaml), or --master/--kubeconfig"
        } else {
            "check --master/--kubeconfig and that this node can reach that address"
        };
        tracing::error!(url = %self.url, %reason, hint, "cannot reach the API server; retrying");
    }
}

/// Builds the API client: `--kubeconfig` when given, else the in-cluster
/// configuration (or `$KUBECONFIG` / `~/.kube/config`); `--master`
/// overrides the server URL, as in kube-proxy. `content_type` is the
/// encoding asked for ([`pb`]: protobuf, read into the same wire types
/// as JSON).
pub async fn client(
    kubeconfig: Option<&std::path::Path>,
    master: Option<&str>,
    content_type: KubeContentType,
) -> Result<(Client, ApiServer), KubeSourceError> {
    let mut in_cluster = false;
    let mut config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                KubeSourceError::Kubeconfig {
                    path: path.to_owned(),
                    reason: e.to_string(),
                }
            })?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| KubeSourceError::Kubeconfig {
                    path: path.to_owned(),
                    reason: e.to_string(),
                })?
        }
        None => {
            in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
            kube::Config::infer()
                .await
                .map_err(|e| KubeSourceError::Config(e.to_string()))?
        }
    };
    if let Some(url) = master.filter(|m| !m.is_empty()) {
        config.cluster_url =
            url.parse()
                .map_err(|e: http::uri::InvalidUri| KubeSourceError::Master {
                    url: url.to_owned(),
                    reason: e.to_string(),
                })?;
        in_cluster = false;
    }
    let unknown_events = Arc::new(events::UnknownEvents::default());
    let server = ApiServer {
        url: config.cluster_url.to_string(),
        in_cluster,
        unknown_events: unknown_events.clone(),
    };
    let client = kube::client::ClientBuilder::try_from(config)
        .map_err(|e| KubeSourceError::Client(e.to_string()))?
        .with_layer(&tower::layer::layer_fn(move |inner| {
            events::Filtered::new(
                inner,
                unknown_events.clone(),
                content_type == KubeContentType::Protobuf,
            )
        }))
        .build();
    Ok((client, server))
}

/// One watched resource, its events already converted to model objects.
#[derive(Debug)]
enum Update {
    /// Objects of a resource's first list, passed on as they are read
    /// (nothing is published before every resource has listed, so the
    /// model can take them while the rest of the list is still on the
    /// wire).
    Listing {
        resource: &'static str,
        objects: Vec<Object>,
    },
    /// A complete (re)list: the valid objects that are new or changed
    /// (but those already passed on as [`Update::Listing`]), and the
    /// objects that are gone. An object that exists but failed the checks
    /// keeps its last good version: it is neither.
    Relisted {
        resource: &'static str,
        objects: Vec<Object>,
        deleted: Vec<ObjectRef>,
        /// The objects listed unchanged, for the log.
        unchanged: usize,
    },
    Applied(Object),
    Deleted(ObjectRef),
    /// An object that failed the checks; its last good version stays.
    Rejected {
        resource: &'static str,
        reason: RejectReason,
        message: String,
    },
    Error {
        resource: &'static str,
        reason: &'static str,
        message: String,
    },
}

/// A (re)list being collected, from `Init` to `InitDone`.
#[derive(Default)]
struct Relist {
    /// New or changed objects not passed on yet.
    objects: Vec<Object>,
    /// Their keys and resourceVersions, for [`Known`] once they are passed
    /// on (a first list records them as it passes its chunks on).
    versions: Vec<(ObjectKey, Option<u64>)>,
    /// Items listed at the version the model has.
    unchanged: usize,
}

/// Objects of a first list are passed on in chunks of this many.
const LISTING_CHUNK: usize = 1000;

/// A list's items are checked this many at a time, on a blocking thread,
/// while the watcher reads the next page.
const CHECK_BATCH: usize = 500;

fn spawn_watch<K: Watched>(
    tasks: &mut JoinSet<()>,
    resource: &'static str,
    config: watcher::Config,
    client: Client,
    out: mpsc::Sender<Update>,
    cancel: CancellationToken,
) {
    let api = Api::<RawObject<K>>::all(client);
    tasks.spawn(async move {
        let mut stream = watcher(api, config).default_backoff().boxed();
        let mut listing = Listing {
            resource,
            kind: K::KIND,
            relist: None,
            first_list: true,
            known: Known::default(),
        };
        // List items not checked yet, and the batch being checked.
        let mut unchecked: Vec<RawObject<K>> = Vec::new();
        let mut checking: Option<tokio::task::JoinHandle<Vec<Checked>>> = None;
        loop {
            let event = tokio::select! {
                _ = cancel.cancelled() => return,
                e = stream.next() => match e {
                    Some(e) => e,
                    None => return,
                },
            };
            if let Ok(Event::InitApply(raw)) = event {
                if listing.unchanged(&raw) {
                    continue;
                }
                unchecked.push(raw);
                if unchecked.len() >= CHECK_BATCH {
                    let done = checked(checking.take()).await;
                    let batch = std::mem::take(&mut unchecked);
                    checking = Some(tokio::task::spawn_blocking(|| check_all(batch)));
                    if !listing.take(done, &out).await {
                        return;
                    }
                }
                continue;
            }
            // Every list item before this event is taken in first.
            let mut done = checked(checking.take()).await;
            done.extend(check_all(std::mem::take(&mut unchecked)));
            if !listing.take(done, &out).await {
                return;
            }
            let update = match event {
                Ok(Event::Init) => {
                    listing.begin();
                    continue;
                }
                Ok(Event::InitApply(_)) => continue,
                Ok(Event::InitDone) => listing.end(),
                Ok(Event::Apply(raw)) => {
                    let checked = raw.check();
                    let version = checked.version();
                    match checked.decoded {
                        Ok(o) => {
                            listing.known.insert(o.object_ref().key, version, false);
                            Update::Applied(o)
                        }
                        Err(rejected) => rejected.update(resource),
                    }
                }
                // A delete needs the name only: the last version may well
                // be one that failed the checks.
                Ok(Event::Delete(raw)) => match raw.check().reference {
                    Ok(r) => {
                        listing.known.remove(&r.key);
                        Update::Deleted(r)
                    }
                    Err(error) => Rejection {
                        object: None,
                        error,
                    }
                    .update(resource),
                },
                Err(e) => {
                    let reason = match &e {
                        watcher::Error::WatchError(status) if status.code == 410 => "relist_410",
                        _ => "watch",
                    };
                    Update::Error {
                        resource,
                        reason,
                        message: e.to_string(),
                    }
                }
            };
            if out.send(update).await.is_err() {
                return;
            }
        }
    });
}

/// The checked batch `checking` (none: nothing).
async fn checked(checking: Option<tokio::task::JoinHandle<Vec<Checked>>>) -> Vec<Checked> {
    match checking {
        Some(handle) => match handle.await {
            Ok(done) => done,
            // `check` panics only on a bug: pass it on.
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        },
        None => Vec::new(),
    }
}

/// Checks `batch`, in order, its halves on two threads when it is large.
fn check_all<K: Watched>(batch: Vec<RawObject<K>>) -> Vec<Checked> {
    if batch.len() < CHECK_BATCH / 2 {
        return batch.into_iter().map(RawObject::check).collect();
    }
    let mut first = batch;
    let second = first.split_off(first.len() / 2);
    std::thread::scope(|scope| {
        let other = scope.spawn(|| second.into_iter().map(RawObject::check).collect::<Vec<_>>());
        let mut done: Vec<Checked> = first.into_iter().map(RawObject::check).collect();
        match other.join() {
            Ok(rest) => done.extend(rest),
            Err(panic) => std::panic::resume_unwind(panic),
        }
        done
    })
}

/// One resource's objects as the model has them, and its (re)list as the
/// checked items come in.
struct Listing {
    resource: &'static str,
    kind: ObjectKind,
    relist: Option<Relist>,
    /// Until the first list completes, its objects are passed on in
    /// chunks.
    first_list: bool,
    known: Known,
}

impl Listing {
    /// A (re)list begins (again, after an attempt that failed part way:
    /// what that one buffered was never passed on).
    fn begin(&mut self) {
        self.relist = Some(Relist::default());
        self.known.begin_list();
    }

    /// Whether a list item is the object the model has, at the same
    /// resourceVersion: it is then only marked as still there.
    fn unchanged<K: Watched>(&mut self, raw: &RawObject<K>) -> bool {
        // A first list has nothing to compare with: not even the head is
        // read.
        if self.known.is_empty() {
            return false;
        }
        let Some((r, version)) = raw.version() else {
            return false;
        };
        if !self.known.is_current(&r.key, version) {
            return false;
        }
        self.known.mark_listed(&r.key);
        if let Some(relist) = self.relist.as_mut() {
            relist.unchanged += 1;
        }
        true
    }

    /// The list ended: what changed, and what is gone.
    fn end(&mut self) -> Update {
        let Relist {
            objects,
            versions,
            unchanged,
        } = self.relist.take().unwrap_or_default();
        for (key, version) in versions {
            self.known.insert(key, version, true);
        }
        let kind = self.kind;
        let deleted = self
            .known
            .end_list()
            .into_iter()
            .map(|key| ObjectRef { kind, key })
            .collect();
        self.first_list = false;
        Update::Relisted {
            resource: self.resource,
            objects,
            deleted,
            unchanged,
        }
    }

    /// Takes in checked list items; false when `out` is gone.
    async fn take(&mut self, done: Vec<Checked>, out: &mpsc::Sender<Update>) -> bool {
        for checked in done {
            let version = checked.version();
            match (checked.decoded, self.relist.as_mut()) {
                (Ok(o), Some(r)) => {
                    let key = o.object_ref().key;
                    r.objects.push(o);
                    if !self.first_list {
                        r.versions.push((key, version));
                        continue;
                    }
                    self.known.insert(key, version, true);
                    if r.objects.len() >= LISTING_CHUNK {
                        let chunk = Update::Listing {
                            resource: self.resource,
                            objects: std::mem::take(&mut r.objects),
                        };
                        if out.send(chunk).await.is_err() {
                            return false;
                        }
                    }
                }
                (Ok(_), None) => {}
                (Err(rejected), r) => {
                    // It exists: its last good version, if any, stays.
                    if let (Some(_), Some(object)) = (r, &rejected.object) {
                        self.known.mark_listed(&object.key);
                    }
                    if out.send(rejected.update(self.resource)).await.is_err() {
                        return false;
                    }
                }
            }
        }
        true
    }
}

/// The resources watched, in the order their sync is reported.
pub const RESOURCES: [&str; 4] = ["services", "endpointslices", "nodes", "pods"];

/// Runs the watches until `cancel`; returns when the consumer goes away.
pub async fn run(
    client: Client,
    server: ApiServer,
    node_name: String,
    tx: SourceSender,
    cancel: CancellationToken,
) {
    let (updates_tx, mut updates) = mpsc::channel::<Update>(256);
    {
        let (client, server, cancel) = (client.clone(), server.clone(), cancel.clone());
        tokio::spawn(async move { cancel.run_until_cancelled(server.probe(&client)).await });
    }
    // kube-proxy's selector: objects of another proxy and headless
    // services' slices are never even listed.
    let proxied = watcher::Config::default().labels(&proxy_label_selector());
    // The watches end with `cancel`, and with this function (the set aborts
    // what is left when dropped).
    let mut watches = JoinSet::new();
    spawn_watch::<core::Service>(
        &mut watches,
        "services",
        proxied.clone(),
        client.clone(),
        updates_tx.clone(),
        cancel.clone(),
    );
    spawn_watch::<discovery::EndpointSlice>(
        &mut watches,
        "endpointslices",
        proxied,
        client.clone(),
        updates_tx.clone(),
        cancel.clone(),
    );
    spawn_watch::<core::Node>(
        &mut watches,
        "nodes",
        watcher::Config::default().fields(&format!("metadata.name={node_name}")),
        client.clone(),
        updates_tx.clone(),
        cancel.clone(),
    );
    spawn_watch::<core::Pod>(
        &mut watches,
        "pods",
        watcher::Config::default().fields(&format!("spec.nodeName={node_name}")),
        client,
        updates_tx,
        cancel.clone(),
    );

    // Resources whose watch failed and has not delivered since.
    let mut stale: BTreeSet<&'static str> = BTreeSet::new();
    let mut errors_logged = ErrorLog::default();
    let mut synced: BTreeSet<&'static str> = BTreeSet::new();
    let mut announced = false;
    loop {
        let first = tokio::select! {
            _ = cancel.cancelled() => None,
            u = updates.recv() => u,
            () = server.unknown_events.arrived.notified() => {
                // Logged as they were read; counted here.
                for _ in 0..server.unknown_events.take() {
                    let msg = SourceMessage::Rejected {
                        reason: RejectReason::Undecodable,
                    };
                    if tx.send(msg).await.is_err() {
                        return;
                    }
                }
                continue;
            }
        };
        let Some(first) = first else {
            break;
        };
        // Coalesce what is already queued into one batch.
        let mut changes = Vec::new();
        let mut next = Some(first);
        while let Some(update) = next.take() {
            let delivered = match &update {
                Update::Relisted { resource, .. }
                | Update::Listing { resource, .. }
                | Update::Rejected { resource, .. } => Some(*resource),
                Update::Applied(o) => Some(resource_of(o)),
                Update::Deleted(r) => Some(resource_of_ref(r)),
                Update::Error { .. } => None,
            };
            if let Some(resource) = delivered.filter(|r| stale.remove(r)) {
                errors_logged.recovered(resource);
                tracing::info!(resource, "watch delivering again");
                let msg = SourceMessage::ResourceStale {
                    resource,
                    stale: false,
                };
                if tx.send(msg).await.is_err() {
                    return;
                }
            }
            match update {
                Update::Listing { objects, .. } => {
                    changes.extend(objects.into_iter().map(Change::Upsert));
                }
                Update::Relisted {
                    resource,
                    objects,
                    deleted,
                    unchanged,
                } => {
                    let (changed, gone) = (objects.len(), deleted.len());
                    changes.extend(deleted.into_iter().map(Change::Delete));
                    changes.extend(objects.into_iter().map(Change::Upsert));
                    if synced.insert(resource) {
                        tracing::info!(resource, "initial list complete");
                    } else {
                        tracing::info!(resource, changed, deleted = gone, unchanged, "relisted");
                    }
                }
                Update::Applied(o) => changes.push(Change::Upsert(o)),
                Update::Deleted(r) => changes.push(Change::Delete(r)),
                Update::Rejected {
                    resource,
                    reason,
                    message,
                } => {
                    tracing::warn!(resource, reason = reason.as_str(), error = %message, "object rejected; keeping its last good version");
                    if tx.send(SourceMessage::Rejected { reason }).await.is_err() {
                        return;
                    }
                }
                Update::Error {
                    resource,
                    reason,
                    message,
                } => {
                    match errors_logged.should_warn(resource, tokio::time::Instant::now()) {
                        Some(repeated) => {
                            tracing::warn!(resource, reason, url = %server.url, error = %message, repeated, "watch error; keeping the last state and retrying with backoff")
                        }
                        None => {
                            tracing::debug!(resource, reason, url = %server.url, error = %message, "watch error; retrying with backoff")
                        }
                    }
                    if stale.insert(resource) {
                        let msg = SourceMessage::ResourceStale {
                            resource,
                            stale: true,
                        };
                        if tx.send(msg).await.is_err() {
                            return;
                        }
                    }
                    let msg = SourceMessage::WatchError {
                        resource,
                        reason,
                        message,
                    };
                    if tx.send(msg).await.is_err() {
                        return;
                    }
                }
            }
            next = updates.try_recv().ok();
        }
        if !changes.is_empty() && tx.send(SourceMessage::Changes(changes)).await.is_err() {
            return;
        }
        if !announced && synced.len() == RESOURCES.len() {
            announced = true;
            tracing::info!("kube source synced");
            if tx.send(SourceMessage::Synced).await.is_err() {
                return;
            }
        }
    }
}

/// A watch that keeps failing (an API server outage) is logged at warn
/// level on its first error and then at most once per
/// [`ERROR_LOG_INTERVAL`] with the number of errors in between (debug
/// level for those).
const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(60);

#[derive(Default)]
struct ErrorLog {
    /// Per resource: when it was last logged at warn level, and the
    /// errors since.
    last: std::collections::HashMap<&'static str, (tokio::time::Instant, u64)>,
}

impl ErrorLog {
    /// `Some(errors not logged since the last warning)` when this error is
    /// to be logged at warn level.
    fn should_warn(&mut self, resource: &'static str, now: tokio::time::Instant) -> Option<u64> {
        match self.last.get_mut(resource) {
            Some((at, quiet)) if now.duration_since(*at) < ERROR_LOG_INTERVAL => {
                *quiet += 1;
                None
            }
            Some((at, quiet)) => {
                *at = now;
                Some(std::mem::take(quiet))
            }
            None => {
                self.last.insert(resource, (now, 0));
                Some(0)
            }
        }
    }

    /// The resource delivers again: its next error is logged at once.
    fn recovered(&mut self, resource: &'static str) {
        self.last.remove(resource);
    }
}

fn resource_of(o: &Object) -> &'static str {
    match o {
        Object::Service(_) => "services",
        Object::EndpointSlice(_) => "endpointslices",
        Object::Node(_) => "nodes",
        Object::Pod(_) => "pods",
    }
}

fn resource_of_ref(r: &ObjectRef) -> &'static str {
    match r.kind {
        ObjectKind::Service => "services",
        ObjectKind::EndpointSlice => "endpointslices",
        ObjectKind::Node => "nodes",
        ObjectKind::Pod => "pods",
    }
}
