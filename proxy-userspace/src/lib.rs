//! ebpf-kube-proxy: a kube-proxy replacement.
//!
//! Data flows one way: [`sources`] → [`model`] (pure) → [`sync`] publishes
//! snapshots → consumers ([`localnet`] gRPC API, [`podinfo`] gRPC API,
//! [`datapath`], [`status`]).

pub mod apply;
pub mod cli;
pub mod commands;
pub mod compat;
pub mod config;
pub mod config_file;
pub mod conntrack_sysctl;
pub mod daemon;
pub mod datapath;
pub mod events;
pub mod flagz;
pub mod gofmt;
pub mod grpc_discovery;
pub mod grpc_unix;
pub mod localnet;
pub mod logging;
pub mod memory;
pub mod model;
pub mod net;
pub mod node_addrs;
pub mod podinfo;
pub mod snapshot;
pub mod sources;
pub mod status;
pub mod sync;
pub mod yaml;
