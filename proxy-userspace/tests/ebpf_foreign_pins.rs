//! A rollback meets the pins of the newer build it replaces (issue 38 item
//! 2): at start, once its programs are attached, the daemon removes every
//! pin under its bpffs root that it does not make, detaching links, and
//! keeps its own. Root only; a cgroup, bpffs directory and namespace of
//! the test's own (common::kernel::Env).
//!
//! The "newer build" here is a connect4 program that refuses every
//! connection, linked to the test cgroup and pinned as
//! `links/ekp_connect4_v2`, plus a map pinned at the top and one in a
//! directory this build does not have. The test keeps the link's fd open
//! while the datapath starts, as a process of that build still could: a
//! removed pin alone would leave the program attached.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use ebpf_kube_proxy::apply::Applier;
use ebpf_kube_proxy::datapath::ebpf::{self, generation, loader, EbpfDatapath};
use ebpf_kube_proxy::model::testing::{self, state};
use ebpf_kube_proxy::model::Protocol;
use serde_json::Value;

mod common;
use common::kernel::{Env, LOOPBACK_ECHO};

const NS: &str = "ns";

/// argv: CGROUP HOST PORT. Joins the cgroup, one TCP exchange; the reply
/// or the errno.
const CLIENT: &str = r#"
import json, os, socket, sys
with open(sys.argv[1] + "/cgroup.procs", "w") as f:
    f.write(str(os.getpid()))
out = {}
try:
    s = socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=3)
    s.sendall(b"hello")
    out["reply"] = s.recv(100).decode()
except OSError as e:
    out["errno"] = e.errno
print(json.dumps(out), flush=True)
"#;

fn client(env: &Env) -> Value {
    let cg = env.cgroup.display().to_string();
    env.python_json(NS, CLIENT, &[&cg, "10.96.0.10", "80"])
}

fn bpf(cmd: libc::c_long, attr: &mut [u8]) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a bpf_attr of the length passed, laid out for
    // `cmd` by the callers (zeros past the fields they set); pointers in
    // it outlive the call.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: these commands return a new file descriptor we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as i32) })
}

fn put(attr: &mut [u8], at: usize, bytes: &[u8]) {
    attr[at..at + bytes.len()].copy_from_slice(bytes);
}

