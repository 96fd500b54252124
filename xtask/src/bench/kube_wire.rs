//! The kube source's encodings of issue 37: the bench cluster's Service
//! and EndpointSlice lists as the fake API server answers them in
//! protobuf (`--kube-api-content-type application/vnd.kubernetes.protobuf`,
//! the default) and in JSON — the bytes on the wire, and the CPU the
//! source spends reading them (the answer re-framed, read and every
//! object checked, as `ebpf_kube_proxy::sources::kube::read_list` does) —
//! each protobuf figure against half the JSON one measured in the same
//! run.
//!
//! `cargo xtask bench --only kube-wire [--scales S]` prints the rows at the
//! largest scale given (the goal's is 50k/250k: `--scales 50k/250k`; the
//! default scales reach 100k/1M); the scale table may call
//! [`build_decoder`], [`measure`] and [`rows`] itself. The decoder is
//! `proxy-userspace/examples/kube_wire.rs`; the CPU figure is the least of
//! [`RUNS`] reads of each list, whole (one answer per list, as an API
//! server's watch cache answers; pages of 500 come to the same bytes).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;
use test_support::fake_apiserver::FakeApiServer;

use super::manifests::{self, Scale};

/// Issue 37: protobuf at most half of JSON, bytes and CPU alike.
pub const GOAL_RATIO: f64 = 0.5;
/// Reads per encoding; the least CPU counts (other work on the machine
/// only ever adds to it).
pub const RUNS: usize = 3;

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf, application/json";
const JSON: &str = "application/json";

/// The lists read: resource and the path of its collection.
const LISTS: [(&str, &str); 2] = [
    ("services", "/api/v1/services"),
    ("endpointslices", "/apis/discovery.k8s.io/v1/endpointslices"),
];

/// One encoding's lists.
#[derive(Clone, Copy, Debug)]
pub struct Encoding {
    pub bytes: u64,
    pub cpu_seconds: f64,
    pub wall_seconds: f64,
    pub objects: u64,
}

/// Both encodings of the same cluster, measured in the same run.
#[derive(Clone, Copy, Debug)]
pub struct Wire {
    pub protobuf: Encoding,
    pub json: Encoding,
}

impl Wire {
    pub fn bytes_ratio(&self) -> f64 {
        self.protobuf.bytes as f64 / self.json.bytes as f64
    }

    pub fn cpu_ratio(&self) -> f64 {
        self.protobuf.cpu_seconds / self.json.cpu_seconds
    }
}

/// Builds the decoder in release and copies it into `dir`, out of the
/// shared target directory another build may rewrite meanwhile.
pub fn build_decoder(root: &Path, dir: &Path) -> Result<PathBuf> {
    super::release_example(root, dir, "kube_wire")
}

/// The bench cluster at `scale` on a fake API server; its lists fetched
/// in each encoding into `dir` and read by `decoder`.
pub fn measure(decoder: &Path, dir: &Path, scale: Scale) -> Result<Wire> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting a runtime for the fake API server")?;
    let api = rt.block_on(FakeApiServer::start());
    for object in manifests::objects(scale, &[]) {
        api.apply(object);
    }
    let mut encodings = Vec::new();
    for (name, accept) in [("protobuf", PROTOBUF), ("json", JSON)] {
        let mut bytes = 0;
        let mut args = vec![RUNS.to_string()];
        for (resource, path) in LISTS {
            let body = get(api.addr, path, accept)
                .with_context(|| format!("listing {resource} in {name}"))?;
            bytes += body.len() as u64;
            let file = dir.join(format!("{resource}.{name}"));
            std::fs::write(&file, &body).with_context(|| format!("writing {}", file.display()))?;
            args.push(format!("{resource}={}", file.display()));
        }
        let (cpu_seconds, wall_seconds, objects) = decode(decoder, &args)?;
        encodings.push(Encoding {
            bytes,
            cpu_seconds,
            wall_seconds,
            objects,
        });
    }
    let (protobuf, json) = (encodings[0], encodings[1]);
    ensure!(
        protobuf.objects == json.objects,
        "{} objects read from protobuf, {} from JSON",
        protobuf.objects,
        json.objects
    );
    api.stop();
    Ok(Wire { protobuf, json })
}

