//! The registry's part in deployments: each job's recent [`Deployment`]s, started with a new
//! version of the job, cancelled by a newer one or its stop, and moved on by the leading
//! master's watcher and by operators (promote, pause, resume, fail).

use std::collections::VecDeque;

use muster_model::{Deployment, DeploymentStatus};

use super::RegistryState;
use crate::types::{DeploymentChange, OpError, Outcome};

/// How many deployments of each job the registry keeps, newest last.
pub const DEPLOYMENTS_KEPT: usize = 5;

impl RegistryState {
    /// `job`'s deployments, oldest first.
    pub fn deployments_of(&self, job: &str) -> impl DoubleEndedIterator<Item = &Deployment> {
        self.deployments.get(job).into_iter().flatten()
    }

    /// `job`'s newest deployment.
    pub fn latest_deployment(&self, job: &str) -> Option<&Deployment> {
        self.deployments.get(job).and_then(VecDeque::back)
    }

    /// The deployment with this id (`{job}.v{version}`).
    pub fn deployment(&self, id: &str) -> Option<&Deployment> {
        let (job, _) = id.rsplit_once(".v")?;
        self.deployments_of(job).find(|d| d.id == id)
    }

    /// Every running or paused deployment.
    pub fn active_deployments(&self) -> impl Iterator<Item = &Deployment> {
        self.deployments
            .values()
            .filter_map(VecDeque::back)
            .filter(|d| d.status.is_active())
    }

    /// The newest version of `job` whose deployment succeeded, below `below`.
    pub fn stable_version(&self, job: &str, below: u64) -> Option<u64> {
        self.deployments_of(job)
            .rev()
            .find(|d| d.status == DeploymentStatus::Successful && d.job_version < below)
            .map(|d| d.job_version)
    }

    /// `job` stopped or changed at `index`: its running or paused deployment is cancelled,
    /// saying `why`.
    pub(super) fn cancel_deployments(&mut self, job: &str, why: &str, index: u64) {
        for deployment in self.deployments.get_mut(job).into_iter().flatten() {
            if deployment.status.is_active() {
                deployment.status = DeploymentStatus::Cancelled;
                deployment.description = why.to_owned();
                deployment.modify_index = index;
            }
        }
    }

    /// Starts the deployment of `job`'s stored version, begun at `at_ms`, if the job has
    /// update policies (without canaries for a `revert`); the one it supersedes is cancelled.
    pub(super) fn start_deployment(
        &mut self,
        job: &str,
        at_ms: u64,
        revert: bool,
        index: u64,
    ) -> Result<Outcome, OpError> {
        let stored = self
            .jobs
            .get(job)
            .ok_or_else(|| OpError::UnknownJob(job.to_owned()))?;
        let version = stored.version;
        let started = Deployment::of(stored, at_ms);
        self.cancel_deployments(job, &format!("superseded by version {version}"), index);
        let Some(mut deployment) = started else {
            return Ok(Outcome::Updated);
        };
        if revert {
            deployment.skip_canaries();
            deployment.rollback = true;
        }
        deployment.modify_index = index;
        let kept = self.deployments.entry(job.to_owned()).or_default();
        kept.retain(|d| d.job_version != version);
        kept.push_back(deployment);
        while kept.len() > DEPLOYMENTS_KEPT {
            kept.pop_front();
        }
        Ok(Outcome::Updated)
    }

    /// Fails deployment `id` (see `Op::FailDeployment`), rolling back to `revert` if given.
    pub(super) fn fail_deployment(
        &mut self,
        id: &str,
        description: String,
        revert: Option<muster_model::Job>,
        at_ms: u64,
        index: u64,
    ) -> Result<Outcome, OpError> {
        let reverted_to = revert.as_ref().map(|old| old.version);
        let change = DeploymentChange::Status {
            status: DeploymentStatus::Failed,
            description,
            reverted_to,
        };
        // Only an active deployment fails: it deploys the job's current version, which is
        // not stopped (a newer version or a stop would have cancelled it).
        self.change_deployment(id, change, index)?;
        if let Some(old) = revert {
            let job = old.name.clone();
            self.upsert_job(old)?;
            self.start_deployment(&job, at_ms, true, index)?;
        }
        Ok(Outcome::Updated)
    }

