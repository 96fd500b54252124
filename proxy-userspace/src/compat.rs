//! kube-proxy flags that have no meaning here, so that a kube-proxy
//! DaemonSet's argument list works unchanged: they are taken off the
//! command line before it is parsed, and each is named in a one-line
//! warning. kube-proxy's own names for what this proxy does take effect as
//! its flags (see [`crate::config::DaemonFlags`]).

use std::ffi::OsString;

/// Flags of kube-proxy that take a value (`--flag=V` or `--flag V`).
const WITH_VALUE: &[&str] = &[
    "config-sync-period",
    "detect-local-mode",
    "feature-gates",
    "iptables-masquerade-bit",
    "iptables-min-sync-period",
    "iptables-sync-period",
    "ipvs-exclude-cidrs",
    "ipvs-min-sync-period",
    "ipvs-scheduler",
    "ipvs-sync-period",
    "ipvs-tcp-timeout",
    "ipvs-tcpfin-timeout",
    "ipvs-udp-timeout",
    "kube-api-burst",
    "kube-api-qps",
    "min-sync-period",
    "oom-score-adj",
    "pod-bridge-interface",
    "pod-interface-name-prefix",
    "proxy-port-range",
    "show-hidden-metrics-for-version",
];

/// Boolean flags of kube-proxy (`--flag` or `--flag=true|false`).
const SWITCHES: &[&str] = &[
    "bind-address-hard-fail",
    "iptables-localhost-nodeports",
    "ipvs-strict-arp",
    "profiling",
];

/// `args` without the kube-proxy flags that mean nothing here, and those
/// flags' names (without dashes) in order.
pub fn strip_ignored_flags(args: Vec<OsString>) -> (Vec<OsString>, Vec<String>) {
    let mut kept = Vec::with_capacity(args.len());
    let mut ignored = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let Some(flag) = arg.to_str().and_then(|a| a.strip_prefix("--")) else {
            kept.push(arg);
            continue;
        };
        let (name, inline_value) = match flag.split_once('=') {
            Some((n, _)) => (n, true),
            None => (flag, false),
        };
        if WITH_VALUE.contains(&name) {
            if !inline_value {
                args.next(); // the value
            }
            ignored.push(name.to_owned());
        } else if SWITCHES.contains(&name) {
            ignored.push(name.to_owned());
        } else {
            if flag.is_empty() {
                // `--`: everything after it is not a flag.
                kept.push(arg);
                kept.extend(args);
                break;
            }
            kept.push(arg);
        }
    }
    (kept, ignored)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strip(args: &[&str]) -> (Vec<String>, Vec<String>) {
        let (kept, ignored) = strip_ignored_flags(args.iter().map(OsString::from).collect());
        let kept = kept.into_iter().map(|a| a.into_string().unwrap()).collect();
        (kept, ignored)
    }

    #[test]
    fn kube_proxy_only_flags_go_in_both_spellings_and_ours_stay() {
        let (kept, ignored) = strip(&[
            "ebpf-kube-proxy",
            "--config=/var/lib/kube-proxy/config.conf",
            "--bind-address",
            "0.0.0.0",
            "--masquerade-all",
            "--oom-score-adj=-999",
            "--hostname-override=node-1",
            "--iptables-sync-period",
            "30s",
            "--ipvs-strict-arp=true",
            "--feature-gates=A=true,B=false",
            "--v=2",
        ]);
        assert_eq!(
            kept,
            [
                "ebpf-kube-proxy",
                "--config=/var/lib/kube-proxy/config.conf",
                "--bind-address",
                "0.0.0.0",
                "--masquerade-all",
                "--hostname-override=node-1",
                "--v=2"
            ]
        );
        assert_eq!(
            ignored,
            [
                "oom-score-adj",
                "iptables-sync-period",
                "ipvs-strict-arp",
                "feature-gates"
            ]
        );
    }

    #[test]
    fn nothing_after_a_double_dash_is_touched() {
        let (kept, ignored) = strip(&["x", "--", "--profiling"]);
        assert_eq!(kept, ["x", "--", "--profiling"]);
        assert!(ignored.is_empty());
    }
}
