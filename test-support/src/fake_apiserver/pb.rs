//! The fake API server's protobuf encoding (asked for with `Accept:
//! application/vnd.kubernetes.protobuf`), made with the messages the
//! daemon decodes ([`proto::k8s`]): a stored object's JSON is turned into
//! its kind's message field by field, as an API server holds one object
//! and serves it in either encoding.
//!
//! An object whose JSON does not fit its message (a port given as a
//! string: nothing an API server would store, but what the tests give
//! to check that a bad object is refused alone) is served as its metadata
//! followed by field 2 (every kind's spec or endpoints) with the wrong
//! wire type: a message that does not decode, named by its metadata.

use std::collections::BTreeMap;

use prost::bytes::Bytes;
use prost::Message;
use proto::k8s as pb;
use serde_json::{Map, Value};

type R<T> = Result<T, String>;

/// The content type of a protobuf list or object.
pub const CONTENT_TYPE: &str = pb::CONTENT_TYPE;
/// The content type of a protobuf watch.
pub const WATCH_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// Whether a request's `Accept` asks for protobuf first.
pub fn wants_protobuf(accept: Option<&str>) -> bool {
    accept
        .and_then(|a| a.split(',').next())
        .map(|first| first.split(';').next().unwrap_or("").trim())
        == Some(CONTENT_TYPE)
}

/// The message of `object` (a Service, EndpointSlice, Node or Pod, as
/// JSON), not enveloped: a list's item.
pub fn object_message(kind: &str, object: &Value) -> Vec<u8> {
    match encode(kind, object) {
        Ok(bytes) => bytes,
        Err(_) => {
            // Its metadata, if that fits, then field 2 as a varint.
            let meta = object
                .get("metadata")
                .and_then(Value::as_object)
                .and_then(|m| meta(&F(m)).ok());
            let mut out = pb::ObjectHead {
                metadata: meta.map(|m| pb::MetaHead {
                    name: m.name,
                    namespace: m.namespace,
                    resource_version: m.resource_version,
                }),
            }
            .encode_to_vec();
            out.extend_from_slice(&[0x10, 0x05]);
            out
        }
    }
}

/// `object` in its envelope: a watch event's object.
pub fn enveloped_object(api_version: &str, kind: &str, object: &Value) -> Vec<u8> {
    pb::enveloped(api_version, kind, &object_message(kind, object))
}

/// A list of `items` (messages from [`object_message`]).
pub fn list(
    api_version: &str,
    list_kind: &str,
    resource_version: &str,
    continue_token: Option<&str>,
    items: &[Bytes],
) -> Vec<u8> {
    let list = pb::RawList {
        metadata: Some(pb::ListMeta {
            resource_version: Some(resource_version.to_owned()),
            r#continue: continue_token.map(str::to_owned),
            remaining_item_count: None,
        }),
        items: items.to_vec(),
    };
    pb::enveloped(api_version, list_kind, &list.encode_to_vec())
}

/// A `Status` (as [`super::status_body`] makes it in JSON), enveloped.
pub fn status(status: &Value) -> Vec<u8> {
    let s = pb::Status {
        metadata: Some(pb::ListMeta::default()),
        status: status["status"].as_str().map(str::to_owned),
        message: status["message"].as_str().map(str::to_owned),
        reason: status["reason"].as_str().map(str::to_owned),
        code: status["code"].as_i64().and_then(|c| i32::try_from(c).ok()),
    };
    pb::enveloped("v1", "Status", &s.encode_to_vec())
}

/// One watch frame: the length, then the event (`object` already
/// enveloped).
pub fn watch_frame(event_type: &str, object: Vec<u8>) -> Bytes {
    let event = pb::WatchEvent {
        r#type: Some(event_type.to_owned()),
        object: Some(pb::RawExtension {
            raw: Some(Bytes::from(object)),
        }),
    }
    .encode_to_vec();
    let mut out = u32::try_from(event.len())
        .expect("a frame under 4 GiB")
        .to_be_bytes()
        .to_vec();
    out.extend_from_slice(&event);
    Bytes::from(out)
}

