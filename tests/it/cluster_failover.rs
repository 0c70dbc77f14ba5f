//! A real cluster on loopback: 3 `muster-master` and 5 `muster-agent` processes. The leading
//! master is SIGKILLed three times in a row (and restarted each time); after each kill a new
//! leader is elected, every agent re-registers with it, their tasks are in its state, and no
//! admitted agent is lost. And 3 masters, one stopped while jobs at the size cap are
//! submitted: when it comes back it catches up on tens of MB without an election.
//!
//! And clusters whose agents and masters reach each other through links the test cuts (see
//! `partitions`), each process on its own loopback
//! address, counting the tasks' real processes and the runs each batch task records in a file
//! of its slot: a leader cut from every agent (both ways) and healed; a batch task finished
//! before a failover on an agent that re-registers late; a leader killed with its launches
//! unconfirmed, or as it acknowledges a submission. Each child's stderr goes to a log file,
//! copied out and printed if the test fails (kept in any case with `MUSTER_TEST_KEEP_LOGS`
//! set).
//!
//! And a rolling deployment (one task replaced a second) whose leader is SIGKILLed part-way:
//! the new leader carries it on to the end.
//!
//! The binaries come from the same target directory as this test: `cargo test --workspace`
//! builds them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use common::{DEADLINE, Masters, agent_command, leader_state_when, start_agents};
use muster::proto::cluster as pb;
use muster::proto::model as model_pb;
use muster_security::TokenSecret;
use muster_security::testing::partitions::{Member, Partitions};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::common;

mod partitions;

fn all_back(state: &pb::ClusterState, agents: usize) -> bool {
    state.agents.len() == agents
        && state
            .agents
            .iter()
            .all(|a| a.connected && a.tasks.len() == 1)
        && state.unreachable.is_empty()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_survives_three_leader_kills() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut masters = Masters::new(dir.path(), 3).await?;
    masters.start_all().await?;
    let root = muster_master::testing::bootstrap(&masters.addresses[0]).await?;

    // The test's tasks end with it.
    let mut agents = start_agents(dir.path(), &masters.addresses, 5, |n| {
        vec!["--hostname".into(), format!("host-{n}")]
    })
    .await?;

    let (leader, state) =
        leader_state_when(&masters.addresses, &root, "5 agents registering", |s| {
            s.agents.len() == 5 && s.agents.iter().all(|a| a.connected)
        })
        .await?;
    let admitted: Vec<String> = state.agents.iter().map(|a| a.id.clone()).collect();

    // One long task per agent, so there is something to rebuild.
    let mut client =
        muster_master::testing::operator(&masters.addresses[leader], Some(&root)).await?;
    for (n, agent) in admitted.iter().enumerate() {
        client
            .launch_task(pb::LaunchTaskRequest {
                agent_id: agent.clone(),
                framework: Some(pb::Framework {
                    id: "framework-test".into(),
                    name: "test".into(),
                }),
                task: Some(model_pb::Task {
                    id: format!("sleeper-{n}"),
                    command: "sleep".into(),
                    args: vec!["120".into()],
                    ..model_pb::Task::default()
                }),
            })
            .await
            .with_context(|| format!("launching a task on {agent}"))?;
    }
    let mut leader = leader_state_when(&masters.addresses, &root, "tasks running", |s| {
        all_back(s, 5)
    })
    .await?
    .0;

    for round in 1..=3 {
        let mut killed = masters.children[leader].take().context("leader process")?;
        killed.start_kill()?;
        killed.wait().await?;
        let (new_leader, state) = leader_state_when(
            &masters.addresses,
            &root,
            &format!("round {round}: a new leader with every agent back"),
            |s| !s.recovering && all_back(s, 5),
        )
        .await?;
        assert_ne!(new_leader, leader, "round {round}: the killed master leads");
        let mut ids: Vec<String> = state.agents.iter().map(|a| a.id.clone()).collect();
        ids.sort();
        let mut expected = admitted.clone();
        expected.sort();
        assert_eq!(ids, expected, "round {round}: admitted agents lost");
        let mut tasks: Vec<String> = state
            .agents
            .iter()
            .flat_map(|a| a.tasks.iter().map(|t| t.id.clone()))
            .collect();
        tasks.sort();
        assert_eq!(
            tasks,
            (0..5).map(|n| format!("sleeper-{n}")).collect::<Vec<_>>()
        );
        masters.start(leader).await?;
        leader = new_leader;
    }

    for child in agents
        .iter_mut()
        .chain(masters.children.iter_mut().flatten())
    {
        terminate(child).await?;
    }
    Ok(())
}

