//! Groups placed all at once (`gang`), with a real master and real agents over TLS: an atomic
//! plan that no longer fits commits nothing, and a gang job too big for the cluster waits,
//! saying how many of its tasks found room, until an agent joins and it runs whole.

use anyhow::ensure;
use muster_master::testing;
use muster_master::{MasterConfig, MasterServer};
use muster_proto::model as model_pb;
use muster_scheduler::Backend;

use crate::common::{agent_config, master_config, start_agent};
use crate::plans_bound::Cluster;

/// A service job whose one group of `count` one-cpu tasks is placed all at once.
fn gang_job(name: &str, count: u32, cpus: f64) -> model_pb::Job {
    model_pb::Job {
        name: name.into(),
        scheduler: model_pb::SchedulerType::Service as i32,
        groups: vec![model_pb::TaskGroup {
            name: "workers".into(),
            count,
            resources: Some(model_pb::Resources { cpus, mem_mb: 64 }),
            command: "sleep".into(),
            args: vec!["60".into()],
            gang: true,
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_atomic_plan_that_no_longer_fits_commits_nothing() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    // The agent has 4 cpus: the gang's 3 fit, then a 2-cpu job takes the room first.
    testing::submit(&cluster.master, gang_job("train", 3, 1.0)).await?;
    testing::submit(&cluster.master, gang_job("filler", 1, 2.0)).await?;
    let held = cluster.dequeue(&["train", "filler"]).await?;
    let (Some(train), Some(filler)) = (held.get("train"), held.get("filler")) else {
        anyhow::bail!("dequeued {:?}", held.keys().collect::<Vec<_>>());
    };
    let train_plan = cluster.plan(train).await?;
    ensure!(
        train_plan.atomic && train_plan.place.len() == 3,
        "{train_plan:?}"
    );
    let filler_plan = cluster.plan(filler).await?;
    let filled = cluster.backend.submit(filler_plan).await?;
    ensure!(filled.committed.len() == 1, "{filled:?}");

    // Two of the three would still fit; atomic, none is committed.
    let result = cluster.backend.submit(train_plan).await?;
    ensure!(result.committed.is_empty(), "{result:?}");
    ensure!(result.rejected.len() == 3, "{result:?}");
    ensure!(cluster.live_tasks("train").await?.is_empty());
    cluster.shutdown().await;
    Ok(())
}

/// A master with built-in workers and one agent of 2 cpus.
async fn start(dir: &std::path::Path) -> anyhow::Result<MasterServer> {
    testing::start_leading(MasterConfig {
        workers: 1,
        ..master_config(dir)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_waits_saying_how_much_fit_and_runs_whole_once_room_appears() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = start(dir.path()).await?;
    let masters = vec![master.address().to_owned()];
    let (_first, first, _) = start_agent(
        "agent-1",
        agent_config(masters.clone(), dir.path(), "agent-1", (2.0, 4096)),
    )
    .await?;
    testing::submit(&master, gang_job("train", 3, 1.0)).await?;
    let waiting = testing::job_when(&master, "train", "its evaluation blocked", |status| {
        status.evals.iter().any(|e| {
            e.status == model_pb::EvalStatus::Blocked as i32
                && e.status_description == "a group of 3 tasks placed all at once found room for 2"
        })
    })
    .await?;
    ensure!(waiting.tasks.is_empty(), "{waiting:#?}");

    // A second agent makes room for the third task: all three are placed together.
    let (_second, second, _) = start_agent(
        "agent-2",
        agent_config(masters, dir.path(), "agent-2", (2.0, 4096)),
    )
    .await?;
    let placed = crate::common::job_runs(&master, "train", 3).await?;
    ensure!(placed.tasks.len() == 3, "{placed:#?}");
    first.stop().await;
    second.stop().await;
    master.shutdown().await;
    Ok(())
}
