//! Client side of the PodInfo API: `ebpf-kube-proxy podinfo list|get|watch`
//! over the unix socket, printed as text or in the proto3 JSON mapping.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use clap::{Args, Subcommand};
use proto::podinfo::v1alpha1 as pb;
use proto::podinfo::v1alpha1::pod_info_service_client::PodInfoServiceClient;
use tonic::transport::Channel;

use crate::gofmt::rfc3339_seconds;
use crate::grpc_unix::{self, MAX_MESSAGE_BYTES};
use crate::model::ObjectKey;

/// `-o` of the podinfo commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// One line per pod.
    Text,
    /// The response message in the proto3 JSON mapping, one per line.
    Json,
}

const EXIT_STATUS: &str = "\
Exit status: 0; 1 when the socket cannot be reached or the server answers
with an error (its gRPC code and message are printed), e.g. NotFound for a
pod not on this node, InvalidArgument for a name no pod can have,
ResourceExhausted when the per-client rate limit (--podinfo-qps/-burst of
the daemon) is hit.";

#[derive(Debug, Subcommand)]
pub enum PodInfoCommand {
    /// Print the pods of this node with their conditions.
    #[command(after_long_help = list_help())]
    List(PodInfoArgs),
    /// Print one pod, by NAMESPACE/NAME or --uid.
    #[command(after_long_help = get_help())]
    Get(PodInfoGetArgs),
    /// Print the pod list, then again after every change.
    #[command(after_long_help = watch_help())]
    Watch(PodInfoArgs),
}

fn list_help() -> String {
    format!("Examples:\n  ebpf-kube-proxy podinfo list\n  ebpf-kube-proxy podinfo list -o json --target unix:/run/ebpf-kube-proxy/podinfo.sock\n\n{EXIT_STATUS}")
}

fn get_help() -> String {
    format!("Examples:\n  ebpf-kube-proxy podinfo get kube-system/etcd-node-1\n  ebpf-kube-proxy podinfo get --uid 6f1c0a4e-1b2c-4d5e-8f90-123456789abc -o json\n\n{EXIT_STATUS}")
}

fn watch_help() -> String {
    format!("Examples:\n  ebpf-kube-proxy podinfo watch -o json\n\n{EXIT_STATUS}")
}

#[derive(Clone, Debug, Args)]
pub struct PodInfoArgs {
    /// PodInfo API socket: unix:PATH or PATH (the same flag as the
    /// localnet commands' `--target`; `--socket` is its older name)
    /// [default: the daemon's --podinfo-socket].
    #[arg(
        long = "target",
        visible_alias = "socket",
        value_name = "unix:PATH",
        value_parser = unix_socket_path
    )]
    pub socket: Option<PathBuf>,

    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// `unix:PATH` or a bare PATH: PodInfo listens on a unix socket only.
fn unix_socket_path(s: &str) -> Result<PathBuf, String> {
    match s.strip_prefix("unix:").unwrap_or(s) {
        "" => Err("a socket path is required".to_owned()),
        p if s.starts_with("unix:") || !s.contains("://") => Ok(PathBuf::from(p)),
        _ => Err(format!(
            "{s:?}: the PodInfo API is on a unix socket: give unix:PATH"
        )),
    }
}

#[derive(Clone, Debug, Args)]
pub struct PodInfoGetArgs {
    /// The pod.
    #[arg(value_name = "NAMESPACE/NAME", value_parser = parse_pod_key, required_unless_present = "uid")]
    pub pod: Option<ObjectKey>,

    /// The pod's UID; with NAMESPACE/NAME, both must match.
    #[arg(long, value_name = "UID")]
    pub uid: Option<String>,

