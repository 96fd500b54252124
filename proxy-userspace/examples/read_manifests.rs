//! Reads a manifest directory as the daemon's file source reads it at
//! start — every file read and parsed on the source's loader threads, the
//! changes sent in batches — and prints one JSON line: the bytes of the
//! manifests, the seconds from opening the directory to `Synced`, the
//! objects sent and the errors met.
//!
//! ```text
//! read_manifests DIR [--parse-only]
//! ```
//!
//! `--parse-only` times the parse of each file on one thread instead
//! (no source, no hashing): the parser's own rate.
//!
//! `cargo xtask bench --only yaml` runs it on one generated cluster written
//! as kubectl-style YAML and as JSON.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use ebpf_kube_proxy::sources::{self, file, SourceMessage};
use tokio_util::sync::CancellationToken;

fn main() -> Result<()> {
    let mut args = std::env::args_os().skip(1);
    let dir = PathBuf::from(
        args.next()
            .context("usage: read_manifests DIR [--parse-only]")?,
    );
    let parse_only = args.next().is_some_and(|a| a == "--parse-only");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path
            .extension()
            .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
        {
            files.push(path);
        }
    }
    let mut bytes = 0;
    for f in &files {
        bytes += std::fs::metadata(f)?.len();
    }
    let (seconds, objects, errors) = if parse_only {
        let texts: Vec<(PathBuf, String)> = files
            .into_iter()
            .map(|f| std::fs::read_to_string(&f).map(|t| (f, t)))
            .collect::<Result<_, _>>()?;
        let started = Instant::now();
        let (mut objects, mut errors) = (0, 0);
        for (path, text) in &texts {
            match file::parse_manifest(path, text) {
                Ok(o) => objects += o.len(),
                Err(e) => errors += e.len(),
            }
        }
        (started.elapsed().as_secs_f64(), objects, errors)
    } else {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        runtime.block_on(read(dir))?
    };
    println!(
        "{}",
        serde_json::json!({"bytes": bytes, "seconds": seconds, "objects": objects, "errors": errors})
    );
    Ok(())
}

/// The file source from `open` to `Synced`: (seconds, objects, errors).
async fn read(dir: PathBuf) -> Result<(f64, usize, usize)> {
    let started = Instant::now();
    let manifests = file::ManifestDir::open(&dir)?;
    let (tx, mut rx) = sources::channel();
    let cancel = CancellationToken::new();
    let source = tokio::spawn(file::run(manifests, tx, cancel.clone()));
    let (mut objects, mut errors) = (0, 0);
    while let Some(message) = rx.recv().await {
        match message {
            SourceMessage::Changes(c) | SourceMessage::Part(c) => objects += c.len(),
            SourceMessage::Errors(e) => errors += e.len(),
            SourceMessage::Synced => break,
            _ => {}
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    cancel.cancel();
    source.await??;
    Ok((seconds, objects, errors))
}
