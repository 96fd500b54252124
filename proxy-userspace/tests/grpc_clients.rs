//! The daemon's gRPC servers with clients nobody here wrote (SPEC §10.1,
//! §10.6): Python grpcio with default channel options over the unix
//! sockets and TCP, grpcio's reflection and health clients, and a raw
//! HTTP/2 request whose `:authority` is the socket path as grpc-java sends
//! it.
//!
//! The Python interpreter is `EKP_GRPCIO_PYTHON` (a virtualenv with
//! grpcio ≥ 1.57 that `cargo xtask test` creates).

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{manifests_dir, pod_yaml, service, slice, write_atomic, Daemon};
use loona_hpack::{Decoder, Encoder};
use prost::Message;
use serde_json::Value;

const HOLD_SOURCE: &str = "EBPF_KUBE_PROXY_TEST_HOLD_SOURCE";
const SHUTDOWN_DELAY: &str = "EBPF_KUBE_PROXY_TEST_SHUTDOWN_DELAY";
const LOCALNET: &str = "localnet.v1.Endpoints";
const PODINFO: &str = "podinfo.v1alpha1.PodInfoService";

fn python() -> PathBuf {
    match std::env::var_os("EKP_GRPCIO_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => panic!(
            "EKP_GRPCIO_PYTHON is not set: run `cargo xtask test`, which creates a \
             virtualenv with grpcio and points this variable at its python"
        ),
    }
}

/// Runs the Python client; its JSON answer.
fn py(d: &Daemon, args: &[&str]) -> Value {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(python())
        .arg(here.join("tests/python/grpc_clients.py"))
        .arg(d.dir.path().join("py-stubs"))
        .arg(here.join("../proto"))
        .args(args)
        .output()
        .expect("running the Python client");
    assert!(
        out.status.success(),
        "python {args:?} failed: {}\ndaemon log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log_text()
    );
    serde_json::from_slice(&out.stdout).expect("JSON from the Python client")
}

fn unix_target(path: &Path) -> String {
    format!("unix:{}", path.display())
}

fn podinfo_socket(d: &Daemon) -> PathBuf {
    d.dir.path().join("run/podinfo.sock")
}

fn cluster() -> tempfile::TempDir {
    let pods = format!(
        "{}---\n{}",
        pod_yaml("default", "web-0", "n1", &[("Ready", "True", "")]),
        pod_yaml("default", "far", "n2", &[("Ready", "True", "")])
    );
    manifests_dir(&[
        ("svc.yaml", &service("default", "web", "10.96.0.10")),
        ("eps.yaml", &slice("default", "web", &["10.0.0.1"])),
        ("pods.yaml", &pods),
    ])
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect()
}

#[test]
fn grpcio_with_default_options_reads_both_apis_over_their_unix_sockets() {
    let d = Daemon::start_in(cluster(), &[]);
    for target in [unix_target(&d.socket), d.addr.to_string()] {
        let r = py(&d, &["localnet", &target]);
        assert!(r.get("error").is_none(), "{target}: {r}");
        assert_eq!(
            strings(&r["next_services"]),
            ["default/web"],
            "{target}: {r}"
        );
        assert_eq!(
            strings(&r["watch_services"]),
            ["default/web"],
            "{target}: {r}"
        );
        assert_eq!(r["watch_count"], 1, "{target}: {r}");
        assert_eq!(r["next_rev"], r["watch_rev"], "{target}: {r}");
    }
    let r = py(
        &d,
        &[
            "podinfo",
            &unix_target(&podinfo_socket(&d)),
            "default",
            "web-0",
        ],
    );
    assert!(r.get("error").is_none(), "{r}");
    assert_eq!(strings(&r["list"]), ["default/web-0"], "{r}");
    assert_eq!(r["get"], "default/web-0", "{r}");
    assert_eq!(strings(&r["get_conditions"]), ["Ready"], "{r}");
    assert_eq!(strings(&r["watch"]), ["default/web-0"], "{r}");
}

