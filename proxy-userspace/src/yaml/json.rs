//! The JSON fast path of [`super::documents`]: a stream of `---`-separated
//! documents that are each one JSON object, read by serde_json.
//!
//! It answers `None` for anything it is not sure of, and the caller then
//! uses the YAML parser: a line starting with `---` that carries more than
//! the marker, `...` or a directive, a comment, a document that is not an
//! object, invalid JSON, or a duplicate key (which serde_json's own `Value`
//! would silently resolve to the last one, where the YAML reader refuses
//! the document). A `---` line cannot occur inside a JSON document (JSON
//! strings hold no raw line breaks), so splitting on it is exact.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Every non-empty document, or `None`: use the YAML parser.
pub fn documents(text: &str) -> Option<Vec<Value>> {
    texts(text)?
        .into_iter()
        .map(|doc| {
            let mut de = serde_json::Deserializer::from_str(doc);
            let StrictValue(value) = StrictValue::deserialize(&mut de).ok()?;
            de.end().ok()?;
            Some(value)
        })
        .collect()
}

/// The text of every non-empty document, each starting with `{`, or
/// `None`: not a stream of JSON objects (whether each text is valid JSON
/// is for its reader to find out).
pub fn texts(text: &str) -> Option<Vec<&str>> {
    let mut docs = Vec::new();
    let mut start = 0;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end();
        if bare.starts_with("---") {
            if bare != "---" {
                return None;
            }
            push(&mut docs, &text[start..offset])?;
            start = offset + line.len();
        } else if bare.starts_with("...") || bare.starts_with('%') {
            return None;
        }
        offset += line.len();
    }
    push(&mut docs, &text[start..])?;
    Some(docs)
}

fn push<'a>(docs: &mut Vec<&'a str>, doc: &'a str) -> Option<()> {
    let body = doc.trim();
    if body.is_empty() {
        return Some(());
    }
    body.starts_with('{').then(|| docs.push(body))
}

/// A JSON value whose objects have no duplicate keys.
struct StrictValue(Value);

impl<'de> Deserialize<'de> for StrictValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(StrictValue)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(StrictValue(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(de::Error::custom(format_args!("duplicate key {key:?}")));
            }
            let StrictValue(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_documents_between_markers_are_read() {
        let text =
            "---\n{\"a\": 1, \"b\": [true, null, \"x\"]}\n---\n\n---\n{\"c\": {\"d\": 2.5}}\n";
        assert_eq!(
            documents(text),
            Some(vec![
                json!({"a": 1, "b": [true, null, "x"]}),
                json!({"c": {"d": 2.5}})
            ])
        );
        // Without a leading marker, and pretty-printed over several lines.
        assert_eq!(
            documents("{\n  \"a\": 1\n}\r\n---\r\n{\"b\": 2}"),
            Some(vec![json!({"a": 1}), json!({"b": 2})])
        );
    }

    #[test]
    fn anything_else_goes_to_the_yaml_parser() {
        for text in [
            "a: 1\n",
            "---\n{\"a\": 1}\n---\nb: 2\n",
            "--- {\"a\": 1}\n",
            "%YAML 1.2\n---\n{\"a\": 1}\n",
            "{\"a\": 1}\n...\n",
            "# a comment\n{\"a\": 1}\n",
            "{\"a\": 1} # trailing comment\n",
            "[1, 2]\n",
            "{\"a\": 1, \"a\": 2}\n",
            "{\"a\": {\"b\": 1, \"b\": 1}}\n",
            "{\"a\": 1\n",
        ] {
            assert_eq!(documents(text), None, "{text:?}");
        }
    }

    #[test]
    fn the_fast_path_reads_what_the_yaml_parser_reads() {
        let text = "---\n{\"kind\": \"Service\", \"n\": -3, \"big\": 18446744073709551615, \"f\": 1e3, \"s\": \"\\u00e9\\n\\/\", \"e\": {}, \"l\": []}\n";
        let fast = documents(text).unwrap();
        let mut reader = text.as_bytes();
        let slow: Vec<Value> =
            serde_saphyr::read_with_options::<_, Value>(&mut reader, super::super::options())
                .collect::<Result<_, _>>()
                .unwrap();
        assert_eq!(fast, slow);
    }
}
