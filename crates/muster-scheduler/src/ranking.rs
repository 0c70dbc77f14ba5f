//! How a slot's candidates rank beyond their fit, as Nomad's ranking does: the job's
//! anti-affinity (an agent that already runs tasks of the slot's group ranks lower), the
//! group's affinities, and its spreads. Each is a score from -1 to 1, worked out by the search
//! for each [`Candidate`](crate::Candidate); the built-in placers take the mean of those that
//! apply and their own score ([`Candidate::score`](crate::Candidate::score)).

use std::collections::BTreeMap;
use std::sync::Arc;

use muster_model::{Affinity, Spread, TaskGroup};

use crate::plan::AttributeColumn;

/// The job anti-affinity of an agent that already runs `group_tasks` of a group of `count`
/// tasks: none on an agent without any, and otherwise `-(group_tasks + 1) / count` (Nomad's
/// penalty), at least -1.
pub fn anti_affinity(group_tasks: usize, count: u32) -> Option<f64> {
    (group_tasks > 0).then(|| (-((group_tasks + 1) as f64) / f64::from(count.max(1))).max(-1.0))
}

/// The affinities' score of an agent with `attributes`: the weights of those it matches over
/// the sum of every weight's size, from -1 to 1. `None` for a group without affinities.
pub fn affinity(affinities: &[Affinity], attributes: &BTreeMap<String, String>) -> Option<f64> {
    if affinities.is_empty() {
        return None;
    }
    let total: f64 = affinities.iter().map(|a| f64::from(a.weight).abs()).sum();
    let matched: f64 = affinities
        .iter()
        .filter(|a| a.matches(attributes))
        .map(|a| f64::from(a.weight))
        .sum();
    Some(if total > 0.0 { matched / total } else { 0.0 })
}

/// A group's tasks per value of one spread's attribute, over the agents of one list (the
/// attribute read from its [`AttributeColumn`]).
#[derive(Clone, Debug)]
pub struct SpreadCounts {
    /// The agents' values.
    column: Arc<AttributeColumn>,
    /// Tasks on agents with each value, by the value's number in `column`.
    by_value: Vec<usize>,
    /// How many values hold a task.
    held: usize,
    /// Tasks on agents whose value the spread's targets do not list.
    unlisted: usize,
}

impl SpreadCounts {
    /// No task counted yet, on agents whose values are `column`'s.
    pub fn new(column: Arc<AttributeColumn>) -> Self {
        SpreadCounts {
            by_value: vec![0; column.values()],
            column,
            held: 0,
            unlisted: 0,
        }
    }

    /// Counts `n` more tasks of `spread` on the agent at `at` (none if it lacks the
    /// attribute).
    pub fn add(&mut self, spread: &Spread, at: usize, n: usize) {
        let Some(number) = self.column.number_at(at) else {
            return;
        };
        let Some(count) = self.by_value.get_mut(number as usize) else {
            return;
        };
        if *count == 0 && n > 0 {
            self.held += 1;
        }
        *count += n;
        let value = self.column.value(number).unwrap_or_default();
        if let Some((_, false)) = spread.target_percent(value) {
            self.unlisted += n;
        }
    }

    /// The tasks on agents with the value numbered `number`.
    fn on(&self, number: u32) -> usize {
        self.by_value.get(number as usize).copied().unwrap_or(0)
    }
}

/// The spreads' score of the agent at `at` for a task of `group`, given the group's tasks so
/// far (`counts`, one per spread in order), from -1 to 1: each spread's, weighted. `None` for
/// a group without spreads.
///
/// One spread's score: an agent without the attribute scores -1. Otherwise its value's share
/// of the group's count is its target's percentage (values the targets do not list share
/// what is left of 100 %, together), or with no targets an even share of the values that
/// hold tasks and this one. Below its share the score is how far below, as a fraction of the
/// share (1 when it holds none); at or above it, the score is negative, -1 at worst.
pub fn spread(group: &TaskGroup, counts: &[SpreadCounts], at: usize) -> Option<f64> {
    if group.spreads.is_empty() {
        return None;
    }
    let count = f64::from(group.count.max(1));
    let (mut weighted, mut weights) = (0.0, 0.0);
    for (spread, counts) in group.spreads.iter().zip(counts) {
        let weight = f64::from(spread.weight);
        weights += weight;
        let Some(number) = counts.column.number_at(at) else {
            weighted -= weight;
            continue;
        };
        let value = counts.column.value(number).unwrap_or_default();
        let (desired, used) = match spread.target_percent(value) {
            Some((percent, true)) => (count * f64::from(percent) / 100.0, counts.on(number)),
            Some((percent, false)) => (count * f64::from(percent) / 100.0, counts.unlisted),
            None => {
                let held = counts.on(number);
                let values = counts.held + usize::from(held == 0);
                (count / values as f64, held)
            }
        };
        weighted += weight * boost(desired, used as f64);
    }
    Some(if weights > 0.0 {
        weighted / weights
    } else {
        0.0
    })
}

