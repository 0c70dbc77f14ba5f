//! One agent as a scheduler sees it ([`AgentView`]), and its tasks ([`TaskView`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use std::collections::BTreeSet;

use muster_model::{AgentId, Constraint, DrainPhase, PortRange, Resources, TaskHealth, TaskState};

/// One agent as a scheduler sees it. Its tasks are kept grouped by job, with what its live
/// tasks hold worked out once: a scheduler run finds a job's tasks on an agent by a binary
/// search over a small directory of job-name hashes, and never walks the agent's other tasks
/// ([`AgentView::tasks_of`]).
///
/// Two views are equal when what they say of the agent is: the stamps that tell their
/// histories apart are not compared.
#[derive(Debug)]
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
    /// Where its drain is: its tasks move or stop (see [`reconcile`](mod@crate::reconcile)).
    pub drain: DrainPhase,
    /// The ports it hands out to tasks that ask for a dynamic one.
    pub dynamic_ports: PortRange,
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
    /// Tells these tasks apart from every other view's: each view built, cloned or changed
    /// gets a new one.
    stamp: u64,
    /// What is known of how these tasks came from those of an earlier view, if only tasks were
    /// added since (see [`AgentView::jobs_added_since`]).
    growth: Option<Growth>,
}

/// How a view's tasks grew from those of the view stamped `from`: tasks were only added, and
/// these are the jobs it had no task of.
#[derive(Clone, Debug)]
struct Growth {
    from: u64,
    new_jobs: Vec<Arc<JobGroup>>,
}

/// The source of [`AgentView`] stamps.
static NEXT_STAMP: AtomicU64 = AtomicU64::new(1);

fn next_stamp() -> u64 {
    NEXT_STAMP.fetch_add(1, Ordering::Relaxed)
}

impl Clone for AgentView {
    /// The same view, stamped anew as grown from this one by nothing yet: what a master does
    /// with a view a snapshot shares ([`Arc::make_mut`]) before adding tasks to it.
    fn clone(&self) -> Self {
        AgentView {
            id: self.id.clone(),
            attributes: self.attributes.clone(),
            total: self.total.clone(),
            eligible: self.eligible,
            drain: self.drain,
            dynamic_ports: self.dynamic_ports,
            tasks: self.tasks.clone(),
            jobs: self.jobs.clone(),
            used: self.used.clone(),
            live: self.live,
            stamp: next_stamp(),
            growth: Some(Growth {
                from: self.stamp,
                new_jobs: Vec::new(),
            }),
        }
    }
}

