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

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use muster_actor::{Context, Node, Pid, Process, Reply, System, TimerHandle, Upid};
use muster_broker::blocked::{BlockedEvals, ChannelSink, SinkReceivers};
use muster_broker::{BrokerConfig, EvalBroker};
use muster_proto::cluster as pb;
use muster_registry::jobs::Evaluation;
use muster_registry::{
    AgentId, Leadership, Op, Outcome, Registrar, RegistrarMsg, RegistrarStats, RegistryNode,
    WriteError,
};
use muster_scheduler::{ClusterSnapshot, Demand, Plan, PlanResult};
use tokio::time::Instant;

use crate::cluster::{AgentEntry, Cluster, registry_info, same_info, wire_info};
use crate::config::MasterConfig;

mod crash_loops;
mod plans;
mod scheduling;

/// What a master handles: agents' and operators' requests, and its own timers and
/// continuations.
#[derive(Debug)]
pub enum MasterMsg {
    /// An agent asks to be admitted.
    Register(pb::RegisterAgent, Reply<pb::RegistrationReply>),
    /// An agent comes back with everything it runs.
    Reregister(pb::ReregisterAgent, Reply<pb::RegistrationReply>),
    /// The cluster as this master sees it.
    GetState(Reply<pb::ClusterState>),
    /// This master's counters.
    GetMetrics(Reply<pb::MasterMetrics>),
    /// Launch a task on an agent.
    LaunchTask(pb::LaunchTaskRequest, Reply<Result<(), String>>),
    /// The node to reach agents through (pings, launches). Without one the master only answers.
    UseNode(Node),
    /// The registry's leader changed.
    Leadership(Leadership),
    /// Time to ping the connected agents.
    PingAgents,
    /// An agent's heartbeat.
    Heartbeat(pb::Heartbeat, Reply<pb::HeartbeatReply>),
    /// Time to mark the agents whose heartbeat deadline passed unreachable.
    CheckHeartbeats,
    /// Launched tasks (agent id, task id) whose launch timeout ran out: the ones still
    /// STAGING are lost.
    #[doc(hidden)]
    LaunchesTimedOut(Vec<(String, String)>),
    /// The re-registration deadline of the recovery begun in `term`.
    ReregistrationDeadline {
        /// The term the recovery belongs to.
        term: u64,
    },
    /// Submit a job (new or changed).
    SubmitJob(
        Option<pb::JobSpec>,
        Reply<Result<pb::SubmitJobReply, String>>,
    ),
    /// Stop a job.
    StopJob(String, Reply<Result<pb::SubmitJobReply, String>>),
    /// A job, its tasks and evaluations.
    JobStatus(String, Reply<Result<pb::JobStatusReply, String>>),
    /// The master's eval broker and blocked-queue.
    Scheduling(Reply<SchedulingPids>),
    /// The blocked-queue released these evaluations.
    EvalsUnblocked(Vec<Evaluation>),
    /// The blocked-queue canceled these evaluations.
    EvalsCanceled(Vec<Evaluation>),
    /// The cluster as schedulers see it.
    Snapshot(Reply<ClusterSnapshot>),
    /// Apply a scheduler's plan.
    SubmitPlan(Plan, Reply<Result<PlanResult, String>>),
    /// A worker could not place everything the evaluation asks for.
    BlockEval {
        /// The evaluation.
        eval: Evaluation,
        /// What did not fit.
        unplaced: Vec<Demand>,
        /// The snapshot index the plan was made against.
        snapshot_index: u64,
        /// Done once recorded.
        reply: Reply<Result<(), String>>,
    },
    /// A worker planned the evaluation fully.
    CompleteEval(Evaluation, Reply<Result<(), String>>),
    /// An agent reports a task's state.
    TaskStatus(pb::TaskStatusUpdate),
}

/// The processes beside the master that hold its scheduling state.
#[derive(Clone, Debug)]
pub struct SchedulingPids {
    /// The eval broker.
    pub broker: Pid<EvalBroker>,
    /// The blocked-queue.
    pub blocked: Pid<BlockedEvals>,
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
}

