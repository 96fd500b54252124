//! The Kubernetes source (`--source kube`): list+watch Services,
//! EndpointSlices, this node's Node and the Pods bound to this node through
//! kube-rs watchers, and turn their events into [`SourceMessage`]s.
//!
//! Never partial: a (re)list is buffered from `Init` to `InitDone` and then
//! applied as one batch (with deletes for objects that vanished meanwhile),
//! so a dropped watch or a 410 Gone never publishes half a list. `Synced` is
//! sent once every resource has completed its first list. Watch errors are
//! retried with kube-rs' default backoff (exponential with jitter); during an
//! outage the last state keeps serving.
//!
//! Objects are read as raw JSON and checked one by one, so a bad object
//! (one the API server should have refused, or one no typed client can
//! decode) is refused alone, logged with its kind, namespace and name, and
//! keeps its last good version, also across a relist; every other object of
//! its resource keeps flowing. A delete needs only the name.
//!
//! Each object is checked as it is read off the wire, inside the watcher's
//! own decoding, and only the model's object is kept: a list page (or a
//! whole list, from a server that does not page) never holds the API
//! objects themselves (managed fields, annotations, status the proxy does
//! not read), each is dropped as soon as it is decoded.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::marker::PhantomData;
use std::path::PathBuf;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource};
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::objects::{self, Decoded, ObjectError, Project};
use super::{RejectReason, SourceMessage, SourceSender};
use crate::model::{Change, Object, ObjectKind, ObjectRef};

/// Selector kube-proxy applies to Services and EndpointSlices: objects of
/// another proxy and headless services' slices are never even listed.
pub const PROXY_LABEL_SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

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
/// overrides the server URL, as in kube-proxy.
pub async fn client(
    kubeconfig: Option<&std::path::Path>,
    master: Option<&str>,
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
    let server = ApiServer {
        url: config.cluster_url.to_string(),
        in_cluster,
    };
    let client = Client::try_from(config).map_err(|e| KubeSourceError::Client(e.to_string()))?;
    Ok((client, server))
}

/// A resource the source watches, and the kind its objects have in the
/// model.
trait Watched:
    Resource<DynamicType = ()> + Project + Clone + std::fmt::Debug + Send + Sync + 'static
{
    const KIND: ObjectKind;
}

impl Watched for core::Service {
    const KIND: ObjectKind = ObjectKind::Service;
}

impl Watched for discovery::EndpointSlice {
    const KIND: ObjectKind = ObjectKind::EndpointSlice;
}

impl Watched for core::Node {
    const KIND: ObjectKind = ObjectKind::Node;
}

impl Watched for core::Pod {
    const KIND: ObjectKind = ObjectKind::Pod;
}

/// An API object as the watcher reads it: checked as it is decoded, kept
/// as the model's object (or the reason it was refused). Decoding it never
/// fails, so one object the typed client could not read (a port given as
/// a string) cannot fail the list or the watch of every other object of
/// its resource: each is checked on its own with the checks the file
/// source uses ([`ObjectVisitor`]). `K` names the resource (URL,
/// apiVersion, kind).
#[derive(Clone, Debug)]
struct RawObject<K> {
    /// What the watcher itself reads: a watch event's resourceVersion.
    resource_version: Option<String>,
    /// The `ObjectMeta` the watcher reads it through, made on first use:
    /// an `ObjectMeta` takes some 350 bytes even when empty, and a list's
    /// items, which are never asked for theirs, are all decoded before the
    /// first is consumed (~17 MB of them for a 50k-object list).
    metadata: std::sync::OnceLock<Box<ObjectMeta>>,
    /// The object as the model has it, or why it was refused.
    decoded: Result<Object, Rejection>,
    /// Its kind, namespace and name, all a delete needs.
    reference: Result<ObjectRef, ObjectError>,
    resource: PhantomData<fn() -> K>,
}

impl<'de, K: Watched> Deserialize<'de> for RawObject<K> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_newtype_struct(RAW_VALUE, ObjectVisitor(PhantomData))
    }
}

/// The name under which serde_json hands a visitor the text of the value
/// being read (how its `RawValue` is read). Any other deserializer, or a
/// serde_json that stopped doing so, gives the value itself and the
/// object takes the general path: slower, never wrong. A test checks that
/// list items take the fast one.
const RAW_VALUE: &str = "$serde_json::private::RawValue";

