//! The daemon's configuration: flags checked once, at start, into typed
//! values. Every error names the flag and the offending value.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

pub mod duration;
pub mod flags;

use crate::datapath::ProxyMode;
use crate::net::{parse_cidr_list, parse_ip_sloppy, parse_socket_addr_sloppy, Cidr};
pub use duration::parse_duration;
pub use flags::{DaemonFlags, SourceKind};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--{flag} {value:?}: {reason}")]
pub struct ConfigError {
    pub flag: &'static str,
    pub value: String,
    pub reason: String,
}

fn err(flag: &'static str, value: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        flag,
        value: value.into(),
        reason: reason.into(),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceConfig {
    File {
        dir: PathBuf,
    },
    /// The API server; `master` overrides the kubeconfig's server URL.
    Kube {
        master: Option<String>,
        content_type: KubeContentType,
    },
}

/// The encoding asked of the API server (`--kube-api-content-type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KubeContentType {
    /// `application/vnd.kubernetes.protobuf`, kube-proxy's default: JSON
    /// is still read when the server answers JSON.
    #[default]
    Protobuf,
    /// `application/json`.
    Json,
}

impl KubeContentType {
    pub fn parse(s: &str) -> Option<KubeContentType> {
        match s.trim() {
            "application/vnd.kubernetes.protobuf" => Some(KubeContentType::Protobuf),
            "application/json" => Some(KubeContentType::Json),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub node_name: String,
    pub cluster_cidrs: Vec<Cidr>,
    pub proxy_mode: ProxyMode,
    /// `None` (empty flag) disables the server.
    pub healthz_bind_address: Option<SocketAddr>,
    /// `None` (empty flag) disables the server.
    pub metrics_bind_address: Option<SocketAddr>,
    pub kubeconfig: Option<PathBuf>,
    pub source: SourceConfig,
    pub localnet_bind_address: Option<SocketAddr>,
    pub localnet_socket: Option<PathBuf>,
    pub podinfo_socket: Option<PathBuf>,
    pub bpffs_root: PathBuf,
    pub cgroup_path: Option<PathBuf>,
    /// `--ebpf-map-size`.
    pub ebpf_map_size: u32,
    pub sync_period: Duration,
    pub nodeport_addresses: Vec<Cidr>,
    /// `--masquerade-all` (nftables).
    pub masquerade_all: bool,
    /// The `--conntrack-*` flags: the node's conntrack sysctls.
    pub conntrack: crate::conntrack_sysctl::ConntrackSettings,
    /// `--http-max-connections`, `--http-read-timeout`.
    pub http_limits: crate::status::HttpLimits,
    /// `--socket-group`, resolved to a group id.
    pub socket_group: Option<u32>,
    /// `--grpc-max-connections`, `--grpc-max-streams`.
    pub grpc_limits: crate::grpc_unix::limits::GrpcLimits,
    pub verbosity: u8,
    /// Every flag with its effective value as `/flagz` shows it (sensitive
    /// values already redacted).
    /// The effective flags (command line over config file), for /flagz.
    pub flags: DaemonFlags,
}

/// `IP:PORT`, the IP read as kube-proxy reads it (leading zeros decimal).
fn socket_addr(flag: &'static str, v: &str) -> Result<SocketAddr, ConfigError> {
    parse_socket_addr_sloppy(v).ok_or_else(|| {
        err(
            flag,
            v,
            "expected IP:PORT, e.g. 127.0.0.1:12345 or [::1]:12345",
        )
    })
}

fn optional_socket_addr(flag: &'static str, v: &str) -> Result<Option<SocketAddr>, ConfigError> {
    match v.trim() {
        "" => Ok(None),
        a => socket_addr(flag, a).map(Some),
    }
}

fn optional_path(p: &str) -> Option<PathBuf> {
    (!p.trim().is_empty()).then(|| PathBuf::from(p.trim()))
}

/// This node's name when `--hostname-override` is empty: the kernel's
/// hostname, lower-cased as kube-proxy does.
fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_lowercase())
        .filter(|h| !h.is_empty())
}

