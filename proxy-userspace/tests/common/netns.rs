//! A network namespace of the test's own for datapath tests that need no
//! cgroup or bpffs (the nftables ones): the kernel's rules and addresses
//! there are the test's alone and go with the thread.

/// Runs `f` on a thread in a new, empty network namespace (the `nft` and
/// `ip` it spawns inherit it), or returns `None` when not root or without
/// `nft`.
pub fn in_private_netns<T: Send>(f: impl FnOnce() -> T + Send) -> Option<T> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0
        || std::process::Command::new("nft")
            .arg("--version")
            .output()
            .is_err()
    {
        eprintln!("skipped: needs root and nft");
        return None;
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: unshare only moves this scoped test thread into a
            // fresh network namespace; the host's rules are never seen.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
            f()
        })
        .join()
        .unwrap()
    })
    .into()
}

/// `ip ARGS` in the current thread's namespace; panics when it fails.
pub fn ip(args: &[&str]) {
    let st = std::process::Command::new("ip")
        .args(args)
        .status()
        .unwrap();
    assert!(st.success(), "ip {args:?}");
}
