//! A real gRPC client the project did not write, grpcurl, against a real master over mutual
//! TLS: it lists the services by reflection, checks health, and calls the operator API with a
//! token, its JSON built from the reflected descriptors.
//!
//! grpcurl is a Go program (`go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.3`;
//! `.ci/run` installs it). Without it the test says so and passes, unless
//! `MUSTER_REQUIRE_GRPCURL=1` (as CI sets) makes its absence a failure.

use std::process::Stdio;

use anyhow::{Context as _, ensure};
use muster_master::MasterConfig;
use muster_master::testing::{bootstrap, start_leading};
use muster_security::testing::TestPki;
use muster_security::{Role, TokenSecret};

use crate::common::{installed, master_config};

/// Runs grpcurl with the test client's certificate against `address`: `flags` before the
/// address, `verb` (`list`, `describe X`, a method) after it.
async fn grpcurl(
    address: &str,
    token: Option<&TokenSecret>,
    flags: &[&str],
    verb: &[&str],
) -> anyhow::Result<String> {
    let pki = TestPki::shared();
    let client = pki.files(Role::Client, "grpcurl");
    let mut command = tokio::process::Command::new("grpcurl");
    command
        .arg("-cacert")
        .arg(pki.ca_file())
        .arg("-cert")
        .arg(&client.cert)
        .arg("-key")
        .arg(&client.key)
        .args(["-max-time", "30"]);
    if let Some(token) = token {
        command.args(["-H", &format!("x-muster-token: {}", token.expose())]);
    }
    let output = command
        .args(flags)
        .arg(address)
        .args(verb)
        .stdin(Stdio::null())
        .output()
        .await
        .context("cannot run grpcurl")?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    ensure!(
        output.status.success(),
        "grpcurl {flags:?} {verb:?} failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(stdout)
}

#[tokio::test]
async fn grpcurl_lists_checks_health_and_calls_the_operator_api() -> anyhow::Result<()> {
    if !installed("grpcurl", "-version", "MUSTER_REQUIRE_GRPCURL")? {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let server = start_leading(MasterConfig {
        workers: 0,
        ..master_config(dir.path())
    })
    .await?;
    let address = server.address().to_owned();

    let services = grpcurl(&address, None, &[], &["list"]).await?;
    for service in [
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "muster.cluster.v1.Operator",
        "muster.scheduling.v1.Scheduling",
    ] {
        ensure!(
            services.contains(service),
            "{service} not listed:\n{services}"
        );
    }
    let methods = grpcurl(
        &address,
        None,
        &[],
        &["describe", "muster.cluster.v1.Operator"],
    )
    .await?;
    ensure!(methods.contains("rpc ListJobs"), "{methods}");
    let health = grpcurl(&address, None, &[], &["grpc.health.v1.Health/Check"]).await?;
    ensure!(health.contains("\"SERVING\""), "{health}");

    let token = bootstrap(&address).await?;
    let submitted = grpcurl(
        &address,
        Some(&token),
        &[
            "-d",
            r#"{"job":{"name":"web","scheduler":"SCHEDULER_TYPE_SERVICE","groups":[{"name":"g","count":1,"command":"true","resources":{"cpus":0.1,"memMb":"8"}}]}}"#,
        ],
        &["muster.cluster.v1.Operator/SubmitJob"],
    )
    .await?;
    ensure!(submitted.contains("evalId"), "{submitted}");
    let jobs = grpcurl(
        &address,
        Some(&token),
        &["-d", "{}"],
        &["muster.cluster.v1.Operator/ListJobs"],
    )
    .await?;
    ensure!(jobs.contains("\"name\": \"web\""), "{jobs}");
    // Without the token: refused, with the reason.
    let refused = grpcurl(
        &address,
        None,
        &["-d", "{}"],
        &["muster.cluster.v1.Operator/ListJobs"],
    )
    .await;
    let error = refused
        .err()
        .context("a call without a token was answered")?;
    ensure!(error.to_string().contains("no token"), "{error}");
    server.shutdown().await;
    Ok(())
}
