//! The README and `docs/` say what is true (issue 35): every relative link
//! leads to a file and heading that exist, every `ebpf-kube-proxy …`
//! command of a `sh` block is one the binary accepts, and the Python
//! client of `docs/localnet-api.md` follows a running daemon's deltas and
//! prints what the page says it prints. (`cargo xtask …` commands are
//! checked by xtask's own unit tests.)
//!
//! The Python interpreter is `EKP_GRPCIO_PYTHON` (the virtualenv with
//! grpcio and grpcio-tools that `cargo xtask test` creates).

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{service, write_atomic, Daemon};
use test_support::docs;

const BIN: &str = env!("CARGO_BIN_EXE_ebpf-kube-proxy");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

#[test]
fn every_relative_link_leads_to_a_file_and_heading() {
    let files = docs::doc_files(&root());
    assert!(files.len() >= 8, "README and docs/*.md: {files:?}");
    let broken: Vec<String> = files.iter().flat_map(|f| docs::broken_links(f)).collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// `ebpf-kube-proxy WORDS… --help`: clap reads the subcommands and flags
/// before `--help` (an unknown one fails), then prints the help.
fn accepts(words: &[String]) -> Result<(), String> {
    let mut cmd = Command::new(BIN);
    cmd.args(words);
    if !words.iter().any(|w| w == "--help" || w == "-h") {
        cmd.arg("--help");
    }
    let out = cmd.output().map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && stdout.contains("Usage: ebpf-kube-proxy") {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stderr),
            stdout
        ))
    }
}

#[test]
fn every_binary_command_in_the_docs_parses() {
    // The check itself fails on a renamed subcommand or flag.
    assert!(accepts(&["dumpx".to_owned()]).is_err());
    assert!(accepts(&["localnet".into(), "watch".into(), "--deltaz".into()]).is_err());

    let mut checked = 0;
    let mut failures = Vec::new();
    for file in docs::doc_files(&root()) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, words) in docs::sh_commands(&text) {
            if words.first().map(String::as_str) != Some("ebpf-kube-proxy") {
                continue;
            }
            checked += 1;
            if let Err(e) = accepts(&words[1..]) {
                failures.push(format!(
                    "{}:{line}: {}\n{e}",
                    file.display(),
                    words.join(" ")
                ));
            }
        }
    }
    assert!(
        checked >= 5,
        "only {checked} ebpf-kube-proxy commands found"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn python() -> PathBuf {
    match std::env::var_os("EKP_GRPCIO_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => panic!(
            "EKP_GRPCIO_PYTHON is not set: run `cargo xtask test`, which creates a \
             virtualenv with grpcio and grpcio-tools and points this variable at its python"
        ),
    }
}

/// The first block of `lang` after the line holding `marker`.
fn block_after(page: &str, marker: &str, lang: &str) -> String {
    let at = page
        .lines()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no {marker:?} in the page"));
    docs::blocks(page)
        .into_iter()
        .find(|b| b.lang == lang && b.line > at)
        .unwrap_or_else(|| panic!("no {lang} block after {marker:?}"))
        .text
}

/// Reads one frame's lines of the client's output: `rev R (base B): N
/// services` and the N service lines.
fn frame(lines: &mpsc::Receiver<String>, log: &dyn Fn() -> String) -> String {
    let next = || {
        lines
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|e| {
                panic!(
                    "no output from the Python client ({e}); daemon log:\n{}",
                    log()
                )
            })
    };
    let head = next();
    let count: usize = head
        .split(": ")
        .nth(1)
        .and_then(|r| r.strip_suffix(" services"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a frame head: {head:?}"));
    let mut out = format!("{head}\n");
    for _ in 0..count {
        out.push_str(&next());
        out.push('\n');
    }
    out
}

#[test]
fn the_python_client_of_the_localnet_page_follows_deltas() {
    let root = root();
    let page = std::fs::read_to_string(root.join("docs/localnet-api.md")).unwrap();
    let client = block_after(&page, "`follow_deltas.py` holds", "python");
    let expected = block_after(&page, "Its output on the demo's manifests", "text");
    let setup = block_after(&page, "Generate the stubs", "sh");

    // The demo's manifests, as the page says.
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    for entry in std::fs::read_dir(root.join("deploy/examples")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, manifests.join(path.file_name().unwrap())).unwrap();
    }
    let daemon = Daemon::start_in(dir, &["--hostname-override", "node-1"]);

    // The page's own commands make the stubs: `python3` is the
    // virtualenv's, `proto` the repository's.
    let work = tempfile::tempdir().unwrap();
    let bin = work.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    // A wrapper, not a symlink: a virtualenv's python finds its packages
    // from the path it was started as.
    let shim = bin.join("python3");
    std::fs::write(
        &shim,
        format!("#!/bin/sh\nexec '{}' \"$@\"\n", python().display()),
    )
    .unwrap();
    std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink(root.join("proto"), work.path().join("proto")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for line in setup.lines().filter(|l| !l.contains("follow_deltas.py")) {
        let out = Command::new("sh")
            .args(["-c", line])
            .current_dir(work.path())
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{line}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::write(work.path().join("follow_deltas.py"), client).unwrap();

    let mut py = Command::new(python())
        .arg("follow_deltas.py")
        .arg(format!("unix:{}", daemon.socket.display()))
        .current_dir(work.path())
        .env("PYTHONPATH", "stubs")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stdout = py.stdout.take().unwrap();
    let _py = KillOnDrop(py);
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let log = || daemon.log_text();

    let mut got = frame(&lines, &log);
    write_atomic(
        &daemon.manifest("extra.yaml"),
        &service("demo", "extra", "10.96.0.99"),
    );
    got.push_str(&frame(&lines, &log));
    assert_eq!(got, expected, "the page's output differs from the client's");
}