/// How much one more task on a value holding `used` of its `desired` tasks is wanted, from
/// -1 to 1.
fn boost(desired: f64, used: f64) -> f64 {
    if desired <= 0.0 {
        -1.0
    } else if used < desired {
        (desired - used) / desired
    } else {
        (-(used - desired + 1.0) / desired).max(-1.0)
    }
}

#[cfg(test)]
mod tests {
    use muster_model::{AgentId, ConstraintOp, Resources, SpreadTarget};

    use crate::plan::{AgentView, TaskView};

    use super::*;

    fn attributes(zone: &str) -> BTreeMap<String, String> {
        BTreeMap::from([("zone".to_owned(), zone.to_owned())])
    }

    fn zones(count: u32, targets: &[(&str, u8)]) -> TaskGroup {
        TaskGroup {
            name: "g".into(),
            count,
            spreads: vec![Spread {
                attribute: "zone".into(),
                weight: 50,
                targets: targets
                    .iter()
                    .map(|(value, percent)| SpreadTarget {
                        value: (*value).into(),
                        percent: *percent,
                    })
                    .collect(),
            }],
            ..TaskGroup::default()
        }
    }

    #[test]
    fn anti_affinity_grows_with_the_group_tasks_already_there() {
        assert_eq!(anti_affinity(0, 3), None);
        assert_eq!(anti_affinity(1, 4), Some(-0.5));
        assert_eq!(anti_affinity(5, 3), Some(-1.0));
    }

    #[test]
    fn affinities_weigh_what_matches() {
        let on = |value: &str, weight| Affinity {
            attribute: "zone".into(),
            op: ConstraintOp::Equal,
            value: value.into(),
            weight,
        };
        let both = [on("a", 75), on("b", -25)];
        assert_eq!(affinity(&both, &attributes("a")), Some(0.75));
        assert_eq!(affinity(&both, &attributes("b")), Some(-0.25));
        assert_eq!(affinity(&both, &attributes("c")), Some(0.0));
        assert_eq!(affinity(&[], &attributes("a")), None);
    }

    /// Agents in zones `a` to `d` (positions 0 to 3) and one without a zone (4), and the
    /// column of their zones.
    fn zone_column() -> Arc<AttributeColumn> {
        let agents: Vec<Arc<AgentView>> = ["a", "b", "c", "d", ""]
            .iter()
            .enumerate()
            .map(|(n, zone)| {
                let attributes = if zone.is_empty() {
                    BTreeMap::new()
                } else {
                    attributes(zone)
                };
                Arc::new(AgentView::new(
                    AgentId(format!("agent-{n}")),
                    attributes,
                    Resources::default(),
                    Vec::<TaskView>::new(),
                ))
            })
            .collect();
        Arc::new(AttributeColumn::build("zone", &agents))
    }

    const A: usize = 0;
    const B: usize = 1;
    const C: usize = 2;
    const D: usize = 3;
    const NO_ZONE: usize = 4;

    #[test]
    fn a_value_below_its_target_ranks_above_one_at_it() {
        let group = zones(4, &[("a", 50), ("b", 25)]);
        let spread_of = &group.spreads[0];
        let mut counts = vec![SpreadCounts::new(zone_column())];
        // a holds 2 of its 2, b 0 of its 1; the unlisted values share 1.
        counts[0].add(spread_of, A, 2);
        let score =
            |counts: &[SpreadCounts], at: usize| spread(&group, counts, at).unwrap_or(f64::NAN);
        assert_eq!(score(&counts, B), 1.0);
        assert_eq!(score(&counts, C), 1.0);
        assert_eq!(score(&counts, A), -0.5);
        counts[0].add(spread_of, C, 1);
        // c and d share the unlisted 25 %: both are now at it.
        assert_eq!(score(&counts, D), -1.0);
        assert_eq!(spread(&group, &counts, NO_ZONE), Some(-1.0));
    }

    #[test]
    fn without_targets_values_share_evenly() {
        let group = zones(6, &[]);
        let spread_of = &group.spreads[0];
        let mut counts = vec![SpreadCounts::new(zone_column())];
        counts[0].add(spread_of, A, 2);
        counts[0].add(spread_of, B, 1);
        let score = |at: usize| spread(&group, &counts, at).unwrap_or(f64::NAN);
        // Three values with c: 2 each.
        assert_eq!(score(C), 1.0);
        // Two values: 3 each.
        assert!((score(B) - 2.0 / 3.0).abs() < 1e-9);
        assert!((score(A) - 1.0 / 3.0).abs() < 1e-9);
    }
}