/// A state of a few megabytes: the daemon sends the services of a frame
/// as one shared buffer of gRPC messages, cut into HTTP/2 frames as the
/// client's window and frame size allow, so messages straddle DATA
/// frames; grpcio with its default settings (64 KiB initial window,
/// 16 KiB frames) reads every service of `Next` and `Watch` in order.
#[test]
fn grpcio_with_default_options_reads_a_state_of_megabytes() {
    const SERVICES: usize = 2_000;
    let name = |i: usize| format!("svc-{i:04}");
    let (mut svcs, mut slices) = (Vec::new(), Vec::new());
    for i in 0..SERVICES {
        let ip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
        svcs.push(service("default", &name(i), &ip));
        let ips: Vec<String> = (0..20)
            .map(|e| format!("10.{}.{}.{}", 1 + i / 250, i % 250, e + 1))
            .collect();
        let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
        slices.push(slice("default", &name(i), &ips));
    }
    let d = Daemon::start_in(
        manifests_dir(&[
            ("svc.yaml", &svcs.join("---\n")),
            ("eps.yaml", &slices.join("---\n")),
        ]),
        &[],
    );
    let want: Vec<String> = (0..SERVICES)
        .map(|i| format!("default/{}", name(i)))
        .collect();
    for target in [unix_target(&d.socket), d.addr.to_string()] {
        let r = py(&d, &["localnet", &target]);
        assert!(r.get("error").is_none(), "{target}: {}", r["error"]);
        assert_eq!(strings(&r["next_services"]), want, "{target}");
        assert_eq!(strings(&r["watch_services"]), want, "{target}");
        assert_eq!(r["watch_count"], SERVICES, "{target}");
    }
}

/// grpcio with default options asks for delta frames (the extension in
/// localnet.proto) over both sockets: its first frame is the whole state,
/// then only changes, and the state it rebuilds after a service is added,
/// one changed and one removed is the one `Next` returns.
#[test]
fn grpcio_rebuilds_the_state_from_delta_frames_on_both_sockets() {
    use std::io::BufRead;
    let d = Daemon::start_in(cluster(), &[]);
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut variant = 0;
    for target in [unix_target(&d.socket), d.addr.to_string()] {
        variant += 1;
        // The state to end at: web changed, api added, db (from the last
        // round) gone; written after the client holds its first frame.
        let ip = format!("10.0.0.{}", variant + 1);
        let want = [
            "default/api=10.0.1.1".to_owned(),
            format!("default/web={ip}"),
        ];
        let mut child = Command::new(python())
            .arg(here.join("tests/python/grpc_clients.py"))
            .arg(d.dir.path().join("py-stubs"))
            .arg(here.join("../proto"))
            .args(["localnet-deltas", &target])
            .args(&want)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("running the Python client");
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut ready = String::new();
        out.read_line(&mut ready).unwrap();
        assert!(ready.contains("\"ready\""), "{target}: {ready:?}");
        write_atomic(&d.manifest("eps.yaml"), &slice("default", "web", &[&ip]));
        write_atomic(
            &d.manifest("api.yaml"),
            &format!(
                "{}---\n{}",
                service("default", "api", "10.96.0.11"),
                slice("default", "api", &["10.0.1.1"])
            ),
        );
        let _ = std::fs::remove_file(d.manifest("db.yaml"));
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        assert!(child.wait().unwrap().success(), "{target}: {rest}");
        let r: Value = serde_json::from_str(&rest).expect("JSON from the Python client");
        assert!(r.get("error").is_none(), "{target}: {r}");
        let frames = r["frames"].as_array().unwrap();
        assert_eq!(frames[0]["base_rev"], 0, "{target}: {r}");
        assert!(frames.len() >= 2, "{target}: {r}");
        for pair in frames.windows(2) {
            assert_eq!(pair[1]["base_rev"], pair[0]["rev"], "{target}: {r}");
        }
        let next = rt.block_on(async {
            let mut c = d.tcp().await;
            ebpf_kube_proxy::localnet::client::next(&mut c, 0, 0)
                .await
                .unwrap()
        });
        let from_next: serde_json::Map<String, Value> = next
            .services
            .iter()
            .map(|s| {
                let svc = s.service.as_ref().unwrap();
                let ips: Vec<Value> = s.endpoints.iter().map(|e| e.ip.clone().into()).collect();
                (format!("{}/{}", svc.namespace, svc.name), ips.into())
            })
            .collect();
        assert_eq!(r["state"], Value::Object(from_next), "{target}: {r}");
        assert_eq!(r["state"]["default/web"][0], ip.as_str(), "{target}: {r}");
        // Next round: db added, so that a removal is part of it.
        write_atomic(
            &d.manifest("db.yaml"),
            &format!(
                "{}---\n{}",
                service("default", "db", "10.96.0.12"),
                slice("default", "db", &["10.0.2.1"])
            ),
        );
        std::fs::remove_file(d.manifest("api.yaml")).unwrap();
        rt.block_on(async {
            let mut c = d.tcp().await;
            let mut s = ebpf_kube_proxy::localnet::client::next(&mut c, 0, 0)
                .await
                .unwrap();
            for _ in 0..100 {
                let names: Vec<_> = s
                    .services
                    .iter()
                    .map(|s| s.service.as_ref().unwrap().name.as_str())
                    .collect();
                if names == ["db", "web"] {
                    return;
                }
                s = tokio::time::timeout(
                    Duration::from_secs(10),
                    ebpf_kube_proxy::localnet::client::next(&mut c, s.instance_id, s.rev),
                )
                .await
                .expect("db added and api removed within 10 s")
                .unwrap();
            }
            panic!("db added and api removed: never seen");
        });
    }
}

