//! What a scheduler sees, what it proposes, and what the plan applier answers.
//!
//! A [`ClusterSnapshot`] is a consistent view of the cluster at one state index. A scheduler
//! turns it and an [`Evaluation`](muster_model::Evaluation) into a [`Plan`]: tasks to
//! place, tasks to stop, and [`Demand`]s it could not place. The leading master applies plans
//! one at a time and answers each with a [`PlanResult`]; placements that no longer fit (another
//! scheduler got there first), or would take their namespace over its quota, come back
//! rejected.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use muster_model::{
    AgentId, Demand, Deployment, EvalId, Job, PreemptionConfig, Quota, Resources, TaskState,
};

mod agent_view;
mod attribute_column;
mod job_index;

pub(crate) use agent_view::job_hash;
pub use agent_view::{AgentView, JobGroup, TaskView};
pub use attribute_column::AttributeColumn;
pub use job_index::JobIndex;

/// A consistent view of the cluster: the input of every scheduler.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterSnapshot {
    /// The state index this view is as of; plans carry it so the applier knows how stale they
    /// are.
    pub index: u64,
    /// The agents that can take work, with their tasks, ordered by id (see
    /// [`agents_by_id`](Self::agents_by_id)). Shared: a master keeps one view per agent and
    /// rebuilds only the agents that changed, so a snapshot costs a pointer per agent, not a
    /// copy of every task.
    pub agents: Vec<Arc<AgentView>>,
    /// The registered jobs, by name.
    pub jobs: BTreeMap<String, Job>,
    /// Task slots (`web.frontend[0]`) whose task keeps failing and whose replacement backs
    /// off: schedulers leave them empty for now. An evaluation held back until the wait is
    /// over places them.
    pub held: BTreeSet<String>,
    /// Which agents run tasks of each job, so that a scheduler run visits only those
    /// ([`JobIndex`]). Optional: without it, or if `agents` changed since it was built, a run
    /// looks at every agent.
    pub job_index: Option<Arc<JobIndex>>,
    /// The quotas of the namespaces that have one setting a limit, by namespace: a
    /// namespace's live tasks in this snapshot, with a plan's placements and less its stops,
    /// stay within its quota ([`Quota`]). A namespace not listed has no limit.
    pub quotas: BTreeMap<String, Quota>,
    /// The deployment of each job's current version, by job, for the jobs whose groups roll
    /// ([`Deployment`]): how many outdated tasks a scheduler may replace now, and canaries.
    /// A job not listed replaces all of its outdated tasks at once.
    pub deployments: BTreeMap<String, Deployment>,
    /// Which job types may stop lower-priority tasks to fit ([`PreemptionConfig`]).
    pub preemption: PreemptionConfig,
}

impl ClusterSnapshot {
    /// The agent with this id, if it is in the snapshot.
    pub fn agent(&self, id: &AgentId) -> Option<&AgentView> {
        self.agents
            .iter()
            .map(|agent| &**agent)
            .find(|agent| &agent.id == id)
    }

    /// The positions in [`agents`](Self::agents) of the agents with a task of `job`
    /// (running or recently ended), in order, if the snapshot's [`JobIndex`] holds for its
    /// agents; `None` if there is none, or its agents changed since it was built (then every
    /// agent must be looked at).
    pub fn agents_with(&self, job: &str) -> Option<&[u32]> {
        self.index_of_agents().map(|index| index.agents_with(job))
    }

    /// Its [`JobIndex`], if it has one built for its agents as they are.
    pub fn index_of_agents(&self) -> Option<&JobIndex> {
        let index = self.job_index.as_ref()?;
        index.holds_for(&self.agents).then_some(&**index)
    }

    /// Its agents ordered by id, each once, as schedulers read them. A master's snapshots
    /// list them so and are only checked (borrowed); others are sorted into a copy, where an
    /// id listed twice counts once (the first).
    pub fn agents_by_id(&self) -> Cow<'_, [Arc<AgentView>]> {
        let indexed = |index: &Arc<JobIndex>| index.holds_for(&self.agents);
        if self.job_index.as_ref().is_some_and(indexed)
            || self.agents.is_sorted_by(|a, b| a.id < b.id)
        {
            return Cow::Borrowed(&self.agents);
        }
        let mut agents = self.agents.clone();
        agents.sort_by(|a, b| a.id.cmp(&b.id));
        agents.dedup_by(|later, earlier| later.id == earlier.id);
        Cow::Owned(agents)
    }
}

