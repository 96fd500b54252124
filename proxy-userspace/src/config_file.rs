//! `--config FILE`: a kube-proxy `KubeProxyConfiguration`
//! (kubeproxy.config.k8s.io/v1alpha1) merged under the command line, as
//! kube-proxy does: a flag given on the command line wins over the file.
//!
//! The file's values are written into the daemon's flags before they are
//! validated, so `/flagz` shows the effective value whatever its origin.
//! Fields that do not apply to this proxy are accepted (a kube-proxy
//! configuration must work unchanged); unknown fields are warned about;
//! invalid values are errors naming the field.

use std::path::Path;

use serde_json::Value;

use crate::config::DaemonFlags;
use crate::net::parse_cidr_list;

pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
pub const KIND: &str = "KubeProxyConfiguration";

#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("--config {file}: {reason}")]
    Read { file: String, reason: String },
    #[error("--config {file}: {field}: {reason}")]
    Field {
        file: String,
        field: String,
        reason: String,
    },
}

/// kube-proxy fields this proxy reads.
const USED: &[&str] = &[
    "apiVersion",
    "kind",
    "bindAddress",
    "masqueradeAll",
    "healthzBindAddress",
    "metricsBindAddress",
    "clusterCIDR",
    "hostnameOverride",
    "mode",
    "nodePortAddresses",
    "syncPeriod",
    "clientConnection",
    "conntrack",
];
/// kube-proxy fields accepted without effect here.
const NOT_APPLICABLE: &[&str] = &[
    "bindAddressHardFail",
    "configSyncPeriod",
    "detectLocal",
    "detectLocalMode",
    "enableProfiling",
    "featureGates",
    "iptables",
    "ipvs",
    "linux",
    "logging",
    "minSyncPeriod",
    "nftables",
    "oomScoreAdj",
    "portRange",
    "showHiddenMetricsForVersion",
    "udpIdleTimeout",
    "windows",
    "winkernel",
];

/// Whether `v` is Go's zero value as a KubeProxyConfiguration serialises it
/// (null, "", 0, false, "0s", empty, or an object of such values).
fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty() || s == "0s" || s == "0",
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.values().all(is_zero),
    }
}

/// Merges `flags.config` (when set) into `flags`; `from_command_line(id)`
/// says whether the flag with clap id `id` was given on the command line.
pub fn merge(
    flags: &mut DaemonFlags,
    from_command_line: impl Fn(&str) -> bool,
) -> Result<(), ConfigFileError> {
    let file = flags.config.trim().to_owned();
    if file.is_empty() {
        return Ok(());
    }
    let text = std::fs::read_to_string(Path::new(&file)).map_err(|e| ConfigFileError::Read {
        file: file.clone(),
        reason: e.to_string(),
    })?;
    merge_str(flags, &text, &file, from_command_line)
}

