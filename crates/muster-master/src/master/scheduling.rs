//! The master's scheduling side: jobs in, evaluations to the broker, blocked evaluations to
//! the blocked-queue, and the registry writes that go with them.

use muster_actor::{Context, Reply};
use muster_broker::blocked::BlockedMsg;
use muster_broker::{BrokerMsg, registrar_writer};
use muster_proto::cluster as pb;
use muster_registry::jobs::{EvalStatus, Evaluation, Trigger};
use muster_registry::{Op, Outcome, WriteError};

use super::{Master, Role, write_registry};
use crate::jobs::{job_from_spec, spec_from_job};

/// The job label the master puts on every task it launches for a job.
pub(crate) const JOB_LABEL: &str = "muster/job";
/// The task-group label.
pub(crate) const GROUP_LABEL: &str = "muster/group";
/// The label with the job version a task was placed at: the scheduler replaces tasks placed
/// before their group's definition last changed. Absent on tasks launched otherwise.
pub(crate) const VERSION_LABEL: &str = "muster/job-version";

fn label<'t>(task: &'t pb::Task, key: &str) -> Option<&'t str> {
    task.labels
        .iter()
        .find(|l| l.key == key)
        .map(|l| l.value.as_str())
}

/// The job a task belongs to, if the master launched it for one.
pub(crate) fn task_job(task: &pb::Task) -> Option<&str> {
    label(task, JOB_LABEL)
}

impl Master {
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

    /// On losing leadership.
    pub(super) fn stop_scheduling(&mut self) {
        let _ = self.broker.tell(BrokerMsg::Disable);
        let _ = self.blocked.tell(BlockedMsg::Disable);
    }

    /// Writes `ops` and `evals` in one raft entry, then hands the stored pending evaluations
    /// to the broker; `done` gets the entry's outcome.
    pub(super) fn write_with_evals(
        &mut self,
        ops: Vec<Op>,
        evals: Vec<Evaluation>,
        ctx: &mut Context<Self>,
        done: impl FnOnce(&mut Master, &mut Context<Master>, Result<Outcome, WriteError>)
        + Send
        + 'static,
    ) {
        let Role::Leading { registrar, .. } = &self.role else {
            return done(self, ctx, Err(WriteError::NotLeader { leader: None }));
        };
        // Only pending evaluations go to the broker; a completed or blocked one is just
        // recorded.
        let ids: Vec<_> = evals
            .iter()
            .filter(|e| e.status == EvalStatus::Pending)
            .map(|e| e.id.clone())
            .collect();
        let mut all = ops;
        if !evals.is_empty() {
            all.push(Op::UpsertEvals(evals));
        }
        let write = write_registry(registrar, Op::Together(all));
        ctx.defer(write, move |master: &mut Master, ctx, written| {
            let written = match written {
                Ok(result) => result,
                Err(e) => Err(WriteError::Failed(format!("registrar unavailable: {e}"))),
            };
            if written.is_ok() && !ids.is_empty() {
                // The stored form carries the create index the broker orders by.
                let stored: Vec<Evaluation> = master.registry.reader().read(|state| {
                    ids.iter()
                        .filter_map(|id| state.evals.get(id).cloned())
                        .collect()
                });
                let _ = master.broker.tell(BrokerMsg::Enqueue(stored));
            }
            done(master, ctx, written);
        });
    }

