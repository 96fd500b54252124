//! The netexec client as the scenarios use it, and what its answers mean.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};

use super::Bed;

#[derive(Debug, Default)]
pub(crate) struct Results {
    /// "pod port=N" → count.
    pub(crate) answers: BTreeMap<String, usize>,
    pub(super) peers: BTreeMap<String, usize>,
    /// pod → the source addresses it saw the requests come from.
    pub(super) seen: BTreeMap<String, BTreeSet<String>>,
    pub(crate) errors: Vec<String>,
    /// Slowest error in ms.
    pub(super) max_error_ms: u128,
}

impl Results {
    pub(super) fn parse(lines: &[String]) -> Results {
        let mut r = Results::default();
        for l in lines {
            let ms: u128 = l
                .rsplit_once("ms=")
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0);
            if let Some(rest) = l.strip_prefix("ok ") {
                let mut words = rest.split_whitespace();
                let pod = words.next().unwrap_or("").to_owned();
                let port = words.next().unwrap_or("").to_owned();
                let peer = words
                    .next()
                    .and_then(|p| p.strip_prefix("peer="))
                    .unwrap_or("")
                    .to_owned();
                let seen = words
                    .next()
                    .and_then(|p| p.strip_prefix("seen="))
                    .unwrap_or("")
                    .to_owned();
                r.seen.entry(pod.clone()).or_default().insert(seen);
                *r.answers.entry(format!("{pod} {port}")).or_default() += 1;
                *r.peers.entry(peer).or_default() += 1;
            } else {
                r.errors.push(l.clone());
                r.max_error_ms = r.max_error_ms.max(ms);
            }
        }
        r
    }

    pub(super) fn pods(&self) -> BTreeMap<String, usize> {
        let mut pods = BTreeMap::new();
        for (k, v) in &self.answers {
            let pod = k.split_whitespace().next().unwrap_or("").to_owned();
            *pods.entry(pod).or_default() += v;
        }
        pods
    }

    pub(super) fn ok_count(&self) -> usize {
        self.answers.values().sum()
    }
}

/// The client's own default timeout per request.
pub(super) const CLIENT_TIMEOUT: Duration = Duration::from_millis(1000);

pub(super) fn request(bed: &Bed, proto: &str, target: &str, count: usize) -> Result<Results> {
    request_from(bed, None, proto, target, count, CLIENT_TIMEOUT)
}

/// `count` requests from a client in `netns` (the node's when `None`),
/// each given `timeout` to connect and be answered.
pub(crate) fn request_from(
    bed: &Bed,
    netns: Option<&str>,
    proto: &str,
    target: &str,
    count: usize,
    timeout: Duration,
) -> Result<Results> {
    let lines = bed.client(
        netns,
        &[
            "--proto",
            proto,
            "--target",
            target,
            "--count",
            &count.to_string(),
            "--timeout-ms",
            &timeout.as_millis().to_string(),
        ],
    )?;
    Ok(Results::parse(&lines))
}

/// Retries single requests until one is answered (the daemon programs a
/// change asynchronously), up to `within`.
pub(super) fn wait_until_served(
    bed: &Bed,
    proto: &str,
    target: &str,
    within: Duration,
) -> Result<Duration> {
    wait_until_served_from(bed, None, proto, target, within, CLIENT_TIMEOUT)
}

/// [`wait_until_served`] for a client in `netns`, each attempt given
/// `attempt_timeout` (short where the datapath drops until programmed).
/// Waits (5 s at most) until `target` answers TCP from the client outside
/// the nodes.
pub(super) fn wait_served_from_outside(bed: &Bed, target: &str) -> Result<Duration> {
    wait_until_served_from(
        bed,
        Some(&bed.outside_netns),
        "tcp",
        target,
        Duration::from_secs(5),
        super::DROP_TIMEOUT,
    )
}

pub(super) fn wait_until_served_from(
    bed: &Bed,
    netns: Option<&str>,
    proto: &str,
    target: &str,
    within: Duration,
    attempt_timeout: Duration,
) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let r = request_from(bed, netns, proto, target, 1, attempt_timeout)?;
        if r.ok_count() == 1 {
            return Ok(started.elapsed());
        }
        if started.elapsed() > within {
            bail!(
                "{target}/{proto} not served within {within:?}: {:?}",
                r.errors
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(super) fn assert_spread(
    r: &Results,
    total: usize,
    expected_pods: &[&str],
    min_share: f64,
) -> Result<()> {
    ensure!(
        r.errors.is_empty(),
        "{} failed requests, e.g. {:?}",
        r.errors.len(),
        r.errors.first()
    );
    let pods = r.pods();
    let names: Vec<&str> = pods.keys().map(String::as_str).collect();
    ensure!(
        names == expected_pods,
        "answered by {pods:?}, expected exactly {expected_pods:?}"
    );
    for (pod, n) in &pods {
        let share = *n as f64 / total as f64;
        ensure!(
            share >= min_share,
            "{pod} answered {n}/{total} ({:.0}%), below {:.0}%: {pods:?}",
            share * 100.0,
            min_share * 100.0
        );
    }
    Ok(())
}

pub(super) fn assert_peer_is(r: &Results, vip: &str) -> Result<()> {
    let peers: Vec<&String> = r.peers.keys().collect();
    ensure!(
        peers == [vip],
        "the application must see the service address {vip} as its peer, saw {:?}",
        r.peers
    );
    Ok(())
}

/// No request was answered, and none was refused either: the datapath
/// dropped them (a refusal comes from a reject verdict or, on a node
/// address, from a port nothing was DNATed on).
pub(super) fn assert_dropped(r: &Results, what: &str) -> Result<()> {
    ensure!(
        r.ok_count() == 0,
        "{what}: {} requests answered, by {:?}",
        r.ok_count(),
        r.pods()
    );
    let refused: Vec<&String> = r.errors.iter().filter(|e| e.contains("refused")).collect();
    ensure!(
        refused.is_empty(),
        "{what}: refused instead of dropped: {:?}",
        refused.first()
    );
    Ok(())
}

/// A UDP client that keeps its socket (and so its source port), sending
/// every 50 ms for `ms`.
pub(super) fn udp_client(bed: &Bed, netns: Option<&str>, target: &str, ms: u32) -> Result<Child> {
    bed.spawn_client(
        netns,
        &[
            "--proto",
            "udp",
            "--target",
            target,
            "--duration-ms",
            &ms.to_string(),
            "--interval-ms",
            "50",
            "--timeout-ms",
            "200",
            "--reuse",
        ],
    )
}

/// The last 10 answers of a client started by [`udp_client`].
pub(super) fn tail_of(client: Child) -> Result<Results> {
    let out = client.wait_with_output()?;
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    Ok(Results::parse(&lines[lines.len().saturating_sub(10)..]))
}
