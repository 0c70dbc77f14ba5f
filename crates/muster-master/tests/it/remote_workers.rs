//! Scheduler workers outside the master: real masters running no workers of their own, real
//! agents, and workers in the test that reach the master through the scheduling API over
//! tonic with a `RemoteBackend`. A service job is placed and runs; a job too big blocks and is
//! placed when an agent joins; an unreachable master in the list is skipped and a standby
//! sends the workers (and operators) to the leader.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::bail;
use muster_agent::AgentHandle;
use muster_master::requests::{GetMetrics, GetState};
use muster_master::testing::{self, job_when};
use muster_master::{MasterConfig, MasterServer};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_proto::scheduling as spb;
use muster_proto::scheduling::scheduling_client::SchedulingClient;
use muster_scheduler::protocol::leader_hint;
use muster_scheduler::{RemoteBackend, Worker, WorkerConfig, WorkerStats};
use muster_security::TokenSecret;
use muster_security::guard::WithToken;
use muster_transport::Node;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::common::{self, agent_config, member_config};

const DEADLINE: Duration = Duration::from_secs(30);

/// [`member_config`] with no scheduler workers: scheduling is left to the workers in the test.
fn config(dir: &Path, id: u64, members: &BTreeMap<u64, String>) -> MasterConfig {
    MasterConfig {
        workers: 0,
        ..member_config(id, members, dir)
    }
}

async fn leading(master: &MasterServer) -> anyhow::Result<bool> {
    Ok(master
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await?
        .is_leader)
}

async fn start_master(dir: &Path) -> anyhow::Result<MasterServer> {
    testing::start_leading(config(dir, 1, &BTreeMap::new())).await
}

/// Bootstraps the ACLs of the master at `address` and makes a `schedule` token for workers.
async fn scheduler_token(address: &str) -> anyhow::Result<TokenSecret> {
    let root = testing::bootstrap(address).await?;
    testing::create_token(address, &root, "scheduler", "schedule").await
}

/// An address nothing listens on.
fn closed_address() -> anyhow::Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.to_string())
}

/// A real agent `name` of `masters` with `cpus` CPUs and 1 GiB ([`agent_config`]), presenting
/// the certificate `name`, once registered.
async fn start_agent(
    masters: Vec<String>,
    dir: &Path,
    name: &str,
    cpus: f64,
) -> anyhow::Result<(Node, AgentHandle, String)> {
    common::start_agent(name, agent_config(masters, dir, name, (cpus, 1024))).await
}

/// Scheduler workers of the test's own, each with its clone of one backend.
struct RemoteWorkers {
    stop: watch::Sender<bool>,
    running: Vec<JoinHandle<WorkerStats>>,
}

impl RemoteWorkers {
    fn start(backend: &RemoteBackend, count: usize) -> Self {
        let (stop, stopped) = watch::channel(false);
        let config = WorkerConfig {
            error_backoff: Duration::from_millis(50),
            ..WorkerConfig::default()
        };
        let running = (0..count)
            .map(|_| {
                let worker =
                    Worker::new(backend.clone(), muster_scheduler::spread(), config.clone());
                tokio::spawn(worker.run(stopped.clone()))
            })
            .collect();
        RemoteWorkers { stop, running }
    }

    /// Stops them and adds up what they did.
    async fn stop(self) -> anyhow::Result<WorkerStats> {
        let _ = self.stop.send(true);
        let mut total = WorkerStats::default();
        for worker in self.running {
            let stats = worker.await?;
            total.dequeued += stats.dequeued;
            total.placements_committed += stats.placements_committed;
            total.evals_completed += stats.evals_completed;
            total.evals_blocked += stats.evals_blocked;
            total.evals_nacked += stats.evals_nacked;
        }
        Ok(total)
    }
}

fn group(name: &str, count: u32, cpus: f64) -> model_pb::TaskGroup {
    model_pb::TaskGroup {
        name: name.into(),
        count,
        resources: Some(model_pb::Resources { cpus, mem_mb: 64 }),
        command: "sleep".into(),
        args: vec!["30".into()],
        ..model_pb::TaskGroup::default()
    }
}

/// Submits the service job `name` of the one `group`.
async fn submit(
    master: &MasterServer,
    name: &str,
    group: model_pb::TaskGroup,
) -> anyhow::Result<()> {
    let spec = model_pb::Job {
        name: name.into(),
        scheduler: model_pb::SchedulerType::Service as i32,
        groups: vec![group],
        ..model_pb::Job::default()
    };
    testing::submit(master, spec).await
}

