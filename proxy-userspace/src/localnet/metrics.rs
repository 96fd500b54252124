//! `ebpf_kube_proxy_localnet_clients{rpc}` (open streams, waiting polls
//! included) and `ebpf_kube_proxy_localnet_requests_total{rpc,code}`
//! (finished calls by gRPC status), SPEC §5.2.

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

#[derive(Clone, Debug)]
pub struct LocalnetMetrics {
    clients: IntGaugeVec,
    requests: IntCounterVec,
}

/// Counts one open call while it lives.
pub struct OpenCall {
    clients: IntGaugeVec,
    rpc: &'static str,
}

impl Drop for OpenCall {
    fn drop(&mut self) {
        self.clients.with_label_values(&[self.rpc]).dec();
    }
}

/// The canonical gRPC name of a status code (`DEADLINE_EXCEEDED`).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

impl LocalnetMetrics {
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let clients = IntGaugeVec::new(
            Opts::new(
                "ebpf_kube_proxy_localnet_clients",
                "[ALPHA] Open localnet calls (streams and waiting polls)",
            ),
            &["rpc"],
        )?;
        registry.register(Box::new(clients.clone()))?;
        let requests = IntCounterVec::new(
            Opts::new(
                "ebpf_kube_proxy_localnet_requests_total",
                "[ALPHA] Finished localnet calls by gRPC status",
            ),
            &["rpc", "code"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        for rpc in ["Next", "Watch"] {
            clients.with_label_values(&[rpc]);
        }
        Ok(LocalnetMetrics { clients, requests })
    }

    /// A call of `rpc` starts; it counts as open until the guard drops.
    pub fn open(&self, rpc: &'static str) -> OpenCall {
        self.clients.with_label_values(&[rpc]).inc();
        OpenCall {
            clients: self.clients.clone(),
            rpc,
        }
    }

    /// A call of `rpc` ended with `code`.
    pub fn finished(&self, rpc: &'static str, code: tonic::Code) {
        self.requests
            .with_label_values(&[rpc, code_name(code)])
            .inc();
    }
}
