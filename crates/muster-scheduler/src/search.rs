//! The search for a slot's candidates while a plan is built ([`Search`]): the agents as the
//! plan in progress leaves them (the snapshot's figures plus its placements so far), walked
//! from a random start for a placer with a candidate limit, and what each candidate is to the
//! slot's group: how many of its tasks run there, and how the group's affinities and spreads
//! rank it ([`crate::ranking`]).
//!
//! Only the agents a slot considers are looked at, and a group's spreads count only the
//! agents that hold the job's tasks (the snapshot's job index): a run's cost follows its job.

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use foldhash::{HashMap, HashSet};
use muster_model::{AssignedPort, Constraint, Evaluation, Resources};

use crate::candidate::Candidate;
use crate::plan::{AgentView, AttributeColumn, JobIndex, TaskView};
use crate::ranking::{self, SpreadCounts};
use crate::reconcile::SlotRequest;

/// How many of a group's recent agents a group with spreads is offered again (see
/// `GroupSearch::recent`): enough for one per value of a spread over a few zones.
const RECENT_WITH_SPREADS: usize = 4;

/// What a plan placed on one agent so far.
#[derive(Debug, Default)]
struct Added {
    used: Resources,
    /// What the tasks this plan preempts there held.
    freed: Resources,
    tasks: usize,
    /// Of `tasks`, how many of each group.
    by_group: Vec<(Box<str>, usize)>,
    /// The ports its placements hold.
    ports: Vec<u16>,
}

impl Added {
    fn of_group(&self, group: &str) -> usize {
        self.by_group
            .iter()
            .find(|(name, _)| &**name == group)
            .map_or(0, |(_, n)| *n)
    }
}

/// One group's search for agents while a plan is built.
#[derive(Debug)]
struct GroupSearch {
    /// The order it looks at agents in.
    walk: Walk,
    /// How far along `walk` the next slot's search starts.
    cursor: usize,
    /// Nothing fits any agent any more: free capacity only shrinks while planning, so its
    /// later (unpinned) slots need no search.
    exhausted: bool,
    /// The agents its last slots went to, newest first, offered again while the task fits
    /// there (so that a bin-packing placer fills them before the next ones): the last one, or
    /// for a group with spreads the last few (one per value it spreads over, so that it packs
    /// within each zone instead of opening a new agent at every turn of the spread).
    recent: Vec<usize>,
    /// Its tasks per value of each of its spreads' attributes, this plan's placements
    /// included (empty for a group without spreads).
    spreads: Vec<SpreadCounts>,
}

/// A walk over agent positions `0..len` that visits each once per round. In id order for a
/// placer that sees every candidate. For one with a limit, step `k` visits `p(start + k)` for a
/// permutation `p` of `0..len` keyed from the evaluation, so that a search looks at a
/// well-mixed sample without shuffling (or even reading) every agent first: agents whose ids
/// sort together (`zone-a-…`, `rack-7-…`) are not looked at together. `p` mixes the bits of a
/// position within the next power of two (a keyed sequence of invertible steps: adding a
/// constant, multiplying by an odd one, folding the high bits into the low), walked until it
/// lands inside `0..len` (fewer than two steps on average).
#[derive(Debug)]
struct Walk {
    start: u64,
    len: u64,
    /// Bits of the power of two the mixing works in; 0 for the walk in id order.
    bits: u32,
    /// The added constant and the two odd multipliers.
    keys: [u64; 3],
}

impl Walk {
    fn in_order(len: usize) -> Self {
        Walk {
            start: 0,
            len: len as u64,
            bits: 0,
            keys: [0; 3],
        }
    }

    fn random(len: usize, rng: &mut fastrand::Rng) -> Self {
        if len < 2 {
            return Walk::in_order(len);
        }
        Walk {
            start: rng.u64(0..len as u64),
            len: len as u64,
            bits: u64::BITS - (len as u64 - 1).leading_zeros(),
            keys: [rng.u64(..), rng.u64(..) | 1, rng.u64(..) | 1],
        }
    }

    /// The position visited at step `k`.
    fn at(&self, k: usize) -> usize {
        let mut x = (self.start + k as u64 % self.len) % self.len;
        if self.bits == 0 {
            return x as usize;
        }
        loop {
            x = self.mix(x);
            if x < self.len {
                return x as usize;
            }
        }
    }