/// Reads one object either way: from its text when serde_json offers it
/// (list items, and watch events whose type comes first), straight into
/// `K`; otherwise (an event buffered by serde because its object came
/// before its type) from the value. Only an object `K` refuses goes
/// through a `Value` tree, the general path that names what is wrong with
/// it: building that tree for every object was most of the cost of a
/// 50,000-object list.
struct ObjectVisitor<K>(PhantomData<fn() -> K>);

impl<'de, K: Watched> serde::de::Visitor<'de> for ObjectVisitor<K> {
    type Value = RawObject<K>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an API object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if key == RAW_VALUE && fields.is_empty() {
                let text: String = map.next_value()?;
                return RawObject::from_text(&text).map_err(serde::de::Error::custom);
            }
            fields.insert(key, map.next_value()?);
        }
        Ok(RawObject::general(serde_json::Value::Object(fields)))
    }

    fn visit_newtype_struct<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> Result<Self::Value, D::Error> {
        serde_json::Value::deserialize(d).map(RawObject::general)
    }
}

impl<K: Watched> RawObject<K> {
    /// Decoded straight into `K`; the general path when `K` refuses it.
    fn from_text(text: &str) -> serde_json::Result<Self> {
        match serde_json::from_str::<K>(text) {
            Ok(typed) => Ok(Self::typed(typed)),
            Err(_) => serde_json::from_str(text).map(Self::general),
        }
    }

    fn typed(object: K) -> Self {
        let m = object.meta();
        let resource_version = m.resource_version.clone();
        let reference = objects::object_ref_of(K::KIND, m.name.as_deref(), m.namespace.as_deref());
        let decoded = object.project().map_err(|error| Rejection {
            object: reference.clone().ok(),
            error,
        });
        RawObject {
            resource_version,
            metadata: std::sync::OnceLock::new(),
            decoded,
            reference,
            resource: PhantomData,
        }
    }

    fn general(value: serde_json::Value) -> Self {
        #[cfg(test)]
        tests::GENERAL_PATH.with(|n| n.set(n.get() + 1));
        let resource_version = value
            .pointer("/metadata/resourceVersion")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned);
        let reference = objects::object_ref(K::KIND, &value);
        RawObject {
            resource_version,
            metadata: std::sync::OnceLock::new(),
            decoded: decode::<K>(value, reference.clone().ok()),
            reference,
            resource: PhantomData,
        }
    }
}

impl<K: Resource> Resource for RawObject<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;
    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        self.metadata.get_or_init(|| {
            Box::new(ObjectMeta {
                resource_version: self.resource_version.clone(),
                ..ObjectMeta::default()
            })
        })
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.meta();
        self.metadata.get_mut().expect("meta() has just made it")
    }
}

/// An object of a watched resource that failed the checks.
#[derive(Clone, Debug)]
struct Rejection {
    /// Its kind, namespace and name, when it has them.
    object: Option<ObjectRef>,
    error: ObjectError,
}

impl Rejection {
    fn update(self, resource: &'static str) -> Update {
        let Rejection { object, error } = self;
        let object =
            object.map_or_else(|| "an object without a name".to_owned(), |r| r.to_string());
        Update::Rejected {
            resource,
            reason: error.reject_reason(),
            message: format!("{object}: {error}"),
        }
    }
}

/// Checks one object of `K` as the file source checks a manifest's
/// objects; `object` names it in a rejection.
fn decode<K: Watched>(
    mut value: serde_json::Value,
    object: Option<ObjectRef>,
) -> Result<Object, Rejection> {
    // List items come without apiVersion and kind: the collection says them.
    if let serde_json::Value::Object(fields) = &mut value {
        fields.insert("apiVersion".into(), K::api_version(&()).into());
        fields.insert("kind".into(), K::kind(&()).into());
    }
    let error = match objects::decode_object(value) {
        Ok(Decoded::Object(o)) => return Ok(*o),
        Ok(Decoded::Ignored { api_version, kind }) => ObjectError {
            field: "kind".to_owned(),
            reason: format!("{api_version} {kind} is not a kind this resource holds"),
            undecodable: true,
        },
        Err(e) => e,
    };
    Err(Rejection { object, error })
}