impl Config {
    pub fn from_flags(f: &DaemonFlags) -> Result<Self, ConfigError> {
        let node_name = match f.hostname_override.trim() {
            "" => hostname().ok_or_else(|| {
                err(
                    "hostname-override",
                    "",
                    "the hostname is unknown; set this flag",
                )
            })?,
            name => name.to_lowercase(),
        };
        let cluster_cidrs = parse_cidr_list(&f.cluster_cidr)
            .map_err(|r| err("cluster-cidr", &f.cluster_cidr, r))?;
        let bind_address: IpAddr = parse_ip_sloppy(f.bind_address.trim())
            .ok_or_else(|| err("bind-address", &f.bind_address, "not an IP address"))?;
        // kube-proxy's `primary`: the node's primary IPs, one per family.
        let (primary, cidrs): (Vec<&str>, Vec<&str>) = f
            .nodeport_addresses
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .partition(|p| *p == "primary");
        let mut nodeport_addresses = parse_cidr_list(&cidrs.join(","))
            .map_err(|r| err("nodeport-addresses", &f.nodeport_addresses, r))?;
        if !primary.is_empty() {
            let ips = primary_ips(bind_address);
            if ips.is_empty() {
                tracing::warn!("--nodeport-addresses primary: this node has no route to find its primary IP by, and --bind-address is not set to one; node ports answer on every local address");
                nodeport_addresses.clear();
            } else {
                tracing::info!(ips = ?ips, "--nodeport-addresses primary: node ports answer on the node's primary IPs");
                nodeport_addresses.extend(ips.into_iter().map(Cidr::host));
            }
        }
        let proxy_mode = f.proxy_mode;
        let source = match f.source {
            SourceKind::File => match &f.manifests {
                Some(dir) if !dir.as_os_str().is_empty() => SourceConfig::File { dir: dir.clone() },
                _ => {
                    return Err(err(
                        "manifests",
                        "",
                        "a directory is required with --source file",
                    ))
                }
            },
            SourceKind::Kube => SourceConfig::Kube {
                master: Some(f.master.trim().to_owned()).filter(|m| !m.is_empty()),
                content_type: KubeContentType::parse(&f.kube_api_content_type).ok_or_else(
                    || {
                        err(
                            "kube-api-content-type",
                            &f.kube_api_content_type,
                            "application/vnd.kubernetes.protobuf or application/json",
                        )
                    },
                )?,
            },
        };
        let localnet_bind_address = match f.localnet_bind_address.trim() {
            "" => None,
            a => Some(socket_addr("localnet-bind-address", a)?),
        };
        let sync_period =
            parse_duration(&f.sync_period).map_err(|r| err("sync-period", &f.sync_period, r))?;
        let socket_group = match f.socket_group.trim() {
            "" => None,
            g => Some(group_id(g).ok_or_else(|| err("socket-group", g, "no such group"))?),
        };
        let http_read_timeout = parse_duration(&f.http_read_timeout)
            .map_err(|r| err("http-read-timeout", &f.http_read_timeout, r))?;
        if http_read_timeout.is_zero() {
            return Err(err(
                "http-read-timeout",
                &f.http_read_timeout,
                "must be greater than 0",
            ));
        }
        if sync_period.is_zero() {
            return Err(err("sync-period", &f.sync_period, "must be greater than 0"));
        }
        let conntrack = crate::conntrack_sysctl::ConntrackSettings::from_flags(f).map_err(
            |(flag, reason)| {
                let value = match flag {
                    "conntrack-tcp-timeout-established" => &f.conntrack_tcp_timeout_established,
                    "conntrack-tcp-timeout-close-wait" => &f.conntrack_tcp_timeout_close_wait,
                    "conntrack-udp-timeout" => &f.conntrack_udp_timeout,
                    _ => &f.conntrack_udp_timeout_stream,
                };
                err(flag, value, reason)
            },
        )?;
        Ok(Config {
            node_name,
            cluster_cidrs,
            proxy_mode,
            healthz_bind_address: optional_socket_addr(
                "healthz-bind-address",
                &f.healthz_bind_address,
            )?,
            metrics_bind_address: optional_socket_addr(
                "metrics-bind-address",
                &f.metrics_bind_address,
            )?,
            kubeconfig: optional_path(&f.kubeconfig),
            source,
            localnet_bind_address,
            localnet_socket: optional_path(&f.localnet_socket),
            podinfo_socket: optional_path(&f.podinfo_socket),
            bpffs_root: f.bpffs_root.clone(),
            cgroup_path: optional_path(&f.cgroup_path),
            ebpf_map_size: f.ebpf_map_size,
            sync_period,
            nodeport_addresses,
            masquerade_all: f.masquerade_all,
            conntrack,
            http_limits: crate::status::HttpLimits {
                max_connections: f.http_max_connections as usize,
                read_timeout: http_read_timeout,
            },
            socket_group,
            grpc_limits: crate::grpc_unix::limits::GrpcLimits {
                max_connections: f.grpc_max_connections as usize,
                max_streams: f.grpc_max_streams,
            },
            verbosity: f.verbosity,
            flags: f.clone(),
        })
    }
}

