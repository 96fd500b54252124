//! Every manifest in deploy/ is a valid object of its kind: it parses into
//! the k8s-openapi type and serialises back to the same document, so a
//! misspelt or misplaced field (which the API server would drop or reject)
//! fails here.

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn documents(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap();
    ebpf_kube_proxy::yaml::documents(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn roundtrip<T: serde::de::DeserializeOwned + serde::Serialize>(
    doc: &serde_json::Value,
) -> serde_json::Value {
    let typed: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{e}: {doc}"));
    serde_json::to_value(typed).unwrap()
}

#[test]
fn every_deploy_manifest_is_a_valid_object() {
    let mut kinds = Vec::new();
    for file in ["rbac.yaml", "configmap.yaml", "daemonset.yaml"] {
        let path = deploy_dir().join(file);
        for doc in documents(&path) {
            let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
            let back = match kind.as_str() {
                "ServiceAccount" => roundtrip::<ServiceAccount>(&doc),
                "ClusterRole" => roundtrip::<ClusterRole>(&doc),
                "ClusterRoleBinding" => roundtrip::<ClusterRoleBinding>(&doc),
                "ConfigMap" => roundtrip::<ConfigMap>(&doc),
                "DaemonSet" => roundtrip::<DaemonSet>(&doc),
                other => panic!("{}: unexpected kind {other:?}", path.display()),
            };
            assert_eq!(
                back,
                doc,
                "{}: {kind} does not survive a typed round trip (unknown or misplaced field?)",
                path.display()
            );
            kinds.push(kind);
        }
    }
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
            "ServiceAccount"
        ]
    );
}

#[test]
fn the_daemonset_runs_like_kube_proxy() {
    let doc = &documents(&deploy_dir().join("daemonset.yaml"))[0];
    let ds: DaemonSet = serde_json::from_value(doc.clone()).unwrap();
    let pod = ds.spec.template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert_eq!(pod.service_account_name.as_deref(), Some("ebpf-kube-proxy"));
    let c = &pod.containers[0];
    let liveness = c
        .liveness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(liveness.path.as_deref(), Some("/livez"));
    let readiness = c
        .readiness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(readiness.path.as_deref(), Some("/healthz"));
    let env = c.env.as_ref().unwrap();
    assert!(env.iter().any(|e| e.name == "NODE_NAME"
        && e.value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str())
            == Some("spec.nodeName")));
    let caps = c
        .security_context
        .as_ref()
        .unwrap()
        .capabilities
        .as_ref()
        .unwrap();
    let added = caps.add.clone().unwrap();
    for cap in ["BPF", "NET_ADMIN"] {
        assert!(added.iter().any(|a| a == cap), "missing capability {cap}");
    }
    let mounts: Vec<&str> = c
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| m.mount_path.as_str())
        .collect();
    for m in ["/sys/fs/bpf", "/run/ebpf-kube-proxy"] {
        assert!(mounts.contains(&m), "missing mount {m}");
    }
}

#[test]
fn the_kind_cluster_has_no_kube_proxy_and_the_script_parses() {
    let docs = documents(&deploy_dir().join("kind/cluster.yaml"));
    assert_eq!(docs[0]["networking"]["kubeProxyMode"], "none");
    let script = deploy_dir().join("kind/conformance.sh");
    let st = std::process::Command::new("bash")
        .arg("-n")
        .arg(&script)
        .status()
        .unwrap();
    assert!(st.success(), "bash -n {}", script.display());
    // shellcheck is installed by `cargo xtask test` (Debian package).
    match std::process::Command::new("shellcheck")
        .arg(&script)
        .output()
    {
        Ok(out) => assert!(
            out.status.success(),
            "shellcheck:\n{}",
            String::from_utf8_lossy(&out.stdout)
        ),
        Err(e) => panic!("shellcheck is required (apt-get install shellcheck): {e}"),
    }
}
