//! Plans a scheduler keeps while the master applies them (`SubmitPlanRequest.brief`): sent
//! from a reference, so that a retry can send the same plan again, and answered with the task
//! ids of the placements committed and rejected instead of the placements echoed whole.
//!
//! A plan of a thousand placements echoed whole is an answer as large as the plan, decoded
//! into a thousand placements the scheduler already holds; answered brief it is the ids.

use std::collections::HashMap;

use muster_model::FieldError;
use muster_model::convert::all;
use muster_proto::scheduling as pb;

use crate::plan::{Placement, Plan, PlanResult};

impl From<&Placement> for pb::Placement {
    fn from(this: &Placement) -> Self {
        pb::Placement {
            agent: this.agent.0.clone(),
            task_id: this.task_id.clone(),
            name: this.name.clone(),
            job: this.job.clone(),
            group: this.group.clone(),
            resources: Some(this.resources.clone().into()),
            job_version: this.job_version,
            ports: this.ports.iter().cloned().map(Into::into).collect(),
            ..pb::Placement::default()
        }
    }
}

impl From<&Plan> for pb::Plan {
    fn from(this: &Plan) -> Self {
        pb::Plan {
            eval_id: this.eval.0.clone(),
            job: this.job.clone(),
            job_version: this.job_version,
            snapshot_index: this.snapshot_index,
            place: this.place.iter().map(Into::into).collect(),
            stop: this.stop.iter().cloned().map(Into::into).collect(),
            unplaced: this.unplaced.iter().cloned().map(Into::into).collect(),
            eval_token: this.eval_token.clone(),
            atomic: this.atomic,
            preempt: this.preempt.iter().cloned().map(Into::into).collect(),
        }
    }
}

/// `result` as the master answers a brief submission: the committed and rejected
/// placements by task id, everything else as [`pb::PlanResult::from`] sends it.
pub fn brief_plan_result(result: PlanResult) -> pb::PlanResult {
    let ids = |placements: Vec<Placement>| placements.into_iter().map(|p| p.task_id).collect();
    pb::PlanResult {
        committed_ids: ids(result.committed),
        rejected_ids: ids(result.rejected),
        stopped: all(result.stopped),
        index: result.index,
        over_quota: result.over_quota.into_iter().collect(),
        preempted: all(result.preempted),
        ..pb::PlanResult::default()
    }
}

/// The result of `plan`, submitted brief, from the master's answer: the placements it names
/// by task id are `plan`'s own, moved into the result. An answer that echoes placements whole
/// (a master from before `brief`) is read as it stands. An id the plan did not place, or one
/// named twice, is an error naming it.
pub fn plan_result_from_brief(plan: Plan, proto: pb::PlanResult) -> Result<PlanResult, FieldError> {
    if proto.committed_ids.is_empty() && proto.rejected_ids.is_empty() {
        return PlanResult::try_from(proto);
    }
    let pb::PlanResult {
        committed_ids,
        rejected_ids,
        stopped,
        index,
        over_quota,
        preempted,
        committed: _,
        rejected: _,
    } = proto;
    let (committed_at, rejected_at) = {
        let by_id: HashMap<&str, usize> = plan
            .place
            .iter()
            .enumerate()
            .map(|(at, placement)| (placement.task_id.as_str(), at))
            .collect();
        let positions = |ids: &[String], field: &str| {
            ids.iter()
                .enumerate()
                .map(|(i, id)| {
                    by_id.get(id.as_str()).copied().ok_or_else(|| {
                        FieldError::new(
                            format!("{field}[{i}]"),
                            format!("the plan placed no task {id:?}"),
                        )
                    })
                })
                .collect::<Result<Vec<usize>, FieldError>>()
        };
        (
            positions(&committed_ids, "committed_ids")?,
            positions(&rejected_ids, "rejected_ids")?,
        )
    };
    let mut placements: Vec<Option<Placement>> = plan.place.into_iter().map(Some).collect();
    let mut take = |positions: Vec<usize>, ids: &[String], field: &str| {
        positions
            .into_iter()
            .zip(ids)
            .enumerate()
            .map(|(i, (at, id))| {
                placements[at].take().ok_or_else(|| {
                    FieldError::new(
                        format!("{field}[{i}]"),
                        format!("task {id:?} is named twice"),
                    )
                })
            })
            .collect::<Result<Vec<Placement>, FieldError>>()
    };
    let committed = take(committed_at, &committed_ids, "committed_ids")?;
    let rejected = take(rejected_at, &rejected_ids, "rejected_ids")?;
    Ok(PlanResult {
        committed,
        rejected,
        stopped: muster_model::convert::each(stopped, "stopped")?,
        index,
        over_quota: over_quota.into_iter().collect(),
        preempted: muster_model::convert::each(preempted, "preempted")?,
    })
}

#[cfg(test)]
mod tests {
    use muster_model::{AgentId, EvalId, Resources};

    use super::*;

    fn placement(slot: usize) -> Placement {
        Placement {
            agent: AgentId(format!("agent-{slot}")),
            task_id: format!("web.fe[{slot}]-0000abcd"),
            name: format!("web.fe[{slot}]"),
            job: "web".into(),
            group: "fe".into(),
            resources: Resources {
                cpus: 0.5,
                mem_mb: 64,
            },
            job_version: 3,
            ports: Vec::new(),
        }
    }

    fn plan() -> Plan {
        let mut plan = Plan::empty(EvalId("eval-1".into()), "web", 3);
        plan.place = (0..4).map(placement).collect();
        plan
    }

    #[test]
    fn a_brief_answer_names_the_plans_own_placements() {
        let result = PlanResult {
            committed: vec![placement(2), placement(0)],
            rejected: vec![placement(3)],
            index: 7,
            over_quota: [(placement(3).task_id, "over".to_owned())].into(),
            ..PlanResult::default()
        };
        let wire = brief_plan_result(result.clone());
        assert!(wire.committed.is_empty() && wire.rejected.is_empty());
        assert_eq!(
            wire.committed_ids,
            ["web.fe[2]-0000abcd", "web.fe[0]-0000abcd"]
        );
        assert_eq!(plan_result_from_brief(plan(), wire), Ok(result));
    }

    #[test]
    fn a_whole_answer_is_read_as_it_stands() {
        let result = PlanResult {
            committed: vec![placement(1)],
            index: 9,
            ..PlanResult::default()
        };
        let whole = pb::PlanResult::from(result.clone());
        assert_eq!(plan_result_from_brief(plan(), whole), Ok(result));
    }

    #[test]
    fn an_id_the_plan_did_not_place_or_named_twice_is_refused_by_name() {
        let unknown = pb::PlanResult {
            rejected_ids: vec!["ghost-1".into()],
            ..pb::PlanResult::default()
        };
        let error = plan_result_from_brief(plan(), unknown).expect_err("an unknown id");
        assert!(
            error.to_string().contains("rejected_ids[0]") && error.to_string().contains("ghost-1"),
            "{error}"
        );
        let twice = pb::PlanResult {
            committed_ids: vec!["web.fe[1]-0000abcd".into()],
            rejected_ids: vec!["web.fe[1]-0000abcd".into()],
            ..pb::PlanResult::default()
        };
        let error = plan_result_from_brief(plan(), twice).expect_err("an id named twice");
        assert!(error.to_string().contains("named twice"), "{error}");
    }

    #[test]
    fn a_plan_sent_from_a_reference_is_the_plan_sent_whole() {
        let mut plan = plan();
        plan.eval_token = "token".into();
        plan.atomic = true;
        assert_eq!(pb::Plan::from(&plan), pb::Plan::from(plan.clone()));
    }
}
