//! `muster operator snapshot save` copies the registry to a file; `restore` puts it back over
//! a changed registry, through raft; a damaged file is refused and changes nothing.

use crate::common;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_registry_restores_over_later_changes_and_a_damaged_file_changes_nothing()
-> anyhow::Result<()> {
    let cluster = DevCluster::start().await?;
    let hello = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/jobs/hello.toml");
    let (ok, _, err) = run(&cluster, &["job", "run", hello]).await?;
    ensure!(ok, "job run: {err}");

    let snapshot = cluster.dir().join("registry.snap");
    let path = snapshot.to_str().context("path")?;
    let (ok, out, err) = run(&cluster, &["operator", "snapshot", "save", path]).await?;
    ensure!(ok, "save: {err}");
    ensure!(out.contains("1 jobs"), "save said: {out}");
    // It holds environments and token hashes: its user's alone.
    let mode = std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(&snapshot)?) & 0o777;
    ensure!(mode == 0o600, "the snapshot file is {mode:o}");

    // Later changes: another job, and hello stopped.
    let later = cluster.dir().join("later.toml");
    std::fs::write(
        &later,
        "name = \"later\"\ntype = \"service\"\n[[group]]\nname = \"web\"\ncount = 1\ncommand = \"sleep\"\nargs = [\"600\"]\ncpus = 0.1\nmem_mb = 16\n",
    )?;
    let (ok, _, err) = run(&cluster, &["job", "run", later.to_str().context("path")?]).await?;
    ensure!(ok, "job run later: {err}");
    let (ok, _, err) = run(&cluster, &["job", "stop", "hello"]).await?;
    ensure!(ok, "job stop: {err}");

    // A damaged copy is refused, naming the damage, and the registry is as it was.
    let damaged = cluster.dir().join("damaged.snap");
    let bytes = std::fs::read(&snapshot)?;
    std::fs::write(&damaged, &bytes[..bytes.len() - 10])?;
    let (ok, _, err) = run(
        &cluster,
        &[
            "operator",
            "snapshot",
            "restore",
            damaged.to_str().context("path")?,
        ],
    )
    .await?;
    ensure!(!ok, "a truncated snapshot was restored");
    ensure!(err.contains("truncated"), "the refusal: {err}");
    let (ok, _, err) = run(&cluster, &["job", "status", "later"]).await?;
    ensure!(ok, "the refused restore changed the registry: {err}");

    // The real copy: hello is back as it was, later is gone.
    let (ok, out, err) = run(&cluster, &["operator", "snapshot", "restore", path]).await?;
    ensure!(ok, "restore: {err}");
    ensure!(out.contains("Restored"), "restore said: {out}");
    let (ok, out, err) = run(&cluster, &["job", "status", "hello"]).await?;
    ensure!(ok, "hello after the restore: {err}");
    ensure!(!out.contains("stopped"), "hello is still stopped: {out}");
    let (ok, _, err) = run(&cluster, &["job", "status", "later"]).await?;
    ensure!(!ok, "later outlived the restore");
    ensure!(err.contains("later"), "the error names the job: {err}");

    // The cluster goes on after it: the agent is back, and new work is accepted.
    let (ok, _, err) = run(&cluster, &["job", "run", later.to_str().context("path")?]).await?;
    ensure!(ok, "a job after the restore: {err}");
    cluster.stop().await
}