/// A failover recovery in progress.
#[derive(Debug)]
struct Recovery {
    started: Instant,
    awaiting: HashSet<String>,
    admitted: usize,
    deadline: TimerHandle,
}

#[derive(Debug)]
enum Role {
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

/// The heartbeat deadlines of the agents the leading master tracks, in the order they fall due:
/// one periodic sweep takes the overdue ones, with no timer per agent.
#[derive(Debug, Default)]
struct HeartbeatDeadlines {
    by_deadline: BTreeSet<(Instant, String)>,
    by_agent: HashMap<String, Instant>,
}

impl HeartbeatDeadlines {
    /// How many agents are tracked.
    fn len(&self) -> usize {
        self.by_agent.len()
    }

    fn get(&self, id: &str) -> Option<Instant> {
        self.by_agent.get(id).copied()
    }

    /// Sets (or moves) the agent's deadline.
    fn set(&mut self, id: &str, deadline: Instant) {
        if let Some(old) = self.by_agent.insert(id.to_owned(), deadline) {
            self.by_deadline.remove(&(old, id.to_owned()));
        }
        self.by_deadline.insert((deadline, id.to_owned()));
    }

    fn remove(&mut self, id: &str) {
        if let Some(old) = self.by_agent.remove(id) {
            self.by_deadline.remove(&(old, id.to_owned()));
        }
    }

    /// Takes out the agents whose deadline is at or before `now`, earliest first.
    fn take_expired(&mut self, now: Instant) -> Vec<String> {
        let mut expired = Vec::new();
        while let Some((deadline, _)) = self.by_deadline.first() {
            if *deadline > now {
                break;
            }
            if let Some((_, id)) = self.by_deadline.pop_first() {
                self.by_agent.remove(&id);
                expired.push(id);
            }
        }
        expired
    }

    fn clear(&mut self) {
        self.by_deadline.clear();
        self.by_agent.clear();
    }
}

/// The longest heartbeat TTL the master gives, whatever the config says (keeps the arithmetic
/// on instants from overflowing).
const MAX_HEARTBEAT_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The TTL before stagger for `agents` agents: `max(min_ttl, agents / per_second s)`.
fn heartbeat_base_ttl(min_ttl: Duration, per_second: f64, agents: usize) -> Duration {
    let scaled = if per_second > 0.0 {
        Duration::try_from_secs_f64(agents as f64 / per_second).unwrap_or(MAX_HEARTBEAT_TTL)
    } else {
        Duration::ZERO
    };
    min_ttl.max(scaled).min(MAX_HEARTBEAT_TTL)
}

/// How often the leading master looks for overdue heartbeats: a tenth of the minimum TTL,
/// between 10 ms and 1 s.
fn heartbeat_sweep_period(min_ttl: Duration) -> Duration {
    (min_ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

fn heartbeat_reply(result: pb::heartbeat_reply::Result) -> pb::HeartbeatReply {
    pb::HeartbeatReply {
        result: Some(result),
    }
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
    /// While leading: when each tracked agent's next heartbeat is due at the latest (TTL plus
    /// grace).
    heartbeats: HeartbeatDeadlines,
    /// Task slots that failed in a row, for the back-off of their replacements.
    crash_loops: crash_loops::CrashLoops,
}

fn not_leader(leader: Option<&(u64, String)>) -> pb::RegistrationReply {
    pb::RegistrationReply {
        result: Some(pb::registration_reply::Result::NotLeader(pb::NotLeader {
            leader: leader
                .map(|(_, address)| format!("master@{address}"))
                .unwrap_or_default(),
        })),
    }
}

fn admitted(id: String) -> pb::RegistrationReply {
    pb::RegistrationReply {
        result: Some(pb::registration_reply::Result::AgentId(id)),
    }
}

fn refused(why: String) -> pb::RegistrationReply {
    pb::RegistrationReply {
        result: Some(pb::registration_reply::Result::Refused(why)),
    }
}

/// A registry write as a future the process can defer.
fn write_registry(
    registrar: &Pid<Registrar>,
    op: Op,
) -> impl std::future::Future<Output = Result<muster_registry::WriteResult, muster_actor::AskError>>
+ Send
+ 'static {
    let registrar = registrar.clone();
    async move { registrar.ask(|r| RegistrarMsg::Write(op, r)).await }
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
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
            heartbeats: HeartbeatDeadlines::default(),
            crash_loops: crash_loops::CrashLoops::default(),
        }
    }