    #[command(flatten)]
    pub client: PodInfoArgs,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// `reason` holds the whole cause chain (tonic's transport error alone
    /// says only "transport error").
    #[error("connecting to {}: {reason}", path.display())]
    Connect { path: PathBuf, reason: String },
    #[error("no PodInfo socket: --podinfo-socket is empty; give --target unix:PATH")]
    NoSocket,
    /// Not a `source`: code and message are the whole story, and the
    /// status's own Display would repeat them.
    #[error("{:?}: {}", .0.code(), .0.message())]
    Status(tonic::Status),
    #[error("encoding the answer: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("writing to stdout: {0}")]
    Write(#[from] std::io::Error),
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        ClientError::Status(s)
    }
}

/// `NAMESPACE/NAME` as given on the command line.
pub fn parse_pod_key(s: &str) -> Result<ObjectKey, String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok(ObjectKey::new(ns, name))
        }
        _ => Err(format!("{s:?} is not NAMESPACE/NAME")),
    }
}

/// Opens a channel to the socket at `path`.
pub async fn connect(path: &Path) -> Result<PodInfoServiceClient<Channel>, ClientError> {
    let channel = grpc_unix::channel(path).await.map_err(|e| {
        let mut reason = e.to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            // Some layers already print their cause.
            let text = c.to_string();
            if !reason.ends_with(&text) {
                reason = format!("{reason}: {text}");
            }
            cause = c.source();
        }
        ClientError::Connect {
            path: path.to_owned(),
            reason,
        }
    })?;
    Ok(PodInfoServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES))
}

fn time(t: &pbjson_types::Timestamp) -> String {
    // metav1.Time has seconds precision; times before 1970 do not occur.
    let secs = u64::try_from(t.seconds).unwrap_or_default();
    rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs))
}

fn status_name(c: &pb::PodCondition) -> &'static str {
    match c.status() {
        pb::ConditionStatus::True => "True",
        pb::ConditionStatus::False => "False",
        pb::ConditionStatus::Unknown => "Unknown",
        pb::ConditionStatus::Unspecified => "Unspecified",
    }
}

