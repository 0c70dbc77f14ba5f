//! The [`Scheduler`] trait, the [`Placer`] shortcut for writing one, and the built-in
//! [`binpack()`] and [`spread()`].
//!
//! A [`PlacingScheduler`] reconciles the evaluation's job ([`reconcile()`]), stops what must
//! stop, and asks its [`Placer`] to choose an agent for each missing slot among the
//! [`Candidate`]s: the agents whose attributes the group's constraints admit and whose free
//! resources, after the placements already in this plan, fit the task; all of them, or a
//! sample of them for a placer with a [candidate limit](Placer::candidate_limit), as the
//! built-in ones have. A system slot only has its own agent as a candidate. A slot with no
//! candidate, or for which the placer chooses none, counts towards the plan's unplaced
//! [`Demand`]s.
//!
//! A job whose namespace has a quota ([`ClusterSnapshot::quotas`]) is placed only within it:
//! the namespace's live tasks in the snapshot (of every job, system jobs' too), less this
//! plan's stops, plus its placements so far. A slot past the quota is left unplaced, its
//! demand naming the namespace and the limit ([`Demand::over_quota`]), before any agent is
//! looked at.
//!
//! A run's cost follows its job: its tasks, and the agents its slots consider. Only a placer
//! without a limit looks at every agent for every slot.
//!
//! Resources held by tasks this plan stops are not reused by this plan's placements: the agent
//! still runs them until the stop reaches it, and the applier checks placements against what
//! the agents hold now.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use muster_model::{AgentId, Evaluation, Resources, utilization};

use muster_model::Demand;

use crate::plan::{AgentView, ClusterSnapshot, Plan};
use crate::reconcile::{SlotRequest, reconcile};

/// Turns an evaluation and a snapshot into a plan. Schedulers plan optimistically against a
/// snapshot that may be stale; the plan applier has the last word.
pub trait Scheduler: Send {
    /// A short name for logs and stats (`binpack`).
    fn name(&self) -> &str;

    /// Plans the evaluation's job against `snapshot`.
    fn schedule(&mut self, eval: &Evaluation, snapshot: &ClusterSnapshot) -> Plan;
}

impl<S: Scheduler + ?Sized> Scheduler for Box<S> {
    fn name(&self) -> &str {
        (**self).name()
    }

    fn schedule(&mut self, eval: &Evaluation, snapshot: &ClusterSnapshot) -> Plan {
        (**self).schedule(eval, snapshot)
    }
}

/// An agent a task fits on, as it stands with this plan's placements so far.
#[derive(Clone, Debug)]
pub struct Candidate<'a> {
    /// The agent as the snapshot has it.
    pub agent: &'a AgentView,
    /// What its non-terminal tasks and this plan's placements on it hold.
    pub used: Resources,
    /// What is left: its total minus `used`.
    pub free: Resources,
    /// Its non-terminal tasks, this plan's placements included.
    pub tasks: usize,
    /// Those of them that belong to the job being planned.
    pub job_tasks: usize,
}

impl Candidate<'_> {
    /// The agent's id.
    pub fn id(&self) -> &AgentId {
        &self.agent.id
    }

    /// How full it is now (see [`utilization`](crate::utilization)).
    pub fn utilization(&self) -> f64 {
        utilization(&self.used, &self.agent.total)
    }

    /// How full it would be with a task needing `need` added.
    pub fn utilization_with(&self, need: &Resources) -> f64 {
        utilization(&self.used.saturating_add(need), &self.agent.total)
    }
}

