//! Project tasks that cargo alone cannot do.
//!
//! * `cargo xtask test`  — every check and test: fmt, clippy, unit and
//!   integration tests. Installs the rustup components it needs.
//! * `cargo xtask demo`  — runs the daemon on the example manifests in
//!   `deploy/examples` and prints the published state.
//! * `cargo xtask bench [--quick] [--only localstate|nftables|datapath|scale]`
//!   — benchmarks, printed as ratios against baselines measured in the same
//!   run, and the scale table of the release daemon (`target/bench/results.json`).
//! * `cargo xtask build-ebpf [--release]` — the eBPF object the daemon
//!   embeds (installs the pinned nightly and bpf-linker when missing).
//! * `cargo xtask conformance [--proxy-mode ebpf|nftables] [--filter RE]
//!   [--json] [--write-docs]` — kube-proxy's upstream e2e tests as named
//!   scenarios of the e2e bed; writes `docs/conformance.md` (root).
//! * `cargo xtask soak --minutes N [--proxy-mode ebpf|nftables]
//!   [--churn-per-second R] [--seed S]` — the daemon on the e2e bed under
//!   traffic, churn, a flapping API server and SIGKILLs (root).
//! * `cargo xtask fuzz [--seconds N] [--target NAME]` — the libFuzzer
//!   targets of `fuzz/`, N seconds each (installs cargo-fuzz when missing).

mod bench;
#[cfg(test)]
mod docs_tests;
mod e2e;
mod ebpf;
mod fuzz;
mod paths;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Helpers the e2e suite runs inside test namespaces.
    match args.first().map(String::as_str) {
        Some("netexec") => return e2e::netexec::serve(&args[1..]),
        Some("client") => return e2e::netexec::client(&args[1..]),
        _ => {}
    }
    let root = workspace_root();
    std::env::set_current_dir(&root)?;
    match args.first().map(String::as_str) {
        Some("test") => test(&root),
        Some("demo") => demo(&root),
        Some("bench") => bench::bench(&root, &args[1..]),
        Some("e2e") => e2e_command(&root, &args[1..]),
        Some("conformance") => e2e::conformance::command(&root, &args[1..]),
        Some("build-ebpf") => ebpf::build_ebpf(&root, &args[1..]),
        Some("soak") => soak(&root, &e2e::soak::parse_args(&args[1..])?),
        Some("fuzz") => fuzz::fuzz_command(&root, &args[1..]),
        _ => {
            eprintln!("usage: cargo xtask <test|demo|bench|build-ebpf [--release]|fuzz [--seconds N] [--target NAME]>");
            eprintln!("       cargo xtask e2e|conformance [--proxy-mode ebpf|nftables] [--filter RE] (conformance: [--json] [--write-docs])");
            eprintln!("       cargo xtask soak --minutes N [--proxy-mode ebpf|nftables] [--churn-per-second R] [--seed S]");
            std::process::exit(2);
        }
    }
}

/// Reads `args` as `main` dispatches them and runs nothing: the docs test
/// feeds it every `cargo xtask` command of README.md and docs/. Keep its
/// arms in step with `main`'s.
#[cfg(test)]
fn parse_command(args: &[String]) -> Result<()> {
    let rest = args.get(1..).unwrap_or_default();
    match args.first().map(String::as_str) {
        Some("test" | "demo") if rest.is_empty() => Ok(()),
        Some("bench") => bench::parse_args(rest).map(drop),
        Some("e2e") => e2e::parse_args(rest).map(drop),
        Some("conformance") => e2e::conformance::parse_args(rest).map(drop),
        Some("build-ebpf") => ebpf::parse_args(rest).map(drop),
        Some("soak") => e2e::soak::parse_args(rest).map(drop),
        Some("fuzz") => fuzz::parse_args(rest).map(drop),
        _ => bail!("cargo xtask {}: no such command", args.join(" ")),
    }
}

fn e2e_command(root: &Path, args: &[String]) -> Result<()> {
    let opts = e2e::parse_args(args)?;
    e2e_suite(root, &opts)
}

