//! The agent with simulated tasks against a real master: a job's task is placed on it,
//! reported RUNNING, and FINISHED when its simulated sleep is over, as a process's would be.

use std::time::Duration;

use anyhow::Context as _;
use muster_agent::AgentConfig;
use muster_agent::runner::CustomRunner;
use muster_agent::simulated::SimulatedTasks;
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use tokio::time::Instant;

use crate::common::{AgentNode, start_master};

/// The simulated tasks' clock: the time since the first reading.
fn clock() -> Duration {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}

fn states(status: &pb::JobStatusReply) -> Vec<i32> {
    status
        .tasks
        .iter()
        .filter_map(|t| t.task.as_ref().map(|t| t.state))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_master_s_task_runs_and_finishes_on_simulated_tasks() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = start_master("127.0.0.1:0", dir.path()).await?;
    let machine = SimulatedTasks::new(clock);
    let mut config = AgentConfig::new(vec![master.address().to_owned()], dir.path().join("agent"));
    config.hostname = "simulated".into();
    config.resources = (4.0, 4096);
    config.registration_backoff_initial = Duration::from_millis(20);
    config.task_runner = Some(CustomRunner::new(machine.clone()));
    let agent = AgentNode::start_registered(config).await?;

    // A batch task that sleeps for three seconds of the simulated tasks' clock.
    let job = model_pb::Job {
        name: "nap".into(),
        scheduler: model_pb::SchedulerType::Batch as i32,
        groups: vec![model_pb::TaskGroup {
            name: "main".into(),
            count: 1,
            resources: Some(model_pb::Resources {
                cpus: 0.5,
                mem_mb: 64,
            }),
            command: "sleep".into(),
            args: vec!["3".into()],
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    };
    muster_master::testing::submit(&master, job).await?;
    let running = model_pb::TaskState::Running as i32;
    let finished = model_pb::TaskState::Finished as i32;
    // RUNNING first (the master hears of it long before the task's sleep is over).
    muster_master::testing::job_when(&master, "nap", "the task running", |s| {
        states(s) == [running]
    })
    .await?;
    assert_eq!(machine.running_names(), ["nap.main[0]"]);
    let done = muster_master::testing::job_when(&master, "nap", "the task finishing", |s| {
        states(s) == [finished]
    })
    .await?;
    let task = done.tasks[0].task.as_ref().context("no task")?;
    assert_eq!(task.exit_code, 0);
    let launches = machine.launches();
    assert_eq!(launches.len(), 1, "{launches:?}");
    assert_eq!(launches[0].task_id, task.id);
    assert!(launches[0].term >= 1, "{launches:?}");
    assert!(machine.running_names().is_empty());
    assert!(machine.kills().is_empty());

    agent.stop().await;
    master.shutdown().await;
    Ok(())
}
