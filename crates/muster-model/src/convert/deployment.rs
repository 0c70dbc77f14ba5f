//! [`UpdatePolicy`] and [`Deployment`] to and from their `muster.model.v1` messages.

use muster_proto::model as pb;

use crate::convert::{bad_enum, job_id_from_wire, job_id_to_wire, read};
use crate::deployment::{
    Deployment, DeploymentGroup, DeploymentStatus, HealthCriteria, UpdatePolicy,
};
use crate::error::FieldError;

impl From<UpdatePolicy> for pb::UpdatePolicy {
    fn from(policy: UpdatePolicy) -> Self {
        let health = match policy.health {
            HealthCriteria::Checks => pb::HealthCriteria::Checks,
            HealthCriteria::TaskStates => pb::HealthCriteria::TaskStates,
        };
        pb::UpdatePolicy {
            max_parallel: policy.max_parallel,
            canary: policy.canary,
            min_healthy_time_ms: policy.min_healthy_time_ms,
            healthy_deadline_ms: policy.healthy_deadline_ms,
            progress_deadline_ms: policy.progress_deadline_ms,
            auto_revert: policy.auto_revert,
            auto_promote: policy.auto_promote,
            health: health as i32,
        }
    }
}

/// Every field is read as it is (0 is 0); an unspecified health criterion is checks.
impl TryFrom<pb::UpdatePolicy> for UpdatePolicy {
    type Error = FieldError;

    fn try_from(proto: pb::UpdatePolicy) -> Result<Self, FieldError> {
        let health = match pb::HealthCriteria::try_from(proto.health) {
            Ok(pb::HealthCriteria::Unspecified | pb::HealthCriteria::Checks) => {
                HealthCriteria::Checks
            }
            Ok(pb::HealthCriteria::TaskStates) => HealthCriteria::TaskStates,
            Err(_) => return Err(bad_enum(proto.health).within("health")),
        };
        Ok(UpdatePolicy {
            max_parallel: proto.max_parallel,
            canary: proto.canary,
            min_healthy_time_ms: proto.min_healthy_time_ms,
            healthy_deadline_ms: proto.healthy_deadline_ms,
            progress_deadline_ms: proto.progress_deadline_ms,
            auto_revert: proto.auto_revert,
            auto_promote: proto.auto_promote,
            health,
        })
    }
}

impl From<DeploymentStatus> for i32 {
    fn from(status: DeploymentStatus) -> Self {
        let proto = match status {
            DeploymentStatus::Running => pb::DeploymentStatus::Running,
            DeploymentStatus::Paused => pb::DeploymentStatus::Paused,
            DeploymentStatus::Successful => pb::DeploymentStatus::Successful,
            DeploymentStatus::Failed => pb::DeploymentStatus::Failed,
            DeploymentStatus::Cancelled => pb::DeploymentStatus::Cancelled,
        };
        proto as i32
    }
}

impl TryFrom<i32> for DeploymentStatus {
    type Error = FieldError;

    fn try_from(proto: i32) -> Result<Self, FieldError> {
        match pb::DeploymentStatus::try_from(proto) {
            Ok(pb::DeploymentStatus::Running) => Ok(DeploymentStatus::Running),
            Ok(pb::DeploymentStatus::Paused) => Ok(DeploymentStatus::Paused),
            Ok(pb::DeploymentStatus::Successful) => Ok(DeploymentStatus::Successful),
            Ok(pb::DeploymentStatus::Failed) => Ok(DeploymentStatus::Failed),
            Ok(pb::DeploymentStatus::Cancelled) => Ok(DeploymentStatus::Cancelled),
            Ok(pb::DeploymentStatus::Unspecified) | Err(_) => Err(bad_enum(proto)),
        }
    }
}

impl From<Deployment> for pb::Deployment {
    fn from(deployment: Deployment) -> Self {
        let (namespace, job) = job_id_to_wire(deployment.job);
        pb::Deployment {
            // As its job: named within its namespace.
            id: crate::deployment::deployment_id(&job, deployment.job_version),
            job,
            namespace,
            job_version: deployment.job_version,
            status: deployment.status.into(),
            description: deployment.description,
            groups: deployment
                .groups
                .into_iter()
                .map(|(name, g)| pb::DeploymentGroup {
                    name,
                    update: Some(g.update.into()),
                    desired_total: g.desired_total,
                    desired_canaries: g.desired_canaries,
                    promoted: g.promoted,
                    healthy: g.healthy.into_iter().collect(),
                    unhealthy: g.unhealthy.into_iter().collect(),
                })
                .collect(),
            created_ms: deployment.created_ms,
            progress_by_ms: deployment.progress_by_ms,
            reverted_to: deployment.reverted_to,
            rollback: deployment.rollback,
            modify_index: deployment.modify_index,
        }
    }
}

impl TryFrom<pb::Deployment> for Deployment {
    type Error = FieldError;

    fn try_from(proto: pb::Deployment) -> Result<Self, FieldError> {
        let mut groups = std::collections::BTreeMap::new();
        for (i, g) in proto.groups.into_iter().enumerate() {
            let field = format!("groups[{i}]");
            let update = match g.update {
                Some(update) => read(update, &format!("{field}.update"))?,
                None => UpdatePolicy::default(),
            };
            groups.insert(
                g.name,
                DeploymentGroup {
                    update,
                    desired_total: g.desired_total,
                    desired_canaries: g.desired_canaries,
                    promoted: g.promoted,
                    healthy: g.healthy.into_iter().collect(),
                    unhealthy: g.unhealthy.into_iter().collect(),
                },
            );
        }
        let job = job_id_from_wire(&proto.namespace, proto.job);
        Ok(Deployment {
            id: crate::deployment::deployment_id(&job, proto.job_version),
            job,
            job_version: proto.job_version,
            status: read(proto.status, "status")?,
            description: proto.description,
            groups,
            created_ms: proto.created_ms,
            progress_by_ms: proto.progress_by_ms,
            reverted_to: proto.reverted_to,
            rollback: proto.rollback,
            modify_index: proto.modify_index,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Job, SchedulerType, TaskGroup};

    #[test]
    fn a_deployment_round_trips_with_its_namespace() {
        let job = Job {
            name: "team-a:web".into(),
            priority: 50,
            scheduler: SchedulerType::Service,
            named_scheduler: None,
            groups: vec![TaskGroup {
                name: "fe".into(),
                count: 2,
                update: Some(UpdatePolicy {
                    canary: 1,
                    health: HealthCriteria::TaskStates,
                    ..UpdatePolicy::default()
                }),
                ..TaskGroup::default()
            }],
            stopped: false,
            version: 2,
        };
        let Some(mut deployment) = Deployment::of(&job, 5) else {
            panic!("it deploys")
        };
        deployment
            .groups
            .get_mut("fe")
            .map(|g| g.healthy.insert("t1".into()));
        deployment.reverted_to = Some(1);
        deployment.rollback = true;
        let wire = pb::Deployment::from(deployment.clone());
        assert_eq!(
            (wire.namespace.as_str(), wire.job.as_str()),
            ("team-a", "web")
        );
        assert_eq!(Deployment::try_from(wire), Ok(deployment));
    }
}