#[test]
fn reflection_lists_each_servers_services_and_describes_messages_with_comments() {
    let d = Daemon::start_in(cluster(), &[]);
    let cases = [
        (
            unix_target(&d.socket),
            LOCALNET,
            "localnet.v1.ServiceEndpoints",
        ),
        (d.addr.to_string(), LOCALNET, "localnet.v1.WatchEvent"),
        (
            unix_target(&podinfo_socket(&d)),
            PODINFO,
            "podinfo.v1alpha1.PodInfo",
        ),
    ];
    for (target, api, message) in cases {
        let r = py(&d, &["reflection", &target, message]);
        assert!(r.get("error").is_none(), "{target}: {r}");
        assert_eq!(
            strings(&r["services"]),
            [
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
                api
            ],
            "{target}: {r}"
        );
        assert_eq!(r["message"], message);
        assert!(!strings(&r["fields"]).is_empty(), "{r}");
        assert!(r["comments"].as_u64().unwrap() > 5, "comments lost: {r}");
    }
}

#[test]
fn health_is_not_serving_until_synced_and_again_from_sigterm() {
    let dir = cluster();
    let hold = dir.path().join("hold");
    std::fs::write(&hold, "").unwrap();
    let d = Daemon::start_in_env(
        dir,
        &[],
        &[
            (HOLD_SOURCE, hold.as_os_str()),
            (SHUTDOWN_DELAY, std::ffi::OsStr::new("8s")),
        ],
    );
    let endpoints = [
        (unix_target(&d.socket), LOCALNET),
        (d.addr.to_string(), LOCALNET),
        (unix_target(&podinfo_socket(&d)), PODINFO),
    ];
    let check = |target: &str, api: &str| py(&d, &["health", target, "", api, "no.such.Service"]);
    for (target, api) in &endpoints {
        let r = check(target, api);
        assert_eq!(r[""], "NOT_SERVING", "{target}: {r}");
        assert_eq!(r[*api], "NOT_SERVING", "{target}: {r}");
        assert_eq!(r["no.such.Service"], "NOT_FOUND", "{target}: {r}");
    }
    std::fs::remove_file(&hold).unwrap();
    // Touch a manifest so the source re-reads and reports synced.
    write_atomic(
        &d.manifest("svc.yaml"),
        &service("default", "web", "10.96.0.10"),
    );
    for (target, api) in &endpoints {
        let r = wait_for(|| {
            let r = check(target, api);
            (r[*api] == "SERVING").then_some(r)
        });
        assert_eq!(r[""], "SERVING", "{target}: {r}");
        assert_eq!(r["no.such.Service"], "NOT_FOUND", "{target}: {r}");
    }
    d.sigterm();
    for (target, api) in &endpoints {
        let r = check(target, api);
        assert_eq!(r[""], "NOT_SERVING", "{target} after SIGTERM: {r}");
        assert_eq!(r[*api], "NOT_SERVING", "{target} after SIGTERM: {r}");
    }
}

