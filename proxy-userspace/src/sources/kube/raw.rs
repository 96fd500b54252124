//! API objects as the watchers read them ([`RawObject`]): their text,
//! when serde_json offers it, or their protobuf message (carried in the
//! JSON as [`super::pb_body`] writes it), checked later
//! ([`RawObject::check`]) and kept as the model's object or the reason it
//! was refused.

use std::borrow::Cow;

use bytes::Bytes;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::Deserialize;

use super::super::objects::{self, Decoded, ObjectError, Project};
use super::super::wire::Text;
use super::pb::{self as pbwire, FromPb};
use super::{known, pb_body, Update};
use crate::model::{Object, ObjectKind, ObjectRef};

/// A resource the source watches, and the kind its objects have in the
/// model.
pub(super) trait Watched:
    Resource<DynamicType = ()> + Project + FromPb + Clone + std::fmt::Debug + Send + Sync + 'static
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

/// An API object as the watcher reads it: its text, or (when serde
/// handed over a value instead of text) the checked object. Reading it
/// never fails, so one object the typed client could not read (a port
/// given as a string) cannot fail the list or the watch of every other
/// object of its resource: each is checked on its own, with the checks the
/// file source uses ([`RawObject::check`]). A list's items are checked
/// off the watcher's task, a batch at a time, while it reads the next
/// page. `K` names the resource (URL, apiVersion, kind).
#[derive(Clone, Debug)]
pub(super) struct RawObject<K> {
    content: Content,
    /// The `ObjectMeta` the watcher reads a watch event's resourceVersion
    /// through, made on first use: an `ObjectMeta` takes some 350 bytes
    /// even when empty, and a list's items are never asked for theirs.
    metadata: std::sync::OnceLock<Box<ObjectMeta>>,
    resource: PhantomData<fn() -> K>,
}

#[derive(Clone, Debug)]
enum Content {
    /// The object's JSON text, not read yet.
    Text(Waiting<Box<str>>),
    /// The object's protobuf message (or an envelope holding it), not
    /// read yet.
    Proto(Waiting<Bytes>),
    Checked(Checked),
}

/// Bytes of objects' text waiting to be checked, every resource together.
static WAITING: AtomicUsize = AtomicUsize::new(0);
/// Past this many, objects are checked as they are read: a list served
/// in one piece (an API server's watch cache may ignore the page size)
/// then holds its objects' text once, as the response, not a second time
/// as items. Pages of 500 objects stay far below it.
const WAITING_MAX: usize = 8 << 20;

/// An object's text or message, counted in [`WAITING`] while it lives.
#[derive(Debug)]
struct Waiting<T: Held>(T);

/// What waits: an object's text or its protobuf message.
trait Held: Clone {
    fn size(&self) -> usize;
}

impl Held for Box<str> {
    fn size(&self) -> usize {
        self.len()
    }
}

impl Held for Bytes {
    fn size(&self) -> usize {
        self.len()
    }
}

impl<T: Held> Waiting<T> {
    /// `None` when [`WAITING_MAX`] would be passed.
    fn new(held: T) -> Result<Waiting<T>, T> {
        match WAITING.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            n.checked_add(held.size()).filter(|&m| m <= WAITING_MAX)
        }) {
            Ok(_) => Ok(Waiting(held)),
            Err(_) => Err(held),
        }
    }
}

impl<T: Held> Clone for Waiting<T> {
    fn clone(&self) -> Self {
        WAITING.fetch_add(self.0.size(), Ordering::Relaxed);
        Waiting(self.0.clone())
    }
}

impl<T: Held> Drop for Waiting<T> {
    fn drop(&mut self) {
        WAITING.fetch_sub(self.0.size(), Ordering::Relaxed);
    }
}

