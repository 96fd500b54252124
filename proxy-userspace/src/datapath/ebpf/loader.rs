//! The node side of the eBPF datapath: prerequisites (capabilities, BTF,
//! cgroup v2, bpffs), loading and attaching the programs with pinned
//! links, replacing an earlier daemon's links without a gap, and cleanup.
//!
//! Pin layout under `--bpffs-root`:
//! ```text
//! EKP_SERVICES EKP_BACKENDS EKP_REVNAT EKP_AFFINITY EKP_STATS   maps
//! EKP_CT EKP_IFACES EKP_SRC_RANGES EKP_EXT_AFFINITY              maps (tc)
//! links/ekp_connect4 … links/ekp_getpeername6                    bpf_links
//! links/ekp_tc_ingress_if<N> links/ekp_tc_egress_if<N>           TCX links
//! ```
//! A pinned link keeps its program attached after the daemon exits;
//! removing the pin detaches it.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use aya::maps::MapData;
use aya::programs::links::FdLink;
use aya::programs::{CgroupAttachMode, CgroupSockAddr, ProgramError};
use aya::Ebpf;
use aya::EbpfLoader;
use proxy_common::{
    AffinityKey, AffinityValue, Backend, CtKey, CtValue, ExtAffinityKey, FragKey, FragPorts,
    IfaceValue, RejectKey, RejectTokens, RevNatKey, RevNatValue, ServiceKey, ServiceValue,
    SrcRangeKey, EXT_STAT_COUNT, MAP_AFFINITY, MAP_BACKENDS, MAP_CT, MAP_EXT_AFFINITY,
    MAP_EXT_STATS, MAP_FRAGS, MAP_IFACES, MAP_REJECT_RATE, MAP_REVNAT, MAP_SERVICES,
    MAP_SRC_RANGES, MAP_STATS, MAX_AFFINITY, MAX_BACKENDS, MAX_CT, MAX_FRAGS, MAX_IFACES,
    MAX_REJECT_SOURCES, MAX_REVNAT, MAX_SERVICE_ENTRIES, MAX_SRC_RANGES, STAT_COUNT,
};

use super::external::{self, ExtMaps, NodeIface};
use super::generation::{self, SIZED_MAPS};
use super::maps::KernelMaps;
use super::pins::{classify, load_error, pin_replacing, remove_if_exists, KnownPins, LINKS_DIR};
use super::sockdestroy::PreparedObject;
use super::{chain, EbpfConfig, EbpfError, BPFFS_MOUNT};

pub use super::cleanup::{attached_programs, cleanup, CleanupReport};

/// Program (function) names in the object, one per hook.
pub const PROGRAMS: [&str; 8] = [
    "ekp_connect4",
    "ekp_connect6",
    "ekp_sendmsg4",
    "ekp_sendmsg6",
    "ekp_recvmsg4",
    "ekp_recvmsg6",
    "ekp_getpeername4",
    "ekp_getpeername6",
];

