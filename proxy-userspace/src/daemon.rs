//! Wires the daemon together: source → syncer → (localnet server, datapath,
//! status servers), and shuts everything down on SIGTERM/SIGINT. SIGHUP
//! asks the datapath coordinator for a drift check.

use std::sync::Arc;

use anyhow::Context;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, SourceConfig};
use crate::datapath::{Datapath, DatapathChoice, DatapathConfig, ProxyMode};
use crate::localnet::server::{new_instance_id, Listeners, LocalnetService};
use crate::model::{IpFamily, NodeContext};
use crate::podinfo::{PodInfoApi, PodInfoError, PodInfoListener, PodInfoMetrics, RateLimit};
use crate::sources::{self, file};
use crate::status::{Status, StatusOptions, StatusServers};
use crate::sync;

/// Resources every source lists before it reports `Synced`.
const SOURCE_RESOURCES: &[&str] = &["endpointslices", "nodes", "pods", "services"];

/// Test hook, read from the environment: after SIGTERM/SIGINT keep serving
/// (readiness failing on `shutdown`) for this Go duration before stopping,
/// so integration tests can observe the shutting-down state.
const SHUTDOWN_DELAY_ENV: &str = "EBPF_KUBE_PROXY_TEST_SHUTDOWN_DELAY";

/// The configured source, ready to run.
enum Source {
    File(file::ManifestDir),
    Kube(kube::Client, sources::kube::ApiServer),
}

/// Raises the soft open-files limit to the hard one: every client
/// connection and watch takes a descriptor, and with the common soft limit
/// of 1024 a few hundred idle clients would make accept() fail for the
/// kubelet's probe.
fn raise_open_files_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid, owned rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 || lim.rlim_cur >= lim.rlim_max {
            return;
        }
        let from = lim.rlim_cur;
        lim.rlim_cur = lim.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
            tracing::debug!(from, to = lim.rlim_max, "raised the open-files limit");
        }
    }
}