/// A bookmark's object: only its resourceVersion.
pub fn bookmark(api_version: &str, kind: &str, resource_version: &str) -> Vec<u8> {
    let head = pb::ObjectHead {
        metadata: Some(pb::MetaHead {
            resource_version: Some(resource_version.to_owned()),
            ..pb::MetaHead::default()
        }),
    };
    pb::enveloped(api_version, kind, &head.encode_to_vec())
}

fn encode(kind: &str, object: &Value) -> R<Vec<u8>> {
    let o = F(object.as_object().ok_or("not an object")?);
    Ok(match kind {
        "Service" => service(&o)?.encode_to_vec(),
        "EndpointSlice" => slice(&o)?.encode_to_vec(),
        "Node" => node(&o)?.encode_to_vec(),
        "Pod" => pod(&o)?.encode_to_vec(),
        other => return Err(format!("no message for {other}")),
    })
}

/// A JSON object's fields, read strictly: a field of the wrong JSON type
/// is an error; a missing or null one is absent.
struct F<'a>(&'a Map<String, Value>);

impl<'a> F<'a> {
    fn get(&self, name: &str) -> Option<&'a Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn s(&self, name: &str) -> R<Option<String>> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(format!("{name}: {other} is not a string")),
        }
    }

    fn i32(&self, name: &str) -> R<Option<i32>> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| format!("{name}: {v} is not an int32")),
        }
    }

    fn bool(&self, name: &str) -> R<Option<bool>> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(format!("{name}: {other} is not a bool")),
        }
    }

    fn strs(&self, name: &str) -> R<Vec<String>> {
        self.list(name)?
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| format!("{name}: {v} is not a string"))
            })
            .collect()
    }

    fn list(&self, name: &str) -> R<&'a [Value]> {
        match self.get(name) {
            None => Ok(&[]),
            Some(Value::Array(a)) => Ok(a),
            Some(other) => Err(format!("{name}: {other} is not a list")),
        }
    }

    fn obj(&self, name: &str) -> R<Option<F<'a>>> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(F(m))),
            Some(other) => Err(format!("{name}: {other} is not an object")),
        }
    }

    fn objs(&self, name: &str) -> R<Vec<F<'a>>> {
        self.list(name)?
            .iter()
            .map(|v| {
                v.as_object()
                    .map(F)
                    .ok_or_else(|| format!("{name}: {v} is not an object"))
            })
            .collect()
    }

    fn map(&self, name: &str) -> R<BTreeMap<String, String>> {
        let Some(m) = self.obj(name)? else {
            return Ok(BTreeMap::new());
        };
        m.0.iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => Err(format!("{name}.{k}: {other} is not a string")),
            })
            .collect()
    }

    fn time(&self, name: &str) -> R<Option<pb::Time>> {
        self.s(name)?
            .map(|t| rfc3339(&t).ok_or_else(|| format!("{name}: {t:?} is not a time")))
            .transpose()
    }
}

/// `YYYY-MM-DDTHH:MM:SS[.frac]Z` as seconds and nanoseconds since the epoch.
fn rfc3339(t: &str) -> Option<pb::Time> {
    let t = t.strip_suffix('Z')?;
    let (date, clock) = t.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (clock, frac) = clock.split_once('.').unwrap_or((clock, ""));
    let mut c = clock.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (h, min, s) = (c.next()??, c.next()??, c.next()??);
    let nanos = if frac.is_empty() {
        0
    } else {
        let digits: String = frac.chars().chain(std::iter::repeat('0')).take(9).collect();
        digits.parse::<i32>().ok()?
    };
    // Days from the civil date (proleptic Gregorian).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(pb::Time {
        seconds: Some(days * 86_400 + h * 3600 + min * 60 + s),
        nanos: Some(nanos),
    })
}

