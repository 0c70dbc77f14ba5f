//! What a node serves beside its processes for operators' tools: the standard gRPC health
//! service (`grpc.health.v1.Health`, for load balancers and `grpcurl ... Health/Check`) and
//! server reflection (`grpcurl list`). Both need a certificate of the cluster, as every
//! connection to a node does, and no token.

use tokio::sync::watch;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::server::HealthReporter;
use tonic_reflection::server::v1::{ServerReflection, ServerReflectionServer};
use tonic_reflection::server::v1alpha::{
    ServerReflection as ServerReflectionV1Alpha,
    ServerReflectionServer as ServerReflectionServerV1Alpha,
};

/// The health service of a node whose `serving` says whether it can do its job: the whole
/// server (`""`) and each of `services` (full gRPC names) are SERVING while it is true and
/// NOT_SERVING otherwise, from before the port serves. The reporting ends when `serving`'s
/// sender is dropped. Call it inside a tokio runtime.
pub async fn health_service(
    mut serving: watch::Receiver<bool>,
    services: &'static [&'static str],
) -> HealthServer<impl Health> {
    let (reporter, service) = tonic_health::server::health_reporter();
    async fn report(reporter: &HealthReporter, services: &[&str], serving: bool) {
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for name in std::iter::once(&"").chain(services) {
            reporter.set_service_status(name, status).await;
        }
    }
    // The reporter starts with "" SERVING: set the truth before anyone can ask.
    // Read into a local: a `Ref` held across the await would make this future not `Send`.
    let now = *serving.borrow_and_update();
    report(&reporter, services, now).await;
    tokio::spawn(async move {
        while serving.changed().await.is_ok() {
            let now = *serving.borrow_and_update();
            report(&reporter, services, now).await;
        }
    });
    service
}

/// gRPC server reflection (both `grpc.reflection.v1` and the older `v1alpha` that some
/// clients still ask) over every Muster package and the health service.
///
/// # Errors
/// A descriptor set that does not decode (a build problem, not an input one).
pub fn reflection_services() -> Result<
    (
        ServerReflectionServer<impl ServerReflection>,
        ServerReflectionServerV1Alpha<impl ServerReflectionV1Alpha>,
    ),
    tonic_reflection::server::Error,
> {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(muster_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}

/// The routes every node serves for operators' tools: [`health_service`] (over `serving`
/// and `services`) and [`reflection_services`]. A node adds its own services to them.
///
/// # Errors
/// As [`reflection_services`].
pub async fn operator_routes(
    serving: watch::Receiver<bool>,
    services: &'static [&'static str],
) -> Result<tonic::service::Routes, tonic_reflection::server::Error> {
    let (v1, v1alpha) = reflection_services()?;
    Ok(
        tonic::service::Routes::new(health_service(serving, services).await)
            .add_service(v1)
            .add_service(v1alpha),
    )
}
