//! Where built artifacts live. Every xtask path into the target directory
//! goes through here, so a shared `CARGO_TARGET_DIR` works everywhere.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The cargo target directory: `CARGO_TARGET_DIR` (relative to the
/// workspace root when relative), else `<root>/target`.
pub fn target_dir(root: &Path) -> PathBuf {
    target_dir_from(root, std::env::var_os("CARGO_TARGET_DIR"))
}

fn target_dir_from(root: &Path, env: Option<OsString>) -> PathBuf {
    match env.filter(|d| !d.is_empty()) {
        // `join` keeps an absolute path as it is.
        Some(dir) => root.join(dir),
        None => root.join("target"),
    }
}

/// The daemon binary of the debug build (`cargo build --bin ebpf-kube-proxy`).
pub fn daemon_bin(root: &Path) -> PathBuf {
    target_dir(root).join("debug/ebpf-kube-proxy")
}

/// The virtualenv holding the Python gRPC clients the tests use.
pub fn python_env(root: &Path) -> PathBuf {
    target_dir(root).join("grpcio-venv")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_cargo_target_dir_artifacts_are_under_the_workspace() {
        let root = Path::new("/src/ekp");
        assert_eq!(target_dir_from(root, None), Path::new("/src/ekp/target"));
        assert_eq!(
            target_dir_from(root, Some(OsString::new())),
            Path::new("/src/ekp/target")
        );
    }

    #[test]
    fn cargo_target_dir_absolute_or_relative_to_the_workspace() {
        let root = Path::new("/src/ekp");
        assert_eq!(
            target_dir_from(root, Some("/shared/target".into())),
            Path::new("/shared/target")
        );
        assert_eq!(
            target_dir_from(root, Some("out".into())),
            Path::new("/src/ekp/out")
        );
    }

    #[test]
    fn every_artifact_follows_the_target_dir() {
        // The process environment is shared by parallel tests: only read it.
        let root = Path::new("/src/ekp");
        let target = target_dir(root);
        assert_eq!(daemon_bin(root), target.join("debug/ebpf-kube-proxy"));
        assert!(python_env(root).starts_with(&target));
        assert!(crate::ebpf::object_path(root, true).starts_with(&target));
    }
}
