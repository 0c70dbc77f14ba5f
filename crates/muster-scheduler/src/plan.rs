//! What a scheduler sees, what it proposes, and what the plan applier answers.
//!
//! A [`ClusterSnapshot`] is a consistent view of the cluster at one state index. A scheduler
//! turns it and an [`Evaluation`](muster_model::Evaluation) into a [`Plan`]: tasks to
//! place, tasks to stop, and [`Demand`]s it could not place. The leading master applies plans
//! one at a time and answers each with a [`PlanResult`]; placements that no longer fit (another
//! scheduler got there first) come back rejected.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use muster_model::{AgentId, Constraint, Demand, DrainPhase, EvalId, Job, Resources, TaskState};

/// A consistent view of the cluster: the input of every scheduler.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterSnapshot {
    /// The state index this view is as of; plans carry it so the applier knows how stale they
    /// are.
    pub index: u64,
    /// The agents that can take work, with their tasks. Shared: a master keeps one view per
    /// agent and rebuilds only the agents that changed, so a snapshot costs a pointer per
    /// agent, not a copy of every task.
    pub agents: Vec<Arc<AgentView>>,
    /// The registered jobs, by name.
    pub jobs: BTreeMap<String, Job>,
    /// Task slots (`web.frontend[0]`) whose task keeps failing and whose replacement backs
    /// off: schedulers leave them empty for now. An evaluation held back until the wait is
    /// over places them.
    pub held: BTreeSet<String>,
}

impl ClusterSnapshot {
    /// The agent with this id, if it is in the snapshot.
    pub fn agent(&self, id: &AgentId) -> Option<&AgentView> {
        self.agents
            .iter()
            .map(|agent| &**agent)
            .find(|agent| &agent.id == id)
    }
}

/// One agent as a scheduler sees it. Its tasks are kept grouped by job, with what its live
/// tasks hold worked out once: a scheduler run finds a job's tasks on an agent by a binary
/// search, and never walks the agent's other tasks ([`AgentView::tasks_of`]).
#[derive(Clone, Debug, PartialEq)]
pub struct AgentView {
    /// Its id.
    pub id: AgentId,
    /// Attributes constraints are checked against (`rack = "r1"`).
    pub attributes: BTreeMap<String, String>,
    /// Everything it offers.
    pub total: Resources,
    /// Whether new tasks may be placed on it (false while it drains, or as an operator set
    /// it).
    pub eligible: bool,
    /// Where its drain is: its tasks move or stop (see [`reconcile`](crate::reconcile)).
    pub drain: DrainPhase,
    /// Its tasks, running and recently ended, ordered by job.
    tasks: Vec<TaskView>,
    /// What its live tasks hold.
    used: Resources,
    /// How many of its tasks are live.
    live: usize,
}

impl AgentView {
    /// An eligible agent, not draining, with `tasks`.
    pub fn new(
        id: AgentId,
        attributes: BTreeMap<String, String>,
        total: Resources,
        tasks: Vec<TaskView>,
    ) -> Self {
        let mut view = AgentView {
            id,
            attributes,
            total,
            eligible: true,
            drain: DrainPhase::None,
            tasks,
            used: Resources::default(),
            live: 0,
        };
        view.index();
        view
    }

    /// Its tasks, running and recently ended, ordered by job.
    pub fn tasks(&self) -> &[TaskView] {
        &self.tasks
    }

    /// Its tasks, ordered by job, taken out of the view.
    pub fn into_tasks(self) -> Vec<TaskView> {
        self.tasks
    }

    /// Its tasks of `job`, found by a binary search.
    pub fn tasks_of(&self, job: &str) -> &[TaskView] {
        let start = self.tasks.partition_point(|task| task.job.as_str() < job);
        let len = self.tasks[start..].partition_point(|task| task.job == job);
        &self.tasks[start..start + len]
    }

    /// Changes its tasks with `change`; the order by job and the figures follow.
    pub fn update_tasks(&mut self, change: impl FnOnce(&mut Vec<TaskView>)) {
        change(&mut self.tasks);
        self.index();
    }

    /// Orders the tasks by job (stable: otherwise as given) and works out what the live ones
    /// hold.
    fn index(&mut self) {
        self.tasks.sort_by(|a, b| a.job.cmp(&b.job));
        let live = self.tasks.iter().filter(|task| !task.state.is_terminal());
        self.live = live.clone().count();
        self.used = live.fold(Resources::default(), |used, task| {
            used.saturating_add(&task.resources)
        });
    }

    /// The resources its non-terminal tasks hold.
    pub fn used(&self) -> &Resources {
        &self.used
    }

    /// How many of its tasks are not terminal.
    pub fn live_tasks(&self) -> usize {
        self.live
    }

    /// What is left for new tasks: its total minus what its non-terminal tasks hold, never
    /// below zero.
    pub fn free(&self) -> Resources {
        self.total.saturating_sub(&self.used)
    }

