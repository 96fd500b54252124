//! [`Strict`]: a serde `Deserializer` adapter that refuses an object with
//! a duplicate key, at any depth, while the typed decoder reads it.
//!
//! serde_json and the typed decoders keep the last of two equal keys
//! without a word; the YAML reader refuses them. Checking for them in a
//! pass of its own read every JSON manifest twice (a quarter of the CPU of
//! a 50k-service start), so the check rides along the one typed pass
//! instead: every map the decoder reads records its keys as they go by,
//! and values the decoder skips are walked, not skipped, so that their
//! objects are checked too. serde has no such adapter, nor a well-kept
//! crate (serde_ignored and serde_path_to_error wrap a deserializer the
//! same way to report other things).
//!
//! Everything else is forwarded unchanged: the decoder sees the same
//! calls and values as without the adapter.

use std::borrow::Cow;
use std::fmt;

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor,
};
use smallvec::SmallVec;

/// The deserializer `D`, refusing duplicate keys.
pub type Strict<D> = Forward<D, CheckMaps>;

/// [`Strict`] around `d`.
pub fn strict<D>(d: D) -> Strict<D> {
    Forward { d, wrap: CheckMaps }
}

/// A deserializer that forwards every call to `d`, the visitor wrapped by
/// `W`: [`Strict`] (maps check their keys) and a map key's deserializer
/// ([`NoteKey`]).
pub struct Forward<D, W> {
    d: D,
    wrap: W,
}

/// How a [`Forward`] wraps the visitors it hands on.
pub trait Wrap<'de> {
    type Visitor<V: Visitor<'de>>: Visitor<'de, Value = V::Value>;

    fn wrap<V: Visitor<'de>>(self, visitor: V) -> Self::Visitor<V>;

    /// What `deserialize_ignored_any` asks of the inner deserializer.
    fn ignored_any<D: Deserializer<'de>, V: Visitor<'de>>(
        d: D,
        visitor: Self::Visitor<V>,
    ) -> Result<V::Value, D::Error>;
}

/// [`Strict`]'s wrapping: [`Checked`].
pub struct CheckMaps;

impl<'de> Wrap<'de> for CheckMaps {
    type Visitor<V: Visitor<'de>> = Checked<V>;

    fn wrap<V: Visitor<'de>>(self, visitor: V) -> Checked<V> {
        Checked(visitor)
    }

    /// Walked, not skipped: a skipped object is checked too.
    fn ignored_any<D: Deserializer<'de>, V: Visitor<'de>>(
        d: D,
        visitor: Checked<V>,
    ) -> Result<V::Value, D::Error> {
        d.deserialize_any(visitor)
    }
}

/// A map key's wrapping: a key is text in JSON, whatever the decoder asks
/// it for; any string it hands over is noted ([`KeyVisitor`]).
struct NoteKey<'k, 'de> {
    key: &'k mut Option<Cow<'de, str>>,
}

impl<'k, 'de> Wrap<'de> for NoteKey<'k, 'de> {
    type Visitor<V: Visitor<'de>> = KeyVisitor<'k, 'de, V>;

    fn wrap<V: Visitor<'de>>(self, visitor: V) -> KeyVisitor<'k, 'de, V> {
        KeyVisitor {
            visitor,
            key: self.key,
        }
    }

    /// Read as text: an ignored key still counts.
    fn ignored_any<D: Deserializer<'de>, V: Visitor<'de>>(
        d: D,
        visitor: KeyVisitor<'k, 'de, V>,
    ) -> Result<V::Value, D::Error> {
        d.deserialize_str(visitor)
    }
}

/// Forwards each named method with the visitor wrapped.
macro_rules! forward {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.d.$method(self.wrap.wrap(visitor))
        }
    )*};
}

impl<'de, D: Deserializer<'de>, W: Wrap<'de>> Deserializer<'de> for Forward<D, W> {
    type Error = D::Error;

