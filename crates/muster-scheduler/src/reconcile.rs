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
//!   the running tasks, alone; a task of unknown version (0) is current.
//! - Non-terminal tasks of the job that fill no wanted slot stop: the count was lowered, the
//!   group removed, the agent no longer eligible, or a second task fills the same slot (the
//!   running one, then the lowest agent and task id, stays). A stopped job, or one missing from
//!   the snapshot, stops all its non-terminal tasks.
//! - Draining agents (Nomad's node drain), by [`DrainPhase`]: while it migrates, a service
//!   task there moves. Its slot is placed again elsewhere, at most the group's
//!   [`migration_step`](TaskGroup::migration_step) slots at a time, and the task runs until
//!   its replacement runs, then stops: the job never runs fewer than its count for a move. A
//!   batch task stays to run to its end; a system task stays while a task of another type
//!   runs on the agent, then stops. Past the deadline every task there stops, and its slot
//!   is placed elsewhere.
//! - No task is placed on an agent that is not [`eligible`](AgentView::eligible): a system
//!   slot on one is not missing.
//! - Terminal tasks are never stopped.
//! - A slot the snapshot lists as [`held`](ClusterSnapshot::held) (its task keeps failing and
//!   its replacement backs off) is not missing: it is placed by a later evaluation.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use muster_model::{AgentId, DrainPhase, Resources, TaskState};
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
            command: self.group.command.clone(),
            args: self.group.args.clone(),
            env: self.group.env.clone(),
            user: self.group.user.clone(),
            job_version: self.job_version,
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
    /// Every slot the job wants, in order: by group as the job lists them, then by index (or
    /// agent id for system groups).
    pub wanted: Vec<String>,
    /// The wanted slots no task fills, in the same order.
    pub missing: Vec<SlotRequest>,
    /// Tasks to stop, ordered by agent then task id.
    pub stop: Vec<Stop>,
}