/// Every map with the key size, value size and capacity this binary uses
/// (the capacity of [`SIZED_MAPS`] is `--ebpf-map-size` instead).
pub const MAPS: [(&str, usize, usize, u32); 12] = [
    (
        MAP_SERVICES,
        size_of::<ServiceKey>(),
        size_of::<ServiceValue>(),
        MAX_SERVICE_ENTRIES,
    ),
    (
        MAP_BACKENDS,
        size_of::<u32>(),
        size_of::<Backend>(),
        MAX_BACKENDS,
    ),
    (
        MAP_REVNAT,
        size_of::<RevNatKey>(),
        size_of::<RevNatValue>(),
        MAX_REVNAT,
    ),
    (
        MAP_AFFINITY,
        size_of::<AffinityKey>(),
        size_of::<AffinityValue>(),
        MAX_AFFINITY,
    ),
    (MAP_STATS, size_of::<u32>(), size_of::<u64>(), STAT_COUNT),
    (
        MAP_EXT_STATS,
        size_of::<u32>(),
        size_of::<u64>(),
        EXT_STAT_COUNT,
    ),
    (MAP_CT, size_of::<CtKey>(), size_of::<CtValue>(), MAX_CT),
    (
        MAP_IFACES,
        size_of::<u32>(),
        size_of::<IfaceValue>(),
        MAX_IFACES,
    ),
    (
        MAP_SRC_RANGES,
        // The trie's key is its prefix length followed by the data.
        size_of::<u32>() + size_of::<SrcRangeKey>(),
        size_of::<u8>(),
        MAX_SRC_RANGES,
    ),
    (
        MAP_EXT_AFFINITY,
        size_of::<ExtAffinityKey>(),
        size_of::<AffinityValue>(),
        MAX_AFFINITY,
    ),
    (
        MAP_REJECT_RATE,
        size_of::<RejectKey>(),
        size_of::<RejectTokens>(),
        MAX_REJECT_SOURCES,
    ),
    (
        MAP_FRAGS,
        size_of::<FragKey>(),
        size_of::<FragPorts>(),
        MAX_FRAGS,
    ),
];

/// Maps only the programs write, whose contents may be lost: pinned with
/// another layout (an earlier version's), they are replaced, not refused.
const REPLACEABLE_MAPS: [&str; 3] = [MAP_EXT_STATS, MAP_REJECT_RATE, MAP_FRAGS];

/// One line of /proc/self/mountinfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    pub mount_point: PathBuf,
    pub fs_type: String,
}

/// Undoes mountinfo's octal escapes (`\040` is a space), which procfs
/// leaves in the fields it returns.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .is_some_and(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if b[i] == b'\\' && octal {
            let d = |k: usize| u32::from(b[i + k] - b'0');
            out.push(u8::try_from(d(1) * 64 + d(2) * 8 + d(3)).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn from_procfs(infos: procfs::process::MountInfos) -> Vec<Mount> {
    infos
        .into_iter()
        .map(|m| Mount {
            mount_point: PathBuf::from(unescape(&m.mount_point.to_string_lossy())),
            fs_type: m.fs_type,
        })
        .collect()
}

/// Parses the text of /proc/self/mountinfo (with procfs).
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    use procfs::FromBufRead;
    procfs::process::MountInfos::from_buf_read(text.as_bytes())
        .map(from_procfs)
        .unwrap_or_default()
}

/// The mounts this process sees; none if /proc cannot be read.
pub(super) fn mounts() -> Vec<Mount> {
    procfs::process::Process::myself()
        .and_then(|p| p.mountinfo())
        .map(from_procfs)
        .unwrap_or_default()
}

/// The cgroup v2 root: the first cgroup2 mount (`/sys/fs/cgroup` on a
/// unified host, `/sys/fs/cgroup/unified` on a hybrid one).
pub fn cgroup2_root(mounts: &[Mount]) -> Option<PathBuf> {
    mounts
        .iter()
        .find(|m| m.fs_type == "cgroup2")
        .map(|m| m.mount_point.clone())
}

/// The mount that holds `path` (the longest mount point above it; the
/// later line wins for stacked mounts).
pub fn mount_of<'a>(mounts: &'a [Mount], path: &Path) -> Option<&'a Mount> {
    mounts
        .iter()
        .filter(|m| path.starts_with(&m.mount_point))
        .fold(None, |best: Option<&Mount>, m| match best {
            Some(b) if b.mount_point.as_os_str().len() > m.mount_point.as_os_str().len() => Some(b),
            _ => Some(m),
        })
}

pub(super) fn absolute(path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(path))
            .unwrap_or_else(|_| path.to_path_buf())
    }
}

