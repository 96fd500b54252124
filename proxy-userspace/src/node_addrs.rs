//! The node's addresses (placeholder until the rtnetlink reader lands):
//! every interface address with its interface index, and the selection
//! `--nodeport-addresses` makes.

use std::net::IpAddr;

use crate::net::Cidr;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAddress {
    pub ifindex: u32,
    pub ifname: String,
    pub addr: IpAddr,
    pub prefix_len: u8,
}

#[derive(Debug, thiserror::Error)]
#[error("listing the node's addresses: {0}")]
pub struct NodeAddrsError(#[from] std::io::Error);

pub fn list() -> Result<Vec<NodeAddress>, NodeAddrsError> {
    let mut out = Vec::new();
    for i in if_addrs::get_if_addrs()? {
        let name = std::ffi::CString::new(i.name.clone()).map_err(std::io::Error::other)?;
        // SAFETY: `name` is a valid NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        let prefix_len = match &i.addr {
            if_addrs::IfAddr::V4(a) => u32::from(a.netmask).count_ones() as u8,
            if_addrs::IfAddr::V6(a) => u128::from(a.netmask).count_ones() as u8,
        };
        out.push(NodeAddress {
            ifindex,
            ifname: i.name.clone(),
            addr: i.ip(),
            prefix_len,
        });
    }
    Ok(out)
}

pub fn select(all: &[NodeAddress], cidrs: &[Cidr]) -> Vec<NodeAddress> {
    all.iter()
        .filter(|a| !a.addr.is_loopback())
        .filter(|a| match a.addr {
            IpAddr::V6(v6) => !v6.is_unicast_link_local(),
            IpAddr::V4(_) => true,
        })
        .filter(|a| cidrs.is_empty() || cidrs.iter().any(|c| c.contains(&a.addr)))
        .cloned()
        .collect()
}
