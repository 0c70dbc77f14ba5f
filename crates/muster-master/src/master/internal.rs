//! What the master tells itself ([`InternalMsg`]) and its handlers: leadership changes from its
//! registry member, its timers (pings, the heartbeat sweep, launch timeouts, the
//! re-registration deadline), and the transport it reaches agents through.

use std::time::Duration;

use muster_actor::{Context, Upid};
use muster_model::TaskState;
use muster_proto::cluster as pb;
use muster_registry::{Leadership, Registrar, WriteError};
use muster_transport::Node;
use tokio::time::Instant;

use super::Master;
use super::heartbeats::MAX_HEARTBEAT_TTL;
use super::leadership::{Recovery, Role};
use crate::cluster::{AgentEntry, Cluster};

/// What the master sends itself.
#[derive(Debug)]
pub enum InternalMsg {
    /// The node to reach agents through (pings, launches). Without one the master only answers.
    UseNode(Node),
    /// The registry's leader changed.
    Leadership(Leadership),
    /// Time to ping the connected agents.
    PingAgents,
    /// Time to mark the agents whose heartbeat deadline passed unreachable.
    CheckHeartbeats,
    /// Time to check the launches on this agent: tasks still STAGING past their launch
    /// deadline are lost.
    CheckLaunches(String),
    /// Time for the leader's check that jobs run what they ask for.
    Reconcile,
    /// Time for the leader's check of the drains under way.
    CheckDrains,
    /// The re-registration deadline of the recovery begun in `term`.
    ReregistrationDeadline {
        /// The term the recovery belongs to.
        term: u64,
    },
    /// The end of the hold on placements of the recovery begun in `term` (see
    /// [`RECOVERY_PLACEMENT_HOLD`]).
    EndPlacementHold {
        /// The term the recovery belongs to.
        term: u64,
    },
    /// Try again to take up the leadership of `term`, whose catching up with the registry
    /// failed (no quorum at that moment): raft may still have this master lead that term.
    #[doc(hidden)]
    RetryLeading {
        /// The term.
        term: u64,
    },
}

/// How long a new leader holds every evaluation back, at most, while admitted agents have not
/// re-registered: their tasks are not known yet, and a scheduler that placed meanwhile would
/// place second copies of what they run. Their re-registration ends the hold sooner (most
/// come back within seconds of the leader's announcement); an agent still away after it is
/// taken as gone until it returns (the convergence check then stops the extra copy).
pub(super) const RECOVERY_PLACEMENT_HOLD: Duration = Duration::from_secs(30);

/// How long a leader whose catching up failed waits before it tries again.
const CATCH_UP_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

impl Master {
    pub(super) fn on_internal(&mut self, msg: InternalMsg, ctx: &mut Context<Self>) {
        match msg {
            InternalMsg::UseNode(node) => self.node = Some(node),
            InternalMsg::Leadership(leadership) => self.on_leadership(leadership, ctx),
            InternalMsg::PingAgents => self.ping_agents(ctx),
            InternalMsg::CheckHeartbeats => self.check_heartbeats(ctx),
            InternalMsg::CheckLaunches(agent_id) => self.check_launches(agent_id, ctx),
            InternalMsg::CheckDrains => self.check_drains(ctx),
            InternalMsg::ReregistrationDeadline { term } => self.on_deadline(term, ctx),
            InternalMsg::EndPlacementHold { term } => {
                if self.leading_term() == Some(term) {
                    self.release_placements("the hold on placements ran out");
                }
            }
            InternalMsg::Reconcile => self.reconcile_jobs(ctx),
            InternalMsg::RetryLeading { term } => {
                let leadership = self.registry.leadership().borrow().clone();
                let standing_by = matches!(self.role, Role::Standby { .. });
                if standing_by && leadership.is_self && leadership.term == term {
                    self.become_leader(term, ctx);
                }
            }
        }
    }

