//! The e2e scenarios. Each writes its manifests, lets the daemon program
//! them, and asserts on what the client receives.

use anyhow::Result;
use std::collections::BTreeMap;

use super::bed::Bed;

/// A scenario that does not apply to this datapath: reported as SKIP and
/// counted apart, never as a pass.
#[derive(Debug)]
pub struct Skip(pub &'static str);

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Skip {}

pub struct Scenario {
    pub name: &'static str,
    pub run: fn(&mut Bed) -> Result<()>,
}

/// The product's own scenarios. Those that check what an upstream
/// kube-proxy e2e test checks run as that test in `cargo xtask conformance`
/// (`upstream.rs`), not here.
pub fn all() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "test-bed-pods-reachable-directly",
            run: pods_reachable,
        },
        Scenario {
            name: "ipv6-clusterip",
            run: ipv6,
        },
        Scenario {
            name: "session-affinity-survives-daemon-restart",
            run: affinity_restart,
        },
        Scenario {
            name: "kube-source-drives-the-datapath",
            run: kube_source,
        },
        Scenario {
            name: "ipv6-nodeport-from-outside",
            run: ipv6_nodeport_outside,
        },
        Scenario {
            name: "nodeport-addresses-narrow-node-ports",
            run: nodeport_addresses,
        },
        Scenario {
            name: "external-and-load-balancer-ips-from-outside",
            run: external_and_lb_ips,
        },
        Scenario {
            name: "load-balancer-source-ranges-ipv6-tcp-and-udp",
            run: lb_source_ranges_ipv6_udp,
        },
        Scenario {
            name: "external-traffic-policy-local-nodeport",
            run: etp_local_nodeport,
        },
        Scenario {
            name: "two-node-cluster-policy-from-outside-to-local-and-remote-backends",
            run: two_node::cluster_policy_local_and_remote,
        },
        Scenario {
            name: "two-node-local-policy-keeps-client-address-drops-without-local-endpoint",
            run: two_node::local_policy_keeps_client_address,
        },
        Scenario {
            name: "two-node-hairpin-pod-reaches-its-nodeport-and-lb-ip",
            run: two_node::hairpin_nodeport,
        },
        Scenario {
            name: "two-node-nodeport-flow-to-remote-backend-survives-daemon-sigkill",
            run: two_node::nodeport_flow_survives_restart,
        },
        Scenario {
            name: "two-node-nft-tables-only-in-nftables-mode",
            run: two_node::nft_tables_only_in_nftables_mode,
        },
        Scenario {
            name: "udp-connected-client-follows-a-removed-backend",
            run: two_node::connected_udp_follows_removed_backend,
        },
        Scenario {
            name: "auto-falls-back-to-nftables",
            run: auto_fallback,
        },
        Scenario {
            name: "cleanup-with-the-daemons-arguments-leaves-nothing",
            run: cleanup::with_the_daemons_arguments,
        },
        Scenario {
            name: "kube-proxy-cleanup-flag-leaves-nothing",
            run: cleanup::kube_proxy_cleanup_flag,
        },
        Scenario {
            name: "dump-json-reads-the-programmed-service-back",
            run: cleanup::dump_json_shows_the_programmed_service,
        },
        Scenario {
            name: "bare-cleanup-for-a-daemon-on-default-paths",
            run: cleanup::with_no_flags,
        },
        Scenario {
            name: "contested-address-owned-by-the-older-service",
            run: claims::contested_address_goes_to_the_older_then_the_next,
        },
        Scenario {
            name: "drift-deleted-service-entry-repaired-within-a-sync-period",
            run: drift::deleted_entry_repaired_within_a_sync_period,
        },
        Scenario {
            name: "drift-check-on-sighup-repairs-at-once",
            run: drift::sighup_checks_at_once,
        },
        Scenario {
            name: "drift-removed-programs-or-table-repaired",
            run: drift::removed_datapath_object_repaired,
        },
        Scenario {
            name: "caps-daemon-runs-with-only-the-needed-capabilities",
            run: caps::daemon_runs_with_only_the_needed_capabilities,
        },
        Scenario {
            name: "scale-50k-services-250k-endpoints-programmed-and-served",
            run: scale::fifty_thousand_services_programmed_and_served,
        },
        Scenario {
            name: "upgrade-old-new-old-under-load-keeps-traffic-pins-and-dump",
            run: upgrade::old_new_old,
        },
    ]
}

mod caps;
mod claims;
mod cleanup;
pub(crate) mod client;
mod clusterip;
pub(crate) mod drift;
mod external;
mod manifests;
mod restart;
mod scale;
mod two_node;
mod upgrade;
mod upstream;
mod upstream_conntrack;
mod upstream_more;
mod upstream_services;
mod upstream_two_node;

pub use upstream::conformance;

use client::*;
use clusterip::*;
use external::*;
use manifests::*;
use restart::*;

fn ensure_daemon(bed: &mut Bed) -> Result<()> {
    if !bed.daemon_running() {
        bed.start_daemon()?;
    }
    Ok(())
}
