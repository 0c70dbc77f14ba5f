//! The registry's contents in memory and the rules that change them.
//!
//! Pure logic: the sled store persists what [`RegistryState::apply`] touched, and readers see
//! the same value through a [`RegistryReader`](crate::RegistryReader).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::jobs::{EvalId, Evaluation, Job};
use crate::types::{AgentId, AgentInfo, Op, OpError, Outcome, UnreachableAgent};

/// Admitted and unreachable agents, and the counter that names new agents.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RegistryState {
    /// Agents the master admitted and has not marked unreachable.
    pub agents: BTreeMap<AgentId, AgentInfo>,
    /// Agents marked unreachable, with when.
    pub unreachable: BTreeMap<AgentId, UnreachableAgent>,
    /// The number in the last id handed out.
    pub last_agent_number: u64,
    /// Jobs by name.
    pub jobs: BTreeMap<String, Job>,
    /// Evaluations by id, whatever their status.
    pub evals: BTreeMap<EvalId, Evaluation>,
}

/// The agent ids an [`apply`](RegistryState::apply) touched, so the store writes only those.
#[derive(Debug, Default)]
pub(crate) struct Touched {
    pub(crate) agents: BTreeSet<AgentId>,
    pub(crate) jobs: BTreeSet<String>,
    pub(crate) evals: BTreeSet<EvalId>,
}

impl RegistryState {
    #[cfg(test)]
    fn apply_at(&mut self, op: Op, touched: &mut Touched) -> Result<Outcome, OpError> {
        self.apply(op, 1, touched)
    }

