//! Makes any client's `:authority` acceptable on a unix socket (SPEC §10.1).
//!
//! gRPC C-core (Python, C++, Ruby, PHP) sends the percent-encoded socket
//! path as `:authority`, grpc-java and grpc-swift the raw path. hyper's h2
//! parses the value as an RFC 3986 authority and resets the stream with
//! `PROTOCOL_ERROR` when that fails (hyperium/h2#487, open since 2020), and
//! neither h2, hyper nor tonic has an option to relax it. A unix socket has
//! one authority, so the value carries no meaning here.
//!
//! Why this module exists instead of a crate or a patched h2: no maintained
//! crate does this, and a forked h2 would have to be kept in step with
//! every hyper release. The fix is instead at the byte stream the server
//! reads: [`Rewriter`] follows the client's HTTP/2 frames, decodes each
//! header block with its own HPACK decoder (the `loona-hpack` crate, so the
//! client's dynamic table is tracked exactly), replaces an `:authority`
//! value that is not a valid authority with `localhost`, and re-encodes the
//! block with its own HPACK encoder, whose dynamic table h2's decoder then
//! mirrors. Every other frame passes through byte for byte; nothing the
//! server writes is touched.
//!
//! Assumptions, both true of tonic's defaults, which the servers keep:
//! the server advertises neither `SETTINGS_HEADER_TABLE_SIZE` nor
//! `SETTINGS_MAX_FRAME_SIZE`, so both sides use the RFC 7541 / RFC 9113
//! defaults (4,096 bytes of table, 16,384-byte frames).

use loona_hpack::{Decoder, Encoder};

/// The client connection preface (RFC 9113 §3.4).
const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
/// Frames re-encoded header blocks are split into: the default
/// `SETTINGS_MAX_FRAME_SIZE`, which the servers do not raise.
const MAX_FRAME: usize = 16_384;
/// The default `SETTINGS_HEADER_TABLE_SIZE` (RFC 7541 §4.2).
const HPACK_TABLE: usize = 4_096;
/// Largest header block (compressed, and decoded as RFC 7541 §4.1 counts
/// it) accepted from a client. The APIs' requests carry a few hundred
/// bytes; this bounds what a hostile client can make the server hold.
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// What the server is given instead of an authority it cannot parse.
const REPLACEMENT: &[u8] = b"localhost";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RewriteError {
    #[error("HTTP/2 header block larger than {MAX_HEADER_BLOCK} bytes")]
    TooLarge,
    #[error("malformed HTTP/2 HEADERS frame (padding or priority longer than the frame)")]
    Malformed,
    #[error("undecodable HPACK header block: {0}")]
    Hpack(String),
}

impl From<RewriteError> for std::io::Error {
    fn from(e: RewriteError) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }
}

/// Where the parser is in the client's byte stream.
#[derive(Debug, Clone, Copy)]
enum State {
    /// The connection preface, passed through.
    Preface,
    /// Waiting for a complete 9-byte frame header.
    FrameHeader,
    /// Copying the rest of a frame that is not rewritten.
    Passthrough(usize),
    /// Collecting the payload of a HEADERS or CONTINUATION frame.
    HeaderPayload {
        len: usize,
        kind: u8,
        flags: u8,
        stream: u32,
    },
}

/// A header block split over HEADERS and CONTINUATION frames.
struct OpenBlock {
    stream: u32,
    end_stream: bool,
    fragments: Vec<u8>,
}

/// The client→server half of one connection: bytes in, bytes for h2 out.
pub struct Rewriter {
    state: State,
    /// Input not yet consumed (an incomplete preface, header or payload).
    pending: Vec<u8>,
    open: Option<OpenBlock>,
    decoder: Decoder<'static>,
    encoder: Encoder<'static>,
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(HPACK_TABLE);
        Self {
            state: State::Preface,
            pending: Vec::new(),
            open: None,
            decoder,
            encoder: Encoder::new(),
        }
    }
}

impl Rewriter {
    /// Consumes `input` and appends what the server should read to `out`.
    /// Incomplete frames are kept until the rest arrives. The entry fuzz/
    /// drives.
    pub fn push(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        loop {
            match self.state {
                State::Passthrough(n) => {
                    if input.is_empty() {
                        return Ok(());
                    }
                    let take = n.min(input.len());
                    out.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    self.state = match n - take {
                        0 => State::FrameHeader,
                        rest => State::Passthrough(rest),
                    };
                }
                State::Preface => {
                    let Some(preface) = self.fill(&mut input, PREFACE_LEN) else {
                        return Ok(());
                    };
                    out.extend_from_slice(&preface);
                    self.state = State::FrameHeader;
                }
                State::FrameHeader => {
                    let Some(h) = self.fill(&mut input, FRAME_HEADER_LEN) else {
                        return Ok(());
                    };
                    let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                    let (kind, flags) = (h[3], h[4]);
                    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                    if kind == HEADERS || (kind == CONTINUATION && self.open.is_some()) {
                        if len > MAX_HEADER_BLOCK {
                            return Err(RewriteError::TooLarge);
                        }
                        self.state = State::HeaderPayload {
                            len,
                            kind,
                            flags,
                            stream,
                        };
                    } else {
                        out.extend_from_slice(&h);
                        self.state = match len {
                            0 => State::FrameHeader,
                            n => State::Passthrough(n),
                        };
                    }
                }
                State::HeaderPayload {
                    len,
                    kind,
                    flags,
                    stream,
                } => {
                    let Some(payload) = self.fill(&mut input, len) else {
                        return Ok(());
                    };
                    self.header_frame(stream, kind, flags, &payload, out)?;
                    self.state = State::FrameHeader;
                }
            }
        }
    }

