//! Log set-up: kube-proxy's `--logging-format text|json` and `-v` levels.
//!
//! `json` writes one JSON object per line, as Kubernetes components' JSON
//! logging does: `ts` (Unix seconds, fractional), `level`, `msg`, then the
//! event's fields as keys of their own. Hand-written as a small
//! `FormatEvent`: tracing-subscriber's JSON formatter nests the message and
//! fields under `fields` and names the time `timestamp`.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// `--logging-format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LoggingFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line: ts, level, msg, fields.
    Json,
}

/// Off unless `RUST_LOG` names `kube_client`: kube-rs' HTTP trace layer writes an error
/// line for every failed request (each watcher's retry during an API
/// server outage); the kube source logs the same failures, with their
/// cause, at most once a minute per resource.
const QUIET: &str = "kube_client::client::builder=off";

/// Installs the global subscriber. klog-style levels: `-v` 0–2 info, 3–4
/// debug, 5+ trace; `RUST_LOG` wins.
pub fn init(verbosity: u8, format: LoggingFormat) {
    let level = match verbosity {
        0..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    };
    let from_env = std::env::var("RUST_LOG")
        .ok()
        .filter(|spec| !spec.trim().is_empty())
        .and_then(|spec| {
            let spec = if spec.contains("kube_client") {
                spec
            } else {
                format!("{spec},{QUIET}")
            };
            EnvFilter::try_new(spec).ok()
        });
    let filter =
        from_env.unwrap_or_else(|| EnvFilter::new(format!("warn,{QUIET},ebpf_kube_proxy={level}")));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LoggingFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_target(false)
            .init(),
        LoggingFormat::Json => builder.event_format(JsonLines).init(),
    }
}

/// The `json` line format.
struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        writeln!(writer, "{}", json_line(event, unix_now()))
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// One event as a JSON object.
fn json_line(event: &Event<'_>, ts: f64) -> Value {
    let mut fields = Fields(Map::new());
    event.record(&mut fields);
    let mut line = Map::new();
    line.insert("ts".to_owned(), ts.into());
    line.insert(
        "level".to_owned(),
        event.metadata().level().as_str().to_lowercase().into(),
    );
    let msg = fields
        .0
        .remove("message")
        .unwrap_or(Value::String(String::new()));
    line.insert("msg".to_owned(), msg);
    line.extend(fields.0);
    Value::Object(line)
}

/// Collects an event's fields; numbers and booleans stay JSON numbers and
/// booleans, the rest are their `Display`/`Debug` text.
struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_owned(), format!("{value:?}").into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), value.into());
    }
}
