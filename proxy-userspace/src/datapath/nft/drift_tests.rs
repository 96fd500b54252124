use super::super::nlsock::NFTA_LIST_ELEM;
use super::*;

const WEB_CHAIN: &str = "svc-default/web/tcp/http";

fn web_key() -> ElementKey {
    let ip: IpAddr = "10.96.0.10".parse().unwrap();
    (
        rules::SERVICE_IPS,
        key_bytes(&[KeyPart::Addr(ip), KeyPart::Proto(6), KeyPart::Port(80)]),
    )
}

/// A table with one service: its chain (rules not counted), its
/// service-ips element and a hairpin element; helper chains `services`
/// (1 rule) and `masquerading` (2 rules).
fn programmed() -> Expected {
    let mut c = TableContents::default();
    c.chains.insert("services".into(), Some(1));
    c.chains.insert("masquerading".into(), Some(2));
    c.chains.insert(WEB_CHAIN.into(), None);
    c.sets.insert(rules::SERVICE_IPS.into(), 0);
    c.sets.insert(rules::HAIRPIN.into(), 0);
    c.sets.insert("aff-default/web/tcp/http".into(), 10_800_000);
    c.elements.insert(
        web_key(),
        ElementData::Verdict(NFT_GOTO, Some(WEB_CHAIN.into())),
    );
    let ip: IpAddr = "10.244.1.11".parse().unwrap();
    c.elements.insert(
        (
            rules::HAIRPIN,
            key_bytes(&[KeyPart::Addr(ip), KeyPart::Addr(ip)]),
        ),
        ElementData::Set,
    );
    Expected {
        owners: HashMap::from([(web_key(), "default/web".to_owned())]),
        contents: c,
    }
}

fn found(edit: impl FnOnce(&mut TableContents)) -> TableContents {
    let mut c = programmed().contents;
    edit(&mut c);
    c
}

#[test]
fn a_table_as_programmed_has_no_drift() {
    let f = found(|_| {});
    assert_eq!(compare(Family::V4, &programmed(), Some(&f)), vec![]);
}

#[test]
fn a_deleted_table_is_one_difference() {
    let d = compare(Family::V6, &programmed(), None);
    assert_eq!(
        d,
        vec![Drift::new(
            DriftKind::Table,
            "ip6 ebpf-kube-proxy",
            "",
            "present",
            "absent"
        )]
    );
}

#[test]
fn a_deleted_map_element_names_the_service_the_key_and_the_verdict() {
    let f = found(|c| {
        c.elements.remove(&web_key());
    });
    let d = compare(Family::V4, &programmed(), Some(&f));
    assert_eq!(
        d,
        vec![Drift {
            kind: DriftKind::Element,
            object: "ip ebpf-kube-proxy service-ips".into(),
            key: "10.96.0.10 . tcp . 80".into(),
            service: Some("default/web".into()),
            expected: format!("goto {WEB_CHAIN}"),
            found: "absent".into(),
            repaired: false,
        }]
    );
}

