//! Fuzz target `netlink`: the decoders of what the kernel answers on the
//! `NETLINK_NETFILTER` socket, the input as one received datagram:
//! nfnetlink framing and attributes (`nlsock::messages`, `attrs`), batch
//! acks (`nlsock::acks`), nf_tables dumps (`nlsock::dump_datagram` feeding
//! `batch::table_name`, `chain_of` and `set_of`, as `list_tables` and
//! `list_objects` do) and ctnetlink dumps (`conntrack::ct::list_datagram`,
//! netlink-packet-netfilter's decoder).

#![no_main]

use ebpf_kube_proxy::datapath::nft::batch::{chain_of, set_of, table_name};
use ebpf_kube_proxy::datapath::nft::conntrack::ct;
use ebpf_kube_proxy::datapath::nft::nlsock::{
    acks, attrs, dump_datagram, messages, NFPROTO_IPV4, NFPROTO_IPV6,
};
use ebpf_kube_proxy::datapath::nft::rules::TABLE;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for (_kind, _flags, _seq, payload) in messages(data) {
        // The nfgenmsg header, then attributes, some of them nested.
        for (_, value) in attrs(payload.get(4..).unwrap_or_default()) {
            let _ = attrs(value);
        }
    }
    let _ = acks(data);
    let _ = dump_datagram(data, |a| {
        let _ = table_name(a);
        let _ = chain_of(a, TABLE);
        let _ = set_of(a, TABLE);
    });
    for (family, proto) in [(NFPROTO_IPV4, 17), (NFPROTO_IPV6, 6)] {
        let mut entries = Vec::new();
        if let Err(e) = ct::list_datagram(data, family, proto, &mut entries) {
            let _ = e.to_string();
        }
    }
});
