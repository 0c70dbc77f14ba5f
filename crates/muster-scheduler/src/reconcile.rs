//! Reconciliation: which task slots a job wants, which of them no task fills, and which of
//! the job's tasks must stop. Every scheduler starts from it.
//!
//! Rules:
//! - Service and batch groups want `count` slots, named `{job}.{group}[{i}]`.
//! - System groups want one slot per agent whose attributes their constraints admit, named
//!   `{job}.{group}[{agent id}]`, to be placed on that agent only.
//! - A slot is filled by a non-terminal task of that name (and group, and for system slots on
//!   that agent). A batch slot is also filled by a [`Finished`](TaskState::Finished) task: it
//!   ran to completion (an update of the job never runs it again). A service or system slot
//!   whose task ended is placed again.
//! - A non-terminal task placed at a job version older than its group's
//!   [`spec_version`](TaskGroup::spec_version) is outdated: the group's task definition changed
//!   since (Nomad's destructive update). It stops and its slot counts as missing, placed anew
//!   with the current definition. A change of `count` alone leaves the spec version, and so
//!   the running tasks, alone; a task of unknown version (0) is current. A batch slot is
//!   placed anew only once its outdated task has stopped: one that finishes before the stop
//!   reaches it ran to completion, and is not run again (the master leaves the slot
//!   [`held`](ClusterSnapshot::held) until the task's end is reported, then evaluates it).
//! - Non-terminal tasks of the job that fill no wanted slot stop: the count was lowered, the
//!   group removed, the agent no longer eligible, or a second task fills the same slot (the
//!   running one, then the lowest agent and task id, stays). A stopped job, or one missing from
//!   the snapshot, stops all its non-terminal tasks.
//! - Draining agents (Nomad's node drain), by [`DrainPhase`]: while it migrates, a service
//!   task there moves. Its slot is placed again elsewhere, at most the group's
//!   [`migration_step`](TaskGroup::migration_step) slots at a time, and the task runs until
//!   its replacement runs (and, in a group with health checks, passes them), then stops: the
//!   job never runs fewer than its count for a move. A
//!   batch task stays to run to its end; a system task stays while a task of another type
//!   runs on the agent, then stops. Past the deadline every task there stops, and its slot
//!   is placed elsewhere.
//! - No task is placed on an agent that is not [`eligible`](AgentView::eligible): a system
//!   slot on one is not missing.
//! - Terminal tasks are never stopped.
//! - A slot the snapshot lists as [`held`](ClusterSnapshot::held) (its task keeps failing and
//!   its replacement backs off) is not missing: it is placed by a later evaluation.
//! - A group with an update policy, whose job's version has a deployment in the snapshot
//!   ([`ClusterSnapshot::deployments`]), is rolled: only as many outdated tasks stop as the
//!   deployment allows now ([`Deployment::may_replace`]: `max_parallel` less the slots already
//!   being replaced, that is new tasks not yet counted healthy and empty slots); the others
//!   keep their slots for a later evaluation. While its canaries await promotion, a counted
//!   group also wants canary slots (`{job}.{group}[canary-N]`) beside its own, and replaces
//!   nothing; a system group's canaries are its first replacements.

use foldhash::{HashMap, HashSet};
use std::sync::Arc;

use muster_model::{AgentId, Deployment, DrainPhase, Resources, TaskHealth, TaskState};
use muster_model::{Constraint, Evaluation, Job, SchedulerType, TaskGroup};

use crate::plan::{AgentView, ClusterSnapshot, Placement, Stop, TaskView};

/// A task slot that no task fills: what a scheduler must place.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotRequest {
    /// The slot's name (`web.frontend[0]`); a task placed for it carries this name.
    pub name: String,
    /// The job.
    pub job: String,
    /// The task group, as the snapshot's job has it.
    pub group: Arc<TaskGroup>,
    /// The job's version in the snapshot: a task placed for the slot carries it.
    pub job_version: u64,
    /// For a system slot, the one agent it may be placed on.
    pub agent: Option<AgentId>,
}