/// A GET's body, asking for `accept` (HTTP/1.1, one request).
fn get(addr: SocketAddr, path: &str, accept: &str) -> Result<Vec<u8>> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)?;
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no end of headers")?;
    let head = String::from_utf8_lossy(&answer[..end]).to_ascii_lowercase();
    ensure!(
        head.starts_with("http/1.1 200"),
        "{path}: {}",
        head.lines().next().unwrap_or("")
    );
    if head.contains("transfer-encoding: chunked") {
        bail!("{path}: a chunked answer (expected a length)");
    }
    Ok(answer[end + 4..].to_vec())
}

/// CPU seconds, wall seconds and objects of the decoder's fastest run.
fn decode(decoder: &Path, args: &[String]) -> Result<(f64, f64, u64)> {
    let out = Command::new(decoder)
        .args(args)
        .output()
        .with_context(|| format!("running {}", decoder.display()))?;
    ensure!(
        out.status.success(),
        "{} {}: {}\n{}",
        decoder.display(),
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).context("the decoder's output")?;
    let num = |k: &str| v[k].as_f64().with_context(|| format!("no {k} in {v}"));
    ensure!(num("refused")? == 0.0, "objects refused: {v}");
    Ok((
        num("cpu_seconds")?,
        num("wall_seconds")?,
        num("accepted")? as u64,
    ))
}

/// One line per figure: protobuf, JSON, the ratio and the goal's verdict.
pub fn rows(w: &Wire) -> Vec<String> {
    let verdict = |ratio: f64| {
        let met = if ratio <= GOAL_RATIO { "met" } else { "MISSED" };
        format!("goal <= {GOAL_RATIO} x JSON {met}")
    };
    vec![
        format!(
            "{:<34} {:>8.1} MB protobuf {:>8.1} MB JSON  {:>5.2} x  {}",
            "kube lists, bytes on the wire",
            w.protobuf.bytes as f64 / 1e6,
            w.json.bytes as f64 / 1e6,
            w.bytes_ratio(),
            verdict(w.bytes_ratio())
        ),
        format!(
            "{:<34} {:>8.3} s  protobuf {:>8.3} s  JSON  {:>5.2} x  {}  ({} objects; wall {:.3} s / {:.3} s)",
            "kube lists, decode CPU",
            w.protobuf.cpu_seconds,
            w.json.cpu_seconds,
            w.cpu_ratio(),
            verdict(w.cpu_ratio()),
            w.protobuf.objects,
            w.protobuf.wall_seconds,
            w.json.wall_seconds
        ),
    ]
}

/// Set (to anything), the run directory is kept: the answers in each
/// encoding and the decoder, to profile it (`perf record DIR/kube_wire 3
/// services=DIR/services.protobuf ...`).
const KEEP: &str = "KUBE_WIRE_KEEP";
/// A decoder already built (`cargo build --release -p proxy-userspace
/// --example kube_wire`, copied out of the target directory), used as it
/// is: to compare two builds, or to measure without rebuilding.
const DECODER: &str = "KUBE_WIRE_DECODER";

/// `cargo xtask bench --only kube-wire`: the rows at `scale`.
pub fn bench(root: &Path, scale: Scale) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("ekp-kube-wire-{}", std::process::id()));
    std::fs::create_dir_all(&dir).context("creating the run directory")?;
    let decoder = match std::env::var_os(DECODER) {
        Some(path) => Ok(PathBuf::from(path)),
        None => build_decoder(root, &dir),
    };
    let result = decoder.and_then(|decoder| measure(&decoder, &dir, scale));
    if std::env::var_os(KEEP).is_some() {
        println!(
            "{KEEP}: the answers and the decoder are kept in {}",
            dir.display()
        );
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let wire = result?;
    println!(
        "\nkube source encodings, {} services / {} endpoints, Service and EndpointSlice lists (least CPU of {RUNS} reads)",
        scale.services, scale.endpoints
    );
    for row in rows(&wire) {
        println!("  {row}");
    }
    Ok(())
}
