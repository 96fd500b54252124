//! The node-external half of the eBPF datapath: the tc programs
//! (`ekp_tc_ingress`, `ekp_tc_egress`) attached with TCX links to every
//! interface holding a node address that `--nodeport-addresses` selects,
//! the interface map they SNAT with (`EKP_IFACES`), and the
//! loadBalancerSourceRanges trie (`EKP_SRC_RANGES`).
//!
//! Links are pinned under `--bpffs-root`/links as
//! `ekp_tc_{ingress,egress}_if<ifindex>` (bpffs refuses dots, which
//! interface names may have), so the programs keep serving while the
//! daemon is away; a new daemon attaches its own link first and renames
//! its pin over the old one, which detaches the old program: there is no
//! moment without one. Interfaces that no longer hold a selected address
//! lose their links.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{HashMap as BpfHashMap, MapData};
use aya::programs::links::FdLink;
use aya::programs::tc::TcAttachOptions;
use aya::programs::{LinkOrder, ProgramError, SchedClassifier, TcAttachType};
use aya::Ebpf;
use proxy_common::{IfaceValue, SrcRangeKey, MAP_IFACES, MAP_SRC_RANGES, SRC_RANGE_FRONTEND_BITS};

use super::codec::{encode_ip, Vip};
use super::pins::{load_error, pin_replacing, remove_if_exists, LINKS_DIR};
use super::{chain, EbpfError};
use crate::net::Cidr;
use crate::node_addrs::NodeAddress;

/// The tc programs, in the object and as link pin prefixes.
pub const TC_PROGRAMS: [(&str, TcAttachType); 2] = [
    ("ekp_tc_ingress", TcAttachType::Ingress),
    ("ekp_tc_egress", TcAttachType::Egress),
];

/// An interface the tc programs serve and the node's addresses on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeIface {
    pub ifindex: u32,
    pub name: String,
    /// Sorted; the first of each family is the SNAT source.
    pub addrs: Vec<IpAddr>,
}

impl NodeIface {
    /// Whether the tc programs attach here. Not on loopback: a packet to a
    /// node address held by `lo` arrives through the interface it was
    /// routed over, where the programs are; the node's own loopback
    /// traffic should not pay for a lookup.
    pub fn attachable(&self) -> bool {
        self.name != "lo"
    }

    fn value(&self) -> IfaceValue {
        let v4 = self.addrs.iter().find_map(|a| match a {
            IpAddr::V4(v4) => Some(*v4),
            IpAddr::V6(_) => None,
        });
        let v6 = self.addrs.iter().find_map(|a| match a {
            IpAddr::V6(v6) => Some(*v6),
            IpAddr::V4(_) => None,
        });
        IfaceValue {
            v4: encode_ip(IpAddr::V4(v4.unwrap_or(Ipv4Addr::UNSPECIFIED))).0[0],
            v6: encode_ip(IpAddr::V6(v6.unwrap_or(Ipv6Addr::UNSPECIFIED))).0,
        }
    }
}

/// Groups selected node addresses by interface.
pub fn group(addrs: &[NodeAddress]) -> Vec<NodeIface> {
    let mut by_index: BTreeMap<u32, NodeIface> = BTreeMap::new();
    for a in addrs {
        let iface = by_index.entry(a.ifindex).or_insert_with(|| NodeIface {
            ifindex: a.ifindex,
            name: a.ifname.clone(),
            addrs: Vec::new(),
        });
        iface.addrs.push(a.addr);
    }
    let mut out: Vec<NodeIface> = by_index.into_values().collect();
    for i in &mut out {
        i.addrs.sort_unstable();
        i.addrs.dedup();
    }
    out
}

