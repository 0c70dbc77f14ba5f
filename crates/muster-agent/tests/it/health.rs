//! The `muster-agent` binary serves the standard gRPC health service and reflection on its
//! port: NOT_SERVING until it has registered with a master, SERVING once it has. Asked with a
//! real gRPC client over mutual TLS, as a load balancer or `grpcurl` would.

use std::time::Duration;

use anyhow::Context as _;
use muster_security::Role;
use muster_security::testing::TestPki;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::common::{Killed, WAIT, free_address, spawn_agent, start_master};

/// Starts the binary for `master` and returns it with the address it listens on.
/// It is SIGKILLed when the test ends, however it ends.
fn start_agent(master: &str, data_dir: &std::path::Path) -> anyhow::Result<(Killed, String)> {
    let (agent, line) = spawn_agent(master, data_dir, &[], Killed)?;
    let address = line
        .strip_prefix("muster-agent listening on ")
        .and_then(|rest| rest.split_once(' '))
        .map(|(address, _)| address.to_owned())
        .with_context(|| format!("unexpected first line {line:?}"))?;
    Ok((agent, address))
}

async fn health_of(address: &str) -> anyhow::Result<HealthClient<Channel>> {
    let endpoint = Endpoint::from_shared(format!("http://{address}"))?;
    let (channel, _) = TestPki::shared()
        .security(Role::Client, "test-client")
        .channel(endpoint, &[Role::Agent])
        .await?;
    Ok(HealthClient::new(channel))
}

async fn until_status(
    health: &mut HealthClient<Channel>,
    wanted: ServingStatus,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let now = health
            .check(HealthCheckRequest::default())
            .await?
            .into_inner()
            .status();
        if now == wanted {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "stayed {now:?}, not {wanted:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_serves_once_registered() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // The master's port, chosen now; the master starts on it later.
    let master_address = free_address()?;
    let (_agent, address) = start_agent(&master_address, &dir.path().join("agent"))?;
    let mut health = health_of(&address).await?;
    let status = health
        .check(HealthCheckRequest::default())
        .await?
        .into_inner()
        .status();
    assert_eq!(
        status,
        ServingStatus::NotServing,
        "no master to register with yet"
    );

    let master = start_master(&master_address, dir.path()).await?;
    until_status(&mut health, ServingStatus::Serving).await?;
    master.shutdown().await;
    Ok(())
}
