//! Health-check node ports (SPEC §4.3) of the real daemon over real HTTP.

mod common;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::fake_apiserver::FakeApiServer;
use common::{free_port, manifests_dir, write_atomic, Daemon};
use serde_json::json;

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

/// `--nodeport-addresses` narrows the listeners to the local addresses
/// inside it: 127.0.0.1 answers, 127.0.0.2 (also local, outside the CIDR)
/// does not.
#[test]
fn nodeport_addresses_narrow_the_health_check_listeners() {
    let port = free_port().port();
    let d = Daemon::start_in(
        manifests_dir(&[("web.yaml", &manifests(port, "Local", false))]),
        &["--nodeport-addresses", "127.0.0.1/32"],
    );
    let inside: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let outside: SocketAddr = format!("127.0.0.2:{port}").parse().unwrap();
    eventually(
        Duration::from_secs(5),
        "the port opens on 127.0.0.1",
        || TcpStream::connect(inside).is_ok(),
    );
    assert_eq!(common::http(inside, "GET", "/", &[]).status, 200);
    assert!(
        TcpStream::connect(outside).is_err(),
        "listening outside --nodeport-addresses; log:\n{}",
        d.log_text()
    );
}

/// A port that is already taken: the file source logs
/// FailedToStartServiceHealthcheck naming the service.
#[test]
fn a_taken_port_is_logged_with_the_file_source() {
    let taken = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let d = Daemon::start(&[("web.yaml", &manifests(port, "Local", false))]);
    eventually(Duration::from_secs(5), "the warning is logged", || {
        d.log_text().contains("FailedToStartServiceHealthcheck")
    });
    let log = d.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("FailedToStartServiceHealthcheck"))
        .unwrap();
    assert!(
        line.contains("default/web") && line.contains(&port.to_string()),
        "{line}"
    );
}

/// With the kube source, the same failure posts a Warning Event on the
/// Service, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_port_posts_a_warning_event_on_the_service() {
    let taken = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let api = FakeApiServer::start().await;
    api.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default", "uid": "uid-web"},
        "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.10", "externalTrafficPolicy": "Local",
                 "healthCheckNodePort": port,
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}
    }));
    api.apply(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
        "endpoints": [{"addresses": ["10.244.1.5"], "nodeName": "n1", "conditions": {"ready": true}}]
    }));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let d = Daemon::start_kube(dir, &kubeconfig, &[]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while api.events().is_empty() {
        assert!(
            Instant::now() < deadline,
            "no Event posted; log:\n{}",
            d.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A later state must not post it again.
    api.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "other", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.11", "ports": [{"port": 80}]}
    }));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let events = api.events();
    assert_eq!(events.len(), 1, "{events:#?}");
    let e = &events[0];
    assert_eq!(e["reason"], "FailedToStartServiceHealthcheck", "{e:#}");
    assert_eq!(e["type"], "Warning", "{e:#}");
    assert_eq!(e["regarding"]["kind"], "Service", "{e:#}");
    assert_eq!(e["regarding"]["namespace"], "default", "{e:#}");
    assert_eq!(e["regarding"]["name"], "web", "{e:#}");
    assert_eq!(e["regarding"]["uid"], "uid-web", "{e:#}");
    assert_eq!(e["reportingController"], "ebpf-kube-proxy", "{e:#}");
    let note = e["note"].as_str().unwrap();
    assert!(
        note.contains(&port.to_string()) && note.contains("default/web"),
        "{note}"
    );
    drop(taken);
}
