//! The fast path of YAML reading: a serde `Deserializer` of our own over
//! the YAML that `kubectl get -o yaml` and people write for manifests,
//! decoding straight into the caller's types with no event stream and no
//! `Value` tree in between.
//!
//! It reads a subset: block mappings and sequences (a sequence may sit at
//! its key's indentation, as kubectl writes it), flow mappings and
//! sequences on one line, plain scalars and single-line quoted ones,
//! comments, `---` between documents. Anything else — anchors and aliases,
//! tags, block scalars (`|`, `>`), multi-line scalars or flow collections,
//! directives, tabs, complex keys — and anything wrong (a duplicate key,
//! bad indentation, nesting past [`MAX_DEPTH`], a value the caller's type
//! refuses) is [`Unsupported`]: the caller then reads the text with the
//! general parser ([`super::documents`]), which reads or reports it as it
//! always did. So what this path answers is what the general one would
//! answer, and every error still comes from the general one.
//!
//! Plain scalars resolve as the general parser resolves them into a value
//! (YAML 1.2 core schema, strict booleans): `null`, `~` and nothing are
//! null, `true`/`false` booleans (`yes` and `on` are text), decimal
//! integers numbers, and text that
//! no YAML reader takes for anything but text is a string. Everything
//! else that might be a number (`1.5`, `0x1f`, `1_000`, `.inf`) is
//! [`Unsupported`], not guessed.

use std::borrow::Cow;
use std::fmt;

use serde::de;

use de_impl::ValueDe;

/// The serde side: the deserializer and its accessors.
#[path = "fast_de.rs"]
mod de_impl;

/// Deepest nesting read here (the general parser has its own limit).
pub const MAX_DEPTH: usize = 64;

/// Not read here: the general parser decides.
#[derive(Debug)]
pub struct Unsupported;

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not in the YAML fast path's subset")
    }
}

impl std::error::Error for Unsupported {}

impl de::Error for Unsupported {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Unsupported
    }
}

type R<T> = Result<T, Unsupported>;

/// The text of every non-empty document of a stream (empty ones, and ones
/// of nothing but comments, left out), or `None`: a directive, a `...`
/// marker, a `---` line with more on it, a byte-order mark.
pub fn documents(text: &str) -> Option<Vec<&str>> {
    if text.starts_with('\u{feff}') {
        return None;
    }
    let mut docs = Vec::new();
    let mut start = 0;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        if bare.starts_with("---") {
            if bare != "---" {
                return None;
            }
            push(&mut docs, &text[start..offset]);
            start = offset + line.len();
        } else if bare.starts_with("...") || bare.starts_with('%') {
            return None;
        }
        offset += line.len();
    }
    push(&mut docs, &text[start..]);
    Some(docs)
}

fn push<'a>(docs: &mut Vec<&'a str>, doc: &'a str) {
    let content = doc.lines().any(|l| {
        let l = l.trim_start_matches(' ');
        !l.trim_end().is_empty() && !l.starts_with('#')
    });
    if content {
        docs.push(doc);
    }
}

/// One document (from [`documents`]) as a `T`: its root must be a block
/// mapping at column 0.
pub fn from_document<'a, T: de::Deserialize<'a>>(doc: &'a str) -> R<T> {
    let mut p = P::new(doc);
    match p.content_line()? {
        Some(0) => {}
        _ => return Err(Unsupported),
    }
    let value = T::deserialize(ValueDe {
        p: &mut p,
        node: Node::BlockMap {
            indent: 0,
            mid_line: false,
        },
    })?;
    match p.content_line()? {
        None => Ok(value),
        Some(_) => Err(Unsupported),
    }
}

/// The string value of the top-level key `key` of a document (a line at
/// column 0, `key: value`, the key maybe quoted), as the full read would
/// find it; `None` when missing, given twice, or not a string on the
/// key's line.
pub fn top_level_string<'a>(doc: &'a str, key: &str) -> Option<Cow<'a, str>> {
    let mut found = None;
    let mut offset = 0;
    for line in doc.split_inclusive('\n') {
        let quoted = line.starts_with(['"', '\'']);
        if quoted || line.starts_with(key) {
            let mut p = P::new(doc);
            p.pos = offset;
            if p.key(false).is_ok_and(|k| k == key) {
                if found.is_some() {
                    return None;
                }
                found = Some(p.top_level_value()?);
            }
        }
        offset += line.len();
    }
    found
}

