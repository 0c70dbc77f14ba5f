//! The HTTP/JSON API of a real master over TLS, driven by `curl` as an operator would: tokens
//! in either header, JSON errors with a code for every refusal, jobs submitted, read, listed
//! and stopped, the health endpoints without a token, and the OpenAPI document; a job over the
//! size cap, or with a NUL, refused alike on HTTP and gRPC.
//! What the API streams (events, a task's output) is in `streams`; deployments (list, read,
//! promote, pause, resume, fail) in `deployments`.

use std::process::Stdio;

use anyhow::{Context as _, bail, ensure};
use muster_master::requests::GetMetrics;
use muster_master::testing::{bootstrap, create_token};
use muster_master::{MasterConfig, MasterServer};
use muster_security::testing::TestPki;
use muster_security::{Role, TokenSecret};
use serde_json::Value;
use tokio::io::AsyncWriteExt as _;

use crate::common::master_config;

mod deployments;
mod streams;

/// One answer: its status and JSON body.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Value,
    headers: String,
}

/// Calls the API with `curl`, trusting the test CA: `method` on `path` with `token` in
/// `header` (`X-Muster-Token`, or `Authorization` as `Bearer`), and a JSON `body`.
pub(crate) async fn curl(
    server: &MasterServer,
    method: &str,
    path: &str,
    token: Option<(&str, &TokenSecret)>,
    body: Option<&str>,
) -> anyhow::Result<Answer> {
    let (status, headers, body) = curl_text(server, method, path, token, body).await?;
    let body = if body.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&body).with_context(|| format!("not JSON: {body}"))?
    };
    Ok(Answer {
        status,
        body,
        headers: headers.to_ascii_lowercase(),
    })
}

