//! Masters in one test process, agents played by the test over the real transport: standby
//! redirects, failover rebuilt from re-registrations, the re-registration deadline and the
//! removal limit (`rebuild`); a leader without its quorum and linearizable reads (`quorum`);
//! jobs across a failover (`recovery`); and agents marked unreachable with tasks on them, settled
//! by their groups' `disconnect` policies (`disconnect`). This file holds what they share beside
//! `crate::common` (the masters' settings, starting them, the cluster state): finding the
//! leader, and the agents the tests play.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use muster_actor::{System, Upid};
use muster_agent::reregistration::group_by_shared_labels;
use muster_master::requests::{GetMetrics, GetState, JobStatus, ListJobs, SubmitPlan};
use muster_master::testing::{job_status, submit};
use muster_master::{MasterConfig, MasterServer};
use muster_proto::cluster as pb;
use muster_proto::cluster::registration_reply::Result as Registration;
use muster_proto::model as model_pb;
use muster_transport::Node;
use tokio::time::Instant;

use crate::common::{
    agent_node, free_addresses, member_config, playing_many_agents, start_retrying, state_when,
    trigger_of,
};

mod disconnect;
mod quorum;
mod rebuild;
mod recovery;

const DEADLINE: Duration = Duration::from_secs(20);

/// An agent played by the test: what it would send, sent from its own node.
struct FakeAgent {
    id: String,
    info: model_pb::AgentInfo,
    tasks: Vec<model_pb::Task>,
}

fn agent_info(n: usize, node: &Node) -> model_pb::AgentInfo {
    model_pb::AgentInfo {
        dynamic_ports: Default::default(),
        hostname: format!("host-{n}"),
        address: format!("agent@{}", node.address()),
        resources: Some(model_pb::Resources {
            cpus: 20.0,
            mem_mb: 10240,
        }),
        attributes: [("rack".to_owned(), format!("r{}", n % 2))].into(),
    }
}

fn tasks(agent: usize) -> Vec<model_pb::Task> {
    (0..2)
        .map(|t| model_pb::Task {
            id: format!("task-{agent}-{t}"),
            framework_id: format!("framework-{t}"),
            resources: Some(model_pb::Resources {
                cpus: 0.1,
                mem_mb: 5,
            }),
            state: model_pb::TaskState::Running as i32,
            labels: vec![model_pb::Label {
                key: "tier".into(),
                value: format!("tier-{}", agent % 2),
            }],
            ..model_pb::Task::default()
        })
        .collect()
}

/// Sends `request` to any master, following "not leader" redirects, until one admits it.
async fn ask_until_admitted<M>(
    node: &Node,
    masters: &[String],
    request: M,
) -> anyhow::Result<String>
where
    M: prost::Message + prost::Name + Clone + 'static,
{
    match admission(node, masters, request).await?.result {
        Some(Registration::AgentId(id)) => Ok(id),
        other => bail!("not admitted: {other:?}"),
    }
}

