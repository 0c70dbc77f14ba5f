//! Deployments on `muster dev`, with real processes: a three-replica HTTP service (this test
//! binary run as the task, on the port it was given) rolled to a version that never turns
//! healthy keeps at least `count - max_parallel` of its tasks serving throughout (probed over
//! HTTP during the roll), its deployment fails at the healthy deadline and rolls back to the
//! last version that deployed well; a canary runs beside the old tasks until an operator
//! promotes it (or, with `auto_promote`, until it is healthy); a system job rolls with a
//! canary too, and an operator's `fail` rolls it back.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use common::DevCluster;
use common::dev_jobs::{http_service_command, job_status, run_job, status_until, tasks_of};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The `web` job: three tasks of this binary's HTTP service answering `version {version}`,
/// whose `/health` fails with `healthy = false`, rolled one at a time.
fn web(version: u32, healthy: bool, update: &str) -> anyhow::Result<String> {
    Ok(format!(
        "name = \"web\"\n[[group]]\nname = \"fe\"\ncount = 3\n{}cpus = 0.05\nmem_mb = 32\n\
         env = {{ MUSTER_TEST_SERVE = \"1\", VERSION = \"{version}\", HEALTH = \"{}\" }}\n\
         [[group.port]]\nlabel = \"http\"\n\
         [[group.check]]\nname = \"alive\"\ntype = \"http\"\nport = \"http\"\npath = \"/health\"\n\
         interval = \"100ms\"\ntimeout = \"100ms\"\nunhealthy_threshold = 1000\n\
         [group.update]\n{update}",
        http_service_command()?,
        if healthy { "ok" } else { "fail" },
    ))
}

/// `muster deployment ARGS --json`.
async fn deployment(cluster: &DevCluster, args: &[&str]) -> anyhow::Result<Value> {
    let mut all = vec!["deployment"];
    all.extend_from_slice(args);
    all.push("--json");
    let output = cluster.cli(&all)?.output().await?;
    ensure!(
        output.status.success(),
        "deployment {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).context("deployment --json")
}

/// Polls `deployment status ID --json` until its status is `status`.
async fn deployment_becomes(cluster: &DevCluster, id: &str, status: &str) -> anyhow::Result<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let found = deployment(cluster, &["status", id]).await;
        if let Ok(d) = &found
            && d["status"] == status
        {
            return found;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "deployment {id} not {status} within a minute: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// GET / of the service on `port`: its body, if it answers 200.
async fn get(port: u64) -> Option<String> {
    let answer = tokio::time::timeout(Duration::from_secs(1), async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port as u16))
            .await
            .ok()?;
        stream
            .write_all(b"GET / HTTP/1.1\r\nhost: web\r\nconnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.ok()?;
        Some(answer)
    })
    .await
    .ok()
    .flatten()?;
    answer.starts_with("HTTP/1.1 200").then(|| {
        answer
            .rsplit("\r\n\r\n")
            .next()
            .unwrap_or_default()
            .to_owned()
    })
}

