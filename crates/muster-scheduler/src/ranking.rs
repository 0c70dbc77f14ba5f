//! How a slot's candidates rank beyond their fit, as Nomad's ranking does: the job's
//! anti-affinity (an agent that already runs tasks of the slot's group ranks lower), the
//! group's affinities, and its spreads. Each is a score from -1 to 1, worked out by the search
//! for each [`Candidate`](crate::Candidate); the built-in placers take the mean of those that
//! apply and their own score ([`Candidate::score`](crate::Candidate::score)).

use std::collections::BTreeMap;

use foldhash::HashMap;

use muster_model::{Affinity, Spread, TaskGroup};

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

/// A group's tasks per value of one spread's attribute.
#[derive(Clone, Debug)]
pub struct SpreadCounts {
    /// The spread.
    attribute: String,
    /// Tasks on agents with each value.
    by_value: HashMap<String, usize>,
}

impl SpreadCounts {
    /// No task counted yet, for `spread`.
    pub fn new(spread: &Spread) -> Self {
        SpreadCounts {
            attribute: spread.attribute.clone(),
            by_value: HashMap::default(),
        }
    }

    /// Counts `n` more tasks on an agent with `attributes` (none if it lacks the attribute).
    pub fn add(&mut self, attributes: &BTreeMap<String, String>, n: usize) {
        if let Some(value) = attributes.get(&self.attribute) {
            // The value is copied only the first time it is seen.
            match self.by_value.get_mut(value.as_str()) {
                Some(count) => *count += n,
                None => {
                    self.by_value.insert(value.clone(), n);
                }
            }
        }
    }

    /// The tasks on agents with `value`.
    fn on(&self, value: &str) -> usize {
        self.by_value.get(value).copied().unwrap_or(0)
    }
}

/// The spreads' score of an agent with `attributes` for a task of `group`, given the group's
/// tasks so far (`counts`, one per spread in order), from -1 to 1: each spread's, weighted.
/// `None` for a group without spreads.
///
/// One spread's score: an agent without the attribute scores -1. Otherwise its value's share
/// of the group's count is its target's percentage (values the targets do not list share
/// what is left of 100 %, together), or with no targets an even share of the values that
/// hold tasks and this one. Below its share the score is how far below, as a fraction of the
/// share (1 when it holds none); at or above it, the score is negative, -1 at worst.
pub fn spread(
    group: &TaskGroup,
    counts: &[SpreadCounts],
    attributes: &BTreeMap<String, String>,
) -> Option<f64> {
    if group.spreads.is_empty() {
        return None;
    }
    let count = f64::from(group.count.max(1));
    let (mut weighted, mut weights) = (0.0, 0.0);
    for (spread, counts) in group.spreads.iter().zip(counts) {
        let weight = f64::from(spread.weight);
        weights += weight;
        let Some(value) = attributes.get(&spread.attribute) else {
            weighted -= weight;
            continue;
        };
        let (desired, used) = match spread.target_percent(value) {
            Some((percent, true)) => (count * f64::from(percent) / 100.0, counts.on(value)),
            Some((percent, false)) => {
                let unlisted: usize = counts
                    .by_value
                    .iter()
                    .filter(|(v, _)| !spread.targets.iter().any(|t| &t.value == *v))
                    .map(|(_, n)| n)
                    .sum();
                (count * f64::from(percent) / 100.0, unlisted)
            }
            None => {
                // One lookup: the value's tasks, and whether it is among the values seen.
                let held = counts.by_value.get(value.as_str()).copied();
                let values = counts.by_value.len() + usize::from(held.is_none());
                (count / values as f64, held.unwrap_or(0))
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
    use muster_model::{ConstraintOp, SpreadTarget};

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

    #[test]
    fn a_value_below_its_target_ranks_above_one_at_it() {
        let group = zones(4, &[("a", 50), ("b", 25)]);
        let mut counts = vec![SpreadCounts::new(&group.spreads[0])];
        // a holds 2 of its 2, b 0 of its 1; the unlisted values share 1.
        counts[0].add(&attributes("a"), 2);
        let score = |counts: &[SpreadCounts], zone: &str| {
            spread(&group, counts, &attributes(zone)).unwrap_or(f64::NAN)
        };
        assert_eq!(score(&counts, "b"), 1.0);
        assert_eq!(score(&counts, "c"), 1.0);
        assert_eq!(score(&counts, "a"), -0.5);
        counts[0].add(&attributes("c"), 1);
        // c and d share the unlisted 25 %: both are now at it.
        assert_eq!(score(&counts, "d"), -1.0);
        assert_eq!(spread(&group, &counts, &BTreeMap::new()), Some(-1.0));
    }

    #[test]
    fn without_targets_values_share_evenly() {
        let group = zones(6, &[]);
        let mut counts = vec![SpreadCounts::new(&group.spreads[0])];
        counts[0].add(&attributes("a"), 2);
        counts[0].add(&attributes("b"), 1);
        let score = |zone: &str| spread(&group, &counts, &attributes(zone)).unwrap_or(f64::NAN);
        // Three values with c: 2 each.
        assert_eq!(score("c"), 1.0);
        // Two values: 3 each.
        assert!((score("b") - 2.0 / 3.0).abs() < 1e-9);
        assert!((score("a") - 1.0 / 3.0).abs() < 1e-9);
    }
}
