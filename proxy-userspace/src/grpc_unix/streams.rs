//! Which HTTP/2 streams of one server connection are open, read off the
//! frame headers passing in both directions (RFC 9113 §4.1, §5.1), so the
//! connection limit can tell an idle connection from a busy one without
//! hooking into hyper or tonic.
//!
//! A stream is open from the client's HEADERS until the server ends it
//! (HEADERS or DATA with END_STREAM: the gRPC trailers) or either side
//! resets it (RST_STREAM). A client's half-close does not end it: the
//! server is still answering. Payloads are skipped, never parsed.

use std::collections::HashSet;

/// The client connection preface (RFC 9113 §3.4).
const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const END_STREAM: u8 = 0x1;

/// Streams tracked at most. A client cannot open more than the server's
/// `SETTINGS_MAX_CONCURRENT_STREAMS` (h2 resets the excess, which removes
/// them again); this only bounds what a broken peer makes us hold.
const MAX_TRACKED: usize = 4096;

/// Splits one direction's bytes into frame headers.
#[derive(Debug)]
struct FrameScanner {
    /// Preface bytes still to skip (client direction only).
    preface: usize,
    head: [u8; FRAME_HEADER_LEN],
    have: usize,
    /// Payload bytes of the current frame still to skip.
    skip: usize,
}

impl FrameScanner {
    fn new(preface: usize) -> Self {
        Self {
            preface,
            head: [0; FRAME_HEADER_LEN],
            have: 0,
            skip: 0,
        }
    }

    /// Calls `frame(kind, flags, stream)` for each frame header completed
    /// by `bytes`.
    fn scan(&mut self, mut bytes: &[u8], mut frame: impl FnMut(u8, u8, u32)) {
        while !bytes.is_empty() {
            if self.preface > 0 {
                let n = self.preface.min(bytes.len());
                self.preface -= n;
                bytes = &bytes[n..];
                continue;
            }
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (FRAME_HEADER_LEN - self.have).min(bytes.len());
            self.head[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == FRAME_HEADER_LEN {
                self.have = 0;
                let h = self.head;
                self.skip = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                frame(h[3], h[4], stream);
            }
        }
    }
}

/// The open streams of one server-side connection.
#[derive(Debug)]
pub struct StreamTracker {
    from_client: FrameScanner,
    from_server: FrameScanner,
    open: HashSet<u32>,
}

impl Default for StreamTracker {
    fn default() -> Self {
        Self {
            from_client: FrameScanner::new(PREFACE_LEN),
            from_server: FrameScanner::new(0),
            open: HashSet::new(),
        }
    }
}

impl StreamTracker {
    /// Bytes the server read from the client.
    pub fn client_bytes(&mut self, bytes: &[u8]) {
        let open = &mut self.open;
        self.from_client.scan(bytes, |kind, _, stream| match kind {
            HEADERS if stream != 0 && open.len() < MAX_TRACKED => {
                open.insert(stream);
            }
            RST_STREAM => {
                open.remove(&stream);
            }
            _ => {}
        });
    }

    /// Bytes the server wrote to the client.
    pub fn server_bytes(&mut self, bytes: &[u8]) {
        let open = &mut self.open;
        self.from_server
            .scan(bytes, |kind, flags, stream| match kind {
                DATA | HEADERS if flags & END_STREAM != 0 => {
                    open.remove(&stream);
                }
                RST_STREAM => {
                    open.remove(&stream);
                }
                _ => {}
            });
    }

    /// Streams open now.
    pub fn open(&self) -> usize {
        self.open.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload_len: usize) -> Vec<u8> {
        let len = payload_len;
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend(std::iter::repeat_n(0xAB, payload_len));
        f
    }

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    #[test]
    fn a_stream_is_open_from_the_request_until_the_trailers_or_a_reset() {
        let mut t = StreamTracker::default();
        let mut client = PREFACE.to_vec();
        client.extend(frame(0x4, 0, 0, 6)); // SETTINGS
        client.extend(frame(HEADERS, 0x4, 1, 40));
        client.extend(frame(DATA, END_STREAM, 1, 7)); // half-close
        client.extend(frame(HEADERS, 0x4, 3, 20));
        // Byte at a time: frames split anywhere are still seen.
        for b in &client {
            t.client_bytes(std::slice::from_ref(b));
        }
        assert_eq!(t.open(), 2, "a half-closed request is still open");

        let mut server = frame(0x4, 0, 0, 12);
        server.extend(frame(HEADERS, 0x4, 1, 10)); // response headers
        server.extend(frame(DATA, 0, 1, 100_000));
        t.server_bytes(&server);
        assert_eq!(t.open(), 2);
        t.server_bytes(&frame(HEADERS, 0x4 | END_STREAM, 1, 15)); // trailers
        assert_eq!(t.open(), 1);
        t.client_bytes(&frame(RST_STREAM, 0, 3, 4));
        assert_eq!(t.open(), 0);

        t.client_bytes(&frame(HEADERS, 0x4, 5, 20));
        t.server_bytes(&frame(RST_STREAM, 0, 5, 4));
        assert_eq!(t.open(), 0, "a stream the server refused");
    }
}
