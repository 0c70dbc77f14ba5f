//! What operators send ([`OperatorMsg`], through the operator API) and its handlers: the
//! cluster state and metrics (answered on every master), and the leader-only calls: task
//! output and manual task launches here, jobs and evaluations in `jobs`.

use std::collections::HashSet;

use muster_actor::{Context, Reply, Upid};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_registry::{Op, RegistrarMsg, RegistrarStats, snapshot_file};

use super::Master;
use super::acl_tokens::AclMsg;
use super::leadership::Role;
use super::registry_writes::now_ms;
use crate::error::ServiceError;
use crate::task_record::TaskRecord;

/// What operators ask the master.
#[derive(Debug)]
pub enum OperatorMsg {
    /// The cluster as this master sees it, at once, whatever its role: for programs in this
    /// process (tests, benches). Operators over gRPC read through [`OperatorMsg::ReadState`].
    GetState(Reply<pb::ClusterState>),
    /// The cluster state as an operator reads it: linearizable (the leader answers once a
    /// quorum confirms it leads), or with `true`, stale (any master, from its own state).
    ReadState(bool, Reply<Result<pb::ClusterState, ServiceError>>),
    /// This master's counters (any master answers).
    GetMetrics(Reply<pb::MasterMetrics>),
    /// This master's figures and the handles to read the rest, for
    /// [`crate::metrics::render`] (any master answers, at once).
    MetricsSnapshot(Reply<crate::metrics::MetricsSnapshot>),
    /// Launch a task on an agent (boxed: the request is much bigger than the other
    /// messages).
    LaunchTask(Box<pb::LaunchTaskRequest>, Reply<Result<(), ServiceError>>),
    /// Submit a job (new or changed).
    SubmitJob(
        Option<model_pb::Job>,
        Reply<Result<pb::SubmitJobReply, ServiceError>>,
    ),
    /// Stop a job.
    StopJob(String, Reply<Result<pb::SubmitJobReply, ServiceError>>),
    /// A job, its tasks and evaluations: linearizable, or with `true`, stale (as
    /// [`OperatorMsg::ReadState`]).
    JobStatus(
        String,
        bool,
        Reply<Result<pb::JobStatusReply, ServiceError>>,
    ),
    /// Every job (or those whose name starts with the prefix), with its tasks counted by
    /// state: linearizable, or stale (as [`OperatorMsg::ReadState`]).
    ListJobs(
        pb::ListJobsRequest,
        Reply<Result<pb::JobList, ServiceError>>,
    ),
    /// Evaluations, newest first, of one job or all, up to a limit: linearizable, or stale.
    ListEvaluations(
        pb::ListEvaluationsRequest,
        Reply<Result<pb::EvaluationList, ServiceError>>,
    ),
    /// Manage ACL tokens.
    Acl(AclMsg),
    /// A snapshot file of the registry, taken once a quorum confirms this master leads.
    SnapshotSave(Reply<Result<Vec<u8>, ServiceError>>),
    /// The events after an index kept on this master, and every one to come (leader only,
    /// once a quorum confirms it leads).
    SubscribeEvents(
        u64,
        Reply<Result<super::events::Subscription, ServiceError>>,
    ),
    /// A dry run of a submission: what would be placed, stopped and replaced (leader only).
    PlanJob(
        Option<model_pb::Job>,
        Reply<Result<pb::JobPlan, ServiceError>>,
    ),
    /// A job's versions, newest first: linearizable, or with `true`, stale.
    JobVersions(
        String,
        bool,
        Reply<Result<pb::JobVersionList, ServiceError>>,
    ),
    /// A piece of a task's output, read from its agent (leader only).
    TaskLogs(
        pb::ReadTaskOutput,
        Reply<Result<pb::TaskOutputChunk, ServiceError>>,
    ),
    /// Start, change or cancel an agent's drain (leader only).
    DrainAgent(
        pb::DrainAgentRequest,
        Reply<Result<pb::AgentSchedulingReply, ServiceError>>,
    ),
    /// Set whether new tasks may be placed on an agent (leader only).
    SetAgentEligibility(
        pb::AgentEligibilityRequest,
        Reply<Result<pb::AgentSchedulingReply, ServiceError>>,
    ),
    /// Replace the registry with the snapshot file given.
    SnapshotRestore(
        bytes::Bytes,
        Reply<Result<pb::SnapshotRestoreReply, ServiceError>>,
    ),
}