/// A resolved scalar.
#[derive(Debug, Clone, PartialEq)]
enum Scalar<'a> {
    Null,
    Bool(bool),
    U64(u64),
    I64(i64),
    Str(Cow<'a, str>),
}

/// What the value at the cursor is; collections are read by their
/// accessors as the visitor asks.
enum Node<'a> {
    Null,
    Scalar(Scalar<'a>),
    /// The cursor is at its first key (`mid_line`: after a `- `) or at the
    /// start of that key's line.
    BlockMap {
        indent: usize,
        mid_line: bool,
    },
    /// The cursor is at the start of the line of its first `-`.
    BlockSeq {
        indent: usize,
    },
    /// The cursor is past the opening bracket; `block`: the collection is
    /// a value in block context, its line ends after it.
    FlowSeq {
        block: bool,
    },
    FlowMap {
        block: bool,
    },
}

/// How a plain scalar in block context ended.
#[derive(PartialEq)]
enum Stop {
    /// It is a key: the cursor is at its `:`.
    Key,
    /// The line ends (maybe with a comment).
    Line,
}

/// The cursor over one document.
struct P<'a> {
    t: &'a str,
    s: &'a [u8],
    pos: usize,
    depth: usize,
}

impl<'a> P<'a> {
    fn new(t: &'a str) -> Self {
        P {
            t,
            s: t.as_bytes(),
            pos: 0,
            depth: 0,
        }
    }

    fn byte(&self, at: usize) -> Option<u8> {
        self.s.get(at).copied()
    }

    /// Whether the byte at `at` ends a token: a space, a line break, the end.
    fn ends_token(&self, at: usize) -> bool {
        matches!(self.byte(at), None | Some(b' ' | b'\n' | b'\r'))
    }

    fn skip_spaces(&mut self) {
        while self.byte(self.pos) == Some(b' ') {
            self.pos += 1;
        }
    }

    /// From the start of a line: skips blank and comment lines, leaves the
    /// cursor at the start of the next line with content and returns its
    /// indentation (`None` at the end of the document).
    fn content_line(&mut self) -> R<Option<usize>> {
        loop {
            let start = self.pos;
            let mut i = start;
            while self.byte(i) == Some(b' ') {
                i += 1;
            }
            match self.byte(i) {
                None => {
                    self.pos = i;
                    return Ok(None);
                }
                Some(b'\t') => return Err(Unsupported),
                Some(b'\n' | b'#') => {}
                Some(b'\r') if self.byte(i + 1) == Some(b'\n') => {}
                Some(_) => return Ok(Some(i - start)),
            }
            self.pos = match memchr(b'\n', &self.s[i..]) {
                Some(n) => i + n + 1,
                None => self.s.len(),
            };
        }
    }

    /// After a value on its line: spaces, maybe a comment, the line break.
    fn end_line(&mut self) -> R<()> {
        self.skip_spaces();
        match self.byte(self.pos) {
            None => return Ok(()),
            Some(b'\n') => {}
            Some(b'\r') if self.byte(self.pos + 1) == Some(b'\n') => self.pos += 1,
            // A comment follows a space (or starts its line).
            Some(b'#') if self.pos == 0 || matches!(self.s[self.pos - 1], b' ' | b'\n') => {
                match memchr(b'\n', &self.s[self.pos..]) {
                    Some(n) => self.pos += n,
                    None => {
                        self.pos = self.s.len();
                        return Ok(());
                    }
                }
            }
            Some(_) => return Err(Unsupported),
        }
        self.pos += 1;
        Ok(())
    }

