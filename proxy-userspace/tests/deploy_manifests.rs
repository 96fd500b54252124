//! deploy/ as an operator applies it: the kustomization renders every
//! manifest; each is a valid object of its kind (a typed round trip through
//! k8s-openapi, so a misspelt or misplaced field fails); the DaemonSet,
//! RBAC and monitoring objects say what a kube-proxy replacement needs;
//! and every metric the Grafana dashboard queries is on a running daemon's
//! `/metrics`.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    ebpf_kube_proxy::yaml::documents(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// What `kubectl apply -k deploy/` creates, in the kustomization's order:
/// its resources, then the generated dashboard ConfigMap.
fn rendered() -> Vec<Value> {
    let kustomization = &documents(&deploy_dir().join("kustomization.yaml"))[0];
    let mut docs = Vec::new();
    for r in kustomization["resources"].as_array().unwrap() {
        docs.extend(documents(&deploy_dir().join(r.as_str().unwrap())));
    }
    for g in kustomization["configMapGenerator"].as_array().unwrap() {
        let mut data = serde_json::Map::new();
        for f in g["files"].as_array().unwrap() {
            let f = f.as_str().unwrap();
            let text = std::fs::read_to_string(deploy_dir().join(f)).unwrap();
            let key = Path::new(f).file_name().unwrap().to_string_lossy();
            data.insert(key.into_owned(), Value::String(text));
        }
        docs.push(serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": g["name"],
                "namespace": g["namespace"],
                "labels": g["options"]["labels"],
            },
            "data": data,
        }));
    }
    docs
}

fn roundtrip<T: serde::de::DeserializeOwned + serde::Serialize>(doc: &Value) -> Value {
    let typed: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{e}: {doc}"));
    serde_json::to_value(typed).unwrap()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in deploy/"))
}

fn daemonset(docs: &[Value]) -> (PodSpec, Container) {
    let ds: DaemonSet =
        serde_json::from_value(find(docs, "DaemonSet", "ebpf-kube-proxy").clone()).unwrap();
    let pod = ds.spec.template.spec.unwrap();
    let c = pod
        .containers
        .iter()
        .find(|c| c.name == "ebpf-kube-proxy")
        .unwrap()
        .clone();
    (pod, c)
}

#[test]
fn the_kustomization_renders_every_manifest_as_a_valid_object() {
    let mut kinds = Vec::new();
    for doc in rendered() {
        let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
        let back = match kind.as_str() {
            "ServiceAccount" => roundtrip::<ServiceAccount>(&doc),
            "ClusterRole" => roundtrip::<ClusterRole>(&doc),
            "ClusterRoleBinding" => roundtrip::<ClusterRoleBinding>(&doc),
            "ConfigMap" => roundtrip::<ConfigMap>(&doc),
            "DaemonSet" => roundtrip::<DaemonSet>(&doc),
            // No Rust type: checked field by field below.
            "PodMonitor" => doc.clone(),
            other => panic!("unexpected kind {other:?}"),
        };
        assert_eq!(
            back, doc,
            "{kind} does not survive a typed round trip (unknown or misplaced field?)"
        );
        assert!(
            doc["metadata"]["namespace"] == "kube-system" || kind.starts_with("Cluster"),
            "{kind} outside kube-system"
        );
        kinds.push(kind);
    }
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "ConfigMap",
            "ConfigMap",
            "DaemonSet",
            "PodMonitor",
            "ServiceAccount"
        ]
    );
    // Every manifest in deploy/ is in the kustomization.
    let listed: BTreeSet<String> = documents(&deploy_dir().join("kustomization.yaml"))[0]
        ["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    for entry in std::fs::read_dir(deploy_dir()).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".yaml") && name != "kustomization.yaml" {
            assert!(
                listed.contains(&name),
                "{name} is not in kustomization.yaml"
            );
        }
    }
}

