//! The Prometheus families of `/metrics` (SPEC §5) and `/metrics/slis`
//! (SPEC §3.3): kube-proxy's names, help texts, labels and buckets, plus the
//! `ebpf_kube_proxy_*` extension families this build has data for.
//!
//! Families are registered once; callers set values through [`Metrics`].
//! Exposition is the `prometheus` crate's text format 0.0.4.

use prometheus::core::Collector;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::model::{IpFamily, LocalState, TrafficPolicy};

/// `Content-Type` of the text exposition format.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// kube-proxy families carry the stability prefix of component-base.
fn alpha(help: &str) -> String {
    format!("[ALPHA] {help}")
}

/// Every family the daemon exports.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    sli_registry: Registry,

    pub sync_duration: HistogramVec,
    pub last_timestamp: GaugeVec,
    pub last_queued_timestamp: GaugeVec,
    pub network_programming: HistogramVec,
    pub endpoint_changes_pending: IntGauge,
    pub endpoint_changes_total: IntCounter,
    pub service_changes_pending: IntGauge,
    pub service_changes_total: IntCounter,
    pub no_local_endpoints: IntGaugeVec,
    pub proxy_healthz_total: IntCounterVec,
    pub proxy_livez_total: IntCounterVec,

    pub healthcheck: IntGaugeVec,
    pub healthchecks_total: IntCounterVec,

    pub build_info: IntGaugeVec,
    pub datapath_mode: IntGaugeVec,
    pub datapath_fallbacks: IntCounterVec,
    pub datapath_apply_errors: IntCounterVec,
    pub datapath_map_entries: IntGaugeVec,
    pub address_conflicts: IntGauge,
    pub localstate_revision: IntGauge,
    pub localstate_timestamp: Gauge,
    pub datapath_revision: IntGauge,
    pub localstate_services: IntGauge,
    pub localstate_endpoints: IntGauge,
    pub source_synced: IntGaugeVec,
    pub source_errors: IntCounterVec,
    pub rejected_objects: IntCounterVec,
}