pub async fn run(config: Config, podinfo_limit: RateLimit) -> anyhow::Result<()> {
    raise_open_files_limit();
    let shutdown = CancellationToken::new();
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    // SIGHUP: check the datapath for drift now (see apply::run).
    let mut sighup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let drift_checks = Arc::new(tokio::sync::Notify::new());

    // Everything that can fail on bad configuration fails before serving.
    let source = match &config.source {
        SourceConfig::File { dir } => Source::File(file::ManifestDir::open(dir)?),
        SourceConfig::Kube {
            master,
            content_type,
        } => {
            let (client, server) = sources::kube::client(
                config.kubeconfig.as_deref(),
                master.as_deref(),
                *content_type,
            )
            .await?;
            Source::Kube(client, server)
        }
    };
    let service_events = match &source {
        Source::File(_) => crate::events::ServiceEvents::Log,
        Source::Kube(client, _) => {
            crate::events::ServiceEvents::kube(client.clone(), &config.node_name)
        }
    };
    // The source starts reading (files parsed, lists requested) while the
    // datapath loads: the eBPF programs' load and verification take a
    // few hundred ms that the first state no longer waits for. Nothing is
    // served before the checks below pass; their messages wait in the
    // channel for the syncer.
    let (source_tx, source_rx) = sources::channel();
    let mut tasks = tokio::task::JoinSet::new();
    {
        let cancel = shutdown.clone();
        let node_name = config.node_name.clone();
        tasks.spawn(async move {
            match source {
                Source::File(manifests) => file::run(manifests, source_tx, cancel)
                    .await
                    .context("file source"),
                Source::Kube(client, server) => {
                    sources::kube::run(client, server, node_name, source_tx, cancel).await;
                    Ok(())
                }
            }
        });
    }
    let (mut datapath, datapath_choice) = select_datapath(&config)?;
    let listeners = Listeners::bind(
        config.localnet_bind_address,
        config.localnet_socket.as_deref(),
    )
    .await?;
    let status_servers =
        StatusServers::bind(config.metrics_bind_address, config.healthz_bind_address).await?;
    let status = Arc::new(Status::new(StatusOptions {
        sync_period: config.sync_period,
        requested_mode: config.proxy_mode,
        active_mode: datapath.mode(),
        source: match config.source {
            SourceConfig::File { .. } => "file",
            SourceConfig::Kube { .. } => "kube",
        },
        resources: SOURCE_RESOURCES,
        // LocalState and every datapath cover both families.
        families: vec![IpFamily::V4, IpFamily::V6],
        flags: crate::flagz::collect(&config.flags),
    })?);
    status.set_localnet_listening(true);
    datapath
        .register_metrics(status.metrics().registry())
        .context("registering the datapath's metrics")?;
    if datapath_choice.fallback_reason.is_some() {
        // `auto` tries eBPF first.
        status.datapath_fallback(
            crate::datapath::ProxyMode::Ebpf,
            datapath_choice.mode,
            datapath_choice.fallback_class.unwrap_or("other"),
        );
    }

    // Bound before anything is served, so a bad --podinfo-socket fails
    // start-up; its families join /metrics only when it is enabled.
    let podinfo = match config.podinfo_socket.as_deref() {
        Some(path) => Some((
            PodInfoListener::bind(path)?,
            PodInfoMetrics::register(status.metrics().registry()).map_err(PodInfoError::from)?,
        )),
        None => None,
    };

    if let Some(gid) = config.socket_group {
        for path in [&config.localnet_socket, &config.podinfo_socket]
            .into_iter()
            .flatten()
        {
            crate::grpc_unix::set_group(path, gid).with_context(|| {
                format!(
                    "--socket-group {gid}: giving {} to the group",
                    path.display()
                )
            })?;
        }
    }

    let (snapshot_tx, snapshot_rx) = crate::snapshot::snapshot_channel();
    let hcnp_snapshots = snapshot_rx.clone();
    let (pods_tx, pods_rx) = crate::snapshot::pod_snapshot_channel();
    let node = NodeContext {
        node_name: config.node_name.clone(),
        synthesize_hints: matches!(config.source, SourceConfig::File { .. }),
    };
    let syncer = std::thread::Builder::new()
        .name("syncer".to_owned())
        .spawn({
            let status = status.clone();
            move || sync::run(source_rx, node, snapshot_tx, pods_tx, status)
        })
        .context("starting the syncer thread")?;

    let instance_id = new_instance_id();
    tracing::info!(
        node = %config.node_name,
        proxy_mode = %datapath.mode(),
        requested_proxy_mode = %datapath_choice.requested,
        instance_id,
        "starting ebpf-kube-proxy {}",
        env!("CARGO_PKG_VERSION")
    );

    // The eBPF datapath serves node ports on the node's addresses and
    // attaches to the interfaces holding them: it follows their changes.
    let node_addresses = Arc::new(tokio::sync::Notify::new());
    if datapath.mode() == crate::datapath::ProxyMode::Ebpf {
        let (mut changes, watch) = crate::node_addrs::subscribe(shutdown.clone())
            .context("watching the node's addresses (rtnetlink)")?;
        tasks.spawn(async move {
            if let Err(e) = watch.await {
                tracing::warn!(error = %e, "the node's addresses are no longer followed");
            }
            Ok(())
        });
        let notify = node_addresses.clone();
        tasks.spawn(async move {
            while changes.changed().await.is_ok() {
                notify.notify_one();
            }
            Ok(())
        });
    }
    tasks.spawn({
        let run = crate::apply::run(
            crate::apply::Applier::new(datapath),
            snapshot_rx.clone(),
            shutdown.clone(),
            status.clone(),
            config.sync_period,
            drift_checks.clone(),
            node_addresses,
        );
        async move {
            run.await;
            Ok(())
        }
    });
    // gRPC health of each API, turned NOT_SERVING at SIGTERM (SPEC §10.6).
    let mut discoveries = Vec::new();
    {
        let service = LocalnetService::new(instance_id, snapshot_rx, shutdown.clone())
            .await
            .with_metrics(
                crate::localnet::metrics::LocalnetMetrics::register(status.metrics().registry())
                    .context("registering the localnet metrics")?,
            );
        discoveries.push(service.discovery().clone());
        let cancel = shutdown.clone();
        let status = status.clone();
        let grpc_limits = config.grpc_limits;
        tasks.spawn(async move {
            let served = listeners.serve(service, grpc_limits, cancel).await;
            status.set_localnet_listening(false);
            served.map_err(Into::into)
        });
    }
    if let Some((listener, metrics)) = podinfo {
        let api = PodInfoApi::new(pods_rx, podinfo_limit, metrics, shutdown.clone()).await;
        discoveries.push(api.discovery().clone());
        let cancel = shutdown.clone();
        let limits = config.grpc_limits;
        tasks.spawn(async move {
            listener
                .serve(api, limits, cancel)
                .await
                .map_err(Into::into)
        });
    }
    {
        let cancel = shutdown.clone();
        let status = status.clone();
        let limits = config.http_limits;
        tasks.spawn(async move {
            status_servers
                .serve(status, limits, cancel)
                .await
                .map_err(Into::into)
        });
    }
    tasks.spawn({
        let (status, snapshots, cancel) = (status.clone(), hcnp_snapshots, shutdown.clone());
        let hcnp = crate::status::hcnp::HcnpConfig {
            node_name: config.node_name.clone(),
            nodeport_addresses: config.nodeport_addresses.clone(),
            events: service_events,
        };
        async move {
            crate::status::hcnp::run(hcnp, status, snapshots, cancel).await;
            Ok(())
        }
    });

    let mut result = Ok(());
    let mut signalled = true;
    loop {
        tokio::select! {
            _ = sigterm.recv() => {
                tracing::info!("SIGTERM received, shutting down");
                break;
            }
            _ = sigint.recv() => {
                tracing::info!("SIGINT received, shutting down");
                break;
            }
            _ = sighup.recv() => {
                tracing::info!("SIGHUP received, checking the datapath for drift");
                drift_checks.notify_one();
            }
            // A component that ends cleanly (e.g. a listener disabled with
            // an empty address) is no reason to stop; a failing one is.
            Some(done) = tasks.join_next() => {
                if let Err(e) = flatten(done) {
                    tracing::error!(error = format!("{e:#}"), "a component failed, shutting down");
                    signalled = false;
                    result = Err(e);
                    break;
                }
            }
        }
    }
    status.shutting_down();
    for d in &discoveries {
        d.stop().await;
    }
    if signalled {
        if let Some(delay) = std::env::var(SHUTDOWN_DELAY_ENV)
            .ok()
            .and_then(|d| crate::config::parse_duration(&d).ok())
        {
            tokio::time::sleep(delay).await;
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

/// `--init-only`: prepares the node for the datapath `--proxy-mode` picks
/// (bpffs mounted, programs loaded, attached and pinned; or nf_tables
/// checked) and returns which one, without programming any state. Pinned
/// links keep the programs in place for the daemon that follows.
pub fn prepare(config: &Config) -> anyhow::Result<DatapathChoice> {
    let (_datapath, choice) = select_datapath(config)?;
    Ok(choice)
}

/// The datapath and why it was chosen (`auto` falls back to `none` with
/// the reason in `DatapathChoice::fallback_reason`).
fn select_datapath(config: &Config) -> anyhow::Result<(Box<dyn Datapath>, DatapathChoice)> {
    crate::datapath::select(&DatapathConfig {
        mode: config.proxy_mode,
        bpffs_root: config.bpffs_root.clone(),
        cgroup_path: config.cgroup_path.clone(),
        ebpf_map_size: config.ebpf_map_size,
        cluster_cidrs: config.cluster_cidrs.clone(),
        masquerade_all: config.masquerade_all,
        nodeport_addresses: config.nodeport_addresses.clone(),
    })
    .with_context(|| format!("--proxy-mode {}", config.proxy_mode))
    .inspect(|(_, choice)| {
        if config.masquerade_all && choice.mode == ProxyMode::Ebpf {
            tracing::warn!("--masquerade-all has no effect on the eBPF datapath: socket-LB picks the backend at connect() and translates no packet");
        }
        // As kube-proxy at start, once the datapath (whose nftables table
        // loads nf_conntrack) is in place; `none` proxies nothing.
        if choice.mode != ProxyMode::None {
            crate::conntrack_sysctl::apply(&config.conntrack);
        }
    })
}
