//! Generated gRPC types for the two APIs the daemon serves.
//!
//! * [`localnet::v1`]: the node-local `Endpoints` API (SPEC §6).
//! * [`podinfo::v1alpha1`]: the PodInfo bridge (SPEC §7).
//! * [`k8s`]: the Kubernetes API's protobuf encoding, for the objects the
//!   kube source reads (hand-written messages, not generated).
//!
//! Messages are prost types; every message also implements serde
//! `Serialize`/`Deserialize` in the canonical proto3 JSON mapping (pbjson),
//! which the CLI uses for `-o json|yaml`.

#![allow(clippy::all, clippy::pedantic, missing_docs)]

pub mod k8s;

pub mod localnet {
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/localnet.v1.rs"));
        include!(concat!(env!("OUT_DIR"), "/localnet.v1.serde.rs"));
    }
}

pub mod podinfo {
    pub mod v1alpha1 {
        include!(concat!(env!("OUT_DIR"), "/podinfo.v1alpha1.rs"));
        include!(concat!(env!("OUT_DIR"), "/podinfo.v1alpha1.serde.rs"));
    }
}

/// Every file of both APIs (and the well-known types they import) as an
/// encoded `FileDescriptorSet` with source info, so the comments of the
/// `.proto` files reach gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin"));