/// One object, checked.
#[derive(Clone, Debug)]
pub(super) struct Checked {
    resource_version: Option<String>,
    /// The object as the model has it, or why it was refused.
    pub(super) decoded: Result<Object, Rejection>,
    /// Its kind, namespace and name, all a delete needs.
    pub(super) reference: Result<ObjectRef, ObjectError>,
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
        while let Some(Text(key)) = map.next_key::<Text<'de>>()? {
            if key == RAW_VALUE && fields.is_empty() {
                // The object's own text, checked later (or now, when too
                // much text waits).
                let Text(text) = map.next_value()?;
                let content = match pb_body::object_bytes(&text) {
                    Some(Ok(bytes)) => match Waiting::new(bytes) {
                        Ok(waiting) => Content::Proto(waiting),
                        Err(bytes) => Content::Checked(RawObject::<K>::check_pb(&bytes)),
                    },
                    Some(Err(reason)) => Content::Checked(RawObject::<K>::refused_pb(
                        &[],
                        ObjectError {
                            field: "object".to_owned(),
                            reason,
                            undecodable: true,
                        },
                    )),
                    None => match Waiting::new(Box::<str>::from(&*text)) {
                        Ok(waiting) => Content::Text(waiting),
                        Err(text) => Content::Checked(RawObject::<K>::check_text(&text)),
                    },
                };
                return Ok(RawObject::new(content));
            }
            fields.insert(key.into_owned(), map.next_value()?);
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
    fn new(content: Content) -> Self {
        RawObject {
            content,
            metadata: std::sync::OnceLock::new(),
            resource: PhantomData,
        }
    }

    /// Checks the object (decoded straight into `K` from its text; the
    /// general path when `K` refuses it). Pure: any thread may run it.
    pub(super) fn check(self) -> Checked {
        match self.content {
            Content::Checked(c) => c,
            Content::Text(waiting) => Self::check_text(&waiting.0),
            Content::Proto(waiting) => Self::check_pb(&waiting.0),
        }
    }

    /// Checks an object read from protobuf: its message read
    /// ([`pbwire`]) into the wire type the JSON path reads, then checked
    /// as that is.
    fn check_pb(bytes: &Bytes) -> Checked {
        let message = match pbwire::message_of::<K>(bytes) {
            Ok(m) => m,
            Err(error) => return Self::refused_pb(&[], error),
        };
        let checked = match K::wire(&message) {
            Ok(wire) => Self::typed(wire),
            Err(error) => Self::refused_pb(&message, error),
        };
        checked
    }

    /// An object read from protobuf that failed before its checks, named
    /// by what of its head `message` holds.
    fn refused_pb(message: &[u8], error: ObjectError) -> Checked {
        let head = pbwire::head(message);
        let head = head.as_ref();
        let reference = objects::object_ref_of(
            K::KIND,
            head.and_then(|h| h.name),
            head.and_then(|h| h.namespace),
        );
        Checked {
            resource_version: head.and_then(|h| h.resource_version).map(str::to_owned),
            decoded: Err(Rejection {
                object: reference.clone().ok(),
                error,
            }),
            reference,
        }
    }

    fn check_text(text: &str) -> Checked {
        let mut de = serde_json::Deserializer::from_str(text);
        match objects::decode_wire::<K, _>(&mut de).and_then(|w| de.end().map(|()| w)) {
            Ok(wire) => Self::typed(wire),
            // serde_json handed it over as the text of one value: it reads
            // as a value.
            Err(_) => Self::checked_value(serde_json::from_str(text).unwrap_or_default()),
        }
    }

    fn typed(wire: K::Wire<'_>) -> Checked {
        let head = K::head(&wire);
        let resource_version = head.resource_version.map(str::to_owned);
        let reference = objects::object_ref_of(K::KIND, head.name, head.namespace);
        let decoded = K::project(wire).map_err(|error| Rejection {
            object: reference.clone().ok(),
            error,
        });
        Checked {
            resource_version,
            decoded,
            reference,
        }
    }

    fn general(value: serde_json::Value) -> Self {
        Self::new(Content::Checked(Self::checked_value(value)))
    }

    fn checked_value(value: serde_json::Value) -> Checked {
        #[cfg(test)]
        tests::GENERAL_PATH.with(|n| n.set(n.get() + 1));
        let resource_version = value
            .pointer("/metadata/resourceVersion")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned);
        let reference = objects::object_ref(K::KIND, &value);
        Checked {
            resource_version,
            decoded: decode::<K>(value, reference.clone().ok()),
            reference,
        }
    }
}

