//! The old build the upgrade scenario switches to and from (issue 38 item
//! 2): `cargo xtask e2e --filter upgrade [--upgrade-from REF]`, and part of
//! every unfiltered `cargo xtask e2e` and `cargo xtask test` run.
//!
//! Without `--upgrade-from`, the old build is [`RELEASE_POINT`]. The ref
//! is checked out with `git worktree add` under this tree's target
//! directory (`target/upgrade-old/src-<sha>`) and built there into a
//! target directory of its own (`target/upgrade-old/target`): its eBPF
//! object and daemon never touch the tree's own build. Only what the
//! scenario runs is built: the eBPF object (the old tree's own
//! `cargo xtask build-ebpf --release`) and the daemon that embeds it. The
//! daemon is kept as `target/upgrade-old/<sha>/ebpf-kube-proxy` and reused
//! by every later run; the worktree and the build directory are removed
//! once it is there (a build from scratch takes minutes, the daemon alone
//! is a few hundred MB less than its build directory).
//!
//! [`last_layout_change`] is only told: when a pinned map's layout or a
//! program section changed after the release point, the run says so, as a
//! reminder to move [`RELEASE_POINT`] once that change has landed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

use anyhow::{bail, Context, Result};

/// The default old build: the last landed release point, a commit whose
/// whole tree builds (`cargo xtask build-ebpf --release`, `cargo build
/// --bin ebpf-kube-proxy`) and whose daemon removes pins it does not know
/// (`datapath/ebpf/foreign.rs`; a build from before that leaves a newer
/// build's pins behind on a rollback, and the scenario fails on them).
///
/// Rule: when a change to a pinned map's layout, a pin name or a program
/// section lands, move this to the commit that landed (or to the last
/// release point before it that still builds), never to a commit of a
/// session in progress (one that may not build on its own).
pub const RELEASE_POINT: &str = "103f5fbc8cac134c9ae37702ea24df8297ea0d66";

/// Where the pinned maps' layout and the programs' sections are defined.
pub const LAYOUT_PATHS: [&str; 2] = ["proxy-common/src/lib.rs", "proxy-ebpf/src"];

/// A line that defines layout (`git log -G`): a field of a `#[repr(C)]`
/// struct, a map or program attribute, a map static, a map name or
/// capacity.
pub const LAYOUT_LINES: &str = r"^\s*(pub [a-z_0-9]+: [][A-Za-z0-9_; ]+,|#\[(map|classifier|cgroup_sock_addr|iter|sock_ops|fentry|kprobe)\b|(pub )?static [A-Z_0-9]+: |pub const (MAP_|MAX_)[A-Z_0-9]+|pub const [A-Z_]*COUNT: )";

/// The old daemon the scenario runs, set by [`prepare`].
#[derive(Clone, Debug)]
pub struct OldBuild {
    pub sha: String,
    /// `git log --oneline` of the ref, for the log lines.
    pub title: String,
    pub daemon_bin: PathBuf,
}

static OLD: OnceLock<OldBuild> = OnceLock::new();

/// The old build [`prepare`] made, if it ran.
pub fn old_build() -> Option<&'static OldBuild> {
    OLD.get()
}

/// Where old builds live: `target/upgrade-old`, beside this tree's own
/// build and ignored by git.
pub fn upgrade_dir(root: &Path) -> PathBuf {
    crate::paths::target_dir(root).join("upgrade-old")
}

fn git(root: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(args)
        .output()
        .with_context(|| format!("running git {args:?}"))?;
    if !out.status.success() {
        bail!(
            "git {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The last commit of HEAD's history that changed a layout line.
pub fn last_layout_change(root: &Path) -> Result<String> {
    let mut args = vec!["log", "-1", "--format=%H", "-G", LAYOUT_LINES, "--"];
    args.extend(LAYOUT_PATHS);
    git(root, &args)
}

/// Resolves `from` (or [`RELEASE_POINT`]), builds it unless built already,
/// and records it for the scenario.
pub fn prepare(root: &Path, from: Option<&str>) -> Result<&'static OldBuild> {
    if let Some(b) = OLD.get() {
        return Ok(b);
    }
    let (r, why) = match from {
        Some(r) => (r, format!("--upgrade-from {r}")),
        None => (
            RELEASE_POINT,
            "the release point, RELEASE_POINT in xtask/src/e2e/upgrade.rs".to_owned(),
        ),
    };
    let sha = git(root, &["rev-parse", "--verify", &format!("{r}^{{commit}}")])
        .with_context(|| format!("the old build {r} ({why}) is not in this clone's history"))?;
    let title = git(root, &["log", "-1", "--format=%h %s", &sha])?;
    let title: String = title.chars().take(100).collect();
    println!("upgrade: old build {title} ({why})");
    if let Ok(layout) = last_layout_change(root) {
        let after = !layout.is_empty()
            && layout != sha
            && git(root, &["merge-base", "--is-ancestor", &sha, &layout]).is_ok();
        if after {
            println!(
                "upgrade: note: {} changed a pinned map's layout or a program section after it; move RELEASE_POINT once that has landed",
                &layout[..12.min(layout.len())]
            );
        }
    }
    let dir = upgrade_dir(root);
    let daemon_bin = dir.join(&sha).join("ebpf-kube-proxy");
    if daemon_bin.exists() {
        println!("upgrade: reusing {}", daemon_bin.display());
    } else {
        build(root, &dir, &sha, &daemon_bin)?;
    }
    Ok(OLD.get_or_init(|| OldBuild {
        sha,
        title,
        daemon_bin,
    }))
}

/// `git worktree add` of `sha`, its eBPF object and debug daemon built
/// into `dir/target`, the daemon copied to `daemon_bin`, the worktree and
/// the build directory removed.
fn build(root: &Path, dir: &Path, sha: &str, daemon_bin: &Path) -> Result<()> {
    let started = Instant::now();
    let tree = dir.join(format!("src-{sha}"));
    let target = dir.join("target");
    std::fs::create_dir_all(dir)?;
    if !tree.join("Cargo.toml").exists() {
        // A worktree whose directory is gone is still registered: forget it.
        git(root, &["worktree", "prune"])?;
        let tree_arg = tree.to_string_lossy().into_owned();
        git(root, &["worktree", "add", "--detach", &tree_arg, sha])?;
    }
    // The rustup proxy (not this process's `$CARGO`), so the old tree's own
    // toolchain choice holds; its xtask and build script read the target
    // directory from CARGO_TARGET_DIR.
    let cargo = |args: &[&str]| -> Result<()> {
        let mut cmd = Command::new("cargo");
        cmd.current_dir(&tree)
            .args(args)
            .env("CARGO_TARGET_DIR", &target)
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("EKP_EBPF_OBJECT");
        crate::run(&mut cmd)
    };
    cargo(&["xtask", "build-ebpf", "--release"])?;
    cargo(&["build", "--bin", "ebpf-kube-proxy"])?;
    std::fs::create_dir_all(daemon_bin.parent().context("bin dir")?)?;
    let tmp = daemon_bin.with_extension("tmp");
    std::fs::copy(target.join("debug/ebpf-kube-proxy"), &tmp).context("copying the old daemon")?;
    std::fs::rename(&tmp, daemon_bin)?;
    let tree_arg = tree.to_string_lossy().into_owned();
    git(root, &["worktree", "remove", "--force", &tree_arg])?;
    std::fs::remove_dir_all(&target).with_context(|| format!("removing {}", target.display()))?;
    println!(
        "upgrade: built {sha} in {:.0} s (into {}, then removed)",
        started.elapsed().as_secs_f64(),
        target.display()
    );
    Ok(())
}