    /// Whether a task needing `need` fits in what is free now (the model's one rule,
    /// [`Resources::fits_in`]).
    pub fn fits(&self, need: &Resources) -> bool {
        need.fits_in(&self.free())
    }

    /// Whether every one of `constraints` admits this agent's attributes.
    pub fn admits(&self, constraints: &[Constraint]) -> bool {
        Constraint::all_admit(constraints, &self.attributes)
    }
}

/// One task on an agent.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskView {
    /// Its unique id (`web.frontend[0]-1a2b3c4d`).
    pub id: String,
    /// The slot it fills (`web.frontend[0]`; system jobs: `web.frontend[agent-1]`).
    pub name: String,
    /// Its job.
    pub job: String,
    /// Its task group.
    pub group: String,
    /// What it holds while not terminal.
    pub resources: Resources,
    /// Where it is.
    pub state: TaskState,
    /// The job version it was placed at; 0 if unknown (launched by an operator, or before
    /// tasks carried it): such a task is never outdated.
    pub job_version: u64,
}

/// A task to start on an agent.
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
    /// What it needs.
    pub resources: Resources,
    /// The program it runs.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its environment.
    pub env: BTreeMap<String, String>,
    /// The user it runs as; empty for the agent's task user.
    pub user: String,
    /// The job version it was placed at; 0 if unknown. A task placed at a version older than
    /// its group's [`spec_version`](muster_model::TaskGroup::spec_version) is
    /// outdated and replaced.
    pub job_version: u64,
}

impl Placement {
    /// The task this placement starts, as a scheduler sees it before its agent reports it
    /// (staging).
    pub fn staged_task(&self) -> TaskView {
        TaskView {
            id: self.task_id.clone(),
            name: self.name.clone(),
            job: self.job.clone(),
            group: self.group.clone(),
            resources: self.resources.clone(),
            state: TaskState::Staging,
            job_version: self.job_version,
        }
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
    /// What did not fit: one demand per task group that had tasks left unplaced.
    pub unplaced: Vec<Demand>,
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
    /// Stops it committed.
    pub stopped: Vec<Stop>,
    /// The state index after applying; a scheduler that plans again refreshes its snapshot to
    /// at least this index.
    pub index: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: &str, cpus: f64, mem_mb: u64, state: TaskState) -> TaskView {
        TaskView {
            id: id.into(),
            name: id.into(),
            job: "j".into(),
            group: "g".into(),
            resources: Resources { cpus, mem_mb },
            state,
            job_version: 0,
        }
    }

    #[test]
    fn only_live_tasks_take_resources() {
        let agent = AgentView::new(
            AgentId("a".into()),
            BTreeMap::new(),
            Resources {
                cpus: 4.0,
                mem_mb: 4096,
            },
            vec![
                task("1", 1.0, 1024, TaskState::Running),
                task("2", 0.5, 512, TaskState::Staging),
                task("3", 2.0, 2048, TaskState::Finished),
                task("4", 2.0, 2048, TaskState::Failed),
                task("5", 2.0, 2048, TaskState::Killed),
                task("6", 2.0, 2048, TaskState::Lost),
            ],
        );
        assert_eq!(agent.live_tasks(), 2);
        assert_eq!(
            agent.free(),
            Resources {
                cpus: 2.5,
                mem_mb: 2560
            }
        );
        assert!(agent.fits(&Resources {
            cpus: 2.5,
            mem_mb: 2560
        }));
        assert!(!agent.fits(&Resources {
            cpus: 2.6,
            mem_mb: 1
        }));
    }

    #[test]
    fn an_overcommitted_agent_has_nothing_free() {
        let agent = AgentView::new(
            AgentId("a".into()),
            BTreeMap::new(),
            Resources {
                cpus: 1.0,
                mem_mb: 100,
            },
            vec![task("1", 2.0, 200, TaskState::Running)],
        );
        assert_eq!(agent.free(), Resources::default());
    }

    #[test]
    fn a_jobs_tasks_are_found_by_job_whatever_the_order_given() {
        let of = |job: &str, id: &str| TaskView {
            job: job.into(),
            ..task(id, 0.1, 1, TaskState::Running)
        };
        let mut agent = AgentView::new(
            AgentId("a".into()),
            BTreeMap::new(),
            Resources {
                cpus: 8.0,
                mem_mb: 100,
            },
            vec![
                of("web", "w1"),
                of("api", "a1"),
                of("web", "w2"),
                of("db", "d1"),
            ],
        );
        let ids = |tasks: &[TaskView]| tasks.iter().map(|t| t.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(agent.tasks_of("web")), ["w1", "w2"]);
        assert_eq!(ids(agent.tasks_of("api")), ["a1"]);
        assert!(agent.tasks_of("nope").is_empty());
        assert!(agent.tasks_of("").is_empty());
        agent.update_tasks(|tasks| tasks.push(of("api", "a2")));
        assert_eq!(ids(agent.tasks_of("api")), ["a1", "a2"]);
        assert_eq!(agent.live_tasks(), 5);
    }
}
