//! Wires the daemon together: source → syncer → (localnet server, datapath),
//! and shuts everything down on SIGTERM/SIGINT.

use std::sync::Arc;

use anyhow::Context;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, SourceConfig};
use crate::datapath::{none::NoneDatapath, Datapath, ProxyMode};
use crate::localnet::server::{new_instance_id, Listeners, LocalnetService};
use crate::model::{LocalState, NodeContext};
use crate::sources::{self, file};
use crate::sync::{self, SnapshotReceiver};

pub async fn run(config: Config) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;

    // Everything that can fail on bad configuration fails before serving.
    let manifests = match &config.source {
        SourceConfig::File { dir } => file::ManifestDir::open(dir)?,
        SourceConfig::Kube => anyhow::bail!("--source kube is not available in this build"),
    };
    let datapath = select_datapath(config.proxy_mode);
    let listeners = Listeners::bind(
        config.localnet_bind_address,
        config.localnet_socket.as_deref(),
    )
    .await?;

    let (source_tx, source_rx) = sources::channel();
    let (snapshot_tx, snapshot_rx) = sync::snapshot_channel();
    let node = NodeContext {
        node_name: config.node_name.clone(),
        synthesize_hints: matches!(config.source, SourceConfig::File { .. }),
    };
    let syncer = std::thread::Builder::new()
        .name("syncer".to_owned())
        .spawn(move || sync::run(source_rx, node, snapshot_tx))
        .context("starting the syncer thread")?;

    let instance_id = new_instance_id();
    tracing::info!(
        node = %config.node_name,
        proxy_mode = %datapath.mode(),
        instance_id = format_args!("{instance_id:016x}"),
        "starting ebpf-kube-proxy {}",
        env!("CARGO_PKG_VERSION")
    );

    let mut tasks = tokio::task::JoinSet::new();
    {
        let cancel = shutdown.clone();
        tasks.spawn(async move {
            file::run(manifests, source_tx, cancel)
                .await
                .context("file source")
        });
    }
    tasks.spawn(run_datapath(
        datapath,
        snapshot_rx.clone(),
        shutdown.clone(),
    ));
    {
        let service = LocalnetService::new(instance_id, snapshot_rx, shutdown.clone());
        let cancel = shutdown.clone();
        tasks.spawn(async move { listeners.serve(service, cancel).await.map_err(Into::into) });
    }

    let mut result = Ok(());
    tokio::select! {
        _ = sigterm.recv() => tracing::info!("SIGTERM received, shutting down"),
        _ = sigint.recv() => tracing::info!("SIGINT received, shutting down"),
        Some(done) = tasks.join_next() => {
            result = flatten(done);
            if let Err(e) = &result {
                tracing::error!(error = format!("{e:#}"), "a component failed, shutting down");
            }
        }
    }
    shutdown.cancel();
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = flatten(done) {
            tracing::error!(error = format!("{e:#}"), "error during shutdown");
            if result.is_ok() {
                result = Err(e);
            }
        }
    }
    // The source has dropped its sender, so the syncer thread ends.
    if syncer.join().is_err() {
        tracing::error!("the syncer thread panicked");
    }
    result
}

fn flatten(r: Result<anyhow::Result<()>, tokio::task::JoinError>) -> anyhow::Result<()> {
    r.map_err(anyhow::Error::from).and_then(|r| r)
}

fn select_datapath(mode: ProxyMode) -> Box<dyn Datapath> {
    if mode == ProxyMode::Auto {
        tracing::warn!("proxy-mode auto: no eBPF or nftables datapath in this build; running with proxy-mode none (state is published, nothing is programmed)");
    }
    Box::new(NoneDatapath)
}

/// Applies every new snapshot to the datapath, newest first: a slow apply
/// skips intermediate revisions.
async fn run_datapath(
    mut datapath: Box<dyn Datapath>,
    mut snapshots: SnapshotReceiver,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut programmed: Arc<LocalState> = Arc::default();
    loop {
        let snapshot = snapshots.borrow_and_update().clone();
        if snapshot.is_synced() {
            let started = std::time::Instant::now();
            match datapath.apply(&programmed, &snapshot.state) {
                Ok(stats) => {
                    tracing::debug!(rev = snapshot.rev, mode = %datapath.mode(), services_changed = stats.services_changed, elapsed = ?started.elapsed(), "datapath applied");
                    programmed = snapshot.state.clone();
                }
                Err(e) => {
                    tracing::error!(rev = snapshot.rev, error = %e, "datapath apply failed; will retry with the next state")
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            changed = snapshots.changed() => if changed.is_err() { return Ok(()) },
        }
    }
}