#[test]
fn flushed_rules_changed_verdicts_and_added_elements_are_reported() {
    let stray: IpAddr = "10.96.0.99".parse().unwrap();
    let stray_key = key_bytes(&[KeyPart::Addr(stray), KeyPart::Proto(17), KeyPart::Port(53)]);
    let f = found(|c| {
        for n in c.chains.values_mut().flatten() {
            *n = 0;
        }
        c.elements
            .insert(web_key(), ElementData::Verdict(NF_DROP, None));
        c.elements.insert(
            (rules::SERVICE_IPS, stray_key),
            ElementData::Verdict(NF_ACCEPT, None),
        );
    });
    let d = compare(Family::V4, &programmed(), Some(&f));
    let summary: Vec<(DriftKind, &str, &str, &str)> = d
        .iter()
        .map(|d| {
            (
                d.kind,
                d.key.as_str(),
                d.expected.as_str(),
                d.found.as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (DriftKind::Rules, "", "2 rules", "0 rules"),
            (DriftKind::Rules, "", "1 rules", "0 rules"),
            (
                DriftKind::Element,
                "10.96.0.10 . tcp . 80",
                "goto svc-default/web/tcp/http",
                "drop"
            ),
            (
                DriftKind::Element,
                "10.96.0.99 . udp . 53",
                "absent",
                "accept"
            ),
        ]
    );
    assert_eq!(d[2].service.as_deref(), Some("default/web"));
}

#[test]
fn a_deleted_chain_or_set_is_one_difference_not_one_per_content() {
    let f = found(|c| {
        c.chains.remove(WEB_CHAIN);
        c.sets.remove(rules::SERVICE_IPS);
        c.elements.remove(&web_key());
        c.sets.insert("aff-default/web/tcp/http".into(), 60_000);
    });
    let d = compare(Family::V4, &programmed(), Some(&f));
    let summary: Vec<(DriftKind, &str, &str, &str)> = d
        .iter()
        .map(|d| {
            (
                d.kind,
                d.object.as_str(),
                d.expected.as_str(),
                d.found.as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                DriftKind::Chain,
                "ip ebpf-kube-proxy svc-default/web/tcp/http",
                "chain",
                "absent"
            ),
            (
                DriftKind::Set,
                "ip ebpf-kube-proxy aff-default/web/tcp/http",
                "timeout 10800s",
                "timeout 60s"
            ),
            (
                DriftKind::Set,
                "ip ebpf-kube-proxy service-ips",
                "no timeout",
                "absent"
            ),
        ]
    );
}

#[test]
fn keys_decode_as_nft_prints_them_in_both_families() {
    let v6: IpAddr = "fd00::10".parse().unwrap();
    let k = key_bytes(&[KeyPart::Addr(v6), KeyPart::Proto(6), KeyPart::Port(443)]);
    assert_eq!(
        key_display(Family::V6, rules::NO_ENDPOINT_SERVICES, &k),
        "fd00::10 . tcp . 443"
    );
    let np = key_bytes(&[KeyPart::Proto(17), KeyPart::Port(30053)]);
    assert_eq!(
        key_display(Family::V4, rules::SERVICE_NODEPORTS, &np),
        "udp . 30053"
    );
    let (_, web) = web_key();
    assert_eq!(
        key_display(Family::V4, rules::SERVICE_IPS, &web),
        "10.96.0.10 . tcp . 80"
    );
    // Not the shape of the set: the bytes, not a wrong address.
    assert_eq!(
        key_display(Family::V4, rules::SERVICE_NODEPORTS, &[1, 2]),
        "0102"
    );
}

#[test]
fn elements_decode_from_a_dump_message() {
    // The layout the kernel answers GETSETELEM with (and that the
    // datapath writes): table, set, then the element list.
    let mut a = Attrs::default();
    let (_, web) = web_key();
    a.str(1, TABLE).str(2, rules::SERVICE_IPS).nest(3, |list| {
        list.nest(NFTA_LIST_ELEM, |el| {
            el.data_value(1, &web);
            el.data_verdict(2, NFT_GOTO, Some(WEB_CHAIN));
        });
        list.nest(NFTA_LIST_ELEM, |el| {
            el.data_value(1, &[10, 0, 0, 1, 10, 0, 0, 1]);
        });
    });
    assert_eq!(
        elements_of(&a.buf),
        vec![
            (
                web,
                ElementData::Verdict(NFT_GOTO, Some(WEB_CHAIN.to_owned()))
            ),
            (vec![10, 0, 0, 1, 10, 0, 0, 1], ElementData::Set),
        ]
    );
}

#[test]
fn the_tables_own_chains_are_reported_before_the_services_chains() {
    let mut e = Expected::default();
    let mut f = TableContents::default();
    for (name, rules) in [
        ("ext-a/a/tcp/http", 2),
        ("fw-a/a/tcp/http", 1),
        ("services", 3),
        ("svc-a/a/tcp/http", 2),
        ("filter-input", 1),
    ] {
        e.contents.chains.insert(name.to_owned(), Some(rules));
        f.chains.insert(name.to_owned(), Some(0));
    }
    let d = compare(Family::V4, &e, Some(&f));
    let order: Vec<&str> = d.iter().map(|d| d.object.as_str()).collect();
    assert_eq!(
        order,
        [
            "ip ebpf-kube-proxy filter-input",
            "ip ebpf-kube-proxy services",
            "ip ebpf-kube-proxy ext-a/a/tcp/http",
            "ip ebpf-kube-proxy fw-a/a/tcp/http",
            "ip ebpf-kube-proxy svc-a/a/tcp/http",
        ]
    );
}
