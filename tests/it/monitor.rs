//! `muster monitor` streams a running master's log as it happens: asked for `debug`, it shows
//! debug lines the master does not otherwise log, as text or as JSON objects; a level that is
//! not one, or a master that is not one, is refused with an error naming it.

use std::process::Stdio;

use anyhow::{Context as _, bail, ensure};
use common::{DEADLINE, DevCluster};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::time::Instant;

use crate::common;

/// Starts a `muster monitor` command; the child, and its stdout by line.
fn spawn_monitor(
    mut command: tokio::process::Command,
) -> anyhow::Result<(
    tokio::process::Child,
    tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
)> {
    let mut monitor = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = monitor.stdout.take().context("the monitor's stdout")?;
    Ok((monitor, BufReader::new(stdout).lines()))
}

/// Runs `muster monitor ARGS` on `cluster` until it prints a line `wanted` accepts, while a
/// job is run (the master logs its evaluation at debug); that line.
async fn first_line(
    cluster: &DevCluster,
    args: &[&str],
    wanted: impl Fn(&str) -> bool,
) -> anyhow::Result<String> {
    let (monitor, mut lines) = spawn_monitor(cluster.cli(&[&["monitor"], args].concat())?)?;
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

/// `muster monitor --agent` on a cluster of real processes: the agent's own debug lines
/// (its heartbeats) come through the leader, an unknown agent is refused by name, and when the
/// monitor ends the agent closes its session (and logs so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitor_of_an_agent_relays_its_debug_lines_and_closes_with_the_stream()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let result = monitor_an_agent(dir.path()).await;
    common::keep_logs_on_error("monitor_of_an_agent", dir.path(), result)
}

async fn monitor_an_agent(dir: &std::path::Path) -> anyhow::Result<()> {
    let mut masters = common::Masters::new(dir, 1).await?;
    masters.start_all().await?;
    let root = muster_master::testing::bootstrap(&masters.addresses[0]).await?;
    let mut agent = common::agent_command(dir, 0, "127.0.0.1", &masters.addresses)?;
    agent.args(["--listen", "127.0.0.1:0", "--stop-tasks-on-exit"]);
    let agent_log = dir.join("agent-0.log");
    let _agent = common::spawn_logged(agent, "agent 0", &agent_log).await?;
    let (_, state) = common::leader_state_when(&masters.addresses, &root, "the agent", |s| {
        s.agents.iter().any(|a| a.connected)
    })
    .await?;
    let agent_id = state
        .agents
        .first()
        .map(|a| a.id.clone())
        .context("the agent's id")?;

    let mut command = common::cli_with_token(&masters.addresses, &root)?;
    command.args(["monitor", "--agent", &agent_id, "--log-level", "debug"]);
    let (mut monitor, mut lines) = spawn_monitor(command)?;
    let deadline = Instant::now() + DEADLINE;
    let mut seen = Vec::new();
    let heartbeat = loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = tokio::time::timeout(remaining, lines.next_line()).await else {
            bail!("no heartbeat line from the agent within {DEADLINE:?}; saw {seen:#?}");
        };
        let Some(line) = line? else {
            let output = monitor.wait_with_output().await?;
            bail!(
                "the monitor ended: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        };
        if line.contains("DEBUG") && line.contains("heartbeat answered") {
            break line;
        }
        seen.push(line);
    };
    ensure!(
        heartbeat.contains("muster_agent"),
        "the line comes from the agent's code: {heartbeat}"
    );
    ensure!(
        seen.iter().any(|l| l.contains("a monitor opened")),
        "the agent's session shows its own opening: {seen:#?}"
    );
    monitor.kill().await?;
    common::poll_within("the agent closes the session", DEADLINE, || {
        let log = std::fs::read_to_string(&agent_log).map_err(|e| e.to_string())?;
        // The close the stream's end sends, not the idle timer's ("a monitor closed: nobody
        // read it"), which would come 10 s later.
        if log.contains("nobody read it") {
            Err("the session closed by its idle timer: the stream's end sent no close".to_owned())
        } else if log.contains("a monitor closed session=") {
            Ok(())
        } else {
            Err("no \"a monitor closed\" in the agent's log".to_owned())
        }
    })
    .await?;

    let refused = common::cli_with_token(&masters.addresses, &root)?
        .args(["monitor", "--agent", "no-such-agent"])
        .output()
        .await?;
    ensure!(!refused.status.success(), "an unknown agent was monitored");
    let err = String::from_utf8_lossy(&refused.stderr);
    ensure!(err.contains("no-such-agent"), "the refusal: {err}");
    Ok(())
}
