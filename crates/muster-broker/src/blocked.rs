//! The blocked-queue: evaluations that found no capacity (or were held back by their
//! namespace's quota), released when capacity changes (or their namespace does): Nomad's
//! blocked evals.
//!
//! [`BlockedEvals`] is one process that owns all of the queue's state. Callers
//! [`tell`](muster_actor::Pid::tell) it what happened and return at once: a scheduler that could
//! not place everything sends [`BlockedMsg::Block`], the master sends
//! [`BlockedMsg::CapacityChanged`] when an agent joins or tasks finish,
//! [`BlockedMsg::QuotaFreed`] when a namespace with a quota may take more (a task of it ended,
//! its quota changed), and [`BlockedMsg::Untrack`] when a job stops. Nothing is shared with
//! callers, so nothing contends on a lock. Nomad moved its blocked-evals queue onto one
//! goroutine for the same reason (hashicorp/nomad pull request "blocked evals queue on a single
//! goroutine", December 2025).
//!
//! # Semantics
//! - A capacity change releases exactly the blocked evaluations with at least one [`Demand`]
//!   that fits the agent's free resources by the model's one rule
//!   ([`Resources::fits_in`]: cpus and memory both) and whose constraints all admit the
//!   agent's attributes.
//! - A demand of a group placed all at once ([`Demand::gang`]) is released only when the
//!   agents whose room changed since it was planned, with the tasks that fitted then, can take
//!   the whole group (`gangs.rs`), not at the first agent with room for one task.
//! - A demand held back by its namespace's quota ([`Demand::over_quota`]) waits for the
//!   namespace, not for capacity: a [`QuotaChange`] of the namespace releases it (a task of
//!   the namespace ended, or its quota changed). A change of the quota itself releases every
//!   blocked evaluation of the namespace's jobs, whatever held it back: a scheduler that
//!   ignores quotas blocks on what the plan applier refused, not knowing why.
//! - A change the scheduler did not see (its index is after the evaluation's
//!   `snapshot_index`) and that would have released the evaluation releases it as soon as it
//!   is blocked ("missed unblock"); so does a namespace's change the scheduler did not see.
//!   The queue remembers the last [`max_history`](BlockedConfig::max_history) changes; an
//!   evaluation planned before the oldest one it remembers is released at once,
//!   conservatively.
//! - At most one evaluation per job is blocked: the newer (by `create_index`, then
//!   `modify_index`; on a tie the one blocked last) stays and the other is canceled.
//! - Released and canceled evaluations go to the [`BlockedSink`], in one call per kind per
//!   message handled. Released ones leave with status [`EvalStatus::Pending`], canceled ones
//!   with [`EvalStatus::Canceled`].
//!
//! # Index
//! Demands are grouped by their constraint set (a cluster has few distinct sets). Within a
//! group, demands sit in buckets keyed by memory, then by cpus, in ordered maps. A change
//! checks each group's constraints once, then walks only the memory keys at or below the free
//! memory and, within each, only the cpu keys at or below the free cpus: every bucket it
//! reaches holds evaluations that fit, so the cost follows the number of distinct demand shapes
//! and of evaluations released, not the number blocked. Gangs are the exception: each change
//! is noted in every blocked gang (few, and each note a constraint check and a division).

mod gangs;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use gangs::GangWait;

use muster_actor::{Context, Process, Reply};
use muster_model::{
    AgentId, Constraint, Demand, EvalId, EvalStatus, Evaluation, Resources, namespace_of,
};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// An evaluation the scheduler could not fully place, with what it could not place.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockedEval {
    /// The evaluation; its `snapshot_index` is the registry index of the cluster snapshot the
    /// scheduler planned against.
    pub eval: Evaluation,
    /// One per task group with unplaced tasks (and cause: room or quota). An evaluation with
    /// none is released by the next capacity change of any kind.
    pub demands: Vec<Demand>,
}