/// [`merge`] of a configuration already read: `text` is the file's content,
/// `file` its name for messages. The entry fuzz/ drives.
pub fn merge_str(
    flags: &mut DaemonFlags,
    text: &str,
    file: &str,
    from_command_line: impl Fn(&str) -> bool,
) -> Result<(), ConfigFileError> {
    let file = file.to_owned();
    let doc: Value = crate::yaml::from_str(text).map_err(|e| ConfigFileError::Read {
        file: file.clone(),
        reason: e.to_string(),
    })?;
    let field_err = |field: &str, reason: String| ConfigFileError::Field {
        file: file.clone(),
        field: field.to_owned(),
        reason,
    };
    let Value::Object(map) = &doc else {
        return Err(ConfigFileError::Read {
            file,
            reason: "not a KubeProxyConfiguration mapping".to_owned(),
        });
    };
    if map.get("apiVersion").and_then(Value::as_str) != Some(API_VERSION) {
        return Err(field_err("apiVersion", format!("must be {API_VERSION}")));
    }
    if map.get("kind").and_then(Value::as_str) != Some(KIND) {
        return Err(field_err("kind", format!("must be {KIND}")));
    }
    for (key, value) in map {
        if NOT_APPLICABLE.contains(&key.as_str()) {
            // kubeadm writes every field, mostly zero: only a value someone
            // chose is worth a warning. masqueradeAll inside a mode's
            // section is read below.
            let mut rest = value.clone();
            if let Value::Object(o) = &mut rest {
                o.remove("masqueradeAll");
            }
            if is_zero(&rest) {
                tracing::debug!(file = %file, field = %key, "KubeProxyConfiguration field does not apply to ebpf-kube-proxy; ignored");
            } else {
                tracing::warn!(file = %file, field = %key, "KubeProxyConfiguration field is set but does not apply to ebpf-kube-proxy; ignored");
            }
        } else if !USED.contains(&key.as_str()) {
            tracing::warn!(file = %file, field = %key, "unknown KubeProxyConfiguration field; ignored");
        }
    }

    let text_field = |name: &str| -> Result<Option<String>, ConfigFileError> {
        match map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(field_err(name, format!("must be a string, got {other}"))),
        }
    };

    if let Some(addr) = text_field("bindAddress")? {
        if !addr.is_empty() {
            crate::net::parse_ip_sloppy(addr.trim()).ok_or_else(|| {
                field_err("bindAddress", format!("{addr:?} is not an IP address"))
            })?;
            if !from_command_line("bind_address") {
                flags.bind_address = addr;
            }
        }
    }
    // v1alpha1 keeps masqueradeAll per mode (iptables, nftables); newer
    // configurations have it under linux or at the top. Any true asks for
    // it: this proxy has one datapath where it applies.
    let mut masquerade_all = None;
    for (section, field) in [
        (None, "masqueradeAll"),
        (Some("linux"), "linux.masqueradeAll"),
        (Some("iptables"), "iptables.masqueradeAll"),
        (Some("nftables"), "nftables.masqueradeAll"),
    ] {
        let parent = match section {
            None => Some(&doc),
            Some(s) => map.get(s),
        };
        match parent.and_then(|p| p.get("masqueradeAll")) {
            None | Some(Value::Null) => {}
            Some(Value::Bool(all)) => {
                masquerade_all = Some(masquerade_all.unwrap_or(false) || *all)
            }
            Some(other) => {
                return Err(field_err(
                    field,
                    format!("must be true or false, got {other}"),
                ))
            }
        }
    }
    if let Some(all) = masquerade_all.filter(|_| !from_command_line("masquerade_all")) {
        flags.masquerade_all = all;
    }
    for (field, id) in [
        ("healthzBindAddress", "healthz_bind_address"),
        ("metricsBindAddress", "metrics_bind_address"),
    ] {
        if let Some(v) = text_field(field)? {
            if v.is_empty() || from_command_line(id) {
                continue;
            }
            crate::net::parse_socket_addr_sloppy(&v)
                .ok_or_else(|| field_err(field, format!("{v:?} is not IP:PORT")))?;
            match id {
                "healthz_bind_address" => flags.healthz_bind_address = v,
                _ => flags.metrics_bind_address = v,
            }
        }
    }
    if let Some(v) = text_field("clusterCIDR")? {
        parse_cidr_list(&v).map_err(|r| field_err("clusterCIDR", r))?;
        if !from_command_line("cluster_cidr") {
            flags.cluster_cidr = v;
        }
    }
    if let Some(v) = text_field("hostnameOverride")? {
        if !v.is_empty() && !from_command_line("hostname_override") {
            flags.hostname_override = v;
        }
    }
    if let Some(v) = text_field("mode")? {
        use crate::datapath::ProxyMode;
        let mode = match v.as_str() {
            "" | "auto" => Some(ProxyMode::Auto),
            "ebpf" => Some(ProxyMode::Ebpf),
            "nftables" => Some(ProxyMode::Nftables),
            "none" => Some(ProxyMode::None),
            "iptables" | "ipvs" | "kernelspace" => {
                tracing::warn!(file = %file, mode = %v, "mode is a kube-proxy datapath this proxy replaces; using auto");
                Some(ProxyMode::Auto)
            }
            other => {
                return Err(field_err(
                    "mode",
                    format!("{other:?} is not one of auto, ebpf, nftables, none"),
                ))
            }
        };
        if let Some(mode) = mode.filter(|_| !from_command_line("proxy_mode")) {
            flags.proxy_mode = mode;
        }
    }
    match map.get("nodePortAddresses") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            let mut cidrs = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let field = format!("nodePortAddresses[{i}]");
                let s = item
                    .as_str()
                    .ok_or_else(|| field_err(&field, "must be a string".to_owned()))?;
                if s != "primary" {
                    parse_cidr_list(s).map_err(|r| field_err(&field, r))?;
                }
                cidrs.push(s.to_owned());
            }
            if !from_command_line("nodeport_addresses") {
                flags.nodeport_addresses = cidrs.join(",");
            }
        }
        Some(other) => {
            return Err(field_err(
                "nodePortAddresses",
                format!("must be a list, got {other}"),
            ))
        }
    }
    if let Some(v) = text_field("syncPeriod")? {
        crate::config::parse_duration(&v).map_err(|r| field_err("syncPeriod", r))?;
        if !from_command_line("sync_period") {
            flags.sync_period = v;
        }
    }
    if let Some(conntrack) = map.get("conntrack") {
        merge_conntrack(flags, conntrack, &file, &from_command_line).map_err(|(f, r)| {
            let field = if f.is_empty() {
                "conntrack".to_owned()
            } else {
                format!("conntrack.{f}")
            };
            field_err(&field, r)
        })?;
    }
    if let Some(cc) = map.get("clientConnection") {
        match cc.get("kubeconfig") {
            None | Some(Value::Null) => {}
            Some(Value::String(k)) => {
                if !k.is_empty() && !from_command_line("kubeconfig") {
                    flags.kubeconfig = k.clone();
                }
            }
            Some(other) => {
                return Err(field_err(
                    "clientConnection.kubeconfig",
                    format!("must be a string, got {other}"),
                ))
            }
        }
        match cc.get("contentType") {
            None | Some(Value::Null) => {}
            Some(Value::String(t)) if t.is_empty() => {}
            Some(Value::String(t)) => {
                if crate::config::KubeContentType::parse(t).is_none() {
                    return Err(field_err(
                        "clientConnection.contentType",
                        format!(
                            "{t:?} is not application/vnd.kubernetes.protobuf or application/json"
                        ),
                    ));
                }
                if !from_command_line("kube_api_content_type") {
                    flags.kube_api_content_type = t.clone();
                }
            }
            Some(other) => {
                return Err(field_err(
                    "clientConnection.contentType",
                    format!("must be a string, got {other}"),
                ))
            }
        }
    }
    Ok(())
}

