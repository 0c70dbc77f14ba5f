//! Preemption with a real master and agent over TLS: a system job of high priority stops one
//! task of a lower-priority service job on a full agent (system jobs preempt by default), its
//! own task runs there, and the service job is evaluated again, its task waiting for room.

use anyhow::{Context as _, ensure};
use muster_master::testing;
use muster_master::{MasterConfig, MasterServer};
use muster_proto::model as model_pb;
use muster_scheduler::Backend as _;

use crate::common::{self, agent_config, master_config, start_agent};

fn job(name: &str, kind: model_pb::SchedulerType, priority: u32, count: u32) -> model_pb::Job {
    model_pb::Job {
        name: name.into(),
        scheduler: kind as i32,
        priority,
        groups: vec![model_pb::TaskGroup {
            name: "g".into(),
            count,
            resources: Some(model_pb::Resources {
                cpus: 1.0,
                mem_mb: 64,
            }),
            command: "sleep".into(),
            args: vec!["60".into()],
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    }
}

async fn killed(master: &MasterServer, name: &str) -> anyhow::Result<usize> {
    let status = testing::job_status(master, name).await?;
    Ok(status
        .tasks
        .iter()
        .filter(|t| {
            t.task
                .as_ref()
                .is_some_and(|t| t.state == model_pb::TaskState::Killed as i32)
        })
        .count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_system_job_preempts_a_lower_priority_task_which_is_evaluated_again() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let master = testing::start_leading(MasterConfig {
        workers: 1,
        ..master_config(dir.path())
    })
    .await?;
    let (_node, agent, _) = start_agent(
        "agent-1",
        agent_config(
            vec![master.address().to_owned()],
            dir.path(),
            "agent-1",
            (2.0, 4096),
        ),
    )
    .await?;
    testing::submit(
        &master,
        job("batchy", model_pb::SchedulerType::Service, 10, 2),
    )
    .await?;
    common::job_runs(&master, "batchy", 2).await?;

    testing::submit(
        &master,
        job("monitor", model_pb::SchedulerType::System, 90, 1),
    )
    .await?;
    common::job_runs(&master, "monitor", 1).await?;
    ensure!(killed(&master, "batchy").await? == 1);
    let after = testing::job_when(&master, "batchy", "evaluated for its preempted task", |s| {
        s.evals.iter().any(|e| {
            e.trigger
                .as_ref()
                .and_then(|t| t.kind.as_ref())
                .is_some_and(|kind| matches!(kind, model_pb::trigger::Kind::Preempted(_)))
        })
    })
    .await?;
    let running = after
        .tasks
        .iter()
        .filter(|t| {
            t.task
                .as_ref()
                .is_some_and(|t| t.state == model_pb::TaskState::Running as i32)
        })
        .count();
    ensure!(running == 1, "{after:#?}");
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

/// Through the scheduling API: the snapshot says system jobs may preempt, the remote plan names
/// the task, and the applier's answer lists it as preempted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_plan_preempts_through_the_scheduling_api() -> anyhow::Result<()> {
    let cluster = crate::plans_bound::Cluster::start().await?;
    // The agent has 4 cpus: four tasks of priority 10 fill it.
    testing::submit(
        &cluster.master,
        job("filler", model_pb::SchedulerType::Service, 10, 4),
    )
    .await?;
    let held = cluster.dequeue(&["filler"]).await?;
    let filler = held.get("filler").context("filler dequeued")?;
    let filled = cluster.backend.submit(cluster.plan(filler).await?).await?;
    ensure!(filled.committed.len() == 4, "{filled:?}");

    testing::submit(
        &cluster.master,
        job("monitor", model_pb::SchedulerType::System, 90, 1),
    )
    .await?;
    let held = cluster.dequeue(&["monitor"]).await?;
    let monitor = held.get("monitor").context("monitor dequeued")?;
    let plan = cluster.plan(monitor).await?;
    ensure!(plan.preempt.len() == 1 && plan.place.len() == 1, "{plan:?}");
    ensure!(plan.preempt[0].job == "filler", "{plan:?}");
    // A plan whose placement is refused (on an agent that is not there) stops nothing.
    let mut elsewhere = plan.clone();
    elsewhere.place[0].agent = muster_model::AgentId("not-an-agent".into());
    let refused = cluster.backend.submit(elsewhere).await?;
    ensure!(
        refused.committed.is_empty() && refused.preempted.is_empty(),
        "{refused:?}"
    );
    ensure!(cluster.live_tasks("filler").await?.len() == 4);
    let result = cluster.backend.submit(plan).await?;
    ensure!(result.preempted.len() == 1, "{result:?}");
    ensure!(result.committed.len() == 1, "{result:?}");
    ensure!(cluster.live_tasks("filler").await?.len() == 3);
    cluster.shutdown().await;
    Ok(())
}
