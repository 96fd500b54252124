//! N localnet `Watch` clients on one daemon, for `cargo xtask bench`: how
//! long until every watcher holds a new revision.
//!
//! `watch_fanout --target unix:PATH|HOST:PORT [--clients N] [--deltas]`
//!
//! Each client opens its own connection and reads whole frames (`begin`,
//! the services, `end`); with `--deltas` it asks for delta frames (the
//! first frame is still the whole state) and checks that each delta is on
//! the revision it holds. Clients decode the events but keep no state, so
//! 100 of them fit in memory at 50k services. Prints `ready R B` once every
//! client holds revision R (the first frame), B the bytes that frame took
//! on the wire (gRPC message prefixes included), then `all R T` each time
//! the revision every client holds rises to R, with T the Unix time
//! (seconds) the last of them finished reading it.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use ebpf_kube_proxy::localnet::client::{self, Target};
use prost::Message;
use proto::localnet::v1::watch_event::Event;
use tokio_stream::StreamExt;

fn parse_args() -> Result<(Target, usize, bool)> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut target, mut clients, mut deltas) = (None, 100usize, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().context("flag needs a value");
        match a.as_str() {
            "--target" => {
                target = Some(
                    value()?
                        .parse()
                        .map_err(|e| anyhow::anyhow!("--target: {e}"))?,
                )
            }
            "--clients" => clients = value()?.parse().context("--clients")?,
            "--deltas" => deltas = true,
            other => bail!("unknown argument {other}"),
        }
    }
    Ok((target.context("--target is required")?, clients, deltas))
}

/// A gRPC message's length prefix.
const GRPC_PREFIX: usize = 5;

/// One watcher: sends `(index, rev, bytes)` after each complete frame.
async fn watcher(
    index: usize,
    target: Target,
    deltas: bool,
    done: tokio::sync::mpsc::UnboundedSender<(usize, u64, usize)>,
) -> Result<()> {
    let mut c = client::connect(&target).await?;
    let mut stream = client::watch(&mut c, 0, 0, deltas).await?;
    let (mut rev, mut bytes) = (0, 0);
    while let Some(event) = stream.next().await {
        let event = event?;
        let len = GRPC_PREFIX + event.encoded_len();
        bytes += len;
        match event.event {
            Some(Event::Begin(b)) => {
                if b.base_rev != 0 && b.base_rev != rev {
                    bail!(
                        "watcher {index}: a delta on {} while holding {rev}",
                        b.base_rev
                    );
                }
                rev = b.rev;
                bytes = len;
            }
            // A frame is complete: report it (the main task gone: stop).
            Some(Event::End(_)) if done.send((index, rev, bytes)).is_err() => return Ok(()),
            _ => {}
        }
    }
    bail!("watcher {index}: the stream ended")
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let (target, clients, deltas) = parse_args()?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..clients {
        let (target, tx) = (target.clone(), tx.clone());
        tasks.spawn(async move { watcher(i, target, deltas, tx).await });
    }
    drop(tx);
    let mut held = vec![0u64; clients];
    let mut reported = 0u64;
    loop {
        tokio::select! {
            Some((i, rev, bytes)) = rx.recv() => {
                held[i] = rev;
                let min = held.iter().copied().min().unwrap_or(0);
                if min > reported {
                    if reported == 0 {
                        println!("ready {min} {bytes}");
                    } else {
                        println!("all {min} {:.6}", now());
                    }
                    reported = min;
                }
            }
            Some(joined) = tasks.join_next() => {
                joined.context("a watcher panicked")??;
            }
            else => bail!("every watcher ended"),
        }
    }
}
