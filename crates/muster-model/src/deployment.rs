//! Deployments: how a new version of a service or system job replaces the tasks of the last
//! one, safely (Nomad's `update` block and deployments).
//!
//! A group's [`UpdatePolicy`] says how: at most `max_parallel` of its tasks are replaced at a
//! time, each new task must stay healthy for `min_healthy_time` (within `healthy_deadline`)
//! before the next is replaced, and `canary` new tasks can first run beside the old ones until
//! the deployment is promoted. Every stored version of such a job starts a [`Deployment`],
//! kept in the registry, which the leading master watches: it records which new tasks turned
//! healthy, promotes canaries (`auto_promote`), fails the deployment when a new task fails or
//! it stops making progress (`progress_deadline`), and with `auto_revert` goes back to the
//! last version that deployed well. Schedulers read the job's deployment to know how many
//! tasks they may replace now ([`Deployment::may_replace`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::job::{Job, SchedulerType};
pub use crate::update::{HealthCriteria, UpdatePolicy};

/// Where a deployment is in its life.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum DeploymentStatus {
    /// Replacing tasks (or waiting for its canaries to be promoted).
    #[default]
    Running,
    /// Held by an operator: nothing more is replaced until it is resumed.
    Paused,
    /// Every group's new tasks are healthy: the version deployed well.
    Successful,
    /// A new task failed, or the deployment missed a deadline, or an operator failed it.
    Failed,
    /// A newer version of the job (or its stop) took its place.
    Cancelled,
}

impl DeploymentStatus {
    /// Its name in the API and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            DeploymentStatus::Running => "running",
            DeploymentStatus::Paused => "paused",
            DeploymentStatus::Successful => "successful",
            DeploymentStatus::Failed => "failed",
            DeploymentStatus::Cancelled => "cancelled",
        }
    }

    /// Whether it may still change tasks: running or paused.
    pub fn is_active(self) -> bool {
        matches!(self, DeploymentStatus::Running | DeploymentStatus::Paused)
    }
}

/// One version of a job being deployed, as the registry keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deployment {
    /// `{job}.v{version}`: one deployment per job version.
    pub id: String,
    /// The job's id.
    pub job: String,
    /// The version it deploys.
    pub job_version: u64,
    /// Where it is.
    pub status: DeploymentStatus,
    /// Why it is there, for people (`canaries await promotion`, `task web.fe[1]-… failed`).
    pub description: String,
    /// Its groups, by name: those of the job with an update policy.
    pub groups: BTreeMap<String, DeploymentGroup>,
    /// When it began, in milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// When it fails if no new task has turned healthy by then, in milliseconds since the
    /// Unix epoch; 0: no deadline.
    pub progress_by_ms: u64,
    /// The version it went back to, if it failed and reverted.
    #[serde(default)]
    pub reverted_to: Option<u64>,
    /// It rolls back to a version that deployed well, after a failed deployment: it has no
    /// canaries, and is not rolled back in turn.
    #[serde(default)]
    pub rollback: bool,
    /// The registry index of its last change.
    pub modify_index: u64,
}

/// One group of a [`Deployment`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentGroup {
    /// Its update policy at the deployed version.
    pub update: UpdatePolicy,
    /// Its tasks at the deployed version (a system group's: 0, as many as agents).
    pub desired_total: u32,
    /// Its canaries.
    pub desired_canaries: u32,
    /// Whether its canaries were promoted (true when it has none).
    pub promoted: bool,
    /// Its new tasks that stayed healthy for `min_healthy_time`, by id.
    pub healthy: BTreeSet<String>,
    /// Its new tasks that failed or missed their healthy deadline, by id.
    pub unhealthy: BTreeSet<String>,
}

/// The id of the deployment of `job`'s version `version`.
pub fn deployment_id(job: &str, version: u64) -> String {
    format!("{job}.v{version}")
}

impl Deployment {
    /// The deployment `job`, just stored at its version, starts, at `now_ms`: its groups are
    /// those with an update policy; `None` for a batch job, a stopped one, or one without
    /// update policies. A group has canaries only if its definition changed with this version
    /// (not for a job's first version, nor for a change of count alone).
    pub fn of(job: &Job, now_ms: u64) -> Option<Deployment> {
        if job.stopped || job.scheduler == SchedulerType::Batch {
            return None;
        }
        let groups: BTreeMap<String, DeploymentGroup> = job
            .groups
            .iter()
            .filter_map(|g| {
                let update = g.update?;
                // Canaries try a changed definition beside the old one: a first version, or
                // a change of count alone, has none to try it against.
                let changed = job.version > 1 && g.spec_version == job.version;
                let canaries = if changed { update.canary } else { 0 };
                Some((
                    g.name.clone(),
                    DeploymentGroup {
                        update,
                        desired_total: g.count,
                        desired_canaries: canaries,
                        promoted: canaries == 0,
                        healthy: BTreeSet::new(),
                        unhealthy: BTreeSet::new(),
                    },
                ))
            })
            .collect();
        if groups.is_empty() {
            return None;
        }
        let awaiting = groups.values().any(|g| !g.promoted);
        let mut deployment = Deployment {
            id: deployment_id(&job.name, job.version),
            job: job.name.clone(),
            job_version: job.version,
            status: DeploymentStatus::Running,
            description: if awaiting {
                "placing canaries".into()
            } else {
                "replacing tasks".into()
            },
            groups,
            created_ms: now_ms,
            progress_by_ms: 0,
            reverted_to: None,
            rollback: false,
            modify_index: 0,
        };
        deployment.progress_by_ms = deployment
            .progress_deadline_ms()
            .map_or(0, |ms| now_ms.saturating_add(ms));
        Some(deployment)
    }