    /// Applies `change` to deployment `id`.
    pub(super) fn change_deployment(
        &mut self,
        id: &str,
        change: DeploymentChange,
        index: u64,
    ) -> Result<Outcome, OpError> {
        let unknown = || OpError::UnknownDeployment(id.to_owned());
        let (job, _) = id.rsplit_once(".v").ok_or_else(unknown)?;
        let deployment = self
            .deployments
            .get_mut(job)
            .and_then(|kept| kept.iter_mut().find(|d| d.id == id))
            .ok_or_else(unknown)?;
        if !deployment.status.is_active() {
            return Err(OpError::DeploymentEnded {
                id: id.to_owned(),
                status: deployment.status.as_str().to_owned(),
            });
        }
        match change {
            DeploymentChange::Progress {
                healthy,
                unhealthy,
                progress_by_ms,
            } => {
                for (group, task) in healthy {
                    if let Some(g) = deployment.groups.get_mut(&group) {
                        g.healthy.insert(task);
                    }
                }
                for (group, task) in unhealthy {
                    if let Some(g) = deployment.groups.get_mut(&group) {
                        g.unhealthy.insert(task);
                    }
                }
                if let Some(by) = progress_by_ms {
                    deployment.progress_by_ms = by;
                }
            }
            DeploymentChange::Promote { groups } => {
                if let Some(group) = groups.iter().find(|g| !deployment.groups.contains_key(*g)) {
                    return Err(OpError::UnknownDeploymentGroup {
                        id: id.to_owned(),
                        group: group.clone(),
                    });
                }
                let mut promoted = false;
                for (name, g) in &mut deployment.groups {
                    if (groups.is_empty() || groups.contains(name)) && !g.promoted {
                        g.promoted = true;
                        promoted = true;
                    }
                }
                if !promoted {
                    return Err(OpError::NothingToPromote(id.to_owned()));
                }
                deployment.description = "replacing tasks".into();
            }
            DeploymentChange::Describe { description } => deployment.description = description,
            DeploymentChange::Status {
                status,
                description,
                reverted_to,
            } => {
                if status == DeploymentStatus::Running
                    && deployment.status != DeploymentStatus::Paused
                {
                    return Err(OpError::DeploymentNotPaused(id.to_owned()));
                }
                deployment.status = status;
                deployment.description = description;
                if reverted_to.is_some() {
                    deployment.reverted_to = reverted_to;
                }
            }
        }
        deployment.modify_index = index;
        Ok(Outcome::Updated)
    }
}

#[cfg(test)]
mod tests {
    use muster_model::{Job, Resources, SchedulerType, TaskGroup, UpdatePolicy};

    use super::*;
    use crate::types::Op;

    fn job(command: &str) -> Job {
        Job {
            name: "web".into(),
            priority: 50,
            scheduler: SchedulerType::Service,
            named_scheduler: None,
            groups: vec![TaskGroup {
                name: "fe".into(),
                count: 2,
                resources: Resources {
                    cpus: 0.1,
                    mem_mb: 8,
                },
                command: command.into(),
                update: Some(UpdatePolicy {
                    canary: 1,
                    ..UpdatePolicy::default()
                }),
                ..TaskGroup::default()
            }],
            stopped: false,
            version: 0,
        }
    }

    fn submit(state: &mut RegistryState, job: Job, index: u64) {
        let name = job.name.clone();
        let ops = vec![
            Op::UpsertJob(job),
            Op::StartDeployment {
                job: name,
                at_ms: 1_000,
                revert: false,
            },
        ];
        assert!(state.apply(Op::Together(ops), index).is_ok());
    }

    fn change(id: &str, change: DeploymentChange) -> Op {
        Op::ChangeDeployment {
            id: id.into(),
            change,
        }
    }

