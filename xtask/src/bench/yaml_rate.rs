//! The manifest read rate of issue 37: the file source reading the bench
//! cluster (one file per 100 services with their EndpointSlices) written
//! as kubectl-style YAML, and the same cluster as JSON, in MB/s from
//! opening the directory to `Synced` — the start-up read the daemon does,
//! on every core the machine has.
//!
//! `cargo xtask bench --only yaml [--scales S]` prints the rows at the
//! largest scale given (50k/250k by default); the scale table calls
//! [`build_reader`], [`measure`] and [`rows`] itself. The reader is
//! `proxy-userspace/examples/read_manifests.rs`; each figure is the best of
//! [`RUNS`] reads of files just written (in the page cache: the parser's
//! rate, not the disk's).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Context, Result};
use serde_json::Value;

use super::manifests::{self, Format, Scale};

/// Issue 37: 79 MB of kubectl-style YAML in at most 1.6 s.
pub const GOAL_MB_S: f64 = 50.0;
/// Reads per format; the fastest counts (other work on the machine only
/// ever slows a read down).
pub const RUNS: usize = 3;

/// One format's read.
#[derive(Clone, Copy, Debug)]
pub struct Rate {
    pub format: Format,
    pub bytes: u64,
    pub seconds: f64,
    /// Objects the source sent (every Service and EndpointSlice).
    pub objects: u64,
}

impl Rate {
    pub fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.seconds
    }

    pub fn name(&self) -> &'static str {
        match self.format {
            Format::Yaml => "YAML manifests read (kubectl-style)",
            Format::Json => "JSON manifests read",
        }
    }

    /// Whether the figure meets its goal; `None`: it has none (JSON).
    pub fn goal_met(&self) -> Option<bool> {
        (self.format == Format::Yaml).then(|| self.mb_per_s() >= GOAL_MB_S)
    }
}

/// Builds the reader in release and copies it into `dir`, out of the
/// shared target directory another build may rewrite meanwhile.
pub fn build_reader(root: &Path, dir: &Path) -> Result<PathBuf> {
    super::release_example(root, dir, "read_manifests")
}

/// `scale` written as YAML, then as JSON, under `dir`, each read [`RUNS`]
/// times by `reader`: the YAML rate, then the JSON one.
pub fn measure(reader: &Path, dir: &Path, scale: Scale) -> Result<[Rate; 2]> {
    let mut rates = Vec::new();
    for format in [Format::Yaml, Format::Json] {
        let files = dir.join(format!("manifests-{format:?}").to_lowercase());
        let _ = std::fs::remove_dir_all(&files);
        std::fs::create_dir_all(&files).with_context(|| format!("creating {}", files.display()))?;
        manifests::write_files_as(&files, scale, &[], format)?;
        let mut best: Option<Rate> = None;
        for _ in 0..RUNS {
            let rate = read(reader, &files, format)?;
            if best.is_none_or(|b| rate.seconds < b.seconds) {
                best = Some(rate);
            }
        }
        std::fs::remove_dir_all(&files).with_context(|| format!("removing {}", files.display()))?;
        rates.push(best.context("no read")?);
    }
    let [yaml, json] = rates[..] else {
        unreachable!("two formats")
    };
    ensure!(
        yaml.objects == json.objects,
        "the YAML cluster has {} objects, the JSON one {}",
        yaml.objects,
        json.objects
    );
    Ok([yaml, json])
}

fn read(reader: &Path, files: &Path, format: Format) -> Result<Rate> {
    let out = Command::new(reader)
        .arg(files)
        .output()
        .with_context(|| format!("running {}", reader.display()))?;
    ensure!(
        out.status.success(),
        "{} {}: {}\n{}",
        reader.display(),
        files.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).context("the reader's output")?;
    let num = |k: &str| v[k].as_f64().with_context(|| format!("no {k} in {v}"));
    ensure!(num("errors")? == 0.0, "manifests refused: {v}");
    Ok(Rate {
        format,
        bytes: num("bytes")? as u64,
        seconds: num("seconds")?,
        objects: num("objects")? as u64,
    })
}

/// One line per rate: name, MB/s, what was read, the goal's verdict.
pub fn rows(rates: &[Rate]) -> Vec<String> {
    rates
        .iter()
        .map(|r| {
            let verdict = match r.goal_met() {
                Some(true) => format!("goal >= {GOAL_MB_S} MB/s met"),
                Some(false) => format!("goal >= {GOAL_MB_S} MB/s MISSED"),
                None => "no goal (the fast path YAML is measured against)".to_owned(),
            };
            format!(
                "{:<37} {:>7.1} MB/s  {:>6.1} MB in {:>5.2} s, {} objects  {verdict}",
                r.name(),
                r.mb_per_s(),
                r.bytes as f64 / 1e6,
                r.seconds,
                r.objects
            )
        })
        .collect()
}

/// `cargo xtask bench --only yaml`: the rows at `scale`.
pub fn bench(root: &Path, scale: Scale) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("ekp-yaml-rate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).context("creating the run directory")?;
    let result = build_reader(root, &dir).and_then(|reader| measure(&reader, &dir, scale));
    let _ = std::fs::remove_dir_all(&dir);
    let rates = result?;
    println!(
        "\nManifest read rate, {} services / {} endpoints, one file per 100 services (best of {RUNS})",
        scale.services, scale.endpoints
    );
    for row in rows(&rates) {
        println!("  {row}");
    }
    Ok(())
}