/// A task to start on an agent: a slot of a job's group, at a job version, on an agent. What
/// the task runs (program, arguments, environment, user) is not in it: the plan applier takes
/// that from the stored job's group at `job_version`, whatever a scheduler says.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// The agent.
    pub agent: AgentId,
    /// A fresh unique id: `{name}-{8 hex digits}`.
    pub task_id: String,
    /// The slot it fills.
    pub name: String,
    /// Its job.
    pub job: String,
    /// Its task group.
    pub group: String,
    /// What it needs: its group's resources, as the scheduler fitted them.
    pub resources: Resources,
    /// The job version it was placed at; 0 if unknown. A task placed at a version older than
    /// its group's [`spec_version`](muster_model::TaskGroup::spec_version) is
    /// outdated and replaced.
    pub job_version: u64,
    /// The ports it is given, in its group's order.
    pub ports: Vec<muster_model::AssignedPort>,
}

impl Placement {
    /// The task this placement starts, as a scheduler sees it before its agent reports it
    /// (staging).
    pub fn staged_task(&self) -> TaskView {
        self.staged_task_of(&self.job)
    }

    /// [`staged_task`](Self::staged_task), staged under job `job` rather than its own.
    pub(crate) fn staged_task_of(&self, job: &str) -> TaskView {
        TaskView::new(
            &self.task_id,
            &self.name,
            JobGroup::new(job, &self.group),
            self.resources.clone(),
            TaskState::Staging,
            self.job_version,
        )
        .with_ports(self.ports.iter().map(|p| p.port).collect::<Vec<_>>())
    }
}

/// A task to stop.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stop {
    /// The agent it runs on.
    pub agent: AgentId,
    /// The task.
    pub task_id: String,
}

/// A task a plan stops so that one of its placements fits: the applier checks that its job's
/// priority is lower than the plan's job's, stops it before it launches anything, and
/// evaluates its job again (its task is placed elsewhere when room allows).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preemption {
    /// The agent it runs on.
    pub agent: AgentId,
    /// The task.
    pub task_id: String,
    /// Its job.
    pub job: String,
}

/// A scheduler's proposal for one evaluation.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The evaluation it answers.
    pub eval: EvalId,
    /// The job.
    pub job: String,
    /// The job's version it was planned for (0 if the job is gone).
    pub job_version: u64,
    /// The index of the snapshot it was planned against.
    pub snapshot_index: u64,
    /// Tasks to start.
    pub place: Vec<Placement>,
    /// Tasks to stop.
    pub stop: Vec<Stop>,
    /// What was left unplaced: one demand per task group that had tasks left so, and per
    /// cause (no room; its namespace's quota, [`Demand::over_quota`]).
    pub unplaced: Vec<Demand>,
    /// The token its evaluation was handed out with ([`Assignment::token`](crate::Assignment));
    /// the scheduling API applies a plan only for an evaluation its caller holds. The
    /// [`Worker`](crate::Worker) fills it in.
    pub eval_token: String,
    /// All or nothing: the applier commits every placement or none (its stops apply either
    /// way). [`PlacingScheduler`](crate::PlacingScheduler) marks a plan so when it places a
    /// group whose tasks go all at once ([`TaskGroup::gang`](muster_model::TaskGroup::gang)).
    pub atomic: bool,
    /// Tasks of lower-priority jobs to stop so that its placements fit (where the snapshot's
    /// [`PreemptionConfig`] allows it for the job's type): the applier checks each victim's
    /// priority and stops them before it launches anything.
    pub preempt: Vec<Preemption>,
}

impl Plan {
    /// A plan that changes nothing.
    pub fn empty(eval: EvalId, job: impl Into<String>, snapshot_index: u64) -> Self {
        Plan {
            eval,
            job: job.into(),
            job_version: 0,
            snapshot_index,
            place: Vec::new(),
            stop: Vec::new(),
            unplaced: Vec::new(),
            eval_token: String::new(),
            atomic: false,
            preempt: Vec::new(),
        }
    }

    /// Whether applying it would change nothing (it may still report unplaced demands).
    pub fn is_noop(&self) -> bool {
        self.place.is_empty() && self.stop.is_empty()
    }
}

/// The plan applier's answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlanResult {
    /// Placements it committed.
    pub committed: Vec<Placement>,
    /// Placements that no longer fit (or were otherwise refused).
    pub rejected: Vec<Placement>,
    /// Why placements among `rejected` that would have taken their namespace over its quota
    /// were refused, by task id (`namespace "team-a" is at its quota of 2 tasks (it would
    /// have 3)`).
    pub over_quota: BTreeMap<String, String>,
    /// Stops it committed.
    pub stopped: Vec<Stop>,
    /// The state index after applying; a scheduler that plans again refreshes its snapshot to
    /// at least this index.
    pub index: u64,
    /// The tasks it stopped for the plan's preemptions.
    pub preempted: Vec<Preemption>,
}
