//! The standard gRPC health service and server reflection on a master's port, through a real
//! gRPC client over mutual TLS with no token: what load balancers and `grpcurl` use.

use std::collections::BTreeMap;
use std::time::Duration;

use muster_master::testing::{self, client_security};
use muster_master::{MasterConfig, MasterServer};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::{ServerReflectionRequest, ServerReflectionResponse};

use crate::common::{master_config, start_master};

async fn status(
    health: &mut HealthClient<tonic::transport::Channel>,
    service: &str,
) -> Result<ServingStatus, tonic::Status> {
    let reply = health
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await?;
    Ok(reply.into_inner().status())
}

/// Polls the health of `service` until it is `wanted`.
async fn until_status(
    health: &mut HealthClient<tonic::transport::Channel>,
    service: &str,
    wanted: ServingStatus,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + testing::WAIT;
    loop {
        let now = status(health, service).await?;
        if now == wanted {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{service:?} stayed {now:?}, not {wanted:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leading_master_is_serving_and_lists_its_services() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = start_master(dir.path()).await?;
    let channel = testing::channel(master.address(), &client_security()).await?;

    let mut health = HealthClient::new(channel.clone());
    for service in [
        "",
        "muster.cluster.v1.Operator",
        "muster.scheduling.v1.Scheduling",
    ] {
        until_status(&mut health, service, ServingStatus::Serving).await?;
    }
    let unknown = status(&mut health, "no.such.Service").await;
    assert_eq!(
        unknown.map_err(|s| s.code()),
        Err(tonic::Code::NotFound),
        "an unknown service is NOT_FOUND, as the protocol says"
    );

    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter([request]))
        .await?
        .into_inner();
    let answer: ServerReflectionResponse = answers
        .message()
        .await?
        .ok_or_else(|| anyhow::anyhow!("no reflection answer"))?;
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        anyhow::bail!("not a service list: {answer:?}");
    };
    let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
    for wanted in [
        "muster.cluster.v1.Operator",
        "muster.scheduling.v1.Scheduling",
        "grpc.health.v1.Health",
    ] {
        assert!(names.contains(&wanted), "{wanted} missing from {names:?}");
    }

    // A method's descriptor, as `grpcurl describe` asks for it.
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(
            "muster.cluster.v1.Operator".into(),
        )),
    };
    let mut reflection =
        ServerReflectionClient::new(testing::channel(master.address(), &client_security()).await?);
    let answer = reflection
        .server_reflection_info(tokio_stream::iter([request]))
        .await?
        .into_inner()
        .message()
        .await?
        .ok_or_else(|| anyhow::anyhow!("no reflection answer"))?;
    assert!(
        matches!(
            answer.message_response,
            Some(MessageResponse::FileDescriptorResponse(ref files)) if !files.file_descriptor_proto.is_empty()
        ),
        "{answer:?}"
    );
    master.shutdown().await;
    Ok(())
}

/// A master that cannot do its job (one of three members, the others never started: no leader
/// is known) says NOT_SERVING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_without_a_leader_is_not_serving() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut members = BTreeMap::new();
    let mut held = Vec::new();
    for id in 1..=3 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        members.insert(id, listener.local_addr()?.to_string());
        held.push(listener);
    }
    // Free the first member's port for the master; the others stay bound and silent.
    held.remove(0);
    let master = MasterServer::start(MasterConfig {
        listen: members[&1].clone(),
        members,
        ..master_config(dir.path())
    })
    .await?;
    let channel = testing::channel(master.address(), &client_security()).await?;
    let mut health = HealthClient::new(channel);
    assert_eq!(status(&mut health, "").await?, ServingStatus::NotServing);
    assert_eq!(
        status(&mut health, "muster.cluster.v1.Operator").await?,
        ServingStatus::NotServing
    );
    master.shutdown().await;
    Ok(())
}
