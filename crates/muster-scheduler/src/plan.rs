//! What a scheduler sees, what it proposes, and what the plan applier answers.
//!
//! A [`ClusterSnapshot`] is a consistent view of the cluster at one state index. A scheduler
//! turns it and an [`Evaluation`](muster_model::Evaluation) into a [`Plan`]: tasks to
//! place, tasks to stop, and [`Demand`]s it could not place. The leading master applies plans
//! one at a time and answers each with a [`PlanResult`]; placements that no longer fit (another
//! scheduler got there first) come back rejected.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use muster_model::{AgentId, Constraint, Demand, DrainPhase, EvalId, Job, Resources, TaskState};

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
        let index = self.job_index.as_ref()?;
        index
            .holds_for(&self.agents)
            .then(|| index.agents_with(job))
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

/// For each job, the agents (by position in a snapshot's agents, ordered by id) with a task
/// of it, running or recently ended: what lets a scheduler run cost what its job costs, not
/// what the cluster does.
///
/// A master keeps one from snapshot to snapshot ([`JobIndex::update`]): an agent whose view is
/// the same `Arc` as before costs a pointer comparison, a changed view the difference of its
/// jobs, and only a change of the agents themselves (one joined or left) renumbers the
/// positions. The index holds the views it was built from, so a snapshot whose agents were
/// changed after it was built is detected ([`ClusterSnapshot::agents_with`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobIndex {
    agents: Vec<Arc<AgentView>>,
    jobs: HashMap<Arc<str>, Arc<Vec<u32>>>,
    /// Whether `agents` are ordered by id, each once, as the index needs (if not, it is
    /// never used). Checked where the list changed only: views kept from the list before
    /// stay in its order.
    ordered: bool,
}

impl JobIndex {
    /// The index of `agents` (ordered by id, each once), built from `previous`, the index of
    /// an earlier list, when there is one. Returns `previous` itself if nothing changed.
    pub fn update(previous: Option<&Arc<JobIndex>>, agents: &[Arc<AgentView>]) -> Arc<JobIndex> {
        let empty = JobIndex {
            ordered: true,
            ..JobIndex::default()
        };
        // An index of a list out of order is not built on.
        let before = previous
            .filter(|index| index.ordered)
            .map_or(&empty, |index| &**index);
        if let Some(previous) = previous
            && previous.holds_for(agents)
        {
            return Arc::clone(previous);
        }
        // Walk the old and new lists together (both ordered by id): where each old agent is
        // now, and the views that are new or changed.
        let old = &before.agents;
        let mut moved_to = vec![u32::MAX; old.len()];
        let mut renumbered = old.len() != agents.len();
        let mut changed: Vec<(Option<&AgentView>, u32)> = Vec::new();
        let (mut i, mut j) = (0, 0);
        while i < old.len() || j < agents.len() {
            let order = match (old.get(i), agents.get(j)) {
                (Some(a), Some(b)) if Arc::ptr_eq(a, b) => None,
                (Some(a), Some(b)) => Some(a.id.cmp(&b.id)),
                (Some(_), None) => Some(std::cmp::Ordering::Less),
                (None, _) => Some(std::cmp::Ordering::Greater),
            };
            match order {
                None => {
                    moved_to[i] = j as u32;
                    renumbered |= i != j;
                    (i, j) = (i + 1, j + 1);
                }
                Some(std::cmp::Ordering::Equal) => {
                    moved_to[i] = j as u32;
                    renumbered |= i != j;
                    changed.push((Some(&old[i]), j as u32));
                    (i, j) = (i + 1, j + 1);
                }
                Some(std::cmp::Ordering::Less) => {
                    renumbered = true;
                    i += 1;
                }
                Some(std::cmp::Ordering::Greater) => {
                    renumbered = true;
                    changed.push((None, j as u32));
                    j += 1;
                }
            }
        }
        let in_order =
            |at: usize| at == 0 || at >= agents.len() || agents[at - 1].id < agents[at].id;
        let ordered = before.ordered
            && changed
                .iter()
                .all(|&(_, at)| in_order(at as usize) && in_order(at as usize + 1));
        let mut jobs = before.jobs.clone();
        if renumbered {
            // An agent joined or left: every position moves (monotonically, so each list
            // stays ordered).
            jobs = jobs
                .into_iter()
                .map(|(job, at)| {
                    let moved: Vec<u32> = at
                        .iter()
                        .map(|&p| moved_to[p as usize])
                        .filter(|&p| p != u32::MAX)
                        .collect();
                    (job, Arc::new(moved))
                })
                .collect();
        }
        for (was, at) in changed {
            let now = &agents[at as usize];
            let (gone, new) = job_changes(was, now);
            for job in gone {
                if let Some(list) = jobs.get_mut(job) {
                    let list = Arc::make_mut(list);
                    if let Ok(k) = list.binary_search(&at) {
                        list.remove(k);
                    }
                }
            }
            for job in new {
                match jobs.get_mut(job) {
                    Some(list) => {
                        let list = Arc::make_mut(list);
                        if let Err(k) = list.binary_search(&at) {
                            list.insert(k, at);
                        }
                    }
                    None => {
                        jobs.insert(Arc::from(job), Arc::new(vec![at]));
                    }
                }
            }
        }
        jobs.retain(|_, at| !at.is_empty());
        Arc::new(JobIndex {
            agents: agents.to_vec(),
            jobs,
            ordered,
        })
    }

