//! `/statusz` (SPEC §1) and `/flagz` (SPEC §2) bodies: the text pages with
//! their delimiter, the structured `Statusz`/`Flagz` kinds in JSON and
//! YAML, and the 406 `Status`. Pure: the delimiter is a parameter.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::negotiate::{not_acceptable_message, Structured, Version};
use crate::flagz::FlagValue;
use crate::gofmt::{go_unix_date, html_escape, rfc3339_seconds, uptime};

/// Component name on every page.
pub const COMPONENT: &str = "ebpf-kube-proxy";

const WARNING: &str = "Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only.";

/// Delimiters a text page draws from (upstream's anti-scraping measure).
pub const DELIMITERS: [&str; 4] = [":", ": ", "=", " "];

/// One of [`DELIMITERS`], drawn at random.
pub fn random_delimiter() -> &'static str {
    // Without an OS RNG every page uses the first one; still a valid page.
    let i = getrandom::u32().unwrap_or(0) as usize % DELIMITERS.len();
    DELIMITERS[i]
}

/// The kinds served with content negotiation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Page {
    Statusz,
    Flagz,
}

impl Page {
    /// The structured kind (`as=` parameter).
    pub fn kind(self) -> &'static str {
        match self {
            Page::Statusz => "Statusz",
            Page::Flagz => "Flagz",
        }
    }

    fn endpoint(self) -> &'static str {
        match self {
            Page::Statusz => "statusz",
            Page::Flagz => "flagz",
        }
    }

    /// `Warning` header value of a deprecated version.
    pub fn deprecation_warning(self) -> String {
        format!(
            "299 - \"This version of the {} endpoint is deprecated. Please use a newer version.\"",
            self.endpoint()
        )
    }
}

/// What statusz reports.
#[derive(Clone, Debug)]
pub struct StatuszInfo {
    pub started: SystemTime,
    pub uptime: Duration,
    pub rust_version: String,
    pub binary_version: String,
    pub emulation_version: Option<String>,
    /// Top-level paths of the status server, sorted.
    pub paths: Vec<String>,
}

/// The text page, byte-exact as SPEC §1.2.
pub fn statusz_text(info: &StatuszInfo, delimiter: &str) -> String {
    let line = |label: &str, value: &str| format!("{label}{delimiter} {}\n", html_escape(value));
    let mut out = format!("\n{COMPONENT} statusz\n{WARNING}\n\n");
    out.push_str(&line("Started", &go_unix_date(info.started)));
    out.push_str(&line("Up", &uptime(info.uptime)));
    out.push_str(&line("Rust version", &info.rust_version));
    out.push_str(&line("Binary version", &info.binary_version));
    match &info.emulation_version {
        Some(v) => out.push_str(&line("Emulation version", v)),
        None => out.push('\n'),
    }
    if info.paths.is_empty() {
        out.push('\n');
    } else {
        out.push_str(&line("Paths", &info.paths.join(" ")));
    }
    out
}

