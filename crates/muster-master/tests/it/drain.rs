//! Draining an agent end to end, as Nomad's node drain: a real master and three real agents
//! running child processes. The drained agent takes no new task; its service tasks move to
//! the others a migration step at a time, each replacement running before the task it
//! replaces stops, so the job never runs fewer than its count; a batch task there runs to its
//! end; the agent is then marked drained. Eligibility is refused while an agent drains, and a
//! drain's deadline stops what is left.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use muster_master::requests::{DrainAgent, GetState, SetAgentEligibility, SubscribeEvents};
use muster_master::testing::{self, submit};
use muster_master::{EventFeed, MasterServer, ServiceError};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use tokio::time::Instant;

use crate::common::{start_master, start_pinnable_agent};

const DEADLINE: Duration = Duration::from_secs(30);
/// The service job's count, and how many of its tasks may move at once.
const COUNT: u32 = 4;
const STEP: u32 = 2;

fn job(
    name: &str,
    scheduler: model_pb::SchedulerType,
    count: u32,
    args: &[&str],
    on: Option<&str>,
) -> model_pb::Job {
    model_pb::Job {
        name: name.into(),
        scheduler: scheduler as i32,
        groups: vec![model_pb::TaskGroup {
            name: "main".into(),
            count,
            resources: Some(model_pb::Resources {
                cpus: 1.0,
                mem_mb: 64,
            }),
            command: "sleep".into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            constraints: on
                .map(|agent| model_pb::Constraint {
                    attribute: "name".into(),
                    op: model_pb::ConstraintOp::Equal as i32,
                    value: agent.into(),
                })
                .into_iter()
                .collect(),
            migrate_max_parallel: STEP,
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    }
}

async fn drain(
    master: &MasterServer,
    request: pb::DrainAgentRequest,
) -> anyhow::Result<Result<pb::AgentSchedulingReply, ServiceError>> {
    Ok(master
        .pid()
        .ask(|reply| DrainAgent { request, reply }.into())
        .await?)
}

async fn set_eligibility(
    master: &MasterServer,
    agent_id: &str,
    eligible: bool,
) -> anyhow::Result<Result<pb::AgentSchedulingReply, ServiceError>> {
    let request = pb::AgentEligibilityRequest {
        agent_id: agent_id.into(),
        eligible,
    };
    Ok(master
        .pid()
        .ask(|reply| SetAgentEligibility { request, reply }.into())
        .await?)
}

/// The live tasks of a job's status, as (agent, state).
fn live(status: &pb::JobStatusReply) -> Vec<(String, model_pb::TaskState)> {
    status
        .tasks
        .iter()
        .filter_map(|t| {
            let task = t.task.as_ref()?;
            let state = model_pb::TaskState::try_from(task.state).ok()?;
            matches!(
                state,
                model_pb::TaskState::Staging
                    | model_pb::TaskState::Starting
                    | model_pb::TaskState::Running
            )
            .then(|| (t.agent_id.clone(), state))
        })
        .collect()
}

/// Polls the cluster state until `done` holds for agent `id`'s scheduling.
async fn agent_when(
    master: &MasterServer,
    id: &str,
    what: &str,
    done: impl Fn(&model_pb::AgentScheduling) -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let state = master.pid().ask(|reply| GetState { reply }.into()).await?;
        let scheduling = state
            .agents
            .iter()
            .find(|a| a.id == id)
            .map(|a| a.scheduling.unwrap_or_default());
        if scheduling.as_ref().is_some_and(&done) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{what} did not happen within {DEADLINE:?}: {scheduling:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the event stream says of one job's tasks: each task's last state, and the fewest
/// running and the most starting (replacements not running yet) at once since counting
/// began.
#[derive(Default)]
struct TaskWatch {
    states: HashMap<String, (String, String)>,
    fewest_running: Option<usize>,
    most_starting: usize,
    /// Every change seen, for the failure messages.
    log: Vec<String>,
}

impl TaskWatch {
    fn read(&mut self, event: &muster_api::Event, job: &str, counting: bool) {
        if event.topic != "task" || event.payload["job"] != job {
            return;
        }
        let agent = event.payload["agent_id"].as_str().unwrap_or("").to_owned();
        let state = event.payload["state"].as_str().unwrap_or("").to_owned();
        self.log
            .push(format!("{} {} {agent} {state}", event.index, event.key));
        self.states.insert(event.key.clone(), (agent, state));
        if counting {
            let running = self.count(|s| s == "running");
            let starting = self.count(|s| matches!(s, "staging" | "starting"));
            self.fewest_running = Some(self.fewest_running.map_or(running, |f| f.min(running)));
            self.most_starting = self.most_starting.max(starting);
        }
    }

    fn count(&self, wanted: impl Fn(&str) -> bool) -> usize {
        self.states.values().filter(|(_, s)| wanted(s)).count()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_agents_service_tasks_move_a_step_at_a_time_and_never_below_the_count()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = start_master(dir.path()).await?;
    let mut agents = Vec::new();
    for name in ["a1", "a2", "a3"] {
        agents.push(start_pinnable_agent(&master, dir.path(), name, (6.0, 4096)).await?);
    }

    // The service job, then a short batch task pinned where most of it runs.
    submit(
        &master,
        job(
            "web",
            model_pb::SchedulerType::Service,
            COUNT,
            &["600"],
            None,
        ),
    )
    .await?;
    let status = testing::job_when(&master, "web", "web running", |s| {
        let live = live(s);
        live.len() == COUNT as usize
            && live
                .iter()
                .all(|(_, state)| *state == model_pb::TaskState::Running)
    })
    .await?;
    let mut per_agent: BTreeMap<String, usize> = BTreeMap::new();
    for (agent, _) in live(&status) {
        *per_agent.entry(agent).or_default() += 1;
    }
    let (drained, _) = per_agent
        .iter()
        .max_by_key(|(_, n)| **n)
        .context("web runs nowhere")?;
    let drained = drained.clone();
    let state = master.pid().ask(|reply| GetState { reply }.into()).await?;
    let host = state
        .agents
        .iter()
        .find(|a| a.id == drained)
        .and_then(|a| a.info.as_ref())
        .map(|info| info.hostname.clone())
        .context("the drained agent is not in the state")?;
    submit(
        &master,
        job(
            "crunch",
            model_pb::SchedulerType::Batch,
            1,
            &["2"],
            Some(&host),
        ),
    )
    .await?;
    testing::job_when(&master, "crunch", "crunch running", |s| {
        live(s)
            .iter()
            .any(|(_, state)| *state == model_pb::TaskState::Running)
    })
    .await?;

    // Watch web's tasks through the event stream from the start.
    let subscription = master
        .pid()
        .ask(|reply| SubscribeEvents { after: 0, reply }.into())
        .await?
        .map_err(anyhow::Error::msg)?;
    let mut feed = EventFeed::new(
        subscription,
        0,
        vec!["task".into(), "agent".into()],
        muster_security::Caller::insecure(),
        muster_master::visibility::NamespaceFilter::All,
    );
    let mut web = TaskWatch::default();
    let mut crunch = TaskWatch::default();

    let started = drain(
        &master,
        pb::DrainAgentRequest {
            agent_id: drained.clone(),
            no_deadline: true,
            ..pb::DrainAgentRequest::default()
        },
    )
    .await?
    .map_err(anyhow::Error::msg)?;
    ensure!(
        started
            .scheduling
            .as_ref()
            .is_some_and(|s| s.ineligible && s.drain.is_some()),
        "{started:?}"
    );
    let refused = set_eligibility(&master, &drained, true).await?;
    ensure!(
        matches!(&refused, Err(ServiceError::FailedPrecondition(why)) if why.contains("draining")),
        "{refused:?}"
    );

    // Follow the stream until the agent is marked drained.
    let deadline = Instant::now() + DEADLINE;
    let mut counting = false;
    loop {
        let event = tokio::time::timeout_at(deadline, feed.next())
            .await
            .context("the agent was not drained in time")?
            .context("the event stream ended")?
            .map_err(|lagged| anyhow::anyhow!("lagged: {lagged:?}"))?;
        // Counting starts once the stream has caught up with the drain's request.
        if event.topic == "agent" && event.kind == "agent-scheduling" && event.key == drained {
            if event.payload["drain"] == "drained" {
                break;
            }
            counting = true;
        }
        web.read(&event, "web", counting);
        crunch.read(&event, "crunch", counting);
    }

    let fewest = web.fewest_running.context("no web task changed state")?;
    ensure!(
        fewest >= (COUNT - STEP) as usize,
        "web ran only {fewest} tasks at one point, below its count less the migration step: {:#?}",
        web.log
    );
    // Stronger, as Muster moves: each replacement ran before the task it replaced stopped.
    ensure!(
        fewest >= COUNT as usize,
        "web dropped to {fewest} running: {:#?}",
        web.log
    );
    ensure!(
        web.most_starting <= STEP as usize,
        "{} replacements started at once, more than the migration step: {:#?}",
        web.most_starting,
        web.log
    );
    let status = testing::job_when(&master, "web", "web settled", |s| {
        live(s).len() == COUNT as usize
    })
    .await?;
    ensure!(
        live(&status).iter().all(|(agent, _)| *agent != drained),
        "a web task is still on the drained agent: {status:?}"
    );
    // The batch task ran to its end where it was, and was not placed again.
    let ended: Vec<&(String, String)> = crunch.states.values().collect();
    ensure!(
        ended.len() == 1 && ended[0].0 == drained && ended[0].1 == "finished",
        "crunch: {ended:?}"
    );

    // Nothing new is placed on a drained agent.
    submit(
        &master,
        job("more", model_pb::SchedulerType::Service, 2, &["600"], None),
    )
    .await?;
    let more = testing::job_when(&master, "more", "more running", |s| live(s).len() == 2).await?;
    ensure!(
        live(&more).iter().all(|(agent, _)| *agent != drained),
        "{more:?}"
    );

    // Eligible again, a drain with a deadline: a task with nowhere else to go stops at the
    // deadline, and the agent is drained.
    set_eligibility(&master, &drained, true)
        .await?
        .map_err(anyhow::Error::msg)?;
    submit(
        &master,
        job(
            "pinned",
            model_pb::SchedulerType::Batch,
            1,
            &["600"],
            Some(&host),
        ),
    )
    .await?;
    testing::job_when(&master, "pinned", "pinned running", |s| {
        live(s)
            .iter()
            .any(|(_, state)| *state == model_pb::TaskState::Running)
    })
    .await?;
    drain(
        &master,
        pb::DrainAgentRequest {
            agent_id: drained.clone(),
            deadline_ms: 500,
            ..pb::DrainAgentRequest::default()
        },
    )
    .await?
    .map_err(anyhow::Error::msg)?;
    let pinned = testing::job_when(&master, "pinned", "pinned stopped at the deadline", |s| {
        live(s).is_empty()
            && s.tasks.iter().any(|t| {
                t.task
                    .as_ref()
                    .is_some_and(|t| t.state == model_pb::TaskState::Killed as i32)
            })
    })
    .await?;
    ensure!(!pinned.tasks.is_empty());
    agent_when(&master, &drained, "the second drain's end", |s| {
        s.drain.is_none() && s.ineligible && s.drained_at_ms > 0
    })
    .await?;

    // Unknown agents are named.
    let unknown = drain(
        &master,
        pb::DrainAgentRequest {
            agent_id: "agent-99".into(),
            ..pb::DrainAgentRequest::default()
        },
    )
    .await?;
    ensure!(
        matches!(&unknown, Err(ServiceError::UnknownAgent(id)) if id == "agent-99"),
        "{unknown:?}"
    );

    for (_node, agent, _) in &agents {
        agent.stop().await;
    }
    master.shutdown().await;
    Ok(())
}