    forward! {
        deserialize_any deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32
        deserialize_i64 deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32
        deserialize_u64 deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char
        deserialize_str deserialize_string deserialize_bytes deserialize_byte_buf
        deserialize_option deserialize_unit deserialize_seq deserialize_map
        deserialize_identifier
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        W::ignored_any(self.d, self.wrap.wrap(visitor))
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.d
            .deserialize_unit_struct(name, self.wrap.wrap(visitor))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.d
            .deserialize_newtype_struct(name, self.wrap.wrap(visitor))
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.d.deserialize_tuple(len, self.wrap.wrap(visitor))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.d
            .deserialize_tuple_struct(name, len, self.wrap.wrap(visitor))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.d
            .deserialize_struct(name, fields, self.wrap.wrap(visitor))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.d
            .deserialize_enum(name, variants, self.wrap.wrap(visitor))
    }

    fn is_human_readable(&self) -> bool {
        self.d.is_human_readable()
    }
}

/// A visitor whose maps check their keys and whose nested values are
/// read through [`Strict`].
pub struct Checked<V>(V);

/// Forwards each named visit of a plain value.
macro_rules! visit {
    ($($method:ident($ty:ty))*) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<V::Value, E> {
            self.0.$method(v)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Checked<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    visit! {
        visit_bool(bool) visit_i8(i8) visit_i16(i16) visit_i32(i32) visit_i64(i64)
        visit_i128(i128) visit_u8(u8) visit_u16(u16) visit_u32(u32) visit_u64(u64)
        visit_u128(u128) visit_f32(f32) visit_f64(f64) visit_char(char)
        visit_str(&str) visit_borrowed_str(&'de str) visit_string(String)
        visit_bytes(&[u8]) visit_borrowed_bytes(&'de [u8]) visit_byte_buf(Vec<u8>)
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.0.visit_some(strict(d))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.0.visit_newtype_struct(strict(d))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.0.visit_seq(CheckedSeq(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.0.visit_map(CheckedMap {
            map,
            keys: Keys::default(),
        })
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.0.visit_enum(CheckedEnum(data))
    }
}

/// A seed whose deserializer is wrapped in [`Strict`].
struct StrictSeed<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for StrictSeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(strict(d))
    }
}

struct CheckedSeq<A>(A);

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for CheckedSeq<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(StrictSeed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

struct CheckedMap<'de, A> {
    map: A,
    keys: Keys<'de>,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for CheckedMap<'de, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let mut key = None;
        let value = self.map.next_key_seed(KeySeed {
            seed,
            key: &mut key,
        })?;
        if let Some(key) = key {
            self.keys.insert(key)?;
        }
        Ok(value)
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        self.map.next_value_seed(StrictSeed(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}

struct CheckedEnum<A>(A);

impl<'de, A: EnumAccess<'de>> EnumAccess<'de> for CheckedEnum<A> {
    type Error = A::Error;
    type Variant = CheckedEnum<A::Variant>;

    fn variant_seed<T: DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> Result<(T::Value, Self::Variant), A::Error> {
        self.0
            .variant_seed(seed)
            .map(|(value, variant)| (value, CheckedEnum(variant)))
    }
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for CheckedEnum<A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.0.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.0.newtype_variant_seed(StrictSeed(seed))
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.0.tuple_variant(len, Checked(visitor))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.0.struct_variant(fields, Checked(visitor))
    }
}

/// A map key's seed: notes the key's text on its way to the decoder.
struct KeySeed<'k, 'de, S> {
    seed: S,
    key: &'k mut Option<Cow<'de, str>>,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for KeySeed<'_, 'de, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.seed.deserialize(Forward {
            d,
            wrap: NoteKey { key: self.key },
        })
    }
}

pub struct KeyVisitor<'k, 'de, V> {
    visitor: V,
    key: &'k mut Option<Cow<'de, str>>,
}

/// Forwards each named visit of a value that is not text.
macro_rules! visit_key {
    ($($method:ident($ty:ty))*) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<V::Value, E> {
            self.visitor.$method(v)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for KeyVisitor<'_, 'de, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(f)
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<V::Value, E> {
        *self.key = Some(Cow::Borrowed(v));
        self.visitor.visit_borrowed_str(v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        *self.key = Some(Cow::Owned(v.to_owned()));
        self.visitor.visit_str(v)
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<V::Value, E> {
        *self.key = Some(Cow::Owned(v.clone()));
        self.visitor.visit_string(v)
    }

    visit_key! {
        visit_bool(bool) visit_i8(i8) visit_i16(i16) visit_i32(i32) visit_i64(i64)
        visit_i128(i128) visit_u8(u8) visit_u16(u16) visit_u32(u32) visit_u64(u64)
        visit_u128(u128) visit_f32(f32) visit_f64(f64) visit_char(char)
        visit_bytes(&[u8]) visit_borrowed_bytes(&'de [u8]) visit_byte_buf(Vec<u8>)
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.visitor.visit_some(d)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.visitor.visit_newtype_struct(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_map(map)
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_enum(data)
    }
}

/// The keys of one object so far. Objects are small (a linear scan, on
/// the stack: a quarter of a million endpoints each hold a few nested
/// objects), except label maps, which get a set past a few keys.
#[derive(Default)]
struct Keys<'de> {
    few: SmallVec<[Cow<'de, str>; FEW_KEYS]>,
    many: hashbrown::HashSet<Cow<'de, str>>,
}

const FEW_KEYS: usize = 16;

impl<'de> Keys<'de> {
    fn insert<E: de::Error>(&mut self, key: Cow<'de, str>) -> Result<(), E> {
        let fresh = if self.few.len() < FEW_KEYS {
            let fresh = !self.few.contains(&key);
            self.few.push(key);
            fresh
        } else {
            !self.few.contains(&key) && self.many.insert(key)
        };
        if fresh {
            Ok(())
        } else {
            Err(E::custom("duplicate key"))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::*;

    fn decode_strict<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, serde_json::Error> {
        let mut de = serde_json::Deserializer::from_str(text);
        let value = T::deserialize(strict(&mut de))?;
        de.end()?;
        Ok(value)
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Outer {
        name: String,
        #[serde(default)]
        labels: BTreeMap<String, String>,
        #[serde(default)]
        items: Vec<Inner>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Inner {
        port: Option<u16>,
    }

    #[test]
    fn values_read_as_without_the_adapter() {
        let text = r#"{"name":"a\"b","labels":{"x":"1","y":"2"},"items":[{"port":80},{"port":null}],"skipped":{"deep":[1,2.5,true,null,"s"]}}"#;
        let plain: Outer = serde_json::from_str(text).unwrap();
        assert_eq!(decode_strict::<Outer>(text).unwrap(), plain);
        assert_eq!(
            decode_strict::<serde_json::Value>(text).unwrap(),
            serde_json::from_str::<serde_json::Value>(text).unwrap()
        );
    }

    #[test]
    fn a_duplicate_key_at_any_depth_is_refused() {
        for text in [
            // A field, a map entry, an object inside a list, an escaped
            // key equal to a plain one, a field the decoder skips.
            r#"{"name":"a","name":"b"}"#,
            r#"{"name":"a","labels":{"x":"1","x":"2"}}"#,
            r#"{"name":"a","items":[{"port":1},{"port":2,"port":3}]}"#,
            r#"{"name":"a","labels":{"x":"1","\u0078":"2"}}"#,
            r#"{"name":"a","skipped":{"deep":[{"k":1,"k":2}]}}"#,
        ] {
            let e = decode_strict::<Outer>(text).expect_err(text);
            assert!(e.to_string().contains("duplicate"), "{text}: {e}");
        }
    }

    #[test]
    fn many_keys_are_checked_past_the_inline_ones() {
        let labels: Vec<String> = (0..40).map(|i| format!(r#""k{i}":"v""#)).collect();
        let ok = format!(r#"{{"name":"a","labels":{{{}}}}}"#, labels.join(","));
        assert_eq!(decode_strict::<Outer>(&ok).unwrap().labels.len(), 40);
        for dup in [r#""k3":"v""#, r#""k39":"v""#] {
            let text = ok.replace(r#""k20":"v""#, dup);
            assert!(decode_strict::<Outer>(&text).is_err(), "{dup}");
        }
    }
}