/// As [`curl`], the answer as it came: its status, headers and body (all of it: a streamed
/// body until the server ended it).
async fn curl_text(
    server: &MasterServer,
    method: &str,
    path: &str,
    token: Option<(&str, &TokenSecret)>,
    body: Option<&str>,
) -> anyhow::Result<(u16, String, String)> {
    let url = format!("https://{}{path}", server.http_address());
    let mut command = tokio::process::Command::new("curl");
    command
        .args(["--silent", "--show-error", "--globoff", "--max-time", "30"])
        .arg("--cacert")
        .arg(TestPki::shared().ca_file())
        .args(["--request", method, "--dump-header", "-"])
        .args(["--write-out", "\n%{http_code}"]);
    match token {
        Some(("bearer", secret)) => {
            command.args([
                "--header",
                &format!("Authorization: Bearer {}", secret.expose()),
            ]);
        }
        Some((_, secret)) => {
            command.args(["--header", &format!("X-Muster-Token: {}", secret.expose())]);
        }
        None => {}
    }
    if body.is_some() {
        // From standard input: a job near the size cap is longer than one argument may be.
        command.args([
            "--header",
            "Content-Type: application/json",
            "--data-binary",
            "@-",
        ]);
    }
    let mut child = command
        .arg(&url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run curl")?;
    let mut stdin = child.stdin.take().context("curl's stdin")?;
    if let Some(body) = body {
        stdin.write_all(body.as_bytes()).await?;
    }
    drop(stdin);
    let output = child.wait_with_output().await?;
    ensure!(
        output.status.success(),
        "curl {method} {url} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout)?;
    let (rest, status) = text.rsplit_once('\n').context("no status line")?;
    let (headers, body) = rest.split_once("\r\n\r\n").unwrap_or(("", rest));
    Ok((status.trim().parse()?, headers.to_owned(), body.to_owned()))
}

/// The error code of an error answer.
pub(crate) fn code(answer: &Answer) -> &str {
    answer.body["code"].as_str().unwrap_or("")
}

const JOB: &str = r#"{"name":"shop","type":"service","group":[{"name":"web","count":2,"command":"true","cpus":0.1,"mem_mb":16,"env":{"DB_PASSWORD":"hunter2"}}]}"#;

#[tokio::test]
async fn curl_drives_jobs_through_the_http_api_with_tokens_and_json_errors() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let server = muster_master::testing::start_leading(MasterConfig {
        workers: 0,
        ..master_config(dir.path())
    })
    .await?;
    let management = bootstrap(server.address()).await?;
    let reader = create_token(server.address(), &management, "reader", "read").await?;

    // Health and the OpenAPI document need no token.
    let live = curl(&server, "GET", "/v1/health/live", None, None).await?;
    ensure!(live.status == 200, "{live:?}");
    let ready = curl(&server, "GET", "/v1/health/ready", None, None).await?;
    ensure!(
        ready.status == 200 && ready.body["status"] == "ready",
        "{ready:?}"
    );
    let openapi = curl(&server, "GET", "/v1/openapi.json", None, None).await?;
    ensure!(
        openapi.status == 200 && openapi.body["paths"]["/v1/jobs"]["post"].is_object(),
        "{openapi:?}"
    );

    // No token, a reader writing: refused as JSON naming the problem.
    let anonymous = curl(&server, "GET", "/v1/jobs", None, None).await?;
    ensure!(
        anonymous.status == 401 && code(&anonymous) == "unauthenticated",
        "{anonymous:?}"
    );
    ensure!(
        anonymous.body["message"]
            .as_str()
            .is_some_and(|m| m.contains("X-Muster-Token")),
        "{anonymous:?}"
    );
    let forged = TokenSecret::new("not-a-token");
    let unknown = curl(&server, "GET", "/v1/jobs", Some(("x", &forged)), None).await?;
    ensure!(
        unknown.status == 401 && code(&unknown) == "unauthenticated",
        "{unknown:?}"
    );
    let denied = curl(&server, "POST", "/v1/jobs", Some(("x", &reader)), Some(JOB)).await?;
    ensure!(
        denied.status == 403 && code(&denied) == "permission_denied",
        "{denied:?}"
    );

    // A malformed document names the key; a bad query string is a JSON error too.
    let typo = JOB.replace("\"count\"", "\"cuont\"");
    let bad = curl(
        &server,
        "POST",
        "/v1/jobs",
        Some(("x", &management)),
        Some(&typo),
    )
    .await?;
    ensure!(
        bad.status == 400
            && code(&bad) == "bad_request"
            && bad.body["message"]
                .as_str()
                .is_some_and(|m| m.contains("cuont")),
        "{bad:?}"
    );
    let invalid = JOB.replace("\"cpus\":0.1", "\"cpus\":-1");
    let refused = curl(
        &server,
        "POST",
        "/v1/jobs",
        Some(("x", &management)),
        Some(&invalid),
    )
    .await?;
    ensure!(
        refused.status == 400
            && code(&refused) == "invalid_argument"
            && refused.body["message"]
                .as_str()
                .is_some_and(|m| m.contains("cpus")),
        "{refused:?}"
    );
    let query = curl(
        &server,
        "GET",
        "/v1/evaluations?limit=many",
        Some(("x", &reader)),
        None,
    )
    .await?;
    ensure!(
        query.status == 400 && code(&query) == "bad_request",
        "{query:?}"
    );

    // Submit, then read it back as the reader (Bearer): the secret is redacted.
    let submitted = curl(
        &server,
        "POST",
        "/v1/jobs",
        Some(("bearer", &management)),
        Some(JOB),
    )
    .await?;
    ensure!(
        submitted.status == 200
            && submitted.body["eval_id"]
                .as_str()
                .is_some_and(|e| !e.is_empty()),
        "{submitted:?}"
    );
    // A dry run of a bigger version: nothing can be placed (no agent here), nothing is written.
    let bigger = JOB.replace("\"count\":2", "\"count\":3");
    let plan = curl(
        &server,
        "POST",
        "/v1/job/shop/plan",
        Some(("x", &reader)),
        Some(&bigger),
    )
    .await?;
    ensure!(
        plan.status == 200
            && plan.body["version"] == 2
            && plan.body["place"].as_array().is_some_and(Vec::is_empty)
            && plan.body["unplaced"]
                .as_array()
                .is_some_and(|u| !u.is_empty()),
        "{plan:?}"
    );
    let mismatch = curl(
        &server,
        "POST",
        "/v1/job/other/plan",
        Some(("x", &reader)),
        Some(&bigger),
    )
    .await?;
    ensure!(
        mismatch.status == 400 && code(&mismatch) == "bad_request",
        "{mismatch:?}"
    );
    let list = curl(&server, "GET", "/v1/jobs", Some(("bearer", &reader)), None).await?;
    ensure!(list.status == 200, "{list:?}");
    ensure!(list.headers.contains("x-muster-index:"), "{list:?}");
    let jobs = list.body["jobs"].as_array().context("jobs")?;
    ensure!(
        jobs.len() == 1 && jobs[0]["name"] == "shop" && jobs[0]["desired"] == 2,
        "{list:?}"
    );
    let read = curl(&server, "GET", "/v1/job/shop", Some(("x", &reader)), None).await?;
    ensure!(read.status == 200, "{read:?}");
    ensure!(
        read.body["job"]["group"][0]["env"]["DB_PASSWORD"] == muster_master::REDACTED,
        "the reader saw the secret: {read:?}"
    );
    ensure!(
        read.body["evaluations"][0]["triggered_by"] == "job-register",
        "{read:?}"
    );
    let evals = curl(
        &server,
        "GET",
        "/v1/job/shop/evaluations",
        Some(("x", &reader)),
        None,
    )
    .await?;
    ensure!(evals.status == 200 && evals.body["total"] == 1, "{evals:?}");
    let stale = curl(
        &server,
        "GET",
        "/v1/job/shop?stale=true",
        Some(("x", &reader)),
        None,
    )
    .await?;
    ensure!(
        stale.status == 200 && stale.body["read"]["stale"] == true,
        "{stale:?}"
    );

    // Nothing by that name, no such endpoint, a wrong method: JSON, with a code.
    let missing = curl(&server, "GET", "/v1/job/nope", Some(("x", &reader)), None).await?;
    ensure!(
        missing.status == 404 && code(&missing) == "not_found",
        "{missing:?}"
    );
    let nowhere = curl(&server, "GET", "/v1/nothing", Some(("x", &reader)), None).await?;
    ensure!(
        nowhere.status == 404 && code(&nowhere) == "not_found",
        "{nowhere:?}"
    );
    let method = curl(&server, "PUT", "/v1/jobs", Some(("x", &reader)), None).await?;
    ensure!(
        method.status == 405 && code(&method) == "method_not_allowed",
        "{method:?}"
    );

    // Prometheus metrics over the API's port, with a token; promtool reads them (when
    // installed; the metrics test requires it in CI).
    let metrics = tokio::process::Command::new("curl")
        .args(["--silent", "--show-error", "--fail", "--cacert"])
        .arg(TestPki::shared().ca_file())
        .args(["--header", &format!("X-Muster-Token: {}", reader.expose())])
        .arg(format!("https://{}/metrics", server.http_address()))
        .output()
        .await?;
    ensure!(metrics.status.success(), "{metrics:?}");
    let text = String::from_utf8(metrics.stdout)?;
    ensure!(
        text.contains("# HELP muster_master_is_leader")
            && text.contains("muster_master_is_leader 1"),
        "{text}"
    );
    let unauthorized = curl(&server, "GET", "/metrics", None, None).await?;
    ensure!(unauthorized.status == 401, "{unauthorized:?}");

    // The cluster's status; then stop the job.
    let status = curl(&server, "GET", "/v1/status", Some(("x", &reader)), None).await?;
    ensure!(
        status.status == 200
            && status.body["is_leader"] == true
            && status.body["term"].as_u64() >= Some(1)
            && status.body["members"][0]["leader"] == true
            && status.body["commit_index"].as_u64() >= Some(1),
        "{status:?}"
    );
    let agents = curl(&server, "GET", "/v1/agents", Some(("x", &reader)), None).await?;
    ensure!(
        agents.status == 200 && agents.body["agents"].as_array().is_some(),
        "{agents:?}"
    );
    // Drain and eligibility: management only; an unknown agent, a bad deadline and a bad
    // body are named.
    let not_allowed = curl(
        &server,
        "POST",
        "/v1/agent/agent-9/drain",
        Some(("x", &reader)),
        Some("{}"),
    )
    .await?;
    ensure!(not_allowed.status == 403, "{not_allowed:?}");
    let unknown = curl(
        &server,
        "POST",
        "/v1/agent/agent-9/drain",
        Some(("x", &management)),
        Some(r#"{"deadline": "5m"}"#),
    )
    .await?;
    ensure!(
        unknown.status == 404
            && unknown.body["message"]
                .as_str()
                .is_some_and(|m| m.contains("agent-9")),
        "{unknown:?}"
    );
    let bad_deadline = curl(
        &server,
        "POST",
        "/v1/agent/agent-9/drain",
        Some(("x", &management)),
        Some(r#"{"deadline": "soon"}"#),
    )
    .await?;
    ensure!(
        bad_deadline.status == 400
            && bad_deadline.body["message"]
                .as_str()
                .is_some_and(|m| m.contains("deadline")),
        "{bad_deadline:?}"
    );
    let bad_body = curl(
        &server,
        "POST",
        "/v1/agent/agent-9/eligibility",
        Some(("x", &management)),
        Some(r#"{"eligible": "yes"}"#),
    )
    .await?;
    ensure!(
        bad_body.status == 400 && code(&bad_body) == "bad_request",
        "{bad_body:?}"
    );
    let stopped = curl(
        &server,
        "DELETE",
        "/v1/job/shop",
        Some(("x", &management)),
        None,
    )
    .await?;
    ensure!(stopped.status == 200, "{stopped:?}");
    let after = curl(&server, "GET", "/v1/job/shop", Some(("x", &reader)), None).await?;
    if after.body["stopped"] != true {
        bail!("the job was not stopped: {after:?}");
    }
    // Its history: the stop is the current version, the submission before it.
    let versions = curl(
        &server,
        "GET",
        "/v1/job/shop/versions",
        Some(("x", &reader)),
        None,
    )
    .await?;
    ensure!(
        versions.status == 200
            && versions.body["versions"][0]["stopped"] == true
            && versions.body["versions"][1]["version"] == 1
            && versions.body["versions"][1]["job"]["group"][0]["count"] == 2,
        "{versions:?}"
    );
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn the_http_port_in_use_is_named_at_start() -> anyhow::Result<()> {
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let address = taken.local_addr()?.to_string();
    let dir = tempfile::tempdir()?;
    let error = MasterServer::start(MasterConfig {
        http_listen: Some(address.clone()),
        workers: 0,
        ..master_config(dir.path())
    })
    .await
    .err()
    .context("a master started on a port in use")?;
    ensure!(error.to_string().contains(&address), "{error}");
    Ok(())
}

/// `n` distinct free ports on localhost, as `host:port` (all held while they are picked, so
/// none is handed out twice).
fn free_addresses(n: usize) -> anyhow::Result<Vec<String>> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()?;
    held.iter()
        .map(|l| Ok(l.local_addr()?.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_redirects_to_the_leaders_http_port_and_is_ready() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let ports = free_addresses(4)?;
    let (grpc, http) = ports.split_at(2);
    let members: std::collections::BTreeMap<u64, String> =
        [(1, grpc[0].clone()), (2, grpc[1].clone())].into();
    let http_members: std::collections::BTreeMap<u64, String> =
        [(1, http[0].clone()), (2, http[1].clone())].into();
    let config = |id: u64| MasterConfig {
        id,
        listen: members[&id].clone(),
        http_listen: Some(http_members[&id].clone()),
        members: members.clone(),
        http_members: http_members.clone(),
        data_dir: dir.path().join(format!("master-{id}")),
        workers: 0,
        ..MasterConfig::new(TestPki::shared().security(Role::Master, &format!("master-{id}")))
    };
    let (one, two) = tokio::join!(
        MasterServer::start(config(1)),
        MasterServer::start(config(2))
    );
    let masters = [one?, two?];
    // Whoever leads: the other redirects.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let (leader, standby) = loop {
        let states: Vec<bool> = futures_util::future::join_all(masters.iter().map(|m| async {
            m.pid()
                .ask(|reply| GetMetrics { reply }.into())
                .await
                .is_ok_and(|metrics| metrics.is_leader)
        }))
        .await;
        match states.as_slice() {
            [true, false] => break (&masters[0], &masters[1]),
            [false, true] => break (&masters[1], &masters[0]),
            _ => {}
        }
        ensure!(tokio::time::Instant::now() < deadline, "no leader in 30 s");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let token = bootstrap(leader.address()).await?;
    // The standby knows the leader: ready.
    let ready = curl(standby, "GET", "/v1/health/ready", None, None).await?;
    ensure!(ready.status == 200, "{ready:?}");
    let redirected = curl(
        standby,
        "GET",
        "/v1/jobs?prefix=a",
        Some(("x", &token)),
        None,
    )
    .await?;
    ensure!(
        redirected.status == 307 && code(&redirected) == "not_leader",
        "{redirected:?}"
    );
    let location = format!(
        "location: https://{}/v1/jobs?prefix=a",
        leader.http_address()
    );
    ensure!(redirected.headers.contains(&location), "{redirected:?}");
    // A stale read is answered by the standby itself.
    let stale = curl(
        standby,
        "GET",
        "/v1/jobs?stale=true",
        Some(("x", &token)),
        None,
    )
    .await?;
    ensure!(
        stale.status == 200 && stale.body["read"]["stale"] == true,
        "{stale:?}"
    );
    for master in masters {
        master.shutdown().await;
    }
    Ok(())
}

/// A batch job whose one group sets `env`, as the HTTP API's JSON document.
fn job_document(name: &str, env: &[(&str, &str)]) -> String {
    let env: serde_json::Map<String, Value> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
        .collect();
    serde_json::json!({
        "name": name,
        "type": "batch",
        "group": [{"name": "g", "count": 1, "command": "true", "cpus": 0.1, "mem_mb": 16, "env": env}],
    })
    .to_string()
}

/// The same job as the protobuf `Job` gRPC takes.
fn job_proto(name: &str, env: &[(&str, &str)]) -> muster_proto::model::Job {
    use muster_proto::model as model_pb;
    model_pb::Job {
        name: name.into(),
        scheduler: model_pb::SchedulerType::Batch.into(),
        groups: vec![model_pb::TaskGroup {
            name: "g".into(),
            count: 1,
            resources: Some(model_pb::Resources {
                cpus: 0.1,
                mem_mb: 16,
            }),
            command: "true".into(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    }
}

#[tokio::test]
async fn a_job_over_the_size_cap_or_with_a_nul_is_refused_alike_on_http_and_grpc()
-> anyhow::Result<()> {
    use muster_proto::cluster as pb;

    const CAP: usize = 64 * 1024;
    let dir = tempfile::tempdir()?;
    let server = muster_master::testing::start_leading(MasterConfig {
        workers: 0,
        job_limits: muster_model::JobLimits {
            max_bytes: CAP,
            ..muster_model::JobLimits::default()
        },
        ..master_config(dir.path())
    })
    .await?;
    let management = bootstrap(server.address()).await?;
    let mut grpc = muster_master::testing::operator(server.address(), Some(&management)).await?;
    let submit = |job| pb::SubmitJobRequest { job: Some(job) };

    let blob = "x".repeat(CAP);
    let over_http = curl(
        &server,
        "POST",
        "/v1/jobs",
        Some(("x", &management)),
        Some(&job_document("big-http", &[("BLOB", &blob)])),
    )
    .await?;
    let message = over_http.body["message"].as_str().unwrap_or("");
    ensure!(
        over_http.status == 400
            && code(&over_http) == "invalid_argument"
            && message.contains("--max-job-bytes")
            && message.contains(&format!("cap of {CAP} bytes")),
        "{over_http:?}"
    );
    let over_grpc = grpc
        .submit_job(submit(job_proto("big-grpc", &[("BLOB", &blob)])))
        .await
        .expect_err("over the cap");
    ensure!(
        over_grpc.code() == tonic::Code::InvalidArgument
            && over_grpc.message().contains("--max-job-bytes")
            && over_grpc.message().contains(&format!("cap of {CAP} bytes")),
        "{over_grpc:?}"
    );

    let nul_http = curl(
        &server,
        "POST",
        "/v1/jobs",
        Some(("x", &management)),
        Some(&job_document("nul-http", &[("KEY", "a\u{0}b")])),
    )
    .await?;
    let message = nul_http.body["message"].as_str().unwrap_or("");
    ensure!(
        nul_http.status == 400 && message.contains("U+0000") && message.contains("env"),
        "{nul_http:?}"
    );
    let nul_grpc = grpc
        .submit_job(submit(job_proto("nul-grpc", &[("KEY", "a\u{0}b")])))
        .await
        .expect_err("a NUL");
    ensure!(
        nul_grpc.code() == tonic::Code::InvalidArgument && nul_grpc.message().contains("U+0000"),
        "{nul_grpc:?}"
    );

    // Just under the cap, both doors take it.
    let fits = "y".repeat(CAP - 200);
    let taken = curl(
        &server,
        "POST",
        "/v1/jobs",
        Some(("x", &management)),
        Some(&job_document("fits-http", &[("BLOB", &fits)])),
    )
    .await?;
    ensure!(taken.status == 200, "{taken:?}");
    grpc.submit_job(submit(job_proto("fits-grpc", &[("BLOB", &fits)])))
        .await?;
    let jobs = grpc
        .list_jobs(pb::ListJobsRequest::default())
        .await?
        .into_inner();
    let mut names: Vec<&str> = jobs.jobs.iter().map(|j| j.name.as_str()).collect();
    names.sort_unstable();
    ensure!(names == ["fits-grpc", "fits-http"], "{names:?}");
    server.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_answered_413_with_a_json_document() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let server = muster_master::testing::start_leading(MasterConfig {
        workers: 0,
        ..master_config(dir.path())
    })
    .await?;
    let management = bootstrap(server.address()).await?;
    let limit = muster_master::http::MAX_BODY_BYTES;
    let body = format!("{{\"name\": \"{}\"}}", "x".repeat(limit + 1024));
    let answer = curl(
        &server,
        "POST",
        "/v1/jobs",
        Some(("x-muster-token", &management)),
        Some(&body),
    )
    .await?;
    ensure!(answer.status == 413, "{answer:?}");
    ensure!(code(&answer) == "payload_too_large", "{answer:?}");
    let message = answer.body["message"].as_str().unwrap_or_default();
    ensure!(
        message.contains(&body.len().to_string()) && message.contains(&limit.to_string()),
        "the refusal names the size and the limit: {message}"
    );
    // The server goes on.
    let live = curl(&server, "GET", "/v1/health/live", None, None).await?;
    ensure!(live.status == 200, "{live:?}");
    Ok(())
}
