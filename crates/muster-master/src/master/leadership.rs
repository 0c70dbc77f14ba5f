//! Leadership: the master's role (standby, catching up, leading), who leads, taking up the
//! lead (catching up with the registry, loading the admitted agents, the recovery and its
//! deadline) and losing it, and the scheduling state that comes and goes with leading.

use std::collections::HashSet;
use std::time::Duration;

use muster_actor::{Context, Pid, TimerHandle, Upid};
use muster_broker::blocked::BlockedMsg;
use muster_broker::{BrokerMsg, registrar_writer};
use muster_model::{EvalStatus, Evaluation};
use muster_proto::cluster as pb;
use muster_registry::{Leadership, Registrar, WriteError};
use muster_transport::Node;
use tokio::time::Instant;

use super::agents::heartbeats::MAX_HEARTBEAT_TTL;
use super::{Master, MasterMsg, notice};
use crate::cluster::{AgentEntry, Cluster};
use crate::error::ServiceError;

/// The node to reach agents through (pings, launches); without one the master only answers.
#[derive(Debug)]
pub struct UseNode {
    /// The node.
    pub node: Node,
}

/// The registry's leader changed (the master follows its registry member's leadership).
#[derive(Debug)]
pub struct LeadershipChanged {
    /// Who leads now, and in which term.
    pub leadership: Leadership,
}

/// The master's timer: the re-registration deadline of the recovery begun in `term`.
#[derive(Debug)]
pub struct ReregistrationDeadline {
    /// The term the recovery belongs to.
    pub term: u64,
}

/// The master's timer: the end of the hold on placements of the recovery begun in `term`
/// (at most 30 s after it began, `RECOVERY_PLACEMENT_HOLD`).
#[derive(Debug)]
pub struct EndPlacementHold {
    /// The term the recovery belongs to.
    pub term: u64,
}

/// Try again to take up the leadership of `term`, whose catching up with the registry failed
/// (no quorum at that moment): raft may still have this master lead that term.
#[derive(Debug)]
pub struct RetryLeading {
    /// The term.
    pub term: u64,
}

notice!(
    UseNode,
    LeadershipChanged,
    ReregistrationDeadline,
    EndPlacementHold,
    RetryLeading
);

/// How long a new leader holds every evaluation back, at most, while admitted agents have not
/// re-registered: their tasks are not known yet, and a scheduler that placed meanwhile would
/// place second copies of what they run. Their re-registration ends the hold sooner (most
/// come back within seconds of the leader's announcement); an agent still away after it is
/// taken as gone until it returns (the convergence check then stops the extra copy).
pub(super) const RECOVERY_PLACEMENT_HOLD: Duration = Duration::from_secs(30);

/// How long a leader whose catching up failed waits before it tries again.
const CATCH_UP_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

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

    /// Ends a new leader's hold on placements (see [`RECOVERY_PLACEMENT_HOLD`]), once:
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

impl Master {
    /// [`UseNode`].
    pub(super) fn use_node(&mut self, UseNode { node }: UseNode, _ctx: &mut Context<Self>) {
        self.node = Some(node);
    }

    /// [`LeadershipChanged`].
    pub(super) fn leadership_changed(
        &mut self,
        LeadershipChanged { leadership }: LeadershipChanged,
        ctx: &mut Context<Self>,
    ) {
        self.on_leadership(leadership, ctx);
    }

    /// [`ReregistrationDeadline`].
    pub(super) fn reregistration_deadline(
        &mut self,
        ReregistrationDeadline { term }: ReregistrationDeadline,
        ctx: &mut Context<Self>,
    ) {
        self.on_deadline(term, ctx);
    }

    /// [`EndPlacementHold`].
    pub(super) fn end_placement_hold(
        &mut self,
        EndPlacementHold { term }: EndPlacementHold,
        _ctx: &mut Context<Self>,
    ) {
        if self.leading_term() == Some(term) {
            self.release_placements("the hold on placements ran out");
        }
    }

