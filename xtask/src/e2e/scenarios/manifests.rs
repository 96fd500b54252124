//! Manifests the scenarios write: Services and their EndpointSlices.

use anyhow::Result;

use super::Bed;

/// (name, protocol, port, targetPort).
pub(super) type PortSpec = (&'static str, &'static str, u16, u16);

pub(super) struct Svc<'a> {
    pub(super) name: &'a str,
    pub(super) cluster_ip: &'a str,
    pub(super) ports: &'a [PortSpec],
    pub(super) extra_spec: &'a str,
}

pub(super) fn service_yaml(s: &Svc) -> String {
    let mut y = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {}, namespace: e2e}}\nspec:\n  clusterIP: {}\n{}  ports:\n",
        s.name, s.cluster_ip, s.extra_spec
    );
    for (name, proto, port, target) in s.ports {
        y.push_str(&format!(
            "  - {{name: {name:?}, protocol: {proto}, port: {port}, targetPort: {target}}}\n"
        ));
    }
    y
}

/// One slice of `svc` with the given pods (index into bed.pods, node name).
pub(super) fn slice_yaml(bed: &Bed, svc: &Svc, v6: bool, members: &[(usize, &str)]) -> String {
    let mut y = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: {}-{}, namespace: e2e, labels: {{kubernetes.io/service-name: {}}}}}\n\
         addressType: {}\nports:\n",
        svc.name,
        if v6 { "v6" } else { "v4" },
        svc.name,
        if v6 { "IPv6" } else { "IPv4" }
    );
    for (name, proto, _, target) in svc.ports {
        y.push_str(&format!(
            "- {{name: {name:?}, protocol: {proto}, port: {target}}}\n"
        ));
    }
    y.push_str(if members.is_empty() {
        "endpoints: []\n"
    } else {
        "endpoints:\n"
    });
    for (i, node) in members {
        let pod = &bed.pods[*i];
        let addr = if v6 { &pod.ipv6 } else { &pod.ipv4 };
        y.push_str(&format!(
            "- {{addresses: [\"{addr}\"], nodeName: {node}, conditions: {{ready: true}}, targetRef: {{kind: Pod, namespace: e2e, name: {}}}}}\n",
            pod.name
        ));
    }
    y
}

/// Writes `svc` and one EndpointSlice of it with `members` as the
/// scenario's manifests.
pub(super) fn apply_service(
    bed: &Bed,
    svc: &Svc,
    v6: bool,
    members: &[(usize, &str)],
) -> Result<()> {
    bed.apply_manifests(&docs(&[
        service_yaml(svc),
        slice_yaml(bed, svc, v6, members),
    ]))
}

pub(super) fn docs(parts: &[String]) -> String {
    parts.join("---\n")
}

pub(super) const WEB: Svc = Svc {
    name: "web",
    cluster_ip: "10.96.0.10",
    ports: &[("http", "TCP", 80, 8080)],
    extra_spec: "",
};

pub(super) fn three_pods() -> [(usize, &'static str); 3] {
    [(0, "node-1"), (1, "node-2"), (2, "node-3")]
}
