//! [`Evaluation`] and its parts to and from their `muster.model.v1` messages.

use muster_proto::model as pb;

use crate::agent::AgentId;
use crate::convert::{bad_enum, job_id_from_wire, job_id_to_wire, priority, read, required};
use crate::error::FieldError;
use crate::eval::{EvalId, EvalStatus, Evaluation, Trigger};

impl From<EvalStatus> for i32 {
    fn from(status: EvalStatus) -> Self {
        let proto = match status {
            EvalStatus::Pending => pb::EvalStatus::Pending,
            EvalStatus::Blocked => pb::EvalStatus::Blocked,
            EvalStatus::Complete => pb::EvalStatus::Complete,
            EvalStatus::Failed => pb::EvalStatus::Failed,
            EvalStatus::Canceled => pb::EvalStatus::Canceled,
        };
        proto as i32
    }
}

impl TryFrom<i32> for EvalStatus {
    type Error = FieldError;

    fn try_from(proto: i32) -> Result<Self, FieldError> {
        match pb::EvalStatus::try_from(proto) {
            Ok(pb::EvalStatus::Pending) => Ok(EvalStatus::Pending),
            Ok(pb::EvalStatus::Blocked) => Ok(EvalStatus::Blocked),
            Ok(pb::EvalStatus::Complete) => Ok(EvalStatus::Complete),
            Ok(pb::EvalStatus::Failed) => Ok(EvalStatus::Failed),
            Ok(pb::EvalStatus::Canceled) => Ok(EvalStatus::Canceled),
            Ok(pb::EvalStatus::Unspecified) | Err(_) => Err(bad_enum(proto)),
        }
    }
}

impl From<Trigger> for pb::Trigger {
    fn from(trigger: Trigger) -> Self {
        use pb::trigger::Kind;
        let kind = match trigger {
            Trigger::JobRegister => Kind::JobRegister(pb::trigger::JobRegister {}),
            Trigger::JobDeregister => Kind::JobDeregister(pb::trigger::JobDeregister {}),
            Trigger::AgentUnreachable(agent) => Kind::AgentUnreachable(agent.0),
            Trigger::AgentUpdate(agent) => Kind::AgentUpdate(agent.0),
            Trigger::Unblocked => Kind::Unblocked(pb::trigger::Unblocked {}),
            Trigger::TaskEnded(task) => Kind::TaskEnded(task),
            Trigger::FailedFollowUp(eval) => Kind::FailedFollowUp(eval.0),
            Trigger::Reconcile => Kind::Reconcile(pb::trigger::Reconcile {}),
            Trigger::AgentDrain(agent) => Kind::AgentDrain(agent.0),
            Trigger::Deployment(id) => Kind::Deployment(id),
            Trigger::Preempted(task) => Kind::Preempted(task),
        };
        pb::Trigger { kind: Some(kind) }
    }
}

impl TryFrom<pb::Trigger> for Trigger {
    type Error = FieldError;

    fn try_from(proto: pb::Trigger) -> Result<Self, FieldError> {
        use pb::trigger::Kind;
        match proto.kind {
            Some(Kind::JobRegister(_)) => Ok(Trigger::JobRegister),
            Some(Kind::JobDeregister(_)) => Ok(Trigger::JobDeregister),
            Some(Kind::AgentUnreachable(agent)) => Ok(Trigger::AgentUnreachable(AgentId(agent))),
            Some(Kind::AgentUpdate(agent)) => Ok(Trigger::AgentUpdate(AgentId(agent))),
            Some(Kind::Unblocked(_)) => Ok(Trigger::Unblocked),
            Some(Kind::TaskEnded(task)) => Ok(Trigger::TaskEnded(task)),
            Some(Kind::FailedFollowUp(eval)) => Ok(Trigger::FailedFollowUp(EvalId(eval))),
            Some(Kind::Reconcile(_)) => Ok(Trigger::Reconcile),
            Some(Kind::AgentDrain(agent)) => Ok(Trigger::AgentDrain(AgentId(agent))),
            Some(Kind::Deployment(id)) => Ok(Trigger::Deployment(id)),
            Some(Kind::Preempted(task)) => Ok(Trigger::Preempted(task)),
            None => Err(FieldError::new("", "none of its kinds is set")),
        }
    }
}

impl From<Evaluation> for pb::Evaluation {
    fn from(eval: Evaluation) -> Self {
        let (namespace, job) = job_id_to_wire(eval.job);
        pb::Evaluation {
            namespace,
            id: eval.id.0,
            job,
            priority: eval.priority.into(),
            scheduler: eval.scheduler.into(),
            trigger: Some(eval.trigger.into()),
            status: eval.status.into(),
            status_description: eval.status_description,
            create_index: eval.create_index,
            modify_index: eval.modify_index,
            snapshot_index: eval.snapshot_index,
            wait_until_ms: eval.wait_until_ms,
            scheduler_name: eval.named_scheduler.unwrap_or_default(),
        }
    }
}

impl TryFrom<pb::Evaluation> for Evaluation {
    type Error = FieldError;

    fn try_from(proto: pb::Evaluation) -> Result<Self, FieldError> {
        Ok(Evaluation {
            id: EvalId(proto.id),
            job: job_id_from_wire(&proto.namespace, proto.job),
            priority: priority(proto.priority, "priority")?,
            scheduler: read(proto.scheduler, "scheduler")?,
            named_scheduler: (!proto.scheduler_name.is_empty()).then_some(proto.scheduler_name),
            trigger: required(proto.trigger, "trigger")?,
            status: read(proto.status, "status")?,
            status_description: proto.status_description,
            create_index: proto.create_index,
            modify_index: proto.modify_index,
            snapshot_index: proto.snapshot_index,
            wait_until_ms: proto.wait_until_ms,
        })
    }
}
