//! Fuzz target `grpc_requests`: the request messages of the localnet and
//! PodInfo gRPC APIs, prost-decoded from the input as the servers decode a
//! request body, then the server-side check that runs before any work
//! (`podinfo::server::check_get_request`). localnet's `NextFilter` and
//! `WatchRequest` carry only integers, which need no check past decoding.

#![no_main]

use ebpf_kube_proxy::podinfo::server::check_get_request;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use proto::localnet::v1 as localnet;
use proto::podinfo::v1alpha1 as podinfo;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = localnet::NextFilter::decode(data) {
        let _ = r.encode_to_vec();
    }
    if let Ok(r) = localnet::WatchRequest::decode(data) {
        let _ = r.encode_to_vec();
    }
    let _ = podinfo::ListPodConditionsRequest::decode(data);
    let _ = podinfo::WatchPodConditionsRequest::decode(data);
    if let Ok(r) = podinfo::GetPodConditionsRequest::decode(data) {
        if let Err(status) = check_get_request(&r) {
            let _ = status.to_string();
        }
    }
});