fn meta(m: &F<'_>) -> R<pb::ObjectMeta> {
    Ok(pb::ObjectMeta {
        name: m.s("name")?,
        namespace: m.s("namespace")?,
        uid: m.s("uid")?,
        resource_version: m.s("resourceVersion")?,
        creation_timestamp: m.time("creationTimestamp")?,
        deletion_timestamp: m.time("deletionTimestamp")?,
        labels: m.map("labels")?,
        annotations: m.map("annotations")?,
    })
}

fn metadata(o: &F<'_>) -> R<Option<pb::ObjectMeta>> {
    o.obj("metadata")?.map(|m| meta(&m)).transpose()
}

fn service(o: &F<'_>) -> R<pb::Service> {
    let spec = match o.obj("spec")? {
        None => None,
        Some(s) => Some(pb::ServiceSpec {
            ports: s
                .objs("ports")?
                .iter()
                .map(|p| {
                    Ok(pb::ServicePort {
                        name: p.s("name")?,
                        protocol: p.s("protocol")?,
                        port: p.i32("port")?,
                        node_port: p.i32("nodePort")?,
                        target_port: match p.get("targetPort") {
                            None => None,
                            Some(Value::String(s)) => Some(pb::IntOrString {
                                r#type: Some(1),
                                int_val: None,
                                str_val: Some(s.clone()),
                            }),
                            Some(_) => Some(pb::IntOrString {
                                r#type: Some(0),
                                int_val: p.i32("targetPort")?,
                                str_val: None,
                            }),
                        },
                        app_protocol: p.s("appProtocol")?,
                    })
                })
                .collect::<R<_>>()?,
            cluster_ip: s.s("clusterIP")?,
            r#type: s.s("type")?,
            external_ips: s.strs("externalIPs")?,
            session_affinity: s.s("sessionAffinity")?,
            load_balancer_source_ranges: s.strs("loadBalancerSourceRanges")?,
            external_traffic_policy: s.s("externalTrafficPolicy")?,
            health_check_node_port: s.i32("healthCheckNodePort")?,
            session_affinity_config: match s.obj("sessionAffinityConfig")? {
                None => None,
                Some(c) => Some(pb::SessionAffinityConfig {
                    client_ip: match c.obj("clientIP")? {
                        None => None,
                        Some(ip) => Some(pb::ClientIpConfig {
                            timeout_seconds: ip.i32("timeoutSeconds")?,
                        }),
                    },
                }),
            },
            cluster_ips: s.strs("clusterIPs")?,
            ip_families: s.strs("ipFamilies")?,
            internal_traffic_policy: s.s("internalTrafficPolicy")?,
            traffic_distribution: s.s("trafficDistribution")?,
        }),
    };
    let status = match o.obj("status")? {
        None => None,
        Some(st) => Some(pb::ServiceStatus {
            load_balancer: match st.obj("loadBalancer")? {
                None => None,
                Some(lb) => Some(pb::LoadBalancerStatus {
                    ingress: lb
                        .objs("ingress")?
                        .iter()
                        .map(|i| {
                            Ok(pb::LoadBalancerIngress {
                                ip: i.s("ip")?,
                                ip_mode: i.s("ipMode")?,
                            })
                        })
                        .collect::<R<_>>()?,
                }),
            },
        }),
    };
    Ok(pb::Service {
        metadata: metadata(o)?,
        spec,
        status,
    })
}

fn names(o: &F<'_>, field: &str) -> R<Vec<pb::Named>> {
    o.objs(field)?
        .iter()
        .map(|n| Ok(pb::Named { name: n.s("name")? }))
        .collect()
}

