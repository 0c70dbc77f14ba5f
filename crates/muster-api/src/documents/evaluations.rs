//! The documents of evaluations: why a job was looked at, and how that ended.

use muster_proto::cluster as cluster_pb;
use muster_proto::model as pb;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::ReadInfo;
use crate::job_spec::{planned_by, scheduler_name};

/// An evaluation: why a job was looked at, and how that ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EvaluationInfo {
    /// Its id.
    pub id: String,
    /// The job evaluated (its name in its namespace).
    pub job: String,
    /// The job's namespace.
    pub namespace: String,
    /// The job's priority when it was made.
    pub priority: u32,
    /// Its job's type: `service`, `batch` or `system`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The scheduler that plans it: the one its job names (`gang`), or its type's built-in
    /// one.
    pub scheduler: String,
    /// What made it: `job-register`, `job-deregister`, `agent-unreachable`, `agent-update`,
    /// `unblocked`, `task-ended`, `failed-follow-up` or `reconcile`.
    pub triggered_by: String,
    /// The agent or task the trigger names, if any.
    pub trigger_detail: String,
    /// `pending`, `blocked`, `complete`, `failed` or `canceled`.
    pub status: String,
    /// Why it has that status.
    pub status_description: String,
    /// The registry index that created it.
    pub create_index: u64,
    /// The registry index that last changed it.
    pub modify_index: u64,
    /// Not to be handed out before this time (ms since the epoch); 0: at once.
    pub wait_until_ms: u64,
}

impl From<pb::Evaluation> for EvaluationInfo {
    fn from(eval: pb::Evaluation) -> Self {
        use pb::trigger::Kind;
        let (triggered_by, trigger_detail) = match eval.trigger.and_then(|t| t.kind) {
            Some(Kind::JobRegister(_)) => ("job-register", String::new()),
            Some(Kind::JobDeregister(_)) => ("job-deregister", String::new()),
            Some(Kind::AgentUnreachable(agent)) => ("agent-unreachable", agent),
            Some(Kind::AgentUpdate(agent)) => ("agent-update", agent),
            Some(Kind::Unblocked(_)) => ("unblocked", String::new()),
            Some(Kind::TaskEnded(task)) => ("task-ended", task),
            Some(Kind::FailedFollowUp(eval)) => ("failed-follow-up", eval),
            Some(Kind::Reconcile(_)) => ("reconcile", String::new()),
            Some(Kind::AgentDrain(agent)) => ("agent-drain", agent),
            Some(Kind::Deployment(id)) => ("deployment", id),
            Some(Kind::Preempted(task)) => ("preempted", task),
            None => ("unknown", String::new()),
        };
        let status = match pb::EvalStatus::try_from(eval.status) {
            Ok(pb::EvalStatus::Pending) => "pending",
            Ok(pb::EvalStatus::Blocked) => "blocked",
            Ok(pb::EvalStatus::Complete) => "complete",
            Ok(pb::EvalStatus::Failed) => "failed",
            Ok(pb::EvalStatus::Canceled) => "canceled",
            _ => "unknown",
        };
        let (namespace, job) = super::namespace_and_job(eval.namespace, eval.job);
        EvaluationInfo {
            id: eval.id,
            job,
            namespace,
            priority: eval.priority,
            kind: scheduler_name(eval.scheduler).to_owned(),
            scheduler: planned_by(eval.scheduler, &eval.scheduler_name),
            triggered_by: triggered_by.to_owned(),
            trigger_detail,
            status: status.to_owned(),
            status_description: eval.status_description,
            create_index: eval.create_index,
            modify_index: eval.modify_index,
            wait_until_ms: eval.wait_until_ms,
        }
    }
}

/// `GET /v1/evaluations` and `GET /v1/job/{name}/evaluations`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EvaluationList {
    /// Newest first.
    pub evaluations: Vec<EvaluationInfo>,
    /// How many matched, before the limit.
    pub total: u64,
    /// How the read was answered.
    pub read: ReadInfo,
}

impl From<cluster_pb::EvaluationList> for EvaluationList {
    fn from(list: cluster_pb::EvaluationList) -> Self {
        EvaluationList {
            evaluations: list.evals.into_iter().map(EvaluationInfo::from).collect(),
            total: list.total,
            read: list.read.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_evaluation_names_its_trigger_and_status_in_words() {
        let eval = pb::Evaluation {
            id: "e1".into(),
            trigger: Some(pb::Trigger {
                kind: Some(pb::trigger::Kind::AgentUnreachable("a1".into())),
            }),
            status: pb::EvalStatus::Blocked as i32,
            scheduler: pb::SchedulerType::Batch as i32,
            ..pb::Evaluation::default()
        };
        let doc = EvaluationInfo::from(eval);
        assert_eq!(
            (
                doc.triggered_by.as_str(),
                doc.trigger_detail.as_str(),
                doc.status.as_str(),
                doc.kind.as_str()
            ),
            ("agent-unreachable", "a1", "blocked", "batch")
        );
    }
}