    fn line_start(&self) -> usize {
        self.s[..self.pos]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1)
    }

    /// The value of a top-level key on its own line, as a string.
    fn top_level_value(&mut self) -> Option<Cow<'a, str>> {
        self.skip_spaces();
        match self.inline(false).ok()? {
            Node::Scalar(Scalar::Str(s)) => Some(s),
            _ => None,
        }
    }

    /// The value after `key:` or `-` when nothing follows on its line: the
    /// block node on the next lines indented past `parent`, a sequence at
    /// `parent` itself when `seq_at_parent` (kubectl's style), else null.
    fn next_lines(&mut self, parent: usize, seq_at_parent: bool) -> R<Node<'a>> {
        let Some(indent) = self.content_line()? else {
            return Ok(Node::Null);
        };
        let at = self.pos + indent;
        let dash = self.byte(at) == Some(b'-') && self.ends_token(at + 1);
        if indent == parent && seq_at_parent && dash {
            return Ok(Node::BlockSeq { indent });
        }
        if indent <= parent {
            // The line is the parent's to read.
            return Ok(Node::Null);
        }
        if dash {
            return Ok(Node::BlockSeq { indent });
        }
        let start = self.pos;
        self.pos = at;
        match self.inline(true)? {
            Node::BlockMap { .. } => {
                self.pos = start;
                Ok(Node::BlockMap {
                    indent,
                    mid_line: false,
                })
            }
            // A scalar alone on its line; one continued on the next line
            // (more indented than the key) fails the caller's next read.
            node => Ok(node),
        }
    }

    /// The value starting at the cursor on this line, in block context;
    /// `may_be_map`: after `- ` (or alone on its line), where `key: value`
    /// starts a mapping at the key's column.
    fn inline(&mut self, may_be_map: bool) -> R<Node<'a>> {
        let start = self.pos;
        let node = match self.byte(self.pos) {
            None | Some(b'\n' | b'\r' | b'#') => return Err(Unsupported),
            Some(b'"') => Scalar::Str(self.double_quoted()?),
            Some(b'\'') => Scalar::Str(self.single_quoted()?),
            Some(b'[') => {
                self.pos += 1;
                return Ok(Node::FlowSeq { block: true });
            }
            Some(b'{') => {
                self.pos += 1;
                return Ok(Node::FlowMap { block: true });
            }
            Some(c) if is_indicator(c) => return Err(Unsupported),
            Some(b'-' | b':') if self.ends_token(self.pos + 1) => return Err(Unsupported),
            Some(_) => {
                let (text, stop) = self.plain_block()?;
                if stop == Stop::Key {
                    if !may_be_map {
                        return Err(Unsupported);
                    }
                    self.pos = start;
                    return Ok(Node::BlockMap {
                        indent: start - self.line_start(),
                        mid_line: true,
                    });
                }
                self.end_line()?;
                return Ok(Node::Scalar(resolve(text)?));
            }
        };
        // A quoted scalar: a key when a `:` follows.
        self.skip_spaces();
        if self.byte(self.pos) == Some(b':') && self.ends_token(self.pos + 1) {
            if !may_be_map {
                return Err(Unsupported);
            }
            self.pos = start;
            return Ok(Node::BlockMap {
                indent: start - self.line_start(),
                mid_line: true,
            });
        }
        self.end_line()?;
        Ok(Node::Scalar(node))
    }

    /// A plain scalar in block context: up to `: ` (a key), ` #` or the
    /// end of the line, trailing spaces left out.
    fn plain_block(&mut self) -> R<(&'a str, Stop)> {
        let start = self.pos;
        let mut i = start;
        let stop = loop {
            match self.byte(i) {
                None | Some(b'\n' | b'\r') => break Stop::Line,
                Some(b':') if self.ends_token(i + 1) => break Stop::Key,
                Some(b'#') if self.s[i - 1] == b' ' => break Stop::Line,
                Some(b'\t') => return Err(Unsupported),
                Some(_) => i += 1,
            }
        };
        self.pos = i;
        Ok((self.t[start..i].trim_end_matches(' '), stop))
    }

    /// A plain scalar in a flow collection: up to `,`, `]`, `}` or `: `.
    fn plain_flow(&mut self) -> R<&'a str> {
        let start = self.pos;
        let mut i = start;
        loop {
            match self.byte(i) {
                None | Some(b'\n' | b'\r' | b'\t' | b'[' | b'{') => return Err(Unsupported),
                Some(b',' | b']' | b'}') => break,
                Some(b':') if self.ends_token(i + 1) => break,
                Some(b'#') if self.s[i - 1] == b' ' => return Err(Unsupported),
                Some(_) => i += 1,
            }
        }
        self.pos = i;
        Ok(self.t[start..i].trim_end_matches(' '))
    }

    /// `"…"` on one line, escapes decoded; the cursor at the opening quote.
    fn double_quoted(&mut self) -> R<Cow<'a, str>> {
        let start = self.pos + 1;
        let mut i = start;
        let mut owned: Option<String> = None;
        let mut run = start;
        loop {
            match self.byte(i) {
                None | Some(b'\n' | b'\r') => return Err(Unsupported),
                Some(b'"') => break,
                Some(b'\\') => {
                    let out = owned.get_or_insert_with(String::new);
                    out.push_str(&self.t[run..i]);
                    let (c, len) = match self.byte(i + 1) {
                        Some(b'"') => ('"', 2),
                        Some(b'\\') => ('\\', 2),
                        Some(b'/') => ('/', 2),
                        Some(b'n') => ('\n', 2),
                        Some(b't') => ('\t', 2),
                        Some(b'r') => ('\r', 2),
                        Some(b'0') => ('\0', 2),
                        Some(b'u') => {
                            let hex = self.t.get(i + 2..i + 6).ok_or(Unsupported)?;
                            let code = u32::from_str_radix(hex, 16).map_err(|_| Unsupported)?;
                            (char::from_u32(code).ok_or(Unsupported)?, 6)
                        }
                        _ => return Err(Unsupported),
                    };
                    out.push(c);
                    i += len;
                    run = i;
                }
                Some(_) => i += 1,
            }
        }
        self.pos = i + 1;
        Ok(match owned {
            None => Cow::Borrowed(&self.t[start..i]),
            Some(mut out) => {
                out.push_str(&self.t[run..i]);
                Cow::Owned(out)
            }
        })
    }

    /// `'…'` on one line, `''` as one quote; the cursor at the opening quote.
    fn single_quoted(&mut self) -> R<Cow<'a, str>> {
        let start = self.pos + 1;
        let mut i = start;
        let mut owned: Option<String> = None;
        loop {
            match self.byte(i) {
                None | Some(b'\n' | b'\r') => return Err(Unsupported),
                Some(b'\'') if self.byte(i + 1) == Some(b'\'') => {
                    let out = owned.get_or_insert_with(String::new);
                    out.push_str(&self.t[start..i]);
                    // Rare enough to finish by hand: the rest, unescaped.
                    let mut j = i + 2;
                    out.push('\'');
                    loop {
                        match self.byte(j) {
                            None | Some(b'\n' | b'\r') => return Err(Unsupported),
                            Some(b'\'') if self.byte(j + 1) == Some(b'\'') => {
                                out.push('\'');
                                j += 2;
                            }
                            Some(b'\'') => break,
                            Some(_) => {
                                let c = self.t[j..].chars().next().ok_or(Unsupported)?;
                                out.push(c);
                                j += c.len_utf8();
                            }
                        }
                    }
                    self.pos = j + 1;
                    return Ok(Cow::Owned(owned.unwrap_or_default()));
                }
                Some(b'\'') => break,
                Some(_) => i += 1,
            }
        }
        self.pos = i + 1;
        Ok(Cow::Borrowed(&self.t[start..i]))
    }

    /// A value inside a flow collection.
    fn flow(&mut self) -> R<Node<'a>> {
        Ok(match self.byte(self.pos) {
            Some(b'"') => Node::Scalar(Scalar::Str(self.double_quoted()?)),
            Some(b'\'') => Node::Scalar(Scalar::Str(self.single_quoted()?)),
            Some(b'[') => {
                self.pos += 1;
                Node::FlowSeq { block: false }
            }
            Some(b'{') => {
                self.pos += 1;
                Node::FlowMap { block: false }
            }
            None => return Err(Unsupported),
            Some(c) if is_indicator(c) || c == b',' => return Err(Unsupported),
            Some(b'-' | b':') if self.ends_token(self.pos + 1) => return Err(Unsupported),
            Some(_) => Node::Scalar(resolve(self.plain_flow()?)?),
        })
    }

    /// A mapping key at the cursor, the cursor left past its `:`.
    fn key(&mut self, flow: bool) -> R<Cow<'a, str>> {
        let key = match self.byte(self.pos) {
            Some(b'"') => self.double_quoted()?,
            Some(b'\'') => self.single_quoted()?,
            Some(c) if is_indicator(c) || c == b'-' || c == b':' => return Err(Unsupported),
            _ => {
                let text = if flow {
                    self.plain_flow()?
                } else {
                    let (text, stop) = self.plain_block()?;
                    if stop != Stop::Key {
                        return Err(Unsupported);
                    }
                    text
                };
                match resolve(text)? {
                    Scalar::Str(s) => s,
                    _ => return Err(Unsupported),
                }
            }
        };
        if !flow {
            self.skip_spaces();
        }
        if self.byte(self.pos) != Some(b':') || !self.ends_token(self.pos + 1) {
            return Err(Unsupported);
        }
        self.pos += 1;
        Ok(key)
    }

    fn enter(&mut self) -> R<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Unsupported);
        }
        Ok(())
    }
}

