//! What a rendering reads at each scrape besides the instruments: the master process's own
//! figures, answered in one ask ([`MetricsSnapshot`]), then the broker's, the blocked-queue's,
//! the registrar's, the raft member's and the runtime's, read beside it ([`Figures`]).

use std::sync::Arc;
use std::time::Duration;

use muster_actor::{Pid, System};
use muster_broker::{BlockedEvals, BlockedMsg, BlockedStats, BrokerMsg, BrokerStats, EvalBroker};
use muster_model::TaskState;
use muster_registry::{Registrar, RegistrarMsg, RegistrarStats, RegistryNode};
use muster_transport::{Node, TransportStats};

use super::ASK_TIMEOUT;
use super::instruments::MasterInstruments;
use crate::error::ServiceError;

/// What a `/metrics` rendering asks the master process (every master answers): handled in
/// the master's `cluster_state`, declared here so that rendering needs nothing of the master
/// but its pid.
#[derive(Debug)]
pub struct GetMetricsSnapshot {
    /// The figures and handles.
    pub reply: muster_actor::Reply<MetricsSnapshot>,
}

/// What the master process answers a rendering with ([`GetMetricsSnapshot`](crate::requests::GetMetricsSnapshot)): its
/// own figures at that moment, and the handles to read the rest beside it.
#[derive(Debug)]
pub struct MetricsSnapshot {
    pub(crate) instruments: Arc<MasterInstruments>,
    pub(crate) master: MasterFigures,
    /// Envelopes waiting in the master's mailbox when it answered.
    pub(crate) master_queued: usize,
    pub(crate) broker: Pid<EvalBroker>,
    pub(crate) blocked: Pid<BlockedEvals>,
    /// While leading.
    pub(crate) registrar: Option<Pid<Registrar>>,
    pub(crate) registry: RegistryNode,
    /// Once the master serves its port.
    pub(crate) node: Option<Node>,
    pub(crate) system: System,
}

/// The master process's own figures.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct MasterFigures {
    pub(crate) is_leader: bool,
    /// The last failover recovery's length, once one completed.
    pub(crate) recovery: Option<Duration>,
    pub(crate) messages: u64,
    /// Agents admitted in the registry and not marked unreachable.
    pub(crate) agents_registered: u64,
    pub(crate) agents_connected: u64,
    pub(crate) agents_unreachable: u64,
    /// Tasks by state, in [`TASK_STATES`]'s order.
    pub(crate) tasks: [u64; TASK_STATES.len()],
    pub(crate) registrations: u64,
    pub(crate) reregistrations: u64,
    pub(crate) marked_unreachable: u64,
    pub(crate) impersonations_refused: u64,
    pub(crate) unknown_agents_refused: u64,
    pub(crate) given_up_tasks_killed: u64,
    pub(crate) leadership_confirmations: u64,
    pub(crate) reconcile_evals: u64,
    pub(crate) kill_retries: u64,
    pub(crate) kills_fenced: u64,
}

/// The task states counted, with their label values.
pub(crate) const TASK_STATES: [(TaskState, &str); 7] = [
    (TaskState::Staging, "staging"),
    (TaskState::Starting, "starting"),
    (TaskState::Running, "running"),
    (TaskState::Finished, "finished"),
    (TaskState::Failed, "failed"),
    (TaskState::Killed, "killed"),
    (TaskState::Lost, "lost"),
];

/// Everything a rendering shows besides the instruments.
#[derive(Clone, Debug, Default)]
pub(super) struct Figures {
    pub(super) master: MasterFigures,
    pub(super) broker: BrokerStats,
    pub(super) blocked: BlockedStats,
    pub(super) registrar: RegistrarStats,
    pub(super) raft: RaftFigures,
    pub(super) processes: usize,
    pub(super) dead_letters: u64,
    /// Envelopes waiting per process, by name.
    pub(super) mailboxes: Vec<(&'static str, usize)>,
    pub(super) transport: TransportStats,
}

/// The registry member's raft figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct RaftFigures {
    pub(super) term: u64,
    pub(super) last_log_index: u64,
    pub(super) commit_index: u64,
    pub(super) applied_index: u64,
    pub(super) snapshot_index: u64,
    pub(super) purged_index: u64,
}

impl MetricsSnapshot {
    /// Asks the broker, the blocked-queue and the registrar for their counters (at once),
    /// and reads the raft member and the runtime.
    pub(super) async fn gather(&self) -> Result<Figures, ServiceError> {
        let registrar = async {
            match &self.registrar {
                // A registrar that ended meanwhile (leadership lost) has written nothing.
                Some(registrar) => registrar
                    .ask_timeout(ASK_TIMEOUT, RegistrarMsg::Stats)
                    .await
                    .unwrap_or_default(),
                None => RegistrarStats::default(),
            }
        };
        let (broker, blocked, registrar) = tokio::join!(
            self.broker.ask_timeout(ASK_TIMEOUT, BrokerMsg::Stats),
            self.blocked.ask_timeout(ASK_TIMEOUT, BlockedMsg::Stats),
            registrar,
        );
        let commit_index = self.registry.commit_index();
        let raft = {
            let metrics = self.registry.raft().metrics();
            let metrics = metrics.borrow();
            RaftFigures {
                term: metrics.current_term,
                last_log_index: metrics.last_log_index.unwrap_or(0),
                commit_index,
                applied_index: metrics.last_applied.map_or(0, |id| id.index),
                snapshot_index: metrics.snapshot.map_or(0, |id| id.index),
                purged_index: metrics.purged.map_or(0, |id| id.index),
            }
        };
        let mut mailboxes = vec![
            ("master", self.master_queued),
            ("broker", self.broker.queued()),
            ("blocked", self.blocked.queued()),
        ];
        if let Some(registrar) = &self.registrar {
            mailboxes.push(("registrar", registrar.queued()));
        }
        Ok(Figures {
            master: self.master,
            broker: broker.map_err(|e| {
                ServiceError::Unavailable(format!("the eval broker did not answer: {e}"))
            })?,
            blocked: blocked.map_err(|e| {
                ServiceError::Unavailable(format!("the blocked-queue did not answer: {e}"))
            })?,
            registrar,
            raft,
            processes: self.system.len(),
            dead_letters: self.system.dead_letters(),
            mailboxes,
            transport: self.node.as_ref().map(Node::stats).unwrap_or_default(),
        })
    }
}
