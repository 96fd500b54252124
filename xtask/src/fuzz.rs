//! `cargo xtask fuzz [--seconds N] [--target NAME]`: builds the libFuzzer
//! targets of `fuzz/` once and runs each for N seconds on a scratch copy
//! of its checked-in corpus (`fuzz/corpus/<target>`), so a run never grows
//! the repository. Installs what a fresh machine lacks first: the pinned
//! nightly of [`crate::ebpf::NIGHTLY`] and cargo-fuzz.
//!
//! The build lives in `<target dir>/fuzz` (nightly and sanitizer flags
//! would otherwise invalidate the workspace's own build). A crash fails the
//! run naming the target and the input libFuzzer saved under
//! `fuzz/artifacts/<target>/`; `cargo xtask fuzz --target NAME` after the fix
//! or `<binary> <artifact>` replays it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::ebpf::{ensure_nightly, rustup, NIGHTLY};
use crate::run;

const CARGO_FUZZ_VERSION: &str = "0.13.2";
/// Per target, by default: the 8 targets take two minutes together.
pub const DEFAULT_SECONDS: u64 = 15;
/// Per target in `cargo xtask test`: a smoke run, about half a minute in all.
pub const TEST_SECONDS: u64 = 4;
/// libFuzzer's limits for one input: memory and time. Every target parses
/// one small input, so more than this is a bug.
const RSS_LIMIT_MB: u32 = 2048;
const INPUT_TIMEOUT_SECONDS: u32 = 10;
/// The triple cargo-fuzz builds for (its default).
const HOST: &str = "x86_64-unknown-linux-gnu";

pub struct Options {
    pub seconds: u64,
    pub target: Option<String>,
}

/// `cargo xtask fuzz [--seconds N] [--target NAME]`.
pub fn fuzz_command(root: &Path, args: &[String]) -> Result<()> {
    run_fuzz(root, &parse_args(args)?)
}

/// The options of `cargo xtask fuzz [--seconds N] [--target NAME]`.
pub fn parse_args(args: &[String]) -> Result<Options> {
    let mut opts = Options {
        seconds: DEFAULT_SECONDS,
        target: None,
    };
    let mut args = args.iter();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seconds" => {
                let n = args.next().context("--seconds needs a number")?;
                opts.seconds = n
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .with_context(|| format!("--seconds {n:?}: not a positive number"))?;
            }
            "--target" => {
                opts.target = Some(args.next().context("--target needs a name")?.clone());
            }
            other => bail!(
                "fuzz: unknown argument {other:?}; usage: cargo xtask fuzz [--seconds N] [--target NAME]"
            ),
        }
    }
    Ok(opts)
}

/// What one target's run printed last.
struct Summary {
    target: String,
    runs: Option<u64>,
    exec_per_sec: Option<u64>,
    cov: Option<u64>,
    features: Option<u64>,
    corpus: Option<u64>,
}

/// Builds the targets once and runs them one after the other; fails on the
/// first crash.
pub fn run_fuzz(root: &Path, opts: &Options) -> Result<()> {
    let fuzz_dir = root.join("fuzz");
    let all = targets(&fuzz_dir)?;
    let selected: Vec<String> = match &opts.target {
        Some(t) if all.contains(t) => vec![t.clone()],
        Some(t) => bail!("no fuzz target {t:?}; the targets are {}", all.join(", ")),
        None => all,
    };
    ensure_nightly()?;
    ensure_cargo_fuzz()?;
    let target_dir = crate::paths::target_dir(root).join("fuzz");
    build(&fuzz_dir, &target_dir)?;
    let mut summaries = Vec::new();
    for target in &selected {
        summaries.push(run_target(&fuzz_dir, &target_dir, target, opts.seconds)?);
    }
    println!(
        "fuzz: {} target(s), {} s each",
        summaries.len(),
        opts.seconds
    );
    for s in &summaries {
        println!(
            "  {:<18} {:>9} runs {:>7} exec/s  cov {:>5}  ft {:>5}  corpus {:>4}  no crash",
            s.target,
            show(s.runs),
            show(s.exec_per_sec),
            show(s.cov),
            show(s.features),
            show(s.corpus),
        );
    }
    Ok(())
}

fn show(n: Option<u64>) -> String {
    n.map_or_else(|| "?".to_owned(), |n| n.to_string())
}

/// The targets: the sources in `fuzz/fuzz_targets`, sorted.
fn targets(fuzz_dir: &Path) -> Result<Vec<String>> {
    let dir = fuzz_dir.join("fuzz_targets");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".rs"))
                .map(str::to_owned)
        })
        .collect();
    names.sort();
    if names.is_empty() {
        bail!("no fuzz targets in {}", dir.display());
    }
    Ok(names)
}

/// cargo-fuzz at [`CARGO_FUZZ_VERSION`], from crates.io when missing.
fn ensure_cargo_fuzz() -> Result<()> {
    let have = Command::new("cargo-fuzz")
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(CARGO_FUZZ_VERSION));
    if !have {
        run(crate::cargo().args([
            "install",
            "--locked",
            &format!("cargo-fuzz@{CARGO_FUZZ_VERSION}"),
        ]))?;
    }
    Ok(())
}

/// `cargo fuzz build` of every target: release, debug assertions and
/// overflow checks on, AddressSanitizer (cargo-fuzz's default).
fn build(fuzz_dir: &Path, target_dir: &Path) -> Result<()> {
    let mut cmd = rustup();
    cmd.args(["run", NIGHTLY, "cargo", "fuzz", "build", "-O", "-a"])
        // Faster builds on small machines; the runs are short anyway.
        .args(["--codegen-units", "16"])
        .arg("--fuzz-dir")
        .arg(fuzz_dir)
        .arg("--target-dir")
        .arg(target_dir)
        // The outer build's flags and wrappers are for the stable host build.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET");
    run(&mut cmd)
}

