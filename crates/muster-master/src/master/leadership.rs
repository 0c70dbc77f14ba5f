//! The master's role (standby, catching up, leading), who leads, and the scheduling state
//! that comes and goes with leading. The changes themselves are handled in `internal`.

use std::collections::HashSet;

use muster_actor::{Pid, TimerHandle};
use muster_broker::blocked::BlockedMsg;
use muster_broker::{BrokerMsg, registrar_writer};
use muster_model::{EvalStatus, Evaluation};
use muster_registry::Registrar;
use tokio::time::Instant;

use super::{Master, MasterMsg};
use crate::error::ServiceError;

/// A failover recovery in progress: a new leader waits for its admitted agents to re-register
/// (handled in `reregistration`) until all are back or the deadline passes.
#[derive(Debug)]
pub(super) struct Recovery {
    pub(super) started: Instant,
    pub(super) awaiting: HashSet<String>,
    pub(super) admitted: usize,
    pub(super) deadline: TimerHandle,
}

#[derive(Debug)]
pub(super) enum Role {
    /// Another master leads (or none does yet).
    Standby { leader: Option<(u64, String)> },
    /// This master leads but is still catching up with the registry; requests wait.
    Starting { term: u64, waiting: Vec<MasterMsg> },
    /// This master leads.
    Leading {
        term: u64,
        registrar: Pid<Registrar>,
        recovery: Option<Recovery>,
    },
}

impl Master {
    /// The leading master's registry id and address, if known.
    pub(super) fn leader(&self) -> Option<(u64, String)> {
        match &self.role {
            Role::Standby { leader } => leader.clone(),
            Role::Starting { .. } | Role::Leading { .. } => {
                Some((self.registry.id(), self.address.clone()))
            }
        }
    }

    /// The term this master leads in, once caught up with the registry.
    pub(super) fn leading_term(&self) -> Option<u64> {
        match &self.role {
            Role::Leading { term, .. } => Some(*term),
            _ => None,
        }
    }

    /// The refusal of a leader-only request: this master does not lead, and who does.
    pub(super) fn not_leading(&self) -> ServiceError {
        ServiceError::not_leader(self.leader().map(|(_, address)| address))
    }

    /// On becoming leader: the broker takes the registry's pending (and blocked: their
    /// capacity picture is gone with the old leader) evaluations; the blocked-queue starts
    /// empty.
    pub(super) fn restore_scheduling(&mut self) {
        let Role::Leading { registrar, .. } = &self.role else {
            return;
        };
        let evals: Vec<Evaluation> = self.registry.reader().read(|state| {
            state
                .evals
                .values()
                .filter(|e| matches!(e.status, EvalStatus::Pending | EvalStatus::Blocked))
                .cloned()
                .map(|mut e| {
                    e.status = EvalStatus::Pending;
                    e
                })
                .collect()
        });
        let _ = self.broker.tell(BrokerMsg::Restore {
            writer: registrar_writer(registrar.clone()),
            evals,
        });
        let _ = self.blocked.tell(BlockedMsg::Restore(Vec::new()));
    }

    /// On losing leadership.
    pub(super) fn stop_scheduling(&mut self) {
        let _ = self.broker.tell(BrokerMsg::Disable);
        let _ = self.blocked.tell(BlockedMsg::Disable);
    }
}
