//! The values `/flagz` shows (SPEC §2.1): every flag of a clap `Args`
//! struct, keyed by its long name, with its effective value rendered as Go
//! components render flags.
//!
//! The flag list comes from clap, the values from serialising the parsed
//! struct with serde and matching clap's argument ids to field names, so a
//! new flag appears without touching this module. Fields choose their
//! rendering with `#[serde(serialize_with = ...)]` and the helpers here:
//! [`go_duration`], [`list`], [`value_enum`] and [`classified`] (sensitive
//! flags: tokens, passwords, URLs with user-info).

use serde::{Serialize, Serializer};

/// What a sensitive flag shows, in every format.
pub const CLASSIFIED: &str = "CLASSIFIED";

/// One flag: long name without dashes, rendered value.
pub type FlagValue = (String, String);

/// Every flag of `A` with its value in `flags`, sorted by name.
pub fn collect<A: clap::Args + Serialize>(flags: &A) -> Vec<FlagValue> {
    let values = match serde_json::to_value(flags) {
        Ok(serde_json::Value::Object(map)) => map,
        Ok(_) => serde_json::Map::new(),
        Err(e) => {
            // Only a non-UTF-8 path can get here; show the flags regardless.
            tracing::error!(error = %e, "rendering flag values for /flagz failed");
            serde_json::Map::new()
        }
    };
    let command = A::augment_args(clap::Command::new("flagz"));
    let mut out: Vec<FlagValue> = command
        .get_arguments()
        .map(|arg| {
            let id = arg.get_id().as_str();
            let name = arg.get_long().unwrap_or(id).to_owned();
            let value = values.get(id).map(render).unwrap_or_default();
            (name, value)
        })
        .collect();
    out.sort();
    out
}

/// Go's flag rendering of a serialised value.
fn render(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Null => String::new(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(render).collect();
            format!("[{}]", items.join(","))
        }
        Value::Object(_) => v.to_string(),
    }
}

/// A comma-separated list flag: shown as `[a,b]`, `[]` when empty.
pub fn list<S: Serializer>(value: &str, s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(value.split(',').map(str::trim).filter(|v| !v.is_empty()))
}

/// A clap `ValueEnum` flag: shown by its command-line name.
pub fn value_enum<T: clap::ValueEnum, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
    match value.to_possible_value() {
        Some(p) => s.serialize_str(p.get_name()),
        None => s.serialize_str(""),
    }
}

/// A sensitive flag: its value is never shown.
pub fn classified<T, S: Serializer>(_: &T, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(CLASSIFIED)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Clone, Copy, Debug, clap::ValueEnum)]
    enum Mode {
        FastPath,
        Slow,
    }

    #[derive(Debug, Parser, Serialize)]
    struct Flags {
        #[arg(long, default_value = "")]
        plain: String,
        #[arg(long, default_value = "30s")]
        #[serde(serialize_with = "crate::config::flags::go_duration")]
        period: String,
        #[arg(long, default_value = "")]
        #[serde(serialize_with = "list")]
        addresses: String,
        #[arg(long, value_enum, default_value_t = Mode::FastPath)]
        #[serde(serialize_with = "value_enum")]
        mode: Mode,
        #[arg(long, default_value = "")]
        #[serde(serialize_with = "classified")]
        token: String,
        #[arg(long)]
        optional: Option<std::path::PathBuf>,
        #[arg(long)]
        enabled: bool,
        #[arg(short = 'v', long = "v", default_value_t = 0)]
        verbosity: u8,
    }

    #[test]
    fn every_daemon_flag_has_a_value_and_the_master_url_is_classified() {
        use crate::cli::Cli;
        use crate::config::DaemonFlags;
        let cli = Cli::try_parse_from([
            "ebpf-kube-proxy",
            "--master",
            "https://admin:s3cret@api.example:6443",
            "--sync-period",
            "2m",
        ])
        .unwrap();
        let serialized = serde_json::to_value(&cli.daemon).unwrap();
        let command = <DaemonFlags as clap::Args>::augment_args(clap::Command::new("x"));
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            assert!(
                serialized.get(id).is_some(),
                "flag {id} has no serialized value"
            );
        }
        let flags = collect(&cli.daemon);
        let get = |n: &str| flags.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        assert_eq!(get("master"), Some(CLASSIFIED));
        assert_eq!(get("sync-period"), Some("2m0s"));
        assert_eq!(get("v"), Some("0"));
        assert_eq!(flags.len(), command.get_arguments().count());
    }

    fn values(args: &[&str]) -> Vec<FlagValue> {
        let mut argv = vec!["test"];
        argv.extend_from_slice(args);
        collect(&Flags::try_parse_from(argv).unwrap())
    }

    fn pairs(v: &[(&str, &str)]) -> Vec<FlagValue> {
        v.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_flag_is_listed_sorted_with_go_renderings() {
        assert_eq!(
            values(&[]),
            pairs(&[
                ("addresses", "[]"),
                ("enabled", "false"),
                ("mode", "fast-path"),
                ("optional", ""),
                ("period", "30s"),
                ("plain", ""),
                ("token", "CLASSIFIED"),
                ("v", "0"),
            ])
        );
    }

    #[test]
    fn command_line_values_win_and_are_normalised() {
        let v = values(&[
            "--period=90s",
            "--addresses",
            "10.0.0.0/8, fd00::/64",
            "--mode",
            "slow",
            "--token",
            "s3cr3t",
            "--optional",
            "/x",
            "--enabled",
            "-v",
            "4",
            "--plain",
            "a b",
        ]);
        assert_eq!(
            v,
            pairs(&[
                ("addresses", "[10.0.0.0/8,fd00::/64]"),
                ("enabled", "true"),
                ("mode", "slow"),
                ("optional", "/x"),
                ("period", "1m30s"),
                ("plain", "a b"),
                ("token", "CLASSIFIED"),
                ("v", "4"),
            ])
        );
    }
}
