//! `[group.update]`: how a group's tasks are replaced when its job changes (Nomad's `update`
//! block). What the block leaves out takes the defaults its documentation gives.

use muster_model::UpdatePolicy;
use muster_proto::model as pb;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::SpecError;
use super::lifecycle::{duration_ms, format_ms};

/// How a group's tasks are replaced when its job changes: a deployment replaces at most
/// `max_parallel` at a time, each new one healthy for `min_healthy_time` before the next, with
/// `canary` new tasks first until promoted. Service and system jobs only.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct UpdateSpec {
    /// Tasks replaced at a time (default 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_parallel: Option<u32>,
    /// New tasks placed beside the old ones first, until promoted (default 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canary: Option<u32>,
    /// How long a new task must be healthy before it counts (default `10s`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub min_healthy_time: String,
    /// How long a new task has to become healthy (default `5m`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub healthy_deadline: String,
    /// How long the deployment may go without a new task turning healthy (default `10m`;
    /// `0s`: no deadline).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub progress_deadline: String,
    /// A failed deployment goes back to the last version that deployed well (default false).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_revert: Option<bool>,
    /// Canaries are promoted once they are all healthy (default false).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_promote: Option<bool>,
    /// `checks` (the default: running, and every check passes) or `task_states` (running).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub health: String,
}

impl UpdateSpec {
    /// The wire form; `key` names the block in an error.
    pub(super) fn to_proto(&self, key: &str) -> Result<pb::UpdatePolicy, SpecError> {
        let defaults = UpdatePolicy::default();
        let health = match self.health.as_str() {
            "" | "checks" => pb::HealthCriteria::Checks,
            "task_states" => pb::HealthCriteria::TaskStates,
            other => {
                return Err(SpecError::Value {
                    key: format!("{key}.health"),
                    message: format!("{other:?} is not checks or task_states"),
                });
            }
        };
        Ok(pb::UpdatePolicy {
            max_parallel: self.max_parallel.unwrap_or(defaults.max_parallel),
            canary: self.canary.unwrap_or(defaults.canary),
            min_healthy_time_ms: duration_ms(&self.min_healthy_time, key, "min_healthy_time")?
                .unwrap_or(defaults.min_healthy_time_ms),
            healthy_deadline_ms: duration_ms(&self.healthy_deadline, key, "healthy_deadline")?
                .unwrap_or(defaults.healthy_deadline_ms),
            progress_deadline_ms: duration_ms(&self.progress_deadline, key, "progress_deadline")?
                .unwrap_or(defaults.progress_deadline_ms),
            auto_revert: self.auto_revert.unwrap_or(defaults.auto_revert),
            auto_promote: self.auto_promote.unwrap_or(defaults.auto_promote),
            health: health as i32,
        })
    }

    /// The document form of the wire's.
    pub(super) fn from_proto(policy: &pb::UpdatePolicy) -> UpdateSpec {
        let health = match pb::HealthCriteria::try_from(policy.health) {
            Ok(pb::HealthCriteria::TaskStates) => "task_states",
            _ => "checks",
        };
        UpdateSpec {
            max_parallel: Some(policy.max_parallel),
            canary: Some(policy.canary),
            min_healthy_time: format_ms(policy.min_healthy_time_ms),
            healthy_deadline: format_ms(policy.healthy_deadline_ms),
            progress_deadline: format_ms(policy.progress_deadline_ms),
            auto_revert: Some(policy.auto_revert),
            auto_promote: Some(policy.auto_promote),
            health: health.to_owned(),
        }
    }
}
