//! A process in node 1's network namespace, as a hostNetwork pod is: a
//! netexec serving on the node's own addresses, for the upstream tests
//! whose endpoints are hostNetwork pods. (A hostNetwork *client* is
//! [`Bed::client`] with no netns: the node's namespace and cgroup.)

use anyhow::Result;

use super::Bed;

/// The node's netexec answers as this "pod".
pub const HOST_ENDPOINT_NAME: &str = "node-1-host";
/// Its ports: none of the pods' ([`super::TCP_PORTS`], [`super::UDP_PORTS`]).
pub const HOST_TCP_PORT: u16 = 19376;
pub const HOST_UDP_PORT: u16 = 19353;

impl Bed {
    /// Starts the node's hostNetwork netexec once; it runs until the bed
    /// drops.
    pub fn host_endpoint(&mut self) -> Result<()> {
        if !self.host_endpoint {
            let netns = self.node_netns.clone();
            self.start_netexec(
                &netns,
                HOST_ENDPOINT_NAME,
                &[HOST_TCP_PORT],
                &[HOST_UDP_PORT],
            )?;
            self.host_endpoint = true;
        }
        Ok(())
    }
}