/// Builds what the suite runs (the eBPF object first, so the daemon embeds
/// it), runs it and prints the closing `N passed, N failed` line.
fn e2e_suite(root: &Path, opts: &e2e::Options) -> Result<()> {
    // `dump` and `cleanup` of the nftables datapath run `nft`; the
    // capabilities scenario starts the daemon through `capsh`.
    if is_root() {
        ensure_debian_packages(&[("nft", "nftables"), ("capsh", "libcap2-bin")])?;
    }
    if opts.proxy_mode == "ebpf" || opts.proxy_mode == "auto" {
        ebpf::build(root, true)?;
    }
    run(cargo().args(["build", "--bin", "ebpf-kube-proxy"]))?;
    let (passed, failed, skipped) = e2e::run(root, opts)?;
    println!("{passed} passed, {failed} failed, {skipped} skipped");
    if failed > 0 {
        bail!("{failed} e2e scenario(s) failed");
    }
    Ok(())
}

/// Builds what the soak runs, then runs it (see `e2e/soak.rs`).
fn soak(root: &Path, opts: &e2e::soak::Options) -> Result<()> {
    if !is_root() {
        bail!("the soak needs root (network namespaces, cgroups, eBPF)");
    }
    ensure_debian_packages(&[("nft", "nftables")])?;
    if opts.proxy_mode == "ebpf" {
        ebpf::build(root, true)?;
    }
    run(cargo().args(["build", "--bin", "ebpf-kube-proxy"]))?;
    e2e::soak::run(root, opts)
}

/// Datapaths the e2e suite covers in `cargo xtask test`.
const E2E_PROXY_MODES: &[&str] = &["ebpf", "nftables"];

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// A cargo command without the variables rustup sets for this process, so a
/// nested toolchain choice (`cargo +nightly`) is never overridden.
fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()));
    c.env_remove("RUSTUP_TOOLCHAIN");
    c
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {cmd:?}");
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Installs rustup components of the active toolchain when missing.
fn ensure_components(components: &[&str]) -> Result<()> {
    let out = Command::new("rustup")
        .args(["component", "list", "--installed"])
        .output();
    let installed = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        // No rustup (a distribution toolchain): assume the components exist.
        _ => return Ok(()),
    };
    for c in components {
        if !installed
            .lines()
            .any(|l| l.starts_with(&format!("{c}-")) || l == *c)
        {
            run(Command::new("rustup").args(["component", "add", c]))?;
        }
    }
    Ok(())
}

fn test(root: &Path) -> Result<()> {
    ensure_components(&["rustfmt", "clippy"])?;
    // shellcheck for the deploy script test; iproute2 and util-linux
    // (nsenter) for the network-namespace tests.
    ensure_debian_packages(&[
        ("shellcheck", "shellcheck"),
        ("ip", "iproute2"),
        ("nsenter", "util-linux"),
        // nft for `dump`/`cleanup` and the ruleset listings the tests
        // compare; conntrack to create entries in the cleanup test.
        ("nft", "nftables"),
        ("conntrack", "conntrack"),
    ])?;
    // First, so that the daemon embeds the eBPF object and its kernel tests run.
    ebpf::build(root, true)?;
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    let python = ensure_python_clients(root)?;
    run(cargo()
        .args(["test", "--workspace", "--no-fail-fast"])
        .env("EKP_GRPCIO_PYTHON", python))?;
    if is_root() {
        for mode in E2E_PROXY_MODES {
            e2e_suite(
                root,
                &e2e::Options {
                    proxy_mode: (*mode).to_owned(),
                    filter: None,
                    upgrade_from: None,
                },
            )?;
        }
        // Issue 36: kube-proxy's upstream e2e tests on both datapaths.
        e2e::conformance::run_all(root)?;
        // Issue 19: 3 minutes of soak (churn, API server flapping, daemon
        // SIGKILLs) on one datapath; an hour is
        // `cargo xtask soak --minutes 60 --proxy-mode ebpf` (README, Soak).
        soak(
            root,
            &e2e::soak::Options {
                minutes: 3.0,
                proxy_mode: "nftables".to_owned(),
                churn_per_second: 2.0,
                seed: None,
            },
        )?;
    } else {
        println!("e2e suite skipped: it needs root (network namespaces, cgroups, eBPF)");
    }
    // A short smoke run of every fuzz target (build cached after the first
    // time); the acceptance run is `cargo xtask fuzz --seconds 30`.
    fuzz::run_fuzz(
        root,
        &fuzz::Options {
            seconds: fuzz::TEST_SECONDS,
            target: None,
        },
    )
}