/// Bytes that cannot start a plain scalar here (or start what this path
/// does not read: anchors, aliases, tags, block scalars, directives).
fn is_indicator(c: u8) -> bool {
    matches!(
        c,
        b'&' | b'*' | b'!' | b'|' | b'>' | b'%' | b'@' | b'`' | b'?' | b']' | b'}' | b'#' | b'\t'
    )
}

fn memchr(needle: u8, haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|&b| b == needle)
}

/// A plain scalar as the general parser resolves it into a value, or
/// [`Unsupported`] where this path does not decide.
fn resolve(text: &str) -> R<Scalar<'_>> {
    let Some(&first) = text.as_bytes().first() else {
        return Ok(Scalar::Null);
    };
    match text {
        "~" | "null" | "Null" | "NULL" => return Ok(Scalar::Null),
        "true" | "True" | "TRUE" => return Ok(Scalar::Bool(true)),
        "false" | "False" | "FALSE" => return Ok(Scalar::Bool(false)),
        _ => {}
    }
    let digits = text.strip_prefix('-').unwrap_or(text);
    let decimal = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits.len() == 1 || !digits.starts_with('0'));
    if decimal {
        return if text.starts_with('-') {
            text.parse().map(Scalar::I64).map_err(|_| Unsupported)
        } else {
            text.parse().map(Scalar::U64).map_err(|_| Unsupported)
        };
    }
    let text_like = match first {
        // `yes`, `on`, `y` and the like too: booleans only to YAML 1.1,
        // and the general parser reads YAML 1.2 booleans only.
        b'a'..=b'z' | b'A'..=b'Z' => !matches!(
            text.to_ascii_lowercase().as_str(),
            "inf" | "infinity" | "nan"
        ),
        // Addresses, uids, dates: text unless some reader takes it for a
        // number (`1e3`, `0x1f`, `1_000`, `0127`).
        b'0'..=b'9' => !text.contains('_') && text.parse::<f64>().is_err() && !radix_number(text),
        b'/' => true,
        _ => false,
    };
    if text_like {
        Ok(Scalar::Str(Cow::Borrowed(text)))
    } else {
        Err(Unsupported)
    }
}

/// `0x1f`, `0o17`, `0b101`: a number to the general parser. (`0b02996a-…`,
/// a uid, is text to it: not all binary digits.)
fn radix_number(text: &str) -> bool {
    let radix = match text.as_bytes() {
        [b'0', b'x' | b'X', ..] => 16,
        [b'0', b'o' | b'O', ..] => 8,
        [b'0', b'b' | b'B', ..] => 2,
        _ => return false,
    };
    let digits = &text[2..];
    !digits.is_empty() && digits.chars().all(|c| c.is_digit(radix))
}

#[cfg(test)]
#[path = "fast_tests.rs"]
mod tests;
