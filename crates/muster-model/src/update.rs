//! A group's [`UpdatePolicy`] (Nomad's `update` block): how its tasks are replaced when its
//! job changes, and what healthy means for a new one ([`HealthCriteria`]). The deployment that
//! applies it is [`crate::deployment`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How a group's tasks are replaced when its job changes (Nomad's `update` block). The
/// defaults are those of a block that leaves a field out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct UpdatePolicy {
    /// Tasks replaced at a time (default 1).
    pub max_parallel: u32,
    /// New tasks placed beside the old ones first, until the deployment is promoted
    /// (default 0: none). For a system job: the agents whose task is replaced first.
    pub canary: u32,
    /// How long a new task must be healthy before it counts (default 10 s).
    pub min_healthy_time_ms: u64,
    /// How long a new task has to become healthy before it counts as unhealthy and fails the
    /// deployment (default 5 minutes).
    pub healthy_deadline_ms: u64,
    /// How long the deployment may go without a new task turning healthy before it fails
    /// (default 10 minutes; 0: no deadline).
    pub progress_deadline_ms: u64,
    /// A failed deployment goes back to the job's last version that deployed well.
    pub auto_revert: bool,
    /// Canaries are promoted once they are all healthy, without an operator.
    pub auto_promote: bool,
    /// What healthy means for a new task.
    pub health: HealthCriteria,
}

impl Default for UpdatePolicy {
    fn default() -> Self {
        UpdatePolicy {
            max_parallel: 1,
            canary: 0,
            min_healthy_time_ms: 10_000,
            healthy_deadline_ms: 5 * 60 * 1000,
            progress_deadline_ms: 10 * 60 * 1000,
            auto_revert: false,
            auto_promote: false,
            health: HealthCriteria::Checks,
        }
    }
}

impl UpdatePolicy {
    /// How long a new task must be healthy before it counts.
    pub fn min_healthy_time(&self) -> Duration {
        Duration::from_millis(self.min_healthy_time_ms)
    }

    /// How long a new task has to become healthy.
    pub fn healthy_deadline(&self) -> Duration {
        Duration::from_millis(self.healthy_deadline_ms)
    }

    /// Checks its fields; the error names the field and the problem.
    pub(crate) fn check(&self) -> Result<(), (&'static str, String)> {
        if !(1..=crate::lifecycle::MAX_COUNT).contains(&self.max_parallel) {
            return Err((
                "max_parallel",
                format!(
                    "{} is not within 1..={}",
                    self.max_parallel,
                    crate::lifecycle::MAX_COUNT
                ),
            ));
        }
        if self.canary > crate::lifecycle::MAX_COUNT {
            return Err((
                "canary",
                format!(
                    "{} is more than {}",
                    self.canary,
                    crate::lifecycle::MAX_COUNT
                ),
            ));
        }
        crate::lifecycle::check_duration("min_healthy_time", self.min_healthy_time_ms)?;
        crate::lifecycle::check_duration("healthy_deadline", self.healthy_deadline_ms)?;
        crate::lifecycle::check_duration("progress_deadline", self.progress_deadline_ms)?;
        if self.healthy_deadline_ms <= self.min_healthy_time_ms {
            return Err((
                "healthy_deadline",
                format!(
                    "{} ms must be more than min_healthy_time ({} ms)",
                    self.healthy_deadline_ms, self.min_healthy_time_ms
                ),
            ));
        }
        if self.progress_deadline_ms != 0 && self.progress_deadline_ms < self.healthy_deadline_ms {
            return Err((
                "progress_deadline",
                format!(
                    "{} ms must be 0 or at least healthy_deadline ({} ms)",
                    self.progress_deadline_ms, self.healthy_deadline_ms
                ),
            ));
        }
        if self.auto_promote && self.canary == 0 {
            return Err(("auto_promote", "there are no canaries to promote".into()));
        }
        Ok(())
    }
}

/// What healthy means for a deployment's new task.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthCriteria {
    /// Running, and every health check of its group passes (a group without checks: running).
    #[default]
    Checks,
    /// Running.
    TaskStates,
}
