//! Content negotiation of `/statusz` and `/flagz` (SPEC §1.1): the `Accept`
//! header in, text or a structured (JSON/YAML, versioned) format out, or no
//! match (406). Pure.

/// Group of the structured z-page kinds.
pub const GROUP: &str = "config.k8s.io";

/// Versions of the structured kinds, newest first (the order of the 406
/// message).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1Beta1,
    V1Alpha1,
}

impl Version {
    pub const ALL: [Version; 2] = [Version::V1Beta1, Version::V1Alpha1];

    pub fn as_str(self) -> &'static str {
        match self {
            Version::V1Beta1 => "v1beta1",
            Version::V1Alpha1 => "v1alpha1",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Version::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// `config.k8s.io/VERSION`.
    pub fn api_version(self) -> String {
        format!("{GROUP}/{}", self.as_str())
    }

    /// v1alpha1 answers carry a deprecation `Warning` header.
    pub fn deprecated(self) -> bool {
        self == Version::V1Alpha1
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Structured {
    Json,
    Yaml,
}

impl Structured {
    pub fn media_type(self) -> &'static str {
        match self {
            Structured::Json => "application/json",
            Structured::Yaml => "application/yaml",
        }
    }
}

/// What to answer with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Structured(Structured, Version),
}

/// Picks the format for `accept` (the joined `Accept` header values) and
/// the structured kind `kind` (`Statusz`, `Flagz`). `None` = 406.
pub fn negotiate(accept: Option<&str>, kind: &str) -> Option<Format> {
    let accept = match accept {
        Some(a) if !a.trim().is_empty() => a,
        _ => return Some(Format::Text),
    };
    let mut ranges: Vec<(f32, &str)> = accept
        .split(',')
        .filter_map(|range| Some((quality(range)?, range)))
        .filter(|(q, _)| *q > 0.0)
        .collect();
    // Stable: equal weights keep the client's order.
    ranges.sort_by(|a, b| b.0.total_cmp(&a.0));
    ranges
        .into_iter()
        .find_map(|(_, range)| match_range(range, kind))
}

/// The `q` weight of a media range: 1 when absent, `None` when malformed
/// (such a range cannot match anything).
fn quality(range: &str) -> Option<f32> {
    let mut q = 1.0;
    for param in range.split(';').skip(1) {
        let (name, value) = param.split_once('=')?;
        if name.trim().eq_ignore_ascii_case("q") {
            q = value.trim().parse::<f32>().ok().filter(|q| q.is_finite())?;
            if !(0.0..=1.0).contains(&q) {
                return None;
            }
        }
    }
    Some(q)
}

fn match_range(range: &str, kind: &str) -> Option<Format> {
    let mut parts = range.split(';');
    let media_type = parts.next()?.trim().to_ascii_lowercase();
    // Parameter names are case-insensitive; values of g, v and as are not.
    let mut params: Vec<(String, &str)> = Vec::new();
    for p in parts {
        let (name, value) = p.split_once('=')?;
        let name = name.trim().to_ascii_lowercase();
        if name == "q" {
            continue;
        }
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value);
        if params.iter().any(|(n, _)| *n == name) {
            return None; // a repeated parameter is ambiguous
        }
        params.push((name, value));
    }
    match media_type.as_str() {
        "text/plain" | "text/*" | "*/*" => params
            .iter()
            .all(|(n, v)| n == "charset" && v.eq_ignore_ascii_case("utf-8"))
            .then_some(Format::Text),
        "application/json" => {
            structured(&params, kind).map(|v| Format::Structured(Structured::Json, v))
        }
        "application/yaml" => {
            structured(&params, kind).map(|v| Format::Structured(Structured::Yaml, v))
        }
        _ => None,
    }
}

/// The version when the parameters are exactly g, v, as (and maybe pretty).
fn structured(params: &[(String, &str)], kind: &str) -> Option<Version> {
    let get = |name: &str| params.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    let known = params
        .iter()
        .all(|(n, _)| matches!(n.as_str(), "g" | "v" | "as" | "pretty"));
    if !known || get("g")? != GROUP || get("as")? != kind {
        return None;
    }
    Version::parse(get("v")?)
}

