//! Masters in one test process, agents played by the test over the real transport: standby
//! redirects, failover rebuilt from re-registrations, the re-registration deadline and the
//! removal limit.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use muster_actor::{System, Upid};
use muster_agent::reregistration::group_by_shared_labels;
use muster_master::requests::{GetMetrics, GetState, JobStatus, ListJobs, SubmitJob, SubmitPlan};
use muster_master::{MasterConfig, MasterServer};
use muster_proto::cluster as pb;
use muster_proto::cluster::registration_reply::Result as Registration;
use muster_proto::model as model_pb;
use muster_security::Role;
use muster_security::testing::TestPki;
use muster_transport::Node;
use tokio::time::Instant;

const DEADLINE: Duration = Duration::from_secs(20);

fn master_config(id: u64, members: &BTreeMap<u64, String>, dir: &Path) -> MasterConfig {
    MasterConfig {
        id,
        listen: members[&id].clone(),
        members: members.clone(),
        data_dir: dir.join(format!("master-{id}")),
        raft_heartbeat: Duration::from_millis(50),
        raft_election_timeout: (Duration::from_millis(200), Duration::from_millis(400)),
        ..MasterConfig::new(TestPki::shared().security(Role::Master, &format!("master-{id}")))
    }
}

async fn free_addresses(n: u64) -> anyhow::Result<BTreeMap<u64, String>> {
    let mut members = BTreeMap::new();
    for id in 1..=n {
        let listener = Node::listen("127.0.0.1:0").await?;
        members.insert(id, listener.local_addr().to_string());
    }
    Ok(members)
}

/// Starts a master, retrying while its port or store is still held by a stopped predecessor.
async fn start(config: MasterConfig) -> anyhow::Result<MasterServer> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        match MasterServer::start(config.clone()).await {
            Ok(master) => return Ok(master),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e).context("starting a master"),
        }
    }
}

/// An agent played by the test: what it would send, sent from its own node.
struct FakeAgent {
    id: String,
    info: model_pb::AgentInfo,
    tasks: Vec<model_pb::Task>,
}