    /// Applies one operation of the raft entry at `index`.
    pub(crate) fn apply(
        &mut self,
        op: Op,
        index: u64,
        touched: &mut Touched,
    ) -> Result<Outcome, OpError> {
        match op {
            Op::AdmitAgent(info) => {
                self.last_agent_number += 1;
                let id = AgentId(format!("agent-{}", self.last_agent_number));
                self.agents.insert(id.clone(), info);
                touched.agents.insert(id.clone());
                Ok(Outcome::Admitted(id))
            }
            Op::UpdateAgent { id, info } => {
                self.unreachable.remove(&id);
                self.agents.insert(id.clone(), info);
                touched.agents.insert(id);
                Ok(Outcome::Updated)
            }
            Op::MarkUnreachable { id, at_ms } => {
                let info = self
                    .agents
                    .remove(&id)
                    .ok_or_else(|| OpError::UnknownAgent(id.clone()))?;
                self.unreachable.insert(
                    id.clone(),
                    UnreachableAgent {
                        info,
                        marked_at_ms: at_ms,
                    },
                );
                touched.agents.insert(id);
                Ok(Outcome::MarkedUnreachable)
            }
            Op::RemoveAgent(id) => {
                let known =
                    self.agents.remove(&id).is_some() | self.unreachable.remove(&id).is_some();
                if !known {
                    return Err(OpError::UnknownAgent(id));
                }
                touched.agents.insert(id);
                Ok(Outcome::Removed)
            }
            Op::UpsertJob(mut job) => {
                let version = self.jobs.get(&job.name).map_or(1, |old| old.version + 1);
                job.version = version;
                touched.jobs.insert(job.name.clone());
                self.jobs.insert(job.name.clone(), job);
                Ok(Outcome::JobStored { version })
            }
            Op::UpsertEvals(evals) => {
                let count = evals.len();
                for mut eval in evals {
                    eval.create_index = self
                        .evals
                        .get(&eval.id)
                        .map_or(index, |old| old.create_index);
                    eval.modify_index = index;
                    touched.evals.insert(eval.id.clone());
                    self.evals.insert(eval.id.clone(), eval);
                }
                Ok(Outcome::EvalsStored(count))
            }
            Op::SetEvalStatus {
                ids,
                status,
                description,
            } => {
                let mut changed = 0;
                for id in ids {
                    if let Some(eval) = self.evals.get_mut(&id) {
                        eval.status = status;
                        eval.status_description.clone_from(&description);
                        eval.modify_index = index;
                        touched.evals.insert(id);
                        changed += 1;
                    }
                }
                Ok(Outcome::EvalsStored(changed))
            }
            Op::Together(ops) => Ok(Outcome::Together(
                ops.into_iter()
                    .map(|op| self.apply(op, index, touched))
                    .collect(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(host: &str) -> AgentInfo {
        AgentInfo {
            hostname: host.into(),
            ..AgentInfo::default()
        }
    }

    #[test]
    fn admitted_agents_get_fresh_ids_that_are_never_reused() {
        let mut state = RegistryState::default();
        let mut touched = Touched::default();
        let a = state.apply_at(Op::AdmitAgent(info("a")), &mut touched);
        let b = state.apply_at(Op::AdmitAgent(info("b")), &mut touched);
        assert_eq!(a, Ok(Outcome::Admitted(AgentId("agent-1".into()))));
        assert_eq!(b, Ok(Outcome::Admitted(AgentId("agent-2".into()))));
        let removed = state.apply_at(Op::RemoveAgent(AgentId("agent-2".into())), &mut touched);
        assert_eq!(removed, Ok(Outcome::Removed));
        let c = state.apply_at(Op::AdmitAgent(info("c")), &mut touched);
        assert_eq!(c, Ok(Outcome::Admitted(AgentId("agent-3".into()))));
    }

    #[test]
    fn unreachable_agents_move_out_and_back() {
        let mut state = RegistryState::default();
        let mut touched = Touched::default();
        let id = AgentId("agent-1".into());
        state
            .apply_at(Op::AdmitAgent(info("a")), &mut touched)
            .expect("admit");
        let marked = state.apply_at(
            Op::MarkUnreachable {
                id: id.clone(),
                at_ms: 42,
            },
            &mut touched,
        );
        assert_eq!(marked, Ok(Outcome::MarkedUnreachable));
        assert!(state.agents.is_empty());
        assert_eq!(state.unreachable[&id].marked_at_ms, 42);

        let again = state.apply_at(
            Op::MarkUnreachable {
                id: id.clone(),
                at_ms: 43,
            },
            &mut touched,
        );
        assert_eq!(again, Err(OpError::UnknownAgent(id.clone())));

        let back = state.apply_at(
            Op::UpdateAgent {
                id: id.clone(),
                info: info("a2"),
            },
            &mut touched,
        );
        assert_eq!(back, Ok(Outcome::Updated));
        assert!(state.unreachable.is_empty());
        assert_eq!(state.agents[&id].hostname, "a2");
        assert_eq!(touched.agents.len(), 1);
    }

    #[test]
    fn jobs_get_versions_and_evals_get_indexes_and_statuses() {
        use crate::jobs::{EvalStatus, Evaluation, Job, SchedulerType, Trigger};
        let mut state = RegistryState::default();
        let mut touched = Touched::default();
        let job = Job {
            name: "web".into(),
            priority: 50,
            scheduler: SchedulerType::Service,
            groups: Vec::new(),
            stopped: false,
            version: 0,
        };
        let eval = Evaluation::new(&job, Trigger::JobRegister);
        let together = state.apply(
            Op::Together(vec![
                Op::UpsertJob(job.clone()),
                Op::UpsertEvals(vec![eval.clone()]),
            ]),
            7,
            &mut touched,
        );
        assert_eq!(
            together,
            Ok(Outcome::Together(vec![
                Ok(Outcome::JobStored { version: 1 }),
                Ok(Outcome::EvalsStored(1)),
            ]))
        );
        assert_eq!(state.evals[&eval.id].create_index, 7);
        let again = state.apply(Op::UpsertJob(job), 9, &mut touched);
        assert_eq!(again, Ok(Outcome::JobStored { version: 2 }));

        let canceled = state.apply(
            Op::SetEvalStatus {
                ids: vec![eval.id.clone(), crate::jobs::EvalId("unknown".into())],
                status: EvalStatus::Canceled,
                description: "newer".into(),
            },
            11,
            &mut touched,
        );
        assert_eq!(canceled, Ok(Outcome::EvalsStored(1)));
        let stored = &state.evals[&eval.id];
        assert_eq!(stored.status, EvalStatus::Canceled);
        assert_eq!((stored.create_index, stored.modify_index), (7, 11));
        assert!(touched.jobs.contains("web") && touched.evals.contains(&eval.id));
    }
}
