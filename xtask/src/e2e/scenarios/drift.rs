//! Drift repair: the datapath is changed by hand under the running daemon
//! (an eBPF map entry deleted, a program's link pin removed, an nftables
//! map element deleted, the table flushed or deleted) and the daemon finds
//! it, logs it, counts it and repairs it: within one `--sync-period` on
//! its own, at once on SIGHUP.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use super::*;

const SYNC_PERIOD: &str = "2s";
/// One sync period, plus the time a check and a full sync take on the bed.
const REPAIRED_WITHIN: Duration = Duration::from_millis(3500);
const TARGET: &str = "10.96.0.160:80";
const DRIFTY: Svc = svc("drifty", "10.96.0.160");

/// Restarts the daemon with `--sync-period sync_period`, programs
/// [`DRIFTY`], runs `f`, and leaves the daemon stopped with its usual
/// arguments (the next scenario starts it again).
fn with_daemon(
    bed: &mut Bed,
    sync_period: &str,
    f: impl FnOnce(&mut Bed) -> Result<()>,
) -> Result<()> {
    bed.stop_daemon()?;
    bed.daemon_args = vec!["--sync-period".into(), sync_period.into()];
    let result = (|| {
        apply_service(bed, &DRIFTY, false, &three_pods())?;
        bed.start_daemon()?;
        wait_until_served(bed, "tcp", TARGET, Duration::from_secs(5))?;
        f(bed)
    })();
    let _ = bed.stop_daemon();
    bed.daemon_args.clear();
    result
}

/// Requests to [`TARGET`] are answered again within `within` of `since`,
/// by every pod.
///
/// 60 requests, each pod at least 5% (3) of them: a repaired datapath
/// fails that with p ≈ 4e-8 (three pods, Binomial(60, 1/3) ≤ 2). With 30
/// requests and 10%, as before, a correct datapath failed it with
/// p ≈ 2e-3 per call, five calls a suite run: a flake of the check itself.
fn served_again(bed: &Bed, since: Instant, within: Duration) -> Result<Duration> {
    let left = within.saturating_sub(since.elapsed());
    wait_until_served_from(bed, None, "tcp", TARGET, left, Duration::from_millis(300))
        .context("not repaired in time")?;
    let r = request(bed, "tcp", TARGET, 60)?;
    assert_spread(&r, 60, &["pod1", "pod2", "pod3"], 0.05)?;
    Ok(since.elapsed())
}

/// Traffic to [`TARGET`] fails now (checked right after the change, well
/// before the next check with a sync period of an hour).
fn broken(bed: &Bed, what: &str) -> Result<()> {
    let r = request_from(bed, None, "tcp", TARGET, 1, Duration::from_millis(300))?;
    ensure!(
        r.ok_count() == 0,
        "{what}: {TARGET} still answered by {:?}; the change by hand had no effect",
        r.pods()
    );
    Ok(())
}

/// The daemon logged the drift with every `needle` on one line, and
/// `ebpf_kube_proxy_datapath_drift_total{kind}` moved.
fn reported(bed: &Bed, kind: &str, needles: &[&str]) -> Result<()> {
    let log = bed.daemon_log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("datapath drift: the kernel differs"))
        .collect();
    ensure!(
        lines
            .iter()
            .any(|l| l.contains("WARN") && needles.iter().all(|n| l.contains(n))),
        "no warning naming {needles:?}; drift lines: {lines:#?}"
    );
    ensure!(
        log.contains("datapath drift found; repairing with a full sync"),
        "no repair line in the log"
    );
    let metrics = bed.metrics()?;
    let series = format!("ebpf_kube_proxy_datapath_drift_total{{kind=\"{kind}\"}} ");
    let value: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .with_context(|| format!("no {series} on /metrics"))?
        .trim()
        .parse()?;
    ensure!(value >= 1.0, "{series}is {value}");
    Ok(())
}