    /// A bijection of `0..2^bits`: each step is invertible modulo `2^bits`.
    fn mix(&self, x: u64) -> u64 {
        let mask = if self.bits == 64 {
            u64::MAX
        } else {
            (1u64 << self.bits) - 1
        };
        let fold = self.bits.div_ceil(2);
        let mut x = x.wrapping_add(self.keys[0]) & mask;
        x = x.wrapping_mul(self.keys[1]) & mask;
        x ^= x >> fold;
        x = x.wrapping_mul(self.keys[2]) & mask;
        x ^= x >> fold;
        x
    }
}

/// The agents as a plan in progress leaves them: the snapshot's figures plus what the plan
/// placed so far. Only the agents a slot considers are looked at.
pub(crate) struct Search<'a> {
    agents: &'a [Arc<AgentView>],
    job: &'a str,
    /// The job name's hash, for finding its tasks on each agent looked at.
    job_hash: u64,
    /// The snapshot's job index, when it holds for `agents`: the agents' attributes as
    /// columns.
    index: Option<&'a JobIndex>,
    /// The positions of the agents with a task of the job, from the index: an agent not
    /// listed has none, with nothing of it read.
    with_job: Option<&'a [u32]>,
    /// The tasks this plan stops: they count towards no group's tasks on their agents (the
    /// agents still run them, so their resources still count).
    stopping: HashSet<&'a str>,
    /// The tasks this plan preempts, by id.
    preempted: HashSet<String>,
    added: HashMap<usize, Added>,
    groups: HashMap<String, GroupSearch>,
    /// How many candidates a slot's search stops at (`None`: every fitting agent).
    limit: Option<usize>,
    rng: fastrand::Rng,
}

impl<'a> Search<'a> {
    /// A search over `agents` for the slots of `job`, of which this plan stops `stopping`;
    /// `index` is the snapshot's job index if it was built for exactly these agents.
    pub(crate) fn new(
        agents: &'a [Arc<AgentView>],
        job: &'a str,
        index: Option<&'a JobIndex>,
        stopping: HashSet<&'a str>,
        eval: &Evaluation,
        limit: Option<usize>,
    ) -> Self {
        let mut seed = std::hash::DefaultHasher::new();
        eval.id.hash(&mut seed);
        Search {
            agents,
            job,
            job_hash: crate::plan::job_hash(job),
            index,
            with_job: index.map(|index| index.agents_with(job)),
            stopping,
            preempted: HashSet::default(),
            added: HashMap::default(),
            groups: HashMap::default(),
            limit,
            rng: fastrand::Rng::with_seed(seed.finish()),
        }
    }

    fn used(&self, at: usize) -> Resources {
        let used = self.agents[at].used();
        match self.added.get(&at) {
            Some(added) => used
                .saturating_add(&added.used)
                .saturating_sub(&added.freed),
            None => used.clone(),
        }
    }

    fn fits(&self, at: usize, need: &Resources) -> bool {
        need.fits_in(&self.agents[at].total.saturating_sub(&self.used(at)))
    }

    /// Whether the snapshot may hold tasks of the job on the agent at `at`.
    fn may_hold_job(&self, at: usize) -> bool {
        self.with_job
            .is_none_or(|with_job| with_job.binary_search(&(at as u32)).is_ok())
    }

    /// The job's live tasks on the agent at `at` in the snapshot: all of them, and those of
    /// `group` this plan does not stop.
    fn job_and_group_tasks(&self, at: usize, group: &str) -> (usize, usize) {
        if !self.may_hold_job(at) {
            return (0, 0);
        }
        let (mut job, mut of_group) = (0, 0);
        for task in self.agents[at].tasks_of_hashed(self.job, self.job_hash) {
            if task.state.is_terminal() {
                continue;
            }
            job += 1;
            if task.group() == group
                && (self.stopping.is_empty() || !self.stopping.contains(task.id()))
            {
                of_group += 1;
            }
        }
        (job, of_group)
    }

    /// The group's tasks on the agent at `at`, this plan's placements included.
    fn group_tasks(&self, at: usize, group: &str) -> usize {
        let placed = self.added.get(&at).map_or(0, |added| added.of_group(group));
        self.job_and_group_tasks(at, group).1 + placed
    }