impl SlotRequest {
    /// What a task of this slot needs.
    pub fn resources(&self) -> &Resources {
        &self.group.resources
    }

    /// The conditions on the agent it runs on.
    pub fn constraints(&self) -> &[Constraint] {
        &self.group.constraints
    }

    /// A fresh task id for this slot: `{name}-{8 random hex digits}`.
    pub fn new_task_id(&self) -> String {
        format!("{}-{:08x}", self.name, fastrand::u32(..))
    }

    /// A placement of this slot on `agent`, with a fresh task id.
    pub fn placement(&self, agent: AgentId) -> Placement {
        Placement {
            agent,
            task_id: self.new_task_id(),
            name: self.name.clone(),
            job: self.job.clone(),
            group: self.group.name.clone(),
            resources: self.group.resources.clone(),
            job_version: self.job_version,
            ports: Vec::new(),
        }
    }
}

/// The outcome of [`reconcile()`].
#[derive(Clone, Debug, PartialEq)]
pub struct Reconciled {
    /// The job.
    pub job: String,
    /// Its version in the snapshot (0 if it is missing).
    pub job_version: u64,
    /// Its scheduler type in the snapshot (`None` if it is missing).
    pub scheduler: Option<SchedulerType>,
    /// How many slots the job wants.
    pub wanted: usize,
    /// The wanted slots no task fills, in order: by group as the job lists them, then by index
    /// (or agent id for system groups).
    pub missing: Vec<SlotRequest>,
    /// Tasks to stop, ordered by agent then task id.
    pub stop: Vec<Stop>,
}

