//! The HTTP servers against clients that misbehave: a crowd of idle
//! connections must not starve the kubelet's `/healthz` probe, a client
//! that never finishes its headers is disconnected, and oversized request
//! heads are refused. One test per binary: it lowers the process's
//! open-files limit while it starts the daemon.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::status::{start_web, wait_ready};
use common::{get, http};

fn set_soft_nofile(n: u64) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a valid, owned rlimit.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        let old = lim.rlim_cur;
        lim.rlim_cur = n.min(lim.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        old
    }
}

#[test]
fn idle_and_slow_clients_cannot_starve_healthz() {
    // The daemon inherits a low soft limit, as under many container
    // runtimes' defaults; it must not let 600 idle sockets exhaust it.
    let old = set_soft_nofile(256);
    let d = start_web(&["--http-max-connections=400", "--http-read-timeout=3s"]);
    set_soft_nofile(old);
    wait_ready(&d);

    let mut idle = Vec::new();
    for _ in 0..600 {
        if let Ok(s) = TcpStream::connect(d.healthz) {
            idle.push(s);
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let r = get(d.healthz, "/healthz");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "/healthz took {:?} behind 600 idle connections",
        started.elapsed()
    );

    // A client that starts a request and never finishes its headers is
    // disconnected after --http-read-timeout.
    let mut slow = TcpStream::connect(d.metrics).unwrap();
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    let started = Instant::now();
    let mut buf = Vec::new();
    let _ = slow.read_to_end(&mut buf);
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "a stalled request head held its connection for {:?}",
        started.elapsed()
    );

    // Too many header lines: refused, the server keeps serving.
    let many: Vec<(String, String)> = (0..100)
        .map(|i| (format!("x-h{i}"), "v".to_owned()))
        .collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let r = http(d.metrics, "GET", "/metrics", &many);
    assert_eq!(r.status, 431, "100 headers");
    assert_eq!(get(d.metrics, "/readyz").status, 200);
    drop(idle);
}
