//! The documents of deployments: one version of a job being rolled out.

use muster_proto::cluster as cluster_pb;
use muster_proto::model as pb;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::ReadInfo;

/// A deployment: one version of a job replacing the tasks of the last (Nomad's deployment).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeploymentInfo {
    /// Its id, `{job}.v{version}`: what `muster deployment promote` and the HTTP API name.
    pub id: String,
    /// Its job.
    pub job: String,
    /// Its job's namespace.
    pub namespace: String,
    /// The version it deploys.
    pub job_version: u64,
    /// `running`, `paused`, `successful`, `failed` or `cancelled`.
    pub status: String,
    /// Why it is there.
    pub description: String,
    /// Its groups: those of the job with an update policy.
    pub groups: Vec<DeploymentGroupInfo>,
    /// When it began, in milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// When it fails if no new task turns healthy by then (0: no deadline).
    pub progress_by_ms: u64,
    /// The version it rolled back to, if it failed and did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverted_to: Option<u64>,
}

/// One group of a deployment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeploymentGroupInfo {
    /// The group.
    pub name: String,
    /// Tasks replaced at a time.
    pub max_parallel: u32,
    /// Its tasks at the deployed version.
    pub desired_total: u32,
    /// Its canaries.
    pub desired_canaries: u32,
    /// Whether its canaries were promoted (true without canaries).
    pub promoted: bool,
    /// How many of its new tasks were healthy for `min_healthy_time`.
    pub healthy: usize,
    /// How many of its new tasks failed or missed their healthy deadline.
    pub unhealthy: usize,
    /// A failed deployment rolls back to the last version that deployed well.
    pub auto_revert: bool,
}

/// `GET /v1/deployments`: deployments, newest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeploymentList {
    /// Newest first.
    pub deployments: Vec<DeploymentInfo>,
    /// How it was read.
    pub read: ReadInfo,
}

/// The API's word for a deployment status.
pub fn deployment_status_name(status: i32) -> &'static str {
    muster_model::DeploymentStatus::try_from(status)
        .map_or("unspecified", muster_model::DeploymentStatus::as_str)
}

impl From<pb::Deployment> for DeploymentInfo {
    fn from(d: pb::Deployment) -> Self {
        let (namespace, job) = super::namespace_and_job(d.namespace, d.job);
        DeploymentInfo {
            id: d.id,
            job,
            namespace,
            job_version: d.job_version,
            status: deployment_status_name(d.status).to_owned(),
            description: d.description,
            groups: d
                .groups
                .into_iter()
                .map(|g| {
                    let update = g.update.unwrap_or_default();
                    DeploymentGroupInfo {
                        name: g.name,
                        max_parallel: update.max_parallel,
                        desired_total: g.desired_total,
                        desired_canaries: g.desired_canaries,
                        promoted: g.promoted,
                        healthy: g.healthy.len(),
                        unhealthy: g.unhealthy.len(),
                        auto_revert: update.auto_revert,
                    }
                })
                .collect(),
            created_ms: d.created_ms,
            progress_by_ms: d.progress_by_ms,
            reverted_to: d.reverted_to,
        }
    }
}

impl From<cluster_pb::DeploymentList> for DeploymentList {
    fn from(list: cluster_pb::DeploymentList) -> Self {
        DeploymentList {
            deployments: list.deployments.into_iter().map(Into::into).collect(),
            read: list.read.into(),
        }
    }
}