    fn leader(&self) -> Option<(u64, String)> {
        match &self.role {
            Role::Standby { leader } => leader.clone(),
            Role::Starting { .. } | Role::Leading { .. } => {
                Some((self.registry.id(), self.address.clone()))
            }
        }
    }

    fn leading_term(&self) -> Option<u64> {
        match &self.role {
            Role::Leading { term, .. } => Some(*term),
            _ => None,
        }
    }

    fn on_message(&mut self, msg: MasterMsg, ctx: &mut Context<Self>) {
        self.metrics.messages += 1;
        // Requests that need the registry wait while a new leader catches up with it.
        if let Role::Starting { waiting, .. } = &mut self.role
            && matches!(
                msg,
                MasterMsg::Register(..)
                    | MasterMsg::Reregister(..)
                    | MasterMsg::Heartbeat(..)
                    | MasterMsg::LaunchTask(..)
                    | MasterMsg::SubmitJob(..)
                    | MasterMsg::StopJob(..)
                    | MasterMsg::JobStatus(..)
                    | MasterMsg::SubmitPlan(..)
                    | MasterMsg::BlockEval { .. }
                    | MasterMsg::CompleteEval(..)
            )
        {
            waiting.push(msg);
            return;
        }
        match msg {
            MasterMsg::Register(request, reply) => self.register(request, reply, ctx),
            MasterMsg::Reregister(request, reply) => self.reregister(request, reply, ctx),
            MasterMsg::GetState(reply) => reply.send(self.state()),
            MasterMsg::GetMetrics(reply) => self.send_metrics(reply, ctx),
            MasterMsg::LaunchTask(request, reply) => self.launch(request, reply, ctx),
            MasterMsg::UseNode(node) => self.node = Some(node),
            MasterMsg::Leadership(leadership) => self.on_leadership(leadership, ctx),
            MasterMsg::PingAgents => self.ping_agents(ctx),
            MasterMsg::Heartbeat(heartbeat, reply) => self.on_heartbeat(heartbeat, reply),
            MasterMsg::CheckHeartbeats => self.check_heartbeats(ctx),
            MasterMsg::LaunchesTimedOut(staged) => self.launches_timed_out(staged, ctx),
            MasterMsg::ReregistrationDeadline { term } => self.on_deadline(term, ctx),
            MasterMsg::SubmitJob(spec, reply) => self.submit_job(spec, reply, ctx),
            MasterMsg::StopJob(name, reply) => self.stop_job(name, reply, ctx),
            MasterMsg::JobStatus(name, reply) => reply.send(self.job_status(&name)),
            MasterMsg::Scheduling(reply) => reply.send(SchedulingPids {
                broker: self.broker.clone(),
                blocked: self.blocked.clone(),
            }),
            MasterMsg::EvalsUnblocked(evals) => self.evals_unblocked(evals, ctx),
            MasterMsg::EvalsCanceled(evals) => self.evals_canceled(evals, ctx),
            MasterMsg::Snapshot(reply) => reply.send(self.snapshot()),
            MasterMsg::SubmitPlan(plan, reply) => self.apply_plan(plan, reply, ctx),
            MasterMsg::BlockEval {
                eval,
                unplaced,
                snapshot_index,
                reply,
            } => self.block_eval(eval, unplaced, snapshot_index, reply, ctx),
            MasterMsg::CompleteEval(eval, reply) => self.complete_eval(eval, reply, ctx),
            MasterMsg::TaskStatus(update) => {
                if let Some(task) = update.task {
                    self.task_updated(update.agent_id, task, ctx);
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
            match msg {
                MasterMsg::Register(_, reply) | MasterMsg::Reregister(_, reply) => {
                    reply.send(not_leader(None));
                }
                MasterMsg::Heartbeat(_, reply) => {
                    reply.send(heartbeat_reply(pb::heartbeat_reply::Result::NotLeader(
                        pb::NotLeader::default(),
                    )));
                }
                MasterMsg::LaunchTask(_, reply) => {
                    reply.send(Err("the master lost leadership".into()));
                }
                MasterMsg::SubmitJob(_, reply) | MasterMsg::StopJob(_, reply) => {
                    reply.send(Err("the master lost leadership".into()));
                }
                MasterMsg::JobStatus(_, reply) => {
                    reply.send(Err("the master lost leadership".into()));
                }
                MasterMsg::SubmitPlan(_, reply) => {
                    reply.send(Err("the master lost leadership".into()));
                }
                MasterMsg::BlockEval { reply, .. } | MasterMsg::CompleteEval(_, reply) => {
                    reply.send(Err("the master lost leadership".into()));
                }
                _ => {}
            }
        }
        self.cluster = Cluster::default();
        self.heartbeats.clear();
    }

    fn become_leader(&mut self, term: u64, ctx: &mut Context<Self>) {
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
            tracing::warn!(error = %e, "could not catch up with the registry; standing by");
            self.stop_leading();
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
                MasterMsg::ReregistrationDeadline { term },
            );
            Some(Recovery {
                started: Instant::now(),
                awaiting: admitted.iter().map(|(id, _)| id.clone()).collect(),
                admitted: admitted.len(),
                deadline,
            })
        };
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
        self.cluster.agents = admitted.into_iter().collect();
        self.role = Role::Leading {
            term,
            registrar,
            recovery,
        };
        self.restore_scheduling();
        for msg in waiting {
            self.on_message(msg, ctx);
        }
    }

