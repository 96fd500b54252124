//! Fuzz target `compute`: a cluster built from a manifest (parsed by the
//! file source's `parse_manifest`, applied to a `ClusterState` as the source
//! does) and the endpoint selection `model::compute` for the nodes it names,
//! a node it does not name and an empty name, with and without synthesised
//! topology hints. Checks on top of "no panic": the result is canonical
//! (equal input, equal output) and applying the state's own diff from
//! empty rebuilds it.

#![no_main]

use std::path::Path;

use ebpf_kube_proxy::model::{compute, Change, ClusterState, NodeContext};
use ebpf_kube_proxy::sources::file::parse_manifest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(objects) = parse_manifest(Path::new("fuzz.yaml"), text) else {
        return;
    };
    let mut cluster = ClusterState::default();
    for o in objects {
        cluster.apply(Change::Upsert(o));
    }
    let mut rebuilt = ClusterState::default();
    for change in ClusterState::default().diff(&cluster) {
        rebuilt.apply(change);
    }
    assert!(
        rebuilt == cluster,
        "diff from empty does not rebuild the state"
    );

    let names = cluster
        .nodes
        .keys()
        .cloned()
        .chain(["fuzz-node-absent".to_owned(), String::new()]);
    for node_name in names {
        for synthesize_hints in [false, true] {
            let node = NodeContext {
                node_name: node_name.clone(),
                synthesize_hints,
            };
            let state = compute(&cluster, &node);
            assert_eq!(state, compute(&cluster, &node), "compute is not canonical");
            let _ = state.endpoint_count();
        }
    }
});
