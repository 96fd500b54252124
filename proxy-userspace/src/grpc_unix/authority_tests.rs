use loona_hpack::{Decoder, Encoder};

use super::*;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn request(authority: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/localnet.v1.Endpoints/Next"),
        (":authority", authority),
        ("te", "trailers"),
        ("content-type", "application/grpc"),
    ]
    .iter()
    .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
    .collect()
}

fn encode(enc: &mut Encoder<'static>, fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    enc.encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
}

/// Splits the server's input into frames: (kind, flags, stream, payload).
fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    assert_eq!(&bytes[..24], PREFACE);
    bytes = &bytes[24..];
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        let stream = u32::from_be_bytes(bytes[5..9].try_into().unwrap());
        out.push((bytes[3], bytes[4], stream, bytes[9..9 + len].to_vec()));
        bytes = &bytes[9 + len..];
    }
    out
}

/// Decodes every header block the server would see, as h2 does, with one
/// decoder for the connection.
fn blocks_seen(bytes: &[u8]) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut dec = Decoder::new();
    let mut blocks = Vec::new();
    let mut open = Vec::new();
    for (kind, flags, _, payload) in frames(bytes) {
        if kind == HEADERS || kind == CONTINUATION {
            open.extend_from_slice(&payload);
            if flags & END_HEADERS != 0 {
                blocks.push(dec.decode(&open).unwrap());
                open.clear();
            }
        }
    }
    blocks
}

fn authority_of(block: &[(Vec<u8>, Vec<u8>)]) -> String {
    let (_, v) = block.iter().find(|(n, _)| n == b":authority").unwrap();
    String::from_utf8(v.clone()).unwrap()
}

fn rewrite(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    Rewriter::default().push(input, &mut out).unwrap();
    out
}

/// A client connection: two requests on streams 1 and 3 (the second
/// refers to the first's dynamic-table entries), each with a DATA frame.
fn two_requests(authority: &str) -> Vec<u8> {
    let mut enc = Encoder::new();
    let mut c = PREFACE.to_vec();
    c.extend(frame(0x4, 0, 0, &[0, 4, 0, 0, 0xff, 0xff])); // SETTINGS
    for stream in [1, 3] {
        let block = encode(&mut enc, &request(authority));
        c.extend(frame(HEADERS, END_HEADERS, stream, &block));
        c.extend(frame(0x0, END_STREAM, stream, &[0, 0, 0, 0, 2, 8, 1]));
    }
    c
}

#[test]
fn percent_encoded_and_raw_paths_become_localhost_on_every_request() {
    for authority in [
        "%2Frun%2Febpf-kube-proxy%2Flocalnet.sock",
        "/run/x/podinfo.sock",
    ] {
        let out = rewrite(&two_requests(authority));
        let blocks = blocks_seen(&out);
        assert_eq!(blocks.len(), 2);
        for block in &blocks {
            assert_eq!(authority_of(block), "localhost");
            let mut expected = request("localhost");
            expected.retain(|(n, _)| n != b":authority");
            for field in expected {
                assert!(block.contains(&field), "{field:?} lost");
            }
        }
    }
}

#[test]
fn a_valid_authority_and_every_other_frame_pass_unchanged() {
    let input = two_requests("localhost:12345");
    let out = rewrite(&input);
    for block in blocks_seen(&out) {
        assert_eq!(authority_of(&block), "localhost:12345");
    }
    let others =
        |b: &[u8]| -> Vec<_> { frames(b).into_iter().filter(|f| f.0 != HEADERS).collect() };
    assert_eq!(others(&out), others(&input));
}

#[test]
fn byte_at_a_time_input_gives_the_same_output() {
    let input = two_requests("%2Ftmp%2Fa.sock");
    let mut r = Rewriter::default();
    let mut out = Vec::new();
    for b in &input {
        r.push(std::slice::from_ref(b), &mut out).unwrap();
    }
    assert_eq!(out, rewrite(&input));
}

#[test]
fn padding_priority_and_continuation_frames_are_understood() {
    let mut enc = Encoder::new();
    let block = encode(&mut enc, &request("/raw/path.sock"));
    let (first, rest) = block.split_at(10);
    let mut payload = vec![3u8]; // pad length
    payload.extend_from_slice(&[0, 0, 0, 0, 16]); // priority
    payload.extend_from_slice(first);
    payload.extend_from_slice(&[0, 0, 0]);
    let mut c = PREFACE.to_vec();
    c.extend(frame(HEADERS, PADDED | PRIORITY | END_STREAM, 5, &payload));
    c.extend(frame(CONTINUATION, END_HEADERS, 5, rest));
    let out = rewrite(&c);
    let fs = frames(&out);
    assert_eq!(fs.len(), 1, "one HEADERS frame with the whole block");
    let (kind, flags, stream, _) = &fs[0];
    assert_eq!(
        (*kind, *flags, *stream),
        (HEADERS, END_STREAM | END_HEADERS, 5)
    );
    assert_eq!(authority_of(&blocks_seen(&out)[0]), "localhost");
}

#[test]
fn a_block_larger_than_a_frame_is_split_into_continuations() {
    let mut fields = request("%2Fa");
    fields.push((b"x-big".to_vec(), vec![b'a'; 40_000]));
    let block = encode(&mut Encoder::new(), &fields);
    let mut c = PREFACE.to_vec();
    c.extend(frame(HEADERS, END_HEADERS, 1, &block));
    let out = rewrite(&c);
    let kinds: Vec<(u8, u8)> = frames(&out).iter().map(|f| (f.0, f.1)).collect();
    assert_eq!(
        kinds,
        [(HEADERS, 0), (CONTINUATION, 0), (CONTINUATION, END_HEADERS)]
    );
    let seen = &blocks_seen(&out)[0];
    assert_eq!(authority_of(seen), "localhost");
    assert!(seen.contains(&(b"x-big".to_vec(), vec![b'a'; 40_000])));
}

#[test]
fn oversized_and_expanding_blocks_close_the_connection() {
    let mut c = PREFACE.to_vec();
    c.extend(frame(
        HEADERS,
        END_HEADERS,
        1,
        &vec![0u8; MAX_HEADER_BLOCK + 1],
    ));
    let mut out = Vec::new();
    assert_eq!(
        Rewriter::default().push(&c, &mut out),
        Err(RewriteError::TooLarge)
    );

    // One 3 KiB table entry referenced 100 times: 300 KiB decoded from a
    // block of about 3 KiB.
    let mut enc = Encoder::new();
    let mut block = encode(&mut enc, &[(b"x-a".to_vec(), vec![b'a'; 3000])]);
    block.extend(std::iter::repeat_n(0x80 | 62, 100)); // indexed: dynamic entry 1
    let mut c = PREFACE.to_vec();
    c.extend(frame(HEADERS, END_HEADERS, 1, &block));
    assert_eq!(
        Rewriter::default().push(&c, &mut Vec::new()),
        Err(RewriteError::TooLarge)
    );
}

#[test]
fn garbage_in_a_header_block_is_an_error_not_a_panic() {
    let mut c = PREFACE.to_vec();
    c.extend(frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff, 0xff]));
    assert!(matches!(
        Rewriter::default().push(&c, &mut Vec::new()),
        Err(RewriteError::Hpack(_))
    ));
    let mut c = PREFACE.to_vec();
    c.extend(frame(HEADERS, PADDED | END_HEADERS, 1, &[200, 1, 2]));
    assert_eq!(
        Rewriter::default().push(&c, &mut Vec::new()),
        Err(RewriteError::Malformed)
    );
}
