//! Fuzz target `h2_authority`: the HTTP/2 `:authority` rewriter the
//! unix-socket gRPC servers put in front of h2
//! (`grpc_unix::authority::Rewriter`), the input as what a client writes on
//! the connection. It is pushed whole, and again in 1- and 7-byte pieces
//! (reads split anywhere); on top of "no panic", the pieces must give the
//! same bytes and the same verdict as the whole.

#![no_main]

use ebpf_kube_proxy::grpc_unix::authority::{RewriteError, Rewriter};
use libfuzzer_sys::fuzz_target;

/// The server's input and the first error, feeding `pieces` of `size`.
fn rewrite(data: &[u8], size: usize) -> (Vec<u8>, Option<RewriteError>) {
    let mut rewriter = Rewriter::default();
    let mut out = Vec::new();
    for piece in data.chunks(size) {
        if let Err(e) = rewriter.push(piece, &mut out) {
            return (out, Some(e));
        }
    }
    (out, None)
}

fuzz_target!(|data: &[u8]| {
    let whole = rewrite(data, data.len().max(1));
    for size in [1, 7] {
        assert_eq!(rewrite(data, size), whole, "pieces of {size} bytes differ");
    }
});