    // ---- registration ----

    fn register(
        &mut self,
        request: pb::RegisterAgent,
        reply: Reply<pb::RegistrationReply>,
        ctx: &mut Context<Self>,
    ) {
        let Role::Leading { registrar, .. } = &self.role else {
            return reply.send(not_leader(self.leader().as_ref()));
        };
        let Some(info) = request.info else {
            return reply.send(refused("RegisterAgent carries no agent info".into()));
        };
        let write = write_registry(registrar, Op::AdmitAgent(registry_info(&info)));
        let term = self.term;
        ctx.defer(
            write,
            move |master: &mut Master, ctx, written| match written {
                Ok(Ok(Outcome::Admitted(id))) => {
                    if master.leading_term() == Some(term) {
                        tracing::info!(agent = %id, address = %info.address, "agent registered");
                        master.metrics.registered += 1;
                        master.cluster.agents.insert(
                            id.0.clone(),
                            AgentEntry::connected(info, Vec::new(), Vec::new()),
                        );
                        master.heartbeat_received(&id.0);
                        master.agent_joined(&id.0, ctx);
                    }
                    reply.send(admitted(id.0));
                }
                Ok(Err(WriteError::NotLeader { leader })) => {
                    reply.send(not_leader(leader.as_ref()))
                }
                Ok(other) => reply.send(refused(format!("registry write failed: {other:?}"))),
                Err(e) => reply.send(refused(format!("registrar unavailable: {e}"))),
            },
        );
    }

