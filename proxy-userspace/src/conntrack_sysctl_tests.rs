use std::os::unix::fs::PermissionsExt;

use clap::Parser;

use super::*;

fn settings(args: &[&str]) -> ConntrackSettings {
    let argv: Vec<&str> = [&["ebpf-kube-proxy"][..], args].concat();
    let cli = crate::cli::Cli::try_parse_from(argv).unwrap();
    ConntrackSettings::from_flags(&cli.daemon).unwrap()
}

fn sysctl(name: &'static str, value: u64) -> Write {
    Write::Sysctl { name, value }
}

#[test]
fn kube_proxys_defaults() {
    // 32768 per core × 2 is under the 131072 floor; ×8 is over it.
    assert_eq!(
        plan(&settings(&[]), 2),
        [
            sysctl("nf_conntrack_max", 131072),
            Write::Hashsize(32768),
            sysctl("nf_conntrack_tcp_timeout_established", 86400),
            sysctl("nf_conntrack_tcp_timeout_close_wait", 3600),
        ]
    );
    assert_eq!(settings(&[]).max(8), Some(262144));
}

#[test]
fn each_flag_sets_its_value_and_zero_leaves_it() {
    assert_eq!(
        plan(
            &settings(&[
                "--conntrack-max-per-core=0",
                "--conntrack-min=1",
                "--conntrack-tcp-timeout-established=0",
                "--conntrack-tcp-timeout-close-wait=30m",
                "--conntrack-tcp-be-liberal",
                "--conntrack-udp-timeout=45s",
                "--conntrack-udp-timeout-stream=2m0s",
            ]),
            4
        ),
        [
            sysctl("nf_conntrack_tcp_timeout_close_wait", 1800),
            sysctl("nf_conntrack_tcp_be_liberal", 1),
            sysctl("nf_conntrack_udp_timeout", 45),
            sysctl("nf_conntrack_udp_timeout_stream", 120),
        ]
    );
    assert_eq!(
        plan(
            &settings(&[
                "--conntrack-max-per-core=1000",
                "--conntrack-min=0",
                "--conntrack-tcp-timeout-established=0s",
                "--conntrack-tcp-timeout-close-wait=0s",
                "--conntrack-tcp-be-liberal=false",
            ]),
            3
        ),
        [sysctl("nf_conntrack_max", 3000), Write::Hashsize(750)]
    );
}

#[test]
fn a_bad_duration_names_its_flag() {
    let cli =
        crate::cli::Cli::try_parse_from(["ebpf-kube-proxy", "--conntrack-udp-timeout-stream=soon"])
            .unwrap();
    let (flag, _) = ConntrackSettings::from_flags(&cli.daemon).unwrap_err();
    assert_eq!(flag, "conntrack-udp-timeout-stream");
}

/// A `/proc/sys/net/netfilter` and a hashsize file in a temporary
/// directory: `files` (name, value, writable).
fn node(files: &[(&str, u64, bool)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, value, writable) in files {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{value}\n")).unwrap();
        let mode = if *writable { 0o644 } else { 0o444 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    dir
}

fn read(dir: &tempfile::TempDir, name: &str) -> String {
    std::fs::read_to_string(dir.path().join(name)).unwrap()
}

#[test]
fn values_are_written_when_different_and_skipped_where_they_cannot_be() {
    let dir = node(&[
        ("nf_conntrack_max", 65536, true),
        ("hashsize", 1024, true),
        ("nf_conntrack_tcp_timeout_established", 86400, true),
        ("nf_conntrack_tcp_timeout_close_wait", 60, true),
    ]);
    let writes = plan(&settings(&["--conntrack-udp-timeout=30s"]), 2);
    let done = apply_at(&writes, dir.path(), &dir.path().join("hashsize"));
    let outcomes: Vec<&Outcome> = done.iter().map(|(_, o)| o).collect();
    assert_eq!(
        outcomes,
        [
            &Outcome::Set { from: 65536 },
            &Outcome::Set { from: 1024 },
            &Outcome::AlreadySet,
            &Outcome::Set { from: 60 },
            // No nf_conntrack_udp_timeout file: nf_conntrack not loaded.
            &Outcome::Absent,
        ]
    );
    assert_eq!(read(&dir, "nf_conntrack_max"), "131072");
    assert_eq!(read(&dir, "hashsize"), "32768");
    assert_eq!(read(&dir, "nf_conntrack_tcp_timeout_close_wait"), "3600");
}

#[test]
fn outside_the_initial_namespace_max_and_hashsize_are_left() {
    // nf_conntrack_max is read-only (0444) in a network namespace other
    // than the initial one; the hash size is not tried then.
    let dir = node(&[
        ("nf_conntrack_max", 65536, false),
        ("hashsize", 1024, true),
        ("nf_conntrack_tcp_timeout_close_wait", 60, true),
    ]);
    let done = apply_at(
        &plan(&settings(&["--conntrack-tcp-timeout-established=0"]), 2),
        dir.path(),
        &dir.path().join("hashsize"),
    );
    let outcomes: Vec<&Outcome> = done.iter().map(|(_, o)| o).collect();
    assert_eq!(
        outcomes,
        [
            &Outcome::ReadOnly,
            &Outcome::Skipped,
            &Outcome::Set { from: 60 }
        ]
    );
    assert_eq!(read(&dir, "nf_conntrack_max"), "65536\n");
    assert_eq!(read(&dir, "hashsize"), "1024\n");
}

#[test]
fn a_larger_hash_table_is_kept() {
    let dir = node(&[("nf_conntrack_max", 1, true), ("hashsize", 262144, true)]);
    let done = apply_at(
        &[sysctl("nf_conntrack_max", 131072), Write::Hashsize(32768)],
        dir.path(),
        &dir.path().join("hashsize"),
    );
    assert_eq!(done[1].1, Outcome::Larger(262144));
    assert_eq!(read(&dir, "hashsize"), "262144\n");
}
