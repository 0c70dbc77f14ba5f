//! What the API streams: the event stream, carrying changes as they happen and resuming from
//! an index, and a task's output followed until the task ends.

use super::*;
use crate::common::{start_agent, start_master};

#[tokio::test]
async fn the_event_stream_carries_changes_as_they_happen_and_resumes_from_an_index()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let server = muster_master::testing::start_leading(MasterConfig {
        workers: 0,
        ..master_config(dir.path())
    })
    .await?;
    let token = bootstrap(server.address()).await?;
    let stream = |query: &str| {
        let url = format!("https://{}/v1/event/stream{query}", server.http_address());
        crate::common::follow_with_curl(&url, &token, None)
    };
    // Reads events (skipping heartbeats) until one matches `wanted`.
    async fn until(
        lines: &mut crate::common::CurlLines,
        wanted: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let line = tokio::time::timeout_at(deadline, lines.next_line())
                .await
                .context("no such event in time")??
                .context("the stream ended")?;
            let event: Value = serde_json::from_str(&line)?;
            if wanted(&event) {
                return Ok(event);
            }
        }
    }

    let (_follower, mut lines) = stream("?topic=job,evaluation")?;
    let submitted = curl(&server, "POST", "/v1/jobs", Some(("x", &token)), Some(JOB)).await?;
    ensure!(submitted.status == 200, "{submitted:?}");
    let registered = until(&mut lines, |e| e["kind"] == "job-registered").await?;
    ensure!(
        registered["key"] == "shop" && registered["payload"]["version"].as_u64().is_some(),
        "{registered}"
    );
    let eval = until(&mut lines, |e| e["topic"] == "evaluation").await?;
    ensure!(
        eval["payload"]["job"] == "shop" && eval["payload"]["triggered_by"] == "job-register",
        "{eval}"
    );
    let first = registered["index"].as_u64().context("no index")?;

    // Resuming after the first: the evaluation comes again, the job's registration does not.
    let (_resumed, mut again) = stream(&format!("?index={first}"))?;
    let next = until(&mut again, |e| e["index"].as_u64().is_some()).await?;
    ensure!(
        next["index"].as_u64() > Some(first) && next["topic"] == "evaluation",
        "{next}"
    );

    let unknown = curl(
        &server,
        "GET",
        "/v1/event/stream?topic=weather",
        Some(("x", &token)),
        None,
    )
    .await?;
    ensure!(
        unknown.status == 400 && code(&unknown) == "bad_request",
        "{unknown:?}"
    );
    server.shutdown().await;
    Ok(())
}

/// `curl` of a streamed `path` with `token`: everything it sent until it ended.
async fn curl_stream(
    server: &MasterServer,
    path: &str,
    token: &TokenSecret,
) -> anyhow::Result<String> {
    let (status, headers, body) = curl_text(server, "GET", path, Some(("x", token)), None).await?;
    ensure!(status == 200, "GET {path}: {status} {headers} {body}");
    Ok(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_output_is_followed_until_the_task_ends() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let server = start_master(dir.path()).await?;
    let mut config =
        muster_agent::AgentConfig::new(vec![server.address().to_owned()], dir.path().join("agent"));
    config.registration_backoff_initial = std::time::Duration::from_millis(20);
    let (_node, agent, _) = start_agent("agent-1", config).await?;
    let token = bootstrap(server.address()).await?;

    // Two lines two seconds apart: the second is written while the stream is open.
    let job = r#"{"name":"talk","type":"batch","group":[{"name":"say","count":1,"command":"sh","args":["-c","echo first; sleep 2; echo second"],"cpus":0.1,"mem_mb":16}]}"#;
    let submitted = curl(&server, "POST", "/v1/jobs", Some(("x", &token)), Some(job)).await?;
    ensure!(submitted.status == 200, "{submitted:?}");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let task_id = loop {
        let tasks = curl(
            &server,
            "GET",
            "/v1/job/talk/tasks",
            Some(("x", &token)),
            None,
        )
        .await?;
        let running = tasks
            .body
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["state"] == "running")
            .and_then(|t| t["id"].as_str().map(str::to_owned));
        if let Some(id) = running {
            break id;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the task never ran: {tasks:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let followed = curl_stream(
        &server,
        &format!("/v1/task/{task_id}/logs?follow=true"),
        &token,
    )
    .await?;
    let mut text = String::new();
    for line in followed.lines() {
        let piece: Value =
            serde_json::from_str(line).with_context(|| format!("not JSON: {line}"))?;
        ensure!(piece["task_id"] == task_id.as_str(), "{piece}");
        text.push_str(piece["data"].as_str().unwrap_or(""));
    }
    ensure!(text == "first\nsecond\n", "followed: {followed:?}");
    // The task has ended: the plain form sends what there is and ends at once.
    let plain = curl_stream(
        &server,
        &format!("/v1/task/{task_id}/logs?follow=true&plain=true"),
        &token,
    )
    .await?;
    ensure!(plain == "first\nsecond\n", "plain: {plain:?}");
    let unknown = curl(
        &server,
        "GET",
        "/v1/task/nope/logs?follow=true",
        Some(("x", &token)),
        None,
    )
    .await?;
    ensure!(
        unknown.status == 404 || unknown.status == 400,
        "{unknown:?}"
    );

    agent.stop().await;
    server.shutdown().await;
    Ok(())
}
