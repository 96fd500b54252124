//! Server reflection and `grpc.health.v1` beside each gRPC API (SPEC §10.6),
//! so `grpcurl -plaintext -unix SOCKET list|describe` works without proto
//! files and probes can ask whether the API is ready.
//!
//! Health, per server: for `""` and the API's full service name,
//! `NOT_SERVING` until the server has something to serve (the first
//! published state for localnet, the synced pod cache for PodInfo), then
//! `SERVING`, and `NOT_SERVING` again from SIGTERM on; any other name is
//! `NOT_FOUND` (tonic-health's answer for names it was never told about).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tonic::server::NamedService;
use tonic::service::Routes;
use tonic_health::server::{HealthReporter, HealthService};
use tonic_health::ServingStatus;

/// The health of one API, shared by the listeners that serve it.
#[derive(Clone)]
pub struct Discovery {
    service: &'static str,
    reporter: HealthReporter,
    stopped: Arc<AtomicBool>,
}

impl Discovery {
    /// Health for the API named `service` (e.g. `localnet.v1.Endpoints`),
    /// `NOT_SERVING` until [`Discovery::serving`].
    pub async fn new(service: &'static str) -> Self {
        let d = Self {
            service,
            reporter: HealthReporter::new(),
            stopped: Arc::new(AtomicBool::new(false)),
        };
        d.set(ServingStatus::NotServing).await;
        d
    }

    /// The API has something to serve; ignored once stopped.
    pub async fn serving(&self) {
        if !self.stopped.load(Ordering::SeqCst) {
            self.set(ServingStatus::Serving).await;
        }
    }

    /// SIGTERM: `NOT_SERVING` for good.
    pub async fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.set(ServingStatus::NotServing).await;
    }

    async fn set(&self, status: ServingStatus) {
        for name in ["", self.service] {
            self.reporter.set_service_status(name, status).await;
        }
    }

    /// `api` with health and reflection (v1 and v1alpha) beside it.
    /// Reflection lists these three services, described from descriptors
    /// that keep the protos' comments.
    pub fn routes<S>(&self, api: S) -> Routes
    where
        S: tower::Service<
                http::Request<tonic::body::Body>,
                Response = http::Response<tonic::body::Body>,
                Error = std::convert::Infallible,
            > + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        debug_assert_eq!(S::NAME, self.service);
        let health = tonic_health::pb::health_server::HealthServer::new(
            HealthService::from_health_reporter(self.reporter.clone()),
        );
        let reflection = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
                .with_service_name(self.service)
                .with_service_name(HEALTH)
                .with_service_name(REFLECTION_V1)
        };
        // The descriptor sets are compiled in; the unit test below proves
        // they decode, so building cannot fail at run time.
        let v1 = reflection().build_v1().expect("compiled-in descriptors");
        let v1alpha = reflection()
            .build_v1alpha()
            .expect("compiled-in descriptors");
        Routes::new(api)
            .add_service(health)
            .add_service(v1)
            .add_service(v1alpha)
    }
}

const HEALTH: &str = "grpc.health.v1.Health";
const REFLECTION_V1: &str = "grpc.reflection.v1.ServerReflection";
