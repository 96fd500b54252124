//! Command line: the daemon's flags (kube-proxy's names where kube-proxy has
//! one) and the subcommands. Parsed values are checked in [`crate::config`].

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::datapath::ProxyMode;
use crate::localnet::client::Target;
use crate::localnet::render::OutputFormat;
use crate::model::ObjectKey;
use crate::podinfo::client::{parse_pod_key, OutputFormat as PodInfoOutput};
use crate::status::flagz;

pub const DEFAULT_LOCALNET_BIND_ADDRESS: &str = "127.0.0.1:12345";
pub const DEFAULT_LOCALNET_SOCKET: &str = "/run/ebpf-kube-proxy/localnet.sock";
pub const DEFAULT_PODINFO_SOCKET: &str = "/run/ebpf-kube-proxy/podinfo.sock";
pub const DEFAULT_BPFFS_ROOT: &str = "/sys/fs/bpf/ebpf-kube-proxy";

#[derive(Debug, Parser)]
#[command(
    name = "ebpf-kube-proxy",
    version,
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SourceKind {
    /// Watch the Kubernetes API server.
    Kube,
    /// Read manifests from --manifests DIR.
    File,
}

impl SourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Kube => "kube",
            SourceKind::File => "file",
        }
    }
}

/// Flags of the daemon. Every subcommand accepts them too, before or after
/// its name (a DaemonSet's argument list works unchanged); those that do
/// not matter to it are ignored. Every flag here is shown by /flagz;
/// the `serde` attributes choose how (Go durations, lists, enum names) and
/// mark sensitive flags `classified`.
#[derive(Clone, Debug, Args, serde::Serialize)]
pub struct DaemonFlags {
    /// A KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1);
    /// flags given on the command line override its values.
    #[arg(global = true, long, value_name = "FILE", default_value = "")]
    pub config: String,

    /// Name of this node, instead of the hostname.
    #[arg(global = true, long, value_name = "NAME", default_value = "")]
    pub hostname_override: String,

    /// Pod CIDRs of the cluster, comma separated; traffic from outside them
    /// is masqueraded.
    #[arg(global = true, long, value_name = "CIDRS", default_value = "")]
    pub cluster_cidr: String,

    /// Datapath: auto (eBPF, else nftables), ebpf, nftables or none.
    #[arg(global = true, long, value_enum, default_value_t = ProxyMode::Auto)]
    #[serde(serialize_with = "flagz::value_enum")]
    pub proxy_mode: ProxyMode,

