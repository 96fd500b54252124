//! Starting the daemon and knowing when it serves: the sampled ClusterIPs,
//! the route that makes every generated endpoint answer, the probes that
//! see the first answer, and the daemon's own programmed timestamp.

use std::net::Ipv4Addr;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::{kill, line_reader, Settings};
use crate::bench::daemon::{self, unix_now};
use crate::bench::manifests::Scale;
use crate::e2e::bed::Bed;

/// The first generated service's ClusterIP: the `i`th is this plus `i`.
const FIRST_GENERATED_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 1, 0);
/// Where the generated endpoints live (10.128.0.0/16 on, rotated ones
/// from 10.160.0.0): routed to the first pod, which takes them as its own.
const GENERATED_ENDPOINTS: &str = "10.128.0.0/10";

/// The ClusterIPs whose answer makes a cell served: the first, the
/// middle and the last generated service.
pub fn sampled_ips(scale: Scale) -> Vec<String> {
    let last = scale.services.saturating_sub(1);
    let mut idx = vec![0, last / 2, last];
    idx.dedup();
    idx.into_iter()
        .map(|i| {
            let ip = u32::from(FIRST_GENERATED_IP).wrapping_add(i as u32);
            Ipv4Addr::from(ip).to_string()
        })
        .collect()
}