    /// [`RetryLeading`].
    pub(super) fn retry_leading(
        &mut self,
        RetryLeading { term }: RetryLeading,
        ctx: &mut Context<Self>,
    ) {
        let leadership = self.registry.leadership().borrow().clone();
        let standing_by = matches!(self.role, Role::Standby { .. });
        if standing_by && leadership.is_self && leadership.term == term {
            self.become_leader(term, ctx);
        }
    }

    fn on_leadership(&mut self, leadership: Leadership, ctx: &mut Context<Self>) {
        let current = match &self.role {
            Role::Starting { term, .. } | Role::Leading { term, .. } => Some(*term),
            Role::Standby { .. } => None,
        };
        if leadership.is_self {
            if current != Some(leadership.term) {
                self.become_leader(leadership.term, ctx);
            }
        } else {
            if current.is_some() {
                tracing::warn!(leader = ?leadership.leader, "no longer the leading master");
            }
            self.stop_leading();
            self.role = Role::Standby {
                leader: leadership.leader,
            };
        }
    }

    fn stop_leading(&mut self) {
        if let Role::Leading { registrar, .. } = &self.role {
            registrar.terminate();
            self.stop_scheduling();
        }
        let waiting = match std::mem::replace(&mut self.role, Role::Standby { leader: None }) {
            Role::Starting { waiting, .. } => waiting,
            _ => Vec::new(),
        };
        for msg in waiting {
            msg.refuse_lost_leadership();
        }
        self.cluster = Cluster::default();
        self.heartbeats.clear();
    }

    pub(super) fn become_leader(&mut self, term: u64, ctx: &mut Context<Self>) {
        self.stop_leading();
        tracing::info!(term, "leading master: catching up with the registry");
        self.term = term;
        self.role = Role::Starting {
            term,
            waiting: Vec::new(),
        };
        let registry = self.registry.clone();
        ctx.defer(
            async move { registry.catch_up().await },
            move |master: &mut Master, ctx, caught_up| master.start_leading(term, caught_up, ctx),
        );
    }

    fn start_leading(
        &mut self,
        term: u64,
        caught_up: Result<(), WriteError>,
        ctx: &mut Context<Self>,
    ) {
        if !matches!(&self.role, Role::Starting { term: t, .. } if *t == term) {
            return;
        }
        if let Err(e) = caught_up {
            // Raft still has this master lead the term: standing by for good would leave the
            // cluster with a leader that answers nothing (found by the simulation). Try again
            // while the term lasts.
            tracing::warn!(error = %e, retry_in = ?CATCH_UP_RETRY, "could not catch up with the registry; standing by, then trying again");
            self.stop_leading();
            let _ = ctx.delay(CATCH_UP_RETRY, RetryLeading { term }.into());
            return;
        }
        let Role::Starting { waiting, .. } =
            std::mem::replace(&mut self.role, Role::Standby { leader: None })
        else {
            return;
        };
        let registrar = ctx.spawn(Registrar::new(self.registry.clone()));
        let admitted: Vec<(String, AgentEntry)> = self.registry.reader().read(|state| {
            state
                .agents
                .iter()
                .map(|(id, info)| (id.0.clone(), AgentEntry::awaiting(info)))
                .collect()
        });
        let recovery = if admitted.is_empty() {
            None
        } else {
            let deadline = ctx.delay(
                self.config.reregistration_timeout,
                ReregistrationDeadline { term }.into(),
            );
            let hold = ctx.delay(
                RECOVERY_PLACEMENT_HOLD.min(self.config.reregistration_timeout),
                EndPlacementHold { term }.into(),
            );
            Some(Recovery {
                started: Instant::now(),
                awaiting: admitted.iter().map(|(id, _)| id.clone()).collect(),
                admitted: admitted.len(),
                deadline,
                placements_held: Some(hold),
            })
        };
        // Slots kept for tasks of unreachable agents are let go when those are lost for
        // good: the checks that replace them are this leader's to schedule now.
        self.check_when_kept_slots_go(ctx);
        let hold_placements = recovery.is_some();
        tracing::info!(
            term,
            admitted = admitted.len(),
            deadline = ?self.config.reregistration_timeout,
            "leading master: waiting for admitted agents to re-register"
        );
        // Every loaded agent's first TTL is the long failover one, counted from now.
        let first_deadline = Instant::now()
            + self.config.failover_heartbeat_ttl.min(MAX_HEARTBEAT_TTL)
            + self.config.heartbeat_grace.min(MAX_HEARTBEAT_TTL);
        for (id, _) in &admitted {
            self.heartbeats.set(id, first_deadline);
        }
        self.announce_leadership(term, &admitted);
        self.cluster.agents = admitted.into_iter().collect();
        self.role = Role::Leading {
            term,
            registrar,
            recovery,
        };
        if hold_placements {
            tracing::info!(
                hold = ?RECOVERY_PLACEMENT_HOLD,
                "evaluations held until the admitted agents are back"
            );
        } else {
            self.restore_scheduling();
        }
        for msg in waiting {
            self.on_message(msg, ctx);
        }
    }

