//! Fuzz target `manifests`: the file source's manifest parser
//! (`sources::file::parse_manifest`), the input as the content of a `.yaml`
//! file and of a `.json` file (the extension picks the parser). The source
//! reads files with `read_to_string`, so input that is not UTF-8 never
//! reaches the parser and is skipped here too.

#![no_main]

use std::path::Path;

use ebpf_kube_proxy::sources::file::parse_manifest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for name in ["fuzz.yaml", "fuzz.json"] {
        match parse_manifest(Path::new(name), text) {
            Ok(objects) => {
                for o in &objects {
                    let _ = o.object_ref().to_string();
                }
            }
            // The messages are what the source logs: format them too.
            Err(errors) => {
                for e in &errors {
                    let _ = (e.to_string(), e.reason_class());
                }
            }
        }
    }
});
