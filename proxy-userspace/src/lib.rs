//! ebpf-kube-proxy: a kube-proxy replacement.
//!
//! Data flows one way: [`sources`] → [`model`] (pure) → [`sync`] publishes
//! snapshots → consumers ([`localnet`] gRPC API, [`datapath`]).

pub mod cli;
pub mod commands;
pub mod config;
pub mod daemon;
pub mod datapath;
pub mod localnet;
pub mod model;
pub mod net;
pub mod sources;
pub mod sync;