/// A namespace's quota may allow more than it did: a task of the namespace ended, or its quota
/// changed.
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaChange {
    /// The namespace.
    pub namespace: String,
    /// Whether its quota itself changed: then every blocked evaluation of its jobs is
    /// released. Otherwise (a task of it ended) only those its quota held back are.
    pub quota_changed: bool,
    /// The registry index as of which this is true. Evaluations planned against an earlier
    /// snapshot did not see the change.
    pub index: u64,
}

/// Capacity is now free on an agent (it joined, or tasks finished).
#[derive(Clone, Debug, PartialEq)]
pub struct CapacityChange {
    /// The agent.
    pub agent: AgentId,
    /// Its attributes, which demands' constraints are checked against.
    pub attributes: BTreeMap<String, String>,
    /// What is free on it now.
    pub free: Resources,
    /// The registry index as of which this is true. Evaluations planned against an earlier
    /// snapshot did not see the change.
    pub index: u64,
}

/// Where released and canceled evaluations go. Called from the queue's process, so an
/// implementation should hand the evaluations on (to a channel, another process) and return.
pub trait BlockedSink: Send + 'static {
    /// Evaluations released by a capacity change, status [`EvalStatus::Pending`]: they should
    /// go back to the broker. At most one call per message handled; never empty.
    fn unblocked(&mut self, evals: Vec<Evaluation>);

    /// Evaluations dropped (a newer one of the job is blocked, or the job stopped), status
    /// [`EvalStatus::Canceled`]: they should be marked so in the registry. At most one call per
    /// message handled; never empty.
    fn canceled(&mut self, evals: Vec<Evaluation>);
}

/// A [`BlockedSink`] that forwards each batch into a tokio unbounded channel.
///
/// Batches sent after a receiver was dropped are discarded.
#[derive(Debug)]
pub struct ChannelSink {
    unblocked: UnboundedSender<Vec<Evaluation>>,
    canceled: UnboundedSender<Vec<Evaluation>>,
}

/// The receiving ends of a [`ChannelSink`]: one batch per message the queue handled.
#[derive(Debug)]
pub struct SinkReceivers {
    /// Batches of released evaluations.
    pub unblocked: UnboundedReceiver<Vec<Evaluation>>,
    /// Batches of canceled evaluations.
    pub canceled: UnboundedReceiver<Vec<Evaluation>>,
}

impl ChannelSink {
    /// A sink and the receivers of what it is given.
    pub fn new() -> (ChannelSink, SinkReceivers) {
        let (unblocked_tx, unblocked_rx) = unbounded_channel();
        let (canceled_tx, canceled_rx) = unbounded_channel();
        (
            ChannelSink {
                unblocked: unblocked_tx,
                canceled: canceled_tx,
            },
            SinkReceivers {
                unblocked: unblocked_rx,
                canceled: canceled_rx,
            },
        )
    }
}

impl BlockedSink for ChannelSink {
    fn unblocked(&mut self, evals: Vec<Evaluation>) {
        let _ = self.unblocked.send(evals);
    }

    fn canceled(&mut self, evals: Vec<Evaluation>) {
        let _ = self.canceled.send(evals);
    }
}

/// The queue's settings.
#[derive(Clone, Debug)]
pub struct BlockedConfig {
    /// How many recent capacity changes to remember for the missed-unblock check (at least 1).
    pub max_history: usize,
    /// Capacity changes at or before this index are unknown to the queue (it started later):
    /// an evaluation planned against a snapshot before it is released as soon as it is blocked.
    pub history_floor: u64,
}

impl Default for BlockedConfig {
    fn default() -> Self {
        BlockedConfig {
            max_history: 4096,
            history_floor: 0,
        }
    }
}

/// The queue's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockedStats {
    /// Evaluations blocked now.
    pub total_blocked: usize,
    /// Evaluations blocked now, per scheduler name (names with none are absent).
    pub by_scheduler: BTreeMap<String, usize>,
    /// Evaluations released so far (including missed unblocks released on arrival).
    pub total_unblocked: u64,
    /// Evaluations canceled so far.
    pub total_canceled: u64,
    /// False after [`BlockedMsg::Disable`], until [`BlockedMsg::Restore`].
    pub enabled: bool,
}