    /// Tells every admitted agent that this master now leads, in `term`: agents still with a
    /// paused or cut-off predecessor re-register here at once.
    fn announce_leadership(&self, term: u64, admitted: &[(String, AgentEntry)]) {
        let Some(node) = &self.node else {
            return;
        };
        let leader = format!("master@{}", self.address);
        let mut told = 0_usize;
        for (id, agent) in admitted {
            let Ok(upid) = agent.info.address.parse::<Upid>() else {
                tracing::debug!(agent = %id, address = %agent.info.address, "cannot announce to an agent without a process address");
                continue;
            };
            let announcement = pb::LeaderAnnouncement {
                leader: leader.clone(),
                term,
                reads_tasks_sharing_labels: true,
            };
            match node.remote(upid).tell(announcement) {
                Ok(()) => told += 1,
                Err(error) => {
                    tracing::debug!(agent = %id, %error, "cannot announce the new leader");
                }
            }
        }
        tracing::info!(
            term,
            agents = told,
            "announced the new leadership to the admitted agents"
        );
    }

    // ---- the re-registration deadline ----

    fn on_deadline(&mut self, term: u64, ctx: &mut Context<Self>) {
        let Role::Leading {
            term: leading,
            recovery,
            ..
        } = &mut self.role
        else {
            return;
        };
        if *leading != term || recovery.is_none() {
            return;
        }
        self.release_placements("the re-registration deadline passed");
        let Role::Leading { recovery, .. } = &mut self.role else {
            return;
        };
        let Some(progress) = recovery.take() else {
            return;
        };
        self.metrics.recovery = Some(progress.started.elapsed());
        let mut missing: Vec<String> = progress.awaiting.into_iter().collect();
        missing.sort();
        let all_missing = missing.len();
        let allowed = (self.config.removal_limit * progress.admitted as f64).floor() as usize;
        if missing.len() > allowed {
            let kept = missing.split_off(allowed);
            tracing::error!(
                missing = kept.len() + missing.len(),
                admitted = progress.admitted,
                limit = self.config.removal_limit,
                kept = kept.len(),
                "more agents missed the re-registration deadline than the removal limit \
                 allows: marking only {} unreachable and keeping the rest",
                missing.len()
            );
        }
        // Their tasks never reached this master, so it cannot tell which service jobs ran
        // there: the first one marked carries an evaluation of every service job. Not when
        // the removal limit keeps some: their tasks may still run, unseen.
        let unknown_tasks = missing.len() == all_missing;
        for id in &missing {
            tracing::warn!(agent = %id, "agent did not re-register by the deadline");
        }
        self.mark_unreachable(missing, unknown_tasks, ctx);
    }
}