/// Message of the 406 Status: every acceptable media type, exactly.
pub fn not_acceptable_message(kind: &str) -> String {
    let mut accepted = vec!["text/plain".to_owned()];
    for s in [Structured::Json, Structured::Yaml] {
        for v in Version::ALL {
            accepted.push(format!(
                "{};g={GROUP};v={};as={kind}",
                s.media_type(),
                v.as_str()
            ));
        }
    }
    format!(
        "only the following media types are accepted: {}",
        accepted.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use Format::Text;
    use Structured::{Json, Yaml};
    use Version::*;

    #[test]
    fn accept_headers_pick_the_spec_format() {
        let cases: &[(Option<&str>, Option<Format>)] = &[
            (None, Some(Text)),
            (Some(""), Some(Text)),
            (Some("   "), Some(Text)),
            (Some("text/plain"), Some(Text)),
            (Some("text/plain;charset=utf-8"), Some(Text)),
            (Some("text/plain; charset=UTF-8"), Some(Text)),
            (Some("TEXT/PLAIN"), Some(Text)),
            (Some("text/*"), Some(Text)),
            (Some("*/*"), Some(Text)),
            (Some("text/plain;charset=iso-8859-1"), None),
            (Some("text/html"), None),
            (
                Some("application/json;g=config.k8s.io;v=v1beta1;as=Statusz"),
                Some(Format::Structured(Json, V1Beta1)),
            ),
            (
                Some("application/json;as=Statusz;v=v1alpha1;g=config.k8s.io"),
                Some(Format::Structured(Json, V1Alpha1)),
            ),
            (
                Some("application/yaml;g=config.k8s.io;v=v1beta1;as=Statusz"),
                Some(Format::Structured(Yaml, V1Beta1)),
            ),
            (
                Some("application/json; g=config.k8s.io; v=v1beta1; as=Statusz; pretty=1"),
                Some(Format::Structured(Json, V1Beta1)),
            ),
            // Not matching: bare JSON, missing parameter, wrong kind, unknown
            // version, extra parameter, other media types.
            (Some("application/json"), None),
            (Some("application/json;g=config.k8s.io;v=v1beta1"), None),
            (Some("application/json;v=v1beta1;as=Statusz"), None),
            (Some("application/json;g=config.k8s.io;v=v1beta1;as=Flagz"), None),
            (Some("application/json;g=config.k8s.io;v=v1beta1;as=statusz"), None),
            (Some("application/json;g=config.k8s.io;v=v1;as=Statusz"), None),
            (
                Some("application/json;g=config.k8s.io;v=v1beta1;as=Statusz;x=y"),
                None,
            ),
            (Some("application/xml"), None),
            (Some("application/cbor"), None),
            (Some("application/vnd.kubernetes.protobuf"), None),
            // SPEC §1.1's example: the first range fails, */* matches.
            (
                Some("application/json;v=foo;g=config.k8s.io;as=Statusz,*/*"),
                Some(Text),
            ),
            // The first matching range in order of decreasing q decides.
            (
                Some("text/plain;q=0.5, application/json;g=config.k8s.io;v=v1beta1;as=Statusz"),
                Some(Format::Structured(Json, V1Beta1)),
            ),
            (
                Some("application/yaml;g=config.k8s.io;v=v1beta1;as=Statusz;q=0.9, application/json;g=config.k8s.io;v=v1alpha1;as=Statusz;q=0.9"),
                Some(Format::Structured(Yaml, V1Beta1)),
            ),
            (
                Some("application/json;g=config.k8s.io;v=v1beta1;as=Statusz;q=0.1, text/plain"),
                Some(Text),
            ),
            // q=0 means "not acceptable".
            (Some("text/plain;q=0"), None),
            (Some("*/*;q=0.0, application/json"), None),
            (Some("text/plain;q=abc"), None),
        ];
        for (accept, want) in cases {
            assert_eq!(negotiate(*accept, "Statusz"), *want, "Accept: {accept:?}");
        }
    }

    #[test]
    fn the_kind_is_per_page() {
        let flagz = "application/json;g=config.k8s.io;v=v1beta1;as=Flagz";
        assert_eq!(
            negotiate(Some(flagz), "Flagz"),
            Some(Format::Structured(Json, V1Beta1))
        );
        assert_eq!(negotiate(Some(flagz), "Statusz"), None);
    }

    #[test]
    fn not_acceptable_lists_the_exact_media_types() {
        assert_eq!(
            not_acceptable_message("Statusz"),
            "only the following media types are accepted: text/plain, \
             application/json;g=config.k8s.io;v=v1beta1;as=Statusz, \
             application/json;g=config.k8s.io;v=v1alpha1;as=Statusz, \
             application/yaml;g=config.k8s.io;v=v1beta1;as=Statusz, \
             application/yaml;g=config.k8s.io;v=v1alpha1;as=Statusz"
        );
    }
}