/// What the blocked-queue handles.
#[derive(Debug)]
pub enum BlockedMsg {
    /// The scheduler could not place everything; block the evaluation until capacity changes.
    /// Ignored while disabled.
    Block(BlockedEval),
    /// Capacity is free on an agent: release the evaluations it might now fit. Remembered for
    /// the missed-unblock check even while disabled.
    CapacityChanged(CapacityChange),
    /// A namespace's quota may allow more: release the evaluations it held back (all of the
    /// namespace's if the quota itself changed). Remembered for the missed-unblock check even
    /// while disabled.
    QuotaFreed(QuotaChange),
    /// The job (by name) stopped: its blocked evaluation, if any, is canceled.
    Untrack(String),
    /// Counters.
    Stats(Reply<BlockedStats>),
    /// The evaluations blocked now, oldest (by `create_index`) first.
    List(Reply<Vec<Evaluation>>),
    /// Drop every blocked evaluation without telling the sink, and ignore blocks until
    /// [`Restore`](BlockedMsg::Restore) (leadership lost). Counters and the capacity history
    /// stay.
    Disable,
    /// Enable the queue and block these evaluations (a new leader rebuilding), with the same
    /// rules as [`Block`](BlockedMsg::Block).
    Restore(Vec<BlockedEval>),
}

/// An evaluation's handle inside the indexes (cheaper than its string id).
type Key = u64;

/// A group's handle: one per distinct constraint set.
type GroupId = u64;

/// Non-negative cpus, ordered by their bits (which for non-negative floats is their value's
/// order).
type CpuKey = u64;

/// Where one demand of an evaluation sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Slot {
    group: GroupId,
    mem_mb: u64,
    cpus: CpuKey,
}

#[derive(Debug)]
struct Entry {
    eval: Evaluation,
    slots: Vec<Slot>,
    /// Its job's namespace, if that namespace's quota held some of its tasks back.
    held_by_quota: Option<String>,
}

/// Demands that share one constraint set, by memory then cpus.
#[derive(Debug)]
struct Group {
    constraints: Vec<Constraint>,
    by_mem: BTreeMap<u64, BTreeMap<CpuKey, HashSet<Key>>>,
    /// Demands (slots) in this group.
    len: usize,
}

/// A demand's resources and constraints, made comparable.
#[derive(Debug)]
struct Shape {
    constraints: Vec<Constraint>,
    mem_mb: u64,
    cpus: CpuKey,
}

/// A remembered change.
#[derive(Debug)]
enum PastChange {
    /// Capacity freed on an agent.
    Capacity {
        agent: AgentId,
        free: Resources,
        attributes: BTreeMap<String, String>,
        mem_mb: u64,
        cpus: CpuKey,
    },
    /// A namespace's quota may allow more ([`QuotaChange`]).
    Quota {
        namespace: String,
        quota_changed: bool,
    },
}

/// Maps cpus to an ordered key. NaN and negative amounts count as zero, so a malformed demand
/// is released by the next admitted change rather than never. A change's free cpus are keyed by
/// their [`Resources::cpu_headroom`], so "key at or below" is exactly [`Resources::fits_in`].
fn cpu_key(cpus: f64) -> CpuKey {
    if cpus.is_nan() || cpus <= 0.0 {
        0.0f64.to_bits()
    } else {
        cpus.to_bits()
    }
}

fn shape(demand: &Demand) -> Shape {
    let mut constraints = demand.constraints.clone();
    constraints.sort();
    constraints.dedup();
    Shape {
        constraints,
        mem_mb: demand.resources.mem_mb,
        cpus: cpu_key(demand.resources.cpus),
    }
}

/// What an evaluation released by capacity is told.
const CAPACITY_CAME: &str = "capacity became available";

