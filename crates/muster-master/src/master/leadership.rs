//! The master's role (standby, catching up, leading), who leads, and the scheduling state
//! that comes and goes with leading. The changes themselves are handled in `internal`.

use std::collections::HashSet;

use muster_actor::{Context, Pid, TimerHandle};
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
    /// While set, evaluations are held back (the broker is not restored): the timer that ends
    /// the hold if the agents are not all back first.
    pub(super) placements_held: Option<TimerHandle>,
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

    /// Runs `then` once a quorum has confirmed, recently, that this master still leads: at
    /// once within the lease of the last confirmation, else after a confirmation round
    /// (openraft's `ensure_linearizable`: a heartbeat a quorum answers). `then` gets the
    /// refusal if the round fails or the term changed meanwhile.
    ///
    /// The lease is half the shortest election timeout, counted from when the round began: no
    /// other member can have been elected within it, since the members that answered reset
    /// their election timers after it began. The clock is monotonic, so a master paused
    /// (SIGSTOP) past its lease finds it expired when it resumes.
    pub(super) fn with_quorum_leadership(
        &mut self,
        ctx: &mut Context<Self>,
        then: impl FnOnce(&mut Master, &mut Context<Master>, Result<(), ServiceError>) + Send + 'static,
    ) {
        let Some(term) = self.leading_term() else {
            let refusal = self.not_leading();
            return then(self, ctx, Err(refusal));
        };
        let now = Instant::now();
        if self
            .leadership_lease
            .is_some_and(|(leased_term, until)| leased_term == term && now < until)
        {
            return then(self, ctx, Ok(()));
        }
        let lease = self.config.raft_election_timeout.0 / 2;
        let registry = self.registry.clone();
        ctx.defer(
            async move { registry.catch_up().await },
            move |master: &mut Master, ctx, confirmed| {
                if confirmed.is_ok() && master.leading_term() == Some(term) {
                    master.leadership_lease = Some((term, now + lease));
                    master.metrics.leadership_confirmations += 1;
                    then(master, ctx, Ok(()))
                } else {
                    if let Err(error) = confirmed {
                        tracing::warn!(%error, term, "a quorum did not confirm this master's leadership");
                    }
                    master.leadership_lease = None;
                    // Not `not_leading`: while its role still says so, this master would name
                    // itself. Who leads is not known here.
                    let refusal = match &master.role {
                        Role::Standby { leader } => {
                            ServiceError::not_leader(leader.as_ref().map(|(_, a)| a.clone()))
                        }
                        _ => ServiceError::not_leader(None),
                    };
                    then(master, ctx, Err(refusal))
                }
            },
        );
    }

    /// Whether the last confirmation of this master's leadership still holds, now.
    pub(super) fn lease_holds(&self) -> bool {
        let now = Instant::now();
        match (self.leading_term(), self.leadership_lease) {
            (Some(term), Some((leased, until))) => leased == term && now < until,
            _ => false,
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

    /// Ends a new leader's hold on placements (see `internal::RECOVERY_PLACEMENT_HOLD`), once:
    /// the broker takes the registry's pending evaluations, those written during the hold
    /// among them.
    pub(super) fn release_placements(&mut self, why: &str) {
        let Role::Leading {
            recovery: Some(progress),
            ..
        } = &mut self.role
        else {
            return;
        };
        let Some(hold) = progress.placements_held.take() else {
            return;
        };
        hold.cancel();
        tracing::info!(
            waiting_for = progress.awaiting.len(),
            "{why}: evaluations released to the schedulers"
        );
        self.restore_scheduling();
    }

    /// On losing leadership.
    pub(super) fn stop_scheduling(&mut self) {
        let _ = self.broker.tell(BrokerMsg::Disable);
        let _ = self.blocked.tell(BlockedMsg::Disable);
    }
}
