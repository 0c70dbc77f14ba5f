//! Helpers for tests that run Muster's binaries as child processes.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a child may take to do what a test waits for.
pub(crate) const DEADLINE: Duration = Duration::from_secs(60);

/// A binary of the workspace, from the same target directory as the running test.
pub(crate) fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let test_exe = std::env::current_exe()?;
    let profile_dir = test_exe
        .parent()
        .and_then(|deps| deps.parent())
        .context("test executable has no target directory")?;
    let path = profile_dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !path.exists() {
        bail!(
            "{} not found: run through `cargo test --workspace`, which builds it",
            path.display()
        );
    }
    Ok(path)
}

/// Starts a binary and waits for the line it prints once it listens.
pub(crate) async fn spawn_listening(mut command: Command, what: &str) -> anyhow::Result<Child> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let stdout = child.stdout.take().context("child stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(DEADLINE, lines.next_line())
        .await
        .with_context(|| format!("{what} did not start listening"))??
        .with_context(|| format!("{what} exited before listening"))?;
    if !line.contains("listening on") {
        bail!("{what} printed {line:?}");
    }
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(child)
}