/// The pod reaches the API server without kube-proxy: the in-cluster
/// address is replaced from the apiserver ConfigMap.
#[test]
fn the_daemonset_gets_the_api_servers_real_address() {
    let docs = rendered();
    let (_, c) = daemonset(&docs);
    let from: Vec<String> = c
        .env_from
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e.config_map_ref.as_ref().map(|r| r.name.clone()))
        .collect();
    assert_eq!(from, ["ebpf-kube-proxy-apiserver"]);
    let env = c.env.unwrap_or_default();
    assert!(
        !env.iter()
            .any(|e| e.name.starts_with("KUBERNETES_SERVICE_")),
        "env would override the ConfigMap"
    );
    let cm: ConfigMap =
        serde_json::from_value(find(&docs, "ConfigMap", "ebpf-kube-proxy-apiserver").clone())
            .unwrap();
    let data = cm.data.unwrap();
    assert!(data.contains_key("KUBERNETES_SERVICE_HOST"));
    assert_eq!(data["KUBERNETES_SERVICE_PORT"], "6443");
    let script = std::fs::read_to_string(deploy_dir().join("kind/conformance.sh")).unwrap();
    assert!(
        script.contains(&data["KUBERNETES_SERVICE_HOST"]),
        "the kind script fills in the placeholder"
    );
}

#[test]
fn the_daemonset_runs_like_kube_proxy() {
    let docs = rendered();
    let (pod, c) = daemonset(&docs);
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert_eq!(pod.service_account_name.as_deref(), Some("ebpf-kube-proxy"));
    let tolerations = pod.tolerations.unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()),
        "runs on every node whatever its taints"
    );
    let probe_path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        let get = p.as_ref().unwrap().http_get.as_ref().unwrap();
        (get.path.clone().unwrap(), get.port.clone())
    };
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    assert_eq!(
        probe_path(&c.liveness_probe),
        ("/livez".to_owned(), IntOrString::Int(10256))
    );
    assert_eq!(
        probe_path(&c.readiness_probe),
        ("/healthz".to_owned(), IntOrString::Int(10256))
    );
    let env = c.env.clone().unwrap();
    assert!(env.iter().any(|e| e.name == "NODE_NAME"
        && e.value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str())
            == Some("spec.nodeName")));
    let mounts = c.volume_mounts.clone().unwrap();
    let mount = |path: &str| {
        mounts
            .iter()
            .find(|m| m.mount_path == path)
            .unwrap_or_else(|| panic!("missing mount {path}"))
    };
    assert_eq!(
        mount("/sys/fs/bpf").mount_propagation.as_deref(),
        Some("HostToContainer"),
        "pins made on the host are seen"
    );
    mount("/run/ebpf-kube-proxy");
    mount("/run/ebpf-kube-proxy/cgroup2");
    let command = c.command.clone().unwrap();
    assert!(command.contains(&"--cgroup-path=/run/ebpf-kube-proxy/cgroup2".to_owned()));
    let volumes = pod.volumes.unwrap();
    let host_path = |name: &str| {
        volumes
            .iter()
            .find(|v| v.name == name)
            .and_then(|v| v.host_path.as_ref())
            .map(|h| h.path.clone())
    };
    assert_eq!(host_path("bpffs").as_deref(), Some("/sys/fs/bpf"));
    assert_eq!(host_path("cgroup2").as_deref(), Some("/sys/fs/cgroup"));
    let init = pod.init_containers.unwrap();
    assert_eq!(init.len(), 1);
    assert_eq!(
        init[0]
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.mount_path == "/sys/fs/bpf")
            .and_then(|m| m.mount_propagation.as_deref()),
        Some("Bidirectional")
    );
}