    /// Moves input into `pending` until it holds `n` bytes; then takes them.
    fn fill(&mut self, input: &mut &[u8], n: usize) -> Option<Vec<u8>> {
        let need = n - self.pending.len();
        let take = need.min(input.len());
        self.pending.extend_from_slice(&input[..take]);
        *input = &input[take..];
        (self.pending.len() == n).then(|| std::mem::take(&mut self.pending))
    }

    fn header_frame(
        &mut self,
        stream: u32,
        kind: u8,
        flags: u8,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), RewriteError> {
        let fragment = if kind == HEADERS {
            header_fragment(flags, payload)?
        } else {
            payload
        };
        let block = match (kind, self.open.as_mut()) {
            (HEADERS, _) => self.open.insert(OpenBlock {
                stream,
                end_stream: flags & END_STREAM != 0,
                fragments: Vec::new(),
            }),
            (_, Some(open)) => open,
            // CONTINUATION frames are only parsed while a block is open.
            (_, None) => return Err(RewriteError::Malformed),
        };
        if block.fragments.len() + fragment.len() > MAX_HEADER_BLOCK {
            return Err(RewriteError::TooLarge);
        }
        block.fragments.extend_from_slice(fragment);
        if flags & END_HEADERS == 0 {
            return Ok(());
        }
        let block = self.open.take().expect("inserted above");
        let encoded = self.reencode(&block.fragments)?;
        write_block(block.stream, block.end_stream, &encoded, out);
        Ok(())
    }

    /// Decodes a complete block, fixes `:authority`, encodes it again.
    fn reencode(&mut self, block: &[u8]) -> Result<Vec<u8>, RewriteError> {
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut size = 0usize;
        self.decoder
            .decode_with_cb(block, |name, value| {
                // RFC 7541 §4.1 size; past the cap, stop keeping fields.
                size += name.len() + value.len() + 32;
                if size <= MAX_HEADER_BLOCK {
                    fields.push((name.into_owned(), value.into_owned()));
                }
            })
            .map_err(|e| RewriteError::Hpack(format!("{e:?}")))?;
        if size > MAX_HEADER_BLOCK {
            return Err(RewriteError::TooLarge);
        }
        for (name, value) in &mut fields {
            if name == b":authority" && http::uri::Authority::try_from(value.as_slice()).is_err() {
                REPLACEMENT.clone_into(value);
            }
        }
        Ok(self
            .encoder
            .encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice()))))
    }
}

/// The header block fragment of a HEADERS payload, without padding and
/// priority fields (RFC 9113 §6.2).
fn header_fragment(flags: u8, payload: &[u8]) -> Result<&[u8], RewriteError> {
    let mut p = payload;
    let mut pad = 0usize;
    if flags & PADDED != 0 {
        let (&n, rest) = p.split_first().ok_or(RewriteError::Malformed)?;
        pad = usize::from(n);
        p = rest;
    }
    if flags & PRIORITY != 0 {
        p = p.get(5..).ok_or(RewriteError::Malformed)?;
    }
    p.get(..p.len().checked_sub(pad).ok_or(RewriteError::Malformed)?)
        .ok_or(RewriteError::Malformed)
}

/// Writes `block` as one HEADERS frame and as many CONTINUATION frames as
/// it needs (no padding, no priority).
fn write_block(stream: u32, end_stream: bool, block: &[u8], out: &mut Vec<u8>) {
    let mut chunks = block.chunks(MAX_FRAME).peekable();
    let mut kind = HEADERS;
    let mut flags = if end_stream { END_STREAM } else { 0 };
    // An empty block is still one HEADERS frame.
    let empty: &[u8] = &[];
    let mut next = chunks.next().unwrap_or(empty);
    loop {
        let last = chunks.peek().is_none();
        if last {
            flags |= END_HEADERS;
        }
        let len = next.len();
        out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(next);
        match chunks.next() {
            Some(c) => next = c,
            None => return,
        }
        kind = CONTINUATION;
        flags = 0;
    }
}

#[cfg(test)]
#[path = "authority_tests.rs"]
mod tests;
