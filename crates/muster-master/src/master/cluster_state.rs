//! The cluster's state as operators read it: the whole cluster and the master's metrics
//! (answered on every master), reads through the leader (`read`, with the lease), snapshots
//! of the registry, and the event stream (`cluster_state/events.rs`).

use std::collections::HashSet;

use muster_actor::{Context, Reply};
use muster_proto::cluster as pb;
use muster_registry::{Op, RegistrarMsg, RegistrarStats, snapshot_file};

pub(super) mod events;
mod figures;

use super::leadership::Role;
use super::registry_writes::now_ms;
use super::{Master, Request, answered_request, notice};
use crate::error::ServiceError;
use crate::task_record::TaskRecord;

pub use crate::metrics::snapshot::GetMetricsSnapshot;

/// The cluster as this master knows it, now (every master answers).
#[derive(Debug)]
pub struct GetState {
    /// The cluster.
    pub reply: Reply<pb::ClusterState>,
}

/// The cluster, read as the caller asks: from this master's own state (`stale`), or through
/// the leader once a quorum confirms it leads.
#[derive(Debug)]
pub struct ReadState {
    /// Whether a stale answer will do.
    pub stale: bool,
    /// The cluster.
    pub reply: Reply<Result<pb::ClusterState, ServiceError>>,
}

/// The master's counters (every master answers).
#[derive(Debug)]
pub struct GetMetrics {
    /// The counters.
    pub reply: Reply<pb::MasterMetrics>,
}

/// A copy of the whole registry (`muster operator snapshot save`): a linearizable read.
#[derive(Debug)]
pub struct SnapshotSave {
    /// The snapshot file's bytes.
    pub reply: Reply<Result<Vec<u8>, ServiceError>>,
}

/// Write a saved copy over the registry (`muster operator snapshot restore`).
#[derive(Debug)]
pub struct SnapshotRestore {
    /// The snapshot file's bytes.
    pub file: bytes::Bytes,
    /// The index the restore was written at, and the copy's.
    pub reply: Reply<Result<pb::SnapshotRestoreReply, ServiceError>>,
}

/// Follow the event stream from after an index.
#[derive(Debug)]
pub struct SubscribeEvents {
    /// The last index the subscriber has seen (0: from the oldest kept).
    pub after: u64,
    /// The subscription.
    pub reply: Reply<Result<events::Subscription, ServiceError>>,
}

notice!(GetState, GetMetrics, GetMetricsSnapshot);
answered_request!(SnapshotSave, SnapshotRestore, SubscribeEvents);

impl Request for ReadState {
    fn waits_for_registry(&self) -> bool {
        !self.stale
    }
    fn refuse(self, error: ServiceError) {
        self.reply.send(Err(error));
    }
}

impl Master {
    /// [`GetState`].
    pub(super) fn get_state(&mut self, GetState { reply }: GetState, _ctx: &mut Context<Self>) {
        // A read: nothing a watcher of the cluster follows moves.
        self.quiet = true;
        reply.send(self.state());
    }

    /// [`ReadState`].
    pub(super) fn read_state(
        &mut self,
        ReadState { stale, reply }: ReadState,
        ctx: &mut Context<Self>,
    ) {
        self.read(stale, ctx, reply, move |master| {
            let mut state = master.state();
            state.read = Some(master.read_info(stale));
            Ok(state)
        });
    }

    /// [`GetMetrics`].
    pub(super) fn get_metrics(
        &mut self,
        GetMetrics { reply }: GetMetrics,
        ctx: &mut Context<Self>,
    ) {
        self.quiet = true;
        self.send_metrics(reply, ctx);
    }

    /// [`GetMetricsSnapshot`].
    pub(super) fn get_metrics_snapshot(
        &mut self,
        GetMetricsSnapshot { reply }: GetMetricsSnapshot,
        ctx: &mut Context<Self>,
    ) {
        reply.send(self.metrics_snapshot(ctx));
    }

    /// [`SnapshotSave`], read through the leader.
    pub(super) fn snapshot_save(
        &mut self,
        SnapshotSave { reply }: SnapshotSave,
        ctx: &mut Context<Self>,
    ) {
        self.read(false, ctx, reply, |master| {
            let index = master.registry.reader().applied_index();
            master
                .registry
                .reader()
                .read(|state| snapshot_file::encode(state, index, master.term, now_ms()))
                .map_err(|e| ServiceError::Unavailable(format!("the registry did not encode: {e}")))
        });
    }

    /// [`SnapshotRestore`].
    pub(super) fn snapshot_restore(
        &mut self,
        SnapshotRestore { file, reply }: SnapshotRestore,
        ctx: &mut Context<Self>,
    ) {
        self.restore(&file, reply, ctx);
    }

    /// [`SubscribeEvents`], once this master is confirmed leading.
    pub(super) fn subscribe_events(
        &mut self,
        SubscribeEvents { after, reply }: SubscribeEvents,
        ctx: &mut Context<Self>,
    ) {
        self.read(false, ctx, reply, move |master| {
            Ok(master.events.subscribe(after))
        });
    }