fn pin(fd: &OwnedFd, path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut attr = [0u8; 16];
    put(&mut attr, 0, &(c.as_ptr() as u64).to_ne_bytes());
    put(&mut attr, 8, &(fd.as_raw_fd() as u32).to_ne_bytes());
    // BPF_OBJ_PIN: the fd returned is 0 (no new fd): do not own it.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, 6 as libc::c_long, attr.as_mut_ptr(), 16) };
    assert_eq!(
        rc,
        0,
        "pinning {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// A map another build pins (BPF_MAP_CREATE, a hash map of u32 -> u32).
fn foreign_map(path: &Path) {
    let mut attr = [0u8; 20];
    for (i, v) in [1u32, 4, 4, 16, 0].iter().enumerate() {
        put(&mut attr, i * 4, &v.to_ne_bytes());
    }
    let fd = bpf(0, &mut attr).expect("BPF_MAP_CREATE");
    pin(&fd, path);
}

/// A connect4 program refusing every connection (`r0 = 0; exit`), linked
/// to `cgroup` and pinned at `path`; the link's fd.
fn foreign_refusing_link(cgroup: &Path, path: &Path) -> OwnedFd {
    let insns: [u64; 2] = [0x0000_0000_0000_00b7, 0x0000_0000_0000_0095];
    let license = c"GPL";
    // BPF_PROG_LOAD: prog_type, insn_cnt, insns, license, log fields,
    // kern_version, prog_flags, prog_name[16], prog_ifindex,
    // expected_attach_type (offset 68).
    let mut attr = [0u8; 72];
    put(&mut attr, 0, &18u32.to_ne_bytes()); // BPF_PROG_TYPE_CGROUP_SOCK_ADDR
    put(&mut attr, 4, &2u32.to_ne_bytes());
    put(&mut attr, 8, &(insns.as_ptr() as u64).to_ne_bytes());
    put(&mut attr, 16, &(license.as_ptr() as u64).to_ne_bytes());
    put(&mut attr, 68, &10u32.to_ne_bytes()); // BPF_CGROUP_INET4_CONNECT
    let prog = bpf(5, &mut attr).expect("BPF_PROG_LOAD");
    let dir = std::fs::File::open(cgroup).unwrap();
    // BPF_LINK_CREATE: prog_fd, target_fd, attach_type, flags.
    let mut attr = [0u8; 16];
    put(&mut attr, 0, &(prog.as_raw_fd() as u32).to_ne_bytes());
    put(&mut attr, 4, &(dir.as_raw_fd() as u32).to_ne_bytes());
    put(&mut attr, 8, &10u32.to_ne_bytes());
    let link = bpf(28, &mut attr).expect("BPF_LINK_CREATE");
    pin(&link, path);
    link
}

fn pins(root: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let path = e.path();
            out.insert(path.strip_prefix(root).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                walk(root, &path, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

#[test]
fn a_start_removes_another_builds_pins_and_detaches_its_links_and_keeps_its_own() {
    let Some(mut env) = Env::new("ebpf_foreign_pins", "foreign") else {
        return;
    };
    env.add_ns(NS);
    env.serve(NS, LOOPBACK_ECHO, &["b1", "8081"]);
    test_support::netns::enter(&env.ns(NS)).unwrap();
    // No tc programs: the socket hooks are what this is about.
    let config = env.config(generation::DEFAULT_MAP_SIZE, &["0.0.0.0/32"]);
    let svc = testing::service("test", "echo", &["10.96.0.10"])
        .with_ports(&[("tcp", Protocol::Tcp, 80)])
        .with_ready_endpoint("127.0.0.1", 8081, true);
    {
        let mut dp = Applier::new(Box::new(EbpfDatapath::open(&config).expect("first start")));
        dp.apply(&Arc::new(state(vec![svc]))).expect("apply");
    }
    let r = client(&env);
    assert_eq!(r["reply"], "b1:hello", "{r}");
    let own = pins(&env.bpffs);
    assert!(
        own.contains("EKP_SERVICES") && own.contains("links/ekp_connect4"),
        "{own:?}"
    );

    // Another build's pins, its hook refusing every connection.
    foreign_map(&env.bpffs.join("EKP_FROM_ANOTHER_BUILD"));
    std::fs::create_dir(env.bpffs.join("maps_v2")).unwrap();
    foreign_map(&env.bpffs.join("maps_v2/EKP_SERVICES"));
    let link = foreign_refusing_link(&env.cgroup, &env.bpffs.join("links/ekp_connect4_v2"));
    assert_eq!(loader::attached_programs(&env.cgroup).unwrap(), 9);
    let r = client(&env);
    assert_eq!(r["errno"].as_i64(), Some(i64::from(libc::EPERM)), "{r}");

    // A start of this build: the service it programmed before answers
    // (its maps and links kept), the other build's hook is gone although
    // its fd is still open, and so are its pins.
    let dp = EbpfDatapath::open(&config).expect("second start");
    let r = client(&env);
    assert_eq!(
        r["reply"], "b1:hello",
        "another build's link left attached: {r}"
    );
    assert_eq!(loader::attached_programs(&env.cgroup).unwrap(), 8);
    assert_eq!(pins(&env.bpffs), own, "only this build's pins stay");
    drop(link);
    drop(dp);

    // cleanup removes another build's pins too and leaves nothing.
    foreign_map(&env.bpffs.join("EKP_FROM_ANOTHER_BUILD"));
    let report = ebpf::cleanup(&env.bpffs).expect("cleanup");
    assert_eq!(report.foreign, vec!["EKP_FROM_ANOTHER_BUILD".to_owned()]);
    assert!(!env.bpffs.exists(), "{:?}", pins(&env.bpffs));
}
