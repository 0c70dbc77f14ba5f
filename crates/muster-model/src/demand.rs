//! [`Demand`]: what a task group could not place, which the blocked-queue matches against
//! capacity changes (or, held back by a quota, against its namespace's changes), and
//! [`blocked_description`]: why an evaluation with such demands is blocked.

use crate::placement::Constraint;
use crate::resources::Resources;

/// The longest quota reason [`blocked_description`] repeats, in bytes: a remote scheduler
/// writes its demands, and an evaluation's description is for people.
const MAX_REASON: usize = 256;

/// What one task group with unplaced tasks needs: the resources of one task and where it may
/// run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Demand {
    /// The resources one task needs.
    pub resources: Resources,
    /// Conditions on the agent's attributes; all must admit.
    pub constraints: Vec<Constraint>,
    /// Why its tasks were held back by their namespace's quota rather than for want of room
    /// (`namespace "team-a" is at its quota of 2 tasks (it would have 3)`); `None`: no agent
    /// had room. A demand held back by a quota waits for its namespace (a task of it ending,
    /// its quota changing), not for capacity.
    pub over_quota: Option<String>,
    /// For a group placed all at once ([`TaskGroup::gang`](crate::TaskGroup::gang)): how many
    /// tasks must find room together; 0 for a group whose tasks are placed one by one.
    pub gang: u32,
    /// Of a gang's tasks, how many found room when it was planned.
    pub gang_fitting: u32,
}

/// Why an evaluation that left `demands` unplaced is blocked, for its `status_description`:
/// each quota that held tasks back, each group placed all at once that did not fit whole,
/// then how many other task groups found no room (`namespace "team-a" is at its quota of 2
/// tasks (it would have 3)`, `a group of 4 tasks placed all at once found room for 3`,
/// `2 task groups did not fit`).
pub fn blocked_description(demands: &[Demand]) -> String {
    let mut reasons: Vec<String> = Vec::new();
    for demand in demands {
        if let Some(reason) = demand.over_quota.as_deref() {
            let reason = clipped(reason);
            if !reasons.iter().any(|r| r == reason) {
                reasons.push(reason.to_owned());
            }
        }
    }
    let no_room = || demands.iter().filter(|d| d.over_quota.is_none());
    reasons.extend(no_room().filter(|d| d.gang > 0).map(|d| {
        format!(
            "a group of {} tasks placed all at once found room for {}",
            d.gang, d.gang_fitting
        )
    }));
    let one_by_one = no_room().filter(|d| d.gang == 0).count();
    if one_by_one > 0 || reasons.is_empty() {
        let groups = if one_by_one == 1 { "group" } else { "groups" };
        reasons.push(format!("{one_by_one} task {groups} did not fit"));
    }
    reasons.join("; ")
}

/// `reason`, cut at a character boundary to at most [`MAX_REASON`] bytes.
fn clipped(reason: &str) -> &str {
    if reason.len() <= MAX_REASON {
        return reason;
    }
    let mut end = MAX_REASON;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demand(over_quota: Option<&str>) -> Demand {
        Demand {
            over_quota: over_quota.map(str::to_owned),
            ..Demand::default()
        }
    }

    #[test]
    fn a_blocked_evaluation_names_its_quotas_then_what_did_not_fit() {
        assert_eq!(
            blocked_description(&[demand(None), demand(None)]),
            "2 task groups did not fit"
        );
        let quota = "namespace \"team-a\" is at its quota of 2 tasks (it would have 3)";
        assert_eq!(
            blocked_description(&[demand(Some(quota)), demand(Some(quota))]),
            quota
        );
        assert_eq!(
            blocked_description(&[demand(None), demand(Some(quota))]),
            format!("{quota}; 1 task group did not fit")
        );
        let long = "é".repeat(MAX_REASON);
        assert!(blocked_description(&[demand(Some(&long))]).len() <= MAX_REASON);
    }

    #[test]
    fn a_gang_says_how_much_of_it_found_room() {
        let gang = Demand {
            gang: 4,
            gang_fitting: 3,
            ..Demand::default()
        };
        assert_eq!(
            blocked_description(std::slice::from_ref(&gang)),
            "a group of 4 tasks placed all at once found room for 3"
        );
        assert_eq!(
            blocked_description(&[gang, demand(None)]),
            "a group of 4 tasks placed all at once found room for 3; 1 task group did not fit"
        );
    }
}
