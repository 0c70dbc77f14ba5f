//! The registry's contents in memory and the rules that change them.
//!
//! Pure logic: the sled store persists what [`RegistryState::apply`] touched, and readers see
//! the same value through a [`RegistryReader`](crate::RegistryReader).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

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
}

/// The agent ids an [`apply`](RegistryState::apply) touched, so the store writes only those.
#[derive(Debug, Default)]
pub(crate) struct Touched {
    pub(crate) agents: BTreeSet<AgentId>,
}

impl RegistryState {
    /// Applies one operation.
    pub(crate) fn apply(&mut self, op: Op, touched: &mut Touched) -> Result<Outcome, OpError> {
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
        let a = state.apply(Op::AdmitAgent(info("a")), &mut touched);
        let b = state.apply(Op::AdmitAgent(info("b")), &mut touched);
        assert_eq!(a, Ok(Outcome::Admitted(AgentId("agent-1".into()))));
        assert_eq!(b, Ok(Outcome::Admitted(AgentId("agent-2".into()))));
        let removed = state.apply(Op::RemoveAgent(AgentId("agent-2".into())), &mut touched);
        assert_eq!(removed, Ok(Outcome::Removed));
        let c = state.apply(Op::AdmitAgent(info("c")), &mut touched);
        assert_eq!(c, Ok(Outcome::Admitted(AgentId("agent-3".into()))));
    }

    #[test]
    fn unreachable_agents_move_out_and_back() {
        let mut state = RegistryState::default();
        let mut touched = Touched::default();
        let id = AgentId("agent-1".into());
        state
            .apply(Op::AdmitAgent(info("a")), &mut touched)
            .expect("admit");
        let marked = state.apply(
            Op::MarkUnreachable {
                id: id.clone(),
                at_ms: 42,
            },
            &mut touched,
        );
        assert_eq!(marked, Ok(Outcome::MarkedUnreachable));
        assert!(state.agents.is_empty());
        assert_eq!(state.unreachable[&id].marked_at_ms, 42);

        let again = state.apply(
            Op::MarkUnreachable {
                id: id.clone(),
                at_ms: 43,
            },
            &mut touched,
        );
        assert_eq!(again, Err(OpError::UnknownAgent(id.clone())));

        let back = state.apply(
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
}
