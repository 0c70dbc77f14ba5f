//! Deployments over the HTTP API: a job with an update block lists its deployments newest
//! first, one is read by id (404 for an unknown one), the job's document names its latest, and
//! promote, pause, resume and fail change it, each refusal a JSON error naming the problem.
//! No scheduler runs: a deployment starts with its version and stays running until changed.

use super::*;

/// The `roll` job: a service whose group `fe` is rolled one task at a time, with one canary.
fn rolling_job(args: &str) -> String {
    serde_json::json!({
        "name": "roll",
        "type": "service",
        "group": [{
            "name": "fe", "count": 2, "command": "sleep", "args": [args],
            "cpus": 0.1, "mem_mb": 16,
            "update": {
                "max_parallel": 1, "canary": 1, "min_healthy_time": "100ms",
                "healthy_deadline": "10s", "progress_deadline": "0s"
            }
        }]
    })
    .to_string()
}

/// The message of an error answer.
fn message(answer: &Answer) -> &str {
    answer.body["message"].as_str().unwrap_or("")
}

#[tokio::test]
async fn deployments_are_listed_read_and_changed_over_http() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let server = muster_master::testing::start_leading(MasterConfig {
        workers: 0,
        ..master_config(dir.path())
    })
    .await?;
    let management = bootstrap(server.address()).await?;
    let reader = create_token(server.address(), &management, "reader", "read").await?;
    let admin = Some(("x", &management));
    let read = Some(("x", &reader));

    // Version 1 starts a deployment (no canaries for a first version); version 2, a changed
    // command, starts one that waits for its canary to be promoted and supersedes the first.
    for args in ["600", "601"] {
        let submitted = curl(&server, "POST", "/v1/jobs", admin, Some(&rolling_job(args))).await?;
        ensure!(submitted.status == 200, "{submitted:?}");
    }
    let batch = curl(&server, "POST", "/v1/jobs", admin, Some(JOB)).await?;
    ensure!(batch.status == 200, "{batch:?}");

    let list = curl(&server, "GET", "/v1/deployments?job=roll", read, None).await?;
    ensure!(
        list.status == 200 && list.headers.contains("x-muster-index:"),
        "{list:?}"
    );
    let deployments = list.body["deployments"].as_array().context("deployments")?;
    ensure!(deployments.len() == 2, "{list:?}");
    let (newest, oldest) = (&deployments[0], &deployments[1]);
    ensure!(
        newest["id"] == "roll.v2"
            && newest["job"] == "roll"
            && newest["namespace"] == "default"
            && newest["job_version"] == 2
            && newest["status"] == "running"
            && newest["groups"][0]["name"] == "fe"
            && newest["groups"][0]["max_parallel"] == 1
            && newest["groups"][0]["desired_total"] == 2
            && newest["groups"][0]["desired_canaries"] == 1
            && newest["groups"][0]["promoted"] == false,
        "{newest}"
    );
    ensure!(
        oldest["id"] == "roll.v1" && oldest["status"] == "cancelled",
        "{oldest}"
    );
    // Every job's, in the namespace or in every one the token may read; a stale read.
    for query in ["", "?namespace=*", "?stale=true"] {
        let all = curl(
            &server,
            "GET",
            &format!("/v1/deployments{query}"),
            read,
            None,
        )
        .await?;
        ensure!(
            all.status == 200 && all.body["deployments"][0]["id"] == "roll.v2",
            "{query}: {all:?}"
        );
    }
    let all_of_one = curl(
        &server,
        "GET",
        "/v1/deployments?job=roll&namespace=*",
        read,
        None,
    )
    .await?;
    ensure!(
        all_of_one.status == 400 && code(&all_of_one) == "invalid_argument",
        "{all_of_one:?}"
    );

    // One by id; an unknown one is a JSON 404 naming it.
    let one = curl(&server, "GET", "/v1/deployment/roll.v1", read, None).await?;
    ensure!(
        one.status == 200 && one.body["id"] == "roll.v1" && one.body["job_version"] == 1,
        "{one:?}"
    );
    for unknown in ["roll.v9", "nothing"] {
        let missing = curl(
            &server,
            "GET",
            &format!("/v1/deployment/{unknown}"),
            read,
            None,
        )
        .await?;
        ensure!(
            missing.status == 404
                && code(&missing) == "not_found"
                && message(&missing).contains(unknown),
            "{missing:?}"
        );
    }

    // The job's document names its latest deployment; a batch job has none.
    let job = curl(&server, "GET", "/v1/job/roll", read, None).await?;
    ensure!(
        job.status == 200 && job.body["deployment"]["id"] == "roll.v2",
        "{job:?}"
    );
    let shop = curl(&server, "GET", "/v1/job/shop", read, None).await?;
    ensure!(
        shop.status == 200 && shop.body.get("deployment").is_none(),
        "{shop:?}"
    );

    // Changes: a reader may not; a body that is not a promotion is named.
    let denied = curl(&server, "POST", "/v1/deployment/roll.v2/pause", read, None).await?;
    ensure!(
        denied.status == 403 && code(&denied) == "permission_denied",
        "{denied:?}"
    );
    let typo = curl(
        &server,
        "POST",
        "/v1/deployment/roll.v2/promote",
        admin,
        Some(r#"{"group": "fe"}"#),
    )
    .await?;
    ensure!(
        typo.status == 400 && code(&typo) == "bad_request" && message(&typo).contains("group"),
        "{typo:?}"
    );

    // Pause, then resume; a second resume is refused, naming why.
    let paused = curl(&server, "POST", "/v1/deployment/roll.v2/pause", admin, None).await?;
    ensure!(
        paused.status == 200 && paused.body["status"] == "paused",
        "{paused:?}"
    );
    let resumed = curl(
        &server,
        "POST",
        "/v1/deployment/roll.v2/resume",
        admin,
        None,
    )
    .await?;
    ensure!(
        resumed.status == 200 && resumed.body["status"] == "running",
        "{resumed:?}"
    );
    let again = curl(
        &server,
        "POST",
        "/v1/deployment/roll.v2/resume",
        admin,
        None,
    )
    .await?;
    ensure!(
        again.status == 409
            && code(&again) == "failed_precondition"
            && message(&again).contains("roll.v2")
            && message(&again).contains("not paused"),
        "{again:?}"
    );

    // Promote the canary of `fe`; there is nothing left to promote after.
    let promoted = curl(
        &server,
        "POST",
        "/v1/deployment/roll.v2/promote",
        admin,
        Some(r#"{"groups": ["fe"]}"#),
    )
    .await?;
    ensure!(
        promoted.status == 200 && promoted.body["groups"][0]["promoted"] == true,
        "{promoted:?}"
    );
    let nothing = curl(
        &server,
        "POST",
        "/v1/deployment/roll.v2/promote",
        admin,
        None,
    )
    .await?;
    ensure!(
        nothing.status == 409 && message(&nothing).contains("no canaries"),
        "{nothing:?}"
    );

    // Fail it: it changes no more; an unknown one is a 404.
    let failed = curl(&server, "POST", "/v1/deployment/roll.v2/fail", admin, None).await?;
    ensure!(
        failed.status == 200 && failed.body["status"] == "failed",
        "{failed:?}"
    );
    let ended = curl(&server, "POST", "/v1/deployment/roll.v2/pause", admin, None).await?;
    ensure!(
        ended.status == 409 && message(&ended).contains("failed"),
        "{ended:?}"
    );
    let unknown = curl(&server, "POST", "/v1/deployment/roll.v9/pause", admin, None).await?;
    ensure!(
        unknown.status == 404 && code(&unknown) == "not_found",
        "{unknown:?}"
    );

    // The OpenAPI document has them.
    let openapi = curl(&server, "GET", "/v1/openapi.json", None, None).await?;
    ensure!(
        openapi.body["paths"]["/v1/deployment/{id}/promote"]["post"].is_object()
            && openapi.body["paths"]["/v1/deployments"]["get"].is_object(),
        "{openapi:?}"
    );
    server.shutdown().await;
    Ok(())
}
