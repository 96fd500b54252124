//! The client subcommands: `localnet watch`, `dump`, `cleanup`, `version`.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;

use crate::cli::{CleanupArgs, ClientArgs, WatchArgs};
use crate::localnet::client::{self, State};
use crate::localnet::render::render;

/// Version line: crate version, git commit and compiler.
pub fn version_line() -> String {
    format!(
        "ebpf-kube-proxy {} (git {}, {})",
        env!("CARGO_PKG_VERSION"),
        env!("EKP_GIT_COMMIT"),
        env!("EKP_RUSTC_VERSION")
    )
}

fn print(state: &State, args: &ClientArgs) -> anyhow::Result<()> {
    let text = render(state, args.output)?;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing to stdout")
}

/// Prints every new state until interrupted (or once). Reconnects after
/// errors and resumes with the instance id and revision it holds, so a
/// restarted daemon (new instance id) sends its full state.
pub async fn localnet_watch(args: WatchArgs) -> anyhow::Result<()> {
    let target = &args.client.target;
    let (mut instance_id, mut rev) = (0, 0);
    let mut backoff = Duration::from_millis(200);
    loop {
        let attempt = async {
            let mut c = client::connect(target).await?;
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
            Err(e) if args.once => {
                return Err(e).with_context(|| format!("localnet watch {target}"))
            }
            Err(e) => {
                tracing::warn!(%target, error = %e, retry_in = ?backoff, "localnet watch interrupted");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Shows what is programmed. With no datapath in this build that is
/// nothing; the published LocalState is printed instead.
pub async fn dump(args: ClientArgs) -> anyhow::Result<()> {
    let mut c = client::connect(&args.target)
        .await
        .with_context(|| format!("dump: is the daemon running? (--target {})", args.target))?;
    let state = client::next(&mut c, 0, 0).await.context("dump")?;
    eprintln!("# datapath: none (this build programs nothing); published LocalState follows");
    print(&state, &args)
}

/// Removes what a daemon left behind. This build creates no eBPF pins and
/// no nftables table, only its sockets: those are removed when no daemon
/// answers on them.
pub async fn cleanup(args: CleanupArgs) -> anyhow::Result<()> {
    for path in [&args.localnet_socket, &args.podinfo_socket] {
        remove_stale_socket(path).await?;
    }
    println!(
        "cleanup complete: no eBPF programs, pins or nftables tables are created by this build"
    );
    Ok(())
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
