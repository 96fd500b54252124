//! The daemon's flags: kube-proxy's names where kube-proxy has one. Parsed
//! by clap (see [`crate::cli`]), checked into a [`super::Config`], shown by
//! `/flagz` through serde: each field chooses how its value prints.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde::Serializer;

use crate::datapath::ProxyMode;
use crate::flagz;
use crate::logging::LoggingFormat;

pub const DEFAULT_LOCALNET_BIND_ADDRESS: &str = "127.0.0.1:12345";
pub const DEFAULT_LOCALNET_SOCKET: &str = "/run/ebpf-kube-proxy/localnet.sock";
pub const DEFAULT_PODINFO_SOCKET: &str = "/run/ebpf-kube-proxy/podinfo.sock";
pub const DEFAULT_BPFFS_ROOT: &str = "/sys/fs/bpf/ebpf-kube-proxy";

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
#[derive(Clone, Debug, PartialEq, Args, serde::Serialize)]
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

    /// Encoding asked of the API server: application/vnd.kubernetes.protobuf
    /// (JSON still read when the server answers JSON) or application/json.
    #[arg(
        global = true,
        long,
        value_name = "TYPE",
        default_value = "application/vnd.kubernetes.protobuf"
    )]
    pub kube_api_content_type: String,

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

    /// Group (name or number) that owns the unix sockets, which are mode
    /// 0660: members may call the APIs, others may not. Empty: the
    /// daemon's own group.
    #[arg(global = true, long, value_name = "GROUP", default_value = "")]
    pub socket_group: String,

    /// Connections each gRPC listener (localnet TCP, localnet and PodInfo
    /// unix sockets) keeps open at once; at the limit a new connection
    /// closes the oldest one without an open call, and is itself closed on
    /// accept only when every connection has a call open.
    #[arg(global = true, long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub grpc_max_connections: u32,

    /// Concurrent calls (HTTP/2 streams) per gRPC connection.
    #[arg(global = true, long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub grpc_max_streams: u32,

    /// Connections each HTTP server (metrics/status, health) keeps open at
    /// once; at the limit the oldest connection is closed for the new one.
    #[arg(global = true, long, value_name = "N", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub http_max_connections: u32,

    /// Time an HTTP client has to send a request's headers (also between
    /// requests on a kept-alive connection) before it is disconnected.
    #[arg(global = true, long, value_name = "DURATION", default_value = "10s")]
    #[serde(serialize_with = "go_duration")]
    pub http_read_timeout: String,

    /// bpffs directory for pinned maps and links.
    #[arg(global = true, long, value_name = "DIR", default_value = DEFAULT_BPFFS_ROOT)]
    pub bpffs_root: PathBuf,

    /// cgroup v2 directory the socket hooks attach to; empty = the cgroup v2
    /// root found in /proc/self/mountinfo.
    #[arg(global = true, long, value_name = "DIR", default_value = "")]
    pub cgroup_path: String,

    /// Capacity (entries) of each of the eBPF datapath's services map (one
    /// entry per service port plus one per endpoint behind it) and backends
    /// map (one per distinct endpoint address and port). Entries are
    /// allocated as they are written, so a large size costs little until
    /// it is used; a pinned map of another size is replaced at start
    /// without a gap in service. The default holds 100k services with 1M
    /// endpoints.
    #[arg(global = true, long, value_name = "N", default_value_t = crate::datapath::ebpf::generation::DEFAULT_MAP_SIZE, value_parser = clap::value_parser!(u32).range(1024..=crate::datapath::ebpf::generation::MAX_MAP_SIZE as i64))]
    pub ebpf_map_size: u32,

    /// Resync period; the health timeout is twice this.
    #[arg(global = true, long, value_name = "DURATION", default_value = "30s")]
    #[serde(serialize_with = "go_duration")]
    pub sync_period: String,

    /// CIDRs of node addresses that accept NodePort traffic, comma
    /// separated; `primary` = the node's primary IPs (kube-proxy's nftables
    /// default); empty = all.
    #[arg(global = true, long, value_name = "CIDRS", default_value = "")]
    #[serde(serialize_with = "flagz::list")]
    pub nodeport_addresses: String,

    /// The node's IP, as kube-proxy's flag: a specific address is the
    /// node's primary IP for `--nodeport-addresses primary`; 0.0.0.0 or ::
    /// means "find it" (the address the node routes from).
    #[arg(global = true, long, value_name = "IP", default_value = "0.0.0.0")]
    pub bind_address: String,

    /// Masquerade (SNAT to the node's address) every connection to a
    /// ClusterIP, not only those from outside --cluster-cidr. Applies to
    /// the nftables datapath; eBPF socket-LB translates no packet.
    #[arg(
        global = true,
        long,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value_t = false,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub masquerade_all: bool,

    /// Conntrack entries to allow per CPU: nf_conntrack_max is set to this
    /// times the node's CPUs, at least --conntrack-min; 0 leaves it (and
    /// the hash size) as it is.
    #[arg(global = true, long, value_name = "N", default_value_t = 32768)]
    pub conntrack_max_per_core: u32,

    /// The least nf_conntrack_max to set, whatever the CPU count
    /// (unused when --conntrack-max-per-core is 0).
    #[arg(global = true, long, value_name = "N", default_value_t = 131072)]
    pub conntrack_min: u32,

    /// nf_conntrack_tcp_timeout_established: how long an idle established
    /// TCP connection is tracked; 0 leaves the node's value.
    #[arg(
        global = true,
        long,
        value_name = "DURATION",
        default_value = "24h0m0s"
    )]
    #[serde(serialize_with = "go_duration")]
    pub conntrack_tcp_timeout_established: String,

    /// nf_conntrack_tcp_timeout_close_wait: how long a TCP connection in
    /// CLOSE_WAIT is tracked; 0 leaves the node's value.
    #[arg(global = true, long, value_name = "DURATION", default_value = "1h0m0s")]
    #[serde(serialize_with = "go_duration")]
    pub conntrack_tcp_timeout_close_wait: String,

    /// Set nf_conntrack_tcp_be_liberal to 1: conntrack accepts TCP packets
    /// outside the window it expects instead of marking them INVALID.
    #[arg(
        global = true,
        long,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value_t = false,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub conntrack_tcp_be_liberal: bool,

    /// nf_conntrack_udp_timeout: how long an idle UDP flow that was never
    /// answered is tracked; 0 leaves the node's value.
    #[arg(global = true, long, value_name = "DURATION", default_value = "0s")]
    #[serde(serialize_with = "go_duration")]
    pub conntrack_udp_timeout: String,

    /// nf_conntrack_udp_timeout_stream: how long an idle answered UDP flow
    /// is tracked; 0 leaves the node's value.
    #[arg(global = true, long, value_name = "DURATION", default_value = "0s")]
    #[serde(serialize_with = "go_duration")]
    pub conntrack_udp_timeout_stream: String,

    /// Remove what any datapath left on the node (eBPF links and pins, the
    /// nftables tables, stale sockets) and exit: kube-proxy's spelling of
    /// the `cleanup` subcommand.
    #[arg(global = true, long)]
    pub cleanup: bool,

    /// Prepare the node (mount bpffs, load, attach and pin the eBPF
    /// programs, or check nf_tables for the fallback) and exit.
    #[arg(global = true, long)]
    pub init_only: bool,

    /// Write the effective configuration (flags over --config) to FILE as
    /// a KubeProxyConfiguration, and exit.
    #[arg(global = true, long, value_name = "FILE", default_value = "")]
    pub write_config_to: String,

    /// Log format: text, or json (one object per line: ts, level, msg,
    /// fields).
    #[arg(global = true, long, value_enum, default_value_t = LoggingFormat::Text)]
    #[serde(serialize_with = "flagz::value_enum")]
    pub logging_format: LoggingFormat,

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

/// A duration flag given as text: shown in Go form (`1m0s`) once parsed.
pub fn go_duration<S: Serializer>(value: &str, s: S) -> Result<S::Ok, S::Error> {
    match super::parse_duration(value) {
        Ok(d) => s.serialize_str(&crate::gofmt::go_duration(d)),
        // Config validation rejects it anyway; show what was given.
        Err(_) => s.serialize_str(value),
    }
}