/// What an evaluation released by a change of `namespace` is told.
fn quota_freed(namespace: &str, quota_changed: bool) -> String {
    if quota_changed {
        format!("namespace {namespace:?}'s quota changed")
    } else {
        format!("a task of namespace {namespace:?} ended: its quota may allow more")
    }
}

/// Whether `candidate` is newer than `current` (ties go to the candidate: it arrived last).
fn newer_or_same(candidate: &Evaluation, current: &Evaluation) -> bool {
    (candidate.create_index, candidate.modify_index) >= (current.create_index, current.modify_index)
}

/// What one message released and canceled, handed to the sink when the message is done.
#[derive(Default)]
struct Outcome {
    unblocked: Vec<Evaluation>,
    canceled: Vec<Evaluation>,
}

/// The blocked-queue process. See the [module documentation](crate::blocked).
pub struct BlockedEvals {
    config: BlockedConfig,
    sink: Box<dyn BlockedSink>,
    enabled: bool,
    entries: HashMap<Key, Entry>,
    by_id: HashMap<EvalId, Key>,
    by_job: HashMap<String, Key>,
    /// The evaluations each namespace's quota held back.
    by_quota: HashMap<String, HashSet<Key>>,
    /// The evaluations waiting for room for a whole group, with their waits.
    gangs: HashMap<Key, Vec<GangWait>>,
    next_key: Key,
    group_ids: HashMap<Vec<Constraint>, GroupId>,
    groups: HashMap<GroupId, Group>,
    next_group: GroupId,
    /// Recent capacity changes by (index, arrival).
    history: BTreeMap<(u64, u64), PastChange>,
    next_arrival: u64,
    /// Changes at or before this index may have been forgotten.
    history_floor: u64,
    stats: BlockedStats,
}

impl fmt::Debug for BlockedEvals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockedEvals")
            .field("enabled", &self.enabled)
            .field("blocked", &self.entries.len())
            .field("groups", &self.groups.len())
            .field("history", &self.history.len())
            .field("history_floor", &self.history_floor)
            .finish_non_exhaustive()
    }
}

impl BlockedEvals {
    /// An enabled, empty queue with the default settings, handing what it releases and
    /// cancels to `sink`.
    pub fn new(sink: impl BlockedSink) -> Self {
        Self::with_config(BlockedConfig::default(), sink)
    }

    /// An enabled, empty queue with `config`.
    pub fn with_config(config: BlockedConfig, sink: impl BlockedSink) -> Self {
        let history_floor = config.history_floor;
        BlockedEvals {
            config,
            sink: Box::new(sink),
            enabled: true,
            entries: HashMap::new(),
            by_id: HashMap::new(),
            by_job: HashMap::new(),
            by_quota: HashMap::new(),
            gangs: HashMap::new(),
            next_key: 0,
            group_ids: HashMap::new(),
            groups: HashMap::new(),
            next_group: 0,
            history: BTreeMap::new(),
            next_arrival: 0,
            history_floor,
            stats: BlockedStats {
                enabled: true,
                ..BlockedStats::default()
            },
        }
    }