/// `NS/NAME uid=U [static] [deleting=T] Type=Status(Reason)…`; the reason
/// is shown where it explains a condition that is not True.
pub fn pod_line(p: &pb::PodInfo) -> String {
    let mut line = format!("{}/{} uid={}", p.pod_namespace, p.pod_name, p.pod_uid);
    if p.static_pod {
        line.push_str(" static");
    }
    if let Some(t) = &p.deletion_timestamp {
        line.push_str(&format!(" deleting={}", time(t)));
    }
    for c in &p.conditions {
        line.push_str(&format!(" {}={}", c.r#type, status_name(c)));
        if c.status() != pb::ConditionStatus::True && !c.reason.is_empty() {
            line.push_str(&format!("({})", c.reason));
        }
    }
    line.push('\n');
    line
}

/// A header with the revision, then one line per pod.
pub fn list_text(revision: u64, pods: &[pb::PodInfo]) -> String {
    let mut out = format!("# podinfo revision={revision} pods={}\n", pods.len());
    out.extend(pods.iter().map(pod_line));
    out
}

fn json(message: &impl serde::Serialize) -> Result<String, ClientError> {
    Ok(serde_json::to_string(message)? + "\n")
}

fn print(text: &str) -> Result<(), ClientError> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// Runs one `podinfo` subcommand against `--target`, else the socket the
/// daemon is told to listen on (`daemon_socket`, its `--podinfo-socket`).
pub async fn run(command: PodInfoCommand, daemon_socket: &str) -> Result<(), ClientError> {
    let given = match &command {
        PodInfoCommand::List(a) | PodInfoCommand::Watch(a) => &a.socket,
        PodInfoCommand::Get(g) => &g.client.socket,
    };
    let socket = match (given, daemon_socket.trim()) {
        (Some(path), _) => path.clone(),
        (None, "") => return Err(ClientError::NoSocket),
        (None, path) => PathBuf::from(path),
    };
    match command {
        PodInfoCommand::List(args) => list(&args, &socket).await,
        PodInfoCommand::Get(args) => get(&args, &socket).await,
        PodInfoCommand::Watch(args) => watch(&args, &socket).await,
    }
}

async fn list(args: &PodInfoArgs, socket: &Path) -> Result<(), ClientError> {
    let mut c = connect(socket).await?;
    let r = c
        .list_pod_conditions(pb::ListPodConditionsRequest {})
        .await?
        .into_inner();
    print(&match args.output {
        OutputFormat::Text => list_text(r.revision, &r.pods),
        OutputFormat::Json => json(&r)?,
    })
}

async fn get(args: &PodInfoGetArgs, socket: &Path) -> Result<(), ClientError> {
    let mut c = connect(socket).await?;
    let (pod_namespace, pod_name) = match &args.pod {
        Some(ObjectKey { namespace, name }) => (namespace.to_string(), name.to_string()),
        None => Default::default(),
    };
    let r = c
        .get_pod_conditions(pb::GetPodConditionsRequest {
            pod_uid: args.uid.clone().unwrap_or_default(),
            pod_namespace,
            pod_name,
        })
        .await?
        .into_inner();
    print(&match (args.client.output, &r.pod) {
        (OutputFormat::Text, Some(p)) => pod_line(p),
        (OutputFormat::Text, None) => String::new(),
        (OutputFormat::Json, _) => json(&r)?,
    })
}

/// Prints every list until interrupted; reconnects after errors (a
/// restarted daemon, a dropped slow stream) with backoff.
async fn watch(args: &PodInfoArgs, socket: &Path) -> Result<(), ClientError> {
    let mut backoff = Duration::from_millis(200);
    loop {
        let attempt = async {
            let mut c = connect(socket).await?;
            let mut stream = c
                .watch_pod_conditions(pb::WatchPodConditionsRequest {})
                .await?
                .into_inner();
            while let Some(r) = stream.message().await? {
                print(&match args.output {
                    OutputFormat::Text => list_text(r.revision, &r.pods),
                    OutputFormat::Json => json(&r)?,
                })?;
            }
            Ok::<(), ClientError>(())
        }
        .await;
        match attempt {
            // Output errors (a closed pipe) end the command.
            Err(e @ (ClientError::Write(_) | ClientError::Encode(_))) => return Err(e),
            Ok(()) => tracing::warn!(retry_in = ?backoff, "podinfo watch ended by the server"),
            Err(e) => tracing::warn!(error = %e, retry_in = ?backoff, "podinfo watch interrupted"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_keys_parse_as_namespace_slash_name() {
        assert_eq!(parse_pod_key("ns/p"), Ok(ObjectKey::new("ns", "p")));
        for bad in ["p", "/p", "ns/", "a/b/c"] {
            assert!(parse_pod_key(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_socket_is_named_like_the_localnet_target() {
        assert_eq!(
            unix_socket_path("unix:/run/p.sock"),
            Ok("/run/p.sock".into())
        );
        assert_eq!(unix_socket_path("/run/p.sock"), Ok("/run/p.sock".into()));
        assert!(unix_socket_path("unix:").is_err());
        assert!(unix_socket_path("http://127.0.0.1:1").is_err());
    }

    #[test]
    fn text_shows_conditions_in_order_with_reasons_for_the_unhappy_ones() {
        let cond = |t: &str, s: pb::ConditionStatus, reason: &str| pb::PodCondition {
            r#type: t.to_owned(),
            status: s.into(),
            reason: reason.to_owned(),
            ..Default::default()
        };
        let p = pb::PodInfo {
            pod_uid: "u1".to_owned(),
            pod_namespace: "kube-system".to_owned(),
            pod_name: "etcd-n1".to_owned(),
            static_pod: true,
            conditions: vec![
                cond("PodScheduled", pb::ConditionStatus::True, "Ignored"),
                cond("Ready", pb::ConditionStatus::False, "ContainersNotReady"),
            ],
            deletion_timestamp: Some(pbjson_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 0,
            }),
        };
        assert_eq!(
            list_text(7, &[p]),
            "# podinfo revision=7 pods=1\n\
             kube-system/etcd-n1 uid=u1 static deleting=2023-11-14T22:13:20Z PodScheduled=True Ready=False(ContainersNotReady)\n"
        );
    }
}
