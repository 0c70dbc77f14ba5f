//! The master process: agents and their tasks, jobs and their evaluations, the plan applier,
//! ACL tokens and the cluster's state, with leadership and failover recovery.
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
//! One module per resource, as Nomad's server has an endpoint per resource; each holds its
//! requests (structs with named fields, in [`requests`]), their handlers and their state. A
//! request's handler is the method of its name in snake case (`SubmitJob` is
//! `Master::submit_job`, in `jobs.rs`); [`MasterMsg`] has one variant per request, and
//! `master_requests!` below is the one place that lists and dispatches them.
//! - `agents`: registration, re-registration, heartbeats (`agents/heartbeats.rs`), pings,
//!   drains and eligibility (`agents/drains.rs`), agents found gone (`agents/lost.rs`), joining
//!   (`agents/arriving.rs`) and coming back (`agents/reregistration.rs`).
//! - `tasks`: status updates, kills, manual launches, launch deadlines, task output, and the
//!   back-off of crash-looping slots (`tasks/crash_loops.rs`).
//! - `jobs`: submissions, stops, status, versions, dry runs.
//! - `evaluations`: listing, what workers report (blocked, complete), what the blocked-queue
//!   releases, and the convergence check (`evaluations/convergence.rs`).
//! - `deployments`: the deployment watcher (new tasks healthy, canaries, deadlines,
//!   auto-revert) and what operators ask of deployments.
//! - `plans`: the plan applier: snapshots for schedulers and plans applied one at a time.
//! - `acl`: ACL tokens.
//! - `cluster_state`: reads of the whole cluster, metrics, snapshots of the registry, and the
//!   event stream (`cluster_state/events.rs`).
//! - `leadership`: the role, taking up and losing the lead, recovery and its deadline.
//! - `registry_writes`: registry writes with their evaluations, the state index.

use std::sync::Arc;
use std::time::Duration;

use muster_actor::{Context, Pid, Process, System};
use muster_broker::blocked::{BlockedEvals, ChannelSink, SinkReceivers};
use muster_broker::{BrokerConfig, EvalBroker, SchedulerRoster};
use muster_registry::RegistryNode;
use muster_transport::Node;

use crate::cluster::Cluster;
use crate::config::MasterConfig;
use crate::error::ServiceError;
use crate::metrics::instruments::MasterInstruments;

mod acl;
mod agents;
mod cluster_state;
mod deployments;
mod evaluations;
mod jobs;
mod leadership;
mod plans;
mod preemption;
mod registry_writes;
mod tasks;

pub use acl::ACL_BOOTSTRAP_RESET_FILE;
pub use cluster_state::events::{
    EventFeed, KEPT_EVENTS, Lagged, LoggedEvent, SUBSCRIBER_BUFFER, Subscription,
};
pub use plans::SchedulingPids;

use agents::heartbeats::HeartbeatDeadlines;
use leadership::Role;

/// Every request a master handles, by resource: build one with its named fields and send it
/// (`master.ask(|reply| JobStatus { name, stale: false, reply }.into())`).
pub mod requests {
    pub use super::acl::{
        BootstrapAcl, ChangeAccess, CreateToken, DeleteToken, ListNamespaces, ListPolicies,
        ListTokens,
    };
    pub use super::agents::{
        CheckDrains, CheckHeartbeats, DrainAgent, Heartbeat, PingAgents, RegisterAgent,
        ReregisterAgent, SetAgentEligibility,
    };
    pub use super::cluster_state::{
        GetMetrics, GetMetricsSnapshot, GetState, ReadState, SnapshotRestore, SnapshotSave,
        SubscribeEvents,
    };
    pub use super::deployments::{ChangeDeployment, CheckDeployments, ListDeployments};
    pub use super::evaluations::{
        BlockEval, CheckConvergence, CompleteEval, EvalsCanceled, EvalsUnblocked, ListEvaluations,
    };
    pub use super::jobs::{JobStatus, JobVersions, ListJobs, PlanJob, StopJob, SubmitJob};
    pub use super::leadership::{
        EndPlacementHold, LeadershipChanged, ReregistrationDeadline, RetryLeading, UseNode,
    };
    pub use super::plans::{
        ClusterPulse, GetSchedulingPids, GetSnapshot, SubmitPlan, WatchChanges, WatchSnapshot,
        WatchedSnapshot,
    };
    pub use super::tasks::{AgentLink, CheckLaunches, LaunchTask, TaskLogs, TaskStatus};
}