/// Chooses an agent for one task slot: the one decision that distinguishes most schedulers.
pub trait Placer {
    /// Picks one of `candidates` (never empty; ordered by agent id) for `slot`, or `None` to
    /// leave it unplaced. An id that is not among the candidates counts as `None`.
    fn choose(&mut self, slot: &SlotRequest, candidates: &[Candidate<'_>]) -> Option<AgentId>;

    /// How many candidates a slot's search stops at, in a cluster of `agents` agents. `None`
    /// (the default) shows [`choose`](Self::choose) every agent the slot fits on, which costs
    /// a look at every agent for every slot. With a limit, as Nomad's schedulers do, each
    /// group's search walks the agents from a random start by a random step (seeded by the
    /// evaluation's id), each slot's search going on where the last one stopped, and stops at
    /// that many fitting agents; the agent the group's last slot went to is offered too, while
    /// the task fits there.
    fn candidate_limit(&self, agents: usize) -> Option<usize> {
        let _ = agents;
        None
    }
}

/// The candidate limit of the built-in placers: at least [`MIN_CANDIDATES`], and twice the
/// log₂ of the cluster's size (Nomad's service scheduler looks at log₂ n), so a run costs what
/// the job's slots cost, whatever the cluster's size. A cluster of up to [`MIN_CANDIDATES`]
/// agents is searched whole.
pub fn sampled_candidates(agents: usize) -> usize {
    let log2 = usize::BITS - agents.leading_zeros();
    MIN_CANDIDATES.max(2 * log2 as usize)
}

/// The fewest candidates the built-in placers look at for a slot: see
/// [`sampled_candidates`].
pub const MIN_CANDIDATES: usize = 16;

/// A [`Placer`] made from a closure; see [`PlacingScheduler::from_fn`].
pub struct FnPlacer<F>(pub F);

impl<F> fmt::Debug for FnPlacer<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FnPlacer")
    }
}

