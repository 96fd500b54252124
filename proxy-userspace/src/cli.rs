//! Command line: the daemon's flags (kube-proxy's names where kube-proxy has
//! one), the subcommands and their arguments, and the version they print.
//! Parsed values are checked in [`crate::config`]; the subcommands' code
//! uses this module, never the other way round.

use clap::{Args, Parser, Subcommand};

use crate::config::DaemonFlags;
use crate::localnet::client::Target;
use crate::localnet::render::OutputFormat;
use crate::podinfo::client::PodInfoCommand;

const DAEMON_HELP: &str = "\
Without a subcommand the daemon runs: it watches the API server (or
--manifests with --source file), programs the datapath and serves the
localnet API, PodInfo and the status pages until SIGTERM. Every
--sync-period, and on SIGHUP, it checks that the kernel still holds what it
programmed and repairs any difference.

Examples:
  ebpf-kube-proxy --config=/var/lib/ebpf-kube-proxy/config.conf --hostname-override=$(NODE_NAME)
  ebpf-kube-proxy --source=file --manifests=deploy/examples --proxy-mode=none
  ebpf-kube-proxy --write-config-to=/tmp/effective.yaml

Exit status: 0 after SIGTERM or a one-shot flag (--cleanup, --init-only,
--write-config-to) succeeded; 1 on an error, printed as one line on stderr;
2 on a command-line error.";

const DUMP_HELP: &str = "\
Reads the kernel, not the daemon: works while the daemon is stopped.
Output: text (default) or -o json|yaml.

With --proxy-mode none (nothing programmed) it prints the LocalState of
the daemon its flags describe: on its --localnet-socket, else on its
--localnet-bind-address (--target names another address).

Examples:
  ebpf-kube-proxy dump
  ebpf-kube-proxy dump -o json | jq '.services | length'
  ebpf-kube-proxy dump --bpffs-root=/sys/fs/bpf/ebpf-kube-proxy | head
  ebpf-kube-proxy dump --config=/var/lib/ebpf-kube-proxy/config.conf

Exit status: 0, also when nothing is programmed (said on stderr) or when
the reader closes the pipe early; 1 when the kernel state cannot be read.";

const CLEANUP_HELP: &str = "\
Takes the DaemonSet's own flags, so the same argument list cleans up what
it programmed. kube-proxy's spelling, `ebpf-kube-proxy --cleanup`, does the
same. Prints one line per thing removed.

Examples:
  ebpf-kube-proxy cleanup
  ebpf-kube-proxy cleanup --bpffs-root=/sys/fs/bpf/ebpf-kube-proxy

Exit status: 0 when everything found was removed; 1 otherwise.";

const WATCH_HELP: &str = "\
Dials the daemon its flags (or --config) describe: its --localnet-socket,
else its --localnet-bind-address; --target names another address.

Examples:
  ebpf-kube-proxy localnet watch --once
  ebpf-kube-proxy localnet watch --localnet-bind-address 127.0.0.1:12345 --localnet-socket=
  ebpf-kube-proxy localnet watch --target unix:/run/ebpf-kube-proxy/localnet.sock -o json
  ebpf-kube-proxy localnet watch --full-frames

Exit status: 0 after --once or when the server ends the stream; 1 when the
server cannot be reached.";

const COMPLETION_HELP: &str = "\
Examples:
  source <(ebpf-kube-proxy completion bash)
  ebpf-kube-proxy completion zsh > \"${fpath[1]}/_ebpf-kube-proxy\"
  ebpf-kube-proxy completion fish > ~/.config/fish/completions/ebpf-kube-proxy.fish";