    // ---- leadership ----

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
            let _ = ctx.delay(CATCH_UP_RETRY, InternalMsg::RetryLeading { term }.into());
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
                InternalMsg::ReregistrationDeadline { term }.into(),
            );
            let hold = ctx.delay(
                RECOVERY_PLACEMENT_HOLD.min(self.config.reregistration_timeout),
                InternalMsg::EndPlacementHold { term }.into(),
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

    // ---- health ----

    /// Marks the connected agents whose heartbeat deadline passed unreachable. Agents still
    /// awaited after a failover are left to the re-registration deadline (and its removal
    /// limit).
    fn check_heartbeats(&mut self, ctx: &mut Context<Self>) {
        if self.leading_term().is_none() {
            return;
        }
        let mut gone = Vec::new();
        for id in self.heartbeats.take_expired(Instant::now()) {
            let Some(agent) = self.cluster.agents.get_mut(&id) else {
                continue;
            };
            if !agent.connected {
                continue;
            }
            agent.connected = false;
            tracing::warn!(agent = %id, "agent missed its heartbeat deadline");
            gone.push(id);
        }
        self.mark_unreachable(gone, false, ctx);
    }

    fn ping_agents(&mut self, ctx: &mut Context<Self>) {
        let (Some(node), Some(_)) = (&self.node, self.leading_term()) else {
            return;
        };
        let me = format!("master@{}", self.address);
        let timeout = self.config.ping_timeout;
        for (id, agent) in &mut self.cluster.agents {
            if !agent.connected || agent.ping_in_flight {
                continue;
            }
            let Some(remote) = agent.remote(node).cloned() else {
                agent.missed_pings += 1;
                continue;
            };
            agent.ping_in_flight = true;
            let ping = pb::Ping { master: me.clone() };
            let id = id.clone();
            ctx.defer(
                async move {
                    remote
                        .ask_timeout::<pb::Ping, pb::Pong>(timeout, ping)
                        .await
                },
                move |master: &mut Master, ctx, answered| master.on_pong(id, answered.is_ok(), ctx),
            );
        }
    }

    fn on_pong(&mut self, id: String, answered: bool, ctx: &mut Context<Self>) {
        let max = self.config.max_missed_pings;
        let Some(agent) = self.cluster.agents.get_mut(&id) else {
            return;
        };
        agent.ping_in_flight = false;
        if answered {
            agent.missed_pings = 0;
            return;
        }
        agent.missed_pings += 1;
        tracing::debug!(agent = %id, missed = agent.missed_pings, "agent missed a ping");
        if agent.missed_pings >= max && agent.connected {
            agent.connected = false;
            tracing::warn!(agent = %id, missed = max, "agent missed too many pings");
            self.mark_unreachable(vec![id], false, ctx);
        }
    }

    // ---- launches ----

    /// Tasks on `agent_id` still STAGING past their launch deadline, with no word from the
    /// agent since (a one-way launch can be lost with a broken link): LOST, and replaced. One
    /// walk over the agent's tasks; the next check comes at the earliest deadline left.
    fn check_launches(&mut self, agent_id: String, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let origin = self.launch_clock;
        let Some(agent) = self.cluster.agents.get_mut(&agent_id) else {
            return;
        };
        agent.launch_check_due = false;
        let mut next: Option<Duration> = None;
        let mut silent = Vec::new();
        for task in agent
            .tasks
            .iter()
            .filter(|t| t.state() == TaskState::Staging)
        {
            let Some(deadline) = task.launch_deadline else {
                continue;
            };
            match deadline.remaining(origin, now) {
                Duration::ZERO => silent.push(task.clone()),
                left => next = Some(next.map_or(left, |next| next.min(left))),
            }
        }
        if let Some(wait) = next {
            agent.launch_check_due = true;
            ctx.delay(wait, InternalMsg::CheckLaunches(agent_id.clone()).into());
        }
        for mut lost in silent {
            tracing::warn!(agent = %agent_id, task = %lost.id(), "no word from the agent about a launched task: lost");
            lost.set_state(TaskState::Lost);
            lost.message = format!(
                "no word from the agent within {:?} of the launch",
                self.config.launch_timeout
            )
            .into();
            self.record_updated(agent_id.clone(), lost, ctx);
        }
    }
}
