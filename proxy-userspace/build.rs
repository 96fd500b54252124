//! Records the git commit and the rustc version for `version`, statusz and
//! the build-info metric, and copies the eBPF object into OUT_DIR.
//!
//! The object (`target/bpfel-unknown-none/release/proxy-ebpf`, made by
//! `cargo xtask build-ebpf --release`; `EKP_EBPF_OBJECT` overrides the
//! path) is optional: without it an empty file is embedded and the eBPF
//! datapath refuses to start with a message saying how to build it, so a
//! plain `cargo build` or `cargo clippy` works on a fresh checkout.

use std::path::{Path, PathBuf};
use std::process::Command;

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let rustc_version =
        output(&rustc, &["--version"]).unwrap_or_else(|| "rustc unknown".to_owned());
    // "rustc 1.95.0 (59807616e 2026-04-14)" -> "rustc 1.95.0"
    let short: Vec<&str> = rustc_version.split_whitespace().take(2).collect();
    println!("cargo:rustc-env=EKP_RUSTC_VERSION={}", short.join(" "));
    let commit =
        output("git", &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=EKP_GIT_COMMIT={commit}");
    println!("cargo:rerun-if-changed=build.rs");
    if let Some(git_dir) = output("git", &["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={git_dir}/HEAD");
    }
    embed_ebpf_object();
}

/// Where the release eBPF object is expected: `EKP_EBPF_OBJECT`, else
/// `<target dir>/bpfel-unknown-none/release/proxy-ebpf`, canonical when it
/// exists so that `CARGO_TARGET_DIR` unset, `target` and `$PWD/target` name
/// the same file and cargo sees the same `rerun-if-changed` list (a
/// different spelling of the same path would rerun this script and relink
/// the daemon for nothing).
fn object_path(root: &Path) -> PathBuf {
    let object = match std::env::var_os("EKP_EBPF_OBJECT").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => {
            // Relative to the workspace root, like cargo (run from it).
            // Deliberately not a `rerun-if-env-changed`: the target dir is
            // where this build runs, so a different directory is a
            // different OUT_DIR and runs this script anyway, and the same
            // directory spelled another way must not.
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .filter(|d| !d.is_empty())
                .map(|d| root.join(d))
                .unwrap_or_else(|| root.join("target"));
            target.join("bpfel-unknown-none/release/proxy-ebpf")
        }
    };
    std::fs::canonicalize(&object).unwrap_or(object)
}

/// Writes `contents` to `path` unless it already holds exactly that, so a
/// rerun with the same object leaves the file's mtime (and with it rustc's
/// view of `include_bytes!`) alone.
fn write_if_changed(path: &Path, contents: &[u8]) {
    if std::fs::read(path).is_ok_and(|old| old == contents) {
        return;
    }
    if let Err(e) = std::fs::write(path, contents) {
        panic!("writing {}: {e}", path.display());
    }
}

fn embed_ebpf_object() {
    let Some(out_dir) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        return;
    };
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_default();
    let root = manifest_dir
        .parent()
        .unwrap_or(Path::new("."))
        .to_path_buf();
    println!("cargo:rerun-if-env-changed=EKP_EBPF_OBJECT");
    let object = object_path(&root);
    let dest = out_dir.join("proxy-ebpf.o");
    if object.is_file() {
        println!("cargo:rerun-if-changed={}", object.display());
        let bytes =
            std::fs::read(&object).unwrap_or_else(|e| panic!("reading {}: {e}", object.display()));
        write_if_changed(&dest, &bytes);
        println!(
            "cargo:rustc-env=EKP_EBPF_OBJECT_SOURCE={}",
            object.display()
        );
    } else {
        // Watch the directory the object will appear in (a missing file
        // would make cargo rerun this script on every build).
        if let Some(dir) = object.parent() {
            let _ = std::fs::create_dir_all(dir);
            let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
            println!("cargo:rerun-if-changed={}", dir.display());
        }
        write_if_changed(&dest, b"");
        println!("cargo:rustc-env=EKP_EBPF_OBJECT_SOURCE=");
        println!(
            "cargo:warning=eBPF object {} not found: building without the eBPF datapath (run `cargo xtask build-ebpf --release` to include it)",
            object.display()
        );
    }
}
