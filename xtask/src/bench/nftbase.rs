//! The nftables baseline: a ruleset shaped as kube-proxy's nftables mode
//! writes it (a service-ips verdict map, one chain per service with a
//! `numgen` load-balancing vmap, one DNAT chain per endpoint), for the same
//! cluster, loaded with a single `nft -f` into a fresh network namespace.
//! What the kernel itself costs for a full ruleset of that size.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::manifests::Scale;

/// `nft -f` is stopped after this long (issue 17: capped at 5 min).
pub const CAP: Duration = Duration::from_secs(300);

fn ip(base: Ipv4Addr, offset: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base).wrapping_add(offset as u32))
}

/// The ruleset text for `scale` (the same addresses as the benchmark's
/// generated services, see `manifests`).
pub fn ruleset(scale: Scale) -> String {
    let per = scale.endpoints / scale.services;
    let extra = scale.endpoints % scale.services;
    let mut chains = String::new();
    let mut elements = String::new();
    let mut endpoint = 0usize;
    for i in 0..scale.services {
        let vip = ip(Ipv4Addr::new(10, 96, 1, 0), i);
        let svc = format!("bench/svc-{i}/tcp/http");
        let chain = format!("service-{i:08X}-{svc}");
        let _ = write!(elements, "{vip} . tcp . 80 : goto {chain}, ");
        let n = per + usize::from(i < extra);
        let mut vmap = String::new();
        for k in 0..n {
            let ep = ip(Ipv4Addr::new(10, 128, 0, 0), endpoint + k);
            let ep_chain = format!("endpoint-{:08X}-{svc}__{ep}/8080", endpoint + k);
            let _ = write!(vmap, "{k} : goto {ep_chain}, ");
            let _ = writeln!(
                chains,
                "  chain {ep_chain} {{\n    ip saddr {ep} jump mark-for-masquerade\n    \
                 meta l4proto tcp dnat to {ep}:8080\n  }}"
            );
        }
        endpoint += n;
        let _ = writeln!(
            chains,
            "  chain {chain} {{\n    ip daddr {vip} tcp dport 80 ip saddr != 10.244.0.0/16 \
             jump mark-for-masquerade\n    numgen random mod {n} vmap {{ {vmap} }}\n  }}"
        );
    }
    format!(
        "table ip kube-proxy {{\n\
         \x20 map service-ips {{\n    type ipv4_addr . inet_proto . inet_service : verdict\n    \
         elements = {{ {elements} }}\n  }}\n\
         \x20 chain mark-for-masquerade {{\n    meta mark set meta mark or 0x4000\n  }}\n\
         \x20 chain services {{\n    ip daddr . meta l4proto . th dport vmap @service-ips\n  }}\n\
         \x20 chain nat-output {{\n    type nat hook output priority -100; policy accept;\n    \
         jump services\n  }}\n\
         \x20 chain nat-prerouting {{\n    type nat hook prerouting priority -100; policy accept;\n    \
         jump services\n  }}\n\
         {chains}}}\n"
    )
}

/// Seconds `nft -f` takes to load [`ruleset`] into a fresh network
/// namespace of its own (removed afterwards, also on failure).
pub fn measure(scale: Scale, dir: &Path) -> Result<f64> {
    let file = dir.join(format!("kube-proxy-{}.nft", scale.services));
    std::fs::write(&file, ruleset(scale)).context("writing the baseline ruleset")?;
    let netns = format!("ekpbench{}-nft", std::process::id() % 100_000);
    let status = Command::new("ip")
        .args(["netns", "add", &netns])
        .status()
        .context("ip netns add")?;
    if !status.success() {
        bail!("ip netns add {netns} failed");
    }
    let result = load(&netns, &file);
    let _ = Command::new("ip").args(["netns", "del", &netns]).status();
    let _ = std::fs::remove_file(&file);
    result
}

fn load(netns: &str, file: &Path) -> Result<f64> {
    let started = Instant::now();
    let mut child = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{netns}"))
        .args(["nft", "-f"])
        .arg(file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting nft -f")?;
    loop {
        if let Some(status) = child.try_wait()? {
            let elapsed = started.elapsed().as_secs_f64();
            if !status.success() {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut err);
                }
                let head: String = err.lines().take(5).collect::<Vec<_>>().join("\n");
                bail!("nft -f failed ({status}): {head}");
            }
            return Ok(elapsed);
        }
        if started.elapsed() > CAP {
            let _ = child.kill();
            let _ = child.wait();
            bail!("nft -f took over the {} s cap", CAP.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_chain_per_service_and_per_endpoint() {
        let text = ruleset(Scale {
            services: 3,
            endpoints: 7,
        });
        assert_eq!(text.matches("  chain service-").count(), 3);
        assert_eq!(text.matches("  chain endpoint-").count(), 7);
        assert_eq!(text.matches("dnat to ").count(), 7);
        assert!(text.contains("10.96.1.2 . tcp . 80 : goto service-00000002-bench/svc-2/tcp/http"));
    }
}