fn register<C: Collector + Clone + 'static>(
    registry: &Registry,
    collector: C,
) -> Result<C, prometheus::Error> {
    registry.register(Box::new(collector.clone()))?;
    Ok(collector)
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let sli_registry = Registry::new();
        let r = &registry;

        // 0.001 · 2^k, k = 0..14: 1 ms … 16.384 s.
        let sync_buckets = prometheus::exponential_buckets(0.001, 2.0, 15)?;
        // 0.25, 0.5, 1…59, 60…115 (5), 120…300 (30), as upstream.
        let mut programming_buckets = prometheus::linear_buckets(0.25, 0.25, 2)?;
        programming_buckets.extend(prometheus::linear_buckets(1.0, 1.0, 59)?);
        programming_buckets.extend(prometheus::linear_buckets(60.0, 5.0, 12)?);
        programming_buckets.extend(prometheus::linear_buckets(120.0, 30.0, 7)?);

        let family = &["ip_family"];
        let sync_duration = register(
            r,
            HistogramVec::new(
                HistogramOpts::new(
                    "kubeproxy_sync_proxy_rules_duration_seconds",
                    alpha("SyncProxyRules latency in seconds"),
                )
                .buckets(sync_buckets),
                family,
            )?,
        )?;
        let last_timestamp = register(
            r,
            GaugeVec::new(
                Opts::new(
                    "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                    alpha("The last time proxy rules were successfully synced"),
                ),
                family,
            )?,
        )?;
        let last_queued_timestamp = register(
            r,
            GaugeVec::new(
                Opts::new(
                    "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                    alpha("The last time a sync of proxy rules was queued"),
                ),
                family,
            )?,
        )?;
        let network_programming = register(
            r,
            HistogramVec::new(
                HistogramOpts::new(
                    "kubeproxy_network_programming_duration_seconds",
                    alpha("In Cluster Network Programming Latency in seconds"),
                )
                .buckets(programming_buckets),
                family,
            )?,
        )?;
        let endpoint_changes_pending = register(
            r,
            IntGauge::new(
                "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                alpha("Pending proxy rules Endpoint changes"),
            )?,
        )?;
        let endpoint_changes_total = register(
            r,
            IntCounter::new(
                "kubeproxy_sync_proxy_rules_endpoint_changes_total",
                alpha("Cumulative proxy rules Endpoint changes"),
            )?,
        )?;
        let service_changes_pending = register(
            r,
            IntGauge::new(
                "kubeproxy_sync_proxy_rules_service_changes_pending",
                alpha("Pending proxy rules Service changes"),
            )?,
        )?;
        let service_changes_total = register(
            r,
            IntCounter::new(
                "kubeproxy_sync_proxy_rules_service_changes_total",
                alpha("Cumulative proxy rules Service changes"),
            )?,
        )?;
        let no_local_endpoints = register(
            r,
            IntGaugeVec::new(
                Opts::new(
                    "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                    alpha("Number of services with a Local traffic policy and no endpoints"),
                ),
                &["ip_family", "traffic_policy"],
            )?,
        )?;
        let proxy_healthz_total = register(
            r,
            IntCounterVec::new(
                Opts::new(
                    "kubeproxy_proxy_healthz_total",
                    alpha("Cumulative proxy healthz HTTP status"),
                ),
                &["code"],
            )?,
        )?;
        let proxy_livez_total = register(
            r,
            IntCounterVec::new(
                Opts::new(
                    "kubeproxy_proxy_livez_total",
                    alpha("Cumulative proxy livez HTTP status"),
                ),
                &["code"],
            )?,
        )?;

        // Health SLIs: on /metrics and alone on /metrics/slis.
        let healthcheck = register(
            r,
            IntGaugeVec::new(
                Opts::new(
                    "kubernetes_healthcheck",
                    "[STABLE] This metric records the result of a single healthcheck.",
                ),
                &["name", "type"],
            )?,
        )?;
        let healthchecks_total = register(
            r,
            IntCounterVec::new(
                Opts::new(
                    "kubernetes_healthchecks_total",
                    "[STABLE] This metric records the results of all healthcheck.",
                ),
                &["name", "status", "type"],
            )?,
        )?;
        register(&sli_registry, healthcheck.clone())?;
        register(&sli_registry, healthchecks_total.clone())?;

        let build_info = register(
            r,
            IntGaugeVec::new(
                Opts::new(
                    "ebpf_kube_proxy_build_info",
                    alpha("Build information of ebpf-kube-proxy; the value is always 1"),
                ),
                &["version", "rustc_version", "git_commit"],
            )?,
        )?;
        let datapath_mode = register(
            r,
            IntGaugeVec::new(
                Opts::new(
                    "ebpf_kube_proxy_datapath_mode",
                    alpha("The active datapath (mode) and the requested --proxy-mode; 1 on the active mode"),
                ),
                &["mode", "requested"],
            )?,
        )?;
        let datapath_fallbacks = register(
            r,
            IntCounterVec::new(
                Opts::new(
                    "ebpf_kube_proxy_datapath_fallbacks_total",
                    alpha(
                        "Times --proxy-mode auto fell back from one datapath to another, by reason",
                    ),
                ),
                &["from", "to", "reason"],
            )?,
        )?;
        let datapath_apply_errors = register(
            r,
            IntCounterVec::new(
                Opts::new(
                    "ebpf_kube_proxy_datapath_apply_errors_total",
                    alpha("Cumulative failed datapath applies"),
                ),
                &["mode"],
            )?,
        )?;
        let datapath_map_entries = register(
            r,
            IntGaugeVec::new(
                Opts::new(
                    "ebpf_kube_proxy_datapath_map_entries",
                    alpha("Entries per datapath map after the last apply"),
                ),
                &["map"],
            )?,
        )?;
        let address_conflicts = register(
            r,
            IntGauge::new(
                "ebpf_kube_proxy_address_conflicts",
                alpha("Service frontends (IP, protocol, port) not programmed because an older service claims the same one"),
            )?,
        )?;
        let localstate_revision = register(
            r,
            IntGauge::new(
                "ebpf_kube_proxy_localstate_revision",
                alpha("Revision of the published LocalState; 0 until the sources have synced"),
            )?,
        )?;
        let localstate_timestamp = register(
            r,
            Gauge::new(
                "ebpf_kube_proxy_localstate_timestamp_seconds",
                alpha("The time the published LocalState revision was computed (Unix seconds)"),
            )?,
        )?;
        let datapath_revision = register(
            r,
            IntGauge::new(
                "ebpf_kube_proxy_datapath_revision",
                alpha("Revision of the LocalState the datapath last finished programming; 0 until the first apply"),
            )?,
        )?;
        let localstate_services = register(
            r,
            IntGauge::new(
                "ebpf_kube_proxy_localstate_services",
                alpha("Services in the published LocalState"),
            )?,
        )?;
        let localstate_endpoints = register(
            r,
            IntGauge::new(
                "ebpf_kube_proxy_localstate_endpoints",
                alpha("Endpoints in the published LocalState"),
            )?,
        )?;
        let source_synced = register(
            r,
            IntGaugeVec::new(
                Opts::new(
                    "ebpf_kube_proxy_source_synced",
                    alpha("1 once the source has finished the initial list of the resource"),
                ),
                &["source", "resource"],
            )?,
        )?;
        let source_errors = register(
            r,
            IntCounterVec::new(
                Opts::new(
                    "ebpf_kube_proxy_source_errors_total",
                    alpha("Cumulative errors of the sources by reason"),
                ),
                &["source", "reason"],
            )?,
        )?;
        let rejected_objects = register(
            r,
            IntCounterVec::new(
                Opts::new(
                    "ebpf_kube_proxy_rejected_objects_total",
                    alpha("Objects a source refused, each keeping its last good version, by reason: invalid_object (a value the API server would refuse), undecodable (a field of the wrong type), invalid_manifest (a manifest document that is not YAML/JSON or not a mapping)"),
                ),
                &["source", "reason"],
            )?,
        )?;

        #[cfg(target_os = "linux")]
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;

        Ok(Metrics {
            registry,
            sli_registry,
            sync_duration,
            last_timestamp,
            last_queued_timestamp,
            network_programming,
            endpoint_changes_pending,
            endpoint_changes_total,
            service_changes_pending,
            service_changes_total,
            no_local_endpoints,
            proxy_healthz_total,
            proxy_livez_total,
            healthcheck,
            healthchecks_total,
            build_info,
            datapath_mode,
            datapath_fallbacks,
            datapath_apply_errors,
            datapath_map_entries,
            address_conflicts,
            localstate_revision,
            localstate_timestamp,
            datapath_revision,
            localstate_services,
            localstate_endpoints,
            source_synced,
            source_errors,
            rejected_objects,
        })
    }

    /// The `/metrics` registry, for components that own their families
    /// (the PodInfo server registers its `pod_info_*` families here).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// `/metrics`.
    pub fn encode_all(&self) -> Vec<u8> {
        encode(&self.registry)
    }

    /// `/metrics/slis`.
    pub fn encode_slis(&self) -> Vec<u8> {
        encode(&self.sli_registry)
    }

    /// `DELETE /metrics/slis`.
    pub fn reset_slis(&self) {
        self.healthcheck.reset();
        self.healthchecks_total.reset();
    }

    /// One series per family of the per-family histograms.
    pub fn sync_duration_for(&self, f: IpFamily) -> Histogram {
        self.sync_duration.with_label_values(&[f.as_str()])
    }

    /// Sets the per-family no-local-endpoints gauges from a programmed state.
    pub fn set_no_local_endpoints(&self, state: &LocalState, families: &[IpFamily]) {
        let counts = no_local_endpoints(state);
        for f in families {
            let (internal, external) = counts.get(f).copied().unwrap_or_default();
            let set = |policy: &str, n: i64| {
                self.no_local_endpoints
                    .with_label_values(&[f.as_str(), policy])
                    .set(n);
            };
            set("internal", internal);
            set("external", external);
        }
    }
}

