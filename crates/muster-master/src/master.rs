//! The master process: registration, re-registration, agent health and failover recovery.
//!
//! Every master runs one. The one whose registry member leads the raft group is the leading
//! master; the others are standbys and answer agents with the leader's address. A master that
//! becomes leader catches up with the registry, loads the admitted agents, and rebuilds agents,
//! frameworks and tasks from their re-registrations while it goes on answering requests.
//! Agents not back by the deadline are marked unreachable, up to the removal limit.
//!
//! Agents stay connected by heartbeating (Nomad's model): each heartbeat is answered with a TTL
//! that grows with the number of agents, so that the leading master handles a bounded rate of
//! them, and an agent whose TTL and grace pass without one is marked unreachable. A new leader
//! gives every agent it loads from the registry a long first TTL. Mesos-style pings can be
//! turned on as well ([`MasterConfig::pings`]).
//!
//! Handlers never wait: registry writes and pings are deferred, and their results come back as
//! continuations on the process.
//!
//! # Where things are
//! [`MasterMsg`] groups the messages by who sends them; each group's enum and its handlers
//! live in one module:
//! - [`AgentMsg`] (`from_agents`): registration, re-registration, heartbeats, task status.
//! - [`OperatorMsg`] (`from_operators`): cluster state, metrics, jobs, manual launches.
//! - [`SchedulingMsg`] (`from_scheduling`): scheduler workers' snapshots, plans and
//!   evaluation outcomes, and what the blocked-queue releases or cancels.
//! - [`InternalMsg`] (`internal`): the master's own timers, its registry member's leadership
//!   changes, and its transport.
//!
//! What several handlers share lives in modules named for what they hold: `leadership` (the
//! role and its changes), `heartbeats` (deadlines and TTLs), `tasks` (task bookkeeping and
//! replacements), `reregistration` (rebuilding an agent after a failover, the recovery and its
//! deadline), `arriving_agents` (what an agent joining or coming back sets off), `lost_agents`
//! (marking agents unreachable), `drains` (agents' eligibility and drains, carried to their
//! end), `registry_writes` (registry writes with their evaluations, the state index),
//! `crash_loops` (back-off of failing slots).

use std::sync::Arc;
use std::time::Duration;

use muster_actor::{Context, Pid, Process, System};
use muster_broker::blocked::{BlockedEvals, ChannelSink, SinkReceivers};
use muster_broker::{BrokerConfig, EvalBroker};
use muster_registry::RegistryNode;
use muster_transport::Node;

use crate::cluster::Cluster;
use crate::config::MasterConfig;
use crate::error::ServiceError;
use crate::metrics::MasterInstruments;

mod acl_tokens;
mod arriving_agents;
mod convergence;
mod crash_loops;
mod drains;
mod events;
mod figures;
mod from_agents;
mod from_operators;
mod from_scheduling;
mod heartbeats;
mod internal;
mod jobs;
mod leadership;
mod lost_agents;
mod registry_writes;
mod reregistration;
mod tasks;

pub use acl_tokens::AclMsg;
pub use events::{EventFeed, KEPT_EVENTS, Lagged, LoggedEvent, SUBSCRIBER_BUFFER, Subscription};
pub use from_agents::AgentMsg;
pub use from_operators::OperatorMsg;
pub use from_scheduling::{SchedulingMsg, SchedulingPids};
pub use internal::InternalMsg;

use heartbeats::HeartbeatDeadlines;
use leadership::Role;

/// What a master handles, grouped by who sends it.
#[derive(Debug)]
pub enum MasterMsg {
    /// From agents (over the actor transport).
    Agent(AgentMsg),
    /// From operators (the operator API).
    Operator(OperatorMsg),
    /// From scheduler workers and the blocked-queue.
    Scheduling(SchedulingMsg),
    /// From the master itself: timers, leadership changes, its transport.
    Internal(InternalMsg),
}

impl From<AgentMsg> for MasterMsg {
    fn from(msg: AgentMsg) -> Self {
        MasterMsg::Agent(msg)
    }
}

impl From<OperatorMsg> for MasterMsg {
    fn from(msg: OperatorMsg) -> Self {
        MasterMsg::Operator(msg)
    }
}

impl From<SchedulingMsg> for MasterMsg {
    fn from(msg: SchedulingMsg) -> Self {
        MasterMsg::Scheduling(msg)
    }
}

impl From<InternalMsg> for MasterMsg {
    fn from(msg: InternalMsg) -> Self {
        MasterMsg::Internal(msg)
    }
}