    fn reregister(
        &mut self,
        request: pb::ReregisterAgent,
        reply: Reply<pb::RegistrationReply>,
        ctx: &mut Context<Self>,
    ) {
        if self.leading_term().is_none() {
            return reply.send(not_leader(self.leader().as_ref()));
        }
        let Some(info) = request.info.as_ref() else {
            return reply.send(refused("ReregisterAgent carries no agent info".into()));
        };
        if request.agent_id.is_empty() {
            return reply.send(refused("ReregisterAgent carries no agent id".into()));
        }
        let id = AgentId(request.agent_id.clone());
        let unchanged = self.registry.reader().read(|state| {
            state
                .agents
                .get(&id)
                .is_some_and(|stored| same_info(info, stored))
        });
        if unchanged {
            // The common case after a failover: nothing to write.
            let id = self.readmit(request, ctx);
            return reply.send(admitted(id));
        }
        // Changed info, or an agent marked unreachable (or forgotten) coming back: store it,
        // with an evaluation for each job its return affects, in one raft entry; then take it
        // back.
        let evals = self.evals_for_arriving_agent(&request.agent_id, &request.tasks);
        let info = registry_info(info);
        let term = self.term;
        self.write_with_evals(
            vec![Op::UpdateAgent { id, info }],
            evals,
            ctx,
            move |master, ctx, written| match written {
                Ok(_) if master.leading_term() == Some(term) => {
                    let id = master.readmit(request, ctx);
                    // It was unreachable, forgotten or changed: its capacity is news.
                    master.capacity_joined(&id);
                    reply.send(admitted(id));
                }
                Ok(_) => reply.send(not_leader(master.leader().as_ref())),
                Err(WriteError::NotLeader { leader }) => reply.send(not_leader(leader.as_ref())),
                Err(e) => reply.send(refused(format!("registry write failed: {e}"))),
            },
        );
    }

    /// Rebuilds an agent, its tasks and frameworks from its re-registration, then settles what
    /// this master knew of it with what it reports (see `settle_reregistered`).
    fn readmit(&mut self, request: pb::ReregisterAgent, ctx: &mut Context<Self>) -> String {
        let pb::ReregisterAgent {
            agent_id,
            info,
            frameworks,
            tasks,
            completed_frameworks,
            completed_tasks,
        } = request;
        self.cluster.add_frameworks(frameworks);
        for framework in completed_frameworks {
            if !self.cluster.frameworks.contains_key(&framework.id) {
                self.cluster.completed_frameworks.insert(framework.id);
            }
        }
        let previous = self.cluster.agents.insert(
            agent_id.clone(),
            AgentEntry::connected(info.unwrap_or_default(), tasks, completed_tasks),
        );
        // A re-registration counts as a heartbeat, but does not cut short the long first TTL
        // a new leader gave the agent.
        let first = self.heartbeats.get(&agent_id);
        self.heartbeat_received(&agent_id);
        if let Some(first) = first
            && self
                .heartbeats
                .get(&agent_id)
                .is_some_and(|now| now < first)
        {
            self.heartbeats.set(&agent_id, first);
        }
        self.metrics.reregistered += 1;
        if let Role::Leading { recovery, .. } = &mut self.role
            && let Some(progress) = recovery
        {
            progress.awaiting.remove(&agent_id);
            if progress.awaiting.is_empty() {
                let took = progress.started.elapsed();
                tracing::info!(
                    agents = progress.admitted,
                    took = ?took,
                    "every admitted agent re-registered; recovery done"
                );
                self.metrics.recovery = Some(took);
                progress.deadline.cancel();
                *recovery = None;
            }
        }
        if let Some(previous) = previous {
            self.settle_reregistered(&agent_id, previous, ctx);
        }
        agent_id
    }

