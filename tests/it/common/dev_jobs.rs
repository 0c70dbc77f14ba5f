//! Jobs on `muster dev` through its CLI, for the tests of how tasks live and deploy: run a
//! job file, read `job status --json`, poll it, and the command that runs this test binary as
//! an HTTP service task.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use serde_json::Value;

use super::DevCluster;

/// Runs `muster job run` on `toml`, written to a file in the cluster's directory.
pub(crate) async fn run_job(cluster: &DevCluster, name: &str, toml: &str) -> anyhow::Result<()> {
    let file = cluster.dir().join(format!("{name}.toml"));
    std::fs::write(&file, toml)?;
    let output = cluster
        .cli(&["job", "run", file.to_str().context("path")?])?
        .output()
        .await?;
    ensure!(
        output.status.success(),
        "job run {name}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// `muster job status NAME --json`.
pub(crate) async fn job_status(cluster: &DevCluster, name: &str) -> anyhow::Result<Value> {
    let output = cluster
        .cli(&["job", "status", name, "--json"])?
        .output()
        .await?;
    ensure!(
        output.status.success(),
        "job status {name}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).context("job status --json")
}

/// Polls `job status NAME --json` until `found` picks something out of it (`Err`: what it
/// saw), for at most a minute.
pub(crate) async fn status_until<T>(
    cluster: &DevCluster,
    name: &str,
    what: &str,
    mut found: impl FnMut(&Value) -> Result<T, String>,
) -> anyhow::Result<T> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let status = job_status(cluster, name).await?;
        match found(&status) {
            Ok(found) => return Ok(found),
            Err(last) => ensure!(
                tokio::time::Instant::now() < deadline,
                "{what}: not within a minute; last: {last}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The job's tasks of group `group`.
pub(crate) fn tasks_of<'a>(status: &'a Value, group: &str) -> Vec<&'a Value> {
    status["tasks"]
        .as_array()
        .map(|tasks| tasks.iter().filter(|t| t["group"] == group).collect())
        .unwrap_or_default()
}

/// The command and arguments that run this test binary as [`http_service_task`].
pub(crate) fn http_service_command() -> anyhow::Result<String> {
    let exe = std::env::current_exe()?;
    let exe = exe
        .to_str()
        .context("the test binary's path is not UTF-8")?;
    Ok(format!(
        "command = {exe:?}\nargs = [\"task_lifecycle::http_service_task\", \"--exact\", \"--ignored\", \"--test-threads\", \"1\", \"--nocapture\"]\n"
    ))
}
