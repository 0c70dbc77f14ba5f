//! The attacks a secured cluster must refuse, against a real master and a real agent over
//! mutual TLS: each is refused, and the cluster is as it was.
//!
//! - an agent certificate speaking for another agent (task updates, heartbeats,
//!   re-registration);
//! - launches and kills sent to an agent by anyone but a master;
//! - a client certificate on the actor transport (registering a forged agent);
//! - a certificate of another CA, and a plaintext client.

use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use muster_actor::{AskError, RemoteError, System};
use muster_agent::{AgentConfig, AgentHandle};
use muster_master::requests::GetMetrics;
use muster_master::{MasterServer, testing};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_security::testing::TestPki;
use muster_security::{Role, Security};
use muster_transport::Node;
use tokio::time::Instant;

use crate::common::{master_config, master_upid, start_agent, state, state_when};

const DEADLINE: Duration = Duration::from_secs(30);
const ASK: Duration = Duration::from_secs(10);

struct Cluster {
    master: MasterServer,
    agent_node: Node,
    agent: AgentHandle,
    agent_id: String,
    task_id: String,
    _dir: tempfile::TempDir,
}

/// A master with one agent (certificate `agent-a`) running one task of a job.
async fn cluster() -> anyhow::Result<Cluster> {
    let dir = tempfile::tempdir()?;
    let master = MasterServer::start(master_config(dir.path())).await?;
    let mut config = AgentConfig::new(vec![master.address().to_owned()], dir.path().join("agent"));
    config.registration_backoff_initial = Duration::from_millis(50);
    config.resources = (4.0, 4096);
    let (agent_node, agent, agent_id) = start_agent("agent-a", config).await?;

    let job = model_pb::Job {
        name: "web".into(),
        scheduler: model_pb::SchedulerType::Service as i32,
        priority: 50,
        groups: vec![model_pb::TaskGroup {
            name: "web".into(),
            count: 1,
            resources: Some(model_pb::Resources {
                cpus: 0.1,
                mem_mb: 16,
            }),
            command: "sleep".into(),
            args: vec!["600".into()],
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    };
    testing::submit(&master, job).await?;
    let state = state_when(&master, "the task running", |s| running(s).len() == 1).await?;
    let task_id = running(&state)[0].clone();
    Ok(Cluster {
        master,
        agent_node,
        agent,
        agent_id,
        task_id,
        _dir: dir,
    })
}

/// Ids of the running tasks the master knows.
fn running(state: &pb::ClusterState) -> Vec<String> {
    state
        .agents
        .iter()
        .flat_map(|a| &a.tasks)
        .filter(|t| t.state == model_pb::TaskState::Running as i32)
        .map(|t| t.id.clone())
        .collect()
}

async fn impersonations(master: &MasterServer) -> anyhow::Result<u64> {
    Ok(master
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await?
        .impersonations_refused)
}

/// A node of its own with `security`, as an attacker would run one.
async fn attacker(system: &System, security: Security) -> anyhow::Result<Node> {
    Ok(Node::bind(system, "127.0.0.1:0", security).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_certificate_cannot_speak_for_another_agent() -> anyhow::Result<()> {
    let cluster = cluster().await?;
    let system = System::new();
    let impostor = attacker(&system, TestPki::shared().security(Role::Agent, "agent-b")).await?;
    let master = impostor.remote(master_upid(&cluster.master)?);

    // A forged FINISHED for the other agent's running task.
    master.tell(pb::TaskStatusUpdate {
        agent_id: cluster.agent_id.clone(),
        task: Some(model_pb::Task {
            id: cluster.task_id.clone(),
            state: model_pb::TaskState::Finished as i32,
            ..model_pb::Task::default()
        }),
    })?;
    // A heartbeat and a re-registration in its name.
    let heartbeat: pb::HeartbeatReply = master
        .ask_timeout(
            ASK,
            pb::Heartbeat {
                agent_id: cluster.agent_id.clone(),
            },
        )
        .await?;
    match heartbeat.result {
        Some(pb::heartbeat_reply::Result::Refused(why)) => {
            ensure!(why.contains("cannot speak for"), "{why}");
        }
        other => bail!("a forged heartbeat was taken: {other:?}"),
    }
    let reregistered: pb::RegistrationReply = master
        .ask_timeout(
            ASK,
            pb::ReregisterAgent {
                agent_id: cluster.agent_id.clone(),
                info: Some(model_pb::AgentInfo {
                    hostname: "evil".into(),
                    address: format!("agent@{}", impostor.address()),
                    resources: Some(model_pb::Resources {
                        cpus: 512.0,
                        mem_mb: 1 << 20,
                    }),
                    ..model_pb::AgentInfo::default()
                }),
                ..pb::ReregisterAgent::default()
            },
        )
        .await?;
    match reregistered.result {
        Some(pb::registration_reply::Result::Refused(why)) => {
            ensure!(why.contains("agent-a") && why.contains("agent-b"), "{why}");
        }
        other => bail!("a forged re-registration was taken: {other:?}"),
    }

    // All three refused and counted; the task still runs on the real agent.
    let deadline = Instant::now() + DEADLINE;
    while impersonations(&cluster.master).await? < 3 {
        ensure!(
            Instant::now() < deadline,
            "the forged update was not refused"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let state = state(&cluster.master).await?;
    ensure!(running(&state) == [cluster.task_id.clone()], "{state:?}");
    let agent = state
        .agents
        .iter()
        .find(|a| a.id == cluster.agent_id)
        .context("the agent is gone")?;
    ensure!(agent.connected, "the real agent was disconnected");
    ensure!(
        agent.info.as_ref().is_some_and(|i| i.hostname != "evil"),
        "{agent:?}"
    );
    cluster.agent.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_master_may_launch_or_kill_on_an_agent() -> anyhow::Result<()> {
    let cluster = cluster().await?;
    let system = System::new();
    let agent_upid = cluster.agent.upid().clone();
    for security in [
        TestPki::shared().security(Role::Agent, "agent-b"),
        TestPki::shared().security(Role::Client, "cli"),
    ] {
        let node = attacker(&system, security).await?;
        let agent = node.remote(agent_upid.clone());
        let launched = agent
            .ask_timeout::<pb::RunTask, pb::RunTaskReply>(
                ASK,
                pb::RunTask {
                    framework: None,
                    task: Some(model_pb::Task {
                        id: "evil".into(),
                        command: "id".into(),
                        resources: Some(model_pb::Resources {
                            cpus: 0.1,
                            mem_mb: 16,
                        }),
                        ..model_pb::Task::default()
                    }),
                    term: 0,
                },
            )
            .await;
        refused(launched, "RunTask")?;
        let killed = agent
            .ask_timeout::<pb::KillTask, pb::KillTaskReply>(
                ASK,
                pb::KillTask {
                    task_id: cluster.task_id.clone(),
                    term: 0,
                },
            )
            .await;
        refused(killed, "KillTask")?;
    }
    ensure!(
        cluster.agent_node.stats().unauthorized >= 2,
        "{:?}",
        cluster.agent_node.stats()
    );
    let state = state(&cluster.master).await?;
    ensure!(running(&state) == [cluster.task_id.clone()], "{state:?}");
    cluster.agent.stop().await;
    Ok(())
}

/// The ask was refused: unauthorized for a cluster member's certificate, or the link itself
/// for a client's.
fn refused<T: std::fmt::Debug>(outcome: Result<T, AskError>, what: &str) -> anyhow::Result<()> {
    match outcome {
        Err(AskError::Remote(RemoteError::Unauthorized(_) | RemoteError::Unreachable { .. })) => {
            Ok(())
        }
        other => bail!("{what} was not refused: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_cannot_register_agents() -> anyhow::Result<()> {
    let cluster = cluster().await?;
    let system = System::new();
    for security in [
        TestPki::shared().security(Role::Client, "cli"),
        TestPki::shared().security(Role::Master, "rogue-master"),
        TestPki::foreign().security(Role::Agent, "foreign"),
        Security::Insecure,
    ] {
        let node = attacker(&system, security).await?;
        let registered = node
            .remote(master_upid(&cluster.master)?)
            .ask_timeout::<pb::RegisterAgent, pb::RegistrationReply>(
                ASK,
                pb::RegisterAgent {
                    info: Some(model_pb::AgentInfo {
                        hostname: "forged".into(),
                        address: format!("agent@{}", node.address()),
                        resources: Some(model_pb::Resources {
                            cpus: 512.0,
                            mem_mb: 1 << 20,
                        }),
                        ..model_pb::AgentInfo::default()
                    }),
                    ..Default::default()
                },
            )
            .await;
        match registered {
            Err(AskError::Remote(_)) => {}
            other => bail!("a forged registration was answered: {other:?}"),
        }
    }
    let state = state(&cluster.master).await?;
    ensure!(state.agents.len() == 1, "{state:?}");
    cluster.agent.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_never_admitted_agent_id_is_refused_and_told_to_register_anew() -> anyhow::Result<()> {
    let cluster = cluster().await?;
    let system = System::new();
    let stranger = attacker(&system, TestPki::shared().security(Role::Agent, "agent-99")).await?;
    let master = stranger.remote(master_upid(&cluster.master)?);
    let reply: pb::RegistrationReply = master
        .ask_timeout(
            ASK,
            pb::ReregisterAgent {
                agent_id: "agent-99".into(),
                info: Some(model_pb::AgentInfo {
                    hostname: "stranger".into(),
                    address: format!("agent@{}", stranger.address()),
                    resources: Some(model_pb::Resources {
                        cpus: 4.0,
                        mem_mb: 4096,
                    }),
                    ..model_pb::AgentInfo::default()
                }),
                ..pb::ReregisterAgent::default()
            },
        )
        .await?;
    match reply.result {
        Some(pb::registration_reply::Result::UnknownAgent(why)) => {
            ensure!(
                why.contains("agent-99") && why.contains("register anew"),
                "{why}"
            );
        }
        other => bail!("a never-admitted id was taken back: {other:?}"),
    }
    let metrics: pb::MasterMetrics = cluster
        .master
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await?;
    assert_eq!(metrics.unknown_agents_refused, 1);
    // Nothing of it is listed or counted: the one real agent is all there is.
    let state = state(&cluster.master).await?;
    ensure!(
        state.agents.len() == 1 && state.agents[0].id == cluster.agent_id,
        "{state:?}"
    );
    cluster.agent.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_registering_again_keeps_its_id_and_is_listed_once() -> anyhow::Result<()> {
    let cluster = cluster().await?;
    let system = System::new();
    let node = attacker(&system, TestPki::shared().security(Role::Agent, "agent-77")).await?;
    let master = node.remote(master_upid(&cluster.master)?);
    let register = pb::RegisterAgent {
        info: Some(model_pb::AgentInfo {
            hostname: "retrying".into(),
            address: format!("agent@{}", node.address()),
            resources: Some(model_pb::Resources {
                cpus: 2.0,
                mem_mb: 2048,
            }),
            ..model_pb::AgentInfo::default()
        }),
        ..Default::default()
    };
    let mut ids = Vec::new();
    // As an agent whose first answer was lost does: it asks again.
    for _ in 0..2 {
        let reply: pb::RegistrationReply = master.ask_timeout(ASK, register.clone()).await?;
        match reply.result {
            Some(pb::registration_reply::Result::AgentId(id)) => ids.push(id),
            other => bail!("registration refused: {other:?}"),
        }
    }
    ensure!(ids[0] == ids[1], "admitted twice: {ids:?}");
    let state = state(&cluster.master).await?;
    let listed = state
        .agents
        .iter()
        .filter(|a| a.info.as_ref().is_some_and(|i| i.hostname == "retrying"))
        .count();
    ensure!(listed == 1, "{state:?}");
    cluster.agent.stop().await;
    Ok(())
}