/// One watched resource, its events already converted to model objects.
#[derive(Debug)]
enum Update {
    /// A complete (re)list: every valid object that exists now, and the
    /// objects that exist but failed the checks (each keeps its last good
    /// version: neither deleted nor changed).
    Relisted {
        resource: &'static str,
        objects: Vec<Object>,
        kept: Vec<ObjectRef>,
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
    objects: Vec<Object>,
    kept: Vec<ObjectRef>,
}

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
        let mut relist: Option<Relist> = None;
        loop {
            let event = tokio::select! {
                _ = cancel.cancelled() => return,
                e = stream.next() => match e {
                    Some(e) => e,
                    None => return,
                },
            };
            let update = match event {
                Ok(Event::Init) => {
                    relist = Some(Relist::default());
                    continue;
                }
                Ok(Event::InitApply(raw)) => {
                    match (raw.decoded, relist.as_mut()) {
                        (Ok(o), Some(r)) => r.objects.push(o),
                        (Ok(_), None) => {}
                        (Err(rejected), r) => {
                            if let (Some(r), Some(object)) = (r, rejected.object.clone()) {
                                r.kept.push(object);
                            }
                            if out.send(rejected.update(resource)).await.is_err() {
                                return;
                            }
                        }
                    }
                    continue;
                }
                Ok(Event::InitDone) => {
                    let Relist { objects, kept } = relist.take().unwrap_or_default();
                    Update::Relisted {
                        resource,
                        objects,
                        kept,
                    }
                }
                Ok(Event::Apply(raw)) => match raw.decoded {
                    Ok(o) => Update::Applied(o),
                    Err(rejected) => rejected.update(resource),
                },
                // A delete needs the name only: the last version may well
                // be one that failed the checks.
                Ok(Event::Delete(raw)) => match raw.reference {
                    Ok(r) => Update::Deleted(r),
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
    let proxied = watcher::Config::default().labels(PROXY_LABEL_SELECTOR);
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

    // What each resource's last complete view holds, to turn a relist into
    // deletes for the objects that vanished while the watch was down.
    let mut known: BTreeMap<&'static str, BTreeSet<ObjectRef>> = BTreeMap::new();
    // Resources whose watch failed and has not delivered since.
    let mut stale: BTreeSet<&'static str> = BTreeSet::new();
    let mut synced: BTreeSet<&'static str> = BTreeSet::new();
    let mut announced = false;
    while let Some(first) = tokio::select! {
        _ = cancel.cancelled() => None,
        u = updates.recv() => u,
    } {
        // Coalesce what is already queued into one batch.
        let mut changes = Vec::new();
        let mut next = Some(first);
        while let Some(update) = next.take() {
            let delivered = match &update {
                Update::Relisted { resource, .. } | Update::Rejected { resource, .. } => {
                    Some(*resource)
                }
                Update::Applied(o) => Some(resource_of(o)),
                Update::Deleted(r) => Some(resource_of_ref(r)),
                Update::Error { .. } => None,
            };
            if let Some(resource) = delivered.filter(|r| stale.remove(r)) {
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
                Update::Relisted {
                    resource,
                    objects,
                    kept,
                } => {
                    // A rejected object still exists: it keeps its last
                    // good version, so it is not among the vanished.
                    let now: BTreeSet<ObjectRef> =
                        objects.iter().map(Object::object_ref).chain(kept).collect();
                    let before = known.remove(resource).unwrap_or_default();
                    changes.extend(before.difference(&now).cloned().map(Change::Delete));
                    known.insert(resource, now);
                    changes.extend(objects.into_iter().map(Change::Upsert));
                    if synced.insert(resource) {
                        tracing::info!(resource, "initial list complete");
                    } else {
                        tracing::info!(resource, "relisted");
                    }
                }
                Update::Applied(o) => {
                    known
                        .entry(resource_of(&o))
                        .or_default()
                        .insert(o.object_ref());
                    changes.push(Change::Upsert(o));
                }
                Update::Deleted(r) => {
                    if let Some(set) = known.get_mut(resource_of_ref(&r)) {
                        set.remove(&r);
                    }
                    changes.push(Change::Delete(r));
                }
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
                    tracing::warn!(resource, reason, url = %server.url, error = %message, "watch error; keeping the last state and retrying with backoff");
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw<K: Watched>(v: serde_json::Value) -> RawObject<K> {
        serde_json::from_str(&v.to_string()).expect("a raw object decodes from any JSON")
    }

    #[test]
    fn a_list_item_without_kind_decodes_as_its_collection_kind() {
        let item = json!({"metadata": {"name": "web", "namespace": "prod", "resourceVersion": "7"},
                          "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}});
        let raw = raw::<core::Service>(item);
        assert_eq!(raw.meta().resource_version.as_deref(), Some("7"));
        let o = raw.decoded.unwrap();
        assert_eq!(o.object_ref().to_string(), "Service prod/web");
    }

    thread_local! {
        /// Objects this thread decoded through the general path.
        pub(super) static GENERAL_PATH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// The watcher reads objects inside a list and inside watch events,
    /// whichever of an event's type and object comes first. List items and
    /// events whose type comes first are read from their text straight
    /// into the typed object; either way the object is the one the general
    /// path makes.
    #[test]
    fn list_items_and_watch_events_decode_as_the_general_path_does() {
        let item = json!({"metadata": {"name": "web", "namespace": "prod", "resourceVersion": "7"},
                          "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}});
        let general = RawObject::<core::Service>::general(item.clone());
        assert!(general.decoded.is_ok());
        let same = |raw: &RawObject<core::Service>, what: &str| {
            assert_eq!(raw.meta(), general.meta(), "{what}");
            assert_eq!(raw.reference, general.reference, "{what}");
            assert_eq!(
                raw.decoded.as_ref().ok(),
                general.decoded.as_ref().ok(),
                "{what}"
            );
        };
        let general_after = |f: &dyn Fn()| {
            GENERAL_PATH.with(|n| n.set(0));
            f();
            GENERAL_PATH.with(|n| n.get())
        };

        let list = json!({"apiVersion": "v1", "kind": "ServiceList",
                          "metadata": {"resourceVersion": "9"}, "items": [item.clone(), item.clone()]})
        .to_string();
        let n = general_after(&|| {
            let list: kube::core::ObjectList<RawObject<core::Service>> =
                serde_json::from_slice(list.as_bytes()).expect("the list decodes");
            list.items.iter().for_each(|raw| same(raw, "list item"));
        });
        assert_eq!(n, 0, "list items took the general path");

        for (text, fast) in [
            (format!(r#"{{"type":"ADDED","object":{item}}}"#), true),
            (format!(r#"{{"object":{item},"type":"ADDED"}}"#), false),
        ] {
            let n = general_after(&|| {
                let event: kube::core::WatchEvent<RawObject<core::Service>> =
                    serde_json::from_slice(text.as_bytes()).expect("the event decodes");
                let kube::core::WatchEvent::Added(raw) = event else {
                    panic!("{text}: not an ADDED event");
                };
                same(&raw, &text);
            });
            assert_eq!(n == 0, fast, "{text}: general path taken {n} times");
        }
    }

    #[test]
    fn a_rejected_object_is_named_in_its_message() {
        let cases = [
            (
                json!({"metadata": {"name": "bad"}, "spec": {"ports": [{"port": "eighty"}]}}),
                RejectReason::Undecodable,
                "Service default/bad: object: ",
            ),
            (
                json!({"metadata": {"name": "bad"}, "spec": {"ports": "x"}}),
                RejectReason::Undecodable,
                "Service default/bad: object: ",
            ),
            (
                json!({"metadata": {"name": "bad", "namespace": "p"}, "spec": {"ports": [{"port": 70000}]}}),
                RejectReason::InvalidObject,
                "Service p/bad: spec.ports[0].port: 70000 is not a valid port number",
            ),
            (
                json!({"metadata": {"name": 5}, "spec": {}}),
                RejectReason::Undecodable,
                "an object without a name: object: ",
            ),
            (
                json!("not an object"),
                RejectReason::InvalidObject,
                "an object without a name: ",
            ),
        ];
        for (v, want_reason, want_message) in cases {
            let rejected = raw::<core::Service>(v.clone()).decoded.unwrap_err();
            let Update::Rejected {
                reason, message, ..
            } = rejected.update("services")
            else {
                panic!("{v}: not a rejection");
            };
            assert_eq!(reason, want_reason, "{v}: {message}");
            assert!(message.starts_with(want_message), "{v}: {message}");
        }
    }
}
