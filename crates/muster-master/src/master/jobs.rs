//! Jobs as operators reach them through the leading master: submitting one (its registry
//! write carries the evaluation it calls for), stopping one, its status, its versions, the
//! list of jobs, and a dry run of a submission (Nomad's job plan).

use std::collections::{BTreeMap, HashMap};

use muster_actor::{Context, Reply};
use muster_broker::blocked::BlockedMsg;
use muster_model::{AgentId, EvalStatus, Evaluation, Job, TaskState, Trigger};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_registry::{Op, Outcome, WriteError};

use super::registry_writes::now_ms;
use super::{Master, Request, answered_request};
use crate::error::ServiceError;
use crate::visibility::NamespaceFilter;

/// Submit a job, or a new version of one (`muster job run`).
#[derive(Debug)]
pub struct SubmitJob {
    /// The job as submitted.
    pub job: Option<model_pb::Job>,
    /// Its evaluation and version.
    pub reply: Reply<Result<pb::SubmitJobReply, ServiceError>>,
}

/// Stop a job (`muster job stop`).
#[derive(Debug)]
pub struct StopJob {
    /// The job's name.
    pub name: String,
    /// Its deregistration evaluation.
    pub reply: Reply<Result<pb::SubmitJobReply, ServiceError>>,
}

/// A job, its tasks and its evaluations (`muster job status`).
#[derive(Debug)]
pub struct JobStatus {
    /// The job's name.
    pub name: String,
    /// Answer from this master's own state, without asking the leader.
    pub stale: bool,
    /// The status.
    pub reply: Reply<Result<pb::JobStatusReply, ServiceError>>,
}

/// Jobs with their tasks counted by state (`muster job list`).
#[derive(Debug)]
pub struct ListJobs {
    /// A name prefix, and whether a stale answer will do.
    pub request: pb::ListJobsRequest,
    /// The namespaces to list (the request's, checked against the caller's policies).
    pub namespaces: NamespaceFilter,
    /// The jobs, by name.
    pub reply: Reply<Result<pb::JobList, ServiceError>>,
}

/// A dry run of submitting a job (`muster job plan`): what the scheduler would do.
#[derive(Debug)]
pub struct PlanJob {
    /// The job as it would be submitted.
    pub job: Option<model_pb::Job>,
    /// The plan; nothing is written.
    pub reply: Reply<Result<pb::JobPlan, ServiceError>>,
}

/// A job's versions, newest first (`muster job history`).
#[derive(Debug)]
pub struct JobVersions {
    /// The job's name.
    pub name: String,
    /// Answer from this master's own state, without asking the leader.
    pub stale: bool,
    /// The current version, then the earlier ones the registry keeps.
    pub reply: Reply<Result<pb::JobVersionList, ServiceError>>,
}

answered_request!(SubmitJob, StopJob, PlanJob);

impl Request for JobStatus {
    fn waits_for_registry(&self) -> bool {
        !self.stale
    }
    fn refuse(self, error: ServiceError) {
        self.reply.send(Err(error));
    }
}

impl Request for ListJobs {
    fn waits_for_registry(&self) -> bool {
        !self.request.stale
    }
    fn refuse(self, error: ServiceError) {
        self.reply.send(Err(error));
    }
}

