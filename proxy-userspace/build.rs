//! Records the git commit and the rustc version for `version`, statusz and
//! the build-info metric.

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
}