/// Effective capabilities of this process (the CapEff mask).
fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    u64::from_str_radix(hex, 16).ok()
}

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Names of the capabilities `caps` lacks for loading and attaching
/// cgroup sock_addr programs (CAP_SYS_ADMIN covers all on any kernel).
/// CAP_PERFMON: without it the verifier applies its Spectre v1 rules and
/// refuses the programs' stack pointer arithmetic with a bare EACCES
/// ("pointer arithmetic ... prohibited for !root"), so it is asked for
/// here, by name, before loading.
pub fn missing_caps(caps: u64) -> Vec<&'static str> {
    let has = |c: u32| caps & (1u64 << c) != 0;
    if has(CAP_SYS_ADMIN) {
        return vec![];
    }
    [
        (CAP_BPF, "CAP_BPF"),
        (CAP_NET_ADMIN, "CAP_NET_ADMIN"),
        (CAP_PERFMON, "CAP_PERFMON"),
    ]
    .into_iter()
    .filter(|(c, _)| !has(*c))
    .map(|(_, name)| name)
    .collect()
}

fn check_capabilities() -> Result<(), EbpfError> {
    let Some(caps) = effective_caps() else {
        return Ok(()); // no /proc: let the syscalls tell
    };
    let missing = missing_caps(caps);
    if missing.is_empty() {
        Ok(())
    } else {
        Err(EbpfError::Capabilities {
            missing: missing.join(", "),
        })
    }
}

fn check_btf() -> Result<(), EbpfError> {
    if Path::new("/sys/kernel/btf/vmlinux").exists() {
        Ok(())
    } else {
        Err(EbpfError::NoBtf)
    }
}

/// The cgroup v2 directory to attach to.
pub fn resolve_cgroup(config: &EbpfConfig, mounts: &[Mount]) -> Result<PathBuf, EbpfError> {
    let Some(path) = &config.cgroup_path else {
        return cgroup2_root(mounts).ok_or(EbpfError::NoCgroup2);
    };
    let path = absolute(path);
    let bad = |reason: String| EbpfError::CgroupPath {
        path: path.clone(),
        reason,
    };
    match mount_of(mounts, &path) {
        Some(m) if m.fs_type == "cgroup2" && !path.is_dir() => {
            Err(bad("no such directory".to_owned()))
        }
        Some(m) if m.fs_type == "cgroup2" => Ok(path),
        Some(m) => Err(bad(format!(
            "its filesystem is {}, not cgroup2{}",
            m.fs_type,
            cgroup2_root(mounts)
                .map(|r| format!(" (the cgroup v2 root is {})", r.display()))
                .unwrap_or_default()
        ))),
        None if cgroup2_root(mounts).is_none() => Err(EbpfError::NoCgroup2),
        None => Err(bad("not below any mount".to_owned())),
    }
}

fn mount_bpffs(at: &Path) -> Result<(), EbpfError> {
    let err = |reason: String| EbpfError::Bpffs {
        path: at.to_path_buf(),
        reason,
    };
    std::fs::create_dir_all(at).map_err(|e| err(format!("creating the mount point: {e}")))?;
    let target = std::ffi::CString::new(at.as_os_str().as_encoded_bytes())
        .map_err(|_| err("path contains a NUL byte".to_owned()))?;
    // SAFETY: all pointers are valid NUL-terminated strings that outlive
    // the call; `data` is a C string of mount options.
    let rc = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            target.as_ptr(),
            c"bpf".as_ptr(),
            0,
            c"mode=0700".as_ptr().cast(),
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        // Mounting is the one step that needs CAP_SYS_ADMIN; the DaemonSet
        // leaves it to its init container so the daemon runs without it.
        let hint = if e.raw_os_error() == Some(libc::EPERM) {
            " (mounting needs CAP_SYS_ADMIN: mount bpffs at /sys/fs/bpf before starting the daemon, as deploy/daemonset.yaml's init container does)"
        } else {
            ""
        };
        return Err(err(format!("mount -t bpf failed: {e}{hint}")));
    }
    tracing::info!(path = %at.display(), "mounted bpffs");
    Ok(())
}

