//! The PodInfo families of `/metrics` (SPEC §7.4): kubelet's
//! `pod_info_endpoint_*` counters (without the `kubelet_` prefix, and with
//! the KEP's `pod_resources_info_requests_get` typo fixed) plus our rate
//! limit counter and open-watch gauge. Every series carries
//! `server_api_version="v1alpha1"` and exists from start-up at 0, so a
//! dashboard sees the families before the first call.

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// The `server_api_version` label value.
pub const API_VERSION: &str = "v1alpha1";

/// The three RPCs, for the per-method counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    List,
    Get,
    Watch,
}

/// Per-method request and error counters.
#[derive(Clone, Debug)]
struct MethodCounters {
    requests: IntCounter,
    errors: IntCounter,
}

/// Handles on the registered series.
#[derive(Clone, Debug)]
pub struct PodInfoMetrics {
    requests_total: IntCounter,
    list: MethodCounters,
    get: MethodCounters,
    watch: MethodCounters,
    rate_limited: IntCounter,
    watch_streams: IntGauge,
}

fn alpha(help: &str) -> String {
    format!("[ALPHA] {help}")
}

fn counter(registry: &Registry, name: &str, help: &str) -> Result<IntCounter, prometheus::Error> {
    let vec = IntCounterVec::new(Opts::new(name, alpha(help)), &["server_api_version"])?;
    registry.register(Box::new(vec.clone()))?;
    Ok(vec.with_label_values(&[API_VERSION]))
}

impl PodInfoMetrics {
    /// Registers the families in `registry` (the status server's
    /// `/metrics` registry in the daemon).
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let r = registry;
        let method = |name: &str| -> Result<MethodCounters, prometheus::Error> {
            Ok(MethodCounters {
                requests: counter(
                    r,
                    &format!("pod_info_endpoint_requests_{name}"),
                    &format!("Number of requests to the PodInfo {name} endpoint."),
                )?,
                errors: counter(
                    r,
                    &format!("pod_info_endpoint_errors_{name}"),
                    &format!(
                        "Number of requests to the PodInfo {name} endpoint which returned an error."
                    ),
                )?,
            })
        };
        let requests_total = counter(
            r,
            "pod_info_endpoint_requests_total",
            "Cumulative number of requests to the PodInfo endpoint.",
        )?;
        let (list, get, watch) = (method("list")?, method("get")?, method("watch")?);
        let rate_limited = counter(
            r,
            "pod_info_endpoint_rate_limited_total",
            "Number of PodInfo requests rejected by the per-client rate limit.",
        )?;
        let gauge = IntGaugeVec::new(
            Opts::new(
                "pod_info_watch_streams",
                alpha("Number of open PodInfo watch streams."),
            ),
            &["server_api_version"],
        )?;
        registry.register(Box::new(gauge.clone()))?;
        let watch_streams = gauge.with_label_values(&[API_VERSION]);
        Ok(Self {
            requests_total,
            list,
            get,
            watch,
            rate_limited,
            watch_streams,
        })
    }

    fn method(&self, m: Method) -> &MethodCounters {
        match m {
            Method::List => &self.list,
            Method::Get => &self.get,
            Method::Watch => &self.watch,
        }
    }

    /// One RPC arrived (counted before any check, so rejected calls count).
    pub fn requested(&self, m: Method) {
        self.requests_total.inc();
        self.method(m).requests.inc();
    }

    /// An RPC (or an open watch stream) ended with a non-OK status.
    pub fn failed(&self, m: Method) {
        self.method(m).errors.inc();
    }

    pub fn rate_limited(&self) {
        self.rate_limited.inc();
    }

    pub fn watch_opened(&self) {
        self.watch_streams.inc();
    }

    pub fn watch_closed(&self) {
        self.watch_streams.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(r: &Registry) -> String {
        let mut out = Vec::new();
        prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &r.gather(), &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn every_family_is_exposed_with_its_label_and_alpha_help() {
        let r = Registry::new();
        let m = PodInfoMetrics::register(&r).unwrap();
        m.requested(Method::Get);
        m.failed(Method::Get);
        m.requested(Method::Watch);
        m.watch_opened();
        m.rate_limited();
        let t = text(&r);
        for line in [
            "# HELP pod_info_endpoint_requests_total [ALPHA] Cumulative number of requests to the PodInfo endpoint.\n",
            "# TYPE pod_info_endpoint_requests_total counter\n",
            "pod_info_endpoint_requests_total{server_api_version=\"v1alpha1\"} 2\n",
            "pod_info_endpoint_requests_list{server_api_version=\"v1alpha1\"} 0\n",
            "pod_info_endpoint_requests_get{server_api_version=\"v1alpha1\"} 1\n",
            "pod_info_endpoint_requests_watch{server_api_version=\"v1alpha1\"} 1\n",
            "pod_info_endpoint_errors_list{server_api_version=\"v1alpha1\"} 0\n",
            "# HELP pod_info_endpoint_errors_get [ALPHA] Number of requests to the PodInfo get endpoint which returned an error.\n",
            "pod_info_endpoint_errors_get{server_api_version=\"v1alpha1\"} 1\n",
            "pod_info_endpoint_errors_watch{server_api_version=\"v1alpha1\"} 0\n",
            "pod_info_endpoint_rate_limited_total{server_api_version=\"v1alpha1\"} 1\n",
            "# TYPE pod_info_watch_streams gauge\n",
            "pod_info_watch_streams{server_api_version=\"v1alpha1\"} 1\n",
        ] {
            assert!(t.contains(line), "{line:?} missing in\n{t}");
        }
        m.watch_closed();
        assert!(text(&r).contains("pod_info_watch_streams{server_api_version=\"v1alpha1\"} 0\n"));
        // A second registration in the same registry is a conflict.
        assert!(PodInfoMetrics::register(&r).is_err());
    }
}
