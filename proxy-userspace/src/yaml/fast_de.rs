//! [`ValueDe`]: the value at [`super::P`]'s cursor handed to a serde
//! visitor, and the accessors of the collections it reads.

use std::borrow::Cow;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use smallvec::SmallVec;

use super::{Node, Scalar, Unsupported, P, R};

/// The value at the cursor, as serde_json's `Value` would hand it to a
/// visitor: every request answered by what the value is, an option
/// `None` for null.
pub(super) struct ValueDe<'p, 'a> {
    pub(super) p: &'p mut P<'a>,
    pub(super) node: Node<'a>,
}

impl<'de, 'p> Deserializer<'de> for ValueDe<'p, 'de> {
    type Error = Unsupported;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> R<V::Value> {
        match self.node {
            Node::Null | Node::Scalar(Scalar::Null) => visitor.visit_unit(),
            Node::Scalar(Scalar::Bool(b)) => visitor.visit_bool(b),
            Node::Scalar(Scalar::U64(n)) => visitor.visit_u64(n),
            Node::Scalar(Scalar::I64(n)) => visitor.visit_i64(n),
            Node::Scalar(Scalar::Str(Cow::Borrowed(s))) => visitor.visit_borrowed_str(s),
            Node::Scalar(Scalar::Str(Cow::Owned(s))) => visitor.visit_string(s),
            Node::BlockMap { indent, mid_line } => {
                self.p.enter()?;
                visitor.visit_map(BlockMap {
                    p: self.p,
                    indent,
                    mid_line,
                    keys: Keys::default(),
                })
            }
            Node::BlockSeq { indent } => {
                self.p.enter()?;
                visitor.visit_seq(BlockSeq { p: self.p, indent })
            }
            Node::FlowSeq { block } => {
                self.p.enter()?;
                visitor.visit_seq(Flow::new(self.p, b']', block))
            }
            Node::FlowMap { block } => {
                self.p.enter()?;
                visitor.visit_map(Flow::new(self.p, b'}', block))
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> R<V::Value> {
        match self.node {
            Node::Null | Node::Scalar(Scalar::Null) => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> R<V::Value> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        _visitor: V,
    ) -> R<V::Value> {
        Err(Unsupported)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map struct
        identifier ignored_any
    }
}

/// A mapping key.
struct KeyDe<'a>(Cow<'a, str>);

impl<'de> Deserializer<'de> for KeyDe<'de> {
    type Error = Unsupported;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> R<V::Value> {
        match self.0 {
            Cow::Borrowed(s) => visitor.visit_borrowed_str(s),
            Cow::Owned(s) => visitor.visit_string(s),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

/// The keys of one mapping so far: a duplicate is [`Unsupported`] (the
/// general parser refuses it, naming it). Mappings are small (a linear
/// scan) except label maps, which get a set past a few keys.
#[derive(Default)]
struct Keys<'a> {
    few: SmallVec<[Cow<'a, str>; FEW_KEYS]>,
    many: hashbrown::HashSet<Cow<'a, str>>,
}

const FEW_KEYS: usize = 16;

impl<'a> Keys<'a> {
    fn insert(&mut self, key: Cow<'a, str>) -> R<()> {
        let fresh = if self.few.len() < FEW_KEYS {
            let fresh = !self.few.contains(&key);
            self.few.push(key);
            fresh
        } else {
            !self.few.contains(&key) && self.many.insert(key)
        };
        fresh.then_some(()).ok_or(Unsupported)
    }
}

/// The node after a block collection's indicator (a key's `:`, ending at
/// `after`, or an entry's `- `): on the lines below when nothing but a
/// comment follows on this one, else on this line. `in_map`: a mapping's
/// value (else a sequence entry, which cannot be a `-` again on its line).
fn block_value<'a>(p: &mut P<'a>, after: usize, indent: usize, in_map: bool) -> R<Node<'a>> {
    p.skip_spaces();
    match p.byte(p.pos) {
        None | Some(b'\n' | b'\r') => {}
        Some(b'#') if p.pos > after => {}
        Some(b'-') if !in_map && p.ends_token(p.pos + 1) => return Err(Unsupported),
        Some(_) => return p.inline(!in_map),
    }
    p.end_line()?;
    p.next_lines(indent, in_map)
}

struct BlockMap<'p, 'a> {
    p: &'p mut P<'a>,
    indent: usize,
    mid_line: bool,
    keys: Keys<'a>,
}

impl<'de> MapAccess<'de> for BlockMap<'_, 'de> {
    type Error = Unsupported;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> R<Option<K::Value>> {
        if self.mid_line {
            self.mid_line = false;
        } else {
            match self.p.content_line()? {
                None => {
                    self.p.depth -= 1;
                    return Ok(None);
                }
                Some(i) if i < self.indent => {
                    self.p.depth -= 1;
                    return Ok(None);
                }
                Some(i) if i == self.indent => self.p.pos += i,
                Some(_) => return Err(Unsupported),
            }
        }
        let key = self.p.key(false)?;
        self.keys.insert(key.clone())?;
        seed.deserialize(KeyDe(key)).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> R<V::Value> {
        let p = &mut *self.p;
        let node = block_value(p, p.pos, self.indent, true)?;
        seed.deserialize(ValueDe { p, node })
    }
}

struct BlockSeq<'p, 'a> {
    p: &'p mut P<'a>,
    indent: usize,
}

impl<'de> SeqAccess<'de> for BlockSeq<'_, 'de> {
    type Error = Unsupported;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> R<Option<T::Value>> {
        let p = &mut *self.p;
        let done = match p.content_line()? {
            None => true,
            Some(i) if i < self.indent => true,
            Some(i) if i > self.indent => return Err(Unsupported),
            Some(i) => {
                let at = p.pos + i;
                !(p.byte(at) == Some(b'-') && p.ends_token(at + 1))
            }
        };
        if done {
            // The line is the parent's to read.
            p.depth -= 1;
            return Ok(None);
        }
        p.pos += self.indent + 1;
        let node = block_value(p, p.pos, self.indent, false)?;
        seed.deserialize(ValueDe { p, node }).map(Some)
    }
}

/// A flow collection, `[...]` (a sequence) or `{...}` (a mapping, whose
/// keys are checked for duplicates).
struct Flow<'p, 'a> {
    p: &'p mut P<'a>,
    /// `]` or `}`.
    close: u8,
    /// Whether the collection ends its block line.
    block: bool,
    first: bool,
    keys: Keys<'a>,
}

impl<'p, 'a> Flow<'p, 'a> {
    fn new(p: &'p mut P<'a>, close: u8, block: bool) -> Self {
        Flow {
            p,
            close,
            block,
            first: true,
            keys: Keys::default(),
        }
    }

    /// Before the next entry: `true` at the closing bracket (read, with
    /// the rest of its line for a collection that ends a block line), else
    /// past the `,` that separates it from the one before. A `,` right
    /// before the bracket is [`Unsupported`].
    fn at_end(&mut self) -> R<bool> {
        let p = &mut *self.p;
        p.skip_spaces();
        if p.byte(p.pos) == Some(self.close) {
            p.pos += 1;
            p.depth -= 1;
            if self.block {
                p.end_line()?;
            }
            return Ok(true);
        }
        if !std::mem::take(&mut self.first) {
            if p.byte(p.pos) != Some(b',') {
                return Err(Unsupported);
            }
            p.pos += 1;
            p.skip_spaces();
            if p.byte(p.pos) == Some(self.close) {
                return Err(Unsupported);
            }
        }
        Ok(false)
    }

    fn value<S: DeserializeSeed<'a>>(&mut self, seed: S) -> R<S::Value> {
        let p = &mut *self.p;
        let node = p.flow()?;
        seed.deserialize(ValueDe { p, node })
    }
}

impl<'de> SeqAccess<'de> for Flow<'_, 'de> {
    type Error = Unsupported;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> R<Option<T::Value>> {
        if self.at_end()? {
            return Ok(None);
        }
        self.value(seed).map(Some)
    }
}

impl<'de> MapAccess<'de> for Flow<'_, 'de> {
    type Error = Unsupported;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> R<Option<K::Value>> {
        if self.at_end()? {
            return Ok(None);
        }
        // A `}` after the `,` is refused by at_end as the key would be.
        let key = self.p.key(true)?;
        self.keys.insert(key.clone())?;
        seed.deserialize(KeyDe(key)).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> R<V::Value> {
        self.p.skip_spaces();
        self.value(seed)
    }
}