/// Least privilege: the daemon gets exactly the capabilities the e2e
/// scenario `caps` measured (BPF, NET_ADMIN, PERFMON; README, Privileges),
/// cannot gain more, and only the init container that mounts bpffs on the
/// host (and writes the conntrack sysctls) is privileged.
#[test]
fn the_daemon_runs_with_exactly_the_measured_capabilities() {
    let docs = rendered();
    let (pod, c) = daemonset(&docs);
    let sc = c.security_context.clone().expect("a securityContext");
    assert_eq!(sc.privileged, Some(false), "the daemon is not privileged");
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    let caps = sc.capabilities.expect("capabilities");
    let mut added = caps.add.expect("capabilities.add");
    added.sort();
    assert_eq!(added, ["BPF", "NET_ADMIN", "PERFMON"]);
    assert_eq!(caps.drop.expect("capabilities.drop"), ["ALL"]);
    let privileged =
        |c: &Container| c.security_context.as_ref().and_then(|s| s.privileged) == Some(true);
    let main: Vec<&str> = pod
        .containers
        .iter()
        .filter(|c| privileged(c))
        .map(|c| c.name.as_str())
        .collect();
    assert!(main.is_empty(), "privileged containers: {main:?}");
    // The bpffs mount: mount(2) needs CAP_SYS_ADMIN and Kubernetes allows
    // Bidirectional propagation only in a privileged container.
    let init = pod.init_containers.unwrap_or_default();
    let names: Vec<&str> = init
        .iter()
        .filter(|c| privileged(c))
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["mount-bpffs"]);
    let mount = init.iter().find(|c| c.name == "mount-bpffs").unwrap();
    assert!(mount
        .command
        .as_ref()
        .is_some_and(|cmd| cmd.join(" ").contains("mount -t bpf bpf /sys/fs/bpf")));
}

/// The conntrack sysctls are set at start, as kube-proxy (privileged in its
/// own DaemonSet) sets them: the daemon cannot (/proc/sys is read-only in
/// an unprivileged container), so the privileged init container runs it
/// with `--init-only` and the daemon's own configuration, which writes them
/// (`conntrack_sysctl::apply`) before the daemon starts.
#[test]
fn the_privileged_init_step_sets_the_conntrack_sysctls_from_the_daemons_config() {
    let docs = rendered();
    let (pod, daemon) = daemonset(&docs);
    let init = pod.init_containers.unwrap_or_default();
    let step = init.iter().find(|c| c.name == "mount-bpffs").unwrap();
    assert_eq!(
        step.security_context.as_ref().and_then(|s| s.privileged),
        Some(true)
    );
    assert_eq!(step.image, daemon.image, "the daemon's own binary");
    let script = step.command.clone().unwrap_or_default().join(" ");
    let daemon_command = daemon.command.clone().unwrap();
    let binary = &daemon_command[0];
    let line = script
        .lines()
        .find(|l| l.contains("--init-only"))
        .unwrap_or_else(|| panic!("no --init-only step in {script:?}"));
    assert!(line.contains(binary.as_str()), "{line}");
    // The same configuration as the daemon: the sysctls follow its flags
    // and config file, and the programs it pins are the daemon's.
    for flag in daemon_command.iter().filter(|a| {
        a.starts_with("--config=")
            || a.starts_with("--cgroup-path=")
            || a.starts_with("--hostname-override=")
    }) {
        assert!(line.contains(flag.as_str()), "{flag} missing from {line}");
    }
    // Mounting bpffs comes first and stops the step when it fails.
    let mount_at = script.find("mount -t bpf").unwrap();
    assert!(mount_at < script.find("--init-only").unwrap(), "{script}");
    let mounts = step.volume_mounts.clone().unwrap_or_default();
    for (volume, path) in [
        ("config", "/var/lib/ebpf-kube-proxy"),
        ("bpffs", "/sys/fs/bpf"),
        ("cgroup2", "/run/ebpf-kube-proxy/cgroup2"),
    ] {
        assert!(
            mounts
                .iter()
                .any(|m| m.name == volume && m.mount_path == path),
            "{volume} at {path}: {mounts:?}"
        );
    }
    let env = step.env.clone().unwrap_or_default();
    assert!(
        env.iter().any(|e| e.name == "NODE_NAME"),
        "$(NODE_NAME) needs the variable: {env:?}"
    );
}

