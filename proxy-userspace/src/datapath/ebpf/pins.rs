//! What the loader, the tc attachment (`external`) and the socket-destroy
//! program (`sockdestroy`) share: the link pin directory, pinning a link
//! over an earlier one, removing a pin, and turning a kernel error into
//! the error the operator is shown (EPERM is missing capabilities, a
//! verifier refusal carries its log).

use std::io;
use std::path::Path;

use aya::programs::links::FdLink;
use aya::programs::ProgramError;

use super::{chain, EbpfError};

/// Under `--bpffs-root`: one pinned link per attached program.
pub const LINKS_DIR: &str = "links";

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