/// Reconciles the evaluation's job in `snapshot`: see the [module docs](self) for the rules.
///
/// Its cost follows the job: the agents with its tasks (from the snapshot's [`JobIndex`]
/// when it has one), its tasks there, and for a system job the agents themselves. Slot names
/// are only written out for missing slots.
///
/// [`JobIndex`]: crate::JobIndex
pub fn reconcile(eval: &Evaluation, snapshot: &ClusterSnapshot) -> Reconciled {
    let job_name = eval.job.as_str();
    let agents = snapshot.agents_by_id();
    let stored = snapshot.jobs.get(job_name);
    // The deployment of the stored version, if it rolls some of its groups.
    let deployment = stored.and_then(|job| {
        snapshot
            .deployments
            .get(job_name)
            .filter(|d| d.job_version == job.version)
    });
    let layout = match stored {
        Some(job) if !job.stopped => SlotLayout::of(job, &agents, deployment),
        _ => SlotLayout::default(),
    };
    let scheduler = stored.map(|job| job.scheduler);
    let batch = scheduler == Some(SchedulerType::Batch);
    // Outdated tasks of rolled groups: which of them stop now is the deployment's to say,
    // once every slot's filler is known.
    let mut outdated: Vec<(usize, Filler<'_>)> = Vec::new();

    // The live tasks filling each slot, as (slot, filler).
    let mut fillers: Vec<(usize, Filler<'_>)> = Vec::new();
    let mut finished = vec![false; layout.len];
    // Batch slots whose outdated task is told to stop here: placed once it has.
    let mut stopping = vec![false; layout.len];
    let mut stop = Vec::new();
    // The agents with tasks of the job: from the snapshot's index where it holds for its
    // agents (which are then in id order, as `agents` borrows them), otherwise every agent.
    let visit: Vec<usize> = match snapshot.agents_with(job_name) {
        Some(at) => at.iter().map(|&position| position as usize).collect(),
        None => (0..agents.len()).collect(),
    };
    for position in visit {
        let agent = &agents[position];
        let tasks = agent.tasks_of(job_name);
        if tasks.is_empty() {
            continue;
        }
        let departure = departure(agent, scheduler, snapshot);
        for task in tasks {
            let slot = layout.slot_of(job_name, task, position, &agent.id);
            if task.state.is_terminal() {
                if let (true, TaskState::Finished, Some((i, _))) = (batch, task.state, slot) {
                    finished[i] = true;
                }
                continue;
            }
            let Some((i, group)) = slot else {
                stop.push(stop_of(&agent.id, task));
                continue;
            };
            let rolled = deployment.is_some_and(|d| d.groups.contains_key(&group.name));
            if is_outdated(task, group) && !(rolled && departure != Departure::Stops) {
                // Never a holder: the slot stays missing and is placed anew (a batch slot
                // once the task has stopped).
                stop.push(stop_of(&agent.id, task));
                stopping[i] |= batch;
                continue;
            }
            let leaving = match departure {
                Departure::Stays => false,
                Departure::Moves => true,
                Departure::Stops => {
                    stop.push(stop_of(&agent.id, task));
                    continue;
                }
            };
            let filler = Filler {
                agent: &agent.id,
                task,
                leaving,
            };
            if is_outdated(task, group) {
                outdated.push((i, filler));
            } else {
                fillers.push((i, filler));
            }
        }
    }
    if let Some(deployment) = deployment {
        let placeable = |i: usize| {
            let slots = layout.group_of(i);
            let offset = i - slots.first;
            match &slots.per_agent {
                Some(on) => agents[on[offset]].eligible,
                None => !snapshot
                    .held
                    .contains(&format!("{job_name}.{}[{offset}]", slots.group.name)),
            }
        };
        roll(
            deployment,
            &layout,
            scheduler == Some(SchedulerType::System),
            placeable,
            outdated,
            &mut fillers,
            &mut stop,
        );
    }
    // Stable: a slot's fillers stay in agent order.
    fillers.sort_by_key(|(i, _)| *i);

    // One holder per slot; a task leaving a draining agent holds its slot only while no task
    // elsewhere does, and stops once one elsewhere runs.
    let mut held = vec![false; layout.len];
    // Per group, the moves under way: replacements placed and not running yet.
    let mut moving: HashMap<&str, u32> = HashMap::default();
    let mut to_move: Vec<usize> = Vec::new();
    for fill in fillers.chunk_by(|a, b| a.0 == b.0) {
        let i = fill[0].0;
        let fill = fill.iter().map(|(_, filler)| filler);
        let staying = fill
            .clone()
            .filter(|f| !f.leaving)
            .min_by(|a, b| a.rank().cmp(&b.rank()));
        let Some(holder) = staying.or_else(|| fill.clone().min_by(|a, b| a.rank().cmp(&b.rank())))
        else {
            continue;
        };
        held[i] = true;
        // A group with health checks waits for its replacement to pass them.
        let replacement_runs = replacement_ready(holder.task, &layout.group_of(i).group);
        for other in fill.clone().filter(|f| !std::ptr::eq(*f, holder)) {
            if other.leaving && !holder.leaving && !replacement_runs {
                // Moving: it runs until its replacement does.
                continue;
            }
            stop.push(stop_of(other.agent, other.task));
        }
        if holder.leaving {
            to_move.push(i);
        } else if !replacement_runs && fill.clone().any(|f| f.leaving) {
            *moving
                .entry(layout.group_of(i).group.name.as_str())
                .or_default() += 1;
        }
    }
    // Start as many moves as each group's migration step leaves room for, in slot order.
    for i in to_move {
        let group = &layout.group_of(i).group;
        let under_way = moving.entry(group.name.as_str()).or_default();
        if *under_way < group.migration_step() {
            *under_way += 1;
            held[i] = false;
        }
    }
    stop.sort();

    let job_version = stored.map_or(0, |job| job.version);
    let mut missing = Vec::with_capacity(layout.len);
    for i in (0..layout.len).filter(|&i| !held[i] && !finished[i] && !stopping[i]) {
        let slots = layout.group_of(i);
        let offset = i - slots.first;
        let (key, agent) = match &slots.per_agent {
            None if offset >= slots.group.count as usize => (
                format!("{CANARY_PREFIX}{}", offset - slots.group.count as usize),
                None,
            ),
            None => (offset.to_string(), None),
            Some(on) => {
                let agent = &agents[on[offset]];
                if !agent.eligible {
                    continue;
                }
                (agent.id.0.clone(), Some(agent.id.clone()))
            }
        };
        let name = format!("{job_name}.{}[{key}]", slots.group.name);
        if snapshot.held.contains(&name) {
            continue;
        }
        missing.push(SlotRequest {
            name,
            job: job_name.to_owned(),
            group: Arc::clone(&slots.group),
            job_version,
            agent,
        });
    }
    Reconciled {
        job: job_name.to_owned(),
        job_version,
        scheduler,
        wanted: layout.len,
        missing,
        stop,
    }
}

/// Whether `job` (a service or batch job) wants slot `slot` of its group `group`: it is not
/// stopped, has the group, and the slot's index is below the group's count. A system job's
/// slots follow the agents, so this says no for them.
pub fn wants_counted_slot(job: &Job, group: &str, slot: &str) -> bool {
    if job.stopped || job.scheduler == SchedulerType::System {
        return false;
    }
    let Some(group) = job.groups.iter().find(|g| g.name == group) else {
        return false;
    };
    counted_slot_index(&job.name, &group.name, slot).is_some_and(|i| i < group.count as usize)
}

/// The index of `slot` if it is a counted slot of `job`'s group `group`, named as reconciliation
/// names them (`{job}.{group}[{index}]`, the index in decimal without leading zeros).
pub fn counted_slot_index(job: &str, group: &str, slot: &str) -> Option<usize> {
    slot_key(job, group, slot).and_then(canonical_index)
}

/// What stands between the brackets of `slot` if it is a slot of `job`'s group `group`
/// (`{job}.{group}[{key}]`): an index, or a system slot's agent id.
fn slot_key<'a>(job: &str, group: &str, slot: &'a str) -> Option<&'a str> {
    slot.strip_prefix(job)?
        .strip_prefix('.')?
        .strip_prefix(group)?
        .strip_prefix('[')?
        .strip_suffix(']')
}