impl PartialEq for AgentView {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
            && self.attributes == other.attributes
            && self.total == other.total
            && self.eligible == other.eligible
            && self.drain == other.drain
            && self.dynamic_ports == other.dynamic_ports
            && self.tasks == other.tasks
            && self.jobs == other.jobs
            && self.used == other.used
            && self.live == other.live
    }
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
            dynamic_ports: PortRange::default(),
            tasks: tasks.into_iter().map(Into::into).collect(),
            jobs: Vec::new(),
            used: Resources::default(),
            live: 0,
            stamp: 0,
            growth: None,
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
            .chunk_by(|a, b| a.job() == b.job())
            .map(|tasks| tasks[0].job())
    }

    /// Its tasks, one slice per job (by the job directory, in no particular order): a caller
    /// looking for some jobs' tasks skips each other job at the cost of a look at its first
    /// task.
    pub(crate) fn tasks_by_job(&self) -> impl Iterator<Item = &[Arc<TaskView>]> {
        self.jobs
            .iter()
            .map(|entry| &self.tasks[entry.start as usize..entry.end as usize])
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
            .find(|tasks| *tasks[0].job() == *job)
            .unwrap_or(&[])
    }

    /// Changes its tasks with `change`; the order by job and the figures follow.
    pub fn update_tasks(&mut self, change: impl FnOnce(&mut Vec<Arc<TaskView>>)) {
        change(&mut self.tasks);
        self.index();
    }

    /// Adds `task`, new to this agent (a placement just staged), at the end of its job's
    /// tasks. The same view as one built afresh with the task added, but for the order of a
    /// job's tasks among themselves, which schedulers do not read; what costs is a lookup in
    /// the job directory and moving the tasks after it, not the sort a rebuild takes. A master
    /// that places a task of every job on every agent (spread) updates views this way.
    pub fn add_task(&mut self, task: Arc<TaskView>) {
        let hash = job_hash(task.job());
        let first = self.jobs.partition_point(|entry| entry.hash < hash);
        let found = self.jobs[first..]
            .iter()
            .take_while(|entry| entry.hash == hash)
            .position(|entry| *self.tasks[entry.start as usize].job() == *task.job())
            .map(|k| first + k);
        let at = match found {
            Some(k) => self.jobs[k].end,
            // A job new here goes where its name orders it.
            None => self.tasks.partition_point(|t| *t.job() < *task.job()) as u32,
        };
        for (k, entry) in self.jobs.iter_mut().enumerate() {
            if Some(k) == found {
                entry.end += 1;
            } else if entry.start >= at {
                entry.start += 1;
                entry.end += 1;
            }
        }
        self.stamp = next_stamp();
        if found.is_none() {
            if let Some(growth) = &mut self.growth {
                growth.new_jobs.push(Arc::clone(task.job_group()));
            }
            let k = first + self.jobs[first..].partition_point(|entry| entry.hash == hash);
            grow_by_an_eighth(&mut self.jobs);
            let entry = JobTasks {
                hash,
                start: at,
                end: at + 1,
            };
            self.jobs.insert(k, entry);
        }
        if !task.state.is_terminal() {
            self.live += 1;
            self.used = self.used.saturating_add(&task.resources);
        }
        grow_by_an_eighth(&mut self.tasks);
        self.tasks.insert(at as usize, task);
    }

    /// The jobs this view has tasks of and `was` has not, if this view is `was` with tasks
    /// added ([`AgentView::add_task`]) and nothing else changed in its tasks; `None` if that
    /// is not known (then [`job_changes`] tells).
    pub(super) fn jobs_added_since(&self, was: &AgentView) -> Option<Vec<&str>> {
        let growth = self.growth.as_ref().filter(|g| g.from == was.stamp)?;
        Some(growth.new_jobs.iter().map(|group| &*group.job).collect())
    }

    /// Orders the tasks by job (stable: otherwise as given) and works out what the live ones
    /// hold, stamping the view anew: how its tasks came to be is no longer known.
    fn index(&mut self) {
        self.stamp = next_stamp();
        self.growth = None;
        // Tasks of one group share their job and group: a pointer comparison first.
        let same_job = |a: &TaskView, b: &TaskView| {
            Arc::ptr_eq(a.job_group(), b.job_group()) || a.job() == b.job()
        };
        if !self
            .tasks
            .is_sorted_by(|a, b| same_job(a, b) || a.job() <= b.job())
        {
            self.tasks.sort_by(|a, b| a.job().cmp(b.job()));
        }
        let mut start = 0;
        self.jobs = self
            .tasks
            .chunk_by(|a, b| same_job(a, b))
            .map(|tasks| {
                let entry = JobTasks {
                    hash: job_hash(tasks[0].job()),
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

    /// The ports its live tasks hold.
    pub fn ports_in_use(&self) -> BTreeSet<u16> {
        self.tasks
            .iter()
            .filter(|task| !task.state.is_terminal())
            .flat_map(|task| task.ports().iter().copied())
            .collect()
    }
}

/// The jobs `was` has tasks of and `now` has not (gone), and those `now` has and `was` has not
/// (new). A merge of the two job directories, which are ordered by name hash: a job both have
/// costs an integer comparison and one name check, so a changed agent running hundreds of jobs
/// (spread placement puts a task of every job on every agent) costs little more than its
/// directory.
pub(super) fn job_changes<'a>(
    was: Option<&'a AgentView>,
    now: &'a AgentView,
) -> (Vec<&'a str>, Vec<&'a str>) {
    let name = |view: &'a AgentView, entry: &JobTasks| -> &'a str {
        view.tasks[entry.start as usize].job()
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

/// Makes room in a full `list` for an eighth more: a view updated in place was cloned from
/// the one a snapshot holds (a clone has no room to spare), and doubling would leave a
/// master's every changed view half empty.
fn grow_by_an_eighth<T>(list: &mut Vec<T>) {
    if list.len() == list.capacity() {
        list.reserve_exact(list.len() / 8 + 1);
    }
}

/// A job name's hash for [`AgentView::tasks_of`] (FNV-1a: short names, no seed needed, as
/// equal hashes are checked against the name).
pub(crate) fn job_hash(job: &str) -> u64 {
    job.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The job and task group a task belongs to: one per group, shared (`Arc`) by its tasks.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobGroup {
    /// The job.
    pub job: Box<str>,
    /// The task group.
    pub group: Box<str>,
}

impl JobGroup {
    /// `job`'s group `group`, to share between the group's tasks.
    pub fn new(job: &str, group: &str) -> Arc<JobGroup> {
        Arc::new(JobGroup {
            job: job.into(),
            group: group.into(),
        })
    }
}

/// One task on an agent, as small as a master holding millions of them needs it: its id and
/// slot name are one string when the id starts with the name, as every id a scheduler makes
/// does (`{name}-{8 hex digits}`), and its job and group are a pointer to what every task of
/// its group shares.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskView {
    /// The id, followed by the slot name when the id does not start with it.
    text: Box<str>,
    /// The id's length in `text`.
    id_len: u32,
    /// The name's length: at the start of `text`, or after the id.
    name_len: u32,
    job_group: Arc<JobGroup>,
    /// What it holds while not terminal.
    pub resources: Resources,
    /// Where it is.
    pub state: TaskState,
    /// What its health checks say (kept beside its state, in what would be padding).
    pub health: TaskHealth,
    /// How many times its agent restarted it in place.
    pub restarts: u32,
    /// The job version it was placed at; 0 if unknown (launched by an operator, or before
    /// tasks carried it): such a task is never outdated.
    pub job_version: u64,
    /// The ports it holds on its agent, in its group's order; `None` for none (most tasks:
    /// a pointer's width, not a slice's, in every task a master holds).
    ports: Option<Box<TaskPorts>>,
}

/// The ports one task holds.
#[derive(Clone, Debug, PartialEq, Eq)]
struct TaskPorts(Box<[u16]>);

impl TaskView {
    /// The task `id` filling slot `name` of `job_group`.
    ///
    /// # Panics
    /// If the id and name together are longer than 4 GiB.
    pub fn new(
        id: &str,
        name: &str,
        job_group: Arc<JobGroup>,
        resources: Resources,
        state: TaskState,
        job_version: u64,
    ) -> TaskView {
        let text: Box<str> = if id.starts_with(name) {
            id.into()
        } else {
            [id, name].concat().into()
        };
        // Every message that carries a task is far below this (gRPC's limits are megabytes).
        assert!(
            u32::try_from(text.len()).is_ok(),
            "a task id and name under 4 GiB"
        );
        TaskView {
            id_len: id.len() as u32,
            name_len: name.len() as u32,
            text,
            job_group,
            resources,
            state,
            health: TaskHealth::None,
            restarts: 0,
            job_version,
            ports: None,
        }
    }

    /// The same task, holding `ports` (in its group's order).
    #[must_use]
    pub fn with_ports(mut self, ports: impl Into<Box<[u16]>>) -> TaskView {
        let ports: Box<[u16]> = ports.into();
        self.ports = (!ports.is_empty()).then(|| Box::new(TaskPorts(ports)));
        self
    }

    /// The ports it holds on its agent, in its group's order.
    pub fn ports(&self) -> &[u16] {
        self.ports.as_deref().map_or(&[], |ports| &ports.0)
    }

    /// Its unique id (`web.frontend[0]-1a2b3c4d`).
    pub fn id(&self) -> &str {
        &self.text[..self.id_len as usize]
    }

    /// The slot it fills (`web.frontend[0]`; system jobs: `web.frontend[agent-1]`).
    pub fn name(&self) -> &str {
        let start = if self.text.len() > self.id_len as usize {
            self.id_len as usize
        } else {
            0
        };
        &self.text[start..start + self.name_len as usize]
    }

    /// Its job.
    pub fn job(&self) -> &str {
        &self.job_group.job
    }

    /// Its task group.
    pub fn group(&self) -> &str {
        &self.job_group.group
    }

    /// Its job and group, shared with the other tasks of the group.
    pub fn job_group(&self) -> &Arc<JobGroup> {
        &self.job_group
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    #[test]
    fn a_view_of_a_task_stays_small() {
        // Health and restarts sit beside the state, in what was padding.
        assert_eq!(
            std::mem::size_of::<TaskView>(),
            72,
            "a view as small as before"
        );
    }

    fn task(id: &str, cpus: f64, mem_mb: u64, state: TaskState) -> TaskView {
        task_of("j", id, cpus, mem_mb, state)
    }

    /// Task `id` of `job`, named as its id.
    fn task_of(job: &str, id: &str, cpus: f64, mem_mb: u64, state: TaskState) -> TaskView {
        TaskView::new(
            id,
            id,
            JobGroup::new(job, "g"),
            Resources { cpus, mem_mb },
            state,
            0,
        )
    }

    fn sorted(mut jobs: Vec<&str>) -> Vec<&str> {
        jobs.sort_unstable();
        jobs
    }

    /// Agent `n` running a task of each of `jobs`.
    pub(crate) fn running(n: u32, jobs: &[&str]) -> Arc<AgentView> {
        let tasks = jobs
            .iter()
            .map(|job| task_of(job, &format!("{job}-{n}"), 0.1, 1, TaskState::Running))
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
        let of = |job: &str, id: &str| task_of(job, id, 0.1, 1, TaskState::Running);
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
            |tasks: &[Arc<TaskView>]| tasks.iter().map(|t| t.id().to_string()).collect::<Vec<_>>();
        assert_eq!(ids(agent.tasks_of("web")), ["w1", "w2"]);
        assert_eq!(ids(agent.tasks_of("api")), ["a1"]);
        assert!(agent.tasks_of("nope").is_empty());
        assert!(agent.tasks_of("").is_empty());
        agent.update_tasks(|tasks| tasks.push(Arc::new(of("api", "a2"))));
        assert_eq!(ids(agent.tasks_of("api")), ["a1", "a2"]);
        assert_eq!(agent.live_tasks(), 5);
    }

    #[test]
    fn a_task_added_to_a_view_is_where_a_rebuild_puts_it() {
        let mut rng = fastrand::Rng::with_seed(11);
        let jobs = ["a", "b", "c", "d", "e", "f"];
        let mut added = running(1, &[]);
        let mut all: Vec<TaskView> = Vec::new();
        for n in 0..300 {
            let state = if rng.u8(0..4) == 0 {
                TaskState::Finished
            } else {
                TaskState::Staging
            };
            let task = task_of(
                jobs[rng.usize(..jobs.len())],
                &format!("t{n}"),
                0.25,
                3,
                state,
            );
            all.push(task.clone());
            Arc::make_mut(&mut added).add_task(Arc::new(task));
            let rebuilt = AgentView::new(
                added.id.clone(),
                BTreeMap::new(),
                added.total.clone(),
                all.clone(),
            );
            assert_eq!(added.live_tasks(), rebuilt.live_tasks(), "after {n}");
            assert!(
                (added.used().cpus - rebuilt.used().cpus).abs() < 1e-9
                    && added.used().mem_mb == rebuilt.used().mem_mb,
                "after {n}"
            );
            assert_eq!(added.jobs, rebuilt.jobs, "after {n}");
            assert!(added.jobs().eq(rebuilt.jobs()), "after {n}");
            for job in jobs {
                let ids = |view: &AgentView| {
                    let mut ids: Vec<String> = view
                        .tasks_of(job)
                        .iter()
                        .map(|t| t.id().to_string())
                        .collect();
                    ids.sort_unstable();
                    ids
                };
                assert_eq!(ids(&added), ids(&rebuilt), "after {n}, job {job}");
            }
        }
    }

    #[test]
    fn a_task_keeps_its_id_and_name_whether_or_not_the_id_starts_with_the_name() {
        let group = JobGroup::new("web", "fe");
        let resources = Resources::default();
        for (id, name) in [
            ("web.fe[0]-1a2b3c4d", "web.fe[0]"),
            ("t7", "web.fe[0]"),
            ("web.fe[0]", "web.fe[0]"),
            ("web", "web.fe[0]"),
            ("", "web.fe[0]"),
            ("t7", ""),
            ("", ""),
        ] {
            let task = TaskView::new(
                id,
                name,
                group.clone(),
                resources.clone(),
                TaskState::Running,
                1,
            );
            assert_eq!((task.id(), task.name()), (id, name));
            assert_eq!((task.job(), task.group()), ("web", "fe"));
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
            assert_eq!(found[0].job(), *job);
        }
        assert!(agent.tasks_of("job-300").is_empty());
        assert!(agent.tasks_of("").is_empty());
    }
}