/// A group's id from its number or its name (the system's group database).
fn group_id(group: &str) -> Option<u32> {
    if let Ok(gid) = group.parse() {
        return Some(gid);
    }
    let name = std::ffi::CString::new(group).ok()?;
    // SAFETY: getgrnam with a valid C string; the entry is read at once,
    // before any other call could reuse its static storage.
    unsafe {
        let entry = libc::getgrnam(name.as_ptr());
        (!entry.is_null()).then(|| (*entry).gr_gid)
    }
}

/// The node's primary IPs (kube-proxy's `primary`): `bind` when it is a
/// specific address; else, per family, the source address the kernel
/// picks for a route off the node (a connected UDP socket: nothing is
/// sent). A family without such a route has none.
fn primary_ips(bind: IpAddr) -> Vec<IpAddr> {
    if !bind.is_unspecified() {
        return vec![bind];
    }
    // Documentation addresses (RFC 5737, RFC 3849): only the route
    // lookup matters, no packet leaves.
    ["192.0.2.1:9", "[2001:db8::1]:9"]
        .iter()
        .filter_map(|probe| {
            let probe: SocketAddr = probe.parse().ok()?;
            let local = if probe.is_ipv4() {
                "0.0.0.0:0"
            } else {
                "[::]:0"
            };
            let sock = std::net::UdpSocket::bind(local).ok()?;
            sock.connect(probe).ok()?;
            Some(sock.local_addr().ok()?.ip())
        })
        .filter(|ip| !ip.is_unspecified() && !ip.is_loopback())
        .collect()
}