/// Makes every generated endpoint answer: the node routes
/// [`GENERATED_ENDPOINTS`] to the first pod, whose namespace holds them
/// all as local addresses (its netexec listens on every address), so a
/// connection to a generated service is answered once the datapath
/// translates it, and not before.
pub(in crate::bench) fn route_generated(bed: &Bed) -> Result<()> {
    let pod = bed.pods.first().context("the bed has no pod")?;
    // The first pod's veth on the node (see the bed's add_pod).
    let veth = format!("{}v1", bed.prefix);
    for args in [
        vec![
            "-n",
            pod.netns.as_str(),
            "route",
            "add",
            "local",
            GENERATED_ENDPOINTS,
            "dev",
            "lo",
        ],
        vec![
            "-n",
            bed.node_netns.as_str(),
            "route",
            "add",
            GENERATED_ENDPOINTS,
            "dev",
            veth.as_str(),
        ],
    ] {
        let out = Command::new("ip")
            .args(&args)
            .output()
            .context("running ip")?;
        if !out.status.success() {
            bail!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    Ok(())
}

/// Clients that connect to each of `ips` port 80 every 5 ms from the
/// node: the moment each first got an answer. Before the datapath has a
/// service, its connection fails at once on the eBPF bed (no route) and
/// waits out the 100 ms timeout on the nftables one (a default route into
/// a dead veth): the figure is late by at most that plus 5 ms.
struct ServedProbe {
    clients: Vec<Child>,
    answered: mpsc::Receiver<f64>,
}

impl ServedProbe {
    fn start(bed: &Bed, ips: &[String], timeout: Duration) -> Result<ServedProbe> {
        let (tx, answered) = mpsc::channel();
        let mut clients = Vec::new();
        let duration = timeout.as_millis().to_string();
        for ip in ips {
            let target = format!("{ip}:80");
            let spawned = bed.spawn_client(
                None,
                &[
                    "--proto",
                    "tcp",
                    "--target",
                    &target,
                    "--duration-ms",
                    &duration,
                    "--interval-ms",
                    "5",
                    "--timeout-ms",
                    "100",
                ],
            );
            let mut client = match spawned {
                Ok(c) => c,
                Err(e) => {
                    clients.iter_mut().for_each(kill);
                    return Err(e);
                }
            };
            let lines = line_reader(&mut client);
            clients.push(client);
            let lines = match lines {
                Ok(l) => l,
                Err(e) => {
                    clients.iter_mut().for_each(kill);
                    return Err(e);
                }
            };
            let tx = tx.clone();
            std::thread::spawn(move || {
                if lines.iter().any(|l| l.starts_with("ok ")) {
                    let _ = tx.send(unix_now());
                }
            });
        }
        Ok(ServedProbe { clients, answered })
    }

    /// The moment the last of them first answered, waiting at most
    /// `timeout` more; stops the clients.
    fn last_answer(mut self, timeout: Duration) -> Result<f64> {
        let deadline = Instant::now() + timeout;
        let mut last: f64 = 0.0;
        let mut result = Ok(());
        for n in 0..self.clients.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.answered.recv_timeout(left) {
                Ok(at) => last = last.max(at),
                Err(_) => {
                    result = Err(anyhow::anyhow!(
                        "{n} of {} sampled services answered within {} s of programmed",
                        self.clients.len(),
                        timeout.as_secs()
                    ));
                    break;
                }
            }
        }
        self.clients.iter_mut().for_each(kill);
        result.map(|()| last)
    }
}

/// How long after programmed the sampled services may take to answer: far
/// past either goal (2 s, 5 s from exec), short enough that a cell that never
/// serves costs little.
const SERVED_AFTER_PROGRAMMED: Duration = Duration::from_secs(10);

/// Seconds from spawning the daemon to the whole state programmed, by the
/// daemon's own clock of the apply's end; and to the last of `sampled`
/// answering through the datapath, or why not.
pub(in crate::bench) fn full_sync(
    bed: &mut Bed,
    total: u64,
    sampled: &[String],
    settings: &Settings,
) -> Result<(f64, Result<f64, String>)> {
    let spawned = unix_now();
    bed.spawn_daemon()?;
    let probe = ServedProbe::start(bed, sampled, settings.sync_timeout);
    let programmed = programmed(bed, total, settings)? - spawned;
    let served = probe
        .and_then(|p| p.last_answer(SERVED_AFTER_PROGRAMMED))
        .map(|at| at - spawned)
        .map_err(|e| format!("{e:#}"));
    Ok((programmed, served))
}

/// When the whole state was programmed, by the daemon's clock.
fn programmed(bed: &mut Bed, total: u64, settings: &Settings) -> Result<f64> {
    let first = daemon::wait_for(
        bed,
        settings.sync_timeout,
        Duration::from_millis(20),
        "first state programmed",
        |p| p.programmed_rev >= 1 && p.programmed_rev >= p.state_rev,
    )?;
    if first.services == total {
        return Ok(first.programmed_at);
    }
    // Never-partial: the first state should be whole; give a late object a
    // moment, then report what is missing.
    let p = daemon::wait_for(
        bed,
        Duration::from_secs(30),
        Duration::from_millis(20),
        &format!(
            "all {total} services (the first state had {})",
            first.services
        ),
        |p| p.programmed_rev >= p.state_rev && p.services == total,
    )?;
    Ok(p.programmed_at)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use serde_json::json;

    use super::*;
    use crate::bench::manifests;

    /// The sampled ClusterIPs are those of the first, middle and last
    /// generated service, as the manifests write them.
    #[test]
    fn sampled_ips_are_generated_services() {
        let scale = manifests::parse_scale("1k/10k").unwrap();
        let ips = sampled_ips(scale);
        assert_eq!(ips.len(), 3);
        let objects = manifests::objects(scale, &[]);
        for (name, ip) in ["svc-0", "svc-499", "svc-999"].iter().zip(&ips) {
            let svc = objects
                .iter()
                .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == *name)
                .unwrap_or_else(|| panic!("no {name}"));
            assert_eq!(svc["spec"]["clusterIP"], json!(ip), "{name}");
            let slice = objects
                .iter()
                .find(|o| {
                    o["kind"] == "EndpointSlice"
                        && o["metadata"]["labels"]["kubernetes.io/service-name"] == *name
                })
                .unwrap_or_else(|| panic!("no slice of {name}"));
            let ep: Ipv4Addr = slice["endpoints"][0]["addresses"][0]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(
                ep.octets()[..2],
                [10, 128],
                "{name}: {ep} outside {GENERATED_ENDPOINTS}"
            );
        }
    }
}
