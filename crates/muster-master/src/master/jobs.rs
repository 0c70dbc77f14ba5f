//! Jobs as operators reach them through the leading master: submitting one (its registry
//! write carries the evaluation it calls for), stopping one, its status, the list of jobs,
//! and the list of evaluations. [`OperatorMsg`](super::OperatorMsg) dispatches here.

use std::collections::{BTreeMap, HashMap};

use muster_actor::{Context, Reply};
use muster_broker::blocked::BlockedMsg;
use muster_model::{EvalStatus, Evaluation, Job, TaskState, Trigger};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_registry::{Op, Outcome, WriteError};

use super::Master;
use crate::error::ServiceError;

/// Evaluations a list answers with when the request names no limit.
pub(super) const DEFAULT_EVAL_LIMIT: usize = 50;
/// The most evaluations one list answers with.
pub(super) const MAX_EVAL_LIMIT: usize = 1_000;

impl Master {
    /// The job an operator's `request` (`SubmitJob`, `PlanJob`) carries, read and checked
    /// against this master's job limits: its encoded size first, then its contents. Every
    /// door a job comes in by (gRPC, HTTP, the CLI) goes through here.
    pub(super) fn checked_job(
        &self,
        spec: Option<model_pb::Job>,
        request: &str,
    ) -> Result<Job, ServiceError> {
        if let Some(spec) = &spec {
            let limits = &self.config.job_limits;
            limits.check_encoded_size(prost::Message::encoded_len(spec))?;
        }
        let job = match spec.map(Job::from_submitted) {
            None => {
                return Err(ServiceError::InvalidArgument {
                    field: "job".into(),
                    message: format!("{request} carries no job"),
                });
            }
            Some(Err(e)) => return Err(e.within("job").into()),
            Some(Ok(job)) => job,
        };
        job.check_limits(&self.config.job_limits)
            .map_err(|e| e.within("job"))?;
        Ok(job)
    }

    /// Checks the submitted job against the limits, then stores it with its registration
    /// evaluation in one registry write; the answer names the evaluation and the version.
    pub(super) fn submit_job(
        &mut self,
        spec: Option<model_pb::Job>,
        reply: Reply<Result<pb::SubmitJobReply, ServiceError>>,
        ctx: &mut Context<Self>,
    ) {
        if self.leading_term().is_none() {
            return reply.send(Err(self.not_leading()));
        }
        let job = match self.checked_job(spec, "SubmitJob") {
            Ok(job) => job,
            Err(e) => return reply.send(Err(e)),
        };
        let eval = Evaluation::new(&job, Trigger::JobRegister);
        let eval_id = eval.id.0.clone();
        tracing::info!(job = %job.name, eval = %eval_id, "job submitted");
        self.write_with_evals(
            vec![Op::UpsertJob(job)],
            vec![eval],
            ctx,
            move |_master, _ctx, written| reply.send(job_written(written, eval_id)),
        );
    }

    /// Stops a job: once a quorum confirms this master leads (so its registry holds every
    /// committed submission, and "no such job" is not a stale answer), one entry that stops
    /// the job as it is when applied (`Op::StopJob`, so a submission racing the stop is kept)
    /// and its deregistration evaluation.
    pub(super) fn stop_job(
        &mut self,
        name: String,
        reply: Reply<Result<pb::SubmitJobReply, ServiceError>>,
        ctx: &mut Context<Self>,
    ) {
        self.with_quorum_leadership(ctx, move |master, ctx, confirmed| {
            if let Err(refusal) = confirmed {
                return reply.send(Err(refusal));
            }
            let Some(mut job) = master
                .registry
                .reader()
                .read(|s| s.jobs.get(&name).cloned())
            else {
                return reply.send(Err(ServiceError::UnknownJob(name)));
            };
            job.stopped = true;
            let eval = Evaluation::new(&job, Trigger::JobDeregister);
            let eval_id = eval.id.0.clone();
            let _ = master.blocked.tell(BlockedMsg::Untrack(name.clone()));
            tracing::info!(job = %name, eval = %eval_id, "job stopped");
            master.write_with_evals(
                vec![Op::StopJob(name)],
                vec![eval],
                ctx,
                move |_master, _ctx, written| reply.send(job_written(written, eval_id)),
            );
        });
    }