/// Makes sure `root` is a directory on a bpf filesystem, mounting bpffs at
/// /sys/fs/bpf (for a root below it) or at `root` itself when needed.
pub fn ensure_bpffs(root: &Path) -> Result<PathBuf, EbpfError> {
    let root = absolute(root);
    let on_bpffs = |mounts: &[Mount]| mount_of(mounts, &root).is_some_and(|m| m.fs_type == "bpf");
    if !on_bpffs(&mounts()) {
        let at = if root.starts_with(BPFFS_MOUNT) {
            PathBuf::from(BPFFS_MOUNT)
        } else {
            root.clone()
        };
        mount_bpffs(&at)?;
        if !on_bpffs(&mounts()) {
            return Err(EbpfError::Bpffs {
                path: root,
                reason: "still not on a bpf filesystem after mounting one".to_owned(),
            });
        }
    }
    std::fs::create_dir_all(root.join(LINKS_DIR)).map_err(|e| EbpfError::Bpffs {
        path: root.clone(),
        reason: format!("creating the pin directory: {e}"),
    })?;
    Ok(root)
}

/// Refuses pinned maps whose shape differs from this binary's (a
/// different layout would be misread by the new programs). The capacity
/// of [`SIZED_MAPS`] may differ: [`generation`] replaces them.
fn check_pinned_maps(root: &Path) -> Result<(), EbpfError> {
    for (name, key, value, capacity) in MAPS {
        let path = root.join(name);
        if !path.exists() {
            continue;
        }
        let incompatible = |reason: String| EbpfError::IncompatiblePin {
            path: path.clone(),
            root: root.to_path_buf(),
            reason,
        };
        let info = MapData::from_pin(&path)
            .and_then(|m| m.info())
            .map_err(|e| incompatible(chain(&e)))?;
        let sized = SIZED_MAPS.contains(&name);
        let got = (
            info.key_size() as usize,
            info.value_size() as usize,
            if sized { capacity } else { info.max_entries() },
        );
        if got != (key, value, capacity) && REPLACEABLE_MAPS.contains(&name) {
            // The old programs keep their map until their links go; the
            // new ones get a fresh one.
            remove_if_exists(&path)?;
            tracing::warn!(
                map = name,
                pinned = ?got,
                expected = ?(key, value, capacity),
                "pinned eBPF map of another layout replaced (its contents are lost)"
            );
        } else if got != (key, value, capacity) {
            return Err(incompatible(format!(
                "key/value size and capacity {got:?}, expected {:?}",
                (key, value, capacity)
            )));
        }
    }
    Ok(())
}

/// The result of [`load_and_attach`].
pub struct Attached {
    pub maps: KernelMaps,
    pub ext: ExtMaps,
    /// The loaded object: its tc programs attach to interfaces that gain
    /// a node address later.
    pub ebpf: Ebpf,
    pub cgroup: PathBuf,
    /// Links of an earlier daemon that the new ones replaced.
    pub replaced_links: usize,
    /// The kernel's BTF for [`super::sockdestroy::SockDestroyer::start`];
    /// `None` when the kernel has no `bpf_sock_destroy`.
    pub sock_destroy: Option<PreparedObject>,
}