// Here, not in conntrack_sysctl.rs: the flags are the config's, and the
// sysctl module stays below it.
impl crate::conntrack_sysctl::ConntrackSettings {
    /// The settings of `flags`; `Err((flag, reason))` names a bad one.
    pub fn from_flags(f: &DaemonFlags) -> Result<Self, (&'static str, String)> {
        let duration = |flag: &'static str, v: &str| parse_duration(v).map_err(|r| (flag, r));
        Ok(Self {
            max_per_core: f.conntrack_max_per_core,
            min: f.conntrack_min,
            tcp_established_timeout: duration(
                "conntrack-tcp-timeout-established",
                &f.conntrack_tcp_timeout_established,
            )?,
            tcp_close_wait_timeout: duration(
                "conntrack-tcp-timeout-close-wait",
                &f.conntrack_tcp_timeout_close_wait,
            )?,
            udp_timeout: duration("conntrack-udp-timeout", &f.conntrack_udp_timeout)?,
            udp_stream_timeout: duration(
                "conntrack-udp-timeout-stream",
                &f.conntrack_udp_timeout_stream,
            )?,
            tcp_be_liberal: f.conntrack_tcp_be_liberal,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<Config, ConfigError> {
        let mut argv = vec!["ebpf-kube-proxy", "--hostname-override", "N1"];
        argv.extend_from_slice(args);
        Config::from_flags(&crate::cli::Cli::try_parse_from(argv).unwrap().daemon)
    }

    #[test]
    fn file_source_with_defaults() {
        let c = parse(&["--source", "file", "--manifests", "/m"]).unwrap();
        assert_eq!(c.node_name, "n1");
        assert_eq!(c.source, SourceConfig::File { dir: "/m".into() });
        assert_eq!(
            c.localnet_bind_address,
            Some("127.0.0.1:12345".parse().unwrap())
        );
        assert_eq!(c.sync_period, Duration::from_secs(30));
        assert_eq!(c.proxy_mode, ProxyMode::Auto);
    }

    #[test]
    fn nodeport_addresses_take_cidrs_and_kube_proxys_primary() {
        let file = ["--source", "file", "--manifests", "/m"];
        let c = parse(
            &[
                &file[..],
                &["--nodeport-addresses", "10.0.0.0/8, fd00::/64"],
            ]
            .concat(),
        )
        .unwrap();
        assert_eq!(
            c.nodeport_addresses,
            vec![
                "10.0.0.0/8".parse::<Cidr>().unwrap(),
                "fd00::/64".parse().unwrap()
            ]
        );
        let c = parse(
            &[
                &file[..],
                &["--bind-address=10.1.2.3", "--nodeport-addresses", "primary"],
            ]
            .concat(),
        )
        .unwrap();
        assert_eq!(c.nodeport_addresses, vec!["10.1.2.3/32".parse().unwrap()]);
        let e = parse(&[&file[..], &["--bind-address=node-1"]].concat()).unwrap_err();
        assert!(e.to_string().contains("bind-address"), "{e}");
        let e = parse(&[&file[..], &["--nodeport-addresses", "10.0.0.0/33"]].concat())
            .unwrap_err()
            .to_string();
        assert!(e.contains("nodeport-addresses"), "{e}");
    }

    /// kube-proxy reads its flags' addresses with ParseIPSloppy and
    /// ParseCIDRSloppy: leading zeros are decimal (CVE-2021-29923).
    #[test]
    fn flag_addresses_with_leading_zeros_are_decimal() {
        let c = parse(&[
            "--source",
            "file",
            "--manifests",
            "/m",
            "--cluster-cidr",
            "010.244.0.0/016",
            "--nodeport-addresses",
            "010.0.0.0/8",
            "--bind-address",
            "010.1.2.003",
            "--metrics-bind-address",
            "127.0.0.001:10249",
            "--healthz-bind-address",
            "[::ffff:127.0.0.01]:10256",
        ])
        .unwrap();
        assert_eq!(c.cluster_cidrs[0].to_string(), "10.244.0.0/16");
        assert_eq!(c.nodeport_addresses[0].to_string(), "10.0.0.0/8");
        assert_eq!(
            c.metrics_bind_address.unwrap().to_string(),
            "127.0.0.1:10249"
        );
        assert_eq!(
            c.healthz_bind_address.unwrap().to_string(),
            "127.0.0.1:10256"
        );
        let e = parse(&[
            "--source",
            "file",
            "--manifests",
            "/m",
            "--metrics-bind-address",
            "::1:10249",
        ])
        .unwrap_err();
        assert!(e.to_string().contains("metrics-bind-address"), "{e}");
    }

    #[test]
    fn bad_values_name_the_flag() {
        let file = ["--source", "file", "--manifests", "/m"];
        let cases: &[(&[&str], &str)] = &[
            (&["--cluster-cidr", "10.0.0.0/40"], "cluster-cidr"),
            (
                &["--localnet-bind-address", "localhost"],
                "localnet-bind-address",
            ),
            (
                &["--healthz-bind-address", "0.0.0.0"],
                "healthz-bind-address",
            ),
            (&["--sync-period", "10 parsecs"], "sync-period"),
            (&["--sync-period", "0s"], "sync-period"),
        ];
        for (args, flag) in cases {
            let mut a = file.to_vec();
            a.extend_from_slice(args);
            let e = parse(&a).unwrap_err();
            assert_eq!(e.flag, *flag, "{args:?}: {e}");
            assert!(e.to_string().starts_with(&format!("--{flag} ")), "{e}");
        }
        assert_eq!(parse(&["--source", "file"]).unwrap_err().flag, "manifests");
        assert_eq!(
            parse(&[]).unwrap().source,
            SourceConfig::Kube {
                master: None,
                content_type: KubeContentType::Protobuf,
            },
            "kube is the default source"
        );
    }

    #[test]
    fn ebpf_mode_takes_its_cgroup_and_bpffs_paths() {
        let c = parse(&[
            "--source",
            "file",
            "--manifests",
            "/m",
            "--proxy-mode",
            "ebpf",
            "--cgroup-path",
            "/sys/fs/cgroup/unified/test",
            "--bpffs-root",
            "/sys/fs/bpf/test",
        ])
        .unwrap();
        assert_eq!(c.proxy_mode, ProxyMode::Ebpf);
        assert_eq!(c.cgroup_path, Some("/sys/fs/cgroup/unified/test".into()));
        assert_eq!(c.bpffs_root, PathBuf::from("/sys/fs/bpf/test"));
        let d = parse(&["--source", "file", "--manifests", "/m"]).unwrap();
        assert_eq!(d.cgroup_path, None, "empty = the cgroup v2 root");
        assert_eq!(d.bpffs_root, PathBuf::from("/sys/fs/bpf/ebpf-kube-proxy"));
    }

    #[test]
    fn empty_status_addresses_disable_the_servers() {
        let file = ["--source", "file", "--manifests", "/m"];
        let c = parse(&file).unwrap();
        assert_eq!(
            c.metrics_bind_address,
            Some("127.0.0.1:10249".parse().unwrap())
        );
        assert_eq!(
            c.healthz_bind_address,
            Some("0.0.0.0:10256".parse().unwrap())
        );
        let mut args = file.to_vec();
        args.extend(["--metrics-bind-address", "", "--healthz-bind-address", ""]);
        let c = parse(&args).unwrap();
        assert_eq!(
            (c.metrics_bind_address, c.healthz_bind_address),
            (None, None)
        );
    }
}
