//! What the loader, the tc attachment (`external`) and the socket-destroy
//! program (`sockdestroy`) share: the link pin directory, pinning a link
//! over an earlier one, removing a pin, and turning a kernel error into
//! the error the operator is shown (EPERM is missing capabilities, a
//! verifier refusal carries its log).
//!
//! And [`KnownPins`], the one list of what this build pins under
//! `--bpffs-root`. **Every new pin must be listed there**: at each start
//! the daemon removes every other pin under its root as another build's
//! (`foreign.rs`), so a pin this build makes but does not list would be
//! removed at the next start.

use std::collections::BTreeSet;
use std::io;
use std::path::{Component, Path};

use aya::programs::links::FdLink;
use aya::programs::ProgramError;

use super::{chain, EbpfError};

/// Under `--bpffs-root`: one pinned link per attached program.
pub const LINKS_DIR: &str = "links";

/// The names this build pins under `--bpffs-root` (paths relative to it):
///
/// * at the top, the maps: those of [`super::loader::MAPS`] and every map
///   the eBPF object pins by name (a map added to proxy-ebpf with
///   `pinned(..)` is known without an edit here; it still belongs in
///   `MAPS`, which checks its layout, and a unit test says so), plus
///   `<map>_next` of [`super::generation::SIZED_MAPS`] (a generation being
///   built);
/// * `links/`, one link per attached program: a program's name (the socket
///   hooks, `ekp_lb_source_egress`, any program of the object) or
///   `<tc program>_if<ifindex>`, and either with `_new` (a link about to
///   be renamed over its predecessor, [`pin_replacing`]).
///
/// A pin of another shape (a new directory, a link named otherwise) must
/// be added to [`KnownPins::contains`].
#[derive(Clone, Debug, Default)]
pub struct KnownPins {
    maps: BTreeSet<String>,
    programs: BTreeSet<String>,
}

impl KnownPins {
    /// The pins of the build that carries `object` (empty: the lists of
    /// this source tree alone).
    pub fn of(object: &[u8]) -> KnownPins {
        let mut known = KnownPins::default();
        known
            .maps
            .extend(super::loader::MAPS.iter().map(|(n, ..)| (*n).to_owned()));
        known.maps.extend(
            super::generation::SIZED_MAPS
                .iter()
                .map(|n| format!("{n}_next")),
        );
        known
            .programs
            .extend(super::loader::PROGRAMS.iter().map(|p| (*p).to_owned()));
        known.programs.extend(
            super::external::TC_PROGRAMS
                .iter()
                .map(|(p, _)| (*p).to_owned()),
        );
        known.programs.insert(super::lb_source::PROGRAM.to_owned());
        if let Ok(obj) = aya_obj::Object::parse(object) {
            known.maps.extend(
                obj.maps
                    .iter()
                    .filter(|(_, m)| m.pinning() == aya_obj::maps::PinningType::ByName)
                    .map(|(n, _)| n.clone()),
            );
            known.programs.extend(obj.programs.keys().cloned());
        }
        known
    }

    /// Whether `rel` (a path below the root) is a pin or directory of
    /// this build.
    pub fn contains(&self, rel: &Path) -> bool {
        let parts: Vec<&str> = rel
            .components()
            .map(|c| match c {
                Component::Normal(n) => n.to_str().unwrap_or("/"),
                _ => "/",
            })
            .collect();
        match parts.as_slice() {
            [name] => *name == LINKS_DIR || self.maps.contains(*name),
            [dir, name] if *dir == LINKS_DIR => self.is_link(name),
            _ => false,
        }
    }

    fn is_link(&self, name: &str) -> bool {
        let name = name.strip_suffix("_new").unwrap_or(name);
        if self.programs.contains(name) {
            return true;
        }
        // `<tc program>_if<ifindex>`, external.rs's pin names.
        name.rsplit_once("_if").is_some_and(|(program, ifindex)| {
            self.programs.contains(program)
                && !ifindex.is_empty()
                && ifindex.bytes().all(|b| b.is_ascii_digit())
        })
    }
}

/// An errno anywhere in an error's source chain.
pub fn errno_in(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            if let Some(code) = io.raw_os_error() {
                return Some(code);
            }
        }
        cur = err.source();
    }
    None
}

/// Permission errors become the capabilities error, whatever the step.
pub(super) fn classify(
    e: &(dyn std::error::Error + 'static),
    otherwise: impl FnOnce(String) -> EbpfError,
) -> EbpfError {
    match errno_in(e) {
        Some(libc::EPERM) => EbpfError::Capabilities {
            missing: format!("(the kernel said EPERM: {})", chain(e)),
        },
        _ => otherwise(chain(e)),
    }
}

/// Pins a new link as `links_dir/name`, replacing (and so detaching) the
/// link pinned there before, if any, without a moment with neither: the
/// new link is pinned beside it and renamed over it, atomically. Whether
/// it replaced one.
pub fn pin_replacing(link: FdLink, links_dir: &Path, name: &str) -> Result<bool, EbpfError> {
    let pin = links_dir.join(name);
    // bpffs refuses names with a dot (EPERM): "_new", not ".new".
    let fresh = links_dir.join(format!("{name}_new"));
    remove_if_exists(&fresh)?;
    // Dropping the PinnedLink closes our fd; the pin keeps it attached.
    drop(link.pin(&fresh).map_err(|e| EbpfError::Pin {
        path: fresh.clone(),
        reason: chain(&e),
    })?);
    let replaced = pin.exists();
    std::fs::rename(&fresh, &pin).map_err(|e| EbpfError::Pin {
        path: pin.clone(),
        reason: format!("renaming {} over it: {e}", fresh.display()),
    })?;
    Ok(replaced)
}

/// A program's load error: the verifier's log when it refused it.
pub fn load_error(name: &str, e: ProgramError) -> EbpfError {
    match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } if io_error.raw_os_error() != Some(libc::EPERM) => EbpfError::Verifier {
            program: name.to_owned(),
            error: io_error,
            log: tail(&verifier_log.to_string(), 25),
        },
        other => classify(&other, |r| EbpfError::Load(format!("{name}: {r}"))),
    }
}

fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

pub fn remove_if_exists(path: &Path) -> Result<bool, EbpfError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(EbpfError::Pin {
            path: path.to_path_buf(),
            reason: format!("removing: {e}"),
        }),
    }
}
