//! A protobuf message read in place: its fields one by one, strings and
//! embedded messages borrowed from the bytes, nothing allocated.
//!
//! The messages of [`super`] (prost's) own their strings and vectors:
//! decoding a 250,000-endpoint list into them allocates every address,
//! name and label, which the reader then copies into its own types. This
//! reader hands out `&str` and `&[u8]` slices of the message instead, for
//! a caller that builds its own types straight from them (the kube
//! source's wire types). It checks what prost checks: a key is a valid
//! field number and wire type, a varint ends within ten bytes, a length
//! stays inside the message, a string is UTF-8 (see [`Field::str`]); a
//! field of the wrong wire type for its number is the caller's to refuse
//! ([`Field::varint`] and the rest say which was expected).

use std::fmt;

/// Why a message could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    /// The field being read (a path such as `spec.ports.port`), or `""`
    /// when the message's framing itself is broken.
    pub field: &'static str,
    pub reason: &'static str,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            f.write_str(self.reason)
        } else {
            write!(f, "{}: {}", self.field, self.reason)
        }
    }
}

impl std::error::Error for ReadError {}

fn framing(reason: &'static str) -> ReadError {
    ReadError { field: "", reason }
}

/// A field's value as its wire type gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    Varint(u64),
    Fixed64(u64),
    Len(&'a [u8]),
    Fixed32(u32),
}

/// One field of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    pub number: u32,
    pub value: Value<'a>,
}

impl<'a> Field<'a> {
    fn wrong(field: &'static str, expected: &'static str) -> ReadError {
        ReadError {
            field,
            reason: expected,
        }
    }

    /// A varint field (`int32`, `int64`, `bool`, enums) as its 64 bits.
    pub fn varint(self, field: &'static str) -> Result<u64, ReadError> {
        match self.value {
            Value::Varint(v) => Ok(v),
            _ => Err(Self::wrong(field, "wire type is not varint")),
        }
    }

    /// An `int32` (its low 32 bits, as protobuf truncates).
    pub fn int32(self, field: &'static str) -> Result<i32, ReadError> {
        self.varint(field).map(|v| v as i32)
    }

    pub fn int64(self, field: &'static str) -> Result<i64, ReadError> {
        self.varint(field).map(|v| v as i64)
    }

    pub fn bool(self, field: &'static str) -> Result<bool, ReadError> {
        self.varint(field).map(|v| v != 0)
    }

    /// A length-delimited field: bytes, or an embedded message.
    pub fn bytes(self, field: &'static str) -> Result<&'a [u8], ReadError> {
        match self.value {
            Value::Len(b) => Ok(b),
            _ => Err(Self::wrong(field, "wire type is not length-delimited")),
        }
    }

    /// A `string`: length-delimited and UTF-8.
    pub fn str(self, field: &'static str) -> Result<&'a str, ReadError> {
        std::str::from_utf8(self.bytes(field)?).map_err(|_| ReadError {
            field,
            reason: "string is not UTF-8",
        })
    }
}

/// The fields of `message`, in order. After an error it yields nothing
/// more.
pub fn fields(message: &[u8]) -> Fields<'_> {
    Fields { rest: message }
}

#[derive(Debug, Clone)]
pub struct Fields<'a> {
    rest: &'a [u8],
}

fn varint(rest: &mut &[u8]) -> Result<u64, ReadError> {
    let mut value = 0u64;
    for (i, &b) in rest.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            if i == 9 && b > 1 {
                return Err(framing("varint overflows 64 bits"));
            }
            *rest = &rest[i + 1..];
            return Ok(value);
        }
    }
    Err(framing(if rest.len() < 10 {
        "message ends inside a varint"
    } else {
        "varint longer than ten bytes"
    }))
}

impl<'a> Fields<'a> {
    fn next_field(&mut self) -> Result<Field<'a>, ReadError> {
        let key = varint(&mut self.rest)?;
        let number = u32::try_from(key >> 3)
            .ok()
            .filter(|&n| (1..=0x1fff_ffff).contains(&n))
            .ok_or_else(|| framing("field number out of range"))?;
        let value = match key & 7 {
            0 => Value::Varint(varint(&mut self.rest)?),
            1 => {
                let (b, rest) = self
                    .rest
                    .split_first_chunk::<8>()
                    .ok_or_else(|| framing("message ends inside a fixed64"))?;
                self.rest = rest;
                Value::Fixed64(u64::from_le_bytes(*b))
            }
            2 => {
                let len = varint(&mut self.rest)?;
                let len = usize::try_from(len)
                    .ok()
                    .filter(|&l| l <= self.rest.len())
                    .ok_or_else(|| framing("length past the end of the message"))?;
                let (b, rest) = self.rest.split_at(len);
                self.rest = rest;
                Value::Len(b)
            }
            5 => {
                let (b, rest) = self
                    .rest
                    .split_first_chunk::<4>()
                    .ok_or_else(|| framing("message ends inside a fixed32"))?;
                self.rest = rest;
                Value::Fixed32(u32::from_le_bytes(*b))
            }
            3 | 4 => return Err(framing("groups are not read")),
            _ => return Err(framing("invalid wire type")),
        };
        Ok(Field { number, value })
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<Field<'a>, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let field = self.next_field();
        if field.is_err() {
            self.rest = &[];
        }
        Some(field)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s as pb;
    use prost::Message;

    #[test]
    fn fields_read_as_prost_wrote_them() {
        let port = pb::ServicePort {
            name: Some("http".into()),
            port: Some(-5),
            node_port: Some(30080),
            target_port: Some(pb::IntOrString {
                r#type: Some(1),
                int_val: None,
                str_val: Some("web".into()),
            }),
            ..pb::ServicePort::default()
        };
        let bytes = port.encode_to_vec();
        let read: Vec<Field<'_>> = fields(&bytes).collect::<Result<_, _>>().unwrap();
        assert_eq!(read.len(), 4);
        assert_eq!(read[0].str("name"), Ok("http"));
        assert_eq!(read[1].int32("port"), Ok(-5));
        assert_eq!(read[2].number, 4);
        let target: Vec<Field<'_>> = fields(read[2].bytes("targetPort").unwrap())
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(target[0].int64("type"), Ok(1));
        assert_eq!(target[1].str("strVal"), Ok("web"));
        assert_eq!(read[3].int32("nodePort"), Ok(30080));
        // The wrong wire type names the field.
        assert_eq!(
            read[0].int32("spec.ports.name").unwrap_err().to_string(),
            "spec.ports.name: wire type is not varint"
        );
    }

    #[test]
    fn broken_framing_is_an_error_and_ends_the_fields() {
        for (bytes, want) in [
            (&b"\x08"[..], "message ends inside a varint"),
            (b"\x0a\x05abc", "length past the end of the message"),
            (b"\x0f\x00", "invalid wire type"),
            (b"\x0b", "groups are not read"),
            (b"\x00\x01", "field number out of range"),
            (b"\x09\x01\x02", "message ends inside a fixed64"),
            (
                b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
                "varint longer than ten bytes",
            ),
        ] {
            let mut f = fields(bytes);
            assert_eq!(
                f.next().unwrap().unwrap_err().to_string(),
                want,
                "{bytes:?}"
            );
            assert!(f.next().is_none());
        }
        let not_utf8 = b"\x0a\x01\xff";
        let field = fields(not_utf8).next().unwrap().unwrap();
        assert_eq!(
            field.str("metadata.name").unwrap_err().to_string(),
            "metadata.name: string is not UTF-8"
        );
    }
}