    pub(super) fn submit_job(
        &mut self,
        spec: Option<pb::JobSpec>,
        reply: Reply<Result<pb::SubmitJobReply, String>>,
        ctx: &mut Context<Self>,
    ) {
        if self.leading_term().is_none() {
            return reply.send(Err(self.not_leading()));
        }
        let job = match spec.as_ref().map(job_from_spec) {
            None => return reply.send(Err("SubmitJob carries no job".into())),
            Some(Err(e)) => return reply.send(Err(e.to_string())),
            Some(Ok(job)) => job,
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

    pub(super) fn stop_job(
        &mut self,
        name: String,
        reply: Reply<Result<pb::SubmitJobReply, String>>,
        ctx: &mut Context<Self>,
    ) {
        if self.leading_term().is_none() {
            return reply.send(Err(self.not_leading()));
        }
        let Some(mut job) = self.registry.reader().read(|s| s.jobs.get(&name).cloned()) else {
            return reply.send(Err(format!("no job named {name:?}")));
        };
        job.stopped = true;
        let eval = Evaluation::new(&job, Trigger::JobDeregister);
        let eval_id = eval.id.0.clone();
        let _ = self.blocked.tell(BlockedMsg::Untrack(name.clone()));
        tracing::info!(job = %name, eval = %eval_id, "job stopped");
        self.write_with_evals(
            vec![Op::UpsertJob(job)],
            vec![eval],
            ctx,
            move |_master, _ctx, written| reply.send(job_written(written, eval_id)),
        );
    }

    pub(super) fn job_status(&self, name: &str) -> Result<pb::JobStatusReply, String> {
        if self.leading_term().is_none() {
            return Err(self.not_leading());
        }
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
            return Err(format!("no job named {name:?}"));
        };
        evals.sort_by_key(|e| e.create_index);
        let mut tasks = Vec::new();
        for (agent_id, agent) in &self.cluster.agents {
            for task in agent.tasks.iter().chain(&agent.completed_tasks) {
                if task_job(task) == Some(name) {
                    tasks.push(pb::JobTask {
                        agent_id: agent_id.clone(),
                        task: Some(task.clone()),
                    });
                }
            }
        }
        tasks.sort_by(|a, b| {
            let key = |t: &pb::JobTask| t.task.as_ref().map(|t| t.name.clone());
            key(a).cmp(&key(b))
        });
        Ok(pb::JobStatusReply {
            job: Some(spec_from_job(&job)),
            version: job.version,
            stopped: job.stopped,
            tasks,
            evals: evals
                .iter()
                .rev()
                .take(20)
                .map(|e| pb::EvalSummary {
                    id: e.id.0.clone(),
                    status: format!("{:?}", e.status).to_lowercase(),
                    trigger: format!("{:?}", e.trigger),
                    description: e.status_description.clone(),
                    create_index: e.create_index,
                })
                .collect(),
        })
    }

    /// The blocked-queue released these: pending again in the registry, then to the broker.
    pub(super) fn evals_unblocked(&mut self, evals: Vec<Evaluation>, ctx: &mut Context<Self>) {
        if evals.is_empty() {
            return;
        }
        let evals = evals
            .into_iter()
            .map(|mut e| {
                e.status = EvalStatus::Pending;
                e.status_description = "unblocked: capacity changed".into();
                e
            })
            .collect();
        self.write_with_evals(Vec::new(), evals, ctx, |_master, _ctx, written| {
            if let Err(e) = written {
                tracing::warn!(error = %e, "could not record unblocked evaluations");
            }
        });
    }

    /// The blocked-queue replaced these with newer ones of the same job.
    pub(super) fn evals_canceled(&mut self, evals: Vec<Evaluation>, ctx: &mut Context<Self>) {
        if evals.is_empty() {
            return;
        }
        let op = Op::SetEvalStatus {
            ids: evals.into_iter().map(|e| e.id).collect(),
            status: EvalStatus::Canceled,
            description: "canceled: a newer blocked evaluation of the job".into(),
        };
        self.write_with_evals(vec![op], Vec::new(), ctx, |_master, _ctx, written| {
            if let Err(e) = written {
                tracing::warn!(error = %e, "could not record canceled evaluations");
            }
        });
    }

    pub(super) fn not_leading(&self) -> String {
        match self.leader() {
            Some((_, address)) => format!("not the leading master; the leader is {address}"),
            None => "not the leading master, and no leader is known yet".into(),
        }
    }
}

fn job_written(
    written: Result<Outcome, WriteError>,
    eval_id: String,
) -> Result<pb::SubmitJobReply, String> {
    match written {
        Ok(Outcome::Together(results)) => match results.first() {
            Some(Ok(Outcome::JobStored { version })) => Ok(pb::SubmitJobReply {
                eval_id,
                version: *version,
            }),
            other => Err(format!("the job was not stored: {other:?}")),
        },
        Ok(other) => Err(format!("unexpected registry outcome: {other:?}")),
        Err(e) => Err(e.to_string()),
    }
}