impl Request for JobVersions {
    fn waits_for_registry(&self) -> bool {
        !self.stale
    }
    fn refuse(self, error: ServiceError) {
        self.reply.send(Err(error));
    }
}

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
        let namespace = job.namespace();
        if self
            .registry
            .reader()
            .read(|state| state.namespace(namespace).is_none())
        {
            return Err(ServiceError::UnknownNamespace(namespace.to_owned()));
        }
        Ok(job)
    }

    /// Checks the submitted job against the limits, then stores it with its registration
    /// evaluation in one registry write; the answer names the evaluation and the version.
    pub(super) fn submit_job(
        &mut self,
        SubmitJob { job: spec, reply }: SubmitJob,
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
        // A new version starts its slots' failures over, those given up on included.
        self.crash_loops.forget_job(&job.name);
        let deploy = Op::StartDeployment {
            job: job.name.clone(),
            at_ms: now_ms(),
            revert: false,
        };
        self.write_with_evals(
            vec![Op::UpsertJob(job), deploy],
            vec![eval],
            ctx,
            move |_master, _ctx, written| reply.send(job_written(written, eval_id)),
        );
    }

    /// Stops a job: once a quorum confirms this master leads (so its registry holds every
    /// committed submission, and "no such job" is not a stale answer), one entry that stops
    /// the job as it is when applied (`Op::StopJob`, so a submission racing the stop is kept)
    /// and its deregistration evaluation.
    pub(super) fn stop_job(&mut self, StopJob { name, reply }: StopJob, ctx: &mut Context<Self>) {
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
            let mut eval = Evaluation::new(&job, Trigger::JobDeregister);
            // Stopping needs no scheduler of its own: the type's built-in one stops every
            // task of a stopped job, even while the job's named scheduler is not connected.
            eval.named_scheduler = None;
            let eval_id = eval.id.0.clone();
            let _ = master.blocked.tell(BlockedMsg::Untrack(name.clone()));
            master.crash_loops.forget_job(&name);
            tracing::info!(job = %name, eval = %eval_id, "job stopped");
            master.write_with_evals(
                vec![Op::StopJob(name)],
                vec![eval],
                ctx,
                move |_master, _ctx, written| reply.send(job_written(written, eval_id)),
            );
        });
    }

    /// [`JobStatus`]: the job's status as a read (see `cluster_state.rs`, `read`).
    pub(super) fn job_status(
        &mut self,
        JobStatus { name, stale, reply }: JobStatus,
        ctx: &mut Context<Self>,
    ) {
        self.read(stale, ctx, reply, move |master| {
            let mut status = master.status_of(&name)?;
            status.read = Some(master.read_info(stale));
            Ok(status)
        });
    }

    /// [`ListJobs`]: the jobs whose names start with the prefix, as a read.
    pub(super) fn list_jobs(
        &mut self,
        ListJobs {
            request,
            namespaces,
            reply,
        }: ListJobs,
        ctx: &mut Context<Self>,
    ) {
        let stale = request.stale;
        self.read(stale, ctx, reply, move |master| {
            Ok(pb::JobList {
                jobs: master.job_summaries(&request.prefix, &namespaces),
                read: Some(master.read_info(stale)),
            })
        });
    }

    /// [`JobVersions`]: the current version and the earlier ones the registry keeps, as a
    /// read.
    pub(super) fn job_versions(
        &mut self,
        JobVersions { name, stale, reply }: JobVersions,
        ctx: &mut Context<Self>,
    ) {
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
            let versions = versions.ok_or_else(|| ServiceError::UnknownJob(name.clone()))?;
            Ok(pb::JobVersionList {
                versions,
                read: Some(master.read_info(stale)),
            })
        });
    }

    /// [`PlanJob`]: once a quorum confirms this master leads, the plan its scheduler makes
    /// for the job on a snapshot, with nothing written.
    pub(super) fn plan_job(&mut self, PlanJob { job, reply }: PlanJob, ctx: &mut Context<Self>) {
        let job = match self.checked_job(job, "PlanJob") {
            Ok(job) => job,
            Err(e) => return reply.send(Err(e)),
        };
        self.with_quorum_leadership(ctx, move |master, _ctx, confirmed| {
            reply.send(confirmed.map(|()| master.dry_run(job)));
        });
    }

    /// A summary of every job of `namespaces` whose name starts with `prefix`, by namespace
    /// and name.
    pub(super) fn job_summaries(
        &self,
        prefix: &str,
        namespaces: &NamespaceFilter,
    ) -> Vec<pb::JobSummary> {
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
                    .iter()
                    .filter(|(_, job)| {
                        namespaces.admits(job.namespace())
                            && job.name_in_namespace().starts_with(prefix)
                    })
                    .map(|(name, job)| {
                        let summary = pb::JobSummary {
                            name: job.name_in_namespace().to_owned(),
                            namespace: job.namespace().to_owned(),
                            scheduler: i32::from(job.scheduler),
                            scheduler_name: job.scheduler_name().to_owned(),
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

    /// The job as stored, its tasks on the agents (and, unknown, on agents marked
    /// unreachable) and its last 20 evaluations, newest first;
    /// [`ServiceError::UnknownJob`] if no job has that name.
    fn status_of(&self, name: &str) -> Result<pb::JobStatusReply, ServiceError> {
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

    /// A dry run of submitting `job` (Nomad's job plan): the plan this master's scheduler
    /// would make for it against the cluster now, with the version the registry would give
    /// it. Nothing is written; what the plan applier would refuse is not checked.
    fn dry_run(&mut self, job: Job) -> pb::JobPlan {
        let old = self
            .registry
            .reader()
            .read(|state| state.jobs.get(&job.name).cloned());
        let job = muster_registry::next_version(old.as_ref(), job);
        let version = job.version;
        let mut snapshot = self.snapshot(true);
        let eval = Evaluation::new(&job, muster_model::Trigger::JobRegister);
        snapshot.jobs.insert(job.name.clone(), job);
        let plan = match self.config.placement {
            crate::Placement::Binpack => muster_scheduler::Scheduler::schedule(
                &mut muster_scheduler::binpack(),
                &eval,
                &snapshot,
            ),
            crate::Placement::Spread => muster_scheduler::Scheduler::schedule(
                &mut muster_scheduler::spread(),
                &eval,
                &snapshot,
            ),
        };
        let name_of = |agent: &AgentId, task_id: &str| {
            snapshot
                .agent(agent)
                .and_then(|a| a.tasks().iter().find(|t| t.id() == task_id))
                .map(|t| t.name().to_owned())
                .unwrap_or_default()
        };
        let stop: Vec<pb::PlannedTask> = plan
            .stop
            .iter()
            .map(|s| pb::PlannedTask {
                name: name_of(&s.agent, &s.task_id),
                agent_id: s.agent.0.clone(),
                task_id: s.task_id.clone(),
            })
            .collect();
        let place: Vec<pb::PlannedTask> = plan
            .place
            .iter()
            .map(|p| pb::PlannedTask {
                name: p.name.clone(),
                agent_id: p.agent.0.clone(),
                task_id: String::new(),
            })
            .collect();
        let replaced = place
            .iter()
            .filter(|p| stop.iter().any(|s| s.name == p.name))
            .map(|p| p.name.clone())
            .collect();
        let unplaced = plan
            .unplaced
            .iter()
            .map(|demand| format!("{demand:?}"))
            .collect();
        // A task of another namespace is only counted: a dry run shows its caller no more
        // than its own namespace.
        let namespace = muster_model::namespace_of(&plan.job);
        let preempt = plan
            .preempt
            .iter()
            .map(|p| {
                let own = muster_model::namespace_of(&p.job) == namespace;
                pb::PlannedTask {
                    name: if own {
                        name_of(&p.agent, &p.task_id)
                    } else {
                        "a task of another namespace".to_owned()
                    },
                    agent_id: p.agent.0.clone(),
                    task_id: if own {
                        p.task_id.clone()
                    } else {
                        String::new()
                    },
                }
            })
            .collect();
        pb::JobPlan {
            version,
            place,
            stop,
            replaced,
            unplaced,
            preempt,
        }
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
