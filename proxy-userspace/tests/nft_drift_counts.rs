//! The nftables drift check counts rules from the chain dump
//! (`NFTA_CHAIN_USE`, issue 38 item 4), in the real kernel, each test in a
//! network namespace of its own (root and `nft` needed; otherwise the
//! test says why and passes): a table as programmed has every chain's use
//! count as the datapath expects it, so no rule is read back; a rule
//! added or deleted by `nft` in any chain, a service's included, is found
//! from the counts, and only that chain's rules are read.

use std::process::Command;

use ebpf_kube_proxy::datapath::nft::batch::Family;
use ebpf_kube_proxy::datapath::nft::rules::TABLE;
use ebpf_kube_proxy::datapath::nft::{self, drift, NftDatapath};
use ebpf_kube_proxy::datapath::{Datapath, DriftKind};
use ebpf_kube_proxy::model::claims::Claims;
use ebpf_kube_proxy::model::{testing, EndpointScopes, LocalState};

/// Runs `f` on a thread in a new, empty network namespace (the `nft` it
/// spawns inherits it), or returns `None` when not root.
fn in_private_netns<T: Send>(f: impl FnOnce() -> T + Send) -> Option<T> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 || Command::new("nft").arg("--version").output().is_err() {
        eprintln!("skipped: needs root and nft");
        return None;
    }
    Some(std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: unshare only moves this scoped test thread into a
            // fresh network namespace; the host's rules are never seen.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
            f()
        })
        .join()
        .unwrap()
    }))
}

fn nft_cmd(args: &[&str]) -> String {
    let out = Command::new("nft")
        .args(args)
        .output()
        .expect("running nft");
    assert!(
        out.status.success(),
        "nft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Three services: `ns/web` (two endpoints, ClientIP affinity), `ns/db`
/// (one endpoint, a node port) and `ns/empty` (no endpoint).
fn state() -> LocalState {
    let ep = |ip: &str| {
        let mut e = testing::endpoint(
            ip,
            8080,
            EndpointScopes {
                cluster: true,
                local: false,
                internal: true,
                external: true,
            },
        );
        e.node_name = "n2".into();
        e
    };
    let mut web = testing::service("ns", "web", &["10.96.0.10"])
        .with_endpoints([ep("10.244.1.11"), ep("10.244.1.12")]);
    web.service.session_affinity_timeout = Some(600);
    let mut db = testing::service("ns", "db", &["10.96.0.20"]).with_endpoints([ep("10.244.2.11")]);
    db.service.ports[0].node_port = 30080;
    let empty = testing::service("ns", "empty", &["10.96.0.30"]);
    let mut s = [web, db, empty];
    for se in &mut s {
        se.service.uid = Default::default();
    }
    LocalState::new(s)
}

/// The check's view of family `f`: what was programmed, what the kernel
/// holds, and how many chains' rules the counts sent it to read.
fn counted(dp: &NftDatapath, state: &LocalState, f: Family) -> (drift::TableContents, usize) {
    let none = Default::default();
    let (expected, _) = drift::expected(dp, state, &Claims::of(state), f, &none);
    let (mut found, _) = drift::read(f, &none).unwrap().expect("the table");
    let read = drift::count_rules(f, &expected.contents, &mut found).unwrap();
    assert_eq!(
        found
            .chains
            .keys()
            .collect::<std::collections::BTreeSet<_>>(),
        expected
            .contents
            .chains
            .keys()
            .collect::<std::collections::BTreeSet<_>>()
    );
    (found, read)
}

/// The chain of `ns/web`'s service port.
fn web_chain(found: &drift::TableContents) -> String {
    let mut names: Vec<&String> = found
        .chains
        .keys()
        .filter(|c| c.starts_with("svc-ns/web/"))
        .collect();
    names.sort();
    names.first().expect("a chain of ns/web").to_string()
}

#[test]
fn chain_use_counts_match_what_was_programmed_and_no_rule_is_read() {
    in_private_netns(|| {
        let state = state();
        let mut dp = NftDatapath::open(Vec::new()).unwrap();
        dp.program_all(&state, &Claims::of(&state)).unwrap();
        for f in Family::ALL {
            let (found, read) = counted(&dp, &state, f);
            let (expected, _) =
                drift::expected(&dp, &state, &Claims::of(&state), f, &Default::default());
            assert_eq!(found.uses, expected.contents.uses, "family {f:?}");
            assert_eq!(read, 0, "family {f:?}: rules read back of a clean table");
        }
        assert_eq!(dp.verify(&state, &Claims::of(&state)).unwrap(), vec![]);
        nft::cleanup().unwrap();
    });
}

#[test]
fn a_rule_added_or_deleted_by_nft_is_found_from_the_chain_counts() {
    in_private_netns(|| {
        let state = state();
        let claims = Claims::of(&state);
        let mut dp = NftDatapath::open(Vec::new()).unwrap();
        dp.program_all(&state, &claims).unwrap();
        let (found, _) = counted(&dp, &state, Family::V4);
        let chain = web_chain(&found);
        let rules_before = found.uses[&chain];

        // A rule added to a service's chain (not counted before: only the
        // base chains' rules were).
        nft_cmd(&["add", "rule", "ip", TABLE, &chain, "counter"]);
        let (found, read) = counted(&dp, &state, Family::V4);
        assert_eq!(found.uses[&chain], rules_before + 1);
        assert_eq!(read, 1, "only the chain whose count moved is read");
        let d = dp.verify(&state, &claims).unwrap();
        assert_eq!(d.len(), 1, "{d:#?}");
        assert_eq!(d[0].kind, DriftKind::Rules);
        assert_eq!(d[0].object, format!("ip {TABLE} {chain}"));
        assert_eq!(d[0].service.as_deref(), Some("ns/web"));
        let n = |s: &str| s.trim_end_matches(" rules").parse::<usize>().unwrap();
        assert_eq!(n(&d[0].found), n(&d[0].expected) + 1, "{d:#?}");
        dp.program_all(&state, &claims).unwrap();
        assert_eq!(dp.verify(&state, &claims).unwrap(), vec![]);

        // A rule deleted from a hooked chain by its handle.
        let listing = nft_cmd(&["-a", "list", "chain", "ip", TABLE, "nat-prerouting"]);
        let handle = listing
            .lines()
            .filter(|l| l.contains("# handle"))
            .filter_map(|l| l.rsplit("# handle ").next())
            .map(str::trim)
            .next_back()
            .expect("a rule in nat-prerouting")
            .to_owned();
        nft_cmd(&[
            "delete",
            "rule",
            "ip",
            TABLE,
            "nat-prerouting",
            "handle",
            &handle,
        ]);
        let d = dp.verify(&state, &claims).unwrap();
        assert_eq!(d.len(), 1, "{d:#?}");
        assert_eq!(d[0].kind, DriftKind::Rules);
        assert_eq!(d[0].object, format!("ip {TABLE} nat-prerouting"));
        assert_eq!(n(&d[0].found) + 1, n(&d[0].expected), "{d:#?}");
        nft::cleanup().unwrap();
    });
}