fn in_state(status: &pb::JobStatusReply, states: &[model_pb::TaskState]) -> Vec<pb::JobTask> {
    status
        .tasks
        .iter()
        .filter(|t| {
            t.task
                .as_ref()
                .is_some_and(|t| states.iter().any(|s| *s as i32 == t.state))
        })
        .cloned()
        .collect()
}

fn live(status: &pb::JobStatusReply) -> Vec<pb::JobTask> {
    in_state(
        status,
        &[
            model_pb::TaskState::Staging,
            model_pb::TaskState::Starting,
            model_pb::TaskState::Running,
        ],
    )
}

async fn agent_runs(agent: &AgentHandle, count: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let running = agent.snapshot().await?.tasks.len();
        if running == count {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the agent runs {running} tasks, not {count}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_workers_place_a_service_job_past_an_unreachable_master() -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let dir = tempfile::tempdir()?;
    let master = start_master(dir.path()).await?;
    let (_node, agent, agent_id) =
        start_agent(vec![master.address().to_owned()], dir.path(), "only", 4.0).await?;

    // No worker runs yet, and the master has none of its own: the job waits.
    submit(&master, "web", group("server", 2, 0.5)).await?;
    let waiting = testing::job_status(&master, "web").await?;
    assert!(waiting.tasks.is_empty(), "{waiting:#?}");
    assert!(
        waiting
            .evals
            .iter()
            .any(|e| e.status == model_pb::EvalStatus::Pending as i32)
    );

    // The first master in the list is not there: the workers go on to the next.
    let unreachable = closed_address()?;
    let schedule = scheduler_token(master.address()).await?;
    let backend = RemoteBackend::connect(
        vec![unreachable.clone(), master.address().to_owned()],
        testing::client_security(),
        Some(schedule),
    )?;
    let workers = RemoteWorkers::start(&backend, 2);

    let placed = job_when(&master, "web", "two tasks running", |s| {
        in_state(s, &[model_pb::TaskState::Running]).len() == 2
    })
    .await?;
    assert!(placed.tasks.iter().all(|t| t.agent_id == agent_id));
    let mut names: Vec<String> = placed
        .tasks
        .iter()
        .filter_map(|t| t.task.as_ref().map(|t| t.name.clone()))
        .collect();
    names.sort();
    assert_eq!(names, ["web.server[0]", "web.server[1]"]);
    job_when(&master, "web", "the evaluation complete", |s| {
        s.evals
            .iter()
            .any(|e| e.status == model_pb::EvalStatus::Complete as i32)
    })
    .await?;
    agent_runs(&agent, 2).await?;
    assert_eq!(backend.current(), master.address());

    let stats = workers.stop().await?;
    assert!(stats.dequeued >= 1, "{stats:?}");
    assert_eq!(stats.placements_committed, 2, "{stats:?}");
    assert!(stats.evals_completed >= 1, "{stats:?}");
    assert_eq!(stats.evals_nacked, 0, "{stats:?}");

    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_too_big_blocks_and_is_placed_when_capacity_arrives() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = start_master(dir.path()).await?;
    let masters = vec![master.address().to_owned()];
    let (_first_node, first, first_id) =
        start_agent(masters.clone(), dir.path(), "first", 2.0).await?;
    let schedule = scheduler_token(master.address()).await?;
    let backend =
        RemoteBackend::connect(masters.clone(), testing::client_security(), Some(schedule))?;
    let workers = RemoteWorkers::start(&backend, 2);

    submit(&master, "big", group("server", 3, 1.0)).await?;
    let blocked = job_when(
        &master,
        "big",
        "two tasks placed and the rest blocked",
        |s| {
            live(s).len() == 2
                && s.evals
                    .iter()
                    .any(|e| e.status == model_pb::EvalStatus::Blocked as i32)
        },
    )
    .await?;
    assert!(live(&blocked).iter().all(|t| t.agent_id == first_id));

    // A second agent joins: the blocked evaluation is released and the third task placed.
    let (_second_node, second, second_id) = start_agent(masters, dir.path(), "second", 2.0).await?;
    let placed = job_when(&master, "big", "the third task placed", |s| {
        live(s).len() == 3
    })
    .await?;
    assert_eq!(
        live(&placed)
            .iter()
            .filter(|t| t.agent_id == second_id)
            .count(),
        1
    );
    agent_runs(&second, 1).await?;

    let stats = workers.stop().await?;
    assert!(stats.evals_blocked >= 1, "{stats:?}");
    assert_eq!(stats.placements_committed, 3, "{stats:?}");

    first.stop().await;
    second.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_sends_remote_workers_to_the_leader() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut members = BTreeMap::new();
    for id in [1, 2] {
        members.insert(id, closed_address()?);
    }
    let mut masters = Vec::new();
    for id in [1, 2] {
        masters.push(MasterServer::start(config(dir.path(), id, &members)).await?);
    }
    // Wait for a leader, and for the standby to know it.
    let deadline = Instant::now() + DEADLINE;
    let (leader, standby) = loop {
        let (a, b) = (&masters[0], &masters[1]);
        let (leader, standby) = match (leading(a).await?, leading(b).await?) {
            (true, false) => (a, b),
            (false, true) => (b, a),
            _ => (a, b),
        };
        if leading(leader).await?
            && standby
                .pid()
                .ask(|reply| GetState { reply }.into())
                .await?
                .leader
                == leader.address()
        {
            break (leader, standby);
        }
        if Instant::now() > deadline {
            bail!("no leader known to both masters within {DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    // The standby's answer names the leader.
    let root = testing::bootstrap(standby.address()).await?;
    let schedule = testing::create_token(leader.address(), &root, "scheduler", "schedule").await?;
    let mut client = SchedulingClient::with_interceptor(
        testing::channel(standby.address(), &testing::client_security()).await?,
        WithToken::new(Some(&schedule))?,
    );
    let answer = client
        .snapshot(spb::SnapshotRequest { min_index: 0 })
        .await
        .expect_err("a standby does not answer with a snapshot");
    assert_eq!(answer.code(), tonic::Code::FailedPrecondition, "{answer:?}");
    assert_eq!(
        leader_hint(&answer).as_deref(),
        Some(leader.address()),
        "{answer:?}"
    );
    let answer = client
        .dequeue(spb::DequeueRequest {
            schedulers: vec![model_pb::SchedulerType::Service as i32],
            timeout_ms: 10,
            scheduler_names: Vec::new(),
        })
        .await
        .expect_err("a standby hands out no evaluations");
    assert_eq!(leader_hint(&answer).as_deref(), Some(leader.address()));
    // A malformed request names its field.
    let answer = client
        .dequeue(spb::DequeueRequest {
            schedulers: vec![model_pb::SchedulerType::Service as i32, 42],
            timeout_ms: 10,
            scheduler_names: Vec::new(),
        })
        .await
        .expect_err("unknown scheduler type");
    assert_eq!(answer.code(), tonic::Code::InvalidArgument);
    assert!(answer.message().contains("schedulers[1]"), "{answer:?}");

    // The operator API's leader-only calls, and linearizable reads, answer a standby's way too.
    let mut operator = testing::operator(standby.address(), Some(&root)).await?;
    let answers = [
        operator
            .job_status(pb::JobStatusRequest {
                name: "web".into(),
                ..pb::JobStatusRequest::default()
            })
            .await
            .expect_err("a standby answers no linearizable job status"),
        operator
            .stop_job(pb::StopJobRequest {
                name: "web".into(),
                namespace: String::new(),
            })
            .await
            .expect_err("a standby stops no job"),
        operator
            .submit_job(pb::SubmitJobRequest { job: None })
            .await
            .expect_err("a standby takes no job"),
    ];
    for answer in answers {
        assert_eq!(answer.code(), tonic::Code::FailedPrecondition, "{answer:?}");
        assert_eq!(
            answer
                .metadata()
                .get(muster_scheduler::protocol::LEADER_METADATA)
                .and_then(|v| v.to_str().ok()),
            Some(leader.address()),
            "{answer:?}"
        );
        assert_eq!(
            muster_scheduler::protocol::leader_hint(&answer).as_deref(),
            Some(leader.address())
        );
    }
    // A stale read answers there, naming the leader.
    let state = operator
        .get_state(pb::GetStateRequest { stale: true })
        .await?
        .into_inner();
    assert!(!state.is_leader);
    assert_eq!(state.leader, leader.address());

    let addresses: Vec<String> = members.values().cloned().collect();
    let (_node, agent, _) = start_agent(addresses, dir.path(), "only", 4.0).await?;

    // The workers know an unreachable master and the standby, not the leader.
    let backend = RemoteBackend::connect(
        vec![closed_address()?, standby.address().to_owned()],
        testing::client_security(),
        Some(schedule.clone()),
    )?;
    let workers = RemoteWorkers::start(&backend, 2);
    submit(leader, "web", group("server", 2, 0.5)).await?;
    job_when(leader, "web", "two tasks running", |s| {
        in_state(s, &[model_pb::TaskState::Running]).len() == 2
    })
    .await?;
    agent_runs(&agent, 2).await?;
    assert_eq!(backend.current(), leader.address());
    assert!(backend.masters().iter().any(|m| m == leader.address()));

    let stats = workers.stop().await?;
    assert_eq!(stats.placements_committed, 2, "{stats:?}");

    agent.stop().await;
    for master in masters {
        master.shutdown().await;
    }
    Ok(())
}
