//! The [`Scheduler`] trait, the [`Placer`] shortcut for writing one, and the built-in
//! [`binpack()`] and [`spread()`].
//!
//! A [`PlacingScheduler`] reconciles the evaluation's job ([`reconcile()`]), stops what must
//! stop, and asks its [`Placer`] to choose an agent for each missing slot among the
//! [`Candidate`]s: the agents whose attributes the group's constraints admit and whose free
//! resources, after the placements already in this plan, fit the task. A system slot only has
//! its own agent as a candidate. A slot with no candidate, or for which the placer chooses
//! none, counts towards the plan's unplaced [`Demand`]s.
//!
//! Resources held by tasks this plan stops are not reused by this plan's placements: the agent
//! still runs them until the stop reaches it, and the applier checks placements against what
//! the agents hold now.

use std::collections::{HashMap, HashSet};
use std::fmt;

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
}

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

/// An agent's standing while a plan is built.
#[derive(Debug)]
struct Standing<'a> {
    agent: &'a AgentView,
    used: Resources,
    tasks: usize,
    job_tasks: usize,
}

impl<'a> Standing<'a> {
    fn candidate(&self) -> Candidate<'a> {
        Candidate {
            agent: self.agent,
            used: self.used.clone(),
            free: self.agent.total.saturating_sub(&self.used),
            tasks: self.tasks,
            job_tasks: self.job_tasks,
        }
    }

    fn fits(&self, need: &Resources) -> bool {
        need.fits_in(&self.agent.total.saturating_sub(&self.used))
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
        place: Vec::new(),
        stop: reconciled.stop,
        unplaced: Vec::new(),
    };

    // Agents by id; an id listed twice counts once (the first).
    let mut agents: Vec<&AgentView> = snapshot.agents.iter().map(|a| &**a).collect();
    agents.sort_by(|a, b| a.id.cmp(&b.id));
    agents.dedup_by(|later, earlier| later.id == earlier.id);
    let mut standings: Vec<Standing<'_>> = agents
        .iter()
        .map(|agent| Standing {
            agent,
            used: agent.used().clone(),
            tasks: agent.live_tasks(),
            job_tasks: agent
                .tasks_of(&reconciled.job)
                .iter()
                .filter(|t| !t.state.is_terminal())
                .count(),
        })
        .collect();
    let position: HashMap<&AgentId, usize> = agents
        .iter()
        .enumerate()
        .map(|(i, agent)| (&agent.id, i))
        .collect();

    // Agents each group's constraints admit, worked out once per group.
    let mut eligible: HashMap<String, Vec<usize>> = HashMap::new();
    // Groups for which nothing fits any more: free capacity only shrinks while planning, so
    // their later (unpinned) slots need no search.
    let mut exhausted: HashSet<String> = HashSet::new();
    let mut unplaced_groups: HashSet<String> = HashSet::new();

    for slot in &reconciled.missing {
        let group = slot.group.name.as_str();
        let need = slot.resources();
        let mut fitting: Vec<usize> = Vec::new();
        match &slot.agent {
            Some(pinned) => {
                if let Some(&i) = position.get(pinned) {
                    let standing = &standings[i];
                    if standing.agent.eligible
                        && standing.agent.admits(slot.constraints())
                        && standing.fits(need)
                    {
                        fitting.push(i);
                    }
                }
            }
            None if exhausted.contains(group) => {}
            None => {
                let admitted = eligible.entry(group.to_owned()).or_insert_with(|| {
                    (0..standings.len())
                        .filter(|&i| {
                            let agent = standings[i].agent;
                            agent.eligible && agent.admits(slot.constraints())
                        })
                        .collect()
                });
                fitting.extend(
                    admitted
                        .iter()
                        .copied()
                        .filter(|&i| standings[i].fits(need)),
                );
                if fitting.is_empty() {
                    exhausted.insert(group.to_owned());
                }
            }
        }

        let chosen = if fitting.is_empty() {
            None
        } else {
            let candidates: Vec<Candidate<'_>> =
                fitting.iter().map(|&i| standings[i].candidate()).collect();
            let choice = placer.choose(slot, &candidates);
            let found = choice.as_ref().and_then(|id| {
                candidates
                    .iter()
                    .position(|c| c.id() == id)
                    .map(|at| fitting[at])
            });
            if let (Some(id), None) = (&choice, found) {
                tracing::warn!(slot = %slot.name, agent = %id, "placer chose an agent that is not a candidate");
            }
            found
        };

        match chosen {
            Some(i) => {
                let standing = &mut standings[i];
                standing.used = standing.used.saturating_add(need);
                standing.tasks += 1;
                standing.job_tasks += 1;
                plan.place.push(slot.placement(standing.agent.id.clone()));
            }
            None => {
                if unplaced_groups.insert(group.to_owned()) {
                    plan.unplaced.push(Demand {
                        resources: need.clone(),
                        constraints: slot.constraints().to_vec(),
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

/// Chooses the fitting agent that ends up most utilized, so that agents fill one after
/// another and whole agents stay free for large tasks. Ties go to the lowest agent id.
#[derive(Clone, Copy, Debug, Default)]
pub struct BinPack;

impl Placer for BinPack {
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

/// Chooses the fitting agent with the fewest tasks of the job, then the lowest utilization,
/// so that a job evens out over the cluster and concurrent schedulers rarely pick the same
/// agent (as in HashiCorp's "Nomad 2 million container challenge"). Ties go to the lowest agent id.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spread;

impl Placer for Spread {
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
            Vec::new(),
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
}