/// `nft args` in the node's network namespace, where the daemon's tables are.
fn nft(bed: &Bed, args: &[&str]) -> Result<()> {
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", bed.node_netns))
        .arg("nft")
        .args(args)
        .output()
        .context("running nft")?;
    ensure!(
        out.status.success(),
        "nft {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Deletes what makes [`TARGET`] a service: the eBPF header entry of the
/// VIP, or the nftables `service-ips` element. Returns what the daemon's
/// warning names (the map and key) and the metric's kind.
fn delete_service_entry(bed: &Bed) -> Result<(Vec<&'static str>, &'static str)> {
    if bed.proxy_mode == "ebpf" {
        let map = bed.bpffs.join("EKP_SERVICES");
        let header = bpf::delete_service_header(&map, [10, 96, 0, 160], 80, 6)?;
        ensure!(header, "no header entry of {TARGET} in {}", map.display());
        Ok((
            vec![
                "object=EKP_SERVICES",
                "10.96.0.160:80/TCP slot 0",
                "service=e2e/drifty",
            ],
            "map_entry",
        ))
    } else {
        nft(
            bed,
            &[
                "delete",
                "element",
                "ip",
                "ebpf-kube-proxy",
                "service-ips",
                "{ 10.96.0.160 . tcp . 80 }",
            ],
        )?;
        Ok((
            vec![
                "service-ips",
                "10.96.0.160 . tcp . 80",
                "service=e2e/drifty",
            ],
            "element",
        ))
    }
}

/// A service's entry deleted by hand: traffic recovers within one sync
/// period, the warning names the service, the map and the key.
pub(super) fn deleted_entry_repaired_within_a_sync_period(bed: &mut Bed) -> Result<()> {
    with_daemon(bed, SYNC_PERIOD, |bed| {
        let (needles, kind) = delete_service_entry(bed)?;
        let took = served_again(bed, Instant::now(), REPAIRED_WITHIN)?;
        println!("    deleted entry repaired after {took:?} (sync period {SYNC_PERIOD})");
        reported(bed, kind, &needles)
    })
}

/// With a sync period of an hour, the deletion breaks traffic until SIGHUP
/// asks for a check; then it is repaired at once.
pub(super) fn sighup_checks_at_once(bed: &mut Bed) -> Result<()> {
    with_daemon(bed, "1h", |bed| {
        let (needles, kind) = delete_service_entry(bed)?;
        broken(bed, "after the deletion")?;
        std::thread::sleep(Duration::from_millis(500));
        broken(bed, "half a second later, no check due")?;
        let sent = Instant::now();
        bed.signal_daemon("HUP")?;
        let took = served_again(bed, sent, Duration::from_secs(2))?;
        println!("    repaired {took:?} after SIGHUP");
        reported(bed, kind, &needles)
    })
}

/// What holds the datapath in the kernel removed behind the daemon's back
/// is put back: on eBPF a socket hook's and a tc program's link pins, on
/// nftables the table flushed, then deleted.
pub(super) fn removed_datapath_object_repaired(bed: &mut Bed) -> Result<()> {
    if bed.proxy_mode == "nftables" {
        flushed_and_deleted_table_repaired(bed)
    } else {
        detached_programs_reattached(bed)
    }
}

/// eBPF: a program's link pin removed (the program detaches with its last
/// reference): the daemon attaches the programs again.
fn detached_programs_reattached(bed: &mut Bed) -> Result<()> {
    with_daemon(bed, SYNC_PERIOD, |bed| {
        let pin = bed.bpffs.join("links/ekp_connect4");
        std::fs::remove_file(&pin).with_context(|| format!("removing {}", pin.display()))?;
        let took = served_again(bed, Instant::now(), REPAIRED_WITHIN)?;
        println!("    detached connect4 program attached again after {took:?}");
        ensure!(pin.exists(), "{} was not pinned again", pin.display());
        reported(bed, "link", &["kind=link", "links/ekp_connect4"])?;

        // A tc program of the node's interfaces.
        let tc_pin = std::fs::read_dir(bed.bpffs.join("links"))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("ekp_tc_ingress_if"))
            })
            .context("no tc program pinned")?;
        std::fs::remove_file(&tc_pin)?;
        let name = tc_pin
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let removed = Instant::now();
        while !tc_pin.exists() {
            ensure!(
                removed.elapsed() < REPAIRED_WITHIN,
                "{} not pinned again within {REPAIRED_WITHIN:?}",
                tc_pin.display()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        println!(
            "    detached {name} attached again after {:?}",
            removed.elapsed()
        );
        reported(bed, "link", &["kind=link", &format!("links/{name}")])
    })
}

/// nftables: the table flushed (every rule gone), then deleted.
fn flushed_and_deleted_table_repaired(bed: &mut Bed) -> Result<()> {
    with_daemon(bed, SYNC_PERIOD, |bed| {
        nft(bed, &["flush", "table", "ip", "ebpf-kube-proxy"])?;
        let took = served_again(bed, Instant::now(), REPAIRED_WITHIN)?;
        println!("    flushed table repaired after {took:?}");
        // Every rule gone: the hooked and helper chains' counts say so.
        reported(
            bed,
            "rules",
            &[
                "kind=rules",
                "object=ip ebpf-kube-proxy services",
                "found=0 rules",
            ],
        )?;

        nft(bed, &["delete", "table", "ip", "ebpf-kube-proxy"])?;
        let took = served_again(bed, Instant::now(), REPAIRED_WITHIN)?;
        println!("    deleted table repaired after {took:?}");
        reported(bed, "table", &["kind=table", "object=ip ebpf-kube-proxy"])
    })
}

/// Just enough of bpf(2) to delete one entry of a pinned map by hand, as
/// `bpftool map delete` would (bpftool is not always installed).
pub(crate) mod bpf {
    use super::*;

    const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
    const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
    const BPF_OBJ_GET: libc::c_long = 7;
    /// `sizeof(struct ServiceKey)` (proxy-common).
    const SERVICE_KEY_SIZE: usize = 24;

    /// The `obj_get` member of `union bpf_attr`.
    #[repr(C)]
    #[derive(Default)]
    struct ObjGet {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
    }

    /// The map element members of `union bpf_attr`.
    #[repr(C)]
    #[derive(Default)]
    struct Elem {
        map_fd: u32,
        _pad: u32,
        key: u64,
        next_key: u64,
        flags: u64,
    }

    fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
        // SAFETY: `attr` is a valid, writable `union bpf_attr` member of
        // the size passed, its pointers point into buffers that outlive
        // the call.
        let rc =
            unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, std::mem::size_of::<T>()) };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(rc)
        }
    }

    fn open_pin(path: &Path) -> Result<OwnedFd> {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
        let mut attr = ObjGet {
            pathname: c.as_ptr() as u64,
            ..ObjGet::default()
        };
        let fd =
            bpf(BPF_OBJ_GET, &mut attr).with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: BPF_OBJ_GET returned a new descriptor that we own.
        Ok(unsafe { OwnedFd::from_raw_fd(i32::try_from(fd)?) })
    }

    /// Deletes the header (slot 0) of `ip:port/proto` from the pinned
    /// services map; whether it was there.
    pub(crate) fn delete_service_header(
        map: &Path,
        ip: [u8; 4],
        port: u16,
        proto: u8,
    ) -> Result<bool> {
        let fd = open_pin(map)?;
        let map_fd = u32::try_from(fd.as_raw_fd())?;
        let mut key = [0u8; SERVICE_KEY_SIZE];
        let mut next = [0u8; SERVICE_KEY_SIZE];
        let mut first = true;
        // Bounded by the map's capacity (65,536 service entries) and more.
        for _ in 0..1_000_000 {
            let mut attr = Elem {
                map_fd,
                key: if first { 0 } else { key.as_ptr() as u64 },
                next_key: next.as_mut_ptr() as u64,
                ..Elem::default()
            };
            match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(false),
                Err(e) => bail!("walking {}: {e}", map.display()),
            }
            first = false;
            key = next;
            // addr[0] (network order), port (network order), proto, slot.
            let header = key[0..4] == ip
                && key[16..18] == port.to_be_bytes()
                && key[18] == proto
                && key[20..22] == [0, 0];
            if header {
                let mut attr = Elem {
                    map_fd,
                    key: key.as_ptr() as u64,
                    ..Elem::default()
                };
                bpf(BPF_MAP_DELETE_ELEM, &mut attr)
                    .with_context(|| format!("deleting from {}", map.display()))?;
                return Ok(true);
            }
        }
        bail!("{} did not end", map.display())
    }
}