/// Every slot a job wants, numbered: each group's slots in turn, a service or batch group's
/// by index, a system group's by agent (in id order). A group name repeated within the job
/// counts once (the first).
#[derive(Debug, Default)]
struct SlotLayout {
    groups: Vec<GroupSlots>,
    /// How many slots in all.
    len: usize,
}

/// One group's slots in a [`SlotLayout`].
#[derive(Debug)]
struct GroupSlots {
    group: Arc<TaskGroup>,
    /// The number of its first slot.
    first: usize,
    /// A system group's agents, by their position in the snapshot's agents ordered by id (its
    /// slot `first + k` is on `per_agent[k]`), and the slot number of each agent (`None`
    /// where its constraints do not admit the agent). `None` for a counted group.
    per_agent: Option<Vec<usize>>,
    slot_at: Vec<Option<usize>>,
}

impl SlotLayout {
    fn of(job: &Job, agents: &[Arc<AgentView>], deployment: Option<&Deployment>) -> SlotLayout {
        let mut seen = HashSet::default();
        let mut layout = SlotLayout::default();
        for group in &job.groups {
            if !seen.insert(group.name.as_str()) {
                continue;
            }
            let first = layout.len;
            let (per_agent, slot_at) = match job.scheduler {
                SchedulerType::Service | SchedulerType::Batch => {
                    let canaries = deployment.map_or(0, |d| d.canary_slots(&group.name, false));
                    layout.len += group.count as usize + canaries;
                    (None, Vec::new())
                }
                SchedulerType::System => {
                    let on: Vec<usize> = (0..agents.len())
                        .filter(|&at| agents[at].admits(&group.constraints))
                        .collect();
                    let mut slot_at = vec![None; agents.len()];
                    for (k, &at) in on.iter().enumerate() {
                        slot_at[at] = Some(first + k);
                    }
                    layout.len += on.len();
                    (Some(on), slot_at)
                }
            };
            layout.groups.push(GroupSlots {
                group: Arc::new(group.clone()),
                first,
                per_agent,
                slot_at,
            });
        }
        layout
    }

    /// How many slots `slots`' group has (its canary slots included).
    fn len_of(&self, slots: &GroupSlots) -> usize {
        let next = self
            .groups
            .iter()
            .map(|g| g.first)
            .find(|first| *first > slots.first)
            .unwrap_or(self.len);
        next - slots.first
    }

