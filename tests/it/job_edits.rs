//! `muster job scale` and `muster job revert` against `muster dev`: each submits a new version
//! made from one the cluster holds, the tasks follow, and a wrong group or version is refused
//! by name with nothing changed. `muster job list` says each job's status in Nomad's words.

use crate::common;

use std::time::Duration;

use anyhow::{Context as _, ensure};
use common::DevCluster;

async fn run(cluster: &DevCluster, args: &[&str]) -> anyhow::Result<(bool, String, String)> {
    let output = cluster.cli(args)?.output().await?;
    Ok((
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

/// Polls `muster job status web --json` until `done` holds of its running tasks' count.
async fn running_becomes(
    cluster: &DevCluster,
    what: &str,
    done: impl Fn(usize) -> bool,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (ok, out, err) = run(cluster, &["job", "status", "web", "--json"]).await?;
        ensure!(ok, "job status: {err}");
        let doc: serde_json::Value = serde_json::from_str(&out).context("job status --json")?;
        let running = doc["tasks"].as_array().map_or(0, |tasks| {
            tasks.iter().filter(|t| t["state"] == "running").count()
        });
        if done(running) {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{what}: {running} running after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_and_revert_make_new_versions_the_tasks_follow() -> anyhow::Result<()> {
    let cluster = DevCluster::start().await?;
    let file = cluster.dir().join("web.toml");
    std::fs::write(
        &file,
        "name = \"web\"\ntype = \"service\"\n[[group]]\nname = \"fe\"\ncount = 1\ncommand = \"sleep\"\nargs = [\"600\"]\ncpus = 0.05\nmem_mb = 16\n",
    )?;
    let (ok, _, err) = run(&cluster, &["job", "run", file.to_str().context("path")?]).await?;
    ensure!(ok, "job run: {err}");
    running_becomes(&cluster, "one task", |n| n == 1).await?;

    let (ok, out, err) = run(&cluster, &["job", "scale", "web", "fe", "3"]).await?;
    ensure!(ok, "scale: {err}");
    ensure!(out.contains("scaled to 3: version 2"), "scale said: {out}");
    running_becomes(&cluster, "three tasks", |n| n == 3).await?;

    let (ok, _, err) = run(&cluster, &["job", "scale", "web", "be", "3"]).await?;
    ensure!(
        !ok && err.contains("no group \"be\""),
        "a wrong group: {err}"
    );

    let (ok, out, err) = run(&cluster, &["job", "revert", "web", "1"]).await?;
    ensure!(ok, "revert: {err}");
    ensure!(
        out.contains("reverted to version 1: version 3"),
        "revert said: {out}"
    );
    running_becomes(&cluster, "back to one task", |n| n == 1).await?;

    let (ok, _, err) = run(&cluster, &["job", "revert", "web", "9"]).await?;
    ensure!(
        !ok && err.contains("no version 9"),
        "a version not kept: {err}"
    );
    let (ok, out, _) = run(&cluster, &["job", "history", "web"]).await?;
    ensure!(
        ok && out.starts_with("version 3 (current)"),
        "history: {out}"
    );
    cluster.stop().await
}
