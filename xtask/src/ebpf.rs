//! `cargo xtask build-ebpf [--release]`: builds `proxy-ebpf` for
//! `bpfel-unknown-none`, installing what a fresh machine lacks first:
//!
//! * the pinned nightly with `rust-src` (for `-Z build-std=core`);
//! * `bpf-linker`, built against that nightly's own `libLLVM` (no system
//!   LLVM needed), under `$BPF_TOOLS_DIR` (default `/opt/bpf-tools`) so that
//!   `cargo clean` does not throw it away.
//!
//! Every step checks first and does nothing when the piece is present, so a
//! second run costs well under a second plus cargo's own no-op build.
//!
//! The object lands in `target/bpfel-unknown-none/{release,debug}/proxy-ebpf`;
//! the daemon's build script embeds the release one.

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::run;

/// rustc 1.97.0-nightly, LLVM 22.1.4 (see shared/notes/EBPF-TOOLCHAIN.md).
pub const NIGHTLY: &str = "nightly-2026-05-20";
const BPF_LINKER_VERSION: &str = "0.13.0";
/// Must match the LLVM major version of [`NIGHTLY`].
const LLVM_FEATURE: &str = "llvm-22";
const DEFAULT_TOOLS_DIR: &str = "/opt/bpf-tools";
const TARGET: &str = "bpfel-unknown-none";

pub fn tools_dir() -> PathBuf {
    env::var_os("BPF_TOOLS_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_TOOLS_DIR))
}

/// Path of the object `build(root, release)` produces.
pub fn object_path(root: &Path, release: bool) -> PathBuf {
    let profile = if release { "release" } else { "debug" };
    crate::paths::target_dir(root)
        .join(TARGET)
        .join(profile)
        .join("proxy-ebpf")
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// rustup without the variables the outer `cargo run` set, so the pinned
/// toolchain named on the command line always wins.
pub(crate) fn rustup() -> Command {
    let mut c = Command::new("rustup");
    for v in ["RUSTUP_TOOLCHAIN", "RUSTC", "RUSTDOC", "CARGO"] {
        c.env_remove(v);
    }
    c
}

/// The pinned nightly and its rust-src component.
pub(crate) fn ensure_nightly() -> Result<()> {
    let installed =
        output(rustup().args(["component", "list", "--installed", "--toolchain", NIGHTLY]))
            .map(|list| list.lines().any(|l| l.starts_with("rust-src")))
            .unwrap_or(false);
    if !installed {
        // Installs the toolchain if missing and adds rust-src either way.
        run(rustup().args([
            "toolchain",
            "install",
            NIGHTLY,
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]))?;
    }
    Ok(())
}

fn nightly_sysroot() -> Result<PathBuf> {
    output(rustup().args(["run", NIGHTLY, "rustc", "--print", "sysroot"])).map(PathBuf::from)
}

fn linker_ok(linker: &Path) -> bool {
    linker.is_file()
        && output(Command::new(linker).arg("--version"))
            .map(|v| v.contains(BPF_LINKER_VERSION))
            .unwrap_or(false)
}

/// Replaces `link` by a symlink to `target` unless it already is one.
fn symlink(target: &Path, link: &Path) -> Result<()> {
    if std::fs::read_link(link).ok().as_deref() == Some(target) {
        return Ok(());
    }
    match std::fs::remove_file(link) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", link.display())),
    }
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("linking {} -> {}", link.display(), target.display()))
}