impl<F> Placer for FnPlacer<F>
where
    F: FnMut(&SlotRequest, &[Candidate<'_>]) -> Option<AgentId>,
{
    fn choose(&mut self, slot: &SlotRequest, candidates: &[Candidate<'_>]) -> Option<AgentId> {
        (self.0)(slot, candidates)
    }
}

/// A [`Scheduler`] that leaves only the choice of agent to its [`Placer`].
#[derive(Debug)]
pub struct PlacingScheduler<P> {
    name: String,
    placer: P,
}

impl<P: Placer> PlacingScheduler<P> {
    /// A scheduler called `name` that places with `placer`.
    pub fn new(name: impl Into<String>, placer: P) -> Self {
        PlacingScheduler {
            name: name.into(),
            placer,
        }
    }

    /// Its placer.
    pub fn placer(&self) -> &P {
        &self.placer
    }

    /// Its placer, mutably.
    pub fn placer_mut(&mut self) -> &mut P {
        &mut self.placer
    }

    /// Plans the evaluation's job (what [`Scheduler::schedule`] does, without requiring the
    /// placer to be `Send`).
    pub fn plan(&mut self, eval: &Evaluation, snapshot: &ClusterSnapshot) -> Plan {
        build_plan(&mut self.placer, eval, snapshot)
    }
}

impl<F> PlacingScheduler<FnPlacer<F>>
where
    F: FnMut(&SlotRequest, &[Candidate<'_>]) -> Option<AgentId>,
{
    /// A scheduler called `name` whose placer is the closure `choose`.
    pub fn from_fn(name: impl Into<String>, choose: F) -> Self {
        PlacingScheduler::new(name, FnPlacer(choose))
    }
}

impl<P: Placer + Send> Scheduler for PlacingScheduler<P> {
    fn name(&self) -> &str {
        &self.name
    }

    fn schedule(&mut self, eval: &Evaluation, snapshot: &ClusterSnapshot) -> Plan {
        self.plan(eval, snapshot)
    }
}

/// What a plan placed on one agent so far.
#[derive(Debug, Default)]
struct Added {
    used: Resources,
    tasks: usize,
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
    /// The agent its last slot went to, offered again while the task fits there (so that a
    /// bin-packing placer fills it before the next one).
    last: Option<usize>,
}

/// A walk over agent positions `0..len` that visits each once per round: step `k` is
/// `(start + k * step) mod len`, with `step` coprime to `len`. In id order (start 0, step 1)
/// for a placer that sees every candidate; from a random start with a random step for one
/// with a limit, so that a search looks at a random-looking sample without shuffling (or even
/// reading) every agent first.
#[derive(Debug)]
struct Walk {
    start: usize,
    step: usize,
    len: usize,
}

impl Walk {
    fn in_order(len: usize) -> Self {
        Walk {
            start: 0,
            step: 1,
            len,
        }
    }

    fn random(len: usize, rng: &mut fastrand::Rng) -> Self {
        if len < 2 {
            return Walk::in_order(len);
        }
        let mut step = rng.usize(1..len);
        while gcd(step, len) != 1 {
            step = step % (len - 1) + 1;
        }
        Walk {
            start: rng.usize(0..len),
            step,
            len,
        }
    }

    /// The position visited at step `k`.
    fn at(&self, k: usize) -> usize {
        let offset = (k % self.len) as u128 * self.step as u128;
        ((self.start as u128 + offset) % self.len as u128) as usize
    }
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The agents as a plan in progress leaves them: the snapshot's figures plus what the plan
/// placed so far. Only the agents a slot considers are looked at.
struct Search<'a> {
    agents: &'a [Arc<AgentView>],
    job: &'a str,
    /// The job name's hash, for finding its tasks on each agent looked at.
    job_hash: u64,
    /// The positions of the agents with a task of the job, from the snapshot's job index
    /// when it holds: an agent not listed has none, with nothing of it read.
    with_job: Option<&'a [u32]>,
    added: HashMap<usize, Added>,
    groups: HashMap<String, GroupSearch>,
    /// How many candidates a slot's search stops at (`None`: every fitting agent).
    limit: Option<usize>,
    rng: fastrand::Rng,
}

impl<'a> Search<'a> {
    fn new(
        agents: &'a [Arc<AgentView>],
        job: &'a str,
        with_job: Option<&'a [u32]>,
        eval: &Evaluation,
        limit: Option<usize>,
    ) -> Self {
        let mut seed = std::hash::DefaultHasher::new();
        eval.id.hash(&mut seed);
        Search {
            agents,
            job,
            job_hash: crate::plan::job_hash(job),
            with_job,
            added: HashMap::new(),
            groups: HashMap::new(),
            limit,
            rng: fastrand::Rng::with_seed(seed.finish()),
        }
    }

    fn used(&self, at: usize) -> Resources {
        let used = self.agents[at].used();
        match self.added.get(&at) {
            Some(added) => used.saturating_add(&added.used),
            None => used.clone(),
        }
    }

    fn fits(&self, at: usize, need: &Resources) -> bool {
        need.fits_in(&self.agents[at].total.saturating_sub(&self.used(at)))
    }

    fn candidate(&self, at: usize) -> Candidate<'a> {
        let agent: &'a AgentView = &self.agents[at];
        let used = self.used(at);
        let added = self.added.get(&at).map_or(0, |added| added.tasks);
        let listed = self
            .with_job
            .is_none_or(|with_job| with_job.binary_search(&(at as u32)).is_ok());
        let job_live = if listed {
            agent
                .tasks_of_hashed(self.job, self.job_hash)
                .iter()
                .filter(|task| !task.state.is_terminal())
                .count()
        } else {
            0
        };
        Candidate {
            agent,
            free: agent.total.saturating_sub(&used),
            used,
            tasks: agent.live_tasks() + added,
            job_tasks: job_live + added,
        }
    }

    fn place(&mut self, at: usize, need: &Resources, group: &str) {
        let added = self.added.entry(at).or_default();
        added.used = added.used.saturating_add(need);
        added.tasks += 1;
        if let Some(search) = self.groups.get_mut(group) {
            search.last = Some(at);
        }
    }

    /// The agents (positions) `slot` may go to: its own agent for a pinned slot; otherwise
    /// every fitting admitted agent, or with a limit, that many found from where the group's
    /// last search stopped, and the group's last agent if it still fits. In id order.
    fn fitting(&mut self, slot: &SlotRequest) -> Vec<usize> {
        let need = slot.resources();
        let admits = |agent: &AgentView| agent.eligible && agent.admits(slot.constraints());
        if let Some(pinned) = &slot.agent {
            return self
                .agents
                .binary_search_by(|agent| agent.id.cmp(pinned))
                .ok()
                .filter(|&at| admits(&self.agents[at]) && self.fits(at, need))
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
                last: None,
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
            if admits(&self.agents[at]) && self.fits(at, need) {
                fitting.push(at);
            }
        }
        if let Some(last) = search.last.filter(|last| !fitting.contains(last))
            && self.fits(last, need)
        {
            fitting.push(last);
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

/// Builds the plan for the evaluation's job, asking `placer` for each missing slot.
fn build_plan<P: Placer + ?Sized>(
    placer: &mut P,
    eval: &Evaluation,
    snapshot: &ClusterSnapshot,
) -> Plan {
    let reconciled = reconcile(eval, snapshot);
    let mut plan = Plan {
        eval: eval.id.clone(),
        job: reconciled.job.clone(),
        job_version: reconciled.job_version,
        snapshot_index: snapshot.index,
        place: Vec::with_capacity(reconciled.missing.len()),
        stop: reconciled.stop,
        unplaced: Vec::new(),
        eval_token: String::new(),
    };

    let agents = if reconciled.missing.is_empty() {
        Cow::Borrowed(&[][..])
    } else {
        snapshot.agents_by_id()
    };
    // Positions in the job index are the snapshot's own, which `agents` then borrows.
    let with_job = match &agents {
        Cow::Borrowed(listed) if listed.len() == snapshot.agents.len() => {
            snapshot.agents_with(&reconciled.job)
        }
        _ => None,
    };
    let limit = placer.candidate_limit(agents.len());
    let mut search = Search::new(&agents, &reconciled.job, with_job, eval, limit);
    let mut quota = if reconciled.missing.is_empty() {
        None
    } else {
        crate::quota::usage(&snapshot.quotas, &agents, &plan.job, &plan.stop)
    };
    // Per group, whether it has a slot left unplaced for want of room (false) or by its
    // namespace's quota (true): one demand each.
    let mut unplaced_groups: HashSet<(&str, bool)> = HashSet::new();
    for slot in &reconciled.missing {
        let need = slot.resources();
        if let Some(over) = quota.as_ref().and_then(|usage| usage.refusal(need)) {
            if unplaced_groups.insert((slot.group.name.as_str(), true)) {
                plan.unplaced.push(Demand {
                    resources: need.clone(),
                    constraints: slot.constraints().to_vec(),
                    over_quota: Some(over),
                });
            }
            continue;
        }
        let fitting = search.fitting(slot);
        let chosen = if fitting.is_empty() {
            None
        } else {
            let candidates: Vec<Candidate<'_>> =
                fitting.iter().map(|&at| search.candidate(at)).collect();
            let choice = placer.choose(slot, &candidates);
            let found = choice.as_ref().and_then(|id| {
                candidates
                    .iter()
                    .position(|c| c.id() == id)
                    .map(|k| fitting[k])
            });
            if let (Some(id), None) = (&choice, found) {
                tracing::warn!(slot = %slot.name, agent = %id, "placer chose an agent that is not a candidate");
            }
            found
        };

        match chosen {
            Some(at) => {
                search.place(at, need, &slot.group.name);
                if let Some(usage) = &mut quota {
                    usage.add(need);
                }
                plan.place.push(slot.placement(agents[at].id.clone()));
            }
            None => {
                if unplaced_groups.insert((slot.group.name.as_str(), false)) {
                    plan.unplaced.push(Demand {
                        resources: need.clone(),
                        constraints: slot.constraints().to_vec(),
                        over_quota: None,
                    });
                }
            }
        }
    }
    tracing::debug!(
        eval = %plan.eval,
        job = %plan.job,
        place = plan.place.len(),
        stop = plan.stop.len(),
        unplaced_groups = plan.unplaced.len(),
        "planned"
    );
    plan
}

/// Chooses the candidate that ends up most utilized, so that agents fill one after another and
/// whole agents stay free for large tasks. Ties go to the lowest agent id. It is shown a
/// sample of the fitting agents ([`sampled_candidates`]), among them the one the group's last
/// slot went to: a plan fills that agent before it moves on.
#[derive(Clone, Copy, Debug, Default)]
pub struct BinPack;

impl Placer for BinPack {
    fn candidate_limit(&self, agents: usize) -> Option<usize> {
        Some(sampled_candidates(agents))
    }

    fn choose(&mut self, slot: &SlotRequest, candidates: &[Candidate<'_>]) -> Option<AgentId> {
        let need = slot.resources();
        candidates
            .iter()
            .map(|c| (c.utilization_with(need), c.id()))
            .reduce(|best, next| {
                // Higher utilization wins; on a tie the lower id (the earlier one) stays.
                if next.0.total_cmp(&best.0).is_gt() || (next.0 == best.0 && next.1 < best.1) {
                    next
                } else {
                    best
                }
            })
            .map(|(_, id)| id.clone())
    }
}

/// Chooses the candidate with the fewest tasks of the job, then the lowest utilization, so
/// that a job evens out over the cluster and concurrent schedulers rarely pick the same agent
/// (as in HashiCorp's "Nomad 2 million container challenge"). Ties go to the lowest agent id.
/// It is shown a sample of the fitting agents ([`sampled_candidates`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Spread;

impl Placer for Spread {
    fn candidate_limit(&self, agents: usize) -> Option<usize> {
        Some(sampled_candidates(agents))
    }

    fn choose(&mut self, slot: &SlotRequest, candidates: &[Candidate<'_>]) -> Option<AgentId> {
        let need = slot.resources();
        candidates
            .iter()
            .min_by(|a, b| {
                a.job_tasks
                    .cmp(&b.job_tasks)
                    .then_with(|| {
                        a.utilization_with(need)
                            .total_cmp(&b.utilization_with(need))
                    })
                    .then_with(|| a.id().cmp(b.id()))
            })
            .map(|c| c.id().clone())
    }
}

/// The built-in bin-packing scheduler (Nomad's default): see [`BinPack`].
pub fn binpack() -> PlacingScheduler<BinPack> {
    PlacingScheduler::new("binpack", BinPack)
}

/// The built-in spreading scheduler: see [`Spread`].
pub fn spread() -> PlacingScheduler<Spread> {
    PlacingScheduler::new("spread", Spread)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use muster_model::TaskGroup;

    use super::*;

    fn view(id: &str, cpus: f64) -> AgentView {
        AgentView::new(
            AgentId(id.into()),
            BTreeMap::new(),
            Resources { cpus, mem_mb: 1024 },
            Vec::<crate::TaskView>::new(),
        )
    }

    fn slot() -> SlotRequest {
        SlotRequest {
            name: "j.g[0]".into(),
            job: "j".into(),
            group: Arc::new(TaskGroup {
                name: "g".into(),
                count: 1,
                resources: Resources {
                    cpus: 1.0,
                    mem_mb: 0,
                },
                ..TaskGroup::default()
            }),
            job_version: 1,
            agent: None,
        }
    }

    fn candidate(agent: &AgentView, used_cpus: f64, job_tasks: usize) -> Candidate<'_> {
        let used = Resources {
            cpus: used_cpus,
            mem_mb: 0,
        };
        Candidate {
            agent,
            free: agent.total.saturating_sub(&used),
            used,
            tasks: job_tasks,
            job_tasks,
        }
    }

    #[test]
    fn ties_go_to_the_lowest_id_whatever_the_order() {
        let (b, a) = (view("b", 4.0), view("a", 4.0));
        let candidates = [candidate(&b, 1.0, 1), candidate(&a, 1.0, 1)];
        assert_eq!(
            BinPack.choose(&slot(), &candidates),
            Some(AgentId("a".into()))
        );
        assert_eq!(
            Spread.choose(&slot(), &candidates),
            Some(AgentId("a".into()))
        );
    }

    #[test]
    fn binpack_and_spread_disagree_as_they_should() {
        let (a, b) = (view("a", 4.0), view("b", 4.0));
        // `a` is emptier but already runs more of the job's tasks.
        let candidates = [candidate(&a, 1.0, 1), candidate(&b, 2.0, 0)];
        assert_eq!(
            BinPack.choose(&slot(), &candidates),
            Some(AgentId("b".into()))
        );
        assert_eq!(
            Spread.choose(&slot(), &candidates),
            Some(AgentId("b".into()))
        );
        let candidates = [candidate(&a, 1.0, 0), candidate(&b, 2.0, 0)];
        assert_eq!(
            BinPack.choose(&slot(), &candidates),
            Some(AgentId("b".into()))
        );
        assert_eq!(
            Spread.choose(&slot(), &candidates),
            Some(AgentId("a".into()))
        );
    }

    #[test]
    fn utilization_with_a_task_counts_the_task() {
        let a = view("a", 4.0);
        let c = candidate(&a, 1.0, 0);
        // cpu 1/4 and mem 0/1024, then cpu 2/4.
        assert_eq!(c.utilization(), 0.125);
        assert_eq!(c.utilization_with(slot().resources()), 0.25);
    }

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