    /// A summary of every job whose name starts with `prefix`, by name.
    pub(super) fn job_summaries(&self, prefix: &str) -> Vec<pb::JobSummary> {
        let mut summaries: BTreeMap<String, pb::JobSummary> =
            self.registry.reader().read(|state| {
                let mut in_flight: HashMap<&str, u64> = HashMap::new();
                for eval in state.evals.values() {
                    if matches!(eval.status, EvalStatus::Pending | EvalStatus::Blocked) {
                        *in_flight.entry(eval.job.as_str()).or_default() += 1;
                    }
                }
                state
                    .jobs
                    .range(prefix.to_owned()..)
                    .take_while(|(name, _)| name.starts_with(prefix))
                    .map(|(name, job)| {
                        let summary = pb::JobSummary {
                            name: name.clone(),
                            scheduler: i32::from(job.scheduler),
                            priority: u32::from(job.priority),
                            version: job.version,
                            stopped: job.stopped,
                            desired: job.groups.iter().map(|g| u64::from(g.count)).sum(),
                            evals_in_flight: in_flight.get(name.as_str()).copied().unwrap_or(0),
                            ..pb::JobSummary::default()
                        };
                        (name.clone(), summary)
                    })
                    .collect()
            });
        for agent in self.cluster.agents.values() {
            for task in agent.tasks.iter().chain(&agent.completed_tasks) {
                let Some(summary) = task.job_name().and_then(|job| summaries.get_mut(job)) else {
                    continue;
                };
                let count = match task.state() {
                    TaskState::Staging => &mut summary.staging,
                    TaskState::Starting => &mut summary.starting,
                    TaskState::Running => &mut summary.running,
                    TaskState::Finished => &mut summary.finished,
                    TaskState::Failed => &mut summary.failed,
                    TaskState::Killed => &mut summary.killed,
                    TaskState::Lost => &mut summary.lost,
                    TaskState::Unknown => &mut summary.unknown,
                };
                *count += 1;
            }
        }
        // The tasks of agents marked unreachable: unknown while they are away.
        for task in self.tasks_away() {
            if let Some(summary) = summaries.get_mut(task.job.as_str()) {
                match task.state {
                    TaskState::Lost => summary.lost += 1,
                    _ => summary.unknown += 1,
                }
            }
        }
        summaries.into_values().collect()
    }

    /// Up to `limit` evaluations ([`DEFAULT_EVAL_LIMIT`] for 0, at most [`MAX_EVAL_LIMIT`])
    /// of `job` (every job's if empty), newest first, and how many matched.
    pub(super) fn evaluations(
        &self,
        job: &str,
        id: &str,
        limit: u32,
    ) -> (Vec<model_pb::Evaluation>, u64) {
        let limit = match limit {
            0 => DEFAULT_EVAL_LIMIT,
            n => (n as usize).min(MAX_EVAL_LIMIT),
        };
        self.registry.reader().read(|state| {
            let mut matched: Vec<&Evaluation> = state
                .evals
                .values()
                .filter(|e| job.is_empty() || e.job == job)
                .filter(|e| id.is_empty() || e.id.0 == id)
                .collect();
            matched.sort_by(|a, b| b.create_index.cmp(&a.create_index).then(a.id.cmp(&b.id)));
            let total = matched.len() as u64;
            let evals = matched
                .into_iter()
                .take(limit)
                .cloned()
                .map(Into::into)
                .collect();
            (evals, total)
        })
    }

    /// The job as stored, its tasks on the agents (and, unknown, on agents marked
    /// unreachable) and its last 20 evaluations, newest first;
    /// [`ServiceError::UnknownJob`] if no job has that name.
    pub(super) fn job_status(&self, name: &str) -> Result<pb::JobStatusReply, ServiceError> {
        let (job, mut evals) = self.registry.reader().read(|state| {
            let job = state.jobs.get(name).cloned();
            let evals: Vec<Evaluation> = state
                .evals
                .values()
                .filter(|e| e.job == name)
                .cloned()
                .collect();
            (job, evals)
        });
        let Some(job) = job else {
            return Err(ServiceError::UnknownJob(name.to_owned()));
        };
        evals.sort_by_key(|e| e.create_index);
        let mut tasks = Vec::new();
        for (agent_id, agent) in &self.cluster.agents {
            for task in agent.tasks.iter().chain(&agent.completed_tasks) {
                if task.job_name() == Some(name) {
                    tasks.push(pb::JobTask {
                        agent_id: agent_id.clone(),
                        task: Some(task.to_wire()),
                    });
                }
            }
        }
        // Those on agents marked unreachable: unknown while they are away.
        for (agent_id, away) in self.tasks_away_by_agent() {
            for task in away.into_iter().filter(|t| t.job == name) {
                tasks.push(pb::JobTask {
                    agent_id: agent_id.0.clone(),
                    task: Some(task.into()),
                });
            }
        }
        tasks.sort_by(|a, b| {
            let key = |t: &pb::JobTask| t.task.as_ref().map(|t| t.name.clone());
            key(a).cmp(&key(b))
        });
        Ok(pb::JobStatusReply {
            job: Some(job.clone().into()),
            version: job.version,
            stopped: job.stopped,
            tasks,
            evals: evals
                .iter()
                .rev()
                .take(20)
                .cloned()
                .map(Into::into)
                .collect(),
            read: None,
        })
    }
}

/// The answer to a job submission (or stop) from its registry write.
fn job_written(
    written: Result<Outcome, WriteError>,
    eval_id: String,
) -> Result<pb::SubmitJobReply, ServiceError> {
    match written {
        Ok(Outcome::Together(results)) => match results.first() {
            Some(Ok(Outcome::JobStored { version })) => Ok(pb::SubmitJobReply {
                eval_id,
                version: *version,
            }),
            other => Err(ServiceError::Aborted(format!(
                "the job was not stored: {other:?}"
            ))),
        },
        Ok(other) => Err(ServiceError::Aborted(format!(
            "unexpected registry outcome: {other:?}"
        ))),
        Err(e) => Err(e.into()),
    }
}
