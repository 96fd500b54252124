//! Network namespaces a test creates and removes: a [`Netns`] set deletes
//! every namespace it added when dropped (also after a failed assertion),
//! and [`enter`] moves the calling thread into one, so that code under test
//! that reads the thread's network namespace (addresses, interfaces, TCX
//! attachments) only ever sees the test's own.

use std::process::Command;

use anyhow::{bail, Context, Result};

/// Runs `ip` with `args`; the error carries its stderr.
pub fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .with_context(|| format!("running ip {args:?}"))?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Named network namespaces, deleted on drop.
#[derive(Default)]
pub struct Netns {
    names: Vec<String>,
}

impl Netns {
    /// Adds namespace `name` with loopback up.
    pub fn add(&mut self, name: &str) -> Result<()> {
        ip(&["netns", "add", name])?;
        self.names.push(name.to_owned());
        ip(&["-n", name, "link", "set", "lo", "up"])
    }

    /// `ip -n NETNS args...`
    pub fn ip(&self, netns: &str, args: &[&str]) -> Result<()> {
        let mut all = vec!["-n", netns];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// A sysctl inside `netns` (`net.ipv4.ip_forward` style key).
    pub fn sysctl(&self, netns: &str, key: &str, value: &str) -> Result<()> {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        let status = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{netns}"))
            .args(["sh", "-c", &format!("echo {value} > {path}")])
            .status()?;
        if !status.success() {
            bail!("sysctl {key}={value} in {netns} failed");
        }
        Ok(())
    }

    /// A veth pair `a` in `ns_a` and `b` in `ns_b`, both up.
    pub fn veth(&self, ns_a: &str, a: &str, ns_b: &str, b: &str) -> Result<()> {
        ip(&[
            "link", "add", a, "netns", ns_a, "type", "veth", "peer", "name", b, "netns", ns_b,
        ])?;
        self.ip(ns_a, &["link", "set", a, "up"])?;
        self.ip(ns_b, &["link", "set", b, "up"])
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in self.names.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// Moves the calling thread into network namespace `name` (for the rest
/// of its life: use a thread of its own, or a test's own thread).
pub fn enter(name: &str) -> Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(format!("/run/netns/{name}"))
        .with_context(|| format!("opening netns {name}"))?;
    // SAFETY: a valid namespace fd; setns changes only this thread.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        bail!("setns {name}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}