    /// The group slot `i` belongs to.
    fn group_of(&self, i: usize) -> &GroupSlots {
        let at = self.groups.partition_point(|slots| slots.first <= i) - 1;
        &self.groups[at]
    }

    /// The slot `task`, on the agent at `position` with id `agent`, fills, with its group:
    /// the task's name must be the slot's (`{job}.{group}[{index or agent id}]`), and a
    /// system slot's task must be on the slot's agent.
    fn slot_of(
        &self,
        job: &str,
        task: &TaskView,
        position: usize,
        agent: &AgentId,
    ) -> Option<(usize, &TaskGroup)> {
        let slots = self
            .groups
            .iter()
            .find(|s| *s.group.name == *task.group())?;
        let key = slot_key(job, &slots.group.name, task.name())?;
        let slot = match &slots.per_agent {
            None => match key.strip_prefix(CANARY_PREFIX) {
                Some(canary) => {
                    let k = canonical_index(canary)?;
                    let count = slots.group.count as usize;
                    let canaries = self.len_of(slots) - count;
                    (k < canaries).then_some(slots.first + count + k)?
                }
                None => {
                    let index = canonical_index(key)?;
                    (index < slots.group.count as usize).then_some(slots.first + index)?
                }
            },
            Some(_) if key == agent.0 => slots.slot_at[position]?,
            Some(_) => return None,
        };
        Some((slot, &slots.group))
    }
}

/// What a canary slot's key begins with: `web.fe[canary-0]`.
pub const CANARY_PREFIX: &str = "canary-";

/// Rolls the outdated tasks of `deployment`'s groups: as many stop (their slots placed anew)
/// as the deployment allows now, in slot order; the others keep their slots, as fillers. A
/// group's slots being replaced already are its new tasks not yet counted healthy, and its
/// slots with no task at all.
fn roll<'a>(
    deployment: &Deployment,
    layout: &SlotLayout,
    system: bool,
    placeable: impl Fn(usize) -> bool,
    mut outdated: Vec<(usize, Filler<'a>)>,
    fillers: &mut Vec<(usize, Filler<'a>)>,
    stop: &mut Vec<Stop>,
) {
    outdated.sort_by_key(|(i, f)| (*i, f.rank()));
    for slots in &layout.groups {
        let Some(group) = deployment.groups.get(&slots.group.name) else {
            continue;
        };
        // Its own slots, canaries aside (a system group's are all its own).
        let own = match slots.per_agent {
            Some(_) => layout.len_of(slots),
            None => slots.group.count as usize,
        };
        let mine = slots.first..slots.first + own;
        let mut filled = vec![false; own];
        let mut in_flight = 0;
        let mut current = 0;
        for (i, filler) in fillers.iter().filter(|(i, _)| mine.contains(i)) {
            filled[i - slots.first] = true;
            current += 1;
            if !group.healthy.contains(filler.task.id()) {
                in_flight += 1;
            }
        }
        for (i, _) in outdated.iter().filter(|(i, _)| mine.contains(i)) {
            filled[i - slots.first] = true;
        }
        // An empty slot is being replaced if it is placed now (not one on an agent that takes
        // no task, nor one whose crash-looping task's replacement waits).
        in_flight += filled
            .iter()
            .enumerate()
            .filter(|(k, f)| !**f && placeable(slots.first + k))
            .count();
        let mut budget = deployment
            .may_replace(&slots.group.name, system, in_flight, current)
            .unwrap_or(usize::MAX);
        for (i, filler) in outdated.iter().filter(|(i, _)| mine.contains(i)) {
            // A slot whose new task is placed already is being replaced: its old task goes,
            // but for one leaving a draining agent, which runs on until its replacement runs
            // (and passes its checks), as every move does.
            let replaced = fillers.iter().any(|(j, f)| {
                j == i
                    && !is_outdated_in(f, slots)
                    && (!filler.leaving || replacement_ready(f.task, &slots.group))
            });
            let moving = filler.leaving
                && fillers
                    .iter()
                    .any(|(j, f)| j == i && !is_outdated_in(f, slots));
            if moving && !replaced {
                fillers.push((*i, *filler));
                continue;
            }
            if replaced || budget > 0 {
                budget -= usize::from(!replaced);
                stop.push(stop_of(filler.agent, filler.task));
            } else {
                fillers.push((*i, *filler));
            }
        }
    }
    // Outdated tasks of groups the deployment does not roll stop, as ever.
    for (i, filler) in outdated {
        if !deployment
            .groups
            .contains_key(&layout.group_of(i).group.name)
        {
            stop.push(stop_of(filler.agent, filler.task));
        }
    }
}

/// Whether `task`, the replacement of a task leaving a draining agent, runs (and, in a group
/// with health checks, passes them): then the task it replaces may stop.
fn replacement_ready(task: &TaskView, group: &TaskGroup) -> bool {
    task.state == TaskState::Running
        && (group.checks.is_empty() || task.health == TaskHealth::Healthy)
}

/// Whether `filler`'s task is outdated in its group `slots`.
fn is_outdated_in(filler: &Filler<'_>, slots: &GroupSlots) -> bool {
    is_outdated(filler.task, &slots.group)
}

/// `key` as a slot index, if it is one written as slot names write it (decimal, no sign, no
/// leading zero).
fn canonical_index(key: &str) -> Option<usize> {
    let digits = key.bytes().all(|b| b.is_ascii_digit());
    if !digits || key.is_empty() || (key.len() > 1 && key.starts_with('0')) {
        return None;
    }
    key.parse().ok()
}

/// A live task filling a slot, and whether it is leaving a draining agent.
#[derive(Clone, Copy, Debug)]
struct Filler<'a> {
    agent: &'a AgentId,
    task: &'a TaskView,
    leaving: bool,
}