/// Reconciles the evaluation's job in `snapshot`: see the [module docs](self) for the rules.
pub fn reconcile(eval: &Evaluation, snapshot: &ClusterSnapshot) -> Reconciled {
    let job_name = eval.job.as_str();
    let stored = snapshot.jobs.get(job_name);
    let slots = match stored {
        Some(job) if !job.stopped => wanted_slots(job_name, job, snapshot),
        _ => Vec::new(),
    };
    let by_name: HashMap<&str, usize> = slots
        .iter()
        .enumerate()
        .map(|(i, slot)| (slot.name.as_str(), i))
        .collect();
    let scheduler = stored.map(|job| job.scheduler);
    let batch = scheduler == Some(SchedulerType::Batch);

    // The live tasks filling each slot.
    let mut fillers: Vec<Vec<Filler<'_>>> = vec![Vec::new(); slots.len()];
    let mut finished = vec![false; slots.len()];
    let mut stop = Vec::new();
    for agent in &snapshot.agents {
        let departure = departure(agent, scheduler, snapshot);
        for task in agent.tasks_of(job_name) {
            let slot = by_name.get(task.name.as_str()).copied().filter(|&i| {
                let slot = &slots[i];
                slot.group.name == task.group && slot.agent.as_ref().is_none_or(|a| a == &agent.id)
            });
            if task.state.is_terminal() {
                if let (true, TaskState::Finished, Some(i)) = (batch, task.state, slot) {
                    finished[i] = true;
                }
                continue;
            }
            let Some(i) = slot else {
                stop.push(stop_of(&agent.id, task));
                continue;
            };
            if is_outdated(task, &slots[i].group) {
                // Never a holder: the slot stays missing and is placed anew.
                stop.push(stop_of(&agent.id, task));
                continue;
            }
            match departure {
                Departure::Stays => fillers[i].push(Filler {
                    agent: &agent.id,
                    task,
                    leaving: false,
                }),
                Departure::Moves => fillers[i].push(Filler {
                    agent: &agent.id,
                    task,
                    leaving: true,
                }),
                Departure::Stops => stop.push(stop_of(&agent.id, task)),
            }
        }
    }

    // One holder per slot; a task leaving a draining agent holds its slot only while no task
    // elsewhere does, and stops once one elsewhere runs.
    let mut holders: Vec<Option<&Filler<'_>>> = vec![None; slots.len()];
    // Per group, the moves under way: replacements placed and not running yet.
    let mut moving: HashMap<&str, u32> = HashMap::new();
    let mut to_move: Vec<usize> = Vec::new();
    for (i, fill) in fillers.iter().enumerate() {
        let staying = fill
            .iter()
            .filter(|f| !f.leaving)
            .min_by(|a, b| a.rank().cmp(&b.rank()));
        let Some(holder) = staying.or_else(|| fill.iter().min_by(|a, b| a.rank().cmp(&b.rank())))
        else {
            continue;
        };
        holders[i] = Some(holder);
        let replacement_runs = holder.task.state == TaskState::Running;
        for other in fill.iter().filter(|f| !std::ptr::eq(*f, holder)) {
            if other.leaving && !holder.leaving && !replacement_runs {
                // Moving: it runs until its replacement does.
                continue;
            }
            stop.push(stop_of(other.agent, other.task));
        }
        if holder.leaving {
            to_move.push(i);
        } else if !replacement_runs && fill.iter().any(|f| f.leaving) {
            *moving.entry(slots[i].group.name.as_str()).or_default() += 1;
        }
    }
    // Start as many moves as each group's migration step leaves room for, in slot order.
    let mut moves = vec![false; slots.len()];
    for i in to_move {
        let group = &slots[i].group;
        let under_way = moving.entry(group.name.as_str()).or_default();
        if *under_way < group.migration_step() {
            *under_way += 1;
            moves[i] = true;
        }
    }
    stop.sort();

    let ineligible: HashSet<&AgentId> = snapshot
        .agents
        .iter()
        .filter(|agent| !agent.eligible)
        .map(|agent| &agent.id)
        .collect();
    let wanted = slots.iter().map(|slot| slot.name.clone()).collect();
    let missing = slots
        .into_iter()
        .enumerate()
        .filter(|(i, slot)| {
            (holders[*i].is_none() || moves[*i])
                && !finished[*i]
                && !snapshot.held.contains(&slot.name)
                && slot
                    .agent
                    .as_ref()
                    .is_none_or(|id| !ineligible.contains(id))
        })
        .map(|(_, slot)| slot)
        .collect();
    Reconciled {
        job: job_name.to_owned(),
        job_version: stored.map_or(0, |job| job.version),
        scheduler,
        wanted,
        missing,
        stop,
    }
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
            &self.task.id,
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
                        .get(&task.job)
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

/// Every slot `job` wants. A group name repeated within the job counts once (the first).
fn wanted_slots(job_name: &str, job: &Job, snapshot: &ClusterSnapshot) -> Vec<SlotRequest> {
    let mut seen = HashSet::new();
    let mut slots = Vec::new();
    for group in &job.groups {
        if !seen.insert(group.name.as_str()) {
            continue;
        }
        let shared = Arc::new(group.clone());
        let slot = |name: String, agent: Option<AgentId>| SlotRequest {
            name,
            job: job_name.to_owned(),
            group: Arc::clone(&shared),
            job_version: job.version,
            agent,
        };
        match job.scheduler {
            SchedulerType::Service | SchedulerType::Batch => {
                slots.extend(
                    (0..group.count).map(|i| slot(format!("{job_name}.{}[{i}]", group.name), None)),
                );
            }
            SchedulerType::System => {
                let eligible: BTreeSet<&AgentId> = snapshot
                    .agents
                    .iter()
                    .filter(|agent| agent.admits(&group.constraints))
                    .map(|agent| &agent.id)
                    .collect();
                slots.extend(
                    eligible.into_iter().map(|id| {
                        slot(format!("{job_name}.{}[{id}]", group.name), Some(id.clone()))
                    }),
                );
            }
        }
    }
    slots
}

/// Whether `task` was placed before `group`'s task definition last changed. A task of unknown
/// version (0) is not.
fn is_outdated(task: &TaskView, group: &TaskGroup) -> bool {
    task.job_version != 0 && task.job_version < group.spec_version
}

fn stop_of(agent: &AgentId, task: &TaskView) -> Stop {
    Stop {
        agent: agent.clone(),
        task_id: task.id.clone(),
    }
}
