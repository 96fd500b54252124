//! The localnet `Endpoints` API (SPEC §6): server, client and the output
//! formats of the `localnet watch` and `dump` commands.

mod body;
pub mod client;
pub mod convert;
pub mod delta;
pub mod frame;
pub mod metrics;
pub mod render;
pub mod server;
pub mod wire;
