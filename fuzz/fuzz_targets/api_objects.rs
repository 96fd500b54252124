//! Fuzz target `api_objects`: one API object, as JSON, through
//! `sources::objects::decode_object` into the model types (the check every
//! object from the API server or a manifest passes). Input that is not JSON
//! is skipped: the API client and the manifest parser reject it earlier.

#![no_main]

use ebpf_kube_proxy::sources::objects::{decode_object, Decoded};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    match decode_object(value) {
        Ok(Decoded::Object(o)) => {
            let _ = o.object_ref().to_string();
        }
        Ok(Decoded::Ignored { .. }) => {}
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
