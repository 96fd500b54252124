//! N localnet `Watch` clients on one daemon, for `cargo xtask bench`: how
//! long until every watcher holds a new revision.
//!
//! `watch_fanout --target unix:PATH|HOST:PORT [--clients N]`
//!
//! Each client opens its own connection and reads whole frames (`begin`,
//! the services, `end`). Prints `ready R` once every client holds revision
//! R (the first frame), then `all R T` each time the revision every client
//! holds rises to R, with T the Unix time (seconds) the last of them
//! finished reading it.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use ebpf_kube_proxy::localnet::client::{self, Target};
use proto::localnet::v1::{watch_event::Event, WatchRequest};
use tokio_stream::StreamExt;

fn parse_args() -> Result<(Target, usize)> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut target, mut clients) = (None, 100usize);
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
            other => bail!("unknown argument {other}"),
        }
    }
    Ok((target.context("--target is required")?, clients))
}

/// One watcher: sends `(index, rev)` after each complete frame.
async fn watcher(
    index: usize,
    target: Target,
    done: tokio::sync::mpsc::UnboundedSender<(usize, u64)>,
) -> Result<()> {
    let mut c = client::connect(&target).await?;
    let mut stream = c
        .watch(WatchRequest {
            instance_id: 0,
            rev: 0,
        })
        .await?
        .into_inner();
    let mut rev = 0;
    while let Some(event) = stream.next().await {
        match event?.event {
            Some(Event::Begin(b)) => rev = b.rev,
            // A frame is complete: report it (the main task gone: stop).
            Some(Event::End(_)) if done.send((index, rev)).is_err() => return Ok(()),
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
    let (target, clients) = parse_args()?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..clients {
        let (target, tx) = (target.clone(), tx.clone());
        tasks.spawn(async move { watcher(i, target, tx).await });
    }
    drop(tx);
    let mut held = vec![0u64; clients];
    let mut reported = 0u64;
    loop {
        tokio::select! {
            Some((i, rev)) = rx.recv() => {
                held[i] = rev;
                let min = held.iter().copied().min().unwrap_or(0);
                if min > reported {
                    if reported == 0 {
                        println!("ready {min}");
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
