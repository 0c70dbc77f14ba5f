//! Agents marked unreachable with tasks on them: UNKNOWN while they are away, and settled by
//! each group's `disconnect` policy when they come back (`policies`), also by a new leader
//! (`new_leader`). The cluster they run in: [`AwayCluster`].

mod new_leader;
mod policies;

use super::*;

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

async fn job_summary(master: &MasterServer, job: &str) -> anyhow::Result<pb::JobSummary> {
    let request = pb::ListJobsRequest {
        stale: false,
        prefix: job.into(),
        namespace: String::new(),
    };
    master
        .pid()
        .ask(|reply| {
            ListJobs {
                request,
                namespaces: muster_master::visibility::NamespaceFilter::All,
                reply,
            }
            .into()
        })
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
