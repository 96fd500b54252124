//! Warning Events about Services, as kube-proxy records them (for example
//! `FailedToStartServiceHealthcheck`). With `--source kube` they are posted
//! to the API server (events.k8s.io/v1, through kube-rs's recorder, which
//! folds repeats into a series); with `--source file` there is no API
//! server, so they are log lines. Either way they are also logged.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::model::ObjectKey;

/// How long posting one Event may take.
pub const POST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The component name Events carry.
pub const REPORTING_CONTROLLER: &str = "ebpf-kube-proxy";

/// The Service an Event is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceRef {
    pub key: ObjectKey,
    pub uid: String,
}

/// Where Warning Events about Services go.
#[derive(Clone)]
pub enum ServiceEvents {
    /// `--source file`: a log line only.
    Log,
    /// `--source kube`: posted to the API server too.
    Kube(Arc<Recorder>),
}

impl ServiceEvents {
    /// Events from this node's proxy, posted with `client`.
    pub fn kube(client: kube::Client, node_name: &str) -> Self {
        let reporter = Reporter {
            controller: REPORTING_CONTROLLER.to_owned(),
            instance: Some(node_name.to_owned()),
        };
        ServiceEvents::Kube(Arc::new(Recorder::new(client, reporter)))
    }

    /// Records a Warning `reason` with `note` on `service`. Posting is
    /// bounded by [`POST_TIMEOUT`]; a failure to post is logged, never
    /// fatal.
    pub async fn warning(&self, service: &ServiceRef, reason: &'static str, note: String) {
        tracing::warn!(
            service = %format!("{}/{}", service.key.namespace, service.key.name),
            reason,
            "{note}"
        );
        let ServiceEvents::Kube(recorder) = self else {
            return;
        };
        let reference = ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Service".to_owned()),
            namespace: Some(service.key.namespace.to_string()),
            name: Some(service.key.name.to_string()),
            uid: Some(service.uid.clone()).filter(|u| !u.is_empty()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: reason.to_owned(),
            note: Some(note),
            action: reason.to_owned(),
            secondary: None,
        };
        match tokio::time::timeout(POST_TIMEOUT, recorder.publish(&event, &reference)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, reason, "could not post the Event"),
            Err(_) => tracing::warn!(reason, "posting the Event timed out"),
        }
    }
}