/// Loads the object, reusing pinned maps, attaches every program to the
/// cgroup with a pinned link, then removes the links it replaces.
pub fn load_and_attach(
    object: &[u8],
    config: &EbpfConfig,
    ifaces: &[NodeIface],
) -> Result<Attached, EbpfError> {
    check_capabilities()?;
    check_btf()?;
    let mounts = mounts();
    let cgroup = resolve_cgroup(config, &mounts)?;
    let root = ensure_bpffs(&config.bpffs_root)?;
    check_pinned_maps(&root)?;
    let prepared = generation::prepare(&root, config.map_size)?;
    let mut attached_any = false;
    let result =
        load_and_attach_prepared(object, &cgroup, &root, &prepared, ifaces, &mut attached_any);
    if prepared.replacing.is_some() {
        // Once a hook runs a program of the new generation, that generation
        // is the one to keep (a retry then finds it pinned and fitting and
        // attaches the remaining hooks to it).
        if attached_any {
            generation::promote(&root)?;
        } else {
            generation::discard_next(&root);
        }
    }
    let (maps, ext, ebpf, replaced, sock_destroy) = result?;
    // Only now, with this build's programs attached (no gap): what another
    // build pinned and this one does not make goes (a rollback meets the
    // newer build's pins). Not fatal: the datapath serves either way.
    if let Err(e) = super::foreign::remove_unknown(&root, &KnownPins::of(object)) {
        tracing::warn!(error = %e, "could not remove another build's pins");
    }
    if let Some((from, to)) = prepared.replacing {
        tracing::info!(
            from,
            to,
            "eBPF services/backends maps replaced by a new generation"
        );
    }
    Ok(Attached {
        maps,
        ext,
        ebpf,
        cgroup,
        replaced_links: replaced,
        sock_destroy,
    })
}