fn agent_info(n: usize, node: &Node) -> model_pb::AgentInfo {
    model_pb::AgentInfo {
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

async fn state_when(
    master: &MasterServer,
    what: &str,
    done: impl Fn(&pb::ClusterState) -> bool,
) -> anyhow::Result<pb::ClusterState> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let state = master.pid().ask(|reply| GetState { reply }.into()).await?;
        if done(&state) {
            return Ok(state);
        }
        if Instant::now() > deadline {
            bail!("{what} did not happen within {DEADLINE:?}: {state:?}");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_and_rebuilds_from_reregistrations() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let members = free_addresses(3).await?;
    let addresses: Vec<String> = members.values().cloned().collect();
    let mut masters = BTreeMap::new();
    for id in members.keys() {
        masters.insert(*id, start(master_config(*id, &members, dir.path())).await?);
    }
    let first = leader(&masters).await?;

    let system = System::new();
    let agents_node = Node::bind(
        &system,
        "127.0.0.1:0",
        TestPki::shared().security(Role::Agent, "agent-1"),
    )
    .await?;
    let agents = register_agents(&agents_node, &addresses, 5).await?;
    for agent in &agents {
        reregister(&agents_node, &addresses, agent).await?;
    }
    let state = masters[&first]
        .pid()
        .ask(|reply| GetState { reply }.into())
        .await?;
    assert_eq!(state.agents.len(), 5);
    assert!(
        state
            .agents
            .iter()
            .all(|a| a.connected && a.tasks.len() == 2)
    );

    // A standby answers with the leader's address.
    let standby = *masters
        .keys()
        .find(|id| **id != first)
        .context("a standby")?;
    let redirect = agents_node
        .remote(format!("master@{}", members[&standby]).parse()?)
        .ask_timeout::<pb::RegisterAgent, pb::RegistrationReply>(
            Duration::from_secs(5),
            pb::RegisterAgent {
                info: Some(agents[0].info.clone()),
                ..Default::default()
            },
        )
        .await?;
    assert_eq!(
        redirect.result,
        Some(Registration::NotLeader(model_pb::NotLeader {
            leader: format!("master@{}", members[&first]),
        }))
    );

    // The leader dies; a standby takes over and waits for the admitted agents.
    masters.remove(&first).context("leader")?.shutdown().await;
    let second = leader(&masters).await?;
    let recovering = state_when(&masters[&second], "loading admitted agents", |s| {
        s.is_leader && s.agents.len() == 5
    })
    .await?;
    assert!(recovering.recovering);
    assert!(recovering.agents.iter().all(|a| !a.connected));

    // Agents that heard the new leader say it reads running tasks grouped by their labels
    // send them so; the others, whole.
    for (n, agent) in agents.iter().enumerate() {
        let request = reregistration(agent, n % 2 == 0);
        let id = ask_until_admitted(&agents_node, &addresses, request).await?;
        assert_eq!(id, agent.id, "re-registration keeps the agent's id");
    }
    let rebuilt = state_when(&masters[&second], "the rebuild", |s| !s.recovering).await?;
    assert_eq!(rebuilt.agents.len(), 5);
    for agent in &agents {
        let got = rebuilt
            .agents
            .iter()
            .find(|a| a.id == agent.id)
            .context("agent missing after failover")?;
        assert!(got.connected);
        assert_eq!(got.tasks, agent.tasks);
    }
    assert_eq!(rebuilt.frameworks.len(), 2);
    let metrics = masters[&second]
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await?;
    assert_eq!(metrics.agents_reregistered, 5);
    assert_eq!(
        metrics.registry_entries, 0,
        "unchanged agents cost no registry write"
    );
    assert!(metrics.recovery_seconds > 0.0);
    let again = agents_node
        .remote(format!("master@{}", members[&second]).parse()?)
        .ask_timeout::<pb::ReregisterAgent, pb::RegistrationReply>(
            Duration::from_secs(5),
            reregistration(&agents[0], true),
        )
        .await?;
    assert!(
        again.reads_tasks_sharing_labels,
        "an admission says the master reads grouped tasks"
    );

    agents_node.shutdown();
    for master in masters.into_values() {
        master.shutdown().await;
    }
    Ok(())
}

/// Registers `count` agents with a single master, restarts it, brings back `returning` of
/// them, and returns the state once the re-registration deadline has passed.
async fn restart_with_missing_agents(
    count: usize,
    returning: usize,
    removal_limit: f64,
) -> anyhow::Result<(pb::ClusterState, Vec<FakeAgent>, pb::JobStatusReply)> {
    let dir = tempfile::tempdir()?;
    let members = free_addresses(1).await?;
    let addresses: Vec<String> = members.values().cloned().collect();
    let config = MasterConfig {
        reregistration_timeout: Duration::from_millis(500),
        removal_limit,
        ..master_config(1, &members, dir.path())
    };
    let master = start(config.clone()).await?;
    let system = System::new();
    let agents_node = Node::bind(
        &system,
        "127.0.0.1:0",
        TestPki::shared().security(Role::Agent, "agent-1"),
    )
    .await?;
    let agents = register_agents(&agents_node, &addresses, count).await?;
    // A service job: where its tasks ran dies with this master.
    let web = model_pb::Job {
        name: "web".into(),
        scheduler: model_pb::SchedulerType::Service as i32,
        groups: vec![model_pb::TaskGroup {
            name: "server".into(),
            count: 1,
            resources: Some(model_pb::Resources {
                cpus: 0.5,
                mem_mb: 64,
            }),
            command: "sleep".into(),
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    };
    master
        .pid()
        .ask(|reply| {
            SubmitJob {
                job: Some(web),
                reply,
            }
            .into()
        })
        .await?
        .map_err(anyhow::Error::msg)?;
    master.shutdown().await;

    let master = start(config).await?;
    for agent in &agents[..returning] {
        reregister(&agents_node, &addresses, agent).await?;
    }
    let marked = (count - returning).min((removal_limit * count as f64).floor() as usize);
    let state = state_when(&master, "the re-registration deadline", |s| {
        s.is_leader
            && !s.recovering
            && s.unreachable.len() == marked
            && s.agents.len() == count - marked
    })
    .await?;
    let web = master
        .pid()
        .ask(|reply| {
            JobStatus {
                name: "web".into(),
                stale: false,
                reply,
            }
            .into()
        })
        .await?
        .map_err(anyhow::Error::msg)?;
    agents_node.shutdown();
    master.shutdown().await;
    Ok((state, agents, web))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_away_past_the_deadline_is_marked_unreachable() -> anyhow::Result<()> {
    let (state, agents, web) = restart_with_missing_agents(5, 4, 1.0).await?;
    let unreachable: Vec<&str> = state.unreachable.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(unreachable, [agents[4].id.as_str()]);
    assert_eq!(state.agents.len(), 4);
    assert!(state.agents.iter().all(|a| a.connected));
    // The new master never learned where the service job's task ran: the job is evaluated
    // anyway, in the same entry as the mark.
    assert!(
        web.evals
            .iter()
            .any(|e| trigger_of(e).contains("AgentUnreachable")
                && trigger_of(e).contains(&agents[4].id)),
        "{:?}",
        web.evals
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_lost_together_make_one_evaluation_per_job() -> anyhow::Result<()> {
    // 3 of 5 stay away: marked in one raft entry, with one evaluation of the job, not three.
    let (state, _agents, web) = restart_with_missing_agents(5, 2, 1.0).await?;
    assert_eq!(state.unreachable.len(), 3);
    let marks = web
        .evals
        .iter()
        .filter(|e| trigger_of(e).contains("AgentUnreachable"))
        .count();
    assert_eq!(marks, 1, "{:?}", web.evals);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_removal_limit_keeps_agents_when_most_stay_away() -> anyhow::Result<()> {
    // 4 of 5 stay away; a 40% limit allows 2 to be marked, and the other 2 are kept.
    let (state, _agents, _web) = restart_with_missing_agents(5, 1, 0.4).await?;
    assert_eq!(state.unreachable.len(), 2);
    assert_eq!(state.agents.len(), 3);
    assert_eq!(state.agents.iter().filter(|a| a.connected).count(), 1);
    Ok(())
}

/// Answers the master's pings, as a healthy agent does.
struct Ponger;

impl muster_actor::Process for Ponger {
    type Message = (pb::Ping, muster_actor::Reply<pb::Pong>);
    async fn handle(&mut self, (_, reply): Self::Message, _ctx: &mut muster_actor::Context<Self>) {
        reply.send(pb::Pong::default());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_misses_its_pings_is_marked_unreachable() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let members = free_addresses(1).await?;
    let addresses: Vec<String> = members.values().cloned().collect();
    let master = start(MasterConfig {
        // Pings are off by default (heartbeats keep agents connected); this test is about them.
        pings: true,
        ping_interval: Duration::from_millis(50),
        ping_timeout: Duration::from_millis(500),
        max_missed_pings: 3,
        ..master_config(1, &members, dir.path())
    })
    .await?;
    let system = System::new();
    let node = Node::bind(
        &system,
        "127.0.0.1:0",
        TestPki::shared().security(Role::Agent, "agent-1"),
    )
    .await?;
    node.register("agent", &system.spawn(Ponger))?
        .install_ask::<pb::Ping, pb::Pong>(|ping, reply| (ping, reply));

    let healthy = model_pb::AgentInfo {
        address: format!("agent@{}", node.address()),
        ..agent_info(0, &node)
    };
    let silent = model_pb::AgentInfo {
        address: format!("silent@{}", node.address()),
        ..agent_info(1, &node)
    };
    let healthy = ask_until_admitted(
        &node,
        &addresses,
        pb::RegisterAgent {
            info: Some(healthy),
            ..Default::default()
        },
    )
    .await?;
    let silent = ask_until_admitted(
        &node,
        &addresses,
        pb::RegisterAgent {
            info: Some(silent),
            ..Default::default()
        },
    )
    .await?;

    let state = state_when(&master, "the silent agent marked unreachable", |s| {
        s.unreachable.len() == 1 && s.agents.len() == 1
    })
    .await?;
    assert_eq!(state.unreachable[0].id, silent);
    assert_eq!(state.agents[0].id, healthy);
    assert!(state.agents[0].connected);
    let metrics = master
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await?;
    assert_eq!(metrics.agents_unreachable, 1);

    node.shutdown();
    master.shutdown().await;
    Ok(())
}

/// An evaluation's trigger as operators read it (`AgentUpdate(AgentId("agent-1"))`).
fn trigger_of(eval: &model_pb::Evaluation) -> String {
    muster_model::Evaluation::try_from(eval.clone())
        .map(|eval| format!("{:?}", eval.trigger))
        .unwrap_or_default()
}

/// A group of `n` masters, each with its `master_config` changed by `adjust`.
async fn start_group(
    n: u64,
    dir: &Path,
    adjust: impl Fn(MasterConfig) -> MasterConfig,
) -> anyhow::Result<(BTreeMap<u64, String>, BTreeMap<u64, MasterServer>)> {
    let members = free_addresses(n).await?;
    let mut masters = BTreeMap::new();
    for id in members.keys() {
        masters.insert(*id, start(adjust(master_config(*id, &members, dir))).await?);
    }
    Ok((members, masters))
}

/// A node of the test's own, presenting agent certificate `name`.
async fn agent_node(system: &System, name: &str) -> anyhow::Result<Node> {
    Ok(Node::bind(
        system,
        "127.0.0.1:0",
        TestPki::shared().security(Role::Agent, name),
    )
    .await?)
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

/// Submits `job` at `master`.
async fn submit(master: &MasterServer, job: model_pb::Job) -> anyhow::Result<()> {
    master
        .pid()
        .ask(|reply| {
            SubmitJob {
                job: Some(job),
                reply,
            }
            .into()
        })
        .await?
        .map_err(anyhow::Error::msg)?;
    Ok(())
}

/// A plan placing one task (`task_id`) on `agent`.
fn one_placement(agent: &str, task_id: &str) -> muster_scheduler::Plan {
    let mut plan =
        muster_scheduler::Plan::empty(muster_model::EvalId(format!("eval-{task_id}")), "web", 0);
    plan.place.push(muster_scheduler::Placement {
        agent: muster_model::AgentId(agent.into()),
        task_id: task_id.into(),
        name: "web.main[0]".into(),
        job: "web".into(),
        group: "main".into(),
        resources: muster_model::Resources {
            cpus: 1.0,
            mem_mb: 64,
        },
        command: "sleep".into(),
        args: vec!["60".into()],
        env: BTreeMap::new(),
        user: String::new(),
        job_version: 1,
    });
    plan
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_its_quorum_applies_no_plan() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (members, mut masters) = start_group(3, dir.path(), |config| MasterConfig {
        workers: 0,
        ..config
    })
    .await?;
    let leading = leader(&masters).await?;
    let system = System::new();
    let node = Node::bind(
        &system,
        "127.0.0.1:0",
        TestPki::shared().security(Role::Agent, "agent-q"),
    )
    .await?;
    let agent = register_agents(&node, &[members[&leading].clone()], 1).await?;
    let agent_id = agent[0].id.clone();
    let submit = |master: &MasterServer, plan| {
        let pid = master.pid().clone();
        async move { pid.ask(|reply| SubmitPlan { plan, reply }.into()).await }
    };

    // With its quorum, the leader applies a plan.
    let applied = submit(&masters[&leading], one_placement(&agent_id, "t-1")).await?;
    let applied = applied.map_err(anyhow::Error::msg)?;
    assert_eq!(applied.committed.len(), 1);

    // Without it (both followers gone), the next plan past the lease is refused: no launch
    // from a master that may no longer lead.
    let followers: Vec<u64> = members
        .keys()
        .copied()
        .filter(|id| *id != leading)
        .collect();
    for id in followers {
        if let Some(master) = masters.remove(&id) {
            master.shutdown().await;
        }
    }
    let lease = Duration::from_millis(200) / 2;
    tokio::time::sleep(lease).await;
    let refused = submit(&masters[&leading], one_placement(&agent_id, "t-2")).await?;
    match refused {
        Err(e) => assert!(e.to_string().contains("not the leading master"), "{e}"),
        Ok(result) => bail!("a plan applied without a quorum: {result:?}"),
    }
    let state = masters[&leading]
        .pid()
        .ask(|reply| GetState { reply }.into())
        .await?;
    let tasks: Vec<&str> = state
        .agents
        .iter()
        .flat_map(|a| a.tasks.iter().map(|t| t.id.as_str()))
        .collect();
    assert_eq!(
        tasks,
        ["t-1"],
        "only the plan applied with a quorum placed a task"
    );
    let metrics = masters[&leading]
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await?;
    assert!(metrics.leadership_confirmations >= 1);
    for master in masters.into_values() {
        master.shutdown().await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_are_linearizable_by_default_and_stale_only_when_asked() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (members, mut masters) = start_group(3, dir.path(), |config| MasterConfig {
        workers: 0,
        ..config
    })
    .await?;
    let leading = leader(&masters).await?;
    let standby = *members
        .keys()
        .find(|id| **id != leading)
        .context("a standby")?;
    let token = muster_master::testing::bootstrap(&members[&leading]).await?;
    let mut at_leader = muster_master::testing::operator(&members[&leading], Some(&token)).await?;
    let mut at_standby = muster_master::testing::operator(&members[&standby], Some(&token)).await?;
    // The standby knows the token once it has applied the bootstrap: until then it refuses it.
    let deadline = Instant::now() + DEADLINE;
    while let Err(e) = at_standby
        .get_state(pb::GetStateRequest { stale: true })
        .await
    {
        if e.code() != tonic::Code::Unauthenticated || Instant::now() > deadline {
            bail!("the standby does not take the token: {e:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The leader answers a linearizable read; a standby refuses it, naming the leader.
    let state = at_leader
        .get_state(pb::GetStateRequest::default())
        .await?
        .into_inner();
    let read = state.read.context("no read info")?;
    assert!(
        state.is_leader && !read.stale && read.last_contact_ms == 0,
        "{read:?}"
    );
    let refused = at_standby
        .get_state(pb::GetStateRequest::default())
        .await
        .err()
        .context("a standby answered a linearizable read")?;
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        refused
            .metadata()
            .get("muster-leader")
            .and_then(|v| v.to_str().ok()),
        Some(members[&leading].as_str())
    );

    // Asked for, the standby answers from its own state and says how far behind it may be.
    let state = at_standby
        .get_state(pb::GetStateRequest { stale: true })
        .await?
        .into_inner();
    let read = state.read.context("no read info")?;
    assert!(
        !state.is_leader && read.stale && read.known_leader,
        "{read:?}"
    );
    assert!(read.last_contact_ms < 10_000, "{read:?}");

    // Cut off from both followers, the leader refuses linearizable reads past its lease: it
    // may no longer lead. A stale read still answers.
    for id in members.keys().filter(|id| **id != leading) {
        if let Some(master) = masters.remove(id) {
            master.shutdown().await;
        }
    }
    tokio::time::sleep(Duration::from_millis(200) / 2).await;
    let refused = at_leader
        .get_state(pb::GetStateRequest::default())
        .await
        .err()
        .context("a leader without a quorum answered a linearizable read")?;
    assert!(
        matches!(
            refused.code(),
            tonic::Code::FailedPrecondition | tonic::Code::Unavailable
        ),
        "{refused:?}"
    );
    let stale = at_leader
        .get_state(pb::GetStateRequest { stale: true })
        .await?
        .into_inner();
    assert!(stale.read.is_some_and(|r| r.stale));
    for master in masters.into_values() {
        master.shutdown().await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_submitted_during_recovery_is_held_and_placed_when_its_agent_comes_back()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (members, mut masters) = start_group(3, dir.path(), |config| config).await?;
    let addresses: Vec<String> = members.values().cloned().collect();
    let first = leader(&masters).await?;
    let system = System::new();
    let node = agent_node(&system, "agent-1").await?;
    let mut agents = register_agents(&node, &addresses, 1).await?;
    agents[0].tasks.clear();
    reregister(&node, &addresses, &agents[0]).await?;

    // The leader goes; its successor waits for the agent to re-register, and holds every
    // evaluation meanwhile: it does not know what the agent runs.
    masters
        .remove(&first)
        .context("first leader")?
        .shutdown()
        .await;
    let second = leader(&masters).await?;
    let job = service_job("late", 1);
    submit(&masters[&second], job).await?;
    let status = masters[&second]
        .pid()
        .ask(|reply| {
            JobStatus {
                name: "late".into(),
                stale: true,
                reply,
            }
            .into()
        })
        .await?
        .map_err(anyhow::Error::msg)?;
    assert!(
        !status.evals.is_empty()
            && status
                .evals
                .iter()
                .all(|e| e.status == model_pb::EvalStatus::Pending as i32),
        "held, not scheduled: {:?}",
        status.evals
    );

    // The agent comes back, unchanged: the hold ends, and the job is placed there.
    let remaining: Vec<String> = members
        .iter()
        .filter(|(id, _)| **id != first)
        .map(|(_, address)| address.clone())
        .collect();
    reregister(&node, &remaining, &agents[0]).await?;
    state_when(&masters[&second], "the blocked job placed", |s| {
        s.agents
            .iter()
            .any(|a| a.connected && a.tasks.iter().any(|t| t.job == "late"))
    })
    .await?;
    for master in masters.into_values() {
        master.shutdown().await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_left_below_its_count_by_a_failover_is_evaluated_again() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (members, mut masters) = start_group(3, dir.path(), |config| MasterConfig {
        reconcile_interval: Duration::from_millis(200),
        ..config
    })
    .await?;
    let addresses: Vec<String> = members.values().cloned().collect();
    let first = leader(&masters).await?;
    let system = System::new();
    let node = agent_node(&system, "agent-1").await?;
    let mut agents = register_agents(&node, &addresses, 1).await?;
    agents[0].tasks.clear();
    reregister(&node, &addresses, &agents[0]).await?;
    let job = service_job("kept", 1);
    submit(&masters[&first], job).await?;
    let state = state_when(&masters[&first], "the job's task placed", |s| {
        s.agents
            .iter()
            .any(|a| a.tasks.iter().any(|t| t.job == "kept"))
    })
    .await?;
    let mut placed = state.agents[0]
        .tasks
        .iter()
        .find(|t| t.job == "kept")
        .context("placed task")?
        .clone();

    // The leader dies; the agent comes back to its successor saying the task was lost (it
    // ended while the old leader was going, and that leader never evaluated the job again).
    masters
        .remove(&first)
        .context("first leader")?
        .shutdown()
        .await;
    let second = leader(&masters).await?;
    placed.state = model_pb::TaskState::Lost as i32;
    let request = pb::ReregisterAgent {
        agent_id: agents[0].id.clone(),
        info: Some(agents[0].info.clone()),
        completed_tasks: vec![placed.clone()],
        ..pb::ReregisterAgent::default()
    };
    let remaining: Vec<String> = members
        .iter()
        .filter(|(id, _)| **id != first)
        .map(|(_, address)| address.clone())
        .collect();
    ask_until_admitted(&node, &remaining, request).await?;

    // The convergence check notices the job below its count and places a replacement.
    let state = state_when(&masters[&second], "a replacement placed", |s| {
        s.agents
            .iter()
            .any(|a| a.tasks.iter().any(|t| t.job == "kept" && t.id != placed.id))
    })
    .await?;
    assert_eq!(
        state
            .agents
            .iter()
            .flat_map(|a| &a.tasks)
            .filter(|t| t.job == "kept")
            .count(),
        1
    );
    let metrics = masters[&second]
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await?;
    assert!(metrics.reconcile_evals >= 1, "{metrics:?}");
    for master in masters.into_values() {
        master.shutdown().await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_copy_of_a_slot_is_stopped_by_the_convergence_check() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (members, masters) = start_group(1, dir.path(), |config| MasterConfig {
        reconcile_interval: Duration::from_millis(200),
        ..config
    })
    .await?;
    let addresses: Vec<String> = members.values().cloned().collect();
    leader(&masters).await?;
    let system = System::new();
    let node = agent_node(&system, "agent-1").await?;
    let mut agents = register_agents(&node, &addresses, 1).await?;
    agents[0].tasks.clear();
    reregister(&node, &addresses, &agents[0]).await?;
    let job = service_job("single", 1);
    submit(&masters[&1], job).await?;
    let state = state_when(&masters[&1], "the job's task placed", |s| {
        s.agents
            .iter()
            .any(|a| a.tasks.iter().any(|t| t.job == "single"))
    })
    .await?;
    let placed = state.agents[0]
        .tasks
        .iter()
        .find(|t| t.job == "single")
        .context("placed")?
        .clone();

    // A second copy of the slot turns up (as a task a replaced agent brings back would),
    // with no evaluation to notice it.
    let mut twin = placed.clone();
    twin.id = format!("{}-twin", placed.id);
    twin.state = model_pb::TaskState::Running as i32;
    node.remote(format!("master@{}", addresses[0]).parse()?)
        .tell(pb::TaskStatusUpdate {
            agent_id: agents[0].id.clone(),
            task: Some(twin.clone()),
        })?;

    let live = |s: &pb::ClusterState| {
        s.agents
            .iter()
            .flat_map(|a| &a.tasks)
            .filter(|t| {
                t.job == "single"
                    && !matches!(
                        model_pb::TaskState::try_from(t.state),
                        Ok(model_pb::TaskState::Killed
                            | model_pb::TaskState::Finished
                            | model_pb::TaskState::Failed
                            | model_pb::TaskState::Lost)
                    )
            })
            .count()
    };
    state_when(&masters[&1], "the second copy adopted", |s| live(s) == 2).await?;
    // The convergence check evaluates the job, and one of the two is stopped.
    state_when(&masters[&1], "one copy left", |s| live(s) == 1).await?;
    let metrics = masters[&1]
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await?;
    assert!(metrics.reconcile_evals >= 1, "{metrics:?}");
    for master in masters.into_values() {
        master.shutdown().await;
    }
    Ok(())
}

// Agents marked unreachable with tasks on them: UNKNOWN while they are away, and settled by
// each group's `disconnect` policy when they come back.

/// Short heartbeat timings: an agent that stops heartbeating is marked unreachable within half
/// a second (a TTL of 200 to 400 ms, and 100 ms of grace).
fn quick_heartbeats(config: MasterConfig) -> MasterConfig {
    MasterConfig {
        heartbeat_min_ttl: Duration::from_millis(200),
        heartbeat_grace: Duration::from_millis(100),
        heartbeats_per_second: 1e9,
        ..config
    }
}

/// The service job `web` of one task ([`service_job`]), its group with `disconnect`.
fn web(disconnect: Option<model_pb::Disconnect>) -> model_pb::Job {
    let mut job = service_job("web", 1);
    job.groups[0].disconnect = disconnect;
    job
}

/// A group's `disconnect` policy, as a job submission carries it (`lost_after_ms` 0: never).
fn disconnect(
    replace: bool,
    lost_after_ms: u64,
    reconcile: model_pb::Reconcile,
) -> Option<model_pb::Disconnect> {
    Some(model_pb::Disconnect {
        replace: Some(replace),
        lost_after_ms: Some(lost_after_ms),
        reconcile: reconcile as i32,
    })
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

fn is(task: &model_pb::Task, state: model_pb::TaskState) -> bool {
    task.state == state as i32
}

/// Task `task_id` as `master`'s state has it on connected agent `agent_id`.
fn task_on<'s>(
    state: &'s pb::ClusterState,
    agent_id: &str,
    task_id: &str,
) -> Option<&'s model_pb::Task> {
    state
        .agents
        .iter()
        .filter(|a| a.id == agent_id && a.connected)
        .flat_map(|a| &a.tasks)
        .find(|t| t.id == task_id)
}

/// Task `task_id` as `master`'s state has it on unreachable agent `agent_id`.
fn task_away<'s>(
    state: &'s pb::ClusterState,
    agent_id: &str,
    task_id: &str,
) -> Option<&'s model_pb::Task> {
    state
        .unreachable
        .iter()
        .filter(|a| a.id == agent_id)
        .flat_map(|a| &a.tasks)
        .find(|t| t.id == task_id)
}

/// The tasks of job `job` on agent `agent_id` that have not ended, in `master`'s state.
fn live_tasks_of<'s>(
    state: &'s pb::ClusterState,
    agent_id: &str,
    job: &str,
) -> Vec<&'s model_pb::Task> {
    state
        .agents
        .iter()
        .filter(|a| a.id == agent_id)
        .flat_map(|a| &a.tasks)
        .filter(|t| {
            t.job == job
                && matches!(
                    model_pb::TaskState::try_from(t.state),
                    Ok(model_pb::TaskState::Staging
                        | model_pb::TaskState::Starting
                        | model_pb::TaskState::Running)
                )
        })
        .collect()
}

async fn job_status(master: &MasterServer, job: &str) -> anyhow::Result<pb::JobStatusReply> {
    master
        .pid()
        .ask(|reply| {
            JobStatus {
                name: job.into(),
                stale: false,
                reply,
            }
            .into()
        })
        .await?
        .map_err(anyhow::Error::msg)
}

async fn job_summary(master: &MasterServer, job: &str) -> anyhow::Result<pb::JobSummary> {
    let request = pb::ListJobsRequest {
        stale: false,
        prefix: job.into(),
    };
    master
        .pid()
        .ask(|reply| ListJobs { request, reply }.into())
        .await?
        .map_err(anyhow::Error::msg)?
        .jobs
        .into_iter()
        .find(|j| j.name == job)
        .context("the job is not listed")
}

/// Job `job`'s status once it has an evaluation whose trigger names `trigger` and agent
/// `agent_id`, and every evaluation due now (not waiting for a later time) is done.
async fn evaluated(
    master: &MasterServer,
    job: &str,
    trigger: &str,
    agent_id: &str,
) -> anyhow::Result<pb::JobStatusReply> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let status = job_status(master, job).await?;
        let triggered = status
            .evals
            .iter()
            .any(|e| trigger_of(e).contains(trigger) && trigger_of(e).contains(agent_id));
        let done = status
            .evals
            .iter()
            .filter(|e| e.wait_until_ms == 0)
            .all(|e| {
                matches!(
                    model_pb::EvalStatus::try_from(e.status),
                    Ok(model_pb::EvalStatus::Complete
                        | model_pb::EvalStatus::Failed
                        | model_pb::EvalStatus::Canceled)
                )
            });
        if triggered && done {
            return Ok(status);
        }
        if Instant::now() > deadline {
            bail!(
                "job {job} not evaluated for {trigger} of {agent_id} within {DEADLINE:?}: {:?}",
                status.evals
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What a played agent offers unless a test says otherwise: room for twenty of `web`'s tasks.
const AGENT: model_pb::Resources = model_pb::Resources {
    cpus: 20.0,
    mem_mb: 10240,
};

/// One master with quick heartbeats, job `web` (its group with `disconnect`) running on agent
/// `a`, and agent `b` connected beside it with nothing on it.
struct AwayCluster {
    _dir: tempfile::TempDir,
    members: BTreeMap<u64, String>,
    masters: BTreeMap<u64, MasterServer>,
    /// Where `a` and `b` report (the leader they registered with, or the one that took over
    /// in [`AwayCluster::fail_over`]).
    leader: String,
    a: PlayedAgent,
    b: PlayedAgent,
    /// `web`'s task on `a`, RUNNING (unless started otherwise).
    original: model_pb::Task,
}

impl AwayCluster {
    /// `n` masters; `a` registers alone, so the job is placed there, then `b`; both offer
    /// [`AGENT`].
    async fn start(n: u64, disconnect: Option<model_pb::Disconnect>) -> anyhow::Result<Self> {
        Self::start_with(n, disconnect, AGENT, true).await
    }

    /// [`AwayCluster::start`], with `b` offering `b_offers`; unless `confirmed`, `a` does
    /// not report the original RUNNING (it stays STAGING).
    async fn start_with(
        n: u64,
        disconnect: Option<model_pb::Disconnect>,
        b_offers: model_pb::Resources,
        confirmed: bool,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let (members, masters) = start_group(n, dir.path(), quick_heartbeats).await?;
        let addresses: Vec<String> = members.values().cloned().collect();
        let leading = leader(&masters).await?;
        let leader = members[&leading].clone();
        let a = PlayedAgent::register("agent-a", 0, AGENT, &addresses).await?;
        submit(&masters[&leading], web(disconnect)).await?;
        let original = a.next_launch().await?;
        let original = if confirmed {
            a.report(&leader, &original, model_pb::TaskState::Running)?
        } else {
            original
        };
        state_when(&masters[&leading], "web on a", |s| {
            task_on(s, &a.id, &original.id).is_some_and(|t| t.state == original.state)
        })
        .await?;
        let b = PlayedAgent::register("agent-b", 1, b_offers, &addresses).await?;
        Ok(AwayCluster {
            _dir: dir,
            members,
            masters,
            leader,
            a,
            b,
            original,
        })
    }

    /// The addresses of the masters still running.
    fn addresses(&self) -> Vec<String> {
        self.members.values().cloned().collect()
    }

    /// The master at `leader`: the one `a` and `b` registered with (or that took over).
    fn leading(&self) -> &MasterServer {
        let id = self
            .members
            .iter()
            .find(|(_, address)| **address == self.leader)
            .map(|(id, _)| *id)
            .unwrap_or_default();
        &self.masters[&id]
    }

    /// `a` goes silent; the state once the leader has marked it unreachable, its task UNKNOWN.
    async fn lose_a(&self) -> anyhow::Result<pb::ClusterState> {
        self.a.go_silent();
        state_when(
            self.leading(),
            "a marked unreachable, its task unknown",
            |s| {
                task_away(s, &self.a.id, &self.original.id)
                    .is_some_and(|t| is(t, model_pb::TaskState::Unknown))
                    && !s.agents.iter().any(|agent| agent.id == self.a.id)
            },
        )
        .await
    }

    /// [`AwayCluster::lose_a`], answering when the leader marked `a` unreachable (ms since the
    /// epoch, as the state has it).
    async fn lose_a_marked_at(&self) -> anyhow::Result<u64> {
        let state = self.lose_a().await?;
        Ok(state
            .unreachable
            .iter()
            .find(|u| u.id == self.a.id)
            .context("a unreachable")?
            .marked_at_ms)
    }

    /// The next task launched on `b`, checked to be launched no sooner than `lost_after_ms`
    /// after `a` was marked unreachable (at `marked_at_ms`).
    async fn launched_once_lost(
        &self,
        marked_at_ms: u64,
        lost_after_ms: u64,
    ) -> anyhow::Result<model_pb::Task> {
        let launched = self.b.next_launch().await?;
        let launched_at_ms = u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_millis(),
        )?;
        assert!(
            launched_at_ms >= marked_at_ms + lost_after_ms,
            "replaced {} ms after the mark, before lost_after ({lost_after_ms} ms)",
            launched_at_ms - marked_at_ms
        );
        Ok(launched)
    }

    /// The replacement launched on `b`, reported RUNNING and so in the leader's state.
    async fn replacement_runs_on_b(&self) -> anyhow::Result<model_pb::Task> {
        let launched = self.b.next_launch().await?;
        self.replacement_running(&launched).await
    }

    /// `launched` on `b`, checked to replace the original, reported RUNNING and so in the
    /// leader's state.
    async fn replacement_running(
        &self,
        launched: &model_pb::Task,
    ) -> anyhow::Result<model_pb::Task> {
        let replacement = self
            .b
            .report(&self.leader, launched, model_pb::TaskState::Running)?;
        assert_eq!(replacement.job, "web");
        assert_eq!(replacement.name, self.original.name, "the same slot");
        assert_ne!(replacement.id, self.original.id);
        let (b, id) = (&self.b.id, &replacement.id);
        state_when(self.leading(), "the replacement running on b", |s| {
            task_on(s, b, id).is_some_and(|t| is(t, model_pb::TaskState::Running))
        })
        .await?;
        Ok(replacement)
    }

    /// The leader shuts down and one of the other masters takes over: `leader`,
    /// [`AwayCluster::leading`] and [`AwayCluster::addresses`] name it and the masters left.
    async fn fail_over(&mut self) -> anyhow::Result<()> {
        let first = *self
            .members
            .iter()
            .find(|(_, address)| **address == self.leader)
            .context("the leader")?
            .0;
        self.members.remove(&first);
        self.masters
            .remove(&first)
            .context("the leader")?
            .shutdown()
            .await;
        let second = leader(&self.masters).await?;
        self.leader = self.members[&second].clone();
        Ok(())
    }

    /// `a` comes back, re-registering with whichever master leads, reporting `tasks`; the
    /// reply that admitted it.
    async fn a_comes_back(
        &self,
        tasks: Vec<model_pb::Task>,
    ) -> anyhow::Result<pb::RegistrationReply> {
        self.a.come_back(&self.addresses(), tasks).await
    }

    /// `a` comes back reporting `copy` (its copy of the original) and the copy is to go: it is
    /// in the registration reply's kill list, a KillTask for it reaches `a`, and `a` reports it
    /// KILLED. The state once it is [`settled`](AwayCluster::settled), `replacement` kept on `b`.
    async fn a_returns_and_its_copy_is_killed(
        &self,
        copy: &model_pb::Task,
        replacement: &model_pb::Task,
    ) -> anyhow::Result<pb::ClusterState> {
        let reply = self.a_comes_back(vec![copy.clone()]).await?;
        assert_eq!(reply.kill_tasks, [self.original.id.as_str()], "{reply:?}");
        assert_eq!(self.a.next_kill().await?, self.original.id);
        self.a
            .report(&self.leader, copy, model_pb::TaskState::Killed)?;
        self.settled(&self.b, replacement, &self.a).await
    }

    /// `a` comes back reporting the original and it stays: nothing is in the registration
    /// reply's kill list; instead a KillTask for `copy` reaches `b`, and `b` reports it KILLED.
    async fn a_returns_and_b_stops(&self, copy: &model_pb::Task) -> anyhow::Result<()> {
        let reply = self.a_comes_back(vec![self.original.clone()]).await?;
        assert!(reply.kill_tasks.is_empty(), "{reply:?}");
        assert_eq!(self.b.next_kill().await?, copy.id);
        self.b
            .report(&self.leader, copy, model_pb::TaskState::Killed)?;
        Ok(())
    }

    /// The state once `a`'s return has been evaluated (the `AgentUpdate` evaluation naming it
    /// is done) and `ended` has no live task of `web`; checked to have `kept` RUNNING on
    /// `keeper`, where no KillTask has come.
    async fn settled(
        &self,
        keeper: &PlayedAgent,
        kept: &model_pb::Task,
        ended: &PlayedAgent,
    ) -> anyhow::Result<pb::ClusterState> {
        let master = self.leading();
        evaluated(master, "web", "AgentUpdate", &self.a.id).await?;
        let state = state_when(master, "the other copy ended", |s| {
            live_tasks_of(s, &ended.id, "web").is_empty()
        })
        .await?;
        let task = task_on(&state, &keeper.id, &kept.id).context("the copy kept")?;
        assert!(is(task, model_pb::TaskState::Running), "{task:?}");
        assert!(keeper.nothing_killed(), "the copy kept was killed");
        Ok(state)
    }

    /// The state once `a`'s return has been evaluated (the `AgentUpdate` evaluation naming it
    /// is done), checked to show the return changed nothing: no copy on `b`, no KillTask to
    /// `a` and no launch on `b`, and the job's summary counts the original RUNNING, none
    /// UNKNOWN.
    async fn the_return_changed_nothing(&self) -> anyhow::Result<pb::ClusterState> {
        let master = self.leading();
        evaluated(master, "web", "AgentUpdate", &self.a.id).await?;
        let state = state_when(master, "the state after the return", |_| true).await?;
        assert!(
            live_tasks_of(&state, &self.b.id, "web").is_empty(),
            "{state:?}"
        );
        assert!(self.a.nothing_killed(), "the original was killed");
        assert!(self.b.nothing_launched(), "another copy launched on b");
        let summary = job_summary(master, "web").await?;
        assert_eq!((summary.unknown, summary.running), (0, 1), "{summary:?}");
        Ok(state)
    }

    async fn shutdown(self) {
        drop(self.a);
        drop(self.b);
        for master in self.masters.into_values() {
            master.shutdown().await;
        }
    }
}

/// An agent marked unreachable for missed heartbeats: its running task is UNKNOWN (in the
/// cluster state's unreachable agents, the job's status and the job's summary), and, the
/// default `disconnect` policy replacing it, a replacement is placed on the other agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_agents_task_is_unknown_and_replaced_by_default() -> anyhow::Result<()> {
    let cluster = AwayCluster::start(1, None).await?;
    let state = cluster.lose_a().await?;
    let away = task_away(&state, &cluster.a.id, &cluster.original.id).context("away")?;
    assert_eq!(away.name, cluster.original.name);
    assert_eq!(away.job, "web");

    let replacement = cluster.replacement_runs_on_b().await?;
    let master = cluster.leading();
    let status = job_status(master, "web").await?;
    let unknown: Vec<(&str, &str)> = status
        .tasks
        .iter()
        .filter_map(|t| Some((t.agent_id.as_str(), t.task.as_ref()?)))
        .filter(|(_, t)| is(t, model_pb::TaskState::Unknown))
        .map(|(agent, t)| (agent, t.id.as_str()))
        .collect();
    assert_eq!(
        unknown,
        [(cluster.a.id.as_str(), cluster.original.id.as_str())],
        "{:?}",
        status.tasks
    );
    assert!(
        status.tasks.iter().any(|t| t.agent_id == cluster.b.id
            && t.task.as_ref().is_some_and(|t| t.id == replacement.id)),
        "{:?}",
        status.tasks
    );
    let summary = job_summary(master, "web").await?;
    assert_eq!(
        (summary.unknown, summary.running, summary.lost),
        (1, 1, 0),
        "{summary:?}"
    );
    cluster.shutdown().await;
    Ok(())
}

/// `reconcile = keep_original`: the agent comes back with its task running while the
/// replacement runs elsewhere. Nothing is killed on the returning agent (its registration
/// reply's kill list is empty, and no KillTask reaches it); the replacement is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_original_is_kept_and_its_replacement_stopped_with_keep_original()
-> anyhow::Result<()> {
    let policy = disconnect(true, 0, model_pb::Reconcile::KeepOriginal);
    let cluster = AwayCluster::start(1, policy).await?;
    cluster.lose_a().await?;
    let replacement = cluster.replacement_runs_on_b().await?;

    cluster.a_returns_and_b_stops(&replacement).await?;
    let (a, b) = (&cluster.a.id, &cluster.b.id);
    let state = state_when(cluster.leading(), "the original alone running", |s| {
        task_on(s, a, &cluster.original.id).is_some_and(|t| is(t, model_pb::TaskState::Running))
            && live_tasks_of(s, b, "web").is_empty()
    })
    .await?;
    assert!(state.unreachable.is_empty(), "{state:?}");
    // The return's evaluation changes nothing: no kill for the original, no new launch.
    let state = cluster.the_return_changed_nothing().await?;
    assert_eq!(live_tasks_of(&state, a, "web").len(), 1, "{state:?}");
    cluster.shutdown().await;
    Ok(())
}

/// `reconcile = keep_replacement`: the agent comes back with its task running while the
/// replacement runs elsewhere. The returning copy is in its registration reply's kill list
/// (and a KillTask for it follows); the replacement stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_original_is_killed_with_keep_replacement() -> anyhow::Result<()> {
    let policy = disconnect(true, 0, model_pb::Reconcile::KeepReplacement);
    let cluster = AwayCluster::start(1, policy).await?;
    cluster.lose_a().await?;
    let replacement = cluster.replacement_runs_on_b().await?;

    cluster
        .a_returns_and_its_copy_is_killed(&cluster.original, &replacement)
        .await?;
    assert!(cluster.b.nothing_launched(), "a third copy launched");
    cluster.shutdown().await;
    Ok(())
}

/// `replace = false` (with a `lost_after` that does not pass during the test): while the agent
/// is away its task keeps the slot, so the job's evaluation places nothing; when it comes back
/// the task is kept and nothing is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_not_replaced_keeps_its_slot_while_away_and_is_kept_on_return() -> anyhow::Result<()>
{
    let policy = disconnect(false, 600_000, model_pb::Reconcile::BestScore);
    let cluster = AwayCluster::start(1, policy).await?;
    cluster.lose_a().await?;
    let master = cluster.leading();
    let (a, b) = (&cluster.a.id, &cluster.b.id);

    // The evaluation the mark wrote runs, and places nothing.
    evaluated(master, "web", "AgentUnreachable", a).await?;
    let state = state_when(master, "the state while a is away", |_| true).await?;
    assert!(live_tasks_of(&state, b, "web").is_empty(), "{state:?}");
    assert!(cluster.b.nothing_launched(), "a replacement launched");
    let summary = job_summary(master, "web").await?;
    assert_eq!((summary.unknown, summary.running), (1, 0), "{summary:?}");

    let reply = cluster.a_comes_back(vec![cluster.original.clone()]).await?;
    assert!(reply.kill_tasks.is_empty(), "{reply:?}");
    let state = cluster.the_return_changed_nothing().await?;
    let kept = task_on(&state, a, &cluster.original.id).context("the original")?;
    assert!(is(kept, model_pb::TaskState::Running), "{kept:?}");
    assert!(state.unreachable.is_empty(), "{state:?}");
    cluster.shutdown().await;
    Ok(())
}

/// `replace = false` with a short `lost_after`: the task keeps its slot until then, and a
/// replacement is placed once it has passed (not before); the agent coming back after that has
/// its copy killed (lost for good), and the replacement stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_lost_for_good_is_replaced_then_and_killed_when_its_agent_returns()
-> anyhow::Result<()> {
    const LOST_AFTER_MS: u64 = 1_500;
    let policy = disconnect(false, LOST_AFTER_MS, model_pb::Reconcile::KeepOriginal);
    let cluster = AwayCluster::start(1, policy).await?;
    let marked_at_ms = cluster.lose_a_marked_at().await?;

    let launched = cluster
        .launched_once_lost(marked_at_ms, LOST_AFTER_MS)
        .await?;
    let replacement = cluster.replacement_running(&launched).await?;
    let master = cluster.leading();
    let (a, original) = (&cluster.a.id, &cluster.original.id);
    state_when(master, "the original lost for good", |s| {
        task_away(s, a, original).is_some_and(|t| is(t, model_pb::TaskState::Lost))
    })
    .await?;
    let summary = job_summary(master, "web").await?;
    assert_eq!(
        (summary.unknown, summary.lost, summary.running),
        (0, 1, 1),
        "{summary:?}"
    );

    // Back after lost_after: its copy is killed, even with keep_original.
    cluster
        .a_returns_and_its_copy_is_killed(&cluster.original, &replacement)
        .await?;
    cluster.shutdown().await;
    Ok(())
}

/// The leader fails over while the agent is away: the new leader knows from the registry
/// what the agent ran, and applies the group's policy when the agent comes back to it
/// (`keep_replacement`: the returning copy is killed; the replacement stays).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_settles_a_returning_agent_from_the_registrys_record() -> anyhow::Result<()> {
    let policy = disconnect(true, 0, model_pb::Reconcile::KeepReplacement);
    let mut cluster = AwayCluster::start(3, policy).await?;
    cluster.lose_a().await?;
    let replacement = cluster.replacement_runs_on_b().await?;

    // The leader goes; its successor waits for b, which comes back with the replacement.
    cluster.fail_over().await?;
    let reply = cluster
        .b
        .come_back(&cluster.addresses(), vec![replacement.clone()])
        .await?;
    assert!(reply.kill_tasks.is_empty(), "{reply:?}");
    let (a, b) = (&cluster.a.id, &cluster.b.id);
    let original = &cluster.original.id;
    state_when(
        cluster.leading(),
        "recovered, a still away with its task unknown",
        |s| {
            s.is_leader
                && !s.recovering
                && task_on(s, b, &replacement.id)
                    .is_some_and(|t| is(t, model_pb::TaskState::Running))
                && task_away(s, a, original).is_some_and(|t| is(t, model_pb::TaskState::Unknown))
        },
    )
    .await?;

    let state = cluster
        .a_returns_and_its_copy_is_killed(&cluster.original, &replacement)
        .await?;
    assert!(state.unreachable.is_empty(), "{state:?}");
    cluster.shutdown().await;
    Ok(())
}

/// `reconcile = best_score`: when the agent comes back and a replacement runs, the copy on the
/// fuller agent stays. The replacement's agent is small, so its one task makes
/// it fuller than the returning agent: the returning copy is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_score_keeps_the_copy_on_the_fuller_agent() -> anyhow::Result<()> {
    let small = model_pb::Resources {
        cpus: 2.0,
        mem_mb: 512,
    };
    let policy = disconnect(true, 0, model_pb::Reconcile::BestScore);
    let cluster = AwayCluster::start_with(1, policy, small, true).await?;
    cluster.lose_a().await?;
    let replacement = cluster.replacement_runs_on_b().await?;

    cluster
        .a_returns_and_its_copy_is_killed(&cluster.original, &replacement)
        .await?;
    cluster.shutdown().await;
    Ok(())
}

/// A replacement placed but not running yet when the agent comes back does not count as
/// replacing the task: the returning copy stays (even with `keep_replacement`), and the
/// replacement is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_not_yet_running_is_stopped_when_the_original_comes_back()
-> anyhow::Result<()> {
    let policy = disconnect(true, 0, model_pb::Reconcile::KeepReplacement);
    let cluster = AwayCluster::start(1, policy).await?;
    cluster.lose_a().await?;
    // Launched on b, which says nothing of it yet: STAGING.
    let staging = cluster.b.next_launch().await?;
    let b = &cluster.b.id;
    state_when(cluster.leading(), "the replacement staging on b", |s| {
        task_on(s, b, &staging.id).is_some_and(|t| is(t, model_pb::TaskState::Staging))
    })
    .await?;

    cluster.a_returns_and_b_stops(&staging).await?;
    cluster
        .settled(&cluster.a, &cluster.original, &cluster.b)
        .await?;
    cluster.shutdown().await;
    Ok(())
}

/// An agent that comes back without a task it ran when it was marked unreachable (it lost it
/// meanwhile): the task is LOST, and a late report of it running is answered with a kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_not_reported_on_return_is_lost_and_killed_if_it_turns_up() -> anyhow::Result<()> {
    let cluster = AwayCluster::start(1, None).await?;
    cluster.lose_a().await?;
    let replacement = cluster.replacement_runs_on_b().await?;

    let reply = cluster.a_comes_back(Vec::new()).await?;
    assert!(reply.kill_tasks.is_empty(), "{reply:?}");
    let master = cluster.leading();
    let (a, b) = (&cluster.a.id, &cluster.b.id);
    let original = &cluster.original.id;
    let lost = |status: &pb::JobStatusReply| {
        status.tasks.iter().any(|t| {
            t.agent_id == *a
                && t.task
                    .as_ref()
                    .is_some_and(|t| t.id == *original && is(t, model_pb::TaskState::Lost))
        })
    };
    let status = job_status(master, "web").await?;
    assert!(lost(&status), "{:?}", status.tasks);
    let summary = job_summary(master, "web").await?;
    assert_eq!(
        (summary.unknown, summary.lost, summary.running),
        (0, 1, 1),
        "{summary:?}"
    );

    // It turns up after all: killed, not run beside the replacement.
    cluster.a.report(
        &cluster.leader,
        &cluster.original,
        model_pb::TaskState::Running,
    )?;
    assert_eq!(cluster.a.next_kill().await?, *original);
    let state = state_when(master, "the state after the late report", |s| {
        task_on(s, a, original).is_some_and(|t| is(t, model_pb::TaskState::Killed))
    })
    .await?;
    let kept = task_on(&state, b, &replacement.id).context("the replacement")?;
    assert!(is(kept, model_pb::TaskState::Running), "{kept:?}");
    assert!(cluster.b.nothing_killed(), "the replacement was killed");
    cluster.shutdown().await;
    Ok(())
}

/// `reconcile = longest_running`: a task its agent had not reported running when it was
/// marked unreachable (it was STAGING) started after its replacement, as far as the master
/// knows: when the agent comes back with it running, the returning copy is killed and the
/// replacement stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn longest_running_keeps_the_replacement_of_a_task_not_running_when_marked()
-> anyhow::Result<()> {
    let policy = disconnect(true, 0, model_pb::Reconcile::LongestRunning);
    let cluster = AwayCluster::start_with(1, policy, AGENT, false).await?;
    let state = cluster.lose_a().await?;
    let away = task_away(&state, &cluster.a.id, &cluster.original.id).context("away")?;
    assert!(is(away, model_pb::TaskState::Unknown), "{away:?}");
    let replacement = cluster.replacement_runs_on_b().await?;

    let running = model_pb::Task {
        state: model_pb::TaskState::Running as i32,
        ..cluster.original.clone()
    };
    cluster
        .a_returns_and_its_copy_is_killed(&running, &replacement)
        .await?;
    cluster.shutdown().await;
    Ok(())
}

/// `replace = false` with a `lost_after` shorter than a second: the slot is still kept until
/// `lost_after` has passed, and only then is a replacement placed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lost_after_still_keeps_the_slot_until_it_passes() -> anyhow::Result<()> {
    const LOST_AFTER_MS: u64 = 300;
    let policy = disconnect(false, LOST_AFTER_MS, model_pb::Reconcile::BestScore);
    let cluster = AwayCluster::start(1, policy).await?;
    let marked_at_ms = cluster.lose_a_marked_at().await?;
    cluster
        .launched_once_lost(marked_at_ms, LOST_AFTER_MS)
        .await?;
    cluster.shutdown().await;
    Ok(())
}

/// `replace = false` with a `lost_after`, and the leader fails over while the agent is away:
/// the new leader keeps the slot from the registry's record, places the replacement once
/// `lost_after` has passed (the delayed evaluation written with the mark), and kills the
/// agent's copy when it comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_replaces_a_task_lost_for_good_from_the_registrys_record() -> anyhow::Result<()>
{
    const LOST_AFTER_MS: u64 = 2_000;
    let policy = disconnect(false, LOST_AFTER_MS, model_pb::Reconcile::KeepOriginal);
    let mut cluster = AwayCluster::start(3, policy).await?;
    let marked_at_ms = cluster.lose_a_marked_at().await?;
    // The mark's own evaluation is done (placing nothing) before the leader goes.
    evaluated(cluster.leading(), "web", "AgentUnreachable", &cluster.a.id).await?;
    assert!(cluster.b.nothing_launched(), "replaced before lost_after");

    cluster.fail_over().await?;
    cluster
        .b
        .come_back(&cluster.addresses(), Vec::new())
        .await?;

    // The new leader places the replacement once lost_after has passed, not before.
    let launched = cluster
        .launched_once_lost(marked_at_ms, LOST_AFTER_MS)
        .await?;
    assert_eq!(launched.name, cluster.original.name);
    let replacement = cluster
        .b
        .report(&cluster.leader, &launched, model_pb::TaskState::Running)?;
    let (a, b) = (&cluster.a.id, &cluster.b.id);
    let original = &cluster.original.id;
    state_when(
        cluster.leading(),
        "the replacement running, the original lost",
        |s| {
            task_on(s, b, &replacement.id).is_some_and(|t| is(t, model_pb::TaskState::Running))
                && task_away(s, a, original).is_some_and(|t| is(t, model_pb::TaskState::Lost))
        },
    )
    .await?;

    // Back after lost_after: its copy is killed, even with keep_original.
    cluster
        .a_returns_and_its_copy_is_killed(&cluster.original, &replacement)
        .await?;
    cluster.shutdown().await;
    Ok(())
}
