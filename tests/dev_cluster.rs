//! `muster dev` starts a master and an agent in one process; `muster status` shows them.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_muster");

async fn free_port() -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    Ok(listener.local_addr()?.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_runs_a_cluster_that_status_shows() -> anyhow::Result<()> {
    let master = free_port().await?;
    let agent = free_port().await?;
    let mut dev = Command::new(BIN)
        .args(["dev", "--listen", &master, "--agent-listen", &agent])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting muster dev")?;
    let mut lines = BufReader::new(dev.stdout.take().context("stdout")?).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .context("muster dev did not come up")??
        .context("muster dev exited")?;
    ensure!(
        first.contains("muster dev cluster running"),
        "printed {first:?}"
    );
    // The banner: master, agent, data dir, and a hint.
    let mut banner = String::new();
    for _ in 0..4 {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .context("the banner stopped")??
            .context("muster dev exited")?;
        banner.push_str(&line);
        banner.push('\n');
    }
    ensure!(
        banner.contains(&format!("agent@{agent}")),
        "banner: {banner}"
    );

    let status = Command::new(BIN)
        .args(["status", "--master", &master])
        .env("RUST_LOG", "warn")
        .output()
        .await?;
    ensure!(status.status.success(), "status failed: {status:?}");
    let text = String::from_utf8_lossy(&status.stdout);
    ensure!(text.contains(&format!("leader {master}")), "status: {text}");
    ensure!(
        text.contains("agents: 1 (1 connected), 0 unreachable"),
        "status: {text}"
    );
    ensure!(text.contains(&format!("agent@{agent}")), "status: {text}");

    let pid = dev.id().context("dev pid")?;
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .await?;
    let exit = tokio::time::timeout(Duration::from_secs(20), dev.wait())
        .await
        .context("muster dev did not stop on SIGTERM")??;
    ensure!(exit.success(), "muster dev exited with {exit}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_an_unreachable_master() -> anyhow::Result<()> {
    let nobody = free_port().await?;
    let status = Command::new(BIN)
        .args(["status", "--master", &nobody])
        .output()
        .await?;
    ensure!(!status.status.success());
    let text = String::from_utf8_lossy(&status.stderr);
    ensure!(
        text.contains(&format!("cannot reach a master at {nobody}")),
        "{text}"
    );
    Ok(())
}