    fn block(&mut self, blocked: BlockedEval, out: &mut Outcome) {
        let BlockedEval { mut eval, demands } = blocked;
        // One blocked evaluation per job.
        if let Some(&key) = self.by_job.get(&eval.job)
            && let Some(current) = self.entries.get(&key)
        {
            if current.eval.id == eval.id {
                // The same evaluation blocked again (with new demands): no one is canceled.
                self.remove(key);
            } else if newer_or_same(&eval, &current.eval) {
                if let Some(old) = self.remove(key) {
                    out.canceled.push(old);
                }
            } else {
                out.canceled.push(eval);
                return;
            }
        }
        // The same id under another job name: keep only the latest copy.
        if let Some(&key) = self.by_id.get(&eval.id) {
            self.remove(key);
        }

        // Demands held back by a quota wait for their namespace, gangs for room for all of
        // their tasks, the others for capacity for one task.
        let mut gangs: Vec<GangWait> = demands.iter().filter_map(GangWait::of).collect();
        let shapes: Vec<Shape> = if demands.is_empty() {
            vec![shape(&Demand::default())]
        } else {
            let room = demands
                .iter()
                .filter(|d| d.over_quota.is_none() && GangWait::of(d).is_none());
            room.map(shape).collect()
        };
        let held_by_quota = demands
            .iter()
            .any(|d| d.over_quota.is_some())
            .then(|| namespace_of(&eval.job).to_owned());
        if let Some(why) = self
            .missed_unblock(
                eval.snapshot_index,
                &shapes,
                namespace_of(&eval.job),
                held_by_quota.is_some(),
            )
            .or_else(|| self.missed_gang_room(eval.snapshot_index, &mut gangs))
        {
            eval.status_description = why;
            out.unblocked.push(eval);
            return;
        }

        eval.status = EvalStatus::Blocked;
        let key = self.next_key;
        self.next_key += 1;
        let mut slots: Vec<Slot> = shapes
            .into_iter()
            .map(|shape| Slot {
                group: self.group_for(shape.constraints),
                mem_mb: shape.mem_mb,
                cpus: shape.cpus,
            })
            .collect();
        slots.sort_unstable();
        slots.dedup();
        for slot in &slots {
            if let Some(group) = self.groups.get_mut(&slot.group)
                && group
                    .by_mem
                    .entry(slot.mem_mb)
                    .or_default()
                    .entry(slot.cpus)
                    .or_default()
                    .insert(key)
            {
                group.len += 1;
            }
        }
        *self
            .stats
            .by_scheduler
            .entry(eval.scheduler_name().to_owned())
            .or_default() += 1;
        self.stats.total_blocked += 1;
        self.by_id.insert(eval.id.clone(), key);
        self.by_job.insert(eval.job.clone(), key);
        if let Some(namespace) = &held_by_quota {
            self.by_quota
                .entry(namespace.clone())
                .or_default()
                .insert(key);
        }
        if !gangs.is_empty() {
            self.gangs.insert(key, gangs);
        }
        let entry = Entry {
            eval,
            slots,
            held_by_quota,
        };
        self.entries.insert(key, entry);
    }

    /// Why an evaluation whose `gangs` wait, planned against `snapshot_index`, is released at
    /// once: the remembered changes after that index make room for one whole gang.
    fn missed_gang_room(&self, snapshot_index: u64, gangs: &mut [GangWait]) -> Option<String> {
        let after = snapshot_index.checked_add(1)?;
        let changes = self
            .history
            .range((after, 0)..)
            .filter_map(|(_, change)| match change {
                PastChange::Capacity {
                    agent,
                    free,
                    attributes,
                    ..
                } => Some((agent, attributes, free)),
                PastChange::Quota { .. } => None,
            });
        gangs::room_since(changes, gangs).then(|| CAPACITY_CAME.to_owned())
    }

    /// Why an evaluation of `namespace` planned against `snapshot_index` is released at once:
    /// a remembered change after that index would have released demands of `shapes` (or,
    /// `held_by_quota`, the namespace's quota-held demands), or changes after it may have been
    /// forgotten. `None`: it waits.
    fn missed_unblock(
        &self,
        snapshot_index: u64,
        shapes: &[Shape],
        namespace: &str,
        held_by_quota: bool,
    ) -> Option<String> {
        if snapshot_index < self.history_floor {
            return Some("changes it did not see may have been forgotten".to_owned());
        }
        let after = snapshot_index.checked_add(1)?;
        self.history
            .range((after, 0)..)
            .find_map(|(_, change)| match change {
                PastChange::Capacity {
                    attributes,
                    mem_mb,
                    cpus,
                    ..
                } => shapes
                    .iter()
                    .any(|s| {
                        s.mem_mb <= *mem_mb
                            && s.cpus <= *cpus
                            && Constraint::all_admit(&s.constraints, attributes)
                    })
                    .then(|| CAPACITY_CAME.to_owned()),
                PastChange::Quota {
                    namespace: changed,
                    quota_changed,
                } => (changed == namespace && (*quota_changed || held_by_quota))
                    .then(|| quota_freed(changed, *quota_changed)),
            })
    }

