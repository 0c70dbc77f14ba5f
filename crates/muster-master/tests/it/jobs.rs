//! Jobs on a real master: submitting writes the job and its evaluation in one raft entry and
//! hands the evaluation to the broker; bad specs are refused naming the field; stopping adds
//! an evaluation behind the first; a restarted master rebuilds its broker from the registry.

use std::path::Path;
use std::time::Duration;

use anyhow::bail;
use muster_broker::{BrokerMsg, BrokerStats};
use muster_master::requests::{GetSchedulingPids, GetState, StopJob};
use muster_master::testing::{job_status, try_submit};
use muster_master::{MasterConfig, MasterServer};
use muster_proto::model as model_pb;
use tokio::time::Instant;

use crate::common::{master_config, start_leading_retrying};

const DEADLINE: Duration = Duration::from_secs(20);

/// A master of [`master_config`] with no workers (the broker's queues stay as the master
/// filled them), once it leads; started again on the store of one just stopped.
async fn start(dir: &Path) -> anyhow::Result<MasterServer> {
    start_leading_retrying(MasterConfig {
        workers: 0,
        ..master_config(dir)
    })
    .await
}

fn spec(name: &str) -> model_pb::Job {
    model_pb::Job {
        name: name.into(),
        priority: 60,
        scheduler: model_pb::SchedulerType::Service as i32,
        groups: vec![model_pb::TaskGroup {
            name: "web".into(),
            count: 3,
            resources: Some(model_pb::Resources {
                cpus: 0.5,
                mem_mb: 128,
            }),
            command: "sleep".into(),
            args: vec!["60".into()],
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    }
}

async fn broker_stats(master: &MasterServer) -> anyhow::Result<BrokerStats> {
    let pids = master
        .pid()
        .ask(|reply| GetSchedulingPids { reply }.into())
        .await?;
    Ok(pids.broker.ask(BrokerMsg::Stats).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_stored_with_their_evaluation_and_survive_a_restart() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = start(dir.path()).await?;

    let submitted = try_submit(&master, spec("shop"))
        .await?
        .map_err(anyhow::Error::msg)?;
    assert_eq!(submitted.version, 1);
    let status = job_status(&master, "shop").await?;
    assert_eq!(status.job.as_ref().map(|j| j.groups[0].count), Some(3));
    assert_eq!(status.evals.len(), 1);
    assert_eq!(status.evals[0].id, submitted.eval_id);
    assert_eq!(status.evals[0].status, model_pb::EvalStatus::Pending as i32);
    assert!(status.evals[0].create_index > 0);
    assert_eq!(broker_stats(&master).await?.total().ready, 1);

    // A bad spec is refused, naming the field, and changes nothing.
    let mut bad = spec("shop");
    bad.groups[0].resources = Some(model_pb::Resources {
        cpus: -1.0,
        mem_mb: 128,
    });
    let refused = try_submit(&master, bad).await?;
    match refused {
        Err(e) => assert!(e.to_string().contains("groups[0].resources.cpus"), "{e}"),
        Ok(reply) => bail!("accepted a negative cpu count: {reply:?}"),
    }

    // Stopping adds an evaluation, which waits behind the one in flight.
    let stopped = master
        .pid()
        .ask(|reply| {
            StopJob {
                name: "shop".into(),
                reply,
            }
            .into()
        })
        .await?
        .map_err(anyhow::Error::msg)?;
    assert_eq!(stopped.version, 2);
    let stats = broker_stats(&master).await?.total();
    assert_eq!((stats.ready, stats.pending), (1, 1));
    let unknown = master
        .pid()
        .ask(|reply| {
            StopJob {
                name: "nope".into(),
                reply,
            }
            .into()
        })
        .await?;
    assert!(
        matches!(&unknown, Err(e) if e.to_string().contains("no job named \"nope\"")),
        "{unknown:?}"
    );

    // A new leader rebuilds the broker from the registry.
    master.shutdown().await;
    let master = start(dir.path()).await?;
    let deadline = Instant::now() + DEADLINE;
    loop {
        let stats = broker_stats(&master).await?.total();
        if (stats.ready, stats.pending) == (1, 1) {
            break;
        }
        if Instant::now() > deadline {
            bail!("the broker was not rebuilt: {stats:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let status = job_status(&master, "shop").await?;
    assert!(status.stopped);
    assert_eq!(status.version, 2);
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_over_the_size_caps_is_refused_naming_the_cap() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = start(dir.path()).await?;
    // 300 groups of 10,000: three million tasks in one submission.
    let mut huge = spec("huge");
    let group = huge.groups[0].clone();
    huge.groups = (0..300)
        .map(|i| model_pb::TaskGroup {
            name: format!("g{i}"),
            count: 10_000,
            ..group.clone()
        })
        .collect();
    match try_submit(&master, huge.clone()).await? {
        Err(e) => assert!(
            e.to_string().contains("300 task groups") && e.to_string().contains("cap of 100"),
            "{e}"
        ),
        Ok(reply) => bail!("accepted 300 groups: {reply:?}"),
    }
    huge.groups.truncate(6);
    match try_submit(&master, huge).await? {
        Err(e) => assert!(
            e.to_string().contains("60000 tasks") && e.to_string().contains("cap of 50000"),
            "{e}"
        ),
        Ok(reply) => bail!("accepted 60,000 tasks: {reply:?}"),
    }
    // Nothing was stored, and the master still takes a job within the caps.
    let state = master.pid().ask(|reply| GetState { reply }.into()).await?;
    assert!(state.frameworks.iter().all(|f| f.id != "huge"));
    assert!(try_submit(&master, spec("small")).await?.is_ok());
    assert_eq!(broker_stats(&master).await?.total().ready, 1);
    master.shutdown().await;
    Ok(())
}
