//! `muster monitor` streams a running master's log as it happens: asked for `debug`, it shows
//! debug lines the master does not otherwise log, as text or as JSON objects; a level that is
//! not one, or a master that is not one, is refused with an error naming it.

use std::process::Stdio;

use anyhow::{Context as _, bail, ensure};
use common::{DEADLINE, DevCluster};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::time::Instant;

use crate::common;

/// Runs `muster monitor ARGS` on `cluster` until it prints a line `wanted` accepts, while a
/// job is run (the master logs its evaluation at debug); that line.
async fn first_line(
    cluster: &DevCluster,
    args: &[&str],
    wanted: impl Fn(&str) -> bool,
) -> anyhow::Result<String> {
    let mut monitor = cluster
        .cli(&[&["monitor"], args].concat())?
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = monitor.stdout.take().context("the monitor's stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let hello = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/jobs/hello.toml");
    let deadline = Instant::now() + DEADLINE;
    let mut ran = false;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let line = match tokio::time::timeout(remaining.min(DEADLINE / 20), lines.next_line()).await
        {
            Ok(line) => line?,
            // Quiet: give the master something to log.
            Err(_) if !ran => {
                let run = cluster.cli(&["job", "run", hello])?.output().await?;
                ensure!(
                    run.status.success(),
                    "job run: {}",
                    String::from_utf8_lossy(&run.stderr)
                );
                ran = true;
                continue;
            }
            Err(_) if remaining.is_zero() => bail!("no wanted line within {DEADLINE:?}"),
            Err(_) => continue,
        };
        let Some(line) = line else {
            let output = monitor.wait_with_output().await?;
            bail!(
                "the monitor ended: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        };
        if wanted(&line) {
            return Ok(line);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitor_shows_a_running_masters_debug_lines_as_text_and_json() -> anyhow::Result<()> {
    let cluster = DevCluster::start().await?;

    let line = first_line(&cluster, &["--log-level", "debug"], |l| l.contains("DEBUG")).await?;
    ensure!(line.contains(": "), "a text line names its target: {line}");

    let line = first_line(&cluster, &["--log-level", "debug", "--json"], |l| {
        l.contains("\"DEBUG\"")
    })
    .await?;
    let json: serde_json::Value = serde_json::from_str(&line).context(line.clone())?;
    ensure!(json["level"] == "DEBUG", "{line}");
    ensure!(
        json["target"].is_string() && json["timestamp"].is_string(),
        "{line}"
    );

    let refused = cluster
        .cli(&["monitor", "--log-level", "loud"])?
        .output()
        .await?;
    ensure!(
        !refused.status.success(),
        "a level that is not one was taken"
    );
    let err = String::from_utf8_lossy(&refused.stderr);
    ensure!(
        err.contains("\"loud\"") && err.contains("debug"),
        "the refusal: {err}"
    );

    let refused = cluster.cli(&["monitor", "--node", "7"])?.output().await?;
    ensure!(
        !refused.status.success(),
        "a master that is not one was monitored"
    );
    let err = String::from_utf8_lossy(&refused.stderr);
    ensure!(err.contains("no master 7"), "the refusal: {err}");
    cluster.stop().await
}