/// Every node address the tc programs serve, sorted.
pub fn node_ips(ifaces: &[NodeIface]) -> Vec<IpAddr> {
    let set: BTreeSet<IpAddr> = ifaces
        .iter()
        .flat_map(|i| i.addrs.iter().copied())
        .collect();
    set.into_iter().collect()
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut SchedClassifier, EbpfError> {
    ebpf.program_mut(name)
        .ok_or_else(|| EbpfError::Load(format!("program {name} is not in the object")))?
        .try_into()
        .map_err(|e: ProgramError| EbpfError::Load(format!("{name}: {}", chain(&e))))
}

/// Loads (verifies) the tc programs without attaching them.
pub fn load(ebpf: &mut Ebpf) -> Result<(), EbpfError> {
    for (name, _) in TC_PROGRAMS {
        program(ebpf, name)?
            .load()
            .map_err(|e| load_error(name, e))?;
    }
    Ok(())
}

fn pin_name(program: &str, ifindex: u32) -> String {
    format!("{program}_if{ifindex}")
}

/// The ifindex of a tc link pin name, if it is one.
fn pinned_ifindex(name: &str) -> Option<u32> {
    TC_PROGRAMS.iter().find_map(|(program, _)| {
        name.strip_prefix(program)?
            .strip_prefix("_if")?
            .parse()
            .ok()
    })
}

/// Attaches both programs to every interface with pinned TCX links
/// (replacing earlier links without a gap) and detaches them from pinned
/// interfaces not in `ifaces`. Returns how many links were replaced.
pub fn attach(ebpf: &mut Ebpf, root: &Path, ifaces: &[NodeIface]) -> Result<usize, EbpfError> {
    let links_dir = root.join(LINKS_DIR);
    let mut replaced = 0;
    for iface in ifaces.iter().filter(|i| i.attachable()) {
        match attach_iface(ebpf, &links_dir, iface) {
            Ok(n) => replaced += n,
            // An interface removed since it was listed: the address
            // watcher reports the change, nothing to serve there.
            Err(e) if !iface_exists(iface) => {
                tracing::debug!(iface = %iface.name, error = %e, "interface gone while attaching");
            }
            Err(e) => return Err(e),
        }
    }
    detach_others(root, ifaces)?;
    Ok(replaced)
}

fn iface_exists(iface: &NodeIface) -> bool {
    let Ok(name) = std::ffi::CString::new(iface.name.as_str()) else {
        return false;
    };
    // SAFETY: `name` is a valid NUL-terminated string.
    unsafe { libc::if_nametoindex(name.as_ptr()) == iface.ifindex }
}

/// Attaches both programs to one interface; how many links it replaced.
fn attach_iface(ebpf: &mut Ebpf, links_dir: &Path, iface: &NodeIface) -> Result<usize, EbpfError> {
    let mut replaced = 0;
    for (name, direction) in TC_PROGRAMS {
        let prog = program(ebpf, name)?;
        let attach_err = |reason: String| EbpfError::AttachTc {
            program: name.to_owned(),
            iface: iface.name.clone(),
            reason,
        };
        let id = prog
            .attach_with_options(
                &iface.name,
                direction,
                TcAttachOptions::TcxOrder(LinkOrder::first()),
            )
            .map_err(|e| attach_err(chain(&e)))?;
        let link: FdLink = prog
            .take_link(id)
            .map_err(|e| attach_err(chain(&e)))?
            .try_into()
            .map_err(|e: aya::programs::links::LinkError| {
                attach_err(format!(
                    "not a TCX link (kernel 6.6 or newer is needed): {}",
                    chain(&e)
                ))
            })?;
        if pin_replacing(link, links_dir, &pin_name(name, iface.ifindex))? {
            replaced += 1;
        }
    }
    tracing::debug!(iface = %iface.name, ifindex = iface.ifindex, "tc programs attached");
    Ok(replaced)
}

/// Removes the tc link pins of interfaces not in `ifaces`.
pub fn detach_others(root: &Path, ifaces: &[NodeIface]) -> Result<Vec<u32>, EbpfError> {
    let keep: BTreeSet<u32> = ifaces
        .iter()
        .filter(|i| i.attachable())
        .map(|i| i.ifindex)
        .collect();
    let mut gone = Vec::new();
    for (name, ifindex) in pinned(root) {
        if !keep.contains(&ifindex) && remove_if_exists(&root.join(LINKS_DIR).join(&name))? {
            gone.push(ifindex);
        }
    }
    gone.sort_unstable();
    gone.dedup();
    Ok(gone)
}

/// The tc link pins under `root`: (pin name, ifindex), sorted.
pub fn pinned(root: &Path) -> Vec<(String, u32)> {
    let Ok(entries) = std::fs::read_dir(root.join(LINKS_DIR)) else {
        return Vec::new();
    };
    let mut out: Vec<(String, u32)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            pinned_ifindex(&name).map(|i| (name, i))
        })
        .collect();
    out.sort();
    out
}

/// Pins missing for `ifaces`: names of detached programs.
pub fn missing_pins(root: &Path, ifaces: &[NodeIface]) -> Vec<String> {
    let have: BTreeSet<String> = pinned(root).into_iter().map(|(n, _)| n).collect();
    ifaces
        .iter()
        .filter(|i| i.attachable())
        .flat_map(|i| TC_PROGRAMS.iter().map(|(p, _)| pin_name(p, i.ifindex)))
        .filter(|n| !have.contains(n))
        .collect()
}

fn map_err(map: &'static str, op: &'static str, e: &aya::maps::MapError) -> EbpfError {
    EbpfError::Map {
        map,
        op,
        reason: chain(e),
    }
}

fn range_key(vip: &Vip, cidr: &Cidr) -> Key<SrcRangeKey> {
    let (addr, family) = encode_ip(vip.ip);
    let (src, _) = encode_ip(cidr.addr);
    Key::new(
        SRC_RANGE_FRONTEND_BITS + u32::from(cidr.prefix_len),
        SrcRangeKey {
            addr,
            port: vip.port.to_be(),
            proto: vip.proto,
            family,
            src,
        },
    )
}

/// The interface and source-range maps, and what the daemon wrote to them.
pub struct ExtMaps {
    ifaces: BpfHashMap<MapData, u32, IfaceValue>,
    ranges: LpmTrie<MapData, SrcRangeKey, u8>,
    programmed_ranges: HashMap<Vip, Vec<Cidr>>,
}

