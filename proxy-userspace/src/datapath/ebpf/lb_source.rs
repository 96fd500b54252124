//! loadBalancerSourceRanges for sockets on the node: the `cgroup_skb/egress`
//! program `ekp_lb_source_egress` (proxy-ebpf's `lb_source.rs` says how it
//! and the connect hook share the check), attached to the same cgroup as
//! the socket hooks with a pinned link, `links/ekp_lb_source_egress`,
//! replaced without a gap as the socket hooks' links are.

use std::fs::File;
use std::path::Path;

use aya::programs::cgroup_skb::CgroupSkbAttachType;
use aya::programs::links::FdLink;
use aya::programs::{CgroupAttachMode, CgroupSkb, ProgramError};
use aya::Ebpf;

use super::pins::{classify, load_error, pin_replacing};
use super::{chain, EbpfError};

/// The program, in the object and as its link pin name.
pub const PROGRAM: &str = "ekp_lb_source_egress";

fn program(ebpf: &mut Ebpf) -> Result<&mut CgroupSkb, EbpfError> {
    ebpf.program_mut(PROGRAM)
        .ok_or_else(|| EbpfError::Load(format!("program {PROGRAM} is not in the object")))?
        .try_into()
        .map_err(|e: ProgramError| EbpfError::Load(format!("{PROGRAM}: {}", chain(&e))))
}

/// Loads the program (before anything is attached).
pub fn load(ebpf: &mut Ebpf) -> Result<(), EbpfError> {
    program(ebpf)?.load().map_err(|e| load_error(PROGRAM, e))
}

/// Attaches the program to `cgroup` (opened as `cgroup_dir`) with a link
/// pinned in `links_dir`, replacing an earlier daemon's. Whether it
/// replaced one.
pub fn attach(
    ebpf: &mut Ebpf,
    cgroup_dir: &File,
    cgroup: &Path,
    links_dir: &Path,
) -> Result<bool, EbpfError> {
    let attach_err = |reason: String| EbpfError::Attach {
        program: PROGRAM.to_owned(),
        cgroup: cgroup.to_path_buf(),
        reason,
    };
    let prog = program(ebpf)?;
    // A cgroup bpf_link is multi-attach: the earlier daemon's program
    // keeps running until its pin is replaced below.
    let id = prog
        .attach(
            cgroup_dir,
            CgroupSkbAttachType::Egress,
            CgroupAttachMode::Single,
        )
        .map_err(|e| classify(&e, attach_err))?;
    let link: FdLink = prog
        .take_link(id)
        .map_err(|e| EbpfError::Load(chain(&e)))?
        .try_into()
        .map_err(|e: aya::programs::links::LinkError| {
            attach_err(format!(
                "the kernel has no bpf_link for cgroups (5.7 or newer is needed): {}",
                chain(&e)
            ))
        })?;
    let replaced = pin_replacing(link, links_dir, PROGRAM)?;
    tracing::debug!(program = PROGRAM, cgroup = %cgroup.display(), "attached");
    Ok(replaced)
}
