//! Service, EndpointSlice and Pod manifests, written as YAML the way
//! operators write them (flow mappings, one document each), for the file
//! source and the e2e suite.

/// (name, protocol, port, targetPort).
pub type PortSpec = (&'static str, &'static str, u16, u16);

/// The usual single port: `http`, TCP 80 → 8080.
pub const HTTP: &[PortSpec] = &[("http", "TCP", 80, 8080)];

/// A Service. Start from [`Svc::new`] and override fields with struct
/// update syntax; every field left alone is omitted from the manifest.
#[derive(Clone, Copy, Debug)]
pub struct Svc<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// `""`: ClusterIP (the default); `NodePort`, `LoadBalancer`.
    pub kind: &'a str,
    /// `spec.clusterIP`; `None` as for a headless Service.
    pub cluster_ip: &'a str,
    pub ports: &'a [PortSpec],
    /// One per port, in order; empty: none.
    pub node_ports: &'a [u16],
    pub external_ips: &'a [&'a str],
    /// `status.loadBalancer.ingress[].ip`.
    pub lb_ips: &'a [&'a str],
    /// `metadata.creationTimestamp`, RFC 3339; `""`: unset.
    pub created: &'a str,
    /// Further `spec` lines, each `key: value` (two-space indented by the
    /// builder), e.g. `externalTrafficPolicy: Local`.
    pub spec: &'a [&'a str],
}

impl<'a> Svc<'a> {
    /// A ClusterIP Service `namespace/name` at `cluster_ip` with [`HTTP`].
    pub const fn new(namespace: &'a str, name: &'a str, cluster_ip: &'a str) -> Self {
        Svc {
            namespace,
            name,
            kind: "",
            cluster_ip,
            ports: HTTP,
            node_ports: &[],
            external_ips: &[],
            lb_ips: &[],
            created: "",
            spec: &[],
        }
    }

    /// The manifest.
    pub fn yaml(&self) -> String {
        let mut meta = format!("name: {}, namespace: {}", self.name, self.namespace);
        if !self.created.is_empty() {
            meta.push_str(&format!(", creationTimestamp: \"{}\"", self.created));
        }
        let mut y = format!("apiVersion: v1\nkind: Service\nmetadata: {{{meta}}}\nspec:\n");
        if !self.kind.is_empty() {
            y.push_str(&format!("  type: {}\n", self.kind));
        }
        y.push_str(&format!("  clusterIP: {}\n", self.cluster_ip));
        if !self.external_ips.is_empty() {
            y.push_str(&format!("  externalIPs: [{}]\n", quoted(self.external_ips)));
        }
        for line in self.spec {
            y.push_str(&format!("  {line}\n"));
        }
        y.push_str("  ports:\n");
        for (i, (name, proto, port, target)) in self.ports.iter().enumerate() {
            let node_port = self
                .node_ports
                .get(i)
                .map(|n| format!(", nodePort: {n}"))
                .unwrap_or_default();
            y.push_str(&format!(
                "  - {{name: {name:?}, protocol: {proto}, port: {port}, targetPort: {target}{node_port}}}\n"
            ));
        }
        if !self.lb_ips.is_empty() {
            y.push_str("status:\n  loadBalancer:\n    ingress:\n");
            for ip in self.lb_ips {
                y.push_str(&format!("    - {{ip: \"{ip}\"}}\n"));
            }
        }
        y
    }
}

fn quoted(items: &[&str]) -> String {
    items
        .iter()
        .map(|i| format!("\"{i}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One endpoint of a slice.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub address: String,
    pub node: String,
    /// The flow mapping of `conditions`, e.g. `{ready: true}`.
    pub conditions: String,
    /// `targetRef` Pod name in the slice's namespace; `None`: no targetRef.
    pub pod: Option<String>,
}

impl Endpoint {
    /// A ready endpoint at `address` on `node`.
    pub fn ready(address: &str, node: &str) -> Self {
        Endpoint {
            address: address.to_owned(),
            node: node.to_owned(),
            conditions: "{ready: true}".to_owned(),
            pod: None,
        }
    }
}

/// The EndpointSlice `<service>-<suffix>` of `svc` (its ports' target
/// ports), of family IPv6 when `v6`.
pub fn slice_yaml(svc: &Svc, suffix: &str, v6: bool, endpoints: &[Endpoint]) -> String {
    let mut y = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: {name}-{suffix}, namespace: {ns}, labels: {{kubernetes.io/service-name: {name}}}}}\n\
         addressType: {}\nports:\n",
        if v6 { "IPv6" } else { "IPv4" },
        name = svc.name,
        ns = svc.namespace,
    );
    for (name, proto, _, target) in svc.ports {
        y.push_str(&format!(
            "- {{name: {name:?}, protocol: {proto}, port: {target}}}\n"
        ));
    }
    y.push_str(if endpoints.is_empty() {
        "endpoints: []\n"
    } else {
        "endpoints:\n"
    });
    for e in endpoints {
        let target = e
            .pod
            .as_ref()
            .map(|p| {
                format!(
                    ", targetRef: {{kind: Pod, namespace: {}, name: {p}}}",
                    svc.namespace
                )
            })
            .unwrap_or_default();
        y.push_str(&format!(
            "- {{addresses: [\"{}\"], nodeName: {}, conditions: {}{target}}}\n",
            e.address, e.node, e.conditions
        ));
    }
    y
}

/// A Pod manifest; `conditions` are (type, status, reason) in status order.
pub fn pod_yaml(ns: &str, name: &str, node: &str, conditions: &[(&str, &str, &str)]) -> String {
    let mut s = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}, uid: uid-{name}}}\n\
         spec: {{nodeName: {node}, containers: []}}\nstatus:\n  conditions:\n"
    );
    for (t, status, reason) in conditions {
        s.push_str(&format!(
            "  - {{type: {t}, status: \"{status}\", reason: \"{reason}\", lastTransitionTime: \"2024-05-01T10:00:00Z\"}}\n"
        ));
    }
    s
}

/// Documents joined into one multi-document file.
pub fn docs(parts: &[String]) -> String {
    parts.join("---\n")
}
