//! `ebpf-kube-proxy`: parse the command line, set up logging, run.

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches};
use ebpf_kube_proxy::cli::{Cli, Command, LocalnetCommand};
use ebpf_kube_proxy::config::Config;
use ebpf_kube_proxy::{commands, compat, config_file, daemon, logging, memory, podinfo};

/// The kube-proxy datapaths `--proxy-mode` accepts as `auto`.
const REPLACED_MODES: &[&str] = &["iptables", "ipvs", "kernelspace"];

/// Whether `e` is stdout closing under us (`dump | head`): not a failure.
fn broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn main() -> std::process::ExitCode {
    memory::tune_malloc();
    let (args, ignored) = compat::strip_ignored_flags(std::env::args_os().collect());
    let matches = Cli::command().get_matches_from(args);
    let mut cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    logging::init(cli.daemon.verbosity, cli.daemon.logging_format);
    for flag in &ignored {
        tracing::warn!(flag = %format!("--{flag}"), "kube-proxy flag with no meaning for this proxy; ignored");
    }
    if let Some(mode) = matches
        .get_raw("proxy_mode")
        .and_then(|mut v| v.next_back())
        .and_then(|m| m.to_str())
        .filter(|m| REPLACED_MODES.contains(m))
    {
        tracing::warn!(
            mode,
            "--proxy-mode names a kube-proxy datapath this proxy replaces; using auto"
        );
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ebpf-kube-proxy")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        // Every command takes the daemon's flags and its --config file.
        let from_command_line =
            |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
        config_file::merge(&mut cli.daemon, from_command_line)?;
        if !cli.daemon.write_config_to.is_empty() {
            let path = std::path::Path::new(&cli.daemon.write_config_to);
            config_file::write(&cli.daemon, path)?;
            println!("wrote the configuration to {}", path.display());
            return Ok(());
        }
        match cli.command {
            None if cli.daemon.cleanup => commands::cleanup(&cli.daemon).await,
            None if cli.daemon.init_only => {
                let config = Config::from_flags(&cli.daemon).context("invalid configuration")?;
                let choice = daemon::prepare(&config)?;
                println!("node prepared for the {} datapath", choice.mode);
                if let Some(reason) = choice.fallback_reason {
                    println!("({reason})");
                }
                Ok(())
            }
            None => {
                let config = Config::from_flags(&cli.daemon).context("invalid configuration")?;
                let podinfo_limit = podinfo::RateLimit {
                    qps: cli.daemon.podinfo_qps,
                    burst: cli.daemon.podinfo_burst,
                };
                daemon::run(config, podinfo_limit).await
            }
            Some(Command::Localnet {
                command: LocalnetCommand::Watch(args),
            }) => commands::localnet_watch(args, &cli.daemon).await,
            Some(Command::Dump(args)) => commands::dump(args, &cli.daemon).await,
            Some(Command::Cleanup) => commands::cleanup(&cli.daemon).await,
            Some(Command::Podinfo { command }) => {
                podinfo::client::run(command, &cli.daemon.podinfo_socket)
                    .await
                    .context("podinfo")
            }
            Some(Command::Version) => {
                println!("{}", commands::version_line());
                Ok(())
            }
            Some(Command::Completion { shell }) => {
                use std::io::Write as _;
                std::io::stdout()
                    .write_all(&ebpf_kube_proxy::cli::completion(shell))
                    .context("writing the completion script")
            }
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if broken_pipe(&e) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", ebpf_kube_proxy::cli::error_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}