    /// Verifies a snapshot file and writes it over the registry; then leads anew on it, as a
    /// new leader would: the broker takes the copy's pending evaluations, agents re-register,
    /// and the convergence check places or stops tasks to match the copy's jobs.
    fn restore(
        &mut self,
        file: &[u8],
        reply: Reply<Result<pb::SnapshotRestoreReply, ServiceError>>,
        ctx: &mut Context<Self>,
    ) {
        let Some(term) = self.leading_term() else {
            return reply.send(Err(self.not_leading()));
        };
        let (header, state) = match snapshot_file::decode(file) {
            Ok(decoded) => decoded,
            Err(e) => {
                return reply.send(Err(ServiceError::InvalidArgument {
                    field: "data".into(),
                    message: e.to_string(),
                }));
            }
        };
        tracing::warn!(
            saved_index = header.index,
            saved_term = header.term,
            "restoring the registry from a snapshot"
        );
        self.write_with_evals(
            vec![Op::Restore(Box::new(state))],
            Vec::new(),
            ctx,
            move |master, ctx, written| match written {
                Ok(_) => {
                    let index = master.registry.reader().applied_index();
                    tracing::warn!(index, "registry restored; leading anew on it");
                    reply.send(Ok(pb::SnapshotRestoreReply {
                        index,
                        saved_index: header.index,
                    }));
                    if master.leading_term() == Some(term) {
                        master.become_leader(term, ctx);
                    }
                }
                Err(e) => reply.send(Err(e.into())),
            },
        );
    }

    // ---- reads ----

    /// Answers a read with `compute`: at once from this master's own state if `stale`; else
    /// only on the leader, once a quorum has confirmed (within the lease) that it leads, and
    /// only if its leadership still holds when the answer has been computed. If the lease ran
    /// out meanwhile (a loaded master, or one paused), a second round, begun after the answer
    /// was computed, must confirm that it still leads in the same term: then no other leader
    /// can have been elected since, and the answer stands; if not, the read is refused.
    pub(super) fn read<T: Send + 'static>(
        &mut self,
        stale: bool,
        ctx: &mut Context<Self>,
        reply: Reply<Result<T, ServiceError>>,
        compute: impl FnOnce(&Master) -> Result<T, ServiceError> + Send + 'static,
    ) {
        if stale {
            return reply.send(compute(self));
        }
        self.with_quorum_leadership(ctx, move |master, ctx, confirmed| {
            if let Err(refusal) = confirmed {
                return reply.send(Err(refusal));
            }
            let term = master.leading_term();
            let answer = compute(master);
            if master.lease_holds() {
                return reply.send(answer);
            }
            master.with_quorum_leadership(ctx, move |master, _ctx, confirmed| {
                reply.send(match confirmed {
                    Ok(()) if master.leading_term() == term => answer,
                    Ok(()) => Err(ServiceError::Unavailable(
                        "this master's leadership changed while the read was answered; retry"
                            .into(),
                    )),
                    Err(refusal) => Err(refusal),
                });
            });
        });
    }

    /// How a read is answered now: stale or not, the applied index, the last contact with a
    /// leader.
    pub(super) fn read_info(&self, stale: bool) -> pb::ReadInfo {
        let last_contact_ms = if self.leading_term().is_some() {
            0
        } else {
            self.registry
                .last_leader_contact()
                .map_or(u64::MAX, |since| {
                    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
                })
        };
        pb::ReadInfo {
            stale,
            applied_index: self.registry.reader().applied_index(),
            last_contact_ms,
            known_leader: self.leader().is_some(),
        }
    }

    // ---- cluster state and metrics ----

    fn state(&self) -> pb::ClusterState {
        let leader = self.leader();
        let is_leader = self.leading_term().is_some();
        let mut state = pb::ClusterState {
            leader: leader.map(|(_, a)| a).unwrap_or_default(),
            is_leader,
            term: self.term,
            commit_index: self.registry.commit_index(),
            insecure: self.config.security.is_insecure(),
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
        let scheduling = self.agent_scheduling();
        let scheduling_of = |id: &str| {
            scheduling
                .get(id)
                .map(|scheduling| scheduling.clone().into())
        };
        let mut away = self.tasks_away_by_agent();
        state.unreachable = self.registry.reader().read(|registry| {
            registry
                .unreachable
                .iter()
                .map(|(id, agent)| pb::UnreachableAgent {
                    id: id.0.clone(),
                    info: Some(agent.info.clone().into()),
                    marked_at_ms: agent.marked_at_ms,
                    scheduling: scheduling_of(&id.0),
                    tasks: away
                        .remove(id)
                        .unwrap_or_default()
                        .into_iter()
                        .map(Into::into)
                        .collect(),
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
                info: Some(agent.info.clone().into()),
                tasks: agent.tasks.iter().map(TaskRecord::to_wire).collect(),
                completed_tasks: agent
                    .completed_tasks
                    .iter()
                    .map(TaskRecord::to_wire)
                    .collect(),
                connected: agent.connected,
                scheduling: scheduling_of(id),
                version: agent.version.clone(),
            })
            .collect();
        agents.sort_by(|a, b| a.id.cmp(&b.id));
        state.agents = agents;
        state.masters = crate::raft_peers::list(&self.registry).peers;
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
            impersonations_refused: self.metrics.impersonations,
            unknown_agents_refused: self.metrics.unknown_agents,
            given_up_tasks_killed: self.metrics.given_up_killed,
            leadership_confirmations: self.metrics.leadership_confirmations,
            reconcile_evals: self.metrics.reconcile_evals,
            kill_retries: self.metrics.kill_retries,
            kills_fenced: self.metrics.kills_fenced,
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