impl<'a> Filler<'a> {
    /// Of two tasks filling one slot, the lower rank stays: a running task over a pending
    /// one, then the lowest agent id, then the lowest task id.
    fn rank(&self) -> (bool, &'a AgentId, &'a str) {
        (
            self.task.state != TaskState::Running,
            self.agent,
            self.task.id(),
        )
    }
}

/// What becomes of the job's tasks on an agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Departure {
    /// They stay.
    Stays,
    /// Each moves: it runs until a replacement elsewhere runs.
    Moves,
    /// They stop.
    Stops,
}

/// What becomes of the tasks of a job of type `scheduler` on `agent`, by its drain: on a
/// migrating agent service tasks move, batch tasks stay (to run to their end), and system
/// tasks stay while a task of another type still runs there; past the deadline, all stop.
fn departure(
    agent: &AgentView,
    scheduler: Option<SchedulerType>,
    snapshot: &ClusterSnapshot,
) -> Departure {
    match (agent.drain, scheduler) {
        (DrainPhase::None, _) => Departure::Stays,
        (DrainPhase::Stopping, _) | (DrainPhase::Migrating, None) => Departure::Stops,
        (DrainPhase::Migrating, Some(SchedulerType::Service)) => Departure::Moves,
        (DrainPhase::Migrating, Some(SchedulerType::Batch)) => Departure::Stays,
        (DrainPhase::Migrating, Some(SchedulerType::System)) => {
            let others_run = agent.tasks().iter().any(|task| {
                !task.state.is_terminal()
                    && snapshot
                        .jobs
                        .get(task.job())
                        .is_some_and(|job| job.scheduler != SchedulerType::System)
            });
            if others_run {
                Departure::Stays
            } else {
                Departure::Stops
            }
        }
    }
}

/// Whether `task` was placed before `group`'s task definition last changed. A task of unknown
/// version (0) is not.
fn is_outdated(task: &TaskView, group: &TaskGroup) -> bool {
    task.job_version != 0 && task.job_version < group.spec_version
}

fn stop_of(agent: &AgentId, task: &TaskView) -> Stop {
    Stop {
        agent: agent.clone(),
        task_id: task.id().to_string(),
    }
}