#[derive(Serialize)]
struct Metadata {
    name: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatuszDoc<'a> {
    kind: &'static str,
    api_version: String,
    metadata: Metadata,
    start_time: String,
    uptime_seconds: u64,
    binary_version: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    emulation_version: Option<&'a str>,
    paths: &'a [String],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FlagzDoc<'a> {
    kind: &'static str,
    api_version: String,
    metadata: Metadata,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    flags: BTreeMap<&'a str, &'a str>,
}

/// Compact JSON plus one newline, or block-style YAML.
fn encode<T: Serialize>(doc: &T, format: Structured) -> String {
    let encoded = match format {
        Structured::Json => serde_json::to_string(doc)
            .map(|s| s + "\n")
            .map_err(|e| e.to_string()),
        Structured::Yaml => crate::yaml::to_string(doc).map_err(|e| e.to_string()),
    };
    // The documents hold only strings, integers and maps of strings, which
    // both encoders always accept.
    encoded.unwrap_or_else(|e| {
        tracing::error!(error = %e, "encoding a status document failed");
        String::new()
    })
}

/// The `Statusz` kind.
pub fn statusz_structured(info: &StatuszInfo, format: Structured, version: Version) -> String {
    let doc = StatuszDoc {
        kind: Page::Statusz.kind(),
        api_version: version.api_version(),
        metadata: Metadata { name: COMPONENT },
        start_time: rfc3339_seconds(info.started),
        uptime_seconds: info.uptime.as_secs(),
        binary_version: &info.binary_version,
        emulation_version: info.emulation_version.as_deref(),
        paths: &info.paths,
    };
    encode(&doc, format)
}

/// The text page, byte-exact as SPEC §2.2 (no space after the delimiter).
pub fn flagz_text(flags: &[FlagValue], delimiter: &str) -> String {
    let mut out = format!("\n{COMPONENT} flagz\n{WARNING}\n");
    for (name, value) in flags {
        out.push_str(&format!("{name}{delimiter}{value}\n"));
    }
    out
}

/// The `Flagz` kind.
pub fn flagz_structured(flags: &[FlagValue], format: Structured, version: Version) -> String {
    let doc = FlagzDoc {
        kind: Page::Flagz.kind(),
        api_version: version.api_version(),
        metadata: Metadata { name: COMPONENT },
        flags: flags
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect(),
    };
    encode(&doc, format)
}

#[derive(Serialize)]
struct Status {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: BTreeMap<String, String>,
    status: &'static str,
    message: String,
    reason: &'static str,
    code: u16,
}

/// The 406 `metav1.Status` body.
pub fn not_acceptable_body(page: Page) -> String {
    let status = Status {
        kind: "Status",
        api_version: "v1",
        metadata: BTreeMap::new(),
        status: "Failure",
        message: not_acceptable_message(page.kind()),
        reason: "NotAcceptable",
        code: 406,
    };
    encode(&status, Structured::Json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn info() -> StatuszInfo {
        StatuszInfo {
            started: UNIX_EPOCH + Duration::from_secs(1_725_603_591),
            uptime: Duration::from_secs(30),
            rust_version: "rustc 1.83.0".to_owned(),
            binary_version: "0.1.0".to_owned(),
            emulation_version: None,
            paths: [
                "/flagz",
                "/healthz",
                "/livez",
                "/metrics",
                "/proxyMode",
                "/readyz",
                "/statusz",
            ]
            .map(String::from)
            .to_vec(),
        }
    }

    #[test]
    fn statusz_text_is_byte_exact_with_colon() {
        assert_eq!(
            statusz_text(&info(), ":"),
            "\nebpf-kube-proxy statusz\n\
             Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only.\n\
             \n\
             Started: Fri Sep  6 06:19:51 UTC 2024\n\
             Up: 0 hr 00 min 30 sec\n\
             Rust version: rustc 1.83.0\n\
             Binary version: 0.1.0\n\
             \n\
             Paths: /flagz /healthz /livez /metrics /proxyMode /readyz /statusz\n"
        );
    }

    #[test]
    fn statusz_values_are_html_escaped_and_slots_optional() {
        let mut i = info();
        i.binary_version = "0.1.0+<dirty>".to_owned();
        i.emulation_version = Some("1.33".to_owned());
        i.paths.clear();
        let text = statusz_text(&i, "=");
        assert!(
            text.contains("Binary version= 0.1.0+&lt;dirty&gt;\nEmulation version= 1.33\n\n"),
            "{text}"
        );
        assert!(text.ends_with("1.33\n\n"), "{text}");
    }

    #[test]
    fn statusz_json_has_spec_keys_in_order() {
        assert_eq!(
            statusz_structured(&info(), Structured::Json, Version::V1Beta1),
            "{\"kind\":\"Statusz\",\"apiVersion\":\"config.k8s.io/v1beta1\",\"metadata\":{\"name\":\"ebpf-kube-proxy\"},\
             \"startTime\":\"2024-09-06T06:19:51Z\",\"uptimeSeconds\":30,\"binaryVersion\":\"0.1.0\",\
             \"paths\":[\"/flagz\",\"/healthz\",\"/livez\",\"/metrics\",\"/proxyMode\",\"/readyz\",\"/statusz\"]}\n"
        );
        let mut i = info();
        i.paths.clear();
        let json = statusz_structured(&i, Structured::Json, Version::V1Alpha1);
        assert!(
            json.contains("\"apiVersion\":\"config.k8s.io/v1alpha1\""),
            "{json}"
        );
        assert!(json.ends_with("\"paths\":[]}\n"), "{json}");
    }

    #[test]
    fn statusz_yaml_is_block_style() {
        let yaml = statusz_structured(&info(), Structured::Yaml, Version::V1Beta1);
        assert!(
            yaml.starts_with("kind: Statusz\napiVersion: config.k8s.io/v1beta1\nmetadata:\n  name: ebpf-kube-proxy\nstartTime:"),
            "{yaml}"
        );
        assert!(yaml.contains("paths:\n- /flagz\n"), "{yaml}");
    }

    fn flags() -> Vec<FlagValue> {
        [
            ("cluster-cidr", "10.244.0.0/16"),
            ("healthz-bind-address", "0.0.0.0:10256"),
            ("kubeconfig", ""),
            ("nodeport-addresses", "[]"),
            ("proxy-mode", "auto"),
            ("sync-period", "30s"),
            ("v", "2"),
        ]
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .to_vec()
    }

    #[test]
    fn flagz_text_is_byte_exact() {
        assert_eq!(
            flagz_text(&flags(), "="),
            "\nebpf-kube-proxy flagz\n\
             Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only.\n\
             cluster-cidr=10.244.0.0/16\n\
             healthz-bind-address=0.0.0.0:10256\n\
             kubeconfig=\n\
             nodeport-addresses=[]\n\
             proxy-mode=auto\n\
             sync-period=30s\n\
             v=2\n"
        );
        assert!(flagz_text(&flags(), ": ").contains("\nv: 2\n"));
    }

    #[test]
    fn flagz_structured_forms() {
        let json = flagz_structured(&flags()[4..], Structured::Json, Version::V1Beta1);
        assert_eq!(
            json,
            "{\"kind\":\"Flagz\",\"apiVersion\":\"config.k8s.io/v1beta1\",\"metadata\":{\"name\":\"ebpf-kube-proxy\"},\
             \"flags\":{\"proxy-mode\":\"auto\",\"sync-period\":\"30s\",\"v\":\"2\"}}\n"
        );
        let yaml = flagz_structured(&flags()[5..], Structured::Yaml, Version::V1Alpha1);
        assert_eq!(
            yaml,
            "kind: Flagz\napiVersion: config.k8s.io/v1alpha1\nmetadata:\n  name: ebpf-kube-proxy\nflags:\n  sync-period: 30s\n  v: \"2\"\n"
        );
    }

    #[test]
    fn not_acceptable_status() {
        assert_eq!(
            not_acceptable_body(Page::Statusz),
            "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\
             \"message\":\"only the following media types are accepted: text/plain, \
             application/json;g=config.k8s.io;v=v1beta1;as=Statusz, application/json;g=config.k8s.io;v=v1alpha1;as=Statusz, \
             application/yaml;g=config.k8s.io;v=v1beta1;as=Statusz, application/yaml;g=config.k8s.io;v=v1alpha1;as=Statusz\",\
             \"reason\":\"NotAcceptable\",\"code\":406}\n"
        );
        assert_eq!(
            Page::Flagz.deprecation_warning(),
            "299 - \"This version of the flagz endpoint is deprecated. Please use a newer version.\""
        );
    }
}