fn encode(registry: &Registry) -> Vec<u8> {
    let mut out = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&registry.gather(), &mut out) {
        // Only a collector producing inconsistent families can cause this.
        tracing::error!(error = %e, "encoding metrics failed");
    }
    out
}

/// Per family: service ports whose internal (resp. external) traffic policy
/// is Local, that have endpoints, but none usable locally — what kube-proxy
/// counts while it writes its "has no local endpoints" drop rules.
pub fn no_local_endpoints(state: &LocalState) -> std::collections::BTreeMap<IpFamily, (i64, i64)> {
    let mut counts = std::collections::BTreeMap::new();
    // Only a Local policy counts: the rest (most services) cost a glance,
    // not a walk over their endpoints, on every apply.
    let local = |svc: &&std::sync::Arc<crate::model::ServiceEndpoints>| {
        svc.service.internal_traffic_policy == TrafficPolicy::Local
            || svc.service.external_traffic_policy == TrafficPolicy::Local
    };
    for svc in state.services.iter().filter(local) {
        for port in &svc.service.ports {
            for family in [IpFamily::V4, IpFamily::V6] {
                let backing = svc
                    .endpoints
                    .iter()
                    .filter(|e| IpFamily::of(&e.ip) == family)
                    .flat_map(|e| {
                        e.ports
                            .iter()
                            .filter(|p| p.name == port.name && p.protocol == port.protocol)
                            .map(move |p| (e.conditions, p.scopes))
                    });
                let (mut any, mut internal, mut external) = (false, false, false);
                for (c, s) in backing {
                    // Usable anywhere in the cluster (kube-proxy's
                    // hasAnyEndpoints): ready, or serving while terminating.
                    // Not the scopes: an iTP=Local ClusterIP service uses
                    // no cluster scope at all.
                    any |= c.ready || (c.serving && c.terminating);
                    internal |= s.internal;
                    external |= s.external;
                }
                if !any {
                    continue;
                }
                let entry: &mut (i64, i64) = counts.entry(family).or_default();
                if svc.service.internal_traffic_policy == TrafficPolicy::Local && !internal {
                    entry.0 += 1;
                }
                if svc.service.external_traffic_policy == TrafficPolicy::Local && !external {
                    entry.1 += 1;
                }
            }
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(m: &Metrics) -> String {
        String::from_utf8(m.encode_all()).unwrap()
    }

    #[test]
    fn families_register_without_conflicts() {
        let m = Metrics::new().unwrap();
        m.service_changes_total.inc();
        let t = text(&m);
        assert!(
            t.contains(
                "# HELP kubeproxy_sync_proxy_rules_service_changes_total [ALPHA] Cumulative proxy rules Service changes\n\
                 # TYPE kubeproxy_sync_proxy_rules_service_changes_total counter\n\
                 kubeproxy_sync_proxy_rules_service_changes_total 1\n"
            ),
            "{t}"
        );
    }

    #[test]
    fn sli_exposition_matches_the_spec_example() {
        let m = Metrics::new().unwrap();
        for (name, ok) in [
            ("ping", true),
            ("informer-sync", false),
            ("datapath-synced", true),
            ("localnet", true),
            ("shutdown", true),
        ] {
            m.healthcheck
                .with_label_values(&[name, "readyz"])
                .set(i64::from(ok));
            let status = if ok { "success" } else { "error" };
            m.healthchecks_total
                .with_label_values(&[name, status, "readyz"])
                .inc();
        }
        let slis = String::from_utf8(m.encode_slis()).unwrap();
        assert_eq!(
            slis,
            "# HELP kubernetes_healthcheck [STABLE] This metric records the result of a single healthcheck.\n\
             # TYPE kubernetes_healthcheck gauge\n\
             kubernetes_healthcheck{name=\"datapath-synced\",type=\"readyz\"} 1\n\
             kubernetes_healthcheck{name=\"informer-sync\",type=\"readyz\"} 0\n\
             kubernetes_healthcheck{name=\"localnet\",type=\"readyz\"} 1\n\
             kubernetes_healthcheck{name=\"ping\",type=\"readyz\"} 1\n\
             kubernetes_healthcheck{name=\"shutdown\",type=\"readyz\"} 1\n\
             # HELP kubernetes_healthchecks_total [STABLE] This metric records the results of all healthcheck.\n\
             # TYPE kubernetes_healthchecks_total counter\n\
             kubernetes_healthchecks_total{name=\"datapath-synced\",status=\"success\",type=\"readyz\"} 1\n\
             kubernetes_healthchecks_total{name=\"informer-sync\",status=\"error\",type=\"readyz\"} 1\n\
             kubernetes_healthchecks_total{name=\"localnet\",status=\"success\",type=\"readyz\"} 1\n\
             kubernetes_healthchecks_total{name=\"ping\",status=\"success\",type=\"readyz\"} 1\n\
             kubernetes_healthchecks_total{name=\"shutdown\",status=\"success\",type=\"readyz\"} 1\n"
        );
        m.reset_slis();
        assert_eq!(m.encode_slis(), b"");
        assert!(!text(&m).contains("kubernetes_health"));
    }

    #[test]
    fn local_policy_ports_with_only_remote_endpoints_are_counted() {
        use crate::model::{compute, Change, ClusterState, NodeContext};
        let manifest = "\
apiVersion: v1
kind: Service
metadata: {name: local, namespace: ns}
spec:
  type: NodePort
  clusterIP: 10.96.0.1
  internalTrafficPolicy: Local
  externalTrafficPolicy: Local
  ports: [{name: a, port: 80, nodePort: 30080}, {name: b, port: 81, nodePort: 30081}]
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: ns}
spec: {clusterIP: 10.96.0.2, internalTrafficPolicy: Local, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: itp, namespace: ns}
spec: {clusterIP: 10.96.0.4, internalTrafficPolicy: Local, ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: itp-1, namespace: ns, labels: {kubernetes.io/service-name: itp}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.2.3], nodeName: n2, conditions: {ready: true}}]
---
apiVersion: v1
kind: Service
metadata: {name: cluster, namespace: ns}
spec: {clusterIP: 10.96.0.3, ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: local-1, namespace: ns, labels: {kubernetes.io/service-name: local}}
addressType: IPv4
ports: [{name: a, port: 8080}, {name: b, port: 8081}]
endpoints: [{addresses: [10.244.2.1], nodeName: n2, conditions: {ready: true}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: cluster-1, namespace: ns, labels: {kubernetes.io/service-name: cluster}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.2.2], nodeName: n2, conditions: {ready: true}}]
";
        let mut cluster = ClusterState::default();
        for o in
            crate::sources::file::parse_manifest(std::path::Path::new("m.yaml"), manifest).unwrap()
        {
            cluster.apply(Change::Upsert(o));
        }
        let node = NodeContext {
            node_name: "n1".to_owned(),
            synthesize_hints: false,
        };
        let state = compute(&cluster, &node);
        // Two ports of `local`, both policies, and the ClusterIP-only
        // `itp` (internal); `empty` has no endpoints at all and `cluster`
        // is not Local.
        assert_eq!(
            no_local_endpoints(&state),
            [(IpFamily::V4, (3, 2))].into_iter().collect()
        );

        let m = Metrics::new().unwrap();
        m.set_no_local_endpoints(&state, &[IpFamily::V4, IpFamily::V6]);
        let t = text(&m);
        for line in [
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv4\",traffic_policy=\"external\"} 2\n",
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv4\",traffic_policy=\"internal\"} 3\n",
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv6\",traffic_policy=\"internal\"} 0\n",
        ] {
            assert!(t.contains(line), "{line} missing in\n{t}");
        }
    }

    #[test]
    fn sync_duration_buckets_double_from_one_millisecond() {
        let m = Metrics::new().unwrap();
        m.sync_duration_for(IpFamily::V4).observe(0.002);
        let t = text(&m);
        let les: Vec<&str> = t
            .lines()
            .filter(|l| l.starts_with("kubeproxy_sync_proxy_rules_duration_seconds_bucket"))
            .map(|l| l.split("le=\"").nth(1).unwrap().split('"').next().unwrap())
            .collect();
        assert_eq!(
            les,
            [
                "0.001", "0.002", "0.004", "0.008", "0.016", "0.032", "0.064", "0.128", "0.256",
                "0.512", "1.024", "2.048", "4.096", "8.192", "16.384", "+Inf"
            ]
        );
    }
}