/// Polls `f` (bounded: 10 s).
fn wait_for<T>(mut f: impl FnMut() -> Option<T>) -> T {
    for _ in 0..100 {
        if let Some(v) = f() {
            return v;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("condition not met within 10 s");
}

/// What the server answered to one raw HTTP/2 request.
#[derive(Debug, Default)]
struct RawAnswer {
    headers: Vec<(String, String)>,
    data: Vec<u8>,
    reset: Option<u32>,
}

impl RawAnswer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// One gRPC call on stream 1 with a hand-made `:authority`, written frame
/// by frame as grpc-java would, read until the stream ends.
fn raw_call(socket: &Path, authority: &str, path: &str, message: &[u8]) -> RawAnswer {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let headers: [(&str, &str); 6] = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ];
    let block = Encoder::new().encode(headers.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())));
    let mut grpc = vec![0u8];
    grpc.extend_from_slice(&(message.len() as u32).to_be_bytes());
    grpc.extend_from_slice(message);
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    out.extend(frame(0x1, 0x4, 1, &block)); // HEADERS, END_HEADERS
    out.extend(frame(0x0, 0x1, 1, &grpc)); // DATA, END_STREAM
    s.write_all(&out).unwrap();

    let mut answer = RawAnswer::default();
    let mut decoder = Decoder::new();
    // Bounded: the stream ends with END_STREAM or RST_STREAM, and a read
    // times out after 10 s.
    for _ in 0..64 {
        let mut h = [0u8; 9];
        s.read_exact(&mut h).unwrap();
        let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).unwrap();
        let (kind, flags) = (h[3], h[4]);
        let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]);
        match (kind, stream) {
            (0x4, 0) if flags & 0x1 == 0 => s.write_all(&frame(0x4, 0x1, 0, &[])).unwrap(),
            (0x1, 1) => {
                for (n, v) in decoder.decode(&payload).unwrap() {
                    answer
                        .headers
                        .push((String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()));
                }
            }
            (0x0, 1) => answer.data.extend_from_slice(&payload),
            (0x3, 1) => {
                answer.reset = Some(u32::from_be_bytes(payload[..4].try_into().unwrap()));
                return answer;
            }
            _ => {}
        }
        if stream == 1 && flags & 0x1 != 0 {
            return answer;
        }
    }
    panic!("the stream did not end: {answer:?}");
}

#[test]
fn a_raw_socket_path_authority_gets_a_grpc_answer_on_both_sockets() {
    use proto::podinfo::v1alpha1 as pb;
    let d = Daemon::start_in(cluster(), &[]);
    let podinfo = podinfo_socket(&d);
    let list = wait_for(|| {
        let a = raw_call(
            &podinfo,
            &podinfo.display().to_string(),
            "/podinfo.v1alpha1.PodInfoService/ListPodConditions",
            &pb::ListPodConditionsRequest {}.encode_to_vec(),
        );
        assert_eq!(a.reset, None, "stream reset: {a:?}\n{}", d.log_text());
        (a.header("grpc-status") == Some("0")).then_some(a)
    });
    assert_eq!(list.header(":status"), Some("200"));
    let reply = pb::ListPodConditionsResponse::decode(&list.data[5..]).unwrap();
    let names: Vec<_> = reply.pods.iter().map(|p| p.pod_name.as_str()).collect();
    assert_eq!(names, ["web-0"]);

    let socket = d.socket.display().to_string();
    let next = raw_call(
        &d.socket,
        &socket,
        "/localnet.v1.Endpoints/Next",
        &proto::localnet::v1::NextFilter::default().encode_to_vec(),
    );
    assert_eq!(next.reset, None, "stream reset: {next:?}");
    assert_eq!(next.header(":status"), Some("200"), "{next:?}");
    assert_eq!(next.header("grpc-status"), Some("0"), "{next:?}");
    assert!(
        next.data.len() > 5,
        "the state arrives in DATA frames: {next:?}"
    );
}
