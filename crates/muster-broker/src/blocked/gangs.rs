//! Evaluations that wait for room for a whole group at once ([`Demand::gang`]): released when
//! the agents whose free room changed since it was planned, with the tasks that fitted then,
//! can take every task of the group together, not at the first agent with room for one.

use std::collections::{BTreeMap, HashMap};

use muster_model::{AgentId, Constraint, Demand, Resources};

/// One gang's wait: what each of its tasks needs, how many must fit, and the room seen since.
#[derive(Debug)]
pub(super) struct GangWait {
    resources: Resources,
    constraints: Vec<Constraint>,
    /// Tasks that must fit together.
    wanted: u32,
    /// Of those, how many fitted when it was planned.
    fitting: u32,
    /// Per agent whose free room changed since: how many of its tasks fit there now.
    room: HashMap<AgentId, u32>,
}

impl GangWait {
    /// The wait for `demand`, if it is a gang's demand for room (not one held back by a
    /// quota).
    pub(super) fn of(demand: &Demand) -> Option<GangWait> {
        (demand.gang > 0 && demand.over_quota.is_none()).then(|| GangWait {
            resources: demand.resources.clone(),
            constraints: demand.constraints.clone(),
            wanted: demand.gang,
            fitting: demand.gang_fitting.min(demand.gang),
            room: HashMap::new(),
        })
    }

    /// Notes that `agent`, with `attributes`, now has `free`; whether the whole gang may fit
    /// now. An overestimate (an agent counted among those that fitted may be counted again)
    /// releases early, never late: the scheduler plans again and blocks again if it must.
    pub(super) fn room_changed(
        &mut self,
        agent: &AgentId,
        attributes: &BTreeMap<String, String>,
        free: &Resources,
    ) -> bool {
        if Constraint::all_admit(&self.constraints, attributes) {
            let fits = tasks_fitting(&self.resources, free);
            match self.room.get_mut(agent) {
                Some(room) => *room = fits,
                None => {
                    self.room.insert(agent.clone(), fits);
                }
            }
        }
        self.fits()
    }

    /// Whether the tasks that fitted and the room seen since add up to the whole gang.
    pub(super) fn fits(&self) -> bool {
        let seen: u64 = self.room.values().map(|&n| u64::from(n)).sum();
        u64::from(self.fitting) + seen >= u64::from(self.wanted)
    }
}

/// Notes each of `changes` (an agent, its attributes, its free room now) in each of `gangs`;
/// whether one of them may now fit whole.
pub(super) fn room_since<'a>(
    changes: impl Iterator<Item = (&'a AgentId, &'a BTreeMap<String, String>, &'a Resources)>,
    gangs: &mut [GangWait],
) -> bool {
    let mut fits = false;
    for (agent, attributes, free) in changes {
        for gang in gangs.iter_mut() {
            fits |= gang.room_changed(agent, attributes, free);
        }
    }
    fits
}

/// How many tasks needing `need` fit in `free` together, by the model's fit rule.
fn tasks_fitting(need: &Resources, free: &Resources) -> u32 {
    if !need.fits_in(free) {
        return 0;
    }
    let by_mem = free.mem_mb.checked_div(need.mem_mb).unwrap_or(u64::MAX);
    let by_cpus = if need.cpus > 0.0 && need.cpus.is_finite() {
        (free.cpu_headroom() / need.cpus).floor().max(1.0) as u64
    } else {
        u64::MAX
    };
    u32::try_from(by_mem.min(by_cpus).max(1)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resources(cpus: f64, mem_mb: u64) -> Resources {
        Resources { cpus, mem_mb }
    }

    #[test]
    fn a_gang_fits_once_the_room_seen_adds_up() {
        let demand = Demand {
            resources: resources(1.0, 100),
            gang: 4,
            gang_fitting: 1,
            ..Demand::default()
        };
        let mut wait = GangWait::of(&demand).expect("a gang's demand");
        let none = BTreeMap::new();
        let (a, b) = (AgentId("a".into()), AgentId("b".into()));
        assert!(!wait.room_changed(&a, &none, &resources(1.5, 1_000)));
        // The same agent again counts once, with its room now.
        assert!(!wait.room_changed(&a, &none, &resources(2.0, 1_000)));
        assert!(wait.room_changed(&b, &none, &resources(4.0, 150)));
        assert!(GangWait::of(&Demand::default()).is_none());
        assert_eq!(
            tasks_fitting(&resources(0.5, 64), &resources(2.0, 1_000)),
            4
        );
        assert_eq!(
            tasks_fitting(&resources(0.5, 64), &resources(0.1, 1_000)),
            0
        );
    }
}