    /// The positions of the agents with a task of `job`, in order.
    pub fn agents_with(&self, job: &str) -> &[u32] {
        self.jobs.get(job).map_or(&[], |at| at.as_slice())
    }

    /// Whether it was built for exactly these views, ordered by id.
    fn holds_for(&self, agents: &[Arc<AgentView>]) -> bool {
        self.ordered
            && self.agents.len() == agents.len()
            && self
                .agents
                .iter()
                .zip(agents)
                .all(|(a, b)| Arc::ptr_eq(a, b))
    }
}

/// One agent as a scheduler sees it. Its tasks are kept grouped by job, with what its live
/// tasks hold worked out once: a scheduler run finds a job's tasks on an agent by a binary
/// search over a small directory of job-name hashes, and never walks the agent's other tasks
/// ([`AgentView::tasks_of`]).
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
    /// Its tasks, running and recently ended, ordered by job. Each is shared (`Arc`) with
    /// whoever built the view: a master rebuilding the view of an agent whose tasks changed
    /// copies a pointer per task.
    tasks: Vec<Arc<TaskView>>,
    /// Where each job's tasks are in `tasks`, ordered by the hash of the job's name: a
    /// lookup compares integers in one small array, not names spread over the heap.
    jobs: Vec<JobTasks>,
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
        tasks: impl IntoIterator<Item = impl Into<Arc<TaskView>>>,
    ) -> Self {
        let mut view = AgentView {
            id,
            attributes,
            total,
            eligible: true,
            drain: DrainPhase::None,
            tasks: tasks.into_iter().map(Into::into).collect(),
            jobs: Vec::new(),
            used: Resources::default(),
            live: 0,
        };
        view.index();
        view
    }

    /// Its tasks, running and recently ended, ordered by job.
    pub fn tasks(&self) -> &[Arc<TaskView>] {
        &self.tasks
    }

    /// Its tasks, ordered by job, taken out of the view.
    pub fn into_tasks(self) -> Vec<Arc<TaskView>> {
        self.tasks
    }

    /// The jobs it has tasks of, each once, in order.
    pub fn jobs(&self) -> impl Iterator<Item = &str> {
        self.tasks
            .chunk_by(|a, b| a.job == b.job)
            .map(|tasks| &*tasks[0].job)
    }

    /// Its tasks of `job`, found by a binary search of the job's name hash.
    pub fn tasks_of(&self, job: &str) -> &[Arc<TaskView>] {
        self.tasks_of_hashed(job, job_hash(job))
    }

    /// [`AgentView::tasks_of`] with the name's [`job_hash`] worked out by the caller (a
    /// placement search asks every agent it looks at for the same job).
    pub(crate) fn tasks_of_hashed(&self, job: &str, hash: u64) -> &[Arc<TaskView>] {
        let first = self.jobs.partition_point(|entry| entry.hash < hash);
        self.jobs[first..]
            .iter()
            .take_while(|entry| entry.hash == hash)
            .map(|entry| &self.tasks[entry.start as usize..entry.end as usize])
            .find(|tasks| *tasks[0].job == *job)
            .unwrap_or(&[])
    }

    /// Changes its tasks with `change`; the order by job and the figures follow.
    pub fn update_tasks(&mut self, change: impl FnOnce(&mut Vec<Arc<TaskView>>)) {
        change(&mut self.tasks);
        self.index();
    }

    /// Orders the tasks by job (stable: otherwise as given) and works out what the live ones
    /// hold.
    fn index(&mut self) {
        // Interned names compare by pointer first: the tasks of one job share theirs.
        let same_job = |a: &TaskView, b: &TaskView| Arc::ptr_eq(&a.job, &b.job) || a.job == b.job;
        if !self
            .tasks
            .is_sorted_by(|a, b| same_job(a, b) || a.job <= b.job)
        {
            self.tasks.sort_by(|a, b| a.job.cmp(&b.job));
        }
        let mut start = 0;
        self.jobs = self
            .tasks
            .chunk_by(|a, b| same_job(a, b))
            .map(|tasks| {
                let entry = JobTasks {
                    hash: job_hash(&tasks[0].job),
                    start: start as u32,
                    end: (start + tasks.len()) as u32,
                };
                start += tasks.len();
                entry
            })
            .collect();
        self.jobs.sort_unstable_by_key(|entry| entry.hash);
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

/// The jobs `was` has tasks of and `now` has not (gone), and those `now` has and `was` has not
/// (new). A merge of the two job directories, which are ordered by name hash: a job both have
/// costs an integer comparison and one name check, so a changed agent running hundreds of jobs
/// (spread placement puts a task of every job on every agent) costs little more than its
/// directory.
fn job_changes<'a>(was: Option<&'a AgentView>, now: &'a AgentView) -> (Vec<&'a str>, Vec<&'a str>) {
    let name = |view: &'a AgentView, entry: &JobTasks| -> &'a str {
        &view.tasks[entry.start as usize].job
    };
    let (old, new): (&[JobTasks], &[JobTasks]) = (was.map_or(&[], |v| &v.jobs), &now.jobs);
    let (mut gone, mut added) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j), was) {
            (Some(a), Some(b), Some(was)) if a.hash == b.hash => {
                // The entries of this hash on each side: one each, and the same job, but for
                // a collision.
                let hash = a.hash;
                let i_end = i + old[i..].iter().take_while(|e| e.hash == hash).count();
                let j_end = j + new[j..].iter().take_while(|e| e.hash == hash).count();
                for a in &old[i..i_end] {
                    if !new[j..j_end].iter().any(|b| name(now, b) == name(was, a)) {
                        gone.push(name(was, a));
                    }
                }
                for b in &new[j..j_end] {
                    if !old[i..i_end].iter().any(|a| name(was, a) == name(now, b)) {
                        added.push(name(now, b));
                    }
                }
                (i, j) = (i_end, j_end);
            }
            (Some(a), b, Some(was)) if b.is_none_or(|b| a.hash < b.hash) => {
                gone.push(name(was, a));
                i += 1;
            }
            (_, Some(b), _) => {
                added.push(name(now, b));
                j += 1;
            }
            // Unreachable: an old entry exists only with `was`, and the arms above take every
            // case with one left.
            _ => break,
        }
    }
    (gone, added)
}

