//! Every `cargo xtask …` command in a `sh` block of README.md and docs/
//! is one xtask accepts (issue 35): its words go through
//! [`parse_command`], the argument parsing `main` dispatches to.

use std::path::Path;

use test_support::docs;

use crate::parse_command;

fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_owned).collect()
}

#[test]
fn the_dry_parse_takes_the_documented_forms_and_refuses_others() {
    for ok in [
        "test",
        "demo",
        "bench --quick",
        "bench --only scale --scales 10k/100k --datapaths nftables --sources kube",
        "e2e --proxy-mode nftables --filter caps",
        "conformance --proxy-mode ebpf --filter NodePort --json",
        "build-ebpf --release",
        "soak --minutes 60 --proxy-mode ebpf",
        "fuzz --seconds 30 --target manifests",
    ] {
        assert!(parse_command(&words(ok)).is_ok(), "{ok}");
    }
    for bad in [
        "",
        "tests",
        "demo --now",
        "bench --quik",
        "bench --datapaths bpf",
        "e2e --mode ebpf",
        "conformance --proxy-mode iptables",
        "build-ebpf --debug",
        "soak --proxy-mode ebpf",
        "fuzz --seconds 0",
    ] {
        assert!(parse_command(&words(bad)).is_err(), "{bad}");
    }
}

#[test]
fn every_xtask_command_in_the_docs_parses() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    let mut failures = Vec::new();
    for file in docs::doc_files(&root) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, words) in docs::sh_commands(&text) {
            if words.get(..2) != Some(&["cargo".to_owned(), "xtask".to_owned()][..]) {
                continue;
            }
            checked += 1;
            if let Err(e) = parse_command(&words[2..]) {
                failures.push(format!(
                    "{}:{line}: {}: {e:#}",
                    file.display(),
                    words.join(" ")
                ));
            }
        }
    }
    assert!(checked >= 8, "only {checked} `cargo xtask` commands found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