    /// Address of kube-proxy's health server (/healthz, /livez).
    #[arg(
        global = true,
        long,
        value_name = "IP:PORT",
        default_value = "0.0.0.0:10256"
    )]
    pub healthz_bind_address: String,

    /// Address of the metrics and status server (/metrics, /statusz, /flagz).
    #[arg(
        global = true,
        long,
        value_name = "IP:PORT",
        default_value = "127.0.0.1:10249"
    )]
    pub metrics_bind_address: String,

    /// Kubeconfig file; empty = in-cluster configuration.
    #[arg(global = true, long, value_name = "PATH", default_value = "")]
    pub kubeconfig: String,

    /// Address of the API server, overriding the kubeconfig's.
    #[arg(global = true, long, value_name = "URL", default_value = "")]
    // The URL may carry user-info (credentials).
    #[serde(serialize_with = "flagz::classified")]
    pub master: String,

    /// Where Services and EndpointSlices come from.
    #[arg(global = true, long, value_enum, default_value_t = SourceKind::Kube)]
    #[serde(serialize_with = "flagz::value_enum")]
    pub source: SourceKind,

    /// Directory of YAML/JSON manifests for --source file.
    #[arg(global = true, long, value_name = "DIR")]
    pub manifests: Option<PathBuf>,

    /// TCP address of the localnet gRPC API; empty disables it.
    #[arg(global = true, long, value_name = "IP:PORT", default_value = DEFAULT_LOCALNET_BIND_ADDRESS)]
    pub localnet_bind_address: String,

    /// Unix socket of the localnet gRPC API (mode 0660); empty disables it.
    #[arg(global = true, long, value_name = "PATH", default_value = DEFAULT_LOCALNET_SOCKET)]
    pub localnet_socket: String,

    /// Unix socket of the PodInfo gRPC API (mode 0660); empty disables it.
    #[arg(global = true, long, value_name = "PATH", default_value = DEFAULT_PODINFO_SOCKET)]
    pub podinfo_socket: String,

    /// PodInfo API calls per second per client (token bucket refill).
    #[arg(global = true, long, value_name = "QPS", default_value_t = 100.0, value_parser = positive_float)]
    #[serde(serialize_with = "go_float")]
    pub podinfo_qps: f64,

    /// PodInfo API calls a client may make at once (token bucket size).
    #[arg(global = true, long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub podinfo_burst: u32,

    /// bpffs directory for pinned maps and links.
    #[arg(global = true, long, value_name = "DIR", default_value = DEFAULT_BPFFS_ROOT)]
    pub bpffs_root: PathBuf,

    /// cgroup v2 directory the socket hooks attach to; empty = the cgroup v2
    /// root found in /proc/self/mountinfo.
    #[arg(global = true, long, value_name = "DIR", default_value = "")]
    pub cgroup_path: String,

    /// Resync period; the health timeout is twice this.
    #[arg(global = true, long, value_name = "DURATION", default_value = "30s")]
    #[serde(serialize_with = "flagz::go_duration")]
    pub sync_period: String,

    /// CIDRs of node addresses that accept NodePort traffic, comma
    /// separated; empty = all.
    #[arg(global = true, long, value_name = "CIDRS", default_value = "")]
    #[serde(serialize_with = "flagz::list")]
    pub nodeport_addresses: String,

    /// Remove what any datapath left on the node (eBPF links and pins, the
    /// nftables tables, stale sockets) and exit: kube-proxy's spelling of
    /// the `cleanup` subcommand.
    #[arg(global = true, long)]
    pub cleanup: bool,

    /// Log verbosity (0-10, as klog's -v).
    #[arg(
        global = true,
        short = 'v',
        long = "v",
        value_name = "LEVEL",
        default_value_t = 0
    )]
    pub verbosity: u8,
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
    /// daemon publishes on --target.
    Dump(DumpArgs),
    /// Remove what any datapath left on the node, whatever --proxy-mode
    /// says: eBPF links and pins under --bpffs-root, both nftables tables,
    /// and the --localnet-socket and --podinfo-socket files when no daemon
    /// listens on them.
    Cleanup,
    /// Clients of the PodInfo API.
    Podinfo {
        #[command(subcommand)]
        command: PodInfoCommand,
    },
    /// Print version information.
    Version,
}

#[derive(Debug, Subcommand)]
pub enum LocalnetCommand {
    /// Print each new state, resuming with instance id and revision.
    Watch(WatchArgs),
}

#[derive(Clone, Debug, Args)]
pub struct ClientArgs {
    /// localnet API address: HOST:PORT or unix:PATH.
    #[arg(long, value_name = "HOST:PORT|unix:PATH", default_value = DEFAULT_LOCALNET_BIND_ADDRESS)]
    pub target: Target,

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
}

#[derive(Debug, Subcommand)]
pub enum PodInfoCommand {
    /// Print the pods of this node with their conditions.
    List(PodInfoArgs),
    /// Print one pod, by NAMESPACE/NAME or --uid.
    Get(PodInfoGetArgs),
    /// Print the pod list, then again after every change.
    Watch(PodInfoArgs),
}

#[derive(Clone, Debug, Args)]
pub struct PodInfoArgs {
    /// PodInfo API socket.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_PODINFO_SOCKET)]
    pub socket: PathBuf,

    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = PodInfoOutput::Text)]
    pub output: PodInfoOutput,
}

#[derive(Clone, Debug, Args)]
pub struct PodInfoGetArgs {
    /// The pod.
    #[arg(value_name = "NAMESPACE/NAME", value_parser = parse_pod_key, required_unless_present = "uid")]
    pub pod: Option<ObjectKey>,

    /// The pod's UID; with NAMESPACE/NAME, both must match.
    #[arg(long, value_name = "UID")]
    pub uid: Option<String>,

    #[command(flatten)]
    pub client: PodInfoArgs,
}

/// A rate: finite and greater than 0.
fn positive_float(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a number greater than 0")),
    }
}

/// A float flag as Go's pflag shows it on /flagz (`100`, `0.5`).
fn go_float<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
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
    fn bad_enum_value_names_the_flag() {
        let err = Cli::try_parse_from(["ebpf-kube-proxy", "--proxy-mode", "ipvs"]).unwrap_err();
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
