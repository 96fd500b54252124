//! Fuzz target `sloppy_ip`: the address and CIDR parser every address of
//! the API, the manifests and the flags goes through, held to kube-proxy's
//! `ParseIPSloppy`/`ParseCIDRSloppy`. Each run checks k8s.io/utils/net's
//! cases once, then for the input: no panic; a result prints in canonical
//! form and reads back as itself; a canonical address reads as itself; an
//! input without a colon reads as Go 1.16's `net.ParseIP` read it (four
//! decimal fields, any number of leading zeros, each at most 255).

#![no_main]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Once;

use ebpf_kube_proxy::net::go_cases::{BAD_CIDRS, BAD_IPS, GOOD_CIDRS, GOOD_IPS};
use ebpf_kube_proxy::net::{parse_cidr_sloppy, parse_ip_sloppy};
use libfuzzer_sys::fuzz_target;

fn go_cases() {
    for spellings in GOOD_IPS {
        for s in *spellings {
            let ip = parse_ip_sloppy(s).map(|ip| ip.to_string());
            assert_eq!(ip.as_deref(), Some(spellings[0]), "{s:?}");
        }
    }
    for s in BAD_IPS {
        assert_eq!(parse_ip_sloppy(s), None, "{s:?}");
    }
    for spellings in GOOD_CIDRS {
        for s in *spellings {
            let c = parse_cidr_sloppy(s).map(|c| c.network().to_string());
            assert_eq!(c.as_deref(), Some(spellings[0]), "{s:?}");
        }
    }
    for s in BAD_CIDRS {
        assert_eq!(parse_cidr_sloppy(s), None, "{s:?}");
    }
}

/// Go 1.16's IPv4 reading: four fields of decimal digits separated by
/// dots, each at most 255 whatever its leading zeros.
fn go116_ipv4(s: &str) -> Option<Ipv4Addr> {
    let fields: Vec<&str> = s.split('.').collect();
    if fields.len() != 4 {
        return None;
    }
    let mut octets = [0u8; 4];
    for (o, f) in octets.iter_mut().zip(&fields) {
        if f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let digits = f.trim_start_matches('0');
        if digits.len() > 3 {
            return None;
        }
        *o = u8::try_from(digits.parse::<u32>().unwrap_or(0)).ok()?;
    }
    Some(Ipv4Addr::from(octets))
}

static CASES: Once = Once::new();

fuzz_target!(|data: &[u8]| {
    CASES.call_once(go_cases);
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let ip = parse_ip_sloppy(s);
    if let Some(ip) = ip {
        let text = ip.to_string();
        assert_eq!(parse_ip_sloppy(&text), Some(ip), "{s:?} → {text}");
        assert_eq!(text.parse::<IpAddr>().ok(), Some(ip), "{s:?} → {text}");
    }
    if let Ok(canonical) = s.parse::<IpAddr>() {
        if canonical.to_string() == s {
            let mapped = matches!(canonical, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some());
            if !mapped {
                assert_eq!(ip, Some(canonical), "{s:?}");
            }
        }
    }
    if !s.contains(':') {
        assert_eq!(ip, go116_ipv4(s).map(IpAddr::V4), "{s:?}");
    }
    if let Some(c) = parse_cidr_sloppy(s) {
        let text = c.to_string();
        assert_eq!(parse_cidr_sloppy(&text), Some(c), "{s:?} → {text}");
        assert!(
            c.contains(&c.addr) && c.network().contains(&c.addr),
            "{s:?}"
        );
    }
});