/// Where one job's tasks are in an [`AgentView`]'s tasks.
#[derive(Clone, Copy, Debug, PartialEq)]
struct JobTasks {
    hash: u64,
    start: u32,
    end: u32,
}

/// A job name's hash for [`AgentView::tasks_of`] (FNV-1a: short names, no seed needed, as
/// equal hashes are checked against the name).
pub(crate) fn job_hash(job: &str) -> u64 {
    job.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// One task on an agent. Its strings are shared (`Arc<str>`): a master keeps one copy of each
/// and every snapshot's views point at it, and a job's and group's names are kept once for all
/// their tasks.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskView {
    /// Its unique id (`web.frontend[0]-1a2b3c4d`).
    pub id: Arc<str>,
    /// The slot it fills (`web.frontend[0]`; system jobs: `web.frontend[agent-1]`).
    pub name: Arc<str>,
    /// Its job.
    pub job: Arc<str>,
    /// Its task group.
    pub group: Arc<str>,
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
            id: self.task_id.as_str().into(),
            name: self.name.as_str().into(),
            job: self.job.as_str().into(),
            group: self.group.as_str().into(),
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

    fn sorted(mut jobs: Vec<&str>) -> Vec<&str> {
        jobs.sort_unstable();
        jobs
    }

    #[test]
    fn job_changes_are_the_jobs_gone_and_new() {
        let was = running(1, &["a", "b", "c", "e"]);
        let now = running(1, &["b", "c", "d", "e", "f"]);
        let (gone, new) = job_changes(Some(&was), &now);
        assert_eq!(sorted(gone), ["a"]);
        assert_eq!(sorted(new), ["d", "f"]);
        let (gone, new) = job_changes(None, &now);
        assert!(gone.is_empty());
        assert_eq!(sorted(new), ["b", "c", "d", "e", "f"]);
        let (gone, new) = job_changes(Some(&now), &now);
        assert!(gone.is_empty() && new.is_empty());

        // Every name hashing alike (a collision for each pair) still gives the difference.
        let (mut was, mut now) = (Arc::unwrap_or_clone(was), Arc::unwrap_or_clone(now));
        for entry in was.jobs.iter_mut().chain(now.jobs.iter_mut()) {
            entry.hash = 7;
        }
        let (gone, new) = job_changes(Some(&was), &now);
        assert_eq!(sorted(gone), ["a"]);
        assert_eq!(sorted(new), ["d", "f"]);
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
        let ids =
            |tasks: &[Arc<TaskView>]| tasks.iter().map(|t| t.id.to_string()).collect::<Vec<_>>();
        assert_eq!(ids(agent.tasks_of("web")), ["w1", "w2"]);
        assert_eq!(ids(agent.tasks_of("api")), ["a1"]);
        assert!(agent.tasks_of("nope").is_empty());
        assert!(agent.tasks_of("").is_empty());
        agent.update_tasks(|tasks| tasks.push(Arc::new(of("api", "a2"))));
        assert_eq!(ids(agent.tasks_of("api")), ["a1", "a2"]);
        assert_eq!(agent.live_tasks(), 5);
    }

    /// Agent `n` running a task of each of `jobs`.
    fn running(n: u32, jobs: &[&str]) -> Arc<AgentView> {
        let tasks = jobs
            .iter()
            .map(|job| TaskView {
                job: (*job).into(),
                ..task(&format!("{job}-{n}"), 0.1, 1, TaskState::Running)
            })
            .collect::<Vec<_>>();
        Arc::new(AgentView::new(
            AgentId(format!("agent-{n:03}")),
            BTreeMap::new(),
            Resources {
                cpus: 8.0,
                mem_mb: 100,
            },
            tasks,
        ))
    }

    #[test]
    fn the_job_index_lists_the_agents_of_each_job_and_is_kept_when_nothing_changed() {
        let agents = vec![
            running(1, &["web", "db"]),
            running(2, &[]),
            running(3, &["web"]),
        ];
        let index = JobIndex::update(None, &agents);
        assert_eq!(index.agents_with("web"), [0, 2]);
        assert_eq!(index.agents_with("db"), [0]);
        assert!(index.agents_with("nope").is_empty());
        assert!(Arc::ptr_eq(
            &index,
            &JobIndex::update(Some(&index), &agents)
        ));

        let mut snapshot = ClusterSnapshot {
            agents: agents.clone(),
            job_index: Some(Arc::clone(&index)),
            ..ClusterSnapshot::default()
        };
        assert_eq!(snapshot.agents_with("web"), Some(&[0, 2][..]));
        // A view replaced after the index was built: the index no longer holds.
        snapshot.agents[1] = running(2, &["web"]);
        assert_eq!(snapshot.agents_with("web"), None);
    }

    #[test]
    fn an_updated_job_index_is_the_one_built_afresh() {
        let jobs = ["a", "b", "c", "d"];
        let mut rng = fastrand::Rng::with_seed(7);
        let mut agents: Vec<Arc<AgentView>> = Vec::new();
        let mut index = JobIndex::update(None, &agents);
        for round in 0..500 {
            for _ in 0..rng.usize(1..4) {
                let n = rng.u32(0..40);
                let at = agents.binary_search_by(|a| a.id.cmp(&running(n, &[]).id));
                let some_jobs: Vec<&str> = jobs.iter().copied().filter(|_| rng.bool()).collect();
                match (at, rng.u8(0..3)) {
                    (Ok(at), 0) => {
                        agents.remove(at);
                    }
                    (Ok(at), _) => agents[at] = running(n, &some_jobs),
                    (Err(at), _) => agents.insert(at, running(n, &some_jobs)),
                }
            }
            index = JobIndex::update(Some(&index), &agents);
            let fresh = JobIndex::update(None, &agents);
            for job in jobs {
                assert_eq!(
                    index.agents_with(job),
                    fresh.agents_with(job),
                    "round {round}, job {job}"
                );
                let expected: Vec<u32> = (0..agents.len() as u32)
                    .filter(|&at| !agents[at as usize].tasks_of(job).is_empty())
                    .collect();
                assert_eq!(index.agents_with(job), expected, "round {round}, job {job}");
            }
            assert!(index.holds_for(&agents), "round {round}: kept in order");
        }
    }

    #[test]
    fn a_job_index_of_agents_out_of_order_is_never_used() {
        let sorted = vec![running(1, &["web"]), running(2, &["web"]), running(3, &[])];
        let index = JobIndex::update(None, &sorted);
        let mut swapped = sorted.clone();
        swapped.swap(0, 2);
        for index in [
            JobIndex::update(None, &swapped),
            JobIndex::update(Some(&index), &swapped),
        ] {
            let snapshot = ClusterSnapshot {
                agents: swapped.clone(),
                job_index: Some(Arc::clone(&index)),
                ..ClusterSnapshot::default()
            };
            assert_eq!(snapshot.agents_with("web"), None);
            assert!(matches!(snapshot.agents_by_id(), Cow::Owned(_)));
            // Once in order again, an index built on it holds.
            let again = JobIndex::update(Some(&index), &sorted);
            assert_eq!(again.agents_with("web"), [0, 1]);
            assert!(again.holds_for(&sorted));
        }
    }

    #[test]
    fn tasks_of_finds_each_jobs_tasks_among_many_jobs() {
        let names: Vec<String> = (0..300).map(|n| format!("job-{n}")).collect();
        let jobs: Vec<&str> = names.iter().map(String::as_str).collect();
        let agent = running(1, &jobs);
        for job in &jobs {
            let found = agent.tasks_of(job);
            assert_eq!(found.len(), 1, "{job}");
            assert_eq!(&*found[0].job, *job);
        }
        assert!(agent.tasks_of("job-300").is_empty());
        assert!(agent.tasks_of("").is_empty());
    }
}
