//! Namespaces' quotas, enforced: the built-in schedulers place a namespace's tasks only up to
//! its quota and block the evaluation with the quota named in its description; a raised quota
//! releases it and the rest runs. The plan applier enforces the quota whatever a scheduler
//! planned (a hand-made plan through the scheduling API is partly committed, the rest refused
//! with the reason), and a task of the namespace ending releases an evaluation its quota held.

use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use muster_master::MasterServer;
use muster_master::testing::{TestOperator, bootstrap, job_when, operator, submit};
use muster_model::{Demand, EvalStatus, SchedulerType};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_scheduler::{Backend, Scheduler};

use crate::common::{agent_config, start_agent, start_master};
use crate::plans_bound::Cluster;

const DEADLINE: Duration = Duration::from_secs(30);

/// Namespace `name` with a quota of `tasks` tasks.
fn namespace(name: &str, tasks: u64) -> pb::Namespace {
    pb::Namespace {
        name: name.into(),
        description: format!("{name}, at most {tasks} tasks"),
        quota_tasks: Some(tasks),
        ..pb::Namespace::default()
    }
}

/// Service job `name` in `namespace`: `count` small `sleep 60` tasks.
fn sleeper(namespace: &str, name: &str, count: u32) -> model_pb::Job {
    model_pb::Job {
        name: name.into(),
        namespace: namespace.into(),
        scheduler: model_pb::SchedulerType::Service as i32,
        groups: vec![model_pb::TaskGroup {
            name: "main".into(),
            count,
            resources: Some(model_pb::Resources {
                cpus: 0.1,
                mem_mb: 16,
            }),
            command: "sleep".into(),
            args: vec!["60".into()],
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    }
}

/// How many of the job's tasks are live (staging, starting, running), and how many run.
fn live_and_running(status: &pb::JobStatusReply) -> (usize, usize) {
    let states: Vec<i32> = status
        .tasks
        .iter()
        .filter_map(|t| t.task.as_ref().map(|t| t.state))
        .collect();
    let running = model_pb::TaskState::Running as i32;
    let live = [
        model_pb::TaskState::Staging as i32,
        model_pb::TaskState::Starting as i32,
        running,
    ];
    (
        states.iter().filter(|s| live.contains(s)).count(),
        states.iter().filter(|s| **s == running).count(),
    )
}

/// The newest evaluation of job `name` in `namespace`, as `Operator/ListEvaluations` shows it.
async fn newest_eval(
    admin: &mut TestOperator,
    namespace: &str,
    name: &str,
) -> anyhow::Result<Option<model_pb::Evaluation>> {
    let list = admin
        .list_evaluations(pb::ListEvaluationsRequest {
            job: name.into(),
            namespace: namespace.into(),
            ..pb::ListEvaluationsRequest::default()
        })
        .await?
        .into_inner();
    Ok(list.evals.into_iter().next())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_runs_up_to_its_quota_and_a_raised_quota_runs_the_rest() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = start_master(dir.path()).await?;
    let config = agent_config(
        vec![master.address().to_owned()],
        dir.path(),
        "agent-1",
        (8.0, 8192),
    );
    let (_node, agent, _) = start_agent("agent-1", config).await?;
    let address = master.address().to_owned();
    let root = bootstrap(&address).await?;
    let mut admin = operator(&address, Some(&root)).await?;
    admin.apply_namespace(namespace("team-a", 2)).await?;
    // Room for 80 such tasks: only the quota holds the third back.
    submit(&master, sleeper("team-a", "web", 3)).await?;

    // The evaluation blocks, saying why; never more than two tasks live meanwhile.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let blocked = loop {
        let status = muster_master::testing::job_status(&master, "team-a:web").await?;
        let (live, _) = live_and_running(&status);
        ensure!(live <= 2, "the quota of 2 tasks was passed: {status:#?}");
        let eval = newest_eval(&mut admin, "team-a", "web").await?;
        if let Some(eval) = &eval
            && eval.status == model_pb::EvalStatus::Blocked as i32
        {
            break eval.clone();
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the evaluation did not block within {DEADLINE:?}: {eval:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let why = &blocked.status_description;
    ensure!(
        why.contains("namespace \"team-a\" is at its quota of 2 tasks"),
        "the blocked evaluation does not name the quota: {why:?}"
    );
    let status = job_when(&master, "team-a:web", "two tasks run", |status| {
        live_and_running(status).1 == 2
    })
    .await?;
    ensure!(live_and_running(&status) == (2, 2), "{status:#?}");

    // A raised quota releases the evaluation: the third task runs, with nothing else done.
    admin.apply_namespace(namespace("team-a", 3)).await?;
    job_when(&master, "team-a:web", "the third task runs", |status| {
        live_and_running(status).1 == 3
    })
    .await?;

    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

/// Plans `job`'s dequeued evaluation as a scheduler that ignores quotas would: the built-in
/// spread against the snapshot without them.
async fn plan_ignoring_quotas(
    cluster: &Cluster,
    assignment: &muster_scheduler::Assignment,
) -> anyhow::Result<(muster_scheduler::Plan, u64)> {
    let mut snapshot = cluster.backend.snapshot(assignment.min_index()).await?;
    let quota = snapshot.quotas.get("team-a").and_then(|q| q.tasks);
    ensure!(
        quota == Some(2),
        "the snapshot carries team-a's quota: {:?}",
        snapshot.quotas
    );
    snapshot.quotas.clear();
    let mut plan = muster_scheduler::spread().schedule(&assignment.eval, &snapshot);
    plan.eval_token.clone_from(&assignment.token);
    Ok((plan, snapshot.index))
}

/// Records `assignment`'s evaluation complete and acks it.
async fn settle(
    cluster: &Cluster,
    assignment: &muster_scheduler::Assignment,
) -> anyhow::Result<()> {
    let mut done = assignment.eval.clone();
    done.status = EvalStatus::Complete;
    cluster.backend.complete(&done, &assignment.token).await?;
    cluster
        .backend
        .ack(&assignment.eval.id, &assignment.token)
        .await?;
    Ok(())
}

/// The one evaluation of `job` dequeued through the scheduling API.
async fn dequeue_one(cluster: &Cluster, job: &str) -> anyhow::Result<muster_scheduler::Assignment> {
    let mut held = cluster.dequeue(&[job]).await?;
    held.remove(job)
        .with_context(|| format!("dequeued another job's evaluation than {job}'s: {held:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applier_refuses_placements_past_a_quota_and_an_ended_task_releases_the_wait()
-> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let master: &MasterServer = &cluster.master;
    let mut admin = operator(master.address(), Some(&cluster.root)).await?;
    admin.apply_namespace(namespace("team-a", 2)).await?;

    // `other` takes one of team-a's two tasks.
    submit(master, sleeper("team-a", "other", 1)).await?;
    let other = dequeue_one(&cluster, "team-a:other").await?;
    let placed = cluster.backend.submit(cluster.plan(&other).await?).await?;
    ensure!(placed.committed.len() == 1, "{placed:?}");
    settle(&cluster, &other).await?;

    // A plan for `web` made blind to the quota places both its tasks: the applier commits
    // one and refuses the other, naming the quota.
    submit(master, sleeper("team-a", "web", 2)).await?;
    let web = dequeue_one(&cluster, "team-a:web").await?;
    ensure!(web.eval.scheduler == SchedulerType::Service);
    let (plan, snapshot_index) = plan_ignoring_quotas(&cluster, &web).await?;
    ensure!(plan.place.len() == 2, "{plan:?}");
    let result = cluster.backend.submit(plan).await?;
    ensure!(
        result.committed.len() == 1 && result.rejected.len() == 1,
        "one committed, one refused: {result:?}"
    );
    let refused = &result.rejected[0];
    let reason = result
        .over_quota
        .get(&refused.task_id)
        .with_context(|| format!("no reason for the refused placement: {result:?}"))?;
    ensure!(
        reason == "namespace \"team-a\" is at its quota of 2 tasks (it would have 3)",
        "{reason:?}"
    );
    let live = cluster.live_tasks("team-a:web").await?;
    ensure!(live.len() == 1, "{live:?}");

    // Blocked as a worker blocks it: the description names the quota.
    let mut blocked = web.eval.clone();
    blocked.status = EvalStatus::Blocked;
    blocked.snapshot_index = snapshot_index;
    let demand = Demand {
        gang_fitting: 0,
        gang: 0,
        resources: refused.resources.clone(),
        constraints: Vec::new(),
        over_quota: Some(reason.clone()),
    };
    cluster
        .backend
        .block(blocked, &web.token, vec![demand])
        .await?;
    cluster.backend.ack(&web.eval.id, &web.token).await?;
    let listed = newest_eval(&mut admin, "team-a", "web")
        .await?
        .context("web's evaluation")?;
    ensure!(
        listed.status == model_pb::EvalStatus::Blocked as i32
            && listed.status_description.contains(reason.as_str()),
        "{listed:?}"
    );

    // `other` stops: its task's end releases web's evaluation, which places the second task.
    admin
        .stop_job(pb::StopJobRequest {
            name: "other".into(),
            namespace: "team-a".into(),
        })
        .await?;
    let stopping = dequeue_one(&cluster, "team-a:other").await?;
    let stopped = cluster
        .backend
        .submit(cluster.plan(&stopping).await?)
        .await?;
    ensure!(stopped.stopped.len() == 1, "{stopped:?}");
    settle(&cluster, &stopping).await?;
    let released = dequeue_one(&cluster, "team-a:web").await?;
    ensure!(
        released.eval.id == web.eval.id && released.eval.status_description.contains("\"team-a\""),
        "{:?}",
        released.eval
    );
    let placed = cluster
        .backend
        .submit(cluster.plan(&released).await?)
        .await?;
    ensure!(
        placed.committed.len() == 1 && placed.rejected.is_empty(),
        "{placed:?}"
    );
    settle(&cluster, &released).await?;
    let live = cluster.live_tasks("team-a:web").await?;
    ensure!(live.len() == 2, "{live:?}");

    cluster.shutdown().await;
    Ok(())
}
