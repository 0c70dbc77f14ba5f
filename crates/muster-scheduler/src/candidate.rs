//! [`Candidate`]: an agent a slot's task fits on, as a [`Placer`](crate::Placer) is shown it,
//! with what the slot's group makes of it (its tasks there, its affinities and spreads) and
//! the one way the built-in placers combine those into a score.

use muster_model::{AgentId, Resources, utilization};

use crate::plan::AgentView;
use crate::reconcile::SlotRequest;

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
    /// Those of them that belong to the slot's group, less those this plan stops.
    pub group_tasks: usize,
    /// How the group's affinities rank the agent, from -1 to 1 (see
    /// [`ranking::affinity`](crate::ranking::affinity)); `None` if it has none.
    pub affinity: Option<f64>,
    /// How the group's spreads rank the agent, from -1 to 1 (see
    /// [`ranking::spread`](crate::ranking::spread)); `None` if it has none.
    pub spread: Option<f64>,
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

    /// The mean of the group's preferences that apply to this agent: its affinities and its
    /// spreads. `None` if the group has neither.
    pub fn preference(&self) -> Option<f64> {
        mean(None, [self.affinity, self.spread])
    }

    /// A placer's own score for this agent, `base`, ranked with the job's anti-affinity
    /// ([`ranking::anti_affinity`](crate::ranking::anti_affinity)), the group's affinities
    /// and its spreads: the mean of `base` and each of them that applies, as Nomad ranks.
    pub fn score(&self, base: f64, slot: &SlotRequest) -> f64 {
        let anti_affinity = crate::ranking::anti_affinity(self.group_tasks, slot.group.count);
        mean(Some(base), [anti_affinity, self.affinity, self.spread]).unwrap_or(base)
    }
}

/// The mean of `first` and `rest`, of those that are set.
fn mean<const N: usize>(first: Option<f64>, rest: [Option<f64>; N]) -> Option<f64> {
    let (sum, n) = std::iter::once(first)
        .chain(rest)
        .flatten()
        .fold((0.0, 0u32), |(sum, n), score| (sum + score, n + 1));
    (n > 0).then(|| sum / f64::from(n))
}