/// [`ask_until_admitted`], answering with the whole reply that admitted the agent (its id,
/// and the tasks it is to kill first).
async fn admission<M>(
    node: &Node,
    masters: &[String],
    request: M,
) -> anyhow::Result<pb::RegistrationReply>
where
    M: prost::Message + prost::Name + Clone + 'static,
{
    let deadline = Instant::now() + DEADLINE;
    let mut target = format!("master@{}", masters[0]);
    let mut next = 0;
    loop {
        if Instant::now() > deadline {
            bail!("no master admitted the agent within {DEADLINE:?}");
        }
        let upid: Upid = target.parse()?;
        let answer = node
            .remote(upid)
            .ask_timeout::<M, pb::RegistrationReply>(Duration::from_secs(2), request.clone())
            .await;
        match answer.as_ref().map(|a| &a.result) {
            Ok(Some(Registration::AgentId(_))) => return Ok(answer?),
            Ok(Some(Registration::NotLeader(hint))) if !hint.leader.is_empty() => {
                target = hint.leader.clone();
            }
            Ok(Some(Registration::Refused(why))) => bail!("refused: {why}"),
            _ => {
                // No leader known yet, or that master is gone: try the next one shortly.
                next = (next + 1) % masters.len();
                target = format!("master@{}", masters[next]);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn leader(masters: &BTreeMap<u64, MasterServer>) -> anyhow::Result<u64> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        for (id, master) in masters {
            let metrics = master
                .pid()
                .ask(|reply| GetMetrics { reply }.into())
                .await?;
            if metrics.is_leader {
                return Ok(*id);
            }
        }
        if Instant::now() > deadline {
            bail!("no leading master within {DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn register_agents(
    node: &Node,
    addresses: &[String],
    count: usize,
) -> anyhow::Result<Vec<FakeAgent>> {
    let mut agents = Vec::new();
    for n in 0..count {
        let info = agent_info(n, node);
        let register = pb::RegisterAgent {
            info: Some(info.clone()),
            ..Default::default()
        };
        let id = ask_until_admitted(node, addresses, register).await?;
        agents.push(FakeAgent {
            id,
            info,
            tasks: tasks(n),
        });
    }
    Ok(agents)
}

async fn reregister(node: &Node, addresses: &[String], agent: &FakeAgent) -> anyhow::Result<()> {
    let id = ask_until_admitted(node, addresses, reregistration(agent, false)).await?;
    assert_eq!(id, agent.id, "re-registration keeps the agent's id");
    Ok(())
}

/// What `agent` sends when it re-registers; `grouped`: its running tasks grouped by the
/// labels they share, as an agent sends them to a master that reads them.
fn reregistration(agent: &FakeAgent, grouped: bool) -> pb::ReregisterAgent {
    let (tasks, tasks_sharing_labels) = if grouped {
        group_by_shared_labels(agent.tasks.clone())
    } else {
        (agent.tasks.clone(), Vec::new())
    };
    pb::ReregisterAgent {
        agent_id: agent.id.clone(),
        info: Some(agent.info.clone()),
        frameworks: (0..2)
            .map(|t| pb::Framework {
                id: format!("framework-{t}"),
                name: format!("framework {t}"),
            })
            .collect(),
        tasks,
        tasks_sharing_labels,
        ..pb::ReregisterAgent::default()
    }
}

/// A group of `n` masters, each with its [`member_config`] changed by `adjust`.
async fn start_group(
    n: u64,
    dir: &Path,
    adjust: impl Fn(MasterConfig) -> MasterConfig,
) -> anyhow::Result<(BTreeMap<u64, String>, BTreeMap<u64, MasterServer>)> {
    let members = free_addresses(n).await?;
    let mut masters = BTreeMap::new();
    for id in members.keys() {
        masters.insert(
            *id,
            start_retrying(adjust(member_config(*id, &members, dir))).await?,
        );
    }
    Ok((members, masters))
}

/// A service job `name`: one group `main` of `count` `sleep 60` tasks (1 cpu, 64 MiB).
fn service_job(name: &str, count: u32) -> model_pb::Job {
    model_pb::Job {
        name: name.into(),
        scheduler: model_pb::SchedulerType::Service as i32,
        groups: vec![model_pb::TaskGroup {
            name: "main".into(),
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

/// What the master sends a [`PlayedAgent`]'s process.
enum StandInMsg {
    Launch(pb::LaunchTasks),
    Kill(pb::KillTask, muster_actor::Reply<pb::KillTaskReply>),
}

/// A [`PlayedAgent`]'s process: hands the tasks the master launches and kills to the test, and
/// answers every kill (as an agent does once it has the task killed).
struct StandIn {
    launches: tokio::sync::mpsc::UnboundedSender<model_pb::Task>,
    kills: tokio::sync::mpsc::UnboundedSender<String>,
}

impl muster_actor::Process for StandIn {
    type Message = StandInMsg;
    async fn handle(&mut self, msg: StandInMsg, _ctx: &mut muster_actor::Context<Self>) {
        match msg {
            StandInMsg::Launch(launch) => {
                for task in launch.tasks.into_iter().filter_map(|run| run.task) {
                    let _ = self.launches.send(task);
                }
            }
            StandInMsg::Kill(kill, reply) => {
                let _ = self.kills.send(kill.task_id);
                reply.send(pb::KillTaskReply::default());
            }
        }
    }
}

/// An agent played by the test on a node of its own: it receives launches and kills (handed
/// to the test), heartbeats the leading master every 50 ms while `beating`, and reports task
/// states when the test says so.
struct PlayedAgent {
    id: String,
    info: model_pb::AgentInfo,
    node: Node,
    launched: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<model_pb::Task>>,
    killed: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<String>>,
    beating: Arc<AtomicBool>,
    heartbeats: tokio::task::JoinHandle<()>,
}

impl PlayedAgent {
    /// Registers agent number `n` (certificate `name`, offering `resources`) with whichever of
    /// `masters` leads, and starts its heartbeats.
    async fn register(
        name: &str,
        n: usize,
        resources: model_pb::Resources,
        masters: &[String],
    ) -> anyhow::Result<PlayedAgent> {
        let node = agent_node(&System::new(), name).await?;
        let (launches, launched) = tokio::sync::mpsc::unbounded_channel();
        let (kills, killed) = tokio::sync::mpsc::unbounded_channel();
        let stand_in = node.system().spawn(StandIn { launches, kills });
        node.register("agent", &stand_in)?
            .install::<pb::LaunchTasks>(StandInMsg::Launch)
            .install_ask::<pb::KillTask, pb::KillTaskReply>(StandInMsg::Kill);
        let info = model_pb::AgentInfo {
            resources: Some(resources),
            ..agent_info(n, &node)
        };
        let register = pb::RegisterAgent {
            info: Some(info.clone()),
            ..Default::default()
        };
        let id = ask_until_admitted(&node, masters, register).await?;
        let beating = Arc::new(AtomicBool::new(true));
        let heartbeats = tokio::spawn(heartbeat_leader(
            node.clone(),
            id.clone(),
            masters.to_vec(),
            Arc::clone(&beating),
        ));
        Ok(PlayedAgent {
            id,
            info,
            node,
            launched: launched.into(),
            killed: killed.into(),
            beating,
            heartbeats,
        })
    }

    /// Stops heartbeating (the agent is cut off): the master marks it unreachable.
    fn go_silent(&self) {
        self.beating.store(false, Ordering::SeqCst);
    }

    /// The next task the master launches here.
    async fn next_launch(&self) -> anyhow::Result<model_pb::Task> {
        tokio::time::timeout(DEADLINE, self.launched.lock().await.recv())
            .await
            .context("no launch within the deadline")?
            .context("the stand-in is gone")
    }

    /// The id of the next task the master tells this agent to kill.
    async fn next_kill(&self) -> anyhow::Result<String> {
        tokio::time::timeout(DEADLINE, self.killed.lock().await.recv())
            .await
            .context("no kill within the deadline")?
            .context("the stand-in is gone")
    }

    /// Whether no kill has reached this agent (since the last one taken).
    fn nothing_killed(&self) -> bool {
        self.killed
            .try_lock()
            .is_ok_and(|mut killed| killed.try_recv().is_err())
    }

    /// Whether no launch has reached this agent (since the last one taken).
    fn nothing_launched(&self) -> bool {
        self.launched
            .try_lock()
            .is_ok_and(|mut launched| launched.try_recv().is_err())
    }

    /// Reports `task` in `state` to the master at `master` (`host:port`), as the agent's
    /// executor would; returns the task so reported.
    fn report(
        &self,
        master: &str,
        task: &model_pb::Task,
        state: model_pb::TaskState,
    ) -> anyhow::Result<model_pb::Task> {
        let task = model_pb::Task {
            state: state as i32,
            ..task.clone()
        };
        self.node
            .remote(format!("master@{master}").parse()?)
            .tell(pb::TaskStatusUpdate {
                agent_id: self.id.clone(),
                task: Some(task.clone()),
            })?;
        Ok(task)
    }

    /// Comes back: re-registers with whichever of `masters` leads, reporting `tasks`, and
    /// heartbeats again. The reply that admitted it.
    async fn come_back(
        &self,
        masters: &[String],
        tasks: Vec<model_pb::Task>,
    ) -> anyhow::Result<pb::RegistrationReply> {
        let request = pb::ReregisterAgent {
            agent_id: self.id.clone(),
            info: Some(self.info.clone()),
            tasks,
            ..pb::ReregisterAgent::default()
        };
        let reply = admission(&self.node, masters, request).await?;
        self.beating.store(true, Ordering::SeqCst);
        Ok(reply)
    }
}

impl Drop for PlayedAgent {
    fn drop(&mut self) {
        self.heartbeats.abort();
        self.node.shutdown();
    }
}

/// Heartbeats agent `id` every 50 ms while `beating`, to whichever of `masters` leads
/// (following "not leader" answers). A refused heartbeat (the agent is unreachable, or has
/// not re-registered with a new leader yet) is let be: the test re-registers it.
async fn heartbeat_leader(node: Node, id: String, masters: Vec<String>, beating: Arc<AtomicBool>) {
    use pb::heartbeat_reply::Result as Beat;
    let mut next = 0;
    let mut target = format!("master@{}", masters[0]);
    loop {
        if beating.load(Ordering::SeqCst) {
            let answer = match target.parse::<Upid>() {
                Ok(upid) => node
                    .remote(upid)
                    .ask_timeout::<pb::Heartbeat, pb::HeartbeatReply>(
                        Duration::from_secs(1),
                        pb::Heartbeat {
                            agent_id: id.clone(),
                        },
                    )
                    .await
                    .ok()
                    .and_then(|reply| reply.result),
                Err(_) => None,
            };
            match answer {
                Some(Beat::TtlMs(_) | Beat::Refused(_)) => {}
                Some(Beat::NotLeader(hint)) if !hint.leader.is_empty() => target = hint.leader,
                _ => {
                    next = (next + 1) % masters.len();
                    target = format!("master@{}", masters[next]);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
