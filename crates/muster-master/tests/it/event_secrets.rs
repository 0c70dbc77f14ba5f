//! The event stream shows environment values only to tokens that may read secrets, as every
//! other read does: through gRPC `StreamEvents`, and through `/v1/event/stream` as NDJSON and
//! as server-sent events (what the web UI's live feed reads), driven by `curl`.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use muster_master::REDACTED;
use muster_master::testing::{create_token, operator};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_security::TokenSecret;

use crate::common::{OneAgentCluster, follow_with_curl, one_agent_cluster};

const DEADLINE: Duration = Duration::from_secs(30);
const SECRET: &str = "hunter2-in-the-env";

/// The first line `curl` streams from `url` with `token` (and `accept`) that holds `wanted`.
async fn first_line_with(
    url: &str,
    token: &TokenSecret,
    accept: &str,
    wanted: &str,
) -> anyhow::Result<String> {
    let (_curl, mut lines) = follow_with_curl(url, token, Some(accept))?;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let line = tokio::time::timeout_at(deadline, lines.next_line())
            .await
            .with_context(|| format!("no line with {wanted:?} from {url}"))??
            .context("the stream ended")?;
        if line.contains(wanted) {
            return Ok(line);
        }
    }
}

/// The payload of the first task event gRPC `StreamEvents` carries to `token`.
async fn first_task_event(address: &str, token: &TokenSecret) -> anyhow::Result<String> {
    let mut events = operator(address, Some(token))
        .await?
        .stream_events(pb::StreamEventsRequest {
            index: 0,
            topics: vec!["task".into()],
            namespace: String::new(),
        })
        .await?
        .into_inner();
    let event = tokio::time::timeout(DEADLINE, events.message())
        .await
        .context("no task event in time")??
        .context("the stream ended")?;
    Ok(event.payload_json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_redacts_environments_for_tokens_that_may_not_read_secrets()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let OneAgentCluster {
        master,
        agent,
        root,
        ..
    } = one_agent_cluster(dir.path()).await?;
    let address = master.address().to_owned();
    let reader = create_token(&address, &root, "viewer", "read").await?;
    let submitter = create_token(&address, &root, "deploy", "submit").await?;

    let job = model_pb::Job {
        name: "vault".into(),
        scheduler: model_pb::SchedulerType::Service as i32,
        groups: vec![model_pb::TaskGroup {
            name: "main".into(),
            count: 1,
            resources: Some(model_pb::Resources {
                cpus: 0.1,
                mem_mb: 16,
            }),
            command: "sleep".into(),
            args: vec!["60".into()],
            env: [("API_KEY".to_owned(), SECRET.to_owned())].into(),
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    };
    operator(&address, Some(&submitter))
        .await?
        .submit_job(pb::SubmitJobRequest { job: Some(job) })
        .await?;

    // gRPC: the reader sees the key with its value redacted; the submitter sees the value.
    let read = first_task_event(&address, &reader).await?;
    ensure!(
        !read.contains(SECRET) && read.contains(&format!("\"API_KEY\":\"{REDACTED}\"")),
        "a read token's event: {read}"
    );
    let submitted = first_task_event(&address, &submitter).await?;
    ensure!(
        submitted.contains(SECRET),
        "a submit token's event: {submitted}"
    );

    // HTTP, as NDJSON and as server-sent events.
    let url = format!(
        "https://{}/v1/event/stream?topic=task",
        master.http_address()
    );
    for accept in ["application/x-ndjson", "text/event-stream"] {
        let line = first_line_with(&url, &reader, accept, "API_KEY").await?;
        ensure!(
            !line.contains(SECRET) && line.contains(REDACTED),
            "{accept} to a read token: {line}"
        );
        let line = first_line_with(&url, &submitter, accept, "API_KEY").await?;
        ensure!(line.contains(SECRET), "{accept} to a submit token: {line}");
    }

    agent.stop().await;
    master.shutdown().await;
    Ok(())
}
