//! Two services claim one address: the older owns it on every datapath,
//! and when it goes away the next claimant gets the address within one
//! sync.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use super::{docs, ensure_daemon, request, slice_yaml, svc, wait_until_served, Bed, Svc};

const CONTESTED: &str = "10.96.0.150:80";

/// Which pods answered 20 requests to the contested address.
fn answering(bed: &Bed) -> Result<Vec<String>> {
    let r = request(bed, "tcp", CONTESTED, 20)?;
    ensure!(
        r.errors.is_empty(),
        "failed requests: {:?}",
        r.errors.first()
    );
    Ok(r.pods().into_keys().collect())
}

/// Waits (bounded) until only `pod` answers on the contested address.
fn wait_owner(bed: &Bed, pod: &str, within: Duration) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let pods = answering(bed)?;
        if pods == [pod] {
            return Ok(started.elapsed());
        }
        ensure!(
            started.elapsed() < within,
            "{CONTESTED} answered by {pods:?}, not only {pod}, {within:?} after the change"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `new` (ClusterIP 10.96.0.150, endpoint pod2) and `old` (externalIP
/// 10.96.0.150, endpoint pod1, created first) claim 10.96.0.150:80.
pub(super) fn contested_address_goes_to_the_older_then_the_next(bed: &mut Bed) -> Result<()> {
    ensure_daemon(bed)?;
    let new = Svc {
        created: "2024-06-01T00:00:00Z",
        ..svc("claim-new", "10.96.0.150")
    };
    let old = Svc {
        created: "2020-01-01T00:00:00Z",
        external_ips: &["10.96.0.150"],
        ..svc("claim-old", "10.96.0.151")
    };
    let (new_yaml, old_yaml) = (new.yaml(), old.yaml());
    let both = docs(&[
        new_yaml.clone(),
        slice_yaml(bed, &new, false, &[(1, "node-2")]),
        old_yaml.clone(),
        slice_yaml(bed, &old, false, &[(0, "node-1")]),
    ]);
    bed.apply_manifests(&both)?;
    wait_until_served(bed, "tcp", "10.96.0.151:80", Duration::from_secs(5))?;
    wait_owner(bed, "pod1", Duration::from_secs(2)).context("the older service owns it")?;

    // The owner goes: the next claimant is programmed in the same sync.
    bed.apply_manifests(&docs(&[
        new_yaml,
        slice_yaml(bed, &new, false, &[(1, "node-2")]),
    ]))?;
    let took =
        wait_owner(bed, "pod2", Duration::from_secs(2)).context("after the owner was deleted")?;
    println!("    contested address handed over in {took:?}");

    // It comes back: being older, it takes the address back.
    bed.apply_manifests(&both)?;
    wait_owner(bed, "pod1", Duration::from_secs(2)).context("after the owner came back")?;
    Ok(())
}