/// Runs one target for `seconds` on a fresh copy of its corpus.
fn run_target(fuzz_dir: &Path, target_dir: &Path, target: &str, seconds: u64) -> Result<Summary> {
    let binary = target_dir.join(HOST).join("release").join(target);
    let scratch = target_dir.join("runs").join(target);
    let corpus = scratch.join("corpus");
    if scratch.exists() {
        std::fs::remove_dir_all(&scratch)
            .with_context(|| format!("removing {}", scratch.display()))?;
    }
    copy_dir(&fuzz_dir.join("corpus").join(target), &corpus)?;
    let artifacts = fuzz_dir.join("artifacts").join(target);
    std::fs::create_dir_all(&artifacts)
        .with_context(|| format!("creating {}", artifacts.display()))?;
    let log_path = scratch.join("libfuzzer.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let mut cmd = Command::new(&binary);
    cmd.arg(&corpus)
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_SECONDS}"))
        // A trailing slash: libFuzzer prefixes the file name with it.
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg("-print_final_stats=1")
        .stdout(Stdio::null())
        .stderr(log);
    eprintln!("+ {cmd:?}");
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {} (built?)", binary.display()))?;
    // libFuzzer stops itself after -max_total_time (plus one -timeout for
    // the input in flight); the deadline only guards against a stuck run.
    let deadline = Instant::now() + Duration::from_secs(seconds + 60);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "fuzz target {target} did not stop after {seconds} s; its log: {}",
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&log_path)
        .with_context(|| format!("reading {}", log_path.display()))?;
    if !status.success() {
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        for line in tail.iter().rev() {
            eprintln!("  {line}");
        }
        let artifact = crash_artifact(&text)
            .map_or_else(|| "(none written)".to_owned(), |p| p.display().to_string());
        bail!(
            "fuzz target {target} failed ({status}); crash artifact: {artifact}; full log: {}; \
             replay: {} {artifact}",
            log_path.display(),
            binary.display()
        );
    }
    Ok(summary(target, &text))
}

/// The input libFuzzer saved for a crash, leak, timeout or OOM.
fn crash_artifact(log: &str) -> Option<PathBuf> {
    log.lines()
        .rev()
        .find_map(|l| l.split_once("Test unit written to "))
        .map(|(_, p)| PathBuf::from(p.trim()))
}

/// The figures of libFuzzer's last status line (`#N DONE cov: .. ft: ..
/// corp: A/Bb .. exec/s: ..`).
fn summary(target: &str, log: &str) -> Summary {
    let last = log
        .lines()
        .rev()
        .find(|l| l.starts_with('#') && l.contains("cov:"))
        .unwrap_or_default();
    let after = |key: &str| -> Option<u64> {
        let mut words = last.split_whitespace();
        words.find(|w| *w == key)?;
        words.next()?.split('/').next()?.parse().ok()
    };
    Summary {
        target: target.to_owned(),
        runs: last
            .split_whitespace()
            .next()
            .and_then(|w| w.trim_start_matches('#').parse().ok()),
        exec_per_sec: after("exec/s:"),
        cov: after("cov:"),
        features: after("ft:"),
        corpus: after("corp:"),
    }
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            let dest = to.join(entry.file_name());
            std::fs::copy(entry.path(), &dest).with_context(|| {
                format!("copying {} to {}", entry.path().display(), dest.display())
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_status_line_gives_the_figures() {
        let log = "INFO: seed corpus: files: 4\n\
                   #2 INITED cov: 10 ft: 11 corp: 1/1b exec/s: 0 rss: 30Mb\n\
                   #65536 pulse cov: 90 ft: 120 corp: 20/300b lim: 600 exec/s: 32768 rss: 40Mb\n\
                   #81234 DONE cov: 101 ft: 150 corp: 25/401b lim: 600 exec/s: 5415 rss: 41Mb\n\
                   Done 81234 runs in 16 second(s)\n";
        let s = summary("manifests", log);
        assert_eq!(s.runs, Some(81234));
        assert_eq!(s.exec_per_sec, Some(5415));
        assert_eq!(s.cov, Some(101));
        assert_eq!(s.features, Some(150));
        assert_eq!(s.corpus, Some(25));
    }

    #[test]
    fn a_crash_names_the_saved_input() {
        let log = "==1== ERROR: libFuzzer: deadly signal\n\
                   artifact_prefix='fuzz/artifacts/netlink/'; Test unit written to fuzz/artifacts/netlink/crash-abc\n\
                   Base64: AAAA\n";
        assert_eq!(
            crash_artifact(log),
            Some(PathBuf::from("fuzz/artifacts/netlink/crash-abc"))
        );
        assert_eq!(crash_artifact("Done 5 runs in 1 second(s)\n"), None);
    }

    #[test]
    fn every_target_has_a_seed_corpus() {
        let fuzz_dir = crate::workspace_root().join("fuzz");
        let names = targets(&fuzz_dir).unwrap();
        assert!(names.len() >= 7, "{names:?}");
        for n in names {
            let seeds = std::fs::read_dir(fuzz_dir.join("corpus").join(&n))
                .map(|d| d.count())
                .unwrap_or(0);
            assert!(seeds > 0, "fuzz target {n} has no seed corpus");
        }
    }
}
