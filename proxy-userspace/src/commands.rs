//! The client subcommands: `localnet watch`, `dump`, `cleanup`, `version`.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;

use crate::cli::{ClientArgs, DumpArgs, WatchArgs, VERSION};
use crate::config::DaemonFlags;
use crate::datapath::ebpf::{self, EbpfDatapath};
use crate::datapath::nft::{self, NftDatapath};
use crate::datapath::{Datapath, DatapathConfig, Dump};
use crate::localnet::client::{self, State, Target};
use crate::localnet::render::{render, OutputFormat};

/// Version line: `ebpf-kube-proxy` and [`VERSION`], for `version`.
pub fn version_line() -> String {
    format!("ebpf-kube-proxy {VERSION}")
}

fn print(state: &State, args: &ClientArgs) -> anyhow::Result<()> {
    let text = render(state, args.output)?;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing to stdout")
}

/// Where `args` dials: `--target`, else the daemon's socket, then its TCP
/// address; an error when the flags disable both.
fn targets(args: &ClientArgs, flags: &DaemonFlags) -> anyhow::Result<Vec<Target>> {
    let targets = args.targets(flags);
    if targets.is_empty() {
        anyhow::bail!(
            "no localnet address: --localnet-socket and --localnet-bind-address are both empty; give --target"
        );
    }
    Ok(targets)
}

/// The targets as the messages name them: `A or B`.
fn named(targets: &[Target]) -> String {
    let names: Vec<String> = targets.iter().map(Target::to_string).collect();
    names.join(" or ")
}

/// Prints every new state until interrupted (or once), dialling the
/// daemon the flags describe (see [`ClientArgs::targets`]). Follows a
/// delta `Watch` stream unless `--full-frames`; the output is the same.
pub async fn localnet_watch(args: WatchArgs, flags: &DaemonFlags) -> anyhow::Result<()> {
    let targets = targets(&args.client, flags)?;
    if args.full_frames {
        localnet_watch_full(&args, &targets).await
    } else {
        localnet_watch_deltas(&args, &targets).await
    }
}

/// `--full-frames`: long-polls `Next`. Reconnects after errors and resumes
/// with the instance id and revision it holds, so a restarted daemon (new
/// instance id) sends its full state.
async fn localnet_watch_full(args: &WatchArgs, targets: &[Target]) -> anyhow::Result<()> {
    let (mut instance_id, mut rev) = (0, 0);
    let mut backoff = Duration::from_millis(200);
    loop {
        let attempt = async {
            let (mut c, _) = client::connect_first(targets).await?;
            loop {
                let state = client::next(&mut c, instance_id, rev).await?;
                print(&state, &args.client)
                    .map_err(|e| client::ClientError::Protocol(e.to_string()))?;
                instance_id = state.instance_id;
                rev = state.rev;
                if args.once {
                    return Ok::<(), client::ClientError>(());
                }
            }
        }
        .await;
        match attempt {
            Ok(()) => return Ok(()),
            Err(e) => backoff = retry_or_fail(args, targets, e, backoff).await?,
        }
    }
}

/// The default: the same output from a delta `Watch` stream, the state
/// rebuilt here. A reconnect resumes at the revision held, so a daemon
/// still at it answers with deltas and another one with its full state.
async fn localnet_watch_deltas(args: &WatchArgs, targets: &[Target]) -> anyhow::Result<()> {
    let mut held = client::Watched::default();
    let mut backoff = Duration::from_millis(200);
    loop {
        let attempt = async {
            let (mut c, _) = client::connect_first(targets).await?;
            let mut stream = client::watch(&mut c, held.instance_id, held.rev, true).await?;
            while held.read_frame(&mut stream).await?.is_some() {
                print(&held.state(), &args.client)
                    .map_err(|e| client::ClientError::Protocol(e.to_string()))?;
                if args.once {
                    break;
                }
            }
            Ok::<(), client::ClientError>(())
        }
        .await;
        match attempt {
            Ok(()) => return Ok(()),
            Err(e) => {
                if matches!(e, client::ClientError::Protocol(_)) {
                    // What is held no longer fits the stream: start over.
                    held = client::Watched::default();
                }
                backoff = retry_or_fail(args, targets, e, backoff).await?
            }
        }
    }
}

/// After a failed attempt: the error with `--once`, else a warning, a
/// pause of `backoff` and the next (doubled, at most 5 s) pause.
async fn retry_or_fail(
    args: &WatchArgs,
    targets: &[Target],
    e: client::ClientError,
    backoff: Duration,
) -> anyhow::Result<Duration> {
    let target = named(targets);
    if args.once {
        return Err(e).with_context(|| format!("localnet watch {target}"));
    }
    tracing::warn!(%target, error = %e, retry_in = ?backoff, "localnet watch interrupted");
    tokio::time::sleep(backoff).await;
    Ok((backoff * 2).min(Duration::from_secs(5)))
}

