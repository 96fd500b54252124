//! Health-check node ports (SPEC §4.3) of the real daemon over real HTTP.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{free_port, write_atomic, Daemon};

fn manifests(hcnp: u16, etp: &str, local_pod_terminating: bool) -> String {
    let local_conditions = if local_pod_terminating {
        "{ready: false, serving: true, terminating: true}"
    } else {
        "{ready: true}"
    };
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: default}}\n\
         spec:\n  type: LoadBalancer\n  clusterIP: 10.96.0.10\n  externalTrafficPolicy: {etp}\n  healthCheckNodePort: {hcnp}\n\
         \x20 ports:\n  - {{name: http, port: 80, targetPort: 8080, nodePort: 30080}}\n  - {{name: https, port: 443, targetPort: 8443, nodePort: 30443}}\n\
         ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: web-1, namespace: default, labels: {{kubernetes.io/service-name: web}}}}\n\
         addressType: IPv4\nports: [{{name: http, port: 8080}}, {{name: https, port: 8443}}]\n\
         endpoints:\n\
         - {{addresses: [10.244.1.5], nodeName: n1, conditions: {local_conditions}}}\n\
         - {{addresses: [10.244.2.5], nodeName: n2, conditions: {{ready: true}}}}\n"
    )
}

fn expected_body(n: u32) -> String {
    format!("{{\n\t\"service\": {{\n\t\t\"namespace\": \"default\",\n\t\t\"name\": \"web\"\n\t}},\n\t\"localEndpoints\": {n},\n\t\"serviceProxyHealthy\": true\n}}")
}

/// Polls (bounded) until `f` holds.
fn eventually(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "{what} not within {within:?}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

#[test]
fn health_check_node_port_follows_local_endpoints() {
    let port = free_port().port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let d = Daemon::start(&[("web.yaml", &manifests(port, "Local", false))]);

    eventually(
        Duration::from_secs(5),
        "the health check port opens",
        || std::net::TcpStream::connect(addr).is_ok(),
    );
    // Any method, any path. Two ports of one pod count once.
    for (method, path) in [("GET", "/"), ("POST", "/anything/at/all")] {
        let r = common::http(addr, method, path, &[]);
        assert_eq!(r.status, 200, "{method} {path}");
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(r.header("x-load-balancing-endpoint-weight"), Some("1"));
        assert_eq!(r.text(), expected_body(1));
    }

    // The local endpoint terminates (still serving): it no longer counts.
    write_atomic(&d.manifest("web.yaml"), &manifests(port, "Local", true));
    eventually(
        Duration::from_secs(1),
        "503 once the local endpoint terminates",
        || common::http(addr, "GET", "/", &[]).status == 503,
    );
    let r = common::http(addr, "GET", "/", &[]);
    assert_eq!(r.header("x-load-balancing-endpoint-weight"), Some("0"));
    assert_eq!(r.text(), expected_body(0));

    // externalTrafficPolicy back to Cluster: the port closes.
    write_atomic(&d.manifest("web.yaml"), &manifests(port, "Cluster", false));
    eventually(Duration::from_secs(1), "the port closes", || {
        std::net::TcpStream::connect(addr).is_err()
    });
}