    /// Whether the slot may go to the agent at `at`: eligible, admitted by the constraints,
    /// with room, (for a group kept on distinct agents) none of the group's tasks there, and
    /// the ports the group asks for free there.
    fn takes(&self, at: usize, slot: &SlotRequest, distinct: bool) -> bool {
        self.fits(at, slot.resources()) && self.takes_but_for_room(at, slot, distinct)
    }

    /// [`takes`](Self::takes) but for its room.
    fn takes_but_for_room(&self, at: usize, slot: &SlotRequest, distinct: bool) -> bool {
        let agent = &self.agents[at];
        agent.eligible
            && agent.admits(slot.constraints())
            && !(distinct && self.group_tasks(at, &slot.group.name) > 0)
            && (slot.group.ports.is_empty() || self.ports_free(at, slot))
    }

    /// Where `slot` would fit if tasks of jobs of lower priority than `priority` stopped
    /// (their jobs' priorities from `priority_of`): the agent, and those tasks, lowest
    /// priority first (and the larger first among equals), as few as make room. Of the agents
    /// that could, the one whose preempted tasks have the lowest highest priority, then the
    /// fewest. Looks at every agent until it has found a few: only for a slot no agent has
    /// room for, where preemption is allowed.
    pub(crate) fn preemptible(
        &self,
        slot: &SlotRequest,
        priority: u8,
        priority_of: impl Fn(&str) -> Option<u8>,
    ) -> Option<(usize, Vec<&'a TaskView>)> {
        const ENOUGH: usize = 4;
        let distinct = Constraint::any_distinct_hosts(slot.constraints());
        let need = slot.resources();
        let mut best: Option<((u8, usize), usize, Vec<&'a TaskView>)> = None;
        let mut found = 0;
        // A pinned slot (a system job's) may preempt on its own agent only.
        let positions: Vec<usize> = match &slot.agent {
            Some(pinned) => self
                .agents
                .binary_search_by(|agent| agent.id.cmp(pinned))
                .ok()
                .into_iter()
                .collect(),
            None => (0..self.agents.len()).collect(),
        };
        for at in positions {
            if found >= ENOUGH {
                break;
            }
            if !self.takes_but_for_room(at, slot, distinct) {
                continue;
            }
            let agent: &'a AgentView = &self.agents[at];
            let mut victims: Vec<(u8, &'a TaskView)> = agent
                .tasks()
                .iter()
                .filter(|task| !task.state.is_terminal())
                .filter(|task| {
                    !self.stopping.contains(task.id()) && !self.preempted.contains(task.id())
                })
                .filter_map(|task| {
                    let theirs = priority_of(task.job())?;
                    (theirs < priority).then_some((theirs, &**task))
                })
                .collect();
            victims.sort_by(|(pa, a), (pb, b)| {
                pa.cmp(pb)
                    .then(b.resources.cpus.total_cmp(&a.resources.cpus))
                    .then(b.resources.mem_mb.cmp(&a.resources.mem_mb))
                    .then(a.id().cmp(b.id()))
            });
            let mut free = agent.total.saturating_sub(&self.used(at));
            let mut taken: Vec<(u8, &'a TaskView)> = Vec::new();
            for (theirs, task) in victims {
                if need.fits_in(&free) {
                    break;
                }
                free = free.saturating_add(&task.resources);
                taken.push((theirs, task));
            }
            if taken.is_empty() || !need.fits_in(&free) {
                continue;
            }
            // Taken lowest priority first, some may be needless once a larger one is in (a
            // 1-cpu task, then a 4-cpu one, for 4 cpus): from the highest down, give back each
            // whose room is not needed.
            for k in (0..taken.len()).rev() {
                let without = free.saturating_sub(&taken[k].1.resources);
                if need.fits_in(&without) {
                    free = without;
                    taken.remove(k);
                }
            }
            let highest = taken.iter().map(|(p, _)| *p).max().unwrap_or(0);
            let taken: Vec<&'a TaskView> = taken.into_iter().map(|(_, task)| task).collect();
            found += 1;
            let rank = (highest, taken.len());
            if best.as_ref().is_none_or(|(best, _, _)| rank < *best) {
                best = Some((rank, at, taken));
            }
        }
        best.map(|(_, at, taken)| (at, taken))
    }

    /// Records that this plan stops `victims` on the agent at `at`: their room is free for
    /// its placements, and no other slot preempts them again.
    pub(crate) fn preempt(&mut self, at: usize, victims: &[&TaskView]) {
        let added = self.added.entry(at).or_default();
        for victim in victims {
            added.freed = added.freed.saturating_add(&victim.resources);
            self.preempted.insert(victim.id().to_owned());
        }
    }

    /// The ports taken on the agent at `at`: its live tasks' and this plan's placements'.
    fn ports_taken(&self, at: usize) -> BTreeSet<u16> {
        let mut taken = self.agents[at].ports_in_use();
        if let Some(added) = self.added.get(&at) {
            taken.extend(added.ports.iter().copied());
        }
        taken
    }

    /// Whether the group's static ports are free on the agent at `at`, and enough of its
    /// dynamic range for the rest.
    fn ports_free(&self, at: usize, slot: &SlotRequest) -> bool {
        let mut taken = self.ports_taken(at);
        let range = self.agents[at].dynamic_ports;
        let mut dynamic = 0;
        for request in &slot.group.ports {
            if request.static_port == 0 {
                dynamic += 1;
            } else if !taken.insert(request.static_port) {
                return false;
            }
        }
        // The group's own static ports inside the range are not for its dynamic ones either.
        let taken_in_range = taken.range(range.min..=range.max).count();
        dynamic <= range.len().saturating_sub(taken_in_range)
    }

    /// The ports a task of `slot` gets on the agent at `at`, in its group's order: each static
    /// one, and for each dynamic one a free port of the agent's range, picked at random (as
    /// Nomad picks them, so that plans from stale snapshots rarely collide). `None` if the
    /// range has too few left.
    pub(crate) fn assign_ports(
        &mut self,
        at: usize,
        slot: &SlotRequest,
    ) -> Option<Vec<AssignedPort>> {
        let requests = &slot.group.ports;
        if requests.is_empty() {
            return Some(Vec::new());
        }
        let mut taken = self.ports_taken(at);
        taken.extend(requests.iter().map(|r| r.static_port).filter(|&p| p != 0));
        let dynamic = requests.iter().filter(|r| r.static_port == 0).count();
        let mut picked = self.agents[at]
            .dynamic_ports
            .pick(dynamic, &taken, &mut self.rng)?
            .into_iter();
        requests
            .iter()
            .map(|request| {
                let port = match request.static_port {
                    0 => picked.next()?,
                    port => port,
                };
                Some(AssignedPort {
                    label: request.label.clone(),
                    port,
                })
            })
            .collect()
    }

    /// The agents at `at` as candidates for `slot`, in that order.
    pub(crate) fn candidates(&self, at: &[usize], slot: &SlotRequest) -> Vec<Candidate<'a>> {
        // Looked up once per slot, and only for a group with spreads (most have none).
        let spreads = if slot.group.spreads.is_empty() {
            &[][..]
        } else {
            self.groups
                .get(slot.group.name.as_str())
                .map_or(&[][..], |search| &search.spreads[..])
        };
        at.iter()
            .map(|&at| self.candidate(at, slot, spreads))
            .collect()
    }

    /// The agent at `at` as a candidate for `slot`, whose group's spread counts are
    /// `spreads`.
    fn candidate(&self, at: usize, slot: &SlotRequest, spreads: &[SpreadCounts]) -> Candidate<'a> {
        let agent: &'a AgentView = &self.agents[at];
        let group = slot.group.name.as_str();
        let used = self.used(at);
        let added = self.added.get(&at);
        let (job_live, group_live) = self.job_and_group_tasks(at, group);
        Candidate {
            agent,
            free: agent.total.saturating_sub(&used),
            used,
            tasks: agent.live_tasks() + added.map_or(0, |a| a.tasks),
            job_tasks: job_live + added.map_or(0, |a| a.tasks),
            group_tasks: group_live + added.map_or(0, |a| a.of_group(group)),
            affinity: ranking::affinity(&slot.group.affinities, &agent.attributes),
            spread: ranking::spread(&slot.group, spreads, at),
        }
    }

    /// Records a placement of `slot` on the agent at `at`, holding `ports`.
    pub(crate) fn place(&mut self, at: usize, slot: &SlotRequest, ports: &[AssignedPort]) {
        let group = slot.group.name.as_str();
        let added = self.added.entry(at).or_default();
        added.used = added.used.saturating_add(slot.resources());
        added.tasks += 1;
        added.ports.extend(ports.iter().map(|p| p.port));
        match added.by_group.iter_mut().find(|(name, _)| &**name == group) {
            Some((_, n)) => *n += 1,
            None => added.by_group.push((group.into(), 1)),
        }
        if let Some(search) = self.groups.get_mut(group) {
            let keep = if slot.group.spreads.is_empty() {
                1
            } else {
                RECENT_WITH_SPREADS
            };
            search.recent.retain(|&r| r != at);
            search.recent.insert(0, at);
            search.recent.truncate(keep);
            for (spread, counts) in slot.group.spreads.iter().zip(&mut search.spreads) {
                counts.add(spread, at, 1);
            }
        }
    }

    /// The group's tasks per value of each of its spreads' attributes, from the agents that
    /// may hold the job's tasks.
    fn spread_counts(&self, slot: &SlotRequest) -> Vec<SpreadCounts> {
        let group = &slot.group;
        if group.spreads.is_empty() {
            return Vec::new();
        }
        let mut counts: Vec<SpreadCounts> = group
            .spreads
            .iter()
            .map(|spread| {
                SpreadCounts::new(match self.index {
                    Some(index) => index.attribute_column(&spread.attribute),
                    None => Arc::new(AttributeColumn::build(&spread.attribute, self.agents)),
                })
            })
            .collect();
        let mut count_at = |at: usize| {
            let n = self.job_and_group_tasks(at, &group.name).1;
            if n > 0 {
                for (spread, counts) in group.spreads.iter().zip(&mut counts) {
                    counts.add(spread, at, n);
                }
            }
        };
        match self.with_job {
            Some(with_job) => with_job.iter().for_each(|&at| count_at(at as usize)),
            None => (0..self.agents.len()).for_each(&mut count_at),
        }
        counts
    }

    /// The agents (positions) `slot` may go to: its own agent for a pinned slot; otherwise
    /// every agent that takes it, or with a limit, that many found from where the group's
    /// last search stopped, and the group's recent agents that still take it. In id order.
    pub(crate) fn fitting(&mut self, slot: &SlotRequest) -> Vec<usize> {
        let distinct = Constraint::any_distinct_hosts(slot.constraints());
        if let Some(pinned) = &slot.agent {
            return self
                .agents
                .binary_search_by(|agent| agent.id.cmp(pinned))
                .ok()
                .filter(|&at| self.takes(at, slot, distinct))
                .into_iter()
                .collect();
        }
        let group = slot.group.name.as_str();
        if !self.groups.contains_key(group) {
            let walk = match self.limit {
                Some(_) => Walk::random(self.agents.len(), &mut self.rng),
                None => Walk::in_order(self.agents.len()),
            };
            let search = GroupSearch {
                walk,
                cursor: 0,
                exhausted: false,
                recent: Vec::new(),
                spreads: self.spread_counts(slot),
            };
            self.groups.insert(group.to_owned(), search);
        }
        let Some(search) = self.groups.get(group) else {
            return Vec::new();
        };
        if search.exhausted {
            return Vec::new();
        }
        let mut fitting = Vec::new();
        let mut looked = 0;
        let wanted = self.limit.unwrap_or(usize::MAX);
        let len = self.agents.len();
        while looked < len && fitting.len() < wanted {
            let at = search.walk.at(search.cursor + looked);
            looked += 1;
            if self.takes(at, slot, distinct) {
                fitting.push(at);
            }
        }
        for &recent in &search.recent {
            if !fitting.contains(&recent) && self.takes(recent, slot, distinct) {
                fitting.push(recent);
            }
        }
        let (cursor, exhausted) = ((search.cursor + looked) % len.max(1), fitting.is_empty());
        if let Some(search) = self.groups.get_mut(group) {
            search.cursor = cursor;
            search.exhausted = exhausted;
        }
        fitting.sort_unstable();
        fitting
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_random_walk_visits_every_agent_once_a_round() {
        let mut rng = fastrand::Rng::with_seed(3);
        for len in [1, 2, 3, 4, 12, 97, 100, 1_000, 1_024] {
            for _ in 0..20 {
                let walk = Walk::random(len, &mut rng);
                for round in [0, 1, 5] {
                    let mut seen: Vec<usize> = (0..len).map(|k| walk.at(round * len + k)).collect();
                    seen.sort_unstable();
                    assert_eq!(seen, (0..len).collect::<Vec<_>>(), "len {len}");
                }
            }
        }
        let walk = Walk::in_order(5);
        assert_eq!(
            (0..7).map(|k| walk.at(k)).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4, 0, 1]
        );
    }
}