/// Shows what is programmed: the eBPF maps pinned under `--bpffs-root`
/// when there are any (no daemon needed), else the nftables tables of this
/// network namespace decoded per service, else the LocalState the daemon
/// publishes (`--proxy-mode none` programs nothing).
pub async fn dump(args: DumpArgs, flags: &DaemonFlags) -> anyhow::Result<()> {
    let config = datapath_config(flags);
    let found = match EbpfDatapath::dump(&config).context("dump")? {
        Some(d) => Some(d),
        None => NftDatapath::dump(&config).context("dump")?,
    };
    if let Some(found) = found {
        let text = match (found, args.client.output) {
            (Dump::Ebpf(maps), OutputFormat::Text) => ebpf::dump::text(&maps),
            (Dump::Ebpf(maps), OutputFormat::Json) => {
                serde_json::to_string(&maps).context("encoding the dump")? + "\n"
            }
            (Dump::Ebpf(maps), OutputFormat::Yaml) => format!(
                "---\n{}",
                crate::yaml::to_string(&maps).context("encoding the dump")?
            ),
            (Dump::Nftables(tables), OutputFormat::Text) => nft::render_tables(&tables),
            (Dump::Nftables(tables), OutputFormat::Json) => {
                serde_json::to_string(&serde_json::json!({ "nftables": tables }))
                    .context("encoding the dump")?
                    + "\n"
            }
            (Dump::Nftables(tables), OutputFormat::Yaml) => format!(
                "---\n{}",
                crate::yaml::to_string(&serde_json::json!({ "nftables": tables }))
                    .context("encoding the dump")?
            ),
        };
        let mut out = std::io::stdout().lock();
        return out
            .write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .context("writing to stdout");
    }
    let args = args.client;
    let nothing = format!(
        "nothing programmed: no eBPF maps pinned under {} and no nftables table ebpf-kube-proxy",
        flags.bpffs_root.display()
    );
    let targets = targets(&args, flags)?;
    // SPEC §10.7: nothing programmed is an answer, not an error.
    let (mut c, target) = match client::connect_first(&targets).await {
        Ok(found) => found,
        Err(e) => {
            eprintln!(
                "# {nothing}; no daemon answers on {} ({e})",
                named(&targets)
            );
            return Ok(());
        }
    };
    let state = client::next(&mut c, 0, 0).await.context("dump")?;
    eprintln!("# {nothing} (--proxy-mode none?); the LocalState published on {target} follows");
    print(&state, &args)
}

/// Removes what any datapath left behind, whatever `--proxy-mode` says:
/// the eBPF links (detaching and unloading the programs) and pinned maps
/// under `--bpffs-root`, the nftables tables `ip`/`ip6 ebpf-kube-proxy` of
/// this network namespace, and the sockets when no daemon answers on them.
/// Prints one line per thing it looked at.
pub async fn cleanup(flags: &DaemonFlags) -> anyhow::Result<()> {
    let config = datapath_config(flags);
    let reports = [
        NftDatapath::cleanup(&config).context("cleanup")?,
        EbpfDatapath::cleanup(&config).context("cleanup")?,
    ];
    for line in reports.iter().flatten() {
        println!("{line}");
    }
    let cgroup_path = Path::new(flags.cgroup_path.trim());
    if !cgroup_path.as_os_str().is_empty() {
        // The kernel releases a detached link asynchronously: allow it a
        // bounded moment before calling the programs left behind.
        let mut left = ebpf::loader::attached_programs(cgroup_path).context("cleanup")?;
        for _ in 0..50 {
            if left == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            left = ebpf::loader::attached_programs(cgroup_path).context("cleanup")?;
        }
        if left > 0 {
            anyhow::bail!(
                "cleanup: {left} programs are still attached to {} (is a daemon still running?)",
                cgroup_path.display()
            );
        }
        println!("{}: no programs attached", cgroup_path.display());
    }
    // An empty socket flag disables that socket: nothing to remove.
    for path in [&flags.localnet_socket, &flags.podinfo_socket] {
        let path = Path::new(path.trim());
        if !path.as_os_str().is_empty() {
            remove_stale_socket(path).await?;
        }
    }
    println!("cleanup complete");
    Ok(())
}

/// What `dump` and `cleanup` need of the datapath settings.
fn datapath_config(flags: &DaemonFlags) -> DatapathConfig {
    let cgroup = flags.cgroup_path.trim();
    DatapathConfig {
        mode: flags.proxy_mode,
        bpffs_root: flags.bpffs_root.clone(),
        cgroup_path: (!cgroup.is_empty()).then(|| cgroup.into()),
        ebpf_map_size: flags.ebpf_map_size,
        cluster_cidrs: Vec::new(),
        masquerade_all: false,
        nodeport_addresses: Vec::new(),
    }
}

async fn remove_stale_socket(path: &Path) -> anyhow::Result<()> {
    if !path.exists() {
        return Ok(());
    }
    if tokio::net::UnixStream::connect(path).await.is_ok() {
        println!("{}: a daemon is listening; left in place", path.display());
        return Ok(());
    }
    std::fs::remove_file(path).with_context(|| format!("removing {}", path.display()))?;
    println!("{}: removed stale socket", path.display());
    Ok(())
}