fn load_and_attach_prepared(
    object: &[u8],
    cgroup: &Path,
    root: &Path,
    prepared: &generation::Prepared,
    ifaces: &[NodeIface],
    attached_any: &mut bool,
) -> Result<(KernelMaps, ExtMaps, Ebpf, usize, Option<PreparedObject>), EbpfError> {
    let cgroup = cgroup.to_path_buf();
    let mut loader = EbpfLoader::new();
    loader.default_map_pin_directory(root);
    for (name, pin) in &prepared.pins {
        loader.map_pin_path(name, pin.as_path());
    }
    // With the bpf_sock_destroy kfunc call resolved (None: no socket
    // destruction on this kernel).
    let sockd = super::sockdestroy::prepare_object(object);
    let mut ebpf = loader
        .load(sockd.as_ref().map_or(object, |p| p.bytes()))
        .map_err(|e| classify(&e, EbpfError::Load))?;
    let cgroup_dir = File::open(&cgroup).map_err(|e| EbpfError::CgroupPath {
        path: cgroup.clone(),
        reason: format!("opening: {e}"),
    })?;
    let links_dir = root.join(LINKS_DIR);

    // Load every program before attaching any, so a verifier rejection
    // leaves the running datapath (if any) untouched.
    for name in PROGRAMS {
        let prog: &mut CgroupSockAddr = ebpf
            .program_mut(name)
            .ok_or_else(|| EbpfError::Load(format!("program {name} is not in the object")))?
            .try_into()
            .map_err(|e: ProgramError| EbpfError::Load(format!("{name}: {}", chain(&e))))?;
        prog.load().map_err(|e| load_error(name, e))?;
    }
    external::load(&mut ebpf)?;
    super::lb_source::load(&mut ebpf)?;

    // Node-external traffic first: once the socket hooks of a new map
    // generation run, the tc programs must already serve it too.
    let mut replaced = external::attach(&mut ebpf, root, ifaces)?;
    *attached_any |= !ifaces.is_empty();
    // Before the socket hooks: a socket they send to a frontend with
    // source ranges has its first packet checked at once.
    if super::lb_source::attach(&mut ebpf, &cgroup_dir, &cgroup, &links_dir)? {
        replaced += 1;
    }
    for name in PROGRAMS {
        let prog: &mut CgroupSockAddr = ebpf
            .program_mut(name)
            .ok_or_else(|| EbpfError::Load(format!("program {name} is not in the object")))?
            .try_into()
            .map_err(|e: ProgramError| EbpfError::Load(format!("{name}: {}", chain(&e))))?;
        let attach_err = |reason: String| EbpfError::Attach {
            program: name.to_owned(),
            cgroup: cgroup.clone(),
            reason,
        };
        // A bpf_link on a cgroup is always multi-attach: the old daemon's
        // program keeps running until its link pin goes away below.
        let id = prog
            .attach(&cgroup_dir, CgroupAttachMode::Single)
            .map_err(|e| classify(&e, attach_err))?;
        let link: FdLink = prog
            .take_link(id)
            .map_err(|e| EbpfError::Load(chain(&e)))?
            .try_into()
            .map_err(|e: aya::programs::links::LinkError| EbpfError::Attach {
                program: name.to_owned(),
                cgroup: cgroup.clone(),
                reason: format!(
                    "the kernel has no bpf_link for cgroups (5.7 or newer is needed): {}",
                    chain(&e)
                ),
            })?;
        *attached_any = true;
        if pin_replacing(link, &links_dir, name)? {
            replaced += 1;
        }
        tracing::debug!(program = name, cgroup = %cgroup.display(), "attached");
    }

    let maps = KernelMaps::take(&mut ebpf)?;
    let ext = ExtMaps::take(&mut ebpf)?;
    Ok((maps, ext, ebpf, replaced, sockd))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
25 22 0:22 / /sys rw,nosuid shared:7 - sysfs sysfs rw
30 25 0:26 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
40 25 0:35 / /sys/fs/bpf rw,relatime shared:20 - bpf bpf rw,mode=700
41 22 0:36 / /mnt/with\\040space rw - tmpfs none rw
";

    #[test]
    fn mountinfo_finds_the_cgroup2_root_and_the_mount_of_a_path() {
        let m = parse_mountinfo(HYBRID);
        assert_eq!(m.len(), 6);
        assert_eq!(
            cgroup2_root(&m),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let fs = |p: &str| mount_of(&m, Path::new(p)).map(|m| m.fs_type.as_str());
        assert_eq!(fs("/sys/fs/cgroup/unified/ekp-test"), Some("cgroup2"));
        assert_eq!(fs("/sys/fs/cgroup/memory"), Some("tmpfs"));
        assert_eq!(fs("/sys/fs/bpf/ebpf-kube-proxy"), Some("bpf"));
        assert_eq!(fs("/sys/fs/bpfx"), Some("sysfs"));
        assert_eq!(fs("/tmp"), Some("ext4"));
        assert_eq!(fs("/mnt/with space/x"), Some("tmpfs"));
    }

    #[test]
    fn a_path_not_on_cgroup2_is_refused_with_the_reason() {
        let m = parse_mountinfo(HYBRID);
        let cfg = EbpfConfig {
            bpffs_root: PathBuf::from("/sys/fs/bpf/x"),
            cgroup_path: Some(PathBuf::from("/sys/fs/cgroup")),
            map_size: generation::DEFAULT_MAP_SIZE,
            nodeport_addresses: Vec::new(),
        };
        let e = resolve_cgroup(&cfg, &m).unwrap_err().to_string();
        assert!(e.contains("its filesystem is tmpfs, not cgroup2"), "{e}");
        assert!(e.contains("/sys/fs/cgroup/unified"), "{e}");
        let none = parse_mountinfo("22 1 254:0 / / rw - ext4 /dev/vda rw\n");
        let default = EbpfConfig {
            cgroup_path: None,
            ..cfg
        };
        assert!(matches!(
            resolve_cgroup(&default, &none),
            Err(EbpfError::NoCgroup2)
        ));
    }

    #[test]
    fn capabilities_needed_for_cgroup_sock_addr_programs() {
        assert!(missing_caps(1 << CAP_SYS_ADMIN).is_empty());
        let needed = (1 << CAP_BPF) | (1 << CAP_NET_ADMIN) | (1 << CAP_PERFMON);
        assert!(missing_caps(needed).is_empty());
        assert_eq!(
            missing_caps(0),
            vec!["CAP_BPF", "CAP_NET_ADMIN", "CAP_PERFMON"]
        );
        assert_eq!(
            missing_caps(1 << CAP_BPF),
            vec!["CAP_NET_ADMIN", "CAP_PERFMON"]
        );
        assert_eq!(
            missing_caps(needed & !(1 << CAP_PERFMON)),
            vec!["CAP_PERFMON"]
        );
    }
}