impl ExtMaps {
    pub fn take(ebpf: &mut Ebpf) -> Result<ExtMaps, EbpfError> {
        let take = |ebpf: &mut Ebpf, name: &'static str| {
            ebpf.take_map(name).ok_or(EbpfError::Map {
                map: name,
                op: "open",
                reason: "not in the eBPF object".to_owned(),
            })
        };
        let ifaces = BpfHashMap::try_from(take(ebpf, MAP_IFACES)?)
            .map_err(|e| map_err(MAP_IFACES, "open", &e))?;
        let ranges = LpmTrie::try_from(take(ebpf, MAP_SRC_RANGES)?)
            .map_err(|e| map_err(MAP_SRC_RANGES, "open", &e))?;
        let mut maps = ExtMaps {
            ifaces,
            ranges,
            programmed_ranges: HashMap::new(),
        };
        maps.read_ranges();
        Ok(maps)
    }

    /// Rebuilds the view of the source ranges from the kernel (what an
    /// earlier daemon wrote), so stale entries are removed later.
    fn read_ranges(&mut self) {
        let mut by_vip: HashMap<Vip, Vec<Cidr>> = HashMap::new();
        for key in self.ranges.keys().filter_map(Result::ok) {
            let data = key.data();
            let Some(vip_ip) = super::codec::decode_ip(&data.addr, data.family) else {
                continue;
            };
            let Some(src) = super::codec::decode_ip(&data.src, data.family) else {
                continue;
            };
            let Some(prefix_len) = key
                .prefix_len()
                .checked_sub(SRC_RANGE_FRONTEND_BITS)
                .and_then(|l| u8::try_from(l).ok())
            else {
                continue;
            };
            let vip = Vip {
                ip: vip_ip,
                port: u16::from_be(data.port),
                proto: data.proto,
                scope: super::codec::Scope::External,
            };
            by_vip.entry(vip).or_default().push(Cidr {
                addr: src,
                prefix_len,
            });
        }
        self.programmed_ranges = by_vip;
    }

    /// Makes `EKP_IFACES` hold exactly `ifaces`.
    pub fn sync_ifaces(&mut self, ifaces: &[NodeIface]) -> Result<(), EbpfError> {
        let want: BTreeMap<u32, IfaceValue> =
            ifaces.iter().map(|i| (i.ifindex, i.value())).collect();
        let have: Vec<u32> = self.ifaces.keys().filter_map(Result::ok).collect();
        for (ifindex, value) in &want {
            self.ifaces
                .insert(ifindex, value, 0)
                .map_err(|e| map_err(MAP_IFACES, "update", &e))?;
        }
        for ifindex in have.iter().filter(|i| !want.contains_key(i)) {
            self.ifaces
                .remove(ifindex)
                .map_err(|e| map_err(MAP_IFACES, "delete", &e))?;
        }
        Ok(())
    }

    /// Writes the ranges of these VIPs that are not in the trie yet (before
    /// their headers ask for them).
    pub fn add_ranges<'a>(
        &mut self,
        wanted: impl IntoIterator<Item = (Vip, &'a [Cidr])>,
    ) -> Result<(), EbpfError> {
        // Only VIPs with ranges get an entry: most have none.
        for (vip, cidrs) in wanted.into_iter().filter(|(_, c)| !c.is_empty()) {
            let have = self.programmed_ranges.entry(vip).or_default();
            for cidr in cidrs {
                if have.contains(cidr) {
                    continue;
                }
                self.ranges
                    .insert(&range_key(&vip, cidr), 1, 0)
                    .map_err(|e| map_err(MAP_SRC_RANGES, "update", &e))?;
                have.push(*cidr);
            }
        }
        Ok(())
    }

    /// Removes every range of `vip` not in `keep` (after its header
    /// stopped asking for them, or with the VIP gone).
    pub fn trim_ranges(&mut self, vip: &Vip, keep: &[Cidr]) -> Result<(), EbpfError> {
        let Some(have) = self.programmed_ranges.get_mut(vip) else {
            return Ok(());
        };
        let mut kept = Vec::new();
        let mut failed = None;
        for cidr in std::mem::take(have) {
            if keep.contains(&cidr) || failed.is_some() {
                kept.push(cidr);
                continue;
            }
            match self.ranges.remove(&range_key(vip, &cidr)) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(aya::maps::MapError::SyscallError(s))
                    if s.io_error.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => {
                    kept.push(cidr);
                    failed = Some(map_err(MAP_SRC_RANGES, "delete", &e));
                }
            }
        }
        if kept.is_empty() {
            self.programmed_ranges.remove(vip);
        } else {
            *have = kept;
        }
        failed.map_or(Ok(()), Err)
    }

    /// VIPs with ranges in the trie.
    pub fn vips_with_ranges(&self) -> Vec<Vip> {
        self.programmed_ranges.keys().copied().collect()
    }
}
