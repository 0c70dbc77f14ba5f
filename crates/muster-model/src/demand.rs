//! [`Demand`]: what a task group could not place, which the blocked-queue matches against
//! capacity changes.

use crate::job::Constraint;
use crate::resources::Resources;

/// What one task group with unplaced tasks needs: the resources of one task and where it may
/// run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Demand {
    /// The resources one task needs.
    pub resources: Resources,
    /// Conditions on the agent's attributes; all must admit.
    pub constraints: Vec<Constraint>,
}
