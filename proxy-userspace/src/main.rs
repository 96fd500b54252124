//! `ebpf-kube-proxy`: parse the command line, set up logging, run.

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches};
use ebpf_kube_proxy::cli::{Cli, Command, LocalnetCommand};
use ebpf_kube_proxy::config::Config;
use ebpf_kube_proxy::{commands, config_file, daemon, podinfo};
use tracing_subscriber::EnvFilter;

fn init_logging(verbosity: u8) {
    // klog-style levels: 0-2 info, 3-4 debug, 5+ trace; RUST_LOG wins.
    let level = match verbosity {
        0..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("warn,ebpf_kube_proxy={level}")));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}

fn main() -> std::process::ExitCode {
    let matches = Cli::command().get_matches();
    let mut cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    init_logging(cli.daemon.verbosity);
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
        match cli.command {
            None if cli.daemon.cleanup => commands::cleanup(&cli.daemon).await,
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
            }) => commands::localnet_watch(args).await,
            Some(Command::Dump(args)) => commands::dump(args, &cli.daemon).await,
            Some(Command::Cleanup) => commands::cleanup(&cli.daemon).await,
            Some(Command::Podinfo { command }) => {
                podinfo::client::run(command).await.context("podinfo")
            }
            Some(Command::Version) => {
                println!("{}", commands::version_line());
                Ok(())
            }
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