/// bpf-linker dynamically linked against the nightly's `libLLVM.so.*`.
/// Its RUNPATH is `<tools>/llvm/lib`, where the build needs `libLLVM.so`
/// (`-lLLVM`) and the loader needs the SONAME file: both are symlinks into
/// the nightly's sysroot. Returns the directory holding `bpf-linker`.
fn ensure_bpf_linker(tools: &Path) -> Result<PathBuf> {
    let bin = tools.join("bin");
    let linker = bin.join("bpf-linker");
    if linker_ok(&linker) {
        return Ok(bin);
    }
    let sysroot = nightly_sysroot()?;
    let lib = sysroot.join("lib");
    let soname = std::fs::read_dir(&lib)
        .with_context(|| format!("reading {}", lib.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("libLLVM.so."))
        .with_context(|| format!("no libLLVM.so.* in {}", lib.display()))?;
    let llvm_lib = tools.join("llvm/lib");
    std::fs::create_dir_all(&llvm_lib).with_context(|| {
        format!(
            "creating {} (set BPF_TOOLS_DIR to a writable directory)",
            llvm_lib.display()
        )
    })?;
    let so = lib.join(&soname);
    symlink(&so, &llvm_lib.join("libLLVM.so"))?;
    symlink(&so, &llvm_lib.join(&soname))?;
    let mut install = Command::new(env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo")));
    install
        .env_remove("RUSTUP_TOOLCHAIN")
        .args([
            "install",
            &format!("bpf-linker@{BPF_LINKER_VERSION}"),
            "--locked",
            "--force",
            "--no-default-features",
            "--features",
            LLVM_FEATURE,
            "--root",
        ])
        .arg(tools)
        .env("LLVM_PREFIX", tools.join("llvm"));
    run(&mut install)?;
    if !linker_ok(&linker) {
        bail!(
            "{} does not run after installing it (`{} --version`)",
            linker.display(),
            linker.display()
        );
    }
    Ok(bin)
}

/// Installs what is missing, then builds the eBPF object.
pub fn build(root: &Path, release: bool) -> Result<PathBuf> {
    ensure_nightly()?;
    let bin = ensure_bpf_linker(&tools_dir())?;
    let mut path = OsString::from(bin.as_os_str());
    if let Some(p) = env::var_os("PATH") {
        path.push(":");
        path.push(p);
    }
    let mut cmd = rustup();
    cmd.args([
        "run", NIGHTLY, "cargo", "build", "--locked", "--target", TARGET,
    ])
    .args(["-Z", "build-std=core"])
    .arg("--target-dir")
    .arg(crate::paths::target_dir(root))
    .current_dir(root.join("proxy-ebpf"))
    .env("PATH", path)
    // Host flags and wrappers of the outer build do not apply to BPF.
    .env_remove("RUSTC_WORKSPACE_WRAPPER")
    .env_remove("RUSTC_WRAPPER")
    .env_remove("CARGO_ENCODED_RUSTFLAGS")
    .env_remove("RUSTFLAGS")
    .env_remove("CARGO_BUILD_TARGET")
    .env_remove("CARGO_TARGET_DIR")
    // The nightly's and the stable toolchain's cargo share
    // `target/.rustc_info.json` and each rewrites it for its own rustc;
    // the nightly one does without the cache (it asks rustc afresh, a few
    // milliseconds) so a second `build-ebpf` leaves the file alone.
    .env("CARGO_CACHE_RUSTC_INFO", "0");
    if release {
        cmd.arg("--release");
    }
    let object = object_path(root, release);
    let dep_info = object.with_extension("d");
    let before = Unchanged::record(&dep_info);
    run(&mut cmd)?;
    // cargo rewrites the artifact's dep-info on every build, even a no-op
    // one with the same contents: give it its mtime back then, so that
    // nothing in the target dir looks newer after a build that did nothing.
    before.restore(&dep_info);
    if !object.is_file() {
        bail!("the build succeeded but {} is missing", object.display());
    }
    eprintln!("built {}", object.display());
    if !release {
        eprintln!("note: the daemon embeds the --release object; run `cargo xtask build-ebpf --release` for it");
    }
    Ok(object)
}

/// A file's contents and mtime before a build, to put the mtime back when
/// the build wrote the same contents again.
struct Unchanged(Option<(Vec<u8>, std::time::SystemTime)>);

impl Unchanged {
    fn record(path: &Path) -> Self {
        let read = || -> std::io::Result<_> {
            let mtime = std::fs::metadata(path)?.modified()?;
            Ok((std::fs::read(path)?, mtime))
        };
        Self(read().ok())
    }

    fn restore(self, path: &Path) {
        let Some((contents, mtime)) = self.0 else {
            return;
        };
        if std::fs::read(path).is_ok_and(|now| now == contents) {
            let file = std::fs::File::options().write(true).open(path);
            // Best effort: a newer mtime only costs a look, never a wrong build.
            let _ = file.and_then(|f| f.set_modified(mtime));
        }
    }
}

/// `cargo xtask build-ebpf [--release]`.
pub fn build_ebpf(root: &Path, args: &[String]) -> Result<()> {
    build(root, parse_args(args)?).map(|_| ())
}

/// Whether `cargo xtask build-ebpf [--release]` asks for a release build.
pub fn parse_args(args: &[String]) -> Result<bool> {
    let mut release = false;
    for a in args {
        match a.as_str() {
            "--release" => release = true,
            other => bail!(
                "build-ebpf: unknown argument {other:?}; usage: cargo xtask build-ebpf [--release]"
            ),
        }
    }
    Ok(release)
}