impl<K: Watched> RawObject<K> {
    /// The object's kind, namespace and name and its resourceVersion (as
    /// [`known::version`] compares it), read without checking the object:
    /// `None` when either is missing.
    pub(super) fn version(&self) -> Option<(ObjectRef, u64)> {
        match &self.content {
            Content::Checked(c) => Some((c.reference.clone().ok()?, c.version()?)),
            Content::Proto(waiting) => {
                let message = pbwire::message_of::<K>(&waiting.0).ok()?;
                let head = pbwire::head(&message)?;
                let rv = known::version(head.resource_version)?;
                let reference = objects::object_ref_of(K::KIND, head.name, head.namespace).ok()?;
                Some((reference, rv))
            }
            Content::Text(waiting) => {
                #[derive(Deserialize)]
                struct Object<'a> {
                    #[serde(borrow)]
                    metadata: Option<Meta<'a>>,
                }
                #[derive(Deserialize)]
                struct Meta<'a> {
                    #[serde(borrow)]
                    name: Option<Text<'a>>,
                    #[serde(borrow)]
                    namespace: Option<Text<'a>>,
                    #[serde(borrow, rename = "resourceVersion")]
                    resource_version: Option<Text<'a>>,
                }
                let meta = serde_json::from_str::<Object<'_>>(&waiting.0)
                    .ok()?
                    .metadata?;
                let rv = known::version(meta.resource_version.as_deref())?;
                let reference = objects::object_ref_of(
                    K::KIND,
                    meta.name.as_deref(),
                    meta.namespace.as_deref(),
                )
                .ok()?;
                Some((reference, rv))
            }
        }
    }
}

impl Checked {
    /// The resourceVersion, as [`known::version`] compares it.
    pub(super) fn version(&self) -> Option<u64> {
        known::version(self.resource_version.as_deref())
    }
}

/// `metadata.resourceVersion` of an object's text, read without the rest.
fn resource_version_of(text: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Object {
        metadata: Option<Meta>,
    }
    #[derive(Deserialize)]
    struct Meta {
        #[serde(rename = "resourceVersion")]
        resource_version: Option<String>,
    }
    serde_json::from_str::<Object>(text)
        .ok()?
        .metadata?
        .resource_version
}

impl<K: Watched> Resource for RawObject<K> {
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
            let resource_version = match &self.content {
                Content::Text(waiting) => resource_version_of(&waiting.0),
                Content::Proto(waiting) => pbwire::message_of::<K>(&waiting.0)
                    .ok()
                    .and_then(|m| pbwire::head(&m)?.resource_version.map(str::to_owned)),
                Content::Checked(c) => c.resource_version.clone(),
            };
            Box::new(ObjectMeta {
                resource_version,
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
pub(super) struct Rejection {
    /// Its kind, namespace and name, when it has them.
    pub(super) object: Option<ObjectRef>,
    pub(super) error: ObjectError,
}

impl Rejection {
    pub(super) fn update(self, resource: &'static str) -> Update {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::RejectReason;
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
        let o = raw.check().decoded.unwrap();
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
        let general_checked = general.clone().check();
        assert!(general_checked.decoded.is_ok());
        let same = |raw: &RawObject<core::Service>, what: &str| {
            assert_eq!(raw.meta(), general.meta(), "{what}");
            let checked = raw.clone().check();
            assert_eq!(checked.reference, general_checked.reference, "{what}");
            assert_eq!(
                checked.decoded.as_ref().ok(),
                general_checked.decoded.as_ref().ok(),
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
                "Service default/bad: spec.ports[0].port: invalid type: string \"eighty\"",
            ),
            (
                json!({"metadata": {"name": "bad"}, "spec": {"ports": "x"}}),
                RejectReason::Undecodable,
                "Service default/bad: spec.ports: invalid type: string \"x\"",
            ),
            (
                json!({"metadata": {"name": "bad", "namespace": "p"}, "spec": {"ports": [{"port": 70000}]}}),
                RejectReason::InvalidObject,
                "Service p/bad: spec.ports[0].port: 70000 is not a valid port number",
            ),
            (
                json!({"metadata": {"name": 5}, "spec": {}}),
                RejectReason::Undecodable,
                "an object without a name: metadata.name: invalid type: integer",
            ),
            (
                json!("not an object"),
                RejectReason::InvalidObject,
                "an object without a name: ",
            ),
        ];
        for (v, want_reason, want_message) in cases {
            let rejected = raw::<core::Service>(v.clone()).check().decoded.unwrap_err();
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