/// The version: crate version, git commit and compiler; `--version` and
/// `version` print it alike.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("EKP_GIT_COMMIT"),
    ", ",
    env!("EKP_RUSTC_VERSION"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    after_long_help = DAEMON_HELP,
    name = "ebpf-kube-proxy",
    version = VERSION,
    about = "A kube-proxy replacement: node-local service state, an eBPF datapath, the localnet API",
    // A repeated flag: the last value wins, as with kube-proxy's flags.
    args_override_self = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub daemon: DaemonFlags,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Clients of the localnet API.
    Localnet {
        #[command(subcommand)]
        command: LocalnetCommand,
    },
    /// Show what is programmed, read from the kernel: the eBPF maps pinned
    /// under --bpffs-root, else the nftables tables, else the LocalState a
    /// daemon publishes (on its --localnet-socket, else its
    /// --localnet-bind-address, or on --target).
    #[command(after_long_help = DUMP_HELP)]
    Dump(DumpArgs),
    /// Remove what any datapath left on the node, whatever --proxy-mode
    /// says: eBPF links and pins under --bpffs-root, both nftables tables,
    /// and the --localnet-socket and --podinfo-socket files when no daemon
    /// listens on them.
    #[command(after_long_help = CLEANUP_HELP)]
    Cleanup,
    /// Clients of the PodInfo API.
    Podinfo {
        #[command(subcommand)]
        command: PodInfoCommand,
    },
    /// Print version information.
    Version,
    /// Print a shell completion script: `source <(ebpf-kube-proxy
    /// completion bash)`, or write it where your shell loads completions
    /// from.
    #[command(after_long_help = COMPLETION_HELP)]
    Completion {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// The completion script for `shell`.
pub fn completion(shell: clap_complete::Shell) -> Vec<u8> {
    use clap::CommandFactory;
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "ebpf-kube-proxy", &mut out);
    out
}

/// An error and its causes on one line, each said once: a cause whose text
/// its parent already includes (a `{0}` in a thiserror message) is not
/// repeated.
pub fn error_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[derive(Debug, Subcommand)]
pub enum LocalnetCommand {
    /// Print each new state, resuming with instance id and revision.
    #[command(after_long_help = WATCH_HELP)]
    Watch(WatchArgs),
}

#[derive(Clone, Debug, Args)]
pub struct ClientArgs {
    /// localnet API address: HOST:PORT or unix:PATH [default: the
    /// daemon's --localnet-socket, then its --localnet-bind-address].
    #[arg(long, value_name = "HOST:PORT|unix:PATH")]
    pub target: Option<Target>,

    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

#[derive(Clone, Debug, Args)]
pub struct DumpArgs {
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Clone, Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub client: ClientArgs,

    /// Print the first state and exit.
    #[arg(long)]
    pub once: bool,

    /// Long-poll `Next` for each whole state instead of following a delta
    /// `Watch` stream (the default: after the first state only the
    /// services that changed cross the wire, and each state is rebuilt
    /// here). The output is the same.
    #[arg(long)]
    pub full_frames: bool,

    /// Deltas, the default; kept so that older command lines still parse.
    #[arg(long, hide = true, conflicts_with = "full_frames")]
    pub deltas: bool,
}

impl ClientArgs {
    /// Where to dial, in order: `--target` when given, else where the
    /// daemon these flags describe listens: its `--localnet-socket`, then
    /// its `--localnet-bind-address` (an unspecified address such as
    /// `0.0.0.0:P` dialled on loopback). Empty when both are disabled.
    pub fn targets(&self, flags: &DaemonFlags) -> Vec<Target> {
        if let Some(target) = &self.target {
            return vec![target.clone()];
        }
        let mut targets = Vec::new();
        let socket = flags.localnet_socket.trim();
        if !socket.is_empty() {
            targets.push(Target::Unix(socket.into()));
        }
        let bind = flags.localnet_bind_address.trim();
        if !bind.is_empty() {
            targets.push(Target::Tcp(dial_address(bind)));
        }
        targets
    }
}

/// The address a client dials for a daemon bound to `bind`.
fn dial_address(bind: &str) -> String {
    match bind.parse::<std::net::SocketAddr>() {
        Ok(mut addr) if addr.ip().is_unspecified() => {
            addr.set_ip(match addr {
                std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
            addr.to_string()
        }
        _ => bind.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::ProxyMode;
    use crate::flagz;
    use clap::CommandFactory;
    use std::path::PathBuf;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn completion_scripts_name_the_subcommands_and_flags() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let script = String::from_utf8(completion(shell)).unwrap();
            for word in [
                "dump",
                "cleanup",
                "podinfo",
                "proxy-mode",
                "nodeport-addresses",
            ] {
                assert!(script.contains(word), "{shell}: {word} missing");
            }
        }
    }

    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::other("permission denied");
        let e = anyhow::Error::new(crate::config_file::ConfigFileError::Read {
            file: "/etc/kp.conf".into(),
            reason: io.to_string(),
        })
        .context("loading the configuration");
        assert_eq!(
            error_line(&e),
            "loading the configuration: --config /etc/kp.conf: permission denied"
        );
        #[derive(Debug, thiserror::Error)]
        #[error("opening the socket: {0}")]
        struct Wraps(#[source] std::io::Error);
        let e = anyhow::Error::new(Wraps(std::io::Error::other("EACCES"))).context("localnet");
        assert_eq!(error_line(&e), "localnet: opening the socket: EACCES");
    }

    #[test]
    fn kube_proxy_style_verbosity_flag_parses() {
        let cli = Cli::try_parse_from(["ebpf-kube-proxy", "--v=4"]).unwrap();
        assert_eq!(cli.daemon.verbosity, 4);
        let cli = Cli::try_parse_from(["ebpf-kube-proxy", "-v", "2"]).unwrap();
        assert_eq!(cli.daemon.verbosity, 2);
    }

    #[test]
    fn subcommands_take_the_daemon_flags_before_or_after_their_name() {
        let parse =
            |args: &[&str]| Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let after = parse(&[
            "ebpf-kube-proxy",
            "dump",
            "--proxy-mode",
            "ebpf",
            "--cgroup-path",
            "/cg",
            "--bpffs-root",
            "/b",
        ]);
        let before = parse(&[
            "ebpf-kube-proxy",
            "--proxy-mode",
            "ebpf",
            "--cgroup-path",
            "/cg",
            "--bpffs-root",
            "/b",
            "dump",
        ]);
        for cli in [after, before] {
            assert!(matches!(cli.command, Some(Command::Dump(_))));
            assert_eq!(cli.daemon.proxy_mode, ProxyMode::Ebpf);
            assert_eq!(cli.daemon.cgroup_path, "/cg");
            assert_eq!(cli.daemon.bpffs_root, PathBuf::from("/b"));
        }
        let cleanup = parse(&[
            "ebpf-kube-proxy",
            "cleanup",
            "--proxy-mode",
            "nftables",
            "--config",
            "/etc/kp.yaml",
            "--v=2",
        ]);
        assert!(matches!(cleanup.command, Some(Command::Cleanup)));
        assert_eq!(cleanup.daemon.config, "/etc/kp.yaml");
        let flag = parse(&["ebpf-kube-proxy", "--cleanup", "--proxy-mode", "ebpf"]);
        assert!(flag.daemon.cleanup && flag.command.is_none());
        let dump = parse(&[
            "ebpf-kube-proxy",
            "dump",
            "-o",
            "json",
            "--metrics-bind-address",
            "0.0.0.0:10249",
        ]);
        assert!(
            matches!(dump.command, Some(Command::Dump(ref a)) if a.client.output == OutputFormat::Json)
        );
    }

    #[test]
    fn clients_dial_the_daemons_socket_then_its_tcp_address_unless_given_a_target() {
        let targets = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            let Some(Command::Dump(dump)) = cli.command else {
                panic!("{args:?}: not dump");
            };
            dump.client
                .targets(&cli.daemon)
                .iter()
                .map(Target::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            targets(&["ebpf-kube-proxy", "dump"]),
            ["unix:/run/ebpf-kube-proxy/localnet.sock", "127.0.0.1:12345"]
        );
        assert_eq!(
            targets(&[
                "ebpf-kube-proxy",
                "--localnet-socket=/s",
                "dump",
                "--localnet-bind-address=0.0.0.0:7"
            ]),
            ["unix:/s", "127.0.0.1:7"]
        );
        assert_eq!(
            targets(&[
                "ebpf-kube-proxy",
                "dump",
                "--localnet-socket=",
                "--localnet-bind-address=[::]:7"
            ]),
            ["[::1]:7"]
        );
        assert_eq!(
            targets(&[
                "ebpf-kube-proxy",
                "dump",
                "--localnet-bind-address=",
                "--localnet-socket="
            ]),
            Vec::<String>::new()
        );
        assert_eq!(
            targets(&[
                "ebpf-kube-proxy",
                "dump",
                "--localnet-socket=/s",
                "--target=10.0.0.1:9"
            ]),
            ["10.0.0.1:9"]
        );
    }

    #[test]
    fn bad_enum_value_names_the_flag() {
        let err = Cli::try_parse_from(["ebpf-kube-proxy", "--proxy-mode", "bogus"]).unwrap_err();
        assert!(err.to_string().contains("--proxy-mode"), "{err}");
    }

    #[test]
    fn podinfo_rate_flags_show_on_flagz_as_go_prints_them() {
        let flag = |args: &[&str], name: &str| {
            let cli = Cli::try_parse_from(args).unwrap();
            flagz::collect(&cli.daemon)
                .into_iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v)
        };
        let defaults = ["ebpf-kube-proxy"];
        assert_eq!(flag(&defaults, "podinfo-qps").as_deref(), Some("100"));
        assert_eq!(flag(&defaults, "podinfo-burst").as_deref(), Some("10"));
        let half = ["ebpf-kube-proxy", "--podinfo-qps", "0.5"];
        assert_eq!(flag(&half, "podinfo-qps").as_deref(), Some("0.5"));
        for bad in ["0", "-1", "NaN", "inf"] {
            assert!(Cli::try_parse_from(["ebpf-kube-proxy", "--podinfo-qps", bad]).is_err());
        }
    }
}
