//! Fuzz target `kube_proxy_config`: a `--config` file through
//! `config_file::merge_str` (what `merge` runs once it has read the file)
//! onto the daemon's default flags, once as if no flag was on the command
//! line and once as if every flag was; a configuration that loads is then
//! checked by `Config::from_flags`, as the daemon does next. The daemon
//! reads the file with `read_to_string`: input that is not UTF-8 is skipped.

#![no_main]

use std::sync::OnceLock;

use clap::Parser;
use ebpf_kube_proxy::cli::Cli;
use ebpf_kube_proxy::config::{Config, DaemonFlags};
use ebpf_kube_proxy::config_file::merge_str;
use libfuzzer_sys::fuzz_target;

/// The flags of `ebpf-kube-proxy` without arguments, parsed once.
fn default_flags() -> &'static DaemonFlags {
    static FLAGS: OnceLock<DaemonFlags> = OnceLock::new();
    FLAGS.get_or_init(|| Cli::parse_from(["ebpf-kube-proxy"]).daemon)
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for on_command_line in [false, true] {
        let mut flags = default_flags().clone();
        // A set name keeps `from_flags` off the machine's hostname.
        flags.hostname_override = "fuzz-node".to_owned();
        match merge_str(&mut flags, text, "fuzz.conf", |_| on_command_line) {
            Ok(()) => {
                if let Err(e) = Config::from_flags(&flags) {
                    let _ = e.to_string();
                }
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
});
