//! `muster-master` reloads its certificate and key on SIGHUP, without a restart: new
//! connections see the new certificate, and a reload of broken files keeps the old one.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use muster_security::testing::TestPki;
use muster_security::{Role, TlsFiles};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;
use tokio::time::Instant;

use crate::common::BIN;

const DEADLINE: Duration = Duration::from_secs(30);

/// Copies the test CA's certificate for `name` over `to`'s certificate and key.
fn install(name: &str, to: &TlsFiles) -> anyhow::Result<()> {
    let from = TestPki::shared().files(Role::Master, name);
    std::fs::copy(&from.cert, &to.cert)?;
    std::fs::copy(&from.key, &to.key)?;
    Ok(())
}

/// The certificate name the master at `address` presents to a new connection.
async fn presented(address: &str) -> anyhow::Result<String> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}"))?
        .connect_timeout(Duration::from_secs(5));
    let client = TestPki::shared().security(Role::Client, "test-client");
    let (_channel, peer) = client.channel(endpoint, &[Role::Master]).await?;
    Ok(peer.context("no peer identity over TLS")?.name)
}

fn hangup(pid: u32) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()?;
    ensure!(status.success(), "kill -HUP failed: {status}");
    Ok(())
}

#[tokio::test]
async fn sighup_reloads_the_certificate_without_a_restart() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let files = TlsFiles {
        ca: TestPki::shared().ca_file(),
        cert: dir.path().join("master.pem"),
        key: dir.path().join("master-key.pem"),
    };
    install("master-before", &files)?;
    let mut child = Command::new(BIN)
        .arg("--tls-ca")
        .arg(&files.ca)
        .arg("--tls-cert")
        .arg(&files.cert)
        .arg("--tls-key")
        .arg(&files.key)
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("registry"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("cannot run muster-master")?;
    let pid = child.id().context("no pid")?;
    let mut logs = BufReader::new(child.stderr.take().context("no stderr")?).lines();
    let stdout = child.stdout.take().context("no stdout")?;
    let line = tokio::time::timeout(DEADLINE, BufReader::new(stdout).lines().next_line())
        .await
        .context("it did not start")??
        .context("it exited")?;
    let address = line
        .split_whitespace()
        .nth(4)
        .context("no address in the first line")?
        .to_owned();
    ensure!(presented(&address).await? == "master-before");

    // Broken files: the reload fails (and says so), the old certificate stays in use.
    std::fs::write(&files.cert, "not a certificate")?;
    hangup(pid)?;
    let failed = tokio::time::timeout(DEADLINE, async {
        while let Some(line) = logs.next_line().await? {
            if line.contains("TLS reload failed") {
                return anyhow::Ok(line);
            }
        }
        bail!("the master's log ended")
    })
    .await
    .context("no log line for the failed reload")??;
    ensure!(failed.contains("master.pem"), "{failed}");
    install("master-after", &files)?;
    // Nothing was reloaded yet: the file changed, but no SIGHUP came since.
    ensure!(presented(&address).await? == "master-before");

    hangup(pid)?;
    let deadline = Instant::now() + DEADLINE;
    loop {
        let name = presented(&address).await?;
        if name == "master-after" {
            break;
        }
        if Instant::now() > deadline {
            bail!("still presenting {name:?} after SIGHUP");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ensure!(child.try_wait()?.is_none(), "the master exited");
    // Keep draining the log so the master never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = logs.next_line().await {} });
    Ok(())
}