/// `conntrack` (KubeProxyConntrackConfiguration) onto the `--conntrack-*`
/// flags not given on the command line; `Err((field, reason))`.
fn merge_conntrack(
    flags: &mut DaemonFlags,
    conntrack: &Value,
    file: &str,
    from_command_line: &impl Fn(&str) -> bool,
) -> Result<(), (String, String)> {
    let map = match conntrack {
        Value::Null => return Ok(()),
        Value::Object(map) => map,
        other => return Err((String::new(), format!("must be a mapping, got {other}"))),
    };
    for (key, value) in map {
        let id = match key.as_str() {
            "maxPerCore" => "conntrack_max_per_core",
            "min" => "conntrack_min",
            "tcpEstablishedTimeout" => "conntrack_tcp_timeout_established",
            "tcpCloseWaitTimeout" => "conntrack_tcp_timeout_close_wait",
            "tcpBeLiberal" => "conntrack_tcp_be_liberal",
            "udpTimeout" => "conntrack_udp_timeout",
            "udpStreamTimeout" => "conntrack_udp_timeout_stream",
            _ => {
                if !is_zero(value) {
                    tracing::warn!(file = %file, field = %format!("conntrack.{key}"), "unknown KubeProxyConfiguration field; ignored");
                }
                continue;
            }
        };
        let bad = |what: &str| (key.clone(), format!("must be {what}, got {value}"));
        // null: kube-proxy's default, which the flag already holds.
        if value.is_null() || from_command_line(id) {
            continue;
        }
        match id {
            "conntrack_max_per_core" | "conntrack_min" => {
                let n = value
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| bad("a count (0 or more)"))?;
                if id == "conntrack_min" {
                    flags.conntrack_min = n;
                } else {
                    flags.conntrack_max_per_core = n;
                }
            }
            "conntrack_tcp_be_liberal" => {
                flags.conntrack_tcp_be_liberal =
                    value.as_bool().ok_or_else(|| bad("true or false"))?;
            }
            _ => {
                let d = value.as_str().ok_or_else(|| bad("a duration"))?;
                crate::config::parse_duration(d).map_err(|r| (key.clone(), r))?;
                let d = d.to_owned();
                match id {
                    "conntrack_tcp_timeout_established" => {
                        flags.conntrack_tcp_timeout_established = d
                    }
                    "conntrack_tcp_timeout_close_wait" => {
                        flags.conntrack_tcp_timeout_close_wait = d
                    }
                    "conntrack_udp_timeout" => flags.conntrack_udp_timeout = d,
                    _ => flags.conntrack_udp_timeout_stream = d,
                }
            }
        }
    }
    Ok(())
}