    fn on_deadline(&mut self, term: u64, ctx: &mut Context<Self>) {
        let Role::Leading {
            term: leading,
            recovery,
            ..
        } = &mut self.role
        else {
            return;
        };
        if *leading != term {
            return;
        }
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

    /// Moves agents found gone together (one heartbeat sweep, one deadline) to unreachable,
    /// with one evaluation for each job any of them ran a task of (and each system job; with
    /// `unknown_tasks`, each service job too), all in one raft entry: 500 agents lost at once
    /// make one evaluation per job, not one per job per agent.
    fn mark_unreachable(&mut self, ids: Vec<String>, unknown_tasks: bool, ctx: &mut Context<Self>) {
        if ids.is_empty() {
            return;
        }
        let evals = self.evals_for_lost_agents(&ids, unknown_tasks);
        let at_ms = now_ms();
        let ops = ids
            .iter()
            .map(|id| Op::MarkUnreachable {
                id: AgentId(id.clone()),
                at_ms,
            })
            .collect();
        self.write_with_evals(ops, evals, ctx, move |master, _ctx, written| match written {
            Ok(_) => {
                for id in &ids {
                    master.metrics.unreachable += 1;
                    master.cluster.agents.remove(id);
                    master.heartbeats.remove(id);
                    tracing::warn!(agent = %id, "agent marked unreachable");
                }
                master.next_index();
            }
            Err(e) => {
                tracing::warn!(agents = ids.len(), error = %e, "could not mark agents unreachable")
            }
        });
    }

    // ---- health ----

    /// Answers an agent's heartbeat with its next TTL, and moves its deadline.
    fn on_heartbeat(&mut self, heartbeat: pb::Heartbeat, reply: Reply<pb::HeartbeatReply>) {
        use pb::heartbeat_reply::Result as Answer;
        if self.leading_term().is_none() {
            let leader = self
                .leader()
                .map(|(_, address)| format!("master@{address}"))
                .unwrap_or_default();
            return reply.send(heartbeat_reply(Answer::NotLeader(pb::NotLeader { leader })));
        }
        let id = heartbeat.agent_id;
        let connected = self.cluster.agents.get(&id).is_some_and(|a| a.connected);
        if !connected {
            let why = if id.is_empty() {
                "the heartbeat carries no agent id".to_owned()
            } else if self.cluster.agents.contains_key(&id) {
                format!("agent {id} has not re-registered with this master; re-register")
            } else {
                format!("agent {id} is not registered (unknown or unreachable); re-register")
            };
            return reply.send(heartbeat_reply(Answer::Refused(why)));
        }
        let ttl = self.heartbeat_received(&id);
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        reply.send(heartbeat_reply(Answer::TtlMs(ttl_ms)));
    }

    /// The agent was just heard from: gives it a new TTL (with stagger) and moves its deadline
    /// to that TTL plus the grace from now. Returns the TTL.
    fn heartbeat_received(&mut self, id: &str) -> Duration {
        // The agent itself counts: a first heartbeat is for one more agent.
        let agents = self.heartbeats.len() + usize::from(self.heartbeats.get(id).is_none());
        let base = heartbeat_base_ttl(
            self.config.heartbeat_min_ttl,
            self.config.heartbeats_per_second,
            agents,
        );
        let ttl = base + base.mul_f64(fastrand::f64());
        let deadline = Instant::now() + ttl + self.config.heartbeat_grace.min(MAX_HEARTBEAT_TTL);
        self.heartbeats.set(id, deadline);
        ttl
    }

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
            let Ok(upid) = agent.info.address.parse::<Upid>() else {
                agent.missed_pings += 1;
                continue;
            };
            agent.ping_in_flight = true;
            let remote = node.remote(upid);
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

    // ---- tasks ----

    fn launch(
        &mut self,
        request: pb::LaunchTaskRequest,
        reply: Reply<Result<(), String>>,
        ctx: &mut Context<Self>,
    ) {
        if self.leading_term().is_none() {
            let leader = self.leader().map(|(_, a)| a).unwrap_or_default();
            return reply.send(Err(format!("not the leading master (leader: {leader:?})")));
        }
        let Some(node) = &self.node else {
            return reply.send(Err("this master has no transport to reach agents".into()));
        };
        let Some(agent) = self.cluster.agents.get(&request.agent_id) else {
            return reply.send(Err(format!("unknown agent {:?}", request.agent_id)));
        };
        if !agent.connected {
            return reply.send(Err(format!("agent {} is not connected", request.agent_id)));
        }
        let (Some(framework), Some(mut task)) = (request.framework, request.task) else {
            return reply.send(Err("LaunchTask needs a framework and a task".into()));
        };
        if task.id.is_empty() {
            return reply.send(Err("the task has no id".into()));
        }
        let upid = match agent.info.address.parse::<Upid>() {
            Ok(upid) => upid,
            Err(e) => return reply.send(Err(format!("agent address: {e}"))),
        };
        if agent.tasks.iter().any(|t| t.id == task.id) {
            return reply.send(Err(format!("task {:?} already runs there", task.id)));
        }
        task.framework_id = framework.id.clone();
        task.state = pb::TaskState::Staging as i32;
        let run = pb::RunTask {
            framework: Some(framework.clone()),
            task: Some(task.clone()),
        };
        let remote = node.remote(upid);
        let timeout = self.config.ping_timeout;
        let agent_id = request.agent_id;
        let task_id = task.id.clone();
        // Recorded before it is sent: the agent's first status update may come before the
        // answer to the launch.
        if let Some(agent) = self.cluster.agent_mut(&agent_id) {
            agent.tasks.push(task);
        }
        self.cluster.add_frameworks(vec![framework]);
        ctx.defer(
            async move {
                remote
                    .ask_timeout::<pb::RunTask, pb::RunTaskReply>(timeout, run)
                    .await
            },
            move |master: &mut Master, _ctx, answered| {
                let refused = match answered {
                    Ok(answer) if answer.error.is_empty() => return reply.send(Ok(())),
                    Ok(answer) => format!("agent refused the task: {}", answer.error),
                    Err(e) => format!("agent unreachable: {e}"),
                };
                if let Some(agent) = master.cluster.agent_mut(&agent_id) {
                    agent.tasks.retain(|t| t.id != task_id);
                }
                reply.send(Err(refused));
            },
        );
    }

    // ---- reports ----

    fn state(&self) -> pb::ClusterState {
        let leader = self.leader();
        let is_leader = self.leading_term().is_some();
        let mut state = pb::ClusterState {
            leader: leader.map(|(_, a)| a).unwrap_or_default(),
            is_leader,
            term: self.term,
            recovering: matches!(
                &self.role,
                Role::Starting { .. }
                    | Role::Leading {
                        recovery: Some(_),
                        ..
                    }
            ),
            ..pb::ClusterState::default()
        };
        if !is_leader {
            return state;
        }
        state.unreachable = self.registry.reader().read(|registry| {
            registry
                .unreachable
                .iter()
                .map(|(id, agent)| pb::UnreachableAgent {
                    id: id.0.clone(),
                    info: Some(wire_info(&agent.info)),
                    marked_at_ms: agent.marked_at_ms,
                })
                .collect()
        });
        // An agent just marked unreachable leaves the in-memory table only when its registry
        // write is answered; one report never lists it in both places.
        let marked: HashSet<&str> = state.unreachable.iter().map(|a| a.id.as_str()).collect();
        let mut agents: Vec<pb::AgentState> = self
            .cluster
            .agents
            .iter()
            .filter(|(id, _)| !marked.contains(id.as_str()))
            .map(|(id, agent)| pb::AgentState {
                id: id.clone(),
                info: Some(agent.info.clone()),
                tasks: agent.tasks.clone(),
                completed_tasks: agent.completed_tasks.clone(),
                connected: agent.connected,
            })
            .collect();
        agents.sort_by(|a, b| a.id.cmp(&b.id));
        state.agents = agents;
        let mut frameworks: Vec<pb::Framework> =
            self.cluster.frameworks.values().cloned().collect();
        frameworks.sort_by(|a, b| a.id.cmp(&b.id));
        state.frameworks = frameworks;
        state
    }

    fn send_metrics(&self, reply: Reply<pb::MasterMetrics>, ctx: &mut Context<Self>) {
        let metrics = pb::MasterMetrics {
            is_leader: self.leading_term().is_some(),
            agents_registered: self.metrics.registered,
            agents_reregistered: self.metrics.reregistered,
            agents_unreachable: self.metrics.unreachable,
            messages_handled: self.metrics.messages,
            recovery_seconds: self.metrics.recovery.map_or(0.0, |d| d.as_secs_f64()),
            agents_connected: self.cluster.connected_agents() as u64,
            registry_entries: 0,
        };
        let Role::Leading { registrar, .. } = &self.role else {
            return reply.send(metrics);
        };
        let registrar = registrar.clone();
        let stats = async move { registrar.ask(RegistrarMsg::Stats).await };
        ctx.defer(stats, move |_master: &mut Master, _ctx, stats| {
            let stats: RegistrarStats = stats.unwrap_or_default();
            reply.send(pb::MasterMetrics {
                registry_entries: stats.entries,
                ..metrics
            });
        });
    }
}

impl Process for Master {
    type Message = MasterMsg;