    /// The shortest progress deadline of its groups, in milliseconds, if any has one.
    pub fn progress_deadline_ms(&self) -> Option<u64> {
        self.groups
            .values()
            .map(|g| g.update.progress_deadline_ms)
            .filter(|ms| *ms > 0)
            .min()
    }

    /// Drops its canaries (a revert to a version that deployed well needs none): every group
    /// counts as promoted.
    pub fn skip_canaries(&mut self) {
        for group in self.groups.values_mut() {
            group.desired_canaries = 0;
            group.promoted = true;
        }
        self.description = "replacing tasks".into();
    }

    /// How many of `group`'s outdated tasks a scheduler may replace now, with `in_flight` of
    /// its slots already being replaced (a new task placed and not yet counted healthy, or no
    /// task at all), and `current` of its tasks already at the new definition: `None` when the
    /// deployment does not limit the group (it has no update policy, or the deployment ended
    /// well or was superseded); none while it is paused or failed. A system group's
    /// canaries are its first replacements; a counted group's run beside the old tasks in
    /// slots of their own ([`canary_slots`](Self::canary_slots)), and nothing is replaced
    /// until they are promoted.
    pub fn may_replace(
        &self,
        group: &str,
        system: bool,
        in_flight: usize,
        current: usize,
    ) -> Option<usize> {
        let g = self.groups.get(group)?;
        match self.status {
            DeploymentStatus::Running => {}
            DeploymentStatus::Paused | DeploymentStatus::Failed => return Some(0),
            // Ended well, or superseded: it limits nothing.
            DeploymentStatus::Successful | DeploymentStatus::Cancelled => return None,
        }
        if !g.promoted {
            if !system {
                return Some(0);
            }
            return Some((g.desired_canaries as usize).saturating_sub(current));
        }
        Some((g.update.max_parallel as usize).saturating_sub(in_flight))
    }

    /// How many canary slots `group` has now (`{job}.{group}[canary-N]`): its canaries, while
    /// they await promotion and the deployment is running or paused; none for a system group.
    pub fn canary_slots(&self, group: &str, system: bool) -> usize {
        match self.groups.get(group) {
            Some(g) if !system && !g.promoted && self.status.is_active() => {
                g.desired_canaries as usize
            }
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::TaskGroup;

    fn job(scheduler: SchedulerType, update: Option<UpdatePolicy>) -> Job {
        Job {
            name: "web".into(),
            priority: 50,
            scheduler,
            named_scheduler: None,
            groups: vec![TaskGroup {
                name: "fe".into(),
                count: 3,
                update,
                spec_version: 4,
                ..TaskGroup::default()
            }],
            stopped: false,
            version: 4,
        }
    }

    #[test]
    fn a_deployment_limits_replacements_by_max_parallel_and_canaries() {
        let canary = UpdatePolicy {
            max_parallel: 2,
            canary: 1,
            ..UpdatePolicy::default()
        };
        assert!(Deployment::of(&job(SchedulerType::Batch, Some(canary)), 0).is_none());
        assert!(Deployment::of(&job(SchedulerType::Service, None), 0).is_none());
        let Some(mut d) = Deployment::of(&job(SchedulerType::Service, Some(canary)), 1_000) else {
            panic!("a service job with an update policy deploys")
        };
        assert_eq!(d.id, "web.v4");
        assert_eq!(d.progress_by_ms, 1_000 + 600_000);
        // Canaries first: nothing replaced, one canary slot.
        assert_eq!(d.may_replace("fe", false, 0, 0), Some(0));
        assert_eq!(d.canary_slots("fe", false), 1);
        // A system group's canaries are its first replacements.
        assert_eq!(d.may_replace("fe", true, 0, 0), Some(1));
        assert_eq!(d.may_replace("fe", true, 1, 1), Some(0));
        // Promoted: max_parallel, less what is in flight.
        if let Some(g) = d.groups.get_mut("fe") {
            g.promoted = true;
        }
        assert_eq!(d.canary_slots("fe", false), 0);
        assert_eq!(d.may_replace("fe", false, 0, 1), Some(2));
        assert_eq!(d.may_replace("fe", false, 1, 1), Some(1));
        assert_eq!(d.may_replace("fe", false, 3, 1), Some(0));
        assert_eq!(d.may_replace("be", false, 0, 0), None);
        // A first version (or a change of count alone) has no canaries.
        let mut first = job(SchedulerType::Service, Some(canary));
        first.version = 1;
        first.groups[0].spec_version = 1;
        let fresh = Deployment::of(&first, 0).map(|d| d.canary_slots("fe", false));
        assert_eq!(fresh, Some(0));
        // Paused or failed: nothing; ended well: no limit.
        d.status = DeploymentStatus::Paused;
        assert_eq!(d.may_replace("fe", false, 0, 0), Some(0));
        d.status = DeploymentStatus::Failed;
        assert_eq!(d.may_replace("fe", false, 0, 0), Some(0));
        d.status = DeploymentStatus::Successful;
        assert_eq!(d.may_replace("fe", false, 3, 0), None);
    }

    #[test]
    fn update_policies_name_what_is_wrong() {
        let fine = UpdatePolicy::default();
        assert_eq!(fine.check(), Ok(()));
        let none = UpdatePolicy {
            max_parallel: 0,
            ..fine
        };
        assert_eq!(none.check().unwrap_err().0, "max_parallel");
        let hasty = UpdatePolicy {
            healthy_deadline_ms: 5_000,
            ..fine
        };
        assert_eq!(hasty.check().unwrap_err().0, "healthy_deadline");
        let lonely = UpdatePolicy {
            auto_promote: true,
            ..fine
        };
        assert_eq!(lonely.check().unwrap_err().0, "auto_promote");
    }
}