/// Prometheus finds the metrics: the listener is on the node's addresses,
/// the port is named, annotated, and the PodMonitor selects it.
#[test]
fn prometheus_can_scrape_every_node() {
    let docs = rendered();
    let ds = find(&docs, "DaemonSet", "ebpf-kube-proxy");
    let (_, c) = daemonset(&docs);
    assert!(c
        .command
        .unwrap()
        .contains(&"--metrics-bind-address=0.0.0.0:10249".to_owned()));
    let port = c
        .ports
        .unwrap()
        .into_iter()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .expect("a port named metrics");
    assert_eq!(port.container_port, 10249);
    let annotations = &ds["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], "10249");
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
    let pm = find(&docs, "PodMonitor", "ebpf-kube-proxy");
    assert_eq!(pm["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(
        pm["spec"]["selector"]["matchLabels"],
        ds["spec"]["selector"]["matchLabels"]
    );
    let endpoint = &pm["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["port"], "metrics");
    assert_eq!(endpoint["path"], "/metrics");
    let dashboard = find(&docs, "ConfigMap", "ebpf-kube-proxy-dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
}

/// Exactly what the code uses: list/watch of the four resources, and
/// Events through events.k8s.io; nothing else.
#[test]
fn rbac_grants_exactly_what_the_code_uses() {
    let docs = rendered();
    let role: ClusterRole =
        serde_json::from_value(find(&docs, "ClusterRole", "ebpf-kube-proxy").clone()).unwrap();
    let mut grants = BTreeSet::new();
    for rule in role.rules.unwrap() {
        for group in rule.api_groups.unwrap() {
            for resource in rule.resources.clone().unwrap() {
                for verb in &rule.verbs {
                    grants.insert(format!("{group}/{resource}:{verb}"));
                }
            }
        }
    }
    let mut expected = BTreeSet::new();
    for r in [
        "/services",
        "/nodes",
        "/pods",
        "discovery.k8s.io/endpointslices",
    ] {
        for verb in ["list", "watch"] {
            expected.insert(format!("{r}:{verb}"));
        }
    }
    for verb in ["create", "patch"] {
        expected.insert(format!("events.k8s.io/events:{verb}"));
    }
    assert_eq!(grants, expected);
    let binding: ClusterRoleBinding =
        serde_json::from_value(find(&docs, "ClusterRoleBinding", "ebpf-kube-proxy").clone())
            .unwrap();
    assert_eq!(binding.role_ref.name, "ebpf-kube-proxy");
    let subject = &binding.subjects.unwrap()[0];
    assert_eq!(
        (subject.kind.as_str(), subject.name.as_str()),
        ("ServiceAccount", "ebpf-kube-proxy")
    );
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

/// Metric family names in the dashboard's queries (histogram series
/// suffixes folded into their family).
fn dashboard_metrics() -> BTreeSet<String> {
    let text = std::fs::read_to_string(deploy_dir().join("monitoring/dashboard.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr" | "query" | "definition", Value::String(s)) => out.push(s.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    walk(&dashboard, &mut exprs);
    let mut names = BTreeSet::new();
    for e in exprs {
        let mut word = String::new();
        for ch in e.chars().chain([' ']) {
            if ch.is_ascii_alphanumeric() || ch == '_' {
                word.push(ch);
                continue;
            }
            let w = std::mem::take(&mut word);
            if ["ebpf_kube_proxy_", "kubeproxy_", "pod_info_"]
                .iter()
                .any(|p| w.starts_with(p))
            {
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| w.strip_suffix(s))
                    .unwrap_or(&w);
                names.insert(family.to_owned());
            }
        }
    }
    names
}

/// Families on `/metrics` of a daemon that went through what makes every
/// family appear: auto falling back to nftables, a failed apply retried, a
/// bad manifest, localnet and PodInfo calls (one rate-limited), health
/// checks. In private network and mount namespaces, so nothing on the
/// host changes.
fn families_of_a_busy_daemon() -> BTreeSet<String> {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    std::fs::write(
        manifests.join("web.yaml"),
        format!(
            "{}---\n{}",
            common::service("prod", "web", "10.96.0.10"),
            common::slice("prod", "web", &["10.244.2.1"])
        ),
    )
    .unwrap();
    std::fs::write(manifests.join("broken.yaml"), "kind: Service\n  bad: [\n").unwrap();
    let scrape = r#"
import sys, time, urllib.request
def get(url):
    try:
        return urllib.request.urlopen(url, timeout=2).read().decode()
    except Exception as e:
        return ""
for _ in range(200):
    page = get("http://127.0.0.1:10249/metrics")
    if "kubeproxy_network_programming_duration_seconds_bucket" in page and \
       "ebpf_kube_proxy_datapath_apply_errors_total{" in page and \
       "\nkubeproxy_sync_proxy_rules_last_timestamp_seconds 0\n" not in page:
        break
    time.sleep(0.1)
get("http://127.0.0.1:10256/healthz")
get("http://127.0.0.1:10256/livez")
sys.stdout.write(get("http://127.0.0.1:10249/metrics"))
"#;
    let script = format!(
        r#"set -e
ip link set lo up
mount -t tmpfs none /run
EBPF_KUBE_PROXY_TEST_FORCE_EBPF_FAILURE=1 EBPF_KUBE_PROXY_TEST_FAIL_APPLIES=1 \
  {bin} --hostname-override=n1 --proxy-mode=auto --sync-period=1s \
  --source=file --manifests={m} --podinfo-qps=0.001 --podinfo-burst=1 2>{log} &
pid=$!
i=0
until {bin} localnet watch --once >/dev/null 2>&1; do
  i=$((i+1)); [ $i -lt 100 ] || break; sleep 0.1
done
{bin} podinfo list >/dev/null 2>&1 || true
{bin} podinfo list >/dev/null 2>&1 || true
# A change with the trigger-time annotation, after start (earlier ones
# are not measured), gives a network programming latency sample.
sleep 1.1
trigger=$(date -u +%Y-%m-%dT%H:%M:%SZ)
printf '%s\n' "apiVersion: discovery.k8s.io/v1" "kind: EndpointSlice" \
  "metadata: {{name: web-2, namespace: prod, labels: {{kubernetes.io/service-name: web}}, annotations: {{endpoints.kubernetes.io/last-change-trigger-time: '$trigger'}}}}" \
  "addressType: IPv4" "ports: [{{name: http, port: 8080, protocol: TCP}}]" \
  "endpoints: [{{addresses: [10.244.2.9], nodeName: n2, conditions: {{ready: true}}}}]" \
  > {m}/.slice.tmp
mv {m}/.slice.tmp {m}/slice-2.yaml
python3 -c '{scrape}'
kill $pid
"#,
        bin = common::BIN,
        m = manifests.display(),
        log = dir.path().join("daemon.log").display(),
        scrape = scrape.replace('\'', "\""),
    );
    let out = std::process::Command::new("unshare")
        .args(["--net", "--mount", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    let page = String::from_utf8_lossy(&out.stdout).into_owned();
    let log = std::fs::read_to_string(dir.path().join("daemon.log")).unwrap_or_default();
    assert!(
        page.contains("# TYPE"),
        "no /metrics page; stderr:\n{}\ndaemon log:\n{log}",
        String::from_utf8_lossy(&out.stderr)
    );
    page.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_dashboard_metric_is_on_a_running_daemons_metrics_page() {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("skipped: needs root for private network and mount namespaces");
        return;
    }
    let wanted = dashboard_metrics();
    assert!(
        wanted.len() >= 20,
        "too few metrics found in the dashboard: {wanted:?}"
    );
    let exported = families_of_a_busy_daemon();
    let missing: Vec<&String> = wanted.difference(&exported).collect();
    // The eBPF programs' counters exist on the eBPF datapath only; the e2e
    // conformance run checks them there ("[sig-network] Networking Granular
    // Checks: Services should function for node-Service: http").
    assert_eq!(
        missing,
        ["ebpf_kube_proxy_datapath_connections_total"],
        "dashboard metrics the daemon does not export (it exports {exported:?})"
    );
}