impl OperatorMsg {
    /// Whether the message waits while a new leader catches up with the registry.
    pub(super) fn waits_for_registry(&self) -> bool {
        !matches!(
            self,
            OperatorMsg::GetState(_)
                | OperatorMsg::GetMetrics(_)
                | OperatorMsg::MetricsSnapshot(_)
                | OperatorMsg::ReadState(true, _)
        ) && !matches!(self, OperatorMsg::JobStatus(_, true, _))
            && !matches!(self, OperatorMsg::JobVersions(_, true, _))
            && !matches!(self, OperatorMsg::ListJobs(r, _) if r.stale)
            && !matches!(self, OperatorMsg::ListEvaluations(r, _) if r.stale)
    }

    /// Answers the request with `error`.
    pub(super) fn refuse(self, error: ServiceError) {
        match self {
            OperatorMsg::LaunchTask(_, reply) => reply.send(Err(error)),
            OperatorMsg::SubmitJob(_, reply) | OperatorMsg::StopJob(_, reply) => {
                reply.send(Err(error));
            }
            OperatorMsg::JobStatus(_, _, reply) => reply.send(Err(error)),
            OperatorMsg::ListJobs(_, reply) => reply.send(Err(error)),
            OperatorMsg::ListEvaluations(_, reply) => reply.send(Err(error)),
            OperatorMsg::ReadState(_, reply) => reply.send(Err(error)),
            OperatorMsg::Acl(msg) => msg.refuse(error),
            OperatorMsg::SnapshotSave(reply) => reply.send(Err(error)),
            OperatorMsg::SubscribeEvents(_, reply) => reply.send(Err(error)),
            OperatorMsg::TaskLogs(_, reply) => reply.send(Err(error)),
            OperatorMsg::JobVersions(_, _, reply) => reply.send(Err(error)),
            OperatorMsg::PlanJob(_, reply) => reply.send(Err(error)),
            OperatorMsg::SnapshotRestore(_, reply) => reply.send(Err(error)),
            OperatorMsg::DrainAgent(_, reply) | OperatorMsg::SetAgentEligibility(_, reply) => {
                reply.send(Err(error));
            }
            OperatorMsg::GetState(_)
            | OperatorMsg::GetMetrics(_)
            | OperatorMsg::MetricsSnapshot(_) => {}
        }
    }
}