/// The effective configuration as a KubeProxyConfiguration: the fields
/// [`merge`] reads, so that `--write-config-to` output loads back through
/// `--config` to the same flags.
pub fn effective(flags: &DaemonFlags) -> Value {
    let cidrs: Vec<&str> = flags
        .nodeport_addresses
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    serde_json::json!({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "bindAddress": flags.bind_address,
        "masqueradeAll": flags.masquerade_all,
        "clientConnection": {"kubeconfig": flags.kubeconfig, "contentType": flags.kube_api_content_type},
        "clusterCIDR": flags.cluster_cidr,
        "healthzBindAddress": flags.healthz_bind_address,
        "hostnameOverride": flags.hostname_override,
        "metricsBindAddress": flags.metrics_bind_address,
        "mode": flags.proxy_mode.as_str(),
        "nodePortAddresses": cidrs,
        "syncPeriod": flags.sync_period,
        "conntrack": {
            "maxPerCore": flags.conntrack_max_per_core,
            "min": flags.conntrack_min,
            "tcpEstablishedTimeout": flags.conntrack_tcp_timeout_established,
            "tcpCloseWaitTimeout": flags.conntrack_tcp_timeout_close_wait,
            "tcpBeLiberal": flags.conntrack_tcp_be_liberal,
            "udpTimeout": flags.conntrack_udp_timeout,
            "udpStreamTimeout": flags.conntrack_udp_timeout_stream,
        },
    })
}