fn slice(o: &F<'_>) -> R<pb::EndpointSlice> {
    let endpoints = o
        .objs("endpoints")?
        .iter()
        .map(|e| {
            Ok(pb::Endpoint {
                addresses: e.strs("addresses")?,
                conditions: match e.obj("conditions")? {
                    None => None,
                    Some(c) => Some(pb::EndpointConditions {
                        ready: c.bool("ready")?,
                        serving: c.bool("serving")?,
                        terminating: c.bool("terminating")?,
                    }),
                },
                hostname: e.s("hostname")?,
                target_ref: match e.obj("targetRef")? {
                    None => None,
                    Some(r) => Some(pb::ObjectReference {
                        kind: r.s("kind")?,
                        namespace: r.s("namespace")?,
                        name: r.s("name")?,
                        uid: r.s("uid")?,
                    }),
                },
                node_name: e.s("nodeName")?,
                zone: e.s("zone")?,
                hints: match e.obj("hints")? {
                    None => None,
                    Some(h) => Some(pb::EndpointHints {
                        for_zones: names(&h, "forZones")?,
                        for_nodes: names(&h, "forNodes")?,
                    }),
                },
            })
        })
        .collect::<R<_>>()?;
    let ports = o
        .objs("ports")?
        .iter()
        .map(|p| {
            Ok(pb::EndpointPort {
                name: p.s("name")?,
                protocol: p.s("protocol")?,
                port: p.i32("port")?,
                app_protocol: p.s("appProtocol")?,
            })
        })
        .collect::<R<_>>()?;
    Ok(pb::EndpointSlice {
        metadata: metadata(o)?,
        endpoints,
        ports,
        address_type: o.s("addressType")?,
    })
}

fn node(o: &F<'_>) -> R<pb::Node> {
    Ok(pb::Node {
        metadata: metadata(o)?,
        spec: match o.obj("spec")? {
            None => None,
            Some(s) => Some(pb::NodeSpec {
                taints: s
                    .objs("taints")?
                    .iter()
                    .map(|t| {
                        Ok(pb::Taint {
                            key: t.s("key")?,
                            effect: t.s("effect")?,
                        })
                    })
                    .collect::<R<_>>()?,
            }),
        },
        status: match o.obj("status")? {
            None => None,
            Some(s) => Some(pb::NodeStatus {
                addresses: s
                    .objs("addresses")?
                    .iter()
                    .map(|a| {
                        Ok(pb::NodeAddress {
                            r#type: a.s("type")?,
                            address: a.s("address")?,
                        })
                    })
                    .collect::<R<_>>()?,
            }),
        },
    })
}

fn pod(o: &F<'_>) -> R<pb::Pod> {
    Ok(pb::Pod {
        metadata: metadata(o)?,
        spec: match o.obj("spec")? {
            None => None,
            Some(s) => Some(pb::PodSpec {
                node_name: s.s("nodeName")?,
            }),
        },
        status: match o.obj("status")? {
            None => None,
            Some(s) => Some(pb::PodStatus {
                conditions: s
                    .objs("conditions")?
                    .iter()
                    .map(|c| {
                        Ok(pb::PodCondition {
                            r#type: c.s("type")?,
                            status: c.s("status")?,
                            last_probe_time: c.time("lastProbeTime")?,
                            last_transition_time: c.time("lastTransitionTime")?,
                            reason: c.s("reason")?,
                            message: c.s("message")?,
                        })
                    })
                    .collect::<R<_>>()?,
            }),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_seconds_since_the_epoch() {
        let t = |s: &str| rfc3339(s).map(|t| (t.seconds.unwrap(), t.nanos.unwrap()));
        assert_eq!(t("1970-01-01T00:00:00Z"), Some((0, 0)));
        assert_eq!(t("2026-11-01T00:00:00Z"), Some((1_793_491_200, 0)));
        assert_eq!(
            t("2000-02-29T12:30:05.5Z"),
            Some((951_827_405, 500_000_000))
        );
        assert_eq!(t("yesterday"), None);
    }

    #[test]
    fn accept_chooses_protobuf_when_it_comes_first() {
        assert!(wants_protobuf(Some(
            "application/vnd.kubernetes.protobuf, application/json"
        )));
        assert!(!wants_protobuf(Some("application/json")));
        assert!(!wants_protobuf(None));
    }
}
