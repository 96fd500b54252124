//! One large service sent to 100 localnet clients at once costs the
//! daemon one copy of its message, not one per client (issue 37: 100
//! clients waiting on `Next` held the 9.2 MB message each).

mod common;

use std::time::Duration;

use common::{service, Daemon};
use ebpf_kube_proxy::localnet::client;
use prost::Message;
use proto::localnet::v1 as pb;
use test_support::manifests;

/// Endpoints of the one big service, in slices of 1,000.
const ENDPOINTS: usize = 120_000;
const CLIENTS: usize = 100;

fn manifest() -> String {
    let mut out = service("big", "web", "10.96.0.10");
    out.push_str("---\n");
    let svc = manifests::Svc::new("big", "web", "");
    for s in 0..ENDPOINTS / 1000 {
        let endpoints: Vec<manifests::Endpoint> = (0..1000)
            .map(|e| {
                let g = s * 1000 + e + 1;
                let ip = format!("10.{}.{}.{}", 100 + g / 65536, g / 256 % 256, g % 256);
                manifests::Endpoint::ready(&ip, "n2")
            })
            .collect();
        out.push_str(&manifests::slice_yaml(
            &svc,
            &s.to_string(),
            false,
            &endpoints,
        ));
        out.push_str("---\n");
    }
    out
}

/// A line of the daemon's /proc status in KiB (`VmHWM`, `VmRSS`).
fn status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {text}"))
}

/// 100 `Next` calls get the big state at once and do not read it: the
/// daemon's memory grows by less than a few copies of the message (it
/// grew by one copy per client), and a client that reads gets the whole
/// service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_clients_share_one_copy_of_a_large_service() {
    let d = Daemon::start(&[("big.yaml", &manifest())]);
    let mut c = d.tcp().await;
    let mut first = client::next(&mut c, 0, 0).await.unwrap();
    while first
        .services
        .iter()
        .map(|s| s.endpoints.len())
        .sum::<usize>()
        < ENDPOINTS
    {
        first = tokio::time::timeout(
            Duration::from_secs(60),
            client::next(&mut c, first.instance_id, first.rev),
        )
        .await
        .unwrap_or_else(|_| panic!("never all {ENDPOINTS} endpoints:\n{}", d.log_text()))
        .unwrap();
    }
    let message = first.services[0].encoded_len() as u64;
    assert!(message > 4 << 20, "the service is {message} bytes");

    let (hwm, rss) = (status_kib(d.pid(), "VmHWM"), status_kib(d.pid(), "VmRSS"));
    // Each on its own connection: each stream and connection window
    // (2 MiB / 5 MiB for these clients) holds some of it, the rest waits
    // in the daemon.
    let mut streams = Vec::new();
    for _ in 0..CLIENTS {
        let mut c = d.tcp().await;
        let req = pb::NextFilter {
            instance_id: 0,
            rev: 0,
        };
        streams.push((c.next(req).await.unwrap().into_inner(), c));
    }
    // Let every stream send what its windows take.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The peak, and what is held now (the peak before may have been
    // higher: reading the manifests).
    let grown = 1024
        * (status_kib(d.pid(), "VmHWM").saturating_sub(hwm))
            .max(status_kib(d.pid(), "VmRSS").saturating_sub(rss));
    eprintln!(
        "{CLIENTS} clients on a {message}-byte service: the daemon grew by {} MiB",
        grown >> 20
    );
    assert!(
        grown < 4 * message,
        "the daemon grew by {} MiB with {CLIENTS} clients on one {} MiB service",
        grown >> 20,
        message >> 20
    );

    // The bytes are the service: a client reads the whole state.
    let (mut stream, _c) = streams.swap_remove(0);
    let mut services = Vec::new();
    while let Some(item) = stream.message().await.unwrap() {
        if let Some(pb::next_item::Item::Endpoints(s)) = item.item {
            services.push(s);
        }
    }
    assert_eq!(services, first.services);
}