impl Master {
    pub(super) fn on_operator(&mut self, msg: OperatorMsg, ctx: &mut Context<Self>) {
        match msg {
            OperatorMsg::GetState(reply) => reply.send(self.state()),
            OperatorMsg::GetMetrics(reply) => self.send_metrics(reply, ctx),
            OperatorMsg::MetricsSnapshot(reply) => reply.send(self.metrics_snapshot(ctx)),
            OperatorMsg::LaunchTask(request, reply) => self.launch(*request, reply, ctx),
            OperatorMsg::SubmitJob(spec, reply) => self.submit_job(spec, reply, ctx),
            OperatorMsg::StopJob(name, reply) => self.stop_job(name, reply, ctx),
            OperatorMsg::DrainAgent(request, reply) => self.drain_agent(request, reply, ctx),
            OperatorMsg::SetAgentEligibility(request, reply) => {
                self.set_agent_eligibility(request, reply, ctx);
            }
            OperatorMsg::ReadState(stale, reply) => {
                self.read(stale, ctx, reply, move |master| {
                    let mut state = master.state();
                    state.read = Some(master.read_info(stale));
                    Ok(state)
                });
            }
            OperatorMsg::JobStatus(name, stale, reply) => {
                self.read(stale, ctx, reply, move |master| {
                    let mut status = master.job_status(&name)?;
                    status.read = Some(master.read_info(stale));
                    Ok(status)
                });
            }
            OperatorMsg::TaskLogs(request, reply) => self.task_logs(request, reply),
            OperatorMsg::PlanJob(spec, reply) => {
                let job = match self.checked_job(spec, "PlanJob") {
                    Ok(job) => job,
                    Err(e) => return reply.send(Err(e)),
                };
                self.with_quorum_leadership(ctx, move |master, _ctx, confirmed| {
                    reply.send(confirmed.map(|()| master.plan_job(job)));
                });
            }
            OperatorMsg::JobVersions(name, stale, reply) => {
                self.read(stale, ctx, reply, move |master| {
                    let versions = master.registry.reader().read(|state| {
                        let current = state.jobs.get(&name)?.clone();
                        let earlier = state.job_versions.get(&name);
                        Some(
                            std::iter::once(current)
                                .chain(earlier.into_iter().flatten().rev().cloned())
                                .map(model_pb::Job::from)
                                .collect::<Vec<_>>(),
                        )
                    });
                    let versions =
                        versions.ok_or_else(|| ServiceError::UnknownJob(name.clone()))?;
                    Ok(pb::JobVersionList {
                        versions,
                        read: Some(master.read_info(stale)),
                    })
                });
            }
            OperatorMsg::SubscribeEvents(after, reply) => {
                self.read(false, ctx, reply, move |master| {
                    Ok(master.events.subscribe(after))
                });
            }
            OperatorMsg::ListJobs(request, reply) => {
                let stale = request.stale;
                self.read(stale, ctx, reply, move |master| {
                    Ok(pb::JobList {
                        jobs: master.job_summaries(&request.prefix),
                        read: Some(master.read_info(stale)),
                    })
                });
            }
            OperatorMsg::ListEvaluations(request, reply) => {
                let stale = request.stale;
                self.read(stale, ctx, reply, move |master| {
                    let (evals, total) =
                        master.evaluations(&request.job, &request.id, request.limit);
                    Ok(pb::EvaluationList {
                        evals,
                        total,
                        read: Some(master.read_info(stale)),
                    })
                });
            }
            OperatorMsg::Acl(msg) => self.on_acl(msg, ctx),
            OperatorMsg::SnapshotSave(reply) => {
                self.read(false, ctx, reply, |master| {
                    let index = master.registry.reader().applied_index();
                    master
                        .registry
                        .reader()
                        .read(|state| snapshot_file::encode(state, index, master.term, now_ms()))
                        .map_err(|e| {
                            ServiceError::Unavailable(format!("the registry did not encode: {e}"))
                        })
                });
            }
            OperatorMsg::SnapshotRestore(file, reply) => self.restore(&file, reply, ctx),
        }
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
    /// only if that confirmation still holds when the answer has been computed (a master
    /// paused in between answers "unavailable, retry" rather than a stale answer).
    fn read<T: Send + 'static>(
        &mut self,
        stale: bool,
        ctx: &mut Context<Self>,
        reply: Reply<Result<T, ServiceError>>,
        compute: impl FnOnce(&Master) -> Result<T, ServiceError> + Send + 'static,
    ) {
        if stale {
            return reply.send(compute(self));
        }
        self.with_quorum_leadership(ctx, move |master, _ctx, confirmed| {
            if let Err(refusal) = confirmed {
                return reply.send(Err(refusal));
            }
            let answer = compute(master);
            if master.lease_holds() {
                reply.send(answer);
            } else {
                reply.send(Err(ServiceError::Unavailable(
                    "this master's leadership could not be confirmed in time; retry".into(),
                )));
            }
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

    // ---- task output ----

    /// Reads a piece of a task's output from the agent it was placed on; the ask runs beside
    /// the process, which goes on handling messages.
    fn task_logs(
        &self,
        request: pb::ReadTaskOutput,
        reply: Reply<Result<pb::TaskOutputChunk, ServiceError>>,
    ) {
        if self.leading_term().is_none() {
            return reply.send(Err(self.not_leading()));
        }
        let found = self.cluster.agents.iter().find(|(_, agent)| {
            agent
                .tasks
                .iter()
                .chain(&agent.completed_tasks)
                .any(|t| t.id() == request.task_id)
        });
        let Some((agent_id, agent)) = found else {
            return reply.send(Err(ServiceError::UnknownTask(request.task_id)));
        };
        if !agent.connected {
            return reply.send(Err(ServiceError::Unavailable(format!(
                "agent {agent_id}, where task {} ran, is not connected",
                request.task_id
            ))));
        }
        let (Some(node), Ok(upid)) = (&self.node, agent.info.address.parse::<muster_actor::Upid>())
        else {
            return reply.send(Err(ServiceError::Unavailable(format!(
                "agent {agent_id} has no usable address {:?}",
                agent.info.address
            ))));
        };
        let remote = node.remote(upid);
        let timeout = self.config.ping_timeout;
        let agent_id = agent_id.clone();
        tokio::spawn(async move {
            let answer = remote
                .ask_timeout::<pb::ReadTaskOutput, pb::TaskOutputChunk>(timeout, request)
                .await;
            reply.send(match answer {
                Ok(chunk) if chunk.error.is_empty() => Ok(chunk),
                Ok(chunk) => Err(ServiceError::FailedPrecondition(format!(
                    "agent {agent_id}: {}",
                    chunk.error
                ))),
                Err(e) => Err(ServiceError::Unavailable(format!(
                    "agent {agent_id} did not answer: {e}"
                ))),
            });
        });
    }

    // ---- manual launches ----

    fn launch(
        &mut self,
        request: pb::LaunchTaskRequest,
        reply: Reply<Result<(), ServiceError>>,
        ctx: &mut Context<Self>,
    ) {
        if self.leading_term().is_none() {
            return reply.send(Err(self.not_leading()));
        }
        let Some(node) = &self.node else {
            return reply.send(Err(ServiceError::Unavailable(
                "this master has no transport to reach agents".into(),
            )));
        };
        let Some(agent) = self.cluster.agents.get(&request.agent_id) else {
            return reply.send(Err(ServiceError::UnknownAgent(request.agent_id)));
        };
        if !agent.connected {
            return reply.send(Err(ServiceError::FailedPrecondition(format!(
                "agent {} is not connected",
                request.agent_id
            ))));
        }
        let (Some(framework), Some(mut task)) = (request.framework, request.task) else {
            return reply.send(Err(ServiceError::InvalidArgument {
                field: "framework, task".into(),
                message: "LaunchTask needs a framework and a task".into(),
            }));
        };
        if task.id.is_empty() {
            return reply.send(Err(ServiceError::InvalidArgument {
                field: "task.id".into(),
                message: "the task has no id".into(),
            }));
        }
        let upid = match agent.info.address.parse::<Upid>() {
            Ok(upid) => upid,
            Err(e) => {
                return reply.send(Err(ServiceError::FailedPrecondition(format!(
                    "agent address: {e}"
                ))));
            }
        };
        if agent.tasks.iter().any(|t| t.id() == task.id) {
            return reply.send(Err(ServiceError::FailedPrecondition(format!(
                "task {:?} already runs there",
                task.id
            ))));
        }
        task.framework_id = framework.id.clone();
        task.state = model_pb::TaskState::Staging as i32;
        let run = pb::RunTask {
            framework: Some(framework.clone()),
            task: Some(task.clone()),
            term: self.term,
        };
        let remote = node.remote(upid);
        let timeout = self.config.ping_timeout;
        let agent_id = request.agent_id;
        let task_id = task.id.clone();
        // Recorded before it is sent: the agent's first status update may come before the
        // answer to the launch.
        let task = self.cluster.interner.task(&task);
        if let Some(agent) = self.cluster.agent_mut(&agent_id) {
            agent.tasks.push(task);
        }
        self.cluster
            .add_frameworks(std::slice::from_ref(&framework));
        ctx.defer(
            async move {
                remote
                    .ask_timeout::<pb::RunTask, pb::RunTaskReply>(timeout, run)
                    .await
            },
            move |master: &mut Master, _ctx, answered| {
                let refused = match answered {
                    Ok(answer) if answer.error.is_empty() => return reply.send(Ok(())),
                    Ok(answer) => ServiceError::FailedPrecondition(format!(
                        "agent refused the task: {}",
                        answer.error
                    )),
                    Err(e) => ServiceError::Unavailable(format!("agent unreachable: {e}")),
                };
                if let Some(agent) = master.cluster.agent_mut(&agent_id) {
                    agent.tasks.retain(|t| t.id() != task_id);
                }
                reply.send(Err(refused));
            },
        );
    }
}
