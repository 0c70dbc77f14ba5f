//! How tasks live, fail and stop on `muster dev`, with real processes: a crashing task is
//! restarted in place up to its restart policy's attempts, then placed again with delays that
//! grow as its reschedule policy says; HTTP health checks mark tasks healthy, and an unhealthy
//! task is restarted, then FAILED; a group's kill signal reaches its task; a batch task past
//! its longest run FAILED.
//!
//! The HTTP service the checks probe is this test binary itself, run as the task
//! ([`http_service_task`]): a job file can name it with no other program installed.

use crate::common;

use anyhow::ensure;
use common::DevCluster;
use common::dev_jobs::{http_service_command, run_job, status_until, tasks_of};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_task_restarts_in_place_then_is_placed_again_with_growing_delays()
-> anyhow::Result<()> {
    let cluster = DevCluster::start().await?;
    run_job(
        &cluster,
        "crashy",
        "name = \"crashy\"\n[[group]]\nname = \"w\"\ncommand = \"sh\"\nargs = [\"-c\", \"exit 3\"]\n\
         cpus = 0.05\nmem_mb = 16\n\
         [group.restart]\nattempts = 2\ndelay = \"100ms\"\ninterval = \"1m\"\n\
         [group.reschedule]\nunlimited = true\ndelay = \"300ms\"\ndelay_function = \"exponential\"\nmax_delay = \"10s\"\n",
    )
    .await?;
    // Each task of the slot restarts twice in place, then FAILED for good; the master places
    // the slot again, 300 ms after the first failure, 600 ms after the second (each
    // replacement's evaluation says so while it waits, and is seen here while it does).
    let mut delays = std::collections::BTreeSet::new();
    let failed = status_until(
        &cluster,
        "crashy",
        "two tasks failed after their restarts",
        |s| {
            let failed: Vec<&Value> = tasks_of(s, "w")
                .into_iter()
                .filter(|t| t["state"] == "failed")
                .collect();
            delays.extend(
                s["evaluations"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e["status_description"].as_str())
                    .filter(|d| d.contains("replaced after"))
                    .map(str::to_owned),
            );
            let grew = delays.iter().any(|d| d.ends_with("after 300ms"))
                && delays.iter().any(|d| d.ends_with("after 600ms"));
            if failed.len() >= 2 && grew {
                Ok(failed.into_iter().cloned().collect::<Vec<Value>>())
            } else {
                Err(format!("{} failed; delays {delays:?}", failed.len()))
            }
        },
    )
    .await?;
    for task in &failed {
        ensure!(task["restarts"] == 2, "restarted twice in place: {task}");
        ensure!(task["exit_code"] == 3, "its exit code: {task}");
        let message = task["message"].as_str().unwrap_or_default();
        ensure!(
            message.contains("2 restarts within 1m"),
            "the message says why it failed for good: {message}"
        );
    }
    cluster.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_mark_tasks_and_an_unhealthy_task_is_restarted_then_fails()
-> anyhow::Result<()> {
    let cluster = DevCluster::start().await?;
    let command = http_service_command()?;
    let group = |name: &str, health: &str, more: &str| {
        format!(
            "[[group]]\nname = \"{name}\"\n{command}cpus = 0.05\nmem_mb = 32\n\
             env = {{ MUSTER_TEST_SERVE = \"1\", HEALTH = \"{health}\" }}\n\
             [[group.port]]\nlabel = \"http\"\n\
             [[group.check]]\nname = \"alive\"\ntype = \"http\"\nport = \"http\"\npath = \"/health\"\n\
             interval = \"200ms\"\ntimeout = \"200ms\"\nunhealthy_threshold = 2\n{more}"
        )
    };
    let job = format!(
        "name = \"checked\"\n{}{}",
        group("good", "ok", ""),
        group(
            "bad",
            "fail",
            "[group.restart]\nattempts = 1\ndelay = \"100ms\"\n[group.reschedule]\nattempts = 0\n"
        )
    );
    run_job(&cluster, "checked", &job).await?;
    let bad = status_until(&cluster, "checked", "good healthy, bad failed", |s| {
        let good = tasks_of(s, "good");
        let bad = tasks_of(s, "bad");
        let good_healthy = good
            .iter()
            .any(|t| t["state"] == "running" && t["health"] == "healthy");
        let bad_failed = bad.iter().find(|t| t["state"] == "failed");
        match (good_healthy, bad_failed) {
            (true, Some(failed)) => Ok((*failed).clone()),
            _ => Err(format!("good {good:?}, bad {bad:?}")),
        }
    })
    .await?;
    ensure!(
        bad["restarts"] == 1,
        "restarted once for being unhealthy: {bad}"
    );
    let message = bad["message"].as_str().unwrap_or_default();
    ensure!(
        message.contains("unhealthy: check \"alive\" fails") && message.contains("500"),
        "the message names the check and what it got: {message}"
    );
    // The words people read say it too.
    let output = cluster.cli(&["job", "status", "checked"])?.output().await?;
    let text = String::from_utf8_lossy(&output.stdout);
    ensure!(text.contains("healthy"), "job status: {text}");
    ensure!(text.contains("1 restart"), "job status: {text}");
    cluster.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_kill_signal_reaches_its_task_and_a_batch_task_past_its_longest_run_fails()
-> anyhow::Result<()> {
    let cluster = DevCluster::start().await?;
    run_job(
        &cluster,
        "trapper",
        "name = \"trapper\"\n[[group]]\nname = \"t\"\ncommand = \"sh\"\n\
         args = [\"-c\", \"trap 'exit 7' INT; while :; do sleep 0.1; done\"]\n\
         cpus = 0.05\nmem_mb = 16\nkill_signal = \"SIGINT\"\nkill_timeout = \"20s\"\n",
    )
    .await?;
    status_until(&cluster, "trapper", "the trapper runs", |s| {
        tasks_of(s, "t")
            .iter()
            .any(|t| t["state"] == "running")
            .then_some(())
            .ok_or_else(|| s["tasks"].to_string())
    })
    .await?;
    let output = cluster.cli(&["job", "stop", "trapper"])?.output().await?;
    ensure!(output.status.success(), "job stop");
    // SIGINT, not SIGTERM: its trap answers with exit code 7.
    status_until(
        &cluster,
        "trapper",
        "the trapper killed by its signal",
        |s| {
            tasks_of(s, "t")
                .iter()
                .any(|t| t["state"] == "killed" && t["exit_code"] == 7)
                .then_some(())
                .ok_or_else(|| s["tasks"].to_string())
        },
    )
    .await?;

    run_job(
        &cluster,
        "long",
        "name = \"long\"\ntype = \"batch\"\n[[group]]\nname = \"b\"\ncommand = \"sleep\"\n\
         args = [\"600\"]\ncpus = 0.05\nmem_mb = 16\nmax_run_duration = \"1s\"\n",
    )
    .await?;
    let message = status_until(&cluster, "long", "the batch task stopped", |s| {
        tasks_of(s, "b")
            .iter()
            .find(|t| t["state"] == "failed")
            .and_then(|t| t["message"].as_str().map(str::to_owned))
            .ok_or_else(|| s["tasks"].to_string())
    })
    .await?;
    ensure!(
        message.contains("max_run_duration of 1s"),
        "it says why: {message}"
    );
    cluster.stop().await
}

/// Not a test: the HTTP service the health-check and deployment tests run as their task (this
/// binary, run with `MUSTER_TEST_SERVE=1`). It listens on `MUSTER_PORT_HTTP` and answers
/// `GET /health` 200, or 500 with `HEALTH=fail`; anything else 200 with `version $VERSION`.
#[test]
#[ignore = "run as a task by the health-check test"]
fn http_service_task() -> anyhow::Result<()> {
    if std::env::var_os("MUSTER_TEST_SERVE").is_none() {
        return Ok(());
    }
    use std::io::{Read as _, Write as _};
    let port: u16 = std::env::var("MUSTER_PORT_HTTP")?.parse()?;
    let healthy = std::env::var("HEALTH").map_or(true, |h| h != "fail");
    let version = std::env::var("VERSION").unwrap_or_default();
    let listener = std::net::TcpListener::bind(("0.0.0.0", port))?;
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let mut request = [0u8; 2048];
        let read = stream.read(&mut request).unwrap_or(0);
        let head = String::from_utf8_lossy(&request[..read]);
        let status = if head.starts_with("GET /health ") && !healthy {
            "500 Internal Server Error"
        } else {
            "200 OK"
        };
        let body = format!("version {version}");
        let _ = stream.write_all(
            format!(
                "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
    }
    Ok(())
}
