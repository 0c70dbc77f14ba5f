//! Masters in one test process, agents played by the test over the real transport: standby
//! redirects, failover rebuilt from re-registrations, the re-registration deadline and the
//! removal limit.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};
use muster_actor::{Node, System, Upid};
use muster_agent::reregistration::group_by_shared_labels;
use muster_master::{MasterConfig, MasterServer, OperatorMsg};
use muster_proto::cluster as pb;
use muster_proto::cluster::registration_reply::Result as Registration;
use muster_proto::model as model_pb;
use muster_security::Role;
use muster_security::testing::TestPki;
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
        match answer.map(|a| a.result) {
            Ok(Some(Registration::AgentId(id))) => return Ok(id),
            Ok(Some(Registration::NotLeader(hint))) if !hint.leader.is_empty() => {
                target = hint.leader;
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
                .ask(|reply| OperatorMsg::GetMetrics(reply).into())
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
        let state = master
            .pid()
            .ask(|reply| OperatorMsg::GetState(reply).into())
            .await?;
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
        .ask(|reply| OperatorMsg::GetState(reply).into())
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
        .ask(|reply| OperatorMsg::GetMetrics(reply).into())
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
        .ask(|reply| OperatorMsg::SubmitJob(Some(web), reply).into())
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
        .ask(|reply| OperatorMsg::JobStatus("web".into(), false, reply).into())
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
        .ask(|reply| OperatorMsg::GetMetrics(reply).into())
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
        .ask(|reply| OperatorMsg::SubmitJob(Some(job), reply).into())
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
        async move {
            pid.ask(|reply| muster_master::SchedulingMsg::SubmitPlan(plan, reply).into())
                .await
        }
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
        .ask(|reply| OperatorMsg::GetState(reply).into())
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
        .ask(|reply| OperatorMsg::GetMetrics(reply).into())
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
        .ask(|reply| OperatorMsg::JobStatus("late".into(), true, reply).into())
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
        .ask(|reply| OperatorMsg::GetMetrics(reply).into())
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
        .ask(|reply| OperatorMsg::GetMetrics(reply).into())
        .await?;
    assert!(metrics.reconcile_evals >= 1, "{metrics:?}");
    for master in masters.into_values() {
        master.shutdown().await;
    }
    Ok(())
}