impl MasterMsg {
    /// Whether the message needs the registry, and so waits while a new leader catches up
    /// with it.
    fn waits_for_registry(&self) -> bool {
        match self {
            MasterMsg::Agent(msg) => msg.waits_for_registry(),
            MasterMsg::Operator(msg) => msg.waits_for_registry(),
            MasterMsg::Scheduling(msg) => msg.waits_for_registry(),
            MasterMsg::Internal(_) => false,
        }
    }

    /// Answers a request that waited for a leadership this master then lost.
    fn refuse_lost_leadership(self) {
        let error = ServiceError::not_leader(None);
        match self {
            MasterMsg::Agent(msg) => msg.refuse_not_leader(),
            MasterMsg::Operator(msg) => msg.refuse(error),
            MasterMsg::Scheduling(msg) => msg.refuse(error),
            MasterMsg::Internal(_) => {}
        }
    }
}

/// The master's counters.
#[derive(Clone, Copy, Debug, Default)]
struct Metrics {
    registered: u64,
    reregistered: u64,
    unreachable: u64,
    messages: u64,
    recovery: Option<Duration>,
    plans: u64,
    /// Agent messages refused for speaking for an agent bound to another certificate.
    impersonations: u64,
    /// Re-registrations under an id the registry does not hold.
    unknown_agents: u64,
    /// Tasks returning agents were told to kill: given up as lost, and replaced.
    given_up_killed: u64,
    /// Rounds in which a quorum confirmed this master's leadership (before applying plans).
    leadership_confirmations: u64,
    /// Evaluations the convergence check made for jobs that ran other than they ask.
    reconcile_evals: u64,
    /// Kills sent again because the agent did not answer the last one.
    kill_retries: u64,
    /// Kills an agent refused for their term (see `pb::MasterMetrics::kills_fenced`).
    kills_fenced: u64,
}

/// The master process.
#[derive(Debug)]
pub struct Master {
    config: MasterConfig,
    broker: Pid<EvalBroker>,
    blocked: Pid<BlockedEvals>,
    blocked_out: Option<SinkReceivers>,
    /// This master's `host:port`.
    address: String,
    registry: RegistryNode,
    node: Option<Node>,
    role: Role,
    cluster: Cluster,
    metrics: Metrics,
    term: u64,
    /// Bumped on every change to agents or tasks; snapshots and plans carry it.
    state_index: u64,
    /// What changed, for the event stream.
    events: events::EventLog,
    /// While leading: when each tracked agent's next heartbeat is due at the latest (TTL plus
    /// grace).
    heartbeats: HeartbeatDeadlines,
    /// Task slots that failed in a row, for the back-off of their replacements.
    crash_loops: crash_loops::CrashLoops,
    /// The term and the moment until which a quorum's last confirmation of this master's
    /// leadership holds (see `leadership::with_quorum_leadership`).
    leadership_lease: Option<(u64, tokio::time::Instant)>,
    /// Whether this master can do its job: it leads (caught up), or it stands by and knows
    /// who leads. The gRPC health service reports it (see [`Master::serving`]).
    serving: tokio::sync::watch::Sender<bool>,
    /// The histograms and counters observed where things happen, shared with the scheduler
    /// workers (see [`crate::metrics`]).
    instruments: Arc<MasterInstruments>,
    /// The agents draining, as of the last drain check or scheduling change: a task update
    /// of a job with a task on one of them sets off the drain's next step.
    draining: std::collections::BTreeSet<String>,
    /// The job index of the last snapshot, which the next one updates rather than rebuilds.
    job_index: Option<Arc<muster_scheduler::JobIndex>>,
    /// The origin of the clock tasks' launch deadlines are read on
    /// ([`crate::task_record::LaunchDeadline`]).
    launch_clock: tokio::time::Instant,
    /// Batch slots whose task this master told to stop, and whose end is not reported yet:
    /// slot to (agent, task). Schedulers leave them empty meanwhile, so a task that finishes
    /// before the kill reaches it is not run again (see `master/tasks.rs`).
    batch_stops: std::collections::BTreeMap<String, (String, String)>,
}