    async fn started(&mut self, ctx: &mut Context<Self>) {
        // Follow the registry's leadership as messages to this process.
        let mut leadership = self.registry.leadership();
        let me = ctx.pid().clone();
        tokio::spawn(async move {
            loop {
                let now = leadership.borrow_and_update().clone();
                if me.tell(MasterMsg::Leadership(now)).is_err() {
                    return;
                }
                if leadership.changed().await.is_err() {
                    return;
                }
            }
        });
        if self.config.pings {
            ctx.interval(self.config.ping_interval, || MasterMsg::PingAgents);
        }
        ctx.interval(
            heartbeat_sweep_period(self.config.heartbeat_min_ttl),
            || MasterMsg::CheckHeartbeats,
        );
        // What the blocked-queue releases or cancels comes back here to be recorded.
        if let Some(SinkReceivers {
            mut unblocked,
            mut canceled,
        }) = self.blocked_out.take()
        {
            let me = ctx.pid().clone();
            tokio::spawn(async move {
                while let Some(evals) = unblocked.recv().await {
                    if me.tell(MasterMsg::EvalsUnblocked(evals)).is_err() {
                        return;
                    }
                }
            });
            let me = ctx.pid().clone();
            tokio::spawn(async move {
                while let Some(evals) = canceled.recv().await {
                    if me.tell(MasterMsg::EvalsCanceled(evals)).is_err() {
                        return;
                    }
                }
            });
        }
    }