/// A batch job of about `bytes` encoded, its one group's environment printable noise.
fn job_of_size(name: &str, bytes: usize, seed: u64) -> model_pb::Job {
    let mut rng = fastrand::Rng::with_seed(seed);
    let blob: String = (0..bytes).map(|_| rng.alphanumeric()).collect();
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
            env: [("BLOB".to_owned(), blob)].into(),
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_back_from_a_stop_catches_up_on_jobs_at_the_size_cap_without_an_election()
-> anyhow::Result<()> {
    use prost::Message as _;

    let dir = tempfile::tempdir()?;
    let mut masters = Masters::new(dir.path(), 3).await?;
    masters.start_all().await?;
    let root = muster_master::testing::bootstrap(&masters.addresses[0]).await?;
    let (leader, state) =
        leader_state_when(&masters.addresses, &root, "a leader", |_| true).await?;
    let term = state.term;
    let stopped = (leader + 1) % 3;
    let mut child = masters.children[stopped].take().context("a follower")?;
    child.start_kill()?;
    child.wait().await?;

    // Four jobs of ten versions each, every version just under the default cap of 1 MiB:
    // some 40 MB of log the stopped master misses.
    let mut client =
        muster_master::testing::operator(&masters.addresses[leader], Some(&root)).await?;
    let cap = muster_model::DEFAULT_MAX_JOB_BYTES;
    for version in 0..10u64 {
        for name in ["big-a", "big-b", "big-c", "big-d"] {
            let job = job_of_size(name, cap - 100, version);
            assert!(job.encoded_len() <= cap, "{}", job.encoded_len());
            client
                .submit_job(pb::SubmitJobRequest { job: Some(job) })
                .await
                .with_context(|| format!("submitting {name} version {version}"))?;
        }
    }
    let over = client
        .submit_job(pb::SubmitJobRequest {
            job: Some(job_of_size("too-big", cap + 1, 0)),
        })
        .await
        .expect_err("over the cap");
    assert!(
        over.code() == tonic::Code::InvalidArgument && over.message().contains("--max-job-bytes"),
        "{over:?}"
    );
    let written = client
        .get_state(pb::GetStateRequest::default())
        .await?
        .into_inner()
        .commit_index;

    masters.start(stopped).await?;
    let mut back =
        muster_master::testing::operator(&masters.addresses[stopped], Some(&root)).await?;
    let deadline = tokio::time::Instant::now() + common::DEADLINE;
    loop {
        // Until it has applied the token's entry, it does not know the token.
        let read = back.get_state(pb::GetStateRequest { stale: true }).await;
        let applied = match &read {
            Ok(state) => state.get_ref().read.unwrap_or_default().applied_index,
            Err(status) if status.code() == tonic::Code::Unauthenticated => 0,
            Err(status) => anyhow::bail!("reading the restarted master's state: {status}"),
        };
        if applied >= written {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the restarted master applied {applied} of {written} entries (last answer {read:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Every term change is an election: there was none, and the same master leads.
    let (now_leading, state) =
        leader_state_when(&masters.addresses, &root, "a leader", |_| true).await?;
    assert_eq!(
        (now_leading, state.term),
        (leader, term),
        "the catch-up cost an election"
    );
    for child in masters.children.iter_mut().flatten() {
        terminate(child).await?;
    }
    Ok(())
}

/// `web`: four `sleep` tasks of version `version` (its environment), rolled one at a time,
/// each new task running for a second before the next is replaced.
fn rolled_web(version: u32) -> model_pb::Job {
    model_pb::Job {
        name: "web".into(),
        groups: vec![model_pb::TaskGroup {
            name: "fe".into(),
            count: 4,
            resources: Some(model_pb::Resources {
                cpus: 0.05,
                mem_mb: 16,
            }),
            command: "sleep".into(),
            args: vec!["600".into()],
            env: [("VERSION".to_owned(), version.to_string())].into(),
            update: Some(model_pb::UpdatePolicy {
                max_parallel: 1,
                min_healthy_time_ms: 1_000,
                healthy_deadline_ms: 30_000,
                progress_deadline_ms: 60_000,
                health: model_pb::HealthCriteria::TaskStates.into(),
                ..model_pb::UpdatePolicy::default()
            }),
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    }
}

/// Deployment `id` as the master at `address` has it (stale: any master answers).
async fn deployment_at(
    address: &str,
    root: &TokenSecret,
    id: &str,
) -> anyhow::Result<Option<model_pb::Deployment>> {
    let mut client = muster_master::testing::operator(address, Some(root)).await?;
    let request = pb::ListDeploymentsRequest {
        id: id.into(),
        stale: true,
        ..pb::ListDeploymentsRequest::default()
    };
    Ok(match client.list_deployments(request).await {
        Ok(list) => list.into_inner().deployments.into_iter().next(),
        Err(status) if status.code() == tonic::Code::NotFound => None,
        Err(status) => return Err(status).context("listing deployments"),
    })
}

/// Polls the masters until one has deployment `id` where `done` says.
async fn deployment_when(
    masters: &Masters,
    root: &TokenSecret,
    id: &str,
    what: &str,
    done: impl Fn(&model_pb::Deployment) -> bool,
) -> anyhow::Result<model_pb::Deployment> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        for (index, address) in masters.addresses.iter().enumerate() {
            if masters.children[index].is_none() {
                continue;
            }
            if let Ok(Some(found)) = deployment_at(address, root, id).await
                && done(&found)
            {
                return Ok(found);
            }
        }
        ensure!(
            Instant::now() < deadline,
            "deployment {id}: not {what} in time"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_deployment_goes_on_after_its_leader_is_killed_mid_roll() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut masters = Masters::new(dir.path(), 3).await?;
    masters.start_all().await?;
    let root = muster_master::testing::bootstrap(&masters.addresses[0]).await?;
    let mut agents = start_agents(dir.path(), &masters.addresses, 2, |_| Vec::new()).await?;
    let (leader, _) = leader_state_when(&masters.addresses, &root, "2 agents", |s| {
        s.agents.len() == 2 && s.agents.iter().all(|a| a.connected)
    })
    .await?;
    common::submit(&masters.addresses[leader], &root, rolled_web(1)).await?;
    let successful = model_pb::DeploymentStatus::Successful as i32;
    deployment_when(&masters, &root, "web.v1", "successful", |d| {
        d.status == successful
    })
    .await?;

    // Version 2 rolls one task a second; the leader dies once the first new task counts.
    let (leader, _) = leader_state_when(&masters.addresses, &root, "a leader", |_| true).await?;
    common::submit(&masters.addresses[leader], &root, rolled_web(2)).await?;
    let running = model_pb::DeploymentStatus::Running as i32;
    let mid = deployment_when(&masters, &root, "web.v2", "part-way", |d| {
        d.status == running && d.groups.iter().any(|g| !g.healthy.is_empty())
    })
    .await?;
    let healthy_before = mid.groups[0].healthy.len();
    ensure!(
        healthy_before < 4,
        "the roll was over before the kill: {mid:?}"
    );
    let mut killed = masters.children[leader].take().context("leader process")?;
    killed.start_kill()?;
    killed.wait().await?;

    // A new leader carries it on to the end: every task is version 2.
    let done = deployment_when(&masters, &root, "web.v2", "successful", |d| {
        d.status == successful
    })
    .await?;
    ensure!(done.groups[0].healthy.len() >= 4, "{done:?}");
    let (_, state) = leader_state_when(&masters.addresses, &root, "four version-2 tasks", |s| {
        let live: Vec<&model_pb::Task> = s
            .agents
            .iter()
            .flat_map(|a| &a.tasks)
            .filter(|t| t.job == "web" && t.state == model_pb::TaskState::Running as i32)
            .collect();
        live.len() == 4 && live.iter().all(|t| t.job_version == 2)
    })
    .await?;
    ensure!(!state.recovering, "recovered");
    for child in agents
        .iter_mut()
        .chain(masters.children.iter_mut().flatten())
    {
        terminate(child).await?;
    }
    Ok(())
}

/// SIGTERM, so the agent stops (and, with `--stop-tasks-on-exit`, kills) its tasks, then wait.
async fn terminate(child: &mut Child) -> anyhow::Result<()> {
    if let Some(pid) = child.id() {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .await;
    }
    match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
        Ok(status) => status.map(drop).context("waiting for a child"),
        Err(_) => {
            child.start_kill()?;
            child.wait().await.map(drop).context("killing a child")
        }
    }
}