/// How many of the job's running tasks answer HTTP with `version 1`, now.
async fn serving_version_1(cluster: &DevCluster) -> anyhow::Result<usize> {
    let status = job_status(cluster, "web").await?;
    let mut serving = 0;
    for task in tasks_of(&status, "fe") {
        if task["state"] != "running" {
            continue;
        }
        let Some(port) = task["ports"]["http"].as_u64() else {
            continue;
        };
        if get(port).await.as_deref() == Some("version 1") {
            serving += 1;
        }
    }
    Ok(serving)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_to_a_version_never_healthy_keeps_serving_fails_at_its_deadline_and_rolls_back()
-> anyhow::Result<()> {
    let cluster = DevCluster::start().await?;
    let update = "max_parallel = 1\nmin_healthy_time = \"300ms\"\nhealthy_deadline = \"3s\"\n\
                  progress_deadline = \"10s\"\nauto_revert = true\n";
    run_job(&cluster, "web", &web(1, true, update)?).await?;
    deployment_becomes(&cluster, "web.v1", "successful").await?;
    ensure!(
        serving_version_1(&cluster).await? == 3,
        "version 1 serves on three tasks"
    );

    // Version 2 never turns healthy. While it rolls, fails and rolls back, at least
    // count - max_parallel = 2 tasks serve version 1 at every look.
    run_job(&cluster, "web", &web(2, false, update)?).await?;
    let mut fewest = usize::MAX;
    let mut looks = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let rolled_back = loop {
        let serving = serving_version_1(&cluster).await?;
        fewest = fewest.min(serving);
        looks += 1;
        let v2 = deployment(&cluster, &["status", "web.v2"]).await?;
        let v3 = deployment(&cluster, &["status", "web.v3"]).await;
        if let Ok(v3) = v3
            && v3["status"] == "successful"
        {
            break v2;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no rollback deployed within 90 s: {v2}"
        );
    };
    ensure!(
        fewest >= 2,
        "fewest tasks serving version 1 at one look: {fewest} (of {looks} looks)"
    );
    ensure!(rolled_back["status"] == "failed", "{rolled_back}");
    ensure!(rolled_back["reverted_to"] == 1, "{rolled_back}");
    let why = rolled_back["description"].as_str().unwrap_or_default();
    ensure!(
        why.contains("healthy_deadline of 3s") && why.contains("rolling back to version 1"),
        "the failed deployment says why: {why}"
    );
    // Version 3 is version 1 again, on all three tasks.
    ensure!(
        serving_version_1(&cluster).await? == 3,
        "version 1 serves again on three tasks"
    );
    let status = job_status(&cluster, "web").await?;
    ensure!(status["version"] == 3, "{}", status["version"]);
    cluster.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_runs_beside_the_old_tasks_until_it_is_promoted() -> anyhow::Result<()> {
    let cluster = DevCluster::start().await?;
    let update = "max_parallel = 2\ncanary = 1\nmin_healthy_time = \"200ms\"\n\
                  healthy_deadline = \"20s\"\nprogress_deadline = \"0s\"\n";
    run_job(&cluster, "web", &web(1, true, update)?).await?;
    deployment_becomes(&cluster, "web.v1", "successful").await?;

    run_job(&cluster, "web", &web(2, true, update)?).await?;
    // The canary turns healthy and waits; the three old tasks run on, untouched.
    let waiting = status_until(&cluster, "web", "the canary healthy and waiting", |s| {
        let tasks = tasks_of(s, "fe");
        let running: Vec<&Value> = tasks
            .iter()
            .filter(|t| t["state"] == "running")
            .copied()
            .collect();
        let canary = running
            .iter()
            .any(|t| t["name"] == "web.fe[canary-0]" && t["health"] == "healthy");
        let old = running.iter().filter(|t| t["job_version"] == 1).count();
        if canary && old == 3 {
            Ok(())
        } else {
            Err(format!("running: {running:?}"))
        }
    })
    .await;
    waiting?;
    let v2 = deployment_becomes(&cluster, "web.v2", "running").await?;
    let awaiting = || async {
        let d = deployment(&cluster, &["status", "web.v2"]).await?;
        anyhow::Ok(
            d["description"]
                .as_str()
                .unwrap_or_default()
                .contains("promote"),
        )
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !awaiting().await? {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the deployment never said it awaits promotion: {v2}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let old_ids: BTreeSet<String> = tasks_of(&job_status(&cluster, "web").await?, "fe")
        .iter()
        .filter(|t| t["job_version"] == 1 && t["state"] == "running")
        .filter_map(|t| t["id"].as_str().map(str::to_owned))
        .collect();
    ensure!(old_ids.len() == 3, "still three old tasks: {old_ids:?}");

    let promoted = deployment(&cluster, &["promote", "web.v2"]).await?;
    ensure!(promoted["groups"][0]["promoted"] == true, "{promoted}");
    deployment_becomes(&cluster, "web.v2", "successful").await?;
    // Every task is version 2 now; the canary gave way.
    status_until(&cluster, "web", "three version-2 tasks", |s| {
        let running: Vec<&Value> = tasks_of(s, "fe")
            .into_iter()
            .filter(|t| t["state"] == "running")
            .collect();
        let all_new = running.len() == 3 && running.iter().all(|t| t["job_version"] == 2);
        let canary_gone = running.iter().all(|t| t["name"] != "web.fe[canary-0]");
        (all_new && canary_gone)
            .then_some(())
            .ok_or_else(|| format!("{running:?}"))
    })
    .await?;
    // A deployment that ended changes no more: said, and refused.
    let output = cluster
        .cli(&["deployment", "promote", "web.v2"])?
        .output()
        .await?;
    let said = String::from_utf8_lossy(&output.stderr);
    ensure!(
        !output.status.success() && said.contains("successful"),
        "promoting an ended deployment: {said}"
    );
    cluster.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_system_job_rolls_with_a_canary_and_rolls_back_when_failed() -> anyhow::Result<()> {
    let cluster = DevCluster::start().await?;
    let system = |version: u32| {
        format!(
            "name = \"node-exporter\"\ntype = \"system\"\n[[group]]\nname = \"x\"\n\
             command = \"sleep\"\nargs = [\"600\"]\ncpus = 0.05\nmem_mb = 16\n\
             env = {{ VERSION = \"{version}\" }}\n\
             [group.update]\ncanary = 1\nmin_healthy_time = \"200ms\"\nhealthy_deadline = \"20s\"\n\
             progress_deadline = \"0s\"\nauto_revert = true\nhealth = \"task_states\"\n"
        )
    };
    run_job(&cluster, "node-exporter", &system(1)).await?;
    deployment_becomes(&cluster, "node-exporter.v1", "successful").await?;
    // Version 2: the one agent's task is the canary; it waits for promotion.
    run_job(&cluster, "node-exporter", &system(2)).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let d = deployment(&cluster, &["status", "node-exporter.v2"]).await?;
        if d["description"]
            .as_str()
            .unwrap_or_default()
            .contains("promote")
        {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the system canary never waited for promotion: {d}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Failed by an operator: back to version 1 (Nomad still lacks this for system jobs).
    let failed = deployment(&cluster, &["fail", "node-exporter.v2"]).await?;
    ensure!(
        failed["status"] == "failed" && failed["reverted_to"] == 1,
        "{failed}"
    );
    deployment_becomes(&cluster, "node-exporter.v3", "successful").await?;
    let status = job_status(&cluster, "node-exporter").await?;
    let running: Vec<&Value> = tasks_of(&status, "x")
        .into_iter()
        .filter(|t| t["state"] == "running")
        .collect();
    ensure!(
        running.len() == 1 && running[0]["job_version"] == 3,
        "one task, of version 3 (version 1 again): {running:?}"
    );
    cluster.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_canaries_promote_themselves_with_auto_promote() -> anyhow::Result<()> {
    let cluster = DevCluster::start().await?;
    let update = "max_parallel = 3\ncanary = 1\nauto_promote = true\nmin_healthy_time = \"200ms\"\n\
                  healthy_deadline = \"20s\"\nprogress_deadline = \"0s\"\n";
    run_job(&cluster, "web", &web(1, true, update)?).await?;
    deployment_becomes(&cluster, "web.v1", "successful").await?;
    run_job(&cluster, "web", &web(2, true, update)?).await?;
    // No operator: the canary is promoted once healthy, and the roll ends.
    let done = deployment_becomes(&cluster, "web.v2", "successful").await?;
    ensure!(done["groups"][0]["promoted"] == true, "{done}");
    status_until(&cluster, "web", "three version-2 tasks", |s| {
        let running: Vec<&Value> = tasks_of(s, "fe")
            .into_iter()
            .filter(|t| t["state"] == "running")
            .collect();
        (running.len() == 3 && running.iter().all(|t| t["job_version"] == 2))
            .then_some(())
            .ok_or_else(|| format!("{running:?}"))
    })
    .await?;
    ensure!(
        serving_version_1(&cluster).await? == 0,
        "no task answers with version 1 any more"
    );
    cluster.stop().await
}