    #[test]
    fn deployments_start_with_versions_move_on_and_end_for_good() {
        let mut state = RegistryState::default();
        submit(&mut state, job("v1"), 1);
        // A first version has no canaries to promote.
        assert_eq!(
            state.apply(
                change("web.v1", DeploymentChange::Promote { groups: Vec::new() }),
                2
            ),
            Err(OpError::NothingToPromote("web.v1".into()))
        );
        submit(&mut state, job("v2"), 3);
        assert_eq!(
            state
                .deployment("web.v1")
                .map(|d| (d.status, d.description.as_str())),
            Some((DeploymentStatus::Cancelled, "superseded by version 2"))
        );
        let second = state.latest_deployment("web").cloned();
        assert_eq!(
            second
                .as_ref()
                .map(|d| (d.id.as_str(), d.status, d.modify_index)),
            Some(("web.v2", DeploymentStatus::Running, 3))
        );
        let progress = DeploymentChange::Progress {
            healthy: vec![("fe".into(), "web.fe[canary-0]-1".into())],
            unhealthy: Vec::new(),
            progress_by_ms: Some(9_000),
        };
        assert!(state.apply(change("web.v2", progress), 4).is_ok());
        let elsewhere = DeploymentChange::Promote {
            groups: vec!["be".into()],
        };
        assert_eq!(
            state.apply(change("web.v2", elsewhere), 5),
            Err(OpError::UnknownDeploymentGroup {
                id: "web.v2".into(),
                group: "be".into()
            })
        );
        let promote = DeploymentChange::Promote { groups: Vec::new() };
        assert!(state.apply(change("web.v2", promote.clone()), 5).is_ok());
        assert_eq!(
            state.apply(change("web.v2", promote), 6),
            Err(OpError::NothingToPromote("web.v2".into()))
        );
        let resumed = DeploymentChange::Status {
            status: DeploymentStatus::Running,
            description: String::new(),
            reverted_to: None,
        };
        assert_eq!(
            state.apply(change("web.v2", resumed), 6),
            Err(OpError::DeploymentNotPaused("web.v2".into()))
        );
        let done = DeploymentChange::Status {
            status: DeploymentStatus::Successful,
            description: "deployed".into(),
            reverted_to: None,
        };
        assert!(state.apply(change("web.v2", done.clone()), 7).is_ok());
        let Some(second) = state.deployment("web.v2") else {
            panic!("kept")
        };
        assert!(second.groups["fe"].promoted && second.groups["fe"].healthy.len() == 1);
        assert_eq!(second.progress_by_ms, 9_000);
        // Ended: it changes no more.
        assert!(matches!(
            state.apply(change("web.v2", done), 8),
            Err(OpError::DeploymentEnded { .. })
        ));
        // A stop cancels the running one.
        submit(&mut state, job("v3"), 9);
        assert!(state.apply(Op::StopJob("web".into()), 10).is_ok());
        assert_eq!(
            state.deployment("web.v3").map(|d| d.status),
            Some(DeploymentStatus::Cancelled)
        );
        assert_eq!(state.stable_version("web", 3), Some(2));
        assert_eq!(state.stable_version("web", 2), None);
        assert_eq!(state.active_deployments().count(), 0);
        // A revert starts without canaries.
        let revert = vec![
            Op::UpsertJob(job("v2")),
            Op::StartDeployment {
                job: "web".into(),
                at_ms: 2_000,
                revert: true,
            },
        ];
        assert!(state.apply(Op::Together(revert), 11).is_ok());
        let reverted = state.latest_deployment("web");
        assert_eq!(reverted.map(|d| d.canary_slots("fe", false)), Some(0));
        // At most a few are kept.
        for (n, index) in (4..12).zip(12..) {
            submit(&mut state, job(&format!("v{n}")), index);
        }
        assert_eq!(state.deployments_of("web").count(), DEPLOYMENTS_KEPT);
    }
}