impl Master {
    /// A master for the registry member `registry`, listening at `address`. Its eval broker
    /// and blocked-queue run as processes of `system`.
    pub fn new(
        config: MasterConfig,
        address: String,
        registry: RegistryNode,
        system: &System,
    ) -> Self {
        let (sink, blocked_out) = ChannelSink::new();
        Master {
            broker: system.spawn(EvalBroker::new(BrokerConfig::default())),
            blocked: system.spawn(BlockedEvals::new(sink)),
            blocked_out: Some(blocked_out),
            config,
            address,
            registry,
            node: None,
            role: Role::Standby { leader: None },
            cluster: Cluster::default(),
            metrics: Metrics::default(),
            term: 0,
            state_index: 0,
            events: events::EventLog::default(),
            heartbeats: HeartbeatDeadlines::default(),
            crash_loops: crash_loops::CrashLoops::default(),
            leadership_lease: None,
            serving: tokio::sync::watch::Sender::new(false),
            instruments: Arc::new(MasterInstruments::new()),
            draining: std::collections::BTreeSet::new(),
            job_index: None,
            launch_clock: tokio::time::Instant::now(),
            batch_stops: std::collections::BTreeMap::new(),
        }
    }

    /// The instruments this master observes (its scheduler workers get them with
    /// [`SchedulingPids`]); [`crate::metrics::render`] encodes them.
    pub fn instruments(&self) -> Arc<MasterInstruments> {
        Arc::clone(&self.instruments)
    }

    /// Follows whether this master can do its job: it leads, caught up with the registry, or
    /// stands by knowing who leads (and so can point a caller there). Take it before the
    /// process is spawned.
    pub fn serving(&self) -> tokio::sync::watch::Receiver<bool> {
        self.serving.subscribe()
    }

    /// Publishes a change of [`serving`](Self::serving).
    fn publish_serving(&self) {
        let now = match &self.role {
            Role::Leading { .. } => true,
            Role::Standby { leader } => leader.is_some(),
            Role::Starting { .. } => false,
        };
        self.serving.send_if_modified(|serving| {
            let changed = *serving != now;
            *serving = now;
            changed
        });
    }

    fn on_message(&mut self, msg: MasterMsg, ctx: &mut Context<Self>) {
        self.metrics.messages += 1;
        // Requests that need the registry wait while a new leader catches up with it.
        if let Role::Starting { waiting, .. } = &mut self.role
            && msg.waits_for_registry()
        {
            waiting.push(msg);
            return;
        }
        match msg {
            MasterMsg::Agent(msg) => self.on_agent(msg, ctx),
            MasterMsg::Operator(msg) => self.on_operator(msg, ctx),
            MasterMsg::Scheduling(msg) => self.on_scheduling(msg, ctx),
            MasterMsg::Internal(msg) => self.on_internal(msg, ctx),
        }
    }
}

impl Process for Master {
    type Message = MasterMsg;

    async fn started(&mut self, ctx: &mut Context<Self>) {
        // Follow the registry's leadership as messages to this process.
        let mut leadership = self.registry.leadership();
        let me = ctx.pid().clone();
        let instruments = Arc::clone(&self.instruments);
        tokio::spawn(async move {
            // Counted: each leader (or term) seen, from none known at the start.
            let mut seen = muster_registry::Leadership {
                leader: None,
                is_self: false,
                term: 0,
            };
            loop {
                let now = leadership.borrow_and_update().clone();
                if now != seen {
                    instruments.leader_changed();
                    seen = now.clone();
                }
                if me.tell(InternalMsg::Leadership(now).into()).is_err() {
                    return;
                }
                if leadership.changed().await.is_err() {
                    return;
                }
            }
        });
        if self.config.pings {
            ctx.interval(self.config.ping_interval, || InternalMsg::PingAgents.into());
        }
        ctx.interval(
            heartbeats::sweep_period(self.config.heartbeat_min_ttl),
            || InternalMsg::CheckHeartbeats.into(),
        );
        ctx.interval(self.config.reconcile_interval, || {
            InternalMsg::Reconcile.into()
        });
        ctx.interval(drains::DRAIN_CHECK, || InternalMsg::CheckDrains.into());
        // What the blocked-queue releases or cancels comes back here to be recorded.
        if let Some(SinkReceivers {
            mut unblocked,
            mut canceled,
        }) = self.blocked_out.take()
        {
            let me = ctx.pid().clone();
            tokio::spawn(async move {
                while let Some(evals) = unblocked.recv().await {
                    if me
                        .tell(SchedulingMsg::EvalsUnblocked(evals).into())
                        .is_err()
                    {
                        return;
                    }
                }
            });
            let me = ctx.pid().clone();
            tokio::spawn(async move {
                while let Some(evals) = canceled.recv().await {
                    if me.tell(SchedulingMsg::EvalsCanceled(evals).into()).is_err() {
                        return;
                    }
                }
            });
        }
    }

    async fn handle(&mut self, msg: MasterMsg, ctx: &mut Context<Self>) {
        self.on_message(msg, ctx);
        self.publish_serving();
    }
}
