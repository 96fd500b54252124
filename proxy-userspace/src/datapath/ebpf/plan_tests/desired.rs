//! Which VIPs a service gets and which endpoints each one uses.

use super::*;

fn service(
    cluster: &[&str],
    external: &[&str],
    endpoints: &[(&str, u16, EndpointScopes)],
) -> ServiceEndpoints {
    let mut se = testing::service("default", "web", cluster)
        .with_external_ips(external)
        .with_endpoints(
            endpoints
                .iter()
                .map(|(ip, port, scopes)| testing::endpoint(ip, *port, *scopes)),
        );
    se.service.uid = Default::default();
    se.service.session_affinity_timeout = Some(10800);
    se
}

/// Socket scope: cluster IPs use the internal scope, external IPs and node
/// ports on the node's addresses the cluster scope (connections from the
/// node itself). External scope (the tc programs): external IPs and node
/// ports with the external scope (externalTrafficPolicy).
#[test]
fn each_frontend_gets_the_endpoint_scope_of_its_traffic() {
    let both = EndpointScopes {
        cluster: true,
        local: true,
        internal: true,
        external: true,
    };
    let remote = EndpointScopes {
        cluster: true,
        internal: false,
        ..Default::default()
    };
    let mut se = service(
        &["10.96.0.10", "fd00::10"],
        &["192.0.2.7"],
        &[
            ("10.0.0.1", 8080, both),
            ("10.0.0.2", 8080, remote),
            ("fd00::1", 8080, both),
        ],
    );
    se.service.ports[0].node_port = 30080;
    let claims = Claims::of(&testing::state(vec![se.clone()]));
    let node_ip: std::net::IpAddr = "192.168.1.1".parse().unwrap();
    let d = desired_services(&se, &claims, &[node_ip]);
    let got: Vec<(String, Vec<String>, Option<u32>)> = d
        .iter()
        .map(|d| {
            (
                d.vip.to_string(),
                d.backends.iter().map(ToString::to_string).collect(),
                d.affinity_timeout,
            )
        })
        .collect();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        got,
        vec![
            (
                "10.96.0.10:80/TCP".into(),
                s(&["10.0.0.1:8080"]),
                Some(10800)
            ),
            (
                "[fd00::10]:80/TCP".into(),
                s(&["[fd00::1]:8080"]),
                Some(10800)
            ),
            (
                "192.0.2.7:80/TCP".into(),
                s(&["10.0.0.1:8080", "10.0.0.2:8080"]),
                Some(10800)
            ),
            (
                "192.0.2.7:80/TCP (external)".into(),
                s(&["10.0.0.1:8080"]),
                Some(10800)
            ),
            (
                "192.168.1.1:30080/TCP".into(),
                s(&["10.0.0.1:8080", "10.0.0.2:8080"]),
                Some(10800)
            ),
            (
                "192.168.1.1:30080/TCP (external)".into(),
                s(&["10.0.0.1:8080"]),
                Some(10800)
            ),
        ]
    );
    assert!(d.iter().all(|d| d.source_ranges.is_none()));
}

/// loadBalancerSourceRanges restrict the LB IPs of their family only (from
/// outside and from the node's own sockets, both scopes); a family the
/// ranges leave out is closed to every source.
#[test]
fn source_ranges_apply_to_load_balancer_ips() {
    let mut se = service(&["10.96.0.10"], &[], &[]);
    se.service.load_balancer_ips = crate::model::IpSet::from_ips(
        [
            "203.0.113.1".parse().unwrap(),
            "2001:db8::1".parse().unwrap(),
        ]
        .iter(),
    );
    se.service.load_balancer_source_ranges = vec!["198.51.100.0/24".into()];
    let claims = Claims::of(&testing::state(vec![se.clone()]));
    let d = desired_services(&se, &claims, &[]);
    let ranges: Vec<(String, Option<Vec<String>>)> = d
        .iter()
        .map(|d| {
            (
                d.vip.to_string(),
                d.source_ranges
                    .as_ref()
                    .map(|r| r.iter().map(ToString::to_string).collect()),
            )
        })
        .collect();
    assert_eq!(
        ranges,
        [
            ("10.96.0.10:80/TCP".to_owned(), None),
            (
                "203.0.113.1:80/TCP".to_owned(),
                Some(vec!["198.51.100.0/24".to_owned()])
            ),
            (
                "203.0.113.1:80/TCP (external)".to_owned(),
                Some(vec!["198.51.100.0/24".to_owned()])
            ),
            ("[2001:db8::1]:80/TCP".to_owned(), Some(vec![])),
            ("[2001:db8::1]:80/TCP (external)".to_owned(), Some(vec![])),
        ]
    );
    let flags: Vec<u16> = d
        .iter()
        .map(|d| d.flags() & SVC_FLAG_SOURCE_RANGES)
        .collect();
    assert_eq!(
        flags,
        [
            0,
            SVC_FLAG_SOURCE_RANGES,
            SVC_FLAG_SOURCE_RANGES,
            SVC_FLAG_SOURCE_RANGES,
            SVC_FLAG_SOURCE_RANGES
        ]
    );
}

#[test]
fn a_vip_claimed_twice_goes_to_its_owner_only() {
    let a = service(&["10.96.0.10"], &[], &[]).created_at(2);
    let mut b = service(&["10.96.0.20"], &["10.96.0.10"], &[]).created_at(1);
    b.service.key = ObjectKey::new("default", "zzz");
    let state = testing::state(vec![a, b]);
    let d = desired_state(&state, &Claims::of(&state), &[]);
    let owners: Vec<(String, &str)> = d
        .iter()
        .map(|d| (d.vip.to_string(), d.owner.name.as_str()))
        .collect();
    assert_eq!(
        owners,
        [
            ("10.96.0.20:80/TCP".to_owned(), "zzz"),
            ("10.96.0.10:80/TCP".to_owned(), "zzz"),
            ("10.96.0.10:80/TCP (external)".to_owned(), "zzz")
        ]
    );
}