    async fn handle(&mut self, msg: MasterMsg, ctx: &mut Context<Self>) {
        self.on_message(msg, ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ttl_grows_with_the_agents_past_the_minimum() {
        let min = Duration::from_secs(10);
        assert_eq!(heartbeat_base_ttl(min, 50.0, 0), min);
        assert_eq!(heartbeat_base_ttl(min, 50.0, 500), min);
        assert_eq!(
            heartbeat_base_ttl(min, 50.0, 40_000),
            Duration::from_secs(800)
        );
        assert_eq!(heartbeat_base_ttl(min, 0.0, 40_000), min);
        assert_eq!(heartbeat_base_ttl(min, f64::NAN, 40_000), min);
        assert_eq!(heartbeat_base_ttl(min, 1e-300, 40_000), MAX_HEARTBEAT_TTL);
    }

    #[test]
    fn the_sweep_period_is_a_tenth_of_the_minimum_ttl_within_bounds() {
        assert_eq!(
            heartbeat_sweep_period(Duration::from_secs(10)),
            Duration::from_secs(1)
        );
        assert_eq!(
            heartbeat_sweep_period(Duration::from_millis(200)),
            Duration::from_millis(20)
        );
        assert_eq!(
            heartbeat_sweep_period(Duration::ZERO),
            Duration::from_millis(10)
        );
    }

    #[test]
    fn deadlines_come_out_in_order_and_move_when_set_again() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut deadlines = HeartbeatDeadlines::default();
        deadlines.set("a", at(30));
        deadlines.set("b", at(10));
        deadlines.set("c", at(20));
        deadlines.set("b", at(40));
        deadlines.remove("c");
        assert_eq!(deadlines.len(), 2);
        assert!(deadlines.take_expired(at(29)).is_empty());
        assert_eq!(deadlines.take_expired(at(40)), ["a", "b"]);
        assert_eq!(deadlines.len(), 0);
        assert_eq!(deadlines.by_deadline.len(), 0);
    }
}