    fn group_for(&mut self, constraints: Vec<Constraint>) -> GroupId {
        if let Some(&id) = self.group_ids.get(&constraints) {
            return id;
        }
        let id = self.next_group;
        self.next_group += 1;
        self.group_ids.insert(constraints.clone(), id);
        self.groups.insert(
            id,
            Group {
                constraints,
                by_mem: BTreeMap::new(),
                len: 0,
            },
        );
        id
    }

    /// Takes an evaluation out of every index; returns it.
    fn remove(&mut self, key: Key) -> Option<Evaluation> {
        let entry = self.entries.remove(&key)?;
        self.gangs.remove(&key);
        for slot in &entry.slots {
            let Some(group) = self.groups.get_mut(&slot.group) else {
                continue;
            };
            if let Some(by_cpu) = group.by_mem.get_mut(&slot.mem_mb) {
                if let Some(bucket) = by_cpu.get_mut(&slot.cpus)
                    && bucket.remove(&key)
                {
                    group.len = group.len.saturating_sub(1);
                    if bucket.is_empty() {
                        by_cpu.remove(&slot.cpus);
                    }
                }
                if by_cpu.is_empty() {
                    group.by_mem.remove(&slot.mem_mb);
                }
            }
            if group.len == 0 {
                self.group_ids.remove(&group.constraints);
                self.groups.remove(&slot.group);
            }
        }
        let eval = entry.eval;
        if self.by_id.get(&eval.id) == Some(&key) {
            self.by_id.remove(&eval.id);
        }
        if self.by_job.get(&eval.job) == Some(&key) {
            self.by_job.remove(&eval.job);
        }
        if let Some(namespace) = &entry.held_by_quota
            && let Some(held) = self.by_quota.get_mut(namespace)
        {
            held.remove(&key);
            if held.is_empty() {
                self.by_quota.remove(namespace);
            }
        }
        if let Some(n) = self.stats.by_scheduler.get_mut(eval.scheduler_name()) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.stats.by_scheduler.remove(eval.scheduler_name());
            }
        }
        self.stats.total_blocked = self.stats.total_blocked.saturating_sub(1);
        Some(eval)
    }

    fn capacity_changed(&mut self, change: CapacityChange, out: &mut Outcome) {
        let mem_mb = change.free.mem_mb;
        let cpus = cpu_key(change.free.cpu_headroom());
        if self.enabled {
            let mut fitting: Vec<Key> = Vec::new();
            for group in self.groups.values() {
                if !Constraint::all_admit(&group.constraints, &change.attributes) {
                    continue;
                }
                for by_cpu in group.by_mem.range(..=mem_mb).map(|(_, by_cpu)| by_cpu) {
                    for bucket in by_cpu.range(..=cpus).map(|(_, bucket)| bucket) {
                        fitting.extend(bucket.iter().copied());
                    }
                }
            }
            for (&key, waits) in &mut self.gangs {
                let room = [(&change.agent, &change.attributes, &change.free)];
                if gangs::room_since(room.into_iter(), waits) {
                    fitting.push(key);
                }
            }
            // An evaluation with several fitting demands appears more than once; `remove`
            // returns it only the first time.
            for key in fitting {
                if let Some(mut eval) = self.remove(key) {
                    eval.status_description = CAPACITY_CAME.to_owned();
                    out.unblocked.push(eval);
                }
            }
        }
        let past = PastChange::Capacity {
            agent: change.agent,
            free: change.free,
            attributes: change.attributes,
            mem_mb,
            cpus,
        };
        self.remember(change.index, past);
    }

    fn quota_freed(&mut self, change: QuotaChange, out: &mut Outcome) {
        let QuotaChange {
            namespace,
            quota_changed,
            index,
        } = change;
        if self.enabled {
            let released: Vec<Key> = if quota_changed {
                // Rare (an operator's change): a look at every blocked evaluation will do.
                self.entries
                    .iter()
                    .filter(|(_, entry)| namespace_of(&entry.eval.job) == namespace)
                    .map(|(&key, _)| key)
                    .collect()
            } else {
                let held = self.by_quota.get(&namespace);
                held.into_iter().flatten().copied().collect()
            };
            for key in released {
                if let Some(mut eval) = self.remove(key) {
                    eval.status_description = quota_freed(&namespace, quota_changed);
                    out.unblocked.push(eval);
                }
            }
        }
        let past = PastChange::Quota {
            namespace,
            quota_changed,
        };
        self.remember(index, past);
    }

    fn remember(&mut self, index: u64, change: PastChange) {
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        self.history.insert((index, arrival), change);
        while self.history.len() > self.config.max_history.max(1) {
            match self.history.pop_first() {
                Some(((forgotten, _), _)) => {
                    self.history_floor = self.history_floor.max(forgotten);
                }
                None => break,
            }
        }
    }

    fn untrack(&mut self, job: &str, out: &mut Outcome) {
        if let Some(&key) = self.by_job.get(job)
            && let Some(eval) = self.remove(key)
        {
            out.canceled.push(eval);
        }
    }

    fn disable(&mut self) {
        self.enabled = false;
        self.stats.enabled = false;
        self.entries.clear();
        self.by_id.clear();
        self.by_job.clear();
        self.by_quota.clear();
        self.gangs.clear();
        self.group_ids.clear();
        self.groups.clear();
        self.stats.total_blocked = 0;
        self.stats.by_scheduler.clear();
    }

    fn list(&self) -> Vec<Evaluation> {
        let mut evals: Vec<Evaluation> = self.entries.values().map(|e| e.eval.clone()).collect();
        evals.sort_by(|a, b| {
            (a.create_index, a.modify_index, &a.id).cmp(&(b.create_index, b.modify_index, &b.id))
        });
        evals
    }

    /// Hands the message's results to the sink, one call per kind.
    fn flush(&mut self, out: Outcome) {
        let Outcome {
            mut unblocked,
            mut canceled,
        } = out;
        if !unblocked.is_empty() {
            for eval in &mut unblocked {
                eval.status = EvalStatus::Pending;
            }
            self.stats.total_unblocked += unblocked.len() as u64;
            self.sink.unblocked(unblocked);
        }
        if !canceled.is_empty() {
            for eval in &mut canceled {
                eval.status = EvalStatus::Canceled;
                eval.status_description =
                    "superseded: another evaluation of the job is blocked, or the job stopped"
                        .to_owned();
            }
            self.stats.total_canceled += canceled.len() as u64;
            self.sink.canceled(canceled);
        }
    }
}

impl Process for BlockedEvals {
    type Message = BlockedMsg;

    async fn handle(&mut self, msg: BlockedMsg, _ctx: &mut Context<Self>) {
        let mut out = Outcome::default();
        match msg {
            BlockedMsg::Block(blocked) => {
                if self.enabled {
                    self.block(blocked, &mut out);
                } else {
                    tracing::debug!(eval = %blocked.eval.id, "blocked-queue disabled; block ignored");
                }
            }
            BlockedMsg::CapacityChanged(change) => self.capacity_changed(change, &mut out),
            BlockedMsg::QuotaFreed(change) => self.quota_freed(change, &mut out),
            BlockedMsg::Untrack(job) => self.untrack(&job, &mut out),
            BlockedMsg::Stats(reply) => reply.send(self.stats.clone()),
            BlockedMsg::List(reply) => reply.send(self.list()),
            BlockedMsg::Disable => self.disable(),
            BlockedMsg::Restore(evals) => {
                self.enabled = true;
                self.stats.enabled = true;
                for blocked in evals {
                    self.block(blocked, &mut out);
                }
            }
        }
        self.flush(out);
    }
}