/// `--write-config-to FILE`: writes [`effective`] as YAML.
pub fn write(flags: &DaemonFlags, path: &Path) -> Result<(), ConfigFileError> {
    let err = |reason: String| ConfigFileError::Read {
        file: path.display().to_string(),
        reason,
    };
    let yaml = crate::yaml::to_string(&effective(flags)).map_err(|e| err(e.to_string()))?;
    std::fs::write(path, yaml).map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn flags_with(config: &str, args: &[&str]) -> (DaemonFlags, Result<(), ConfigFileError>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.conf");
        std::fs::write(&path, config).unwrap();
        let mut argv = vec![
            "ebpf-kube-proxy".to_owned(),
            format!("--config={}", path.display()),
        ];
        argv.extend(args.iter().map(|a| a.to_string()));
        let cli = crate::cli::Cli::try_parse_from(&argv).unwrap();
        let mut flags = cli.daemon;
        let given: Vec<String> = args
            .iter()
            .filter_map(|a| a.strip_prefix("--"))
            .map(|a| a.split('=').next().unwrap_or("").replace('-', "_"))
            .collect();
        let r = merge(&mut flags, |id| given.iter().any(|g| g == id));
        (flags, r)
    }

    const HEAD: &str =
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

    #[test]
    fn file_values_apply_and_command_line_flags_win() {
        let cfg = format!(
            "{HEAD}clusterCIDR: 10.244.0.0/16\nmetricsBindAddress: 127.0.0.1:20249\nsyncPeriod: 1m0s\n\
             mode: nftables\nnodePortAddresses: [10.0.0.0/8]\nconntrack: {{maxPerCore: 0}}\n\
             clientConnection: {{kubeconfig: /etc/kube/config}}\n"
        );
        let (f, r) = flags_with(&cfg, &["--cluster-cidr=10.100.0.0/16"]);
        r.unwrap();
        assert_eq!(f.cluster_cidr, "10.100.0.0/16", "the command line wins");
        assert_eq!(f.metrics_bind_address, "127.0.0.1:20249");
        assert_eq!(f.sync_period, "1m0s");
        assert_eq!(f.proxy_mode, crate::datapath::ProxyMode::Nftables);
        assert_eq!(f.nodeport_addresses, "10.0.0.0/8");
        assert_eq!(f.kubeconfig, "/etc/kube/config");
    }

    #[test]
    fn client_connection_content_type_sets_the_flag_and_a_wrong_one_is_refused() {
        let json = format!("{HEAD}clientConnection: {{contentType: application/json}}\n");
        let (f, r) = flags_with(&json, &[]);
        r.unwrap();
        assert_eq!(f.kube_api_content_type, "application/json");
        let (f, r) = flags_with(
            &json,
            &["--kube-api-content-type=application/vnd.kubernetes.protobuf"],
        );
        r.unwrap();
        assert_eq!(
            f.kube_api_content_type, "application/vnd.kubernetes.protobuf",
            "the command line wins"
        );
        let (f, r) = flags_with(HEAD, &[]);
        r.unwrap();
        assert_eq!(
            f.kube_api_content_type, "application/vnd.kubernetes.protobuf",
            "kube-proxy's default"
        );
        let (_, r) = flags_with(
            &format!("{HEAD}clientConnection: {{contentType: text/xml}}\n"),
            &[],
        );
        match r {
            Err(ConfigFileError::Field { field, .. }) => {
                assert_eq!(field, "clientConnection.contentType")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn conntrack_applies_to_the_conntrack_flags_and_the_command_line_wins() {
        let cfg = format!(
            "{HEAD}conntrack:\n  maxPerCore: 0\n  min: 10\n  tcpEstablishedTimeout: null\n  \
             tcpCloseWaitTimeout: 20m0s\n  tcpBeLiberal: true\n  udpTimeout: 45s\n  \
             udpStreamTimeout: 0s\n"
        );
        let (f, r) = flags_with(&cfg, &["--conntrack-udp-timeout=1m"]);
        r.unwrap();
        assert_eq!(f.conntrack_max_per_core, 0);
        assert_eq!(f.conntrack_min, 10);
        assert_eq!(
            f.conntrack_tcp_timeout_established, "24h0m0s",
            "null: the default"
        );
        assert_eq!(f.conntrack_tcp_timeout_close_wait, "20m0s");
        assert!(f.conntrack_tcp_be_liberal);
        assert_eq!(f.conntrack_udp_timeout, "1m", "the command line wins");
        assert_eq!(f.conntrack_udp_timeout_stream, "0s");
        for (bad, field) in [
            ("conntrack: {maxPerCore: -1}", "conntrack.maxPerCore"),
            (
                "conntrack: {tcpCloseWaitTimeout: soon}",
                "conntrack.tcpCloseWaitTimeout",
            ),
            ("conntrack: {tcpBeLiberal: 1}", "conntrack.tcpBeLiberal"),
            ("conntrack: 3", "conntrack"),
        ] {
            let (_, r) = flags_with(&format!("{HEAD}{bad}\n"), &[]);
            match r {
                Err(ConfigFileError::Field { field: f, .. }) => assert_eq!(f, field, "{bad}"),
                other => panic!("{bad}: expected an error on {field}, got {other:?}"),
            }
        }
    }

    #[test]
    fn invalid_fields_are_named() {
        let cases = [
            (format!("{HEAD}clusterCIDR: 10.0.0.0/99\n"), "clusterCIDR"),
            (
                format!("{HEAD}healthzBindAddress: nope\n"),
                "healthzBindAddress",
            ),
            (format!("{HEAD}mode: userspace\n"), "mode"),
            (format!("{HEAD}syncPeriod: soon\n"), "syncPeriod"),
            (
                format!("{HEAD}nodePortAddresses: [1]\n"),
                "nodePortAddresses[0]",
            ),
            (
                "apiVersion: v1\nkind: KubeProxyConfiguration\n".to_owned(),
                "apiVersion",
            ),
        ];
        for (cfg, field) in cases {
            let (_, r) = flags_with(&cfg, &[]);
            match r {
                Err(ConfigFileError::Field { field: f, .. }) => assert_eq!(f, field, "{cfg}"),
                other => panic!("{cfg}: expected an error on {field}, got {other:?}"),
            }
        }
    }
}
