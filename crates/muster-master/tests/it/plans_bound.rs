//! A `schedule` token reaches only what it was handed: through the scheduling API over mutual
//! TLS, with a real master (no workers of its own) and a real agent, a plan is applied only
//! for an evaluation its caller holds, only for that evaluation's job, stopping only that
//! job's tasks; what a task runs comes from the stored job, never from the plan; a snapshot
//! carries no environment; and an evaluation is settled only by its holder.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use muster_agent::AgentHandle;
use muster_master::testing;
use muster_master::{MasterConfig, MasterServer};
use muster_model::{AgentId, EvalId};
use muster_proto::model as model_pb;
use muster_proto::scheduling as spb;
use muster_proto::scheduling::scheduling_client::SchedulingClient;
use muster_scheduler::{Assignment, Backend, Plan, RemoteBackend, Scheduler, Stop};
use muster_security::guard::WithToken;
use muster_transport::Node;

use crate::common::{agent_config, master_config, start_agent, state};

const DEADLINE: Duration = Duration::from_secs(30);

/// A service job of one `sleep 60` task whose environment holds a secret.
fn job_with_secret(name: &str) -> model_pb::Job {
    model_pb::Job {
        name: name.into(),
        scheduler: model_pb::SchedulerType::Service as i32,
        groups: vec![model_pb::TaskGroup {
            name: "main".into(),
            count: 1,
            resources: Some(model_pb::Resources {
                cpus: 0.5,
                mem_mb: 64,
            }),
            command: "sleep".into(),
            args: vec!["60".into()],
            env: [("SECRET".to_owned(), format!("{name}-hunter2"))].into(),
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    }
}

/// A master that schedules nothing itself, one real agent (4 cpus, 4 GiB), and a
/// `RemoteBackend` holding a `schedule` token (`quotas.rs` plans through it too).
pub(crate) struct Cluster {
    pub(crate) master: MasterServer,
    _node: Node,
    agent: AgentHandle,
    pub(crate) agent_id: String,
    pub(crate) backend: RemoteBackend,
    /// The backend's `schedule` token.
    schedule: muster_security::TokenSecret,
    /// The management token.
    pub(crate) root: muster_security::TokenSecret,
    dir: tempfile::TempDir,
}

impl Cluster {
    pub(crate) async fn start() -> anyhow::Result<Cluster> {
        let dir = tempfile::tempdir()?;
        let master = testing::start_leading(MasterConfig {
            workers: 0,
            ..master_config(dir.path())
        })
        .await?;
        let config = agent_config(
            vec![master.address().to_owned()],
            dir.path(),
            "agent-1",
            (4.0, 4096),
        );
        let (node, agent, agent_id) = start_agent("agent-1", config).await?;
        let root = testing::bootstrap(master.address()).await?;
        let schedule =
            testing::create_token(master.address(), &root, "scheduler", "schedule").await?;
        let backend = RemoteBackend::connect(
            vec![master.address().to_owned()],
            testing::client_security(),
            Some(schedule.clone()),
        )?;
        Ok(Cluster {
            master,
            _node: node,
            agent,
            agent_id,
            backend,
            schedule,
            root,
            dir,
        })
    }

    /// The pending evaluations of `jobs`, dequeued through the scheduling API, by job.
    pub(crate) async fn dequeue(
        &self,
        jobs: &[&str],
    ) -> anyhow::Result<BTreeMap<String, Assignment>> {
        let mut held = BTreeMap::new();
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while held.len() < jobs.len() {
            ensure!(
                tokio::time::Instant::now() < deadline,
                "dequeued only {:?} of {jobs:?}",
                held.keys().collect::<Vec<_>>()
            );
            if let Some(assignment) = self
                .backend
                .dequeue(&built_in_schedulers(), Duration::from_secs(5))
                .await?
            {
                held.insert(assignment.eval.job.clone(), assignment);
            }
        }
        Ok(held)
    }

    /// The plan the built-in spread scheduler makes for `assignment`, as its holder sends it.
    pub(crate) async fn plan(&self, assignment: &Assignment) -> anyhow::Result<Plan> {
        let snapshot = self.backend.snapshot(assignment.min_index()).await?;
        let mut plan = muster_scheduler::spread().schedule(&assignment.eval, &snapshot);
        plan.eval_token.clone_from(&assignment.token);
        Ok(plan)
    }

    /// Submits `plan` as it stands, past the SDK, answered whole.
    pub(crate) async fn submit_on_the_wire(
        &self,
        plan: spb::Plan,
    ) -> anyhow::Result<spb::PlanResult> {
        let mut client = SchedulingClient::with_interceptor(
            testing::channel(self.master.address(), &testing::client_security()).await?,
            WithToken::new(Some(&self.schedule))?,
        );
        let request = spb::SubmitPlanRequest {
            plan: Some(plan),
            brief: false,
        };
        Ok(client.submit_plan(request).await?.into_inner())
    }

    /// The tasks of `job` the master counts as running (or about to), with their records.
    pub(crate) async fn live_tasks(&self, job: &str) -> anyhow::Result<Vec<model_pb::Task>> {
        Ok(state(&self.master)
            .await?
            .agents
            .into_iter()
            .flat_map(|agent| agent.tasks)
            .filter(|task| task.job == job)
            .filter(|task| {
                matches!(
                    model_pb::TaskState::try_from(task.state),
                    Ok(model_pb::TaskState::Staging
                        | model_pb::TaskState::Starting
                        | model_pb::TaskState::Running)
                )
            })
            .collect())
    }

    pub(crate) async fn shutdown(self) {
        self.agent.stop().await;
        self.master.shutdown().await;
    }
}

/// The names of the built-in schedulers, which the workers of these tests serve.
fn built_in_schedulers() -> Vec<String> {
    muster_model::BUILT_IN_SCHEDULERS
        .map(str::to_owned)
        .to_vec()
}

fn refused<T: std::fmt::Debug, E: std::fmt::Display>(
    outcome: Result<T, E>,
    what: &str,
    says: &str,
) -> anyhow::Result<()> {
    match outcome {
        Ok(accepted) => bail!("{what} was accepted: {accepted:?}"),
        Err(error) if error.to_string().contains(says) => Ok(()),
        Err(error) => bail!("{what} was refused, but not for saying {says:?}: {error}"),
    }
}

/// A forged plan (an evaluation nobody was handed, a job that does not exist, a program of
/// its own) is refused and runs nothing; a plan for a held evaluation may neither reach into
/// another job nor choose what its tasks run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_token_plans_only_what_it_was_handed() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let marker = cluster.dir.path().join("MARKER");
    let planted = |job: &str, group: &str, version: u64| muster_scheduler::Placement {
        ports: Default::default(),
        agent: AgentId(cluster.agent_id.clone()),
        task_id: format!("{job}.{group}[0]-0badf00d"),
        name: format!("{job}.{group}[0]"),
        job: job.into(),
        group: group.into(),
        resources: muster_model::Resources {
            cpus: 0.1,
            mem_mb: 16,
        },
        job_version: version,
    };

    // An evaluation nobody was handed, for a job that does not exist.
    let mut forged = Plan::empty(EvalId("nonexistent-eval".into()), "ghost", 0);
    forged.place.push(planted("ghost", "g", 1));
    forged.eval_token = "guessed".into();
    refused(
        cluster.backend.submit(forged).await,
        "a plan for an evaluation nobody holds",
        "is not outstanding",
    )?;
    ensure!(cluster.live_tasks("ghost").await?.is_empty());

    testing::submit(&cluster.master, job_with_secret("web")).await?;
    testing::submit(&cluster.master, job_with_secret("other")).await?;

    // The snapshot a scheduler plans against carries no environment.
    let snapshot = cluster.backend.snapshot(0).await?;
    ensure!(snapshot.jobs.len() == 2, "{:?}", snapshot.jobs.keys());
    for job in snapshot.jobs.values() {
        for group in &job.groups {
            ensure!(
                group.env.is_empty(),
                "{}'s environment reached a scheduler: {:?}",
                job.name,
                group.env
            );
        }
    }

    let held = cluster.dequeue(&["web", "other"]).await?;
    let (web, other) = (&held["web"], &held["other"]);

    // `other` is placed by its holder, as a scheduler does.
    let plan = cluster.plan(other).await?;
    let placed = cluster.backend.submit(plan).await?;
    ensure!(placed.committed.len() == 1, "{placed:?}");
    let other_task = placed.committed[0].task_id.clone();

    // A held evaluation with another token, or for another job.
    let mut stolen = cluster.plan(web).await?;
    stolen.eval_token = other.token.clone();
    refused(
        cluster.backend.submit(stolen).await,
        "a plan under another evaluation's token",
        "token does not match",
    )?;
    let mut elsewhere = cluster.plan(web).await?;
    elsewhere.job = "other".into();
    refused(
        cluster.backend.submit(elsewhere).await,
        "a plan for another job than its evaluation's",
        "is for job \"web\"",
    )?;

    // A plan for `web` that also stops `other`'s task, or places one of `other`'s.
    let mut reaching = cluster.plan(web).await?;
    reaching.stop.push(Stop {
        agent: AgentId(cluster.agent_id.clone()),
        task_id: other_task.clone(),
    });
    refused(
        cluster.backend.submit(reaching).await,
        "a plan stopping another job's task",
        "belongs to job \"other\"",
    )?;
    let mut reaching = cluster.plan(web).await?;
    reaching.place.push(planted("other", "main", 1));
    refused(
        cluster.backend.submit(reaching).await,
        "a plan placing another job's task",
        "places only its own job's tasks",
    )?;
    let others = cluster.live_tasks("other").await?;
    ensure!(
        others.len() == 1 && others[0].id == other_task,
        "other's task was touched: {others:?}"
    );

    // A plan for `web` whose placement names a program, an environment and a user of its
    // own (sent past the SDK, whose placements name none): the task runs what `web` says.
    let mut tampered = spb::Plan::from(&cluster.plan(web).await?);
    ensure!(tampered.place.len() == 1, "{tampered:?}");
    let task_id = tampered.place[0].task_id.clone();
    let stored = tampered.place[0].job_version;
    tampered.place[0] = spb::Placement {
        task_id: task_id.clone(),
        command: "sh".into(),
        args: vec!["-c".into(), format!("id > {}", marker.display())],
        env: [("SECRET".to_owned(), "planted".to_owned())].into(),
        user: "root".into(),
        ..spb::Placement::from(planted("web", "main", stored))
    };
    let applied = cluster.submit_on_the_wire(tampered).await?;
    ensure!(
        applied.committed.len() == 1
            && applied.committed[0].command.is_empty()
            && applied.committed[0].user.is_empty(),
        "the master kept the plan's program: {applied:?}"
    );
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let running = loop {
        let live = cluster.live_tasks("web").await?;
        if let Some(task) = live
            .iter()
            .find(|t| t.id == task_id && t.state == model_pb::TaskState::Running as i32)
        {
            break task.clone();
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "web never ran: {live:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    ensure!(
        running.command == "sleep" && running.args == ["60"] && running.user.is_empty(),
        "the plan chose what the task runs: {running:?}"
    );
    let on_agent = cluster.agent.snapshot().await?;
    let launched = on_agent
        .tasks
        .iter()
        .find(|t| t.id == task_id)
        .context("the task on the agent")?;
    ensure!(
        launched.command == "sleep"
            && launched.env.get("SECRET").map(String::as_str) == Some("web-hunter2"),
        "the agent runs something else than the stored job: {launched:?}"
    );
    ensure!(!marker.exists(), "the plan's program ran");

    // Only the holder settles an evaluation.
    let mut done = web.eval.clone();
    done.status = muster_model::EvalStatus::Complete;
    refused(
        cluster.backend.complete(&done, &other.token).await,
        "a completion under another evaluation's token",
        "token does not match",
    )?;
    refused(
        cluster
            .backend
            .block(done.clone(), "guessed", Vec::new())
            .await,
        "a block under a guessed token",
        "token does not match",
    )?;
    cluster.backend.complete(&done, &web.token).await?;
    cluster.backend.ack(&web.eval.id, &web.token).await?;

    cluster.shutdown().await;
    Ok(())
}
