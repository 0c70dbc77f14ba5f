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
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;

use muster_model::{AgentId, Evaluation};

use muster_model::Demand;

use crate::plan::{ClusterSnapshot, Plan, Preemption};
use crate::reconcile::{SlotRequest, reconcile};
use crate::search::Search;

pub use crate::candidate::Candidate;

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
    /// that many fitting agents; the agent the group's last slot went to (for a group with
    /// spreads, its last few) is offered too, while the task fits there.
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

/// Builds the plan for the evaluation's job, asking `placer` for each missing slot.
fn build_plan<P: Placer + ?Sized>(
    placer: &mut P,
    eval: &Evaluation,
    snapshot: &ClusterSnapshot,
) -> Plan {
    let reconciled = reconcile(eval, snapshot);
    let mut plan = Plan {
        atomic: false,
        preempt: Vec::new(),
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
    let index = match &agents {
        Cow::Borrowed(listed) if listed.len() == snapshot.agents.len() => {
            snapshot.index_of_agents()
        }
        _ => None,
    };
    let limit = placer.candidate_limit(agents.len());
    let stopping = plan.stop.iter().map(|stop| stop.task_id.as_str()).collect();
    let mut search = Search::new(&agents, &reconciled.job, index, stopping, eval, limit);
    // The job's priority, if its type may preempt lower-priority tasks.
    let preempting = snapshot
        .jobs
        .get(&reconciled.job)
        .filter(|job| snapshot.preemption.allows(job.scheduler))
        .map(|job| job.priority);
    let priority_of = |job: &str| snapshot.jobs.get(job).map(|job| job.priority);
    let mut quota = if reconciled.missing.is_empty() {
        None
    } else {
        crate::quota::usage(&snapshot.quotas, &agents, &plan.job, &plan.stop)
    };
    // Per group, whether it has a slot left unplaced for want of room (false) or by its
    // namespace's quota (true): one demand each, at this position in `plan.unplaced`.
    let mut unplaced_groups: HashMap<(&str, bool), usize> = HashMap::new();
    for slot in &reconciled.missing {
        let need = slot.resources();
        if let Some(over) = quota.as_ref().and_then(|usage| usage.refusal(need)) {
            if let Entry::Vacant(entry) = unplaced_groups.entry((slot.group.name.as_str(), true)) {
                entry.insert(plan.unplaced.len());
                plan.unplaced.push(Demand {
                    gang_fitting: 0,
                    gang: 0,
                    resources: need.clone(),
                    constraints: slot.constraints().to_vec(),
                    over_quota: Some(over),
                });
            }
            continue;
        }
        let fitting = search.fitting(slot);
        let no_room = fitting.is_empty();
        let chosen = if no_room {
            None
        } else {
            let candidates: Vec<Candidate<'_>> = search.candidates(&fitting, slot);
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

        // No room anywhere (not a placer that declined): tasks of lower-priority jobs may make
        // some, where allowed.
        let mut victims = Vec::new();
        let chosen = match (chosen, preempting) {
            (Some(at), _) => Some(at),
            // A gang is placed whole or not at all; it does not preempt (yet).
            (None, Some(priority)) if no_room && !slot.group.gang => search
                .preemptible(slot, priority, priority_of)
                .map(|(at, taken)| {
                    victims = taken;
                    at
                }),
            (None, _) => None,
        };
        let chosen = chosen.and_then(|at| Some((at, search.assign_ports(at, slot)?)));
        match chosen {
            Some((at, ports)) => {
                search.preempt(at, &victims);
                plan.preempt.extend(victims.iter().map(|task| Preemption {
                    agent: agents[at].id.clone(),
                    task_id: task.id().to_owned(),
                    job: task.job().to_owned(),
                }));
                search.place(at, slot, &ports);
                if let Some(usage) = &mut quota {
                    usage.add(need);
                }
                let mut placement = slot.placement(agents[at].id.clone());
                placement.ports = ports;
                plan.place.push(placement);
            }
            None => {
                if let Entry::Vacant(entry) =
                    unplaced_groups.entry((slot.group.name.as_str(), false))
                {
                    entry.insert(plan.unplaced.len());
                    plan.unplaced.push(Demand {
                        gang_fitting: 0,
                        gang: 0,
                        resources: need.clone(),
                        constraints: slot.constraints().to_vec(),
                        over_quota: None,
                    });
                }
            }
        }
    }
    all_or_nothing(&mut plan, &reconciled.missing, &unplaced_groups);
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

/// Applies the rule of groups placed all at once ([`TaskGroup::gang`]) to `plan`, whose
/// missing slots were `missing`: a gang group with a slot left unplaced keeps none of its
/// placements, and its demand says how many tasks must fit together and how many did; a plan
/// that places a gang group whole is marked atomic, so that the applier commits it whole or
/// not at all. (The dropped placements still counted as taken while the rest of this plan
/// was made: other groups of the job may wait one round longer, never overcommit.)
///
/// [`TaskGroup::gang`]: muster_model::TaskGroup::gang
fn all_or_nothing(
    plan: &mut Plan,
    missing: &[SlotRequest],
    unplaced_groups: &HashMap<(&str, bool), usize>,
) {
    let mut gangs: Vec<(&str, u32)> = Vec::new();
    for slot in missing.iter().filter(|slot| slot.group.gang) {
        match gangs.iter_mut().find(|(name, _)| *name == slot.group.name) {
            Some((_, n)) => *n += 1,
            None => gangs.push((&slot.group.name, 1)),
        }
    }
    for (group, wanted) in gangs {
        let placed = plan.place.iter().filter(|p| p.group == group).count() as u32;
        if placed == wanted {
            plan.atomic = true;
            continue;
        }
        plan.place.retain(|p| p.group != group);
        // A gang held back by its namespace's quota waits for the quota (its demand says so);
        // one short of room turns its demand into the gang's.
        if unplaced_groups.contains_key(&(group, true)) {
            continue;
        }
        if let Some(&k) = unplaced_groups.get(&(group, false))
            && let Some(demand) = plan.unplaced.get_mut(k)
        {
            demand.gang = wanted;
            demand.gang_fitting = placed;
        }
    }
}

/// Chooses the candidate that ends up most utilized, so that agents fill one after another and
/// whole agents stay free for large tasks, ranked with the job's anti-affinity and the group's
/// affinities and spreads ([`Candidate::score`]): a job's replicas go to agents that run none
/// of them while such agents are among the candidates. Ties go to the lowest agent id. It is
/// shown a sample of the fitting agents ([`sampled_candidates`]), among them the ones the
/// group's last slots went to.
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
            .map(|c| (c.score(c.utilization_with(need), slot), c.id()))
            .reduce(|best, next| {
                // The higher score wins; on a tie the lower id (the earlier one) stays.
                if next.0.total_cmp(&best.0).is_gt() || (next.0 == best.0 && next.1 < best.1) {
                    next
                } else {
                    best
                }
            })
            .map(|(_, id)| id.clone())
    }
}

/// Chooses the candidate the group's affinities and spreads prefer ([`Candidate::preference`]),
/// then the one with the fewest tasks of the job, then the lowest utilization, so that a job
/// evens out over the cluster and concurrent schedulers rarely pick the same agent (as in
/// HashiCorp's "Nomad 2 million container challenge"). Ties go to the lowest agent id. It is
/// shown a sample of the fitting agents ([`sampled_candidates`]).
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
                let preference = |c: &Candidate<'_>| c.preference().unwrap_or(0.0);
                preference(b)
                    .total_cmp(&preference(a))
                    .then_with(|| a.job_tasks.cmp(&b.job_tasks))
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

    use muster_model::{Resources, TaskGroup};

    use super::*;
    use crate::plan::AgentView;

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
            group_tasks: job_tasks,
            affinity: None,
            spread: None,
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
}