/// A virtualenv with the pinned Python gRPC clients
/// (`proxy-userspace/tests/python/requirements.txt`); returns its python.
fn ensure_python_clients(root: &Path) -> Result<PathBuf> {
    let venv = paths::python_env(root);
    let python = venv.join("bin/python");
    let requirements = root.join("proxy-userspace/tests/python/requirements.txt");
    let stamp = venv.join("requirements.installed");
    let wanted = std::fs::read(&requirements).context("reading the Python requirements")?;
    if std::fs::read(&stamp).is_ok_and(|have| have == wanted) && python.exists() {
        return Ok(python);
    }
    if !python.exists() {
        let venv_ok = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success());
        if !venv_ok {
            // Debian's python3 keeps venv in a package of its own.
            apt_install(&["python3-venv", "python3-pip"])?;
            run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        }
    }
    run(Command::new(&python).args(["-m", "pip", "install", "-q", "--upgrade", "pip"]))?;
    run(Command::new(&python)
        .args(["-m", "pip", "install", "-q", "-r"])
        .arg(&requirements))?;
    std::fs::write(&stamp, wanted)?;
    Ok(python)
}

/// Installs Debian packages whose command is missing (root, apt).
fn ensure_debian_packages(wanted: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|(cmd, _)| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {cmd}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(|(_, pkg)| *pkg)
        .collect();
    apt_install(&missing)
}

fn apt_install(packages: &[&str]) -> Result<()> {
    if packages.is_empty() {
        return Ok(());
    }
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn demo(root: &Path) -> Result<()> {
    run(cargo().args(["build", "--bin", "ebpf-kube-proxy"]))?;
    let bin = paths::daemon_bin(root);
    let manifests = root.join("deploy/examples");
    let run_dir = std::env::temp_dir().join(format!("ebpf-kube-proxy-demo-{}", std::process::id()));
    std::fs::create_dir_all(&run_dir)?;
    let socket = run_dir.join("localnet.sock");
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?
    };

    println!(
        "==> starting ebpf-kube-proxy on the file source ({})",
        manifests.display()
    );
    println!(
        "    node node-1 (zone zone-a), proxy-mode none, localnet on {addr} and unix:{}",
        socket.display()
    );
    let mut daemon = KillOnDrop(
        Command::new(&bin)
            .args([
                "--source",
                "file",
                "--hostname-override",
                "node-1",
                "--proxy-mode",
                "none",
            ])
            .arg("--manifests")
            .arg(&manifests)
            .arg("--localnet-bind-address")
            .arg(addr.to_string())
            .arg("--localnet-socket")
            .arg(&socket)
            .arg("--podinfo-socket")
            .arg(run_dir.join("podinfo.sock"))
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the daemon")?,
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if Instant::now() > deadline {
            bail!("the daemon did not open {} within 15 s", socket.display());
        }
        if let Some(status) = daemon.0.try_wait()? {
            bail!("the daemon exited early: {status}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    println!(
        "\n==> ebpf-kube-proxy localnet watch --once --target unix:{}",
        socket.display()
    );
    run(Command::new(&bin)
        .args(["localnet", "watch", "--once", "--target"])
        .arg(format!("unix:{}", socket.display())))?;

    println!("\n==> stopping the daemon (SIGTERM)");
    run(Command::new("kill").args(["-TERM", &daemon.0.id().to_string()]))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = daemon.0.try_wait()? {
            if !status.success() {
                bail!("the daemon exited with {status}");
            }
            break;
        }
        if Instant::now() > deadline {
            bail!("the daemon did not stop within 10 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(&run_dir);
    if is_root() {
        ebpf::build(root, true)?;
        run(cargo().args(["build", "--bin", "ebpf-kube-proxy"]))?;
        println!();
        e2e::demo::traffic(root)?;
    } else {
        println!("\n(run as root to also see real traffic through the eBPF datapath on a network-namespace mini node)");
    }
    println!("==> done");
    Ok(())
}
