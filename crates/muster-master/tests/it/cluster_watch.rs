//! A remote scheduler's live copy of the cluster (`Scheduling/WatchCluster`): three real
//! masters, two real agents, and a `RemoteBackend` in the test keeping its copy. After jobs
//! are placed and run, and again after the leader is shut down and another takes over, the
//! copy equals the snapshot the leader answers (`Scheduling/Snapshot`) at the same index.

use std::time::Duration;

use anyhow::bail;
use muster_master::requests::GetMetrics;
use muster_master::testing::{self, job_when};
use muster_master::{MasterConfig, MasterServer};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_proto::scheduling as spb;
use muster_scheduler::{Backend, ClusterSnapshot, RemoteBackend, RemoteConfig};
use tokio::time::Instant;

use crate::common::{self, agent_config, free_addresses, member_config};

const DEADLINE: Duration = Duration::from_secs(30);

async fn leading(master: &MasterServer) -> bool {
    master
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await
        .is_ok_and(|metrics| metrics.is_leader)
}

/// The master of `masters` that leads, once one does.
async fn leader(masters: &[MasterServer]) -> anyhow::Result<usize> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        for (k, master) in masters.iter().enumerate() {
            if leading(master).await {
                return Ok(k);
            }
        }
        if Instant::now() > deadline {
            bail!("no master leads after {DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A snapshot as the wire shows it, each agent's tasks by id (the order of a job's tasks among
/// themselves is not part of the state).
fn normalized(snapshot: ClusterSnapshot) -> spb::ClusterSnapshot {
    let mut wire = spb::ClusterSnapshot::from(snapshot);
    for agent in &mut wire.agents {
        agent.tasks.sort_by(|a, b| a.id.cmp(&b.id));
    }
    wire
}

/// Waits until the copy `watching` keeps is, at some index, what `asking` is answered at it.
async fn copy_matches(watching: &RemoteBackend, asking: &RemoteBackend) -> anyhow::Result<()> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let asked = asking.snapshot(0).await?;
        let copy = watching.snapshot(asked.index).await;
        let reached = copy.as_ref().map(|copy| copy.index).ok();
        if let Ok(copy) = copy
            && copy.index == asked.index
        {
            let (copy, asked) = (normalized(copy), normalized(asked));
            if copy == asked {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "at index {} the copy differs:\n{copy:#?}\nfrom\n{asked:#?}",
                    asked.index
                );
            }
        } else if Instant::now() > deadline {
            bail!("the copy did not reach index {}: {reached:?}", asked.index);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn job(name: &str, count: u32) -> model_pb::Job {
    model_pb::Job {
        name: name.into(),
        scheduler: model_pb::SchedulerType::Service as i32,
        groups: vec![model_pb::TaskGroup {
            name: "server".into(),
            count,
            resources: Some(model_pb::Resources {
                cpus: 0.25,
                mem_mb: 32,
            }),
            command: "sleep".into(),
            args: vec!["60".into()],
            env: [("SECRET".to_owned(), "not for schedulers".to_owned())].into(),
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_copy_equals_the_leaders_state_through_changes_and_a_failover()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let members = free_addresses(3).await?;
    let mut masters = Vec::new();
    for id in [1, 2, 3] {
        // Retrying: a member's address, picked free, may be taken for a moment by another
        // member's outgoing connection.
        masters.push(
            common::start_retrying(MasterConfig {
                workers: 1,
                ..member_config(id, &members, dir.path())
            })
            .await?,
        );
    }
    let first = leader(&masters).await?;
    let root = testing::bootstrap(masters[first].address()).await?;
    let schedule =
        testing::create_token(masters[first].address(), &root, "scheduler", "schedule").await?;
    let addresses: Vec<String> = members.values().cloned().collect();
    let mut agents = Vec::new();
    for name in ["agent-1", "agent-2"] {
        let config = agent_config(addresses.clone(), dir.path(), name, (4.0, 1024));
        agents.push(common::start_agent(name, config).await?);
    }

    let watching = RemoteBackend::connect(
        addresses.clone(),
        testing::client_security(),
        Some(schedule.clone()),
    )?;
    let asking = RemoteBackend::connect_with(
        addresses.clone(),
        RemoteConfig {
            replica: false,
            ..RemoteConfig::new(testing::client_security(), Some(schedule))
        },
    )?;
    // Many changes: jobs placed, tasks starting and running, a job stopped.
    for (name, count) in [("web", 3), ("api", 2), ("batchy", 4)] {
        testing::submit(&masters[first], job(name, count)).await?;
    }
    copy_matches(&watching, &asking).await?;
    for name in ["web", "api"] {
        job_when(&masters[first], name, "running", |s| {
            s.tasks
                .iter()
                .filter(|t| {
                    t.task
                        .as_ref()
                        .is_some_and(|t| t.state == model_pb::TaskState::Running as i32)
                })
                .count()
                >= 2
        })
        .await?;
    }
    copy_matches(&watching, &asking).await?;
    // Registry writes that change no job (evaluations completed, tasks reported) came between
    // these; the master leaves the jobs out of the watch's snapshots while their versions are
    // what the watch holds, and sends a job once it changes: one updated, one stopped.
    testing::submit(&masters[first], job("web", 4)).await?;
    let mut admin = testing::operator(masters[first].address(), Some(&root)).await?;
    admin
        .stop_job(pb::StopJobRequest {
            name: "batchy".into(),
            ..pb::StopJobRequest::default()
        })
        .await?;
    copy_matches(&watching, &asking).await?;
    let copy = watching.snapshot(0).await?;
    assert_eq!(
        copy.jobs["web"].groups[0].count, 4,
        "the update reached the copy"
    );
    assert!(copy.jobs["batchy"].stopped, "the stop reached the copy");
    assert_eq!(copy.agents.len(), 2);
    assert!(copy.agents.iter().map(|a| a.tasks().len()).sum::<usize>() >= 9);
    assert!(
        copy.jobs
            .values()
            .all(|job| job.groups.iter().all(|g| g.env.is_empty())),
        "no environment reaches a scheduler"
    );
    let before = watching.received();
    assert_eq!(before.watches, 1, "{before:?}");
    assert_eq!(
        before.snapshots, 0,
        "the copy asked for no snapshot: {before:?}"
    );

    // The leader goes; another takes over, the agents re-register with it, and the copy
    // follows without being sent everything again.
    let gone = masters.remove(first);
    gone.shutdown().await;
    let next = leader(&masters).await?;
    testing::submit(&masters[next], job("after", 2)).await?;
    job_when(&masters[next], "after", "placed", |s| s.tasks.len() == 2).await?;
    copy_matches(&watching, &asking).await?;
    let after = watching.received();
    assert!(after.watches >= 2, "{after:?}");

    for (_node, agent, _) in agents {
        agent.stop().await;
    }
    for master in masters {
        master.shutdown().await;
    }
    Ok(())
}

/// A registry write (a job) moves the master's state index even when changes to agents and
/// tasks have run it ahead of the registry's: a snapshot at an index taken after the write
/// holds the job, so a copy that reached that index has it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_job_written_moves_the_index_past_every_snapshot_before_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = testing::start_leading(MasterConfig {
        workers: 1,
        ..common::master_config(dir.path())
    })
    .await?;
    let config = agent_config(
        vec![master.address().to_owned()],
        dir.path(),
        "agent-1",
        (8.0, 4096),
    );
    let (_node, agent, _) = common::start_agent("agent-1", config).await?;
    for n in 0..8 {
        // The task changes of the job before (staged, started, running) move the state index
        // past the registry's.
        let before = snapshot(&master).await?;
        let name = format!("job-{n}");
        testing::submit(&master, job(&name, 1)).await?;
        let after = snapshot(&master).await?;
        assert!(after.jobs.contains_key(&name));
        assert!(
            after.index > before.index,
            "the write of {name} left the index at {}",
            after.index
        );
        job_when(&master, &name, "running", |s| {
            s.tasks.iter().any(|t| {
                t.task
                    .as_ref()
                    .is_some_and(|t| t.state == model_pb::TaskState::Running as i32)
            })
        })
        .await?;
    }
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

async fn snapshot(master: &MasterServer) -> anyhow::Result<ClusterSnapshot> {
    Ok(master
        .pid()
        .ask(|reply| muster_master::requests::GetSnapshot { reply }.into())
        .await?)
}