/// What every request to the master says about itself.
trait Request {
    /// Whether it waits while a new leader catches up with the registry (it needs the
    /// registry, or the leadership).
    fn waits_for_registry(&self) -> bool;

    /// Answers it with `error`: it waited for a leadership this master then lost. A request
    /// nobody waits on drops it.
    fn refuse(self, error: ServiceError);
}

/// Implements [`Request`] for requests answered through a `reply` of
/// `Reply<Result<_, ServiceError>>`, which wait for the registry (or not, `waits: false`).
macro_rules! answered_request {
    ($($request:ty),* $(,)?) => {
        $(impl crate::master::Request for $request {
            fn waits_for_registry(&self) -> bool {
                true
            }
            fn refuse(self, error: crate::error::ServiceError) {
                self.reply.send(Err(error));
            }
        })*
    };
}
use answered_request;

/// Implements [`Request`] for requests nobody waits on (timers, notices), which never wait for
/// the registry.
macro_rules! notice {
    ($($request:ty),* $(,)?) => {
        $(impl crate::master::Request for $request {
            fn waits_for_registry(&self) -> bool {
                false
            }
            fn refuse(self, _error: crate::error::ServiceError) {}
        })*
    };
}
use notice;

/// Declares [`MasterMsg`] with one variant per request (named as its type), each request's
/// conversion into it, and the one dispatch: `Variant(module::Type) => handler` is handled by
/// `Master::handler(request, ctx)`.
macro_rules! master_requests {
    ($($(#[$doc:meta])* $variant:ident($request:ty) => $handler:ident,)*) => {
        /// What a master handles: one variant per request (see [`requests`]).
        #[derive(Debug)]
        pub enum MasterMsg {
            $($(#[$doc])* $variant($request),)*
        }

        $(impl From<$request> for MasterMsg {
            fn from(request: $request) -> Self {
                MasterMsg::$variant(request)
            }
        })*

        impl MasterMsg {
            /// Every request: its name, its type's path from the master module
            /// (`jobs::SubmitJob`: handled in `master/jobs.rs`) and its handler's name.
            pub const HANDLED_IN: &[(&str, &str, &str)] =
                &[$((stringify!($variant), stringify!($request), stringify!($handler)),)*];

            /// Whether the request waits while a new leader catches up with the registry.
            fn waits_for_registry(&self) -> bool {
                match self {
                    $(MasterMsg::$variant(request) => Request::waits_for_registry(request),)*
                }
            }

            /// Answers a request that waited for a leadership this master then lost.
            fn refuse_lost_leadership(self) {
                let error = ServiceError::not_leader(None);
                match self {
                    $(MasterMsg::$variant(request) => Request::refuse(request, error),)*
                }
            }

            /// Hands the request to its handler.
            fn dispatch(self, master: &mut Master, ctx: &mut Context<Master>) {
                match self {
                    $(MasterMsg::$variant(request) => master.$handler(request, ctx),)*
                }
            }
        }
    };
}

master_requests! {
    // agents
    /// An agent asks to be admitted.
    RegisterAgent(agents::RegisterAgent) => register_agent,
    /// An agent comes back with everything it runs.
    ReregisterAgent(agents::ReregisterAgent) => reregister_agent,
    /// An agent's heartbeat.
    Heartbeat(agents::Heartbeat) => heartbeat,
    /// Drain an agent, or cancel its drain.
    DrainAgent(agents::DrainAgent) => drain_agent,
    /// Whether new tasks may go to an agent.
    SetAgentEligibility(agents::SetAgentEligibility) => set_agent_eligibility,
    /// Timer: ping the connected agents.
    PingAgents(agents::PingAgents) => ping_agents,
    /// Timer: mark the agents whose heartbeat deadline passed unreachable.
    CheckHeartbeats(agents::CheckHeartbeats) => check_heartbeats,
    /// Timer: carry the drains under way forward.
    CheckDrains(agents::CheckDrains) => check_drains,
    // tasks
    /// An agent reports a task's state.
    TaskStatus(tasks::TaskStatus) => task_status,
    /// An operator launches a task by hand.
    LaunchTask(tasks::LaunchTask) => launch_task,
    /// A piece of a task's output.
    TaskLogs(tasks::TaskLogs) => task_logs,
    /// The way to an agent, for a monitor of its log.
    AgentLink(tasks::AgentLink) => agent_link,
    /// Timer: the launches on an agent past their deadline are lost.
    CheckLaunches(tasks::CheckLaunches) => check_launches,
    // jobs
    /// Submit or update a job.
    SubmitJob(jobs::SubmitJob) => submit_job,
    /// Stop a job.
    StopJob(jobs::StopJob) => stop_job,
    /// A job, its tasks and evaluations.
    JobStatus(jobs::JobStatus) => job_status,
    /// Jobs with their tasks counted by state.
    ListJobs(jobs::ListJobs) => list_jobs,
    /// A dry run of a submission.
    PlanJob(jobs::PlanJob) => plan_job,
    /// A job's versions, newest first.
    JobVersions(jobs::JobVersions) => job_versions,
    // evaluations
    /// Evaluations, newest first.
    ListEvaluations(evaluations::ListEvaluations) => list_evaluations,
    /// A worker could not place everything an evaluation asks for.
    BlockEval(evaluations::BlockEval) => block_eval,
    /// A worker planned an evaluation fully.
    CompleteEval(evaluations::CompleteEval) => complete_eval,
    /// The blocked-queue released these evaluations.
    EvalsUnblocked(evaluations::EvalsUnblocked) => evals_unblocked,
    /// The blocked-queue canceled these evaluations.
    EvalsCanceled(evaluations::EvalsCanceled) => evals_canceled,
    /// Timer: check that every job runs what it asks for.
    CheckConvergence(evaluations::CheckConvergence) => check_convergence,
    // deployments
    /// Timer: look at the running deployments.
    CheckDeployments(deployments::CheckDeployments) => check_deployments,
    /// Deployments, newest first.
    ListDeployments(deployments::ListDeployments) => list_deployments,
    /// Promote, pause, resume or fail a deployment.
    ChangeDeployment(deployments::ChangeDeployment) => change_deployment,
    // the plan applier
    /// The master's eval broker and blocked-queue, for workers.
    GetSchedulingPids(plans::GetSchedulingPids) => get_scheduling_pids,
    /// The cluster as schedulers see it.
    GetSnapshot(plans::GetSnapshot) => get_snapshot,
    /// Follow the master's changes, to feed snapshots to a remote scheduler.
    WatchChanges(plans::WatchChanges) => watch_changes,
    /// The cluster as schedulers see it, for a watch (the jobs only if changed).
    WatchSnapshot(plans::WatchSnapshot) => watch_snapshot,
    /// Apply a scheduler's plan.
    SubmitPlan(plans::SubmitPlan) => submit_plan,
    // ACL
    /// The first management token, once per cluster.
    BootstrapAcl(acl::BootstrapAcl) => bootstrap_acl,
    /// A new token.
    CreateToken(acl::CreateToken) => create_token,
    /// Every token, without secrets.
    ListTokens(acl::ListTokens) => list_tokens,
    /// Delete a token.
    DeleteToken(acl::DeleteToken) => delete_token,
    /// Store or delete a policy or a namespace.
    ChangeAccess(acl::ChangeAccess) => change_access,
    /// Every policy.
    ListPolicies(acl::ListPolicies) => list_policies,
    /// Every namespace.
    ListNamespaces(acl::ListNamespaces) => list_namespaces,
    // the cluster's state
    /// The cluster as this master knows it, now.
    GetState(cluster_state::GetState) => get_state,
    /// The cluster, read as the caller asks (stale or through the leader).
    ReadState(cluster_state::ReadState) => read_state,
    /// The master's counters.
    GetMetrics(cluster_state::GetMetrics) => get_metrics,
    /// What a metrics rendering needs.
    GetMetricsSnapshot(cluster_state::GetMetricsSnapshot) => get_metrics_snapshot,
    /// A copy of the registry.
    SnapshotSave(cluster_state::SnapshotSave) => snapshot_save,
    /// Write a copy over the registry.
    SnapshotRestore(cluster_state::SnapshotRestore) => snapshot_restore,
    /// Follow the event stream.
    SubscribeEvents(cluster_state::SubscribeEvents) => subscribe_events,
    // leadership
    /// The node to reach agents through.
    UseNode(leadership::UseNode) => use_node,
    /// The registry's leader changed.
    LeadershipChanged(leadership::LeadershipChanged) => leadership_changed,
    /// Timer: the re-registration deadline of a recovery.
    ReregistrationDeadline(leadership::ReregistrationDeadline) => reregistration_deadline,
    /// Timer: the end of a recovery's hold on placements.
    EndPlacementHold(leadership::EndPlacementHold) => end_placement_hold,
    /// Try again to take up a leadership whose catching up failed.
    RetryLeading(leadership::RetryLeading) => retry_leading,
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
    /// Which scheduler names workers serve, shared with the broker.
    schedulers: SchedulerRoster,
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
    events: cluster_state::events::EventLog,
    /// While leading: when each tracked agent's next heartbeat is due at the latest (TTL plus
    /// grace).
    heartbeats: HeartbeatDeadlines,
    /// Task slots that failed in a row, for the back-off of their replacements.
    crash_loops: tasks::crash_loops::CrashLoops,
    /// What the deployment watcher remembers of each running deployment, by id (leading
    /// only; see `deployments.rs`).
    deployment_watch: std::collections::HashMap<String, deployments::Watch>,
    /// The term and the moment until which a quorum's last confirmation of this master's
    /// leadership holds (see `leadership::with_quorum_leadership`).
    leadership_lease: Option<(u64, tokio::time::Instant)>,
    /// Whether this master can do its job: it leads (caught up), or it stands by and knows
    /// who leads. The gRPC health service reports it (see [`Master::serving`]).
    serving: tokio::sync::watch::Sender<bool>,
    /// Moved after each request, timer or continuation handled (see [`plans::ClusterPulse`]).
    pulse: tokio::sync::watch::Sender<plans::ClusterPulse>,
    /// The registry's applied index as the master last saw it: a write applied since moves
    /// `state_index` past it, so that an index counting agents' and tasks' changes also
    /// orders the registry's writes (see [`Master::publish_pulse`]).
    applied_seen: u64,
    /// Set by a request that changed nothing a watcher follows (a snapshot): the pulse does
    /// not move for it.
    quiet: bool,
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
        let broker = EvalBroker::new(BrokerConfig {
            scheduler_gone_after: config.scheduler_gone_after,
            ..BrokerConfig::default()
        });
        Master {
            schedulers: broker.roster(),
            broker: system.spawn(broker),
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
            events: cluster_state::events::EventLog::default(),
            heartbeats: HeartbeatDeadlines::default(),
            crash_loops: tasks::crash_loops::CrashLoops::default(),
            deployment_watch: std::collections::HashMap::new(),
            leadership_lease: None,
            serving: tokio::sync::watch::Sender::new(false),
            pulse: tokio::sync::watch::Sender::new(plans::ClusterPulse::default()),
            quiet: false,
            applied_seen: 0,
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

    /// Moves the [`plans::ClusterPulse`] for what was just handled, unless it changed nothing
    /// a watcher follows.
    fn publish_pulse(&mut self) {
        if std::mem::take(&mut self.quiet) {
            return;
        }
        self.publish_state();
    }

    /// Publishes the [`plans::ClusterPulse`] now, the registry's writes applied since counted:
    /// also before evaluations go to the broker, so that a remote worker handed one reads an
    /// index that covers the write that made it (see `scheduling_service.rs`, `dequeue`).
    fn publish_state(&mut self) {
        // `state_index` runs ahead of the registry's index with each change to agents or
        // tasks; a registry write applied since (a job, say) then gets an index below it, and
        // a snapshot's index alone would not tell a copy taken before the write from one
        // after. Moving past it here, once seen, does.
        let applied = self.registry.reader().applied_index();
        if applied > self.applied_seen {
            self.applied_seen = applied;
            if self.state_index >= applied {
                self.state_index += 1;
            }
        }
        let index = self.current_index();
        let scheduling = match &self.role {
            Role::Leading { recovery, .. } => recovery
                .as_ref()
                .is_none_or(|recovery| recovery.placements_held.is_none()),
            Role::Standby { .. } | Role::Starting { .. } => false,
        };
        let leading = matches!(self.role, Role::Leading { .. } | Role::Starting { .. });
        self.pulse.send_modify(|pulse| {
            pulse.changes = pulse.changes.wrapping_add(1);
            pulse.leading = leading;
            pulse.index = index;
            pulse.scheduling = scheduling;
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
        msg.dispatch(self, ctx);
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
                if me
                    .tell(leadership::LeadershipChanged { leadership: now }.into())
                    .is_err()
                {
                    return;
                }
                if leadership.changed().await.is_err() {
                    return;
                }
            }
        });
        if self.config.pings {
            ctx.interval(self.config.ping_interval, || agents::PingAgents.into());
        }
        ctx.interval(
            agents::heartbeats::sweep_period(self.config.heartbeat_min_ttl),
            || agents::CheckHeartbeats.into(),
        );
        ctx.interval(self.config.reconcile_interval, || {
            evaluations::CheckConvergence.into()
        });
        ctx.interval(agents::drains::DRAIN_CHECK, || agents::CheckDrains.into());
        ctx.interval(deployments::DEPLOYMENT_CHECK, || {
            deployments::CheckDeployments.into()
        });
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
                        .tell(evaluations::EvalsUnblocked { evals }.into())
                        .is_err()
                    {
                        return;
                    }
                }
            });
            let me = ctx.pid().clone();
            tokio::spawn(async move {
                while let Some(evals) = canceled.recv().await {
                    if me
                        .tell(evaluations::EvalsCanceled { evals }.into())
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    }

    async fn handle(&mut self, msg: MasterMsg, ctx: &mut Context<Self>) {
        self.on_message(msg, ctx);
    }

    fn settled(&mut self, _ctx: &mut Context<Self>) {
        self.publish_serving();
        self.publish_pulse();
    }
}

#[cfg(test)]
mod tests {
    use super::MasterMsg;

    /// ARCHITECTURE.md's table of the master's requests lists every request, each once, with
    /// the file and the handler that handle it, and nothing else.
    #[test]
    fn the_architecture_table_lists_every_request_where_it_is_handled() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../ARCHITECTURE.md");
        let text = std::fs::read_to_string(path).expect("ARCHITECTURE.md is readable");
        let section = text
            .split("### Sent to the master")
            .nth(1)
            .and_then(|rest| rest.split("\n### ").next())
            .expect("a section \"Sent to the master\"");
        let mut listed: Vec<(String, String, String)> = Vec::new();
        for row in section.lines().filter(|l| l.starts_with("| `")) {
            let ticked: Vec<&str> = row.split('`').skip(1).step_by(2).collect();
            let file = ticked
                .iter()
                .find(|t| t.starts_with("master/") && t.ends_with(".rs"));
            // Rows handled outside the master process (the broker's calls) name no master/
            // file; a request missing for want of one fails below.
            let (Some(name), Some(file)) = (ticked.first(), file) else {
                continue;
            };
            let handler = ticked
                .iter()
                .skip_while(|t| *t != file)
                .nth(1)
                .unwrap_or_else(|| panic!("a row without a handler after its file: {row}"));
            listed.push((name.to_string(), file.to_string(), handler.to_string()));
        }
        let expected: Vec<(String, String, String)> = MasterMsg::HANDLED_IN
            .iter()
            .map(|(name, request, handler)| {
                let module = request.split("::").next().unwrap_or_default().trim();
                (
                    name.to_string(),
                    format!("master/{module}.rs"),
                    handler.to_string(),
                )
            })
            .collect();
        for row in &listed {
            assert!(
                expected.contains(row),
                "ARCHITECTURE.md lists {row:?}, which is not a request handled there"
            );
        }
        for request in &expected {
            let rows = listed.iter().filter(|row| *row == request).count();
            assert_eq!(
                rows, 1,
                "ARCHITECTURE.md lists {request:?} {rows} times, not once"
            );
        }
    }
}
