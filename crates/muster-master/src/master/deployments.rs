//! The leader's deployment watcher, and what operators ask of deployments.
//!
//! Every [`DEPLOYMENT_CHECK`] the leader looks at each running deployment (kept in the
//! registry, see `muster_model::deployment`) and the tasks of its job:
//! - a new task (one placed at the group's current definition) that has been healthy (its
//!   group's `health`: running with its checks passing, or running) for `min_healthy_time` is
//!   recorded healthy, and the progress deadline moves on;
//! - a new task that failed, was lost, turned unhealthy, or is not healthy by its
//!   `healthy_deadline`, is recorded unhealthy, and the deployment fails; so does one that
//!   passes its progress deadline with no task turning healthy;
//! - canaries that are all healthy are promoted if the group says `auto_promote`;
//! - once every group is promoted, has no outdated task left and its new tasks are healthy,
//!   the deployment is successful: its version deployed well.
//!
//! Whatever lets the schedulers go on (tasks healthy, a promotion, a failure) comes with an
//! evaluation of the job. A failed deployment of a group with `auto_revert` submits the
//! job's last version that deployed well again, as a new version, which starts its own
//! deployment. What the watcher remembers between checks (since when a task is healthy) lives
//! on the leader only: a new leader starts those clocks again, and so errs on the side of
//! waiting longer.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use muster_actor::{Context, Reply};
use muster_model::{
    Deployment, DeploymentStatus, EvalStatus, Evaluation, HealthCriteria, Job, TaskHealth,
    TaskState, Trigger,
};
use muster_proto::cluster as pb;
use muster_registry::{DeploymentChange, Op, OpError, Outcome, WriteError};
use tokio::time::Instant;

use super::registry_writes::now_ms;
use super::{Master, Request};
use crate::error::ServiceError;
use crate::task_record::TaskRecord;
use crate::visibility::NamespaceFilter;

/// How often the leader looks at the running deployments.
pub(in crate::master) const DEPLOYMENT_CHECK: Duration = Duration::from_millis(200);

/// Timer: look at the running deployments.
#[derive(Debug)]
pub struct CheckDeployments;

super::notice!(CheckDeployments);

/// Deployments, newest first (`muster deployment list | status`).
#[derive(Debug)]
pub struct ListDeployments {
    /// Only this job's (its id); `None`: those of every job of `namespaces`.
    pub job: Option<String>,
    /// Which namespaces' jobs, with no job named.
    pub namespaces: NamespaceFilter,
    /// Only this deployment.
    pub id: Option<String>,
    /// Answer from this master's own state, without asking the leader.
    pub stale: bool,
    /// The deployments.
    pub reply: Reply<Result<pb::DeploymentList, ServiceError>>,
}

/// Promote, pause, resume or fail a deployment (`muster deployment promote | pause | resume
/// | fail`).
#[derive(Debug)]
pub struct ChangeDeployment {
    /// The deployment (`{job id}.v{version}`).
    pub id: String,
    /// What to do.
    pub action: pb::DeploymentAction,
    /// Promote: these groups' canaries; none: every group's.
    pub groups: Vec<String>,
    /// The deployment after the change.
    pub reply: Reply<Result<pb::ChangeDeploymentReply, ServiceError>>,
}

impl Request for ListDeployments {
    fn waits_for_registry(&self) -> bool {
        !self.stale
    }
    fn refuse(self, error: ServiceError) {
        self.reply.send(Err(error));
    }
}

super::answered_request!(ChangeDeployment);

/// What the leader remembers of one running deployment between checks.
#[derive(Debug, Default)]
pub(in crate::master) struct Watch {
    /// Each new task seen: when first, and since when healthy.
    seen: HashMap<String, Seen>,
    /// A write of this deployment's changes is on its way: nothing more until it is stored.
    writing: bool,
}

#[derive(Clone, Copy, Debug)]
struct Seen {
    first: Instant,
    healthy_since: Option<Instant>,
}

/// What one check found of a deployment.
#[derive(Debug, Default)]
struct Findings {
    healthy: Vec<(String, String)>,
    unhealthy: Vec<(String, String)>,
    /// Why it fails, if it does.
    failure: Option<String>,
    /// Groups whose canaries are all healthy and promote themselves.
    promote: Vec<String>,
    /// Groups whose canaries are all healthy and wait for an operator.
    awaiting_promotion: bool,
    /// Every group is done.
    done: bool,
}

impl Master {
    /// Looks at every running deployment (see the module docs).
    pub(super) fn check_deployments(&mut self, _: CheckDeployments, ctx: &mut Context<Self>) {
        if self.leading_term().is_none() {
            self.deployment_watch.clear();
            return;
        }
        let running: Vec<(Deployment, Job)> = self.registry.reader().read(|state| {
            state
                .active_deployments()
                .filter(|d| d.status == DeploymentStatus::Running)
                .filter_map(|d| {
                    let job = state.jobs.get(&d.job)?;
                    (job.version == d.job_version).then(|| (d.clone(), job.clone()))
                })
                .collect()
        });
        self.deployment_watch
            .retain(|id, _| running.iter().any(|(d, _)| d.id == *id));
        if running.is_empty() {
            return;
        }
        let now = Instant::now();
        let now_ms = now_ms();
        let jobs: BTreeSet<&str> = running.iter().map(|(d, _)| d.job.as_str()).collect();
        let mut tasks: HashMap<&str, Vec<&TaskRecord>> = HashMap::new();
        for agent in self.cluster.agents.values() {
            for task in agent.tasks.iter().chain(&agent.completed_tasks) {
                if let Some(job) = task.job_name().and_then(|job| jobs.get(job)) {
                    tasks.entry(job).or_default().push(task);
                }
            }
        }
        let mut changes = Vec::new();
        for (deployment, job) in &running {
            let watch = self
                .deployment_watch
                .entry(deployment.id.clone())
                .or_default();
            if watch.writing {
                continue;
            }
            let of_job = tasks
                .get(deployment.job.as_str())
                .map_or(&[][..], Vec::as_slice);
            let findings = examine(deployment, job, of_job, watch, now, now_ms);
            changes.push((deployment.clone(), job.clone(), findings));
        }
        for (deployment, job, findings) in changes {
            self.record_findings(deployment, job, findings, now_ms, ctx, |_, _, _| {});
        }
    }

    /// Writes what a check found of `deployment` (of `job`), with an evaluation of the job if
    /// the schedulers may go on, and reverts a failed one that asks for it.
    fn record_findings(
        &mut self,
        deployment: Deployment,
        job: Job,
        findings: Findings,
        now_ms: u64,
        ctx: &mut Context<Self>,
        done: impl FnOnce(&mut Master, &mut Context<Master>, Result<Outcome, WriteError>)
        + Send
        + 'static,
    ) {
        let id = deployment.id.clone();
        let mut ops = Vec::new();
        let progressed = !findings.healthy.is_empty();
        let promoting = !findings.promote.is_empty();
        // New tasks healthy, or canaries promoted: the progress deadline starts over.
        if progressed || promoting || !findings.unhealthy.is_empty() {
            let progress_by_ms = (progressed || promoting)
                .then(|| deployment.progress_deadline_ms())
                .flatten()
                .map(|ms| now_ms.saturating_add(ms));
            ops.push(change(
                &id,
                DeploymentChange::Progress {
                    healthy: findings.healthy,
                    unhealthy: findings.unhealthy,
                    progress_by_ms,
                },
            ));
        }
        if promoting {
            ops.push(change(
                &id,
                DeploymentChange::Promote {
                    groups: findings.promote,
                },
            ));
        }
        let mut failed = None;
        if let Some(why) = findings.failure {
            // A rollback is not rolled back in turn: it would go back to the same version.
            let revert =
                !deployment.rollback && deployment.groups.values().any(|g| g.update.auto_revert);
            let stable = self.registry.reader().read(|state| {
                let version = state.stable_version(&job.name, deployment.job_version)?;
                let kept = state
                    .job_versions
                    .get(&job.name)?
                    .iter()
                    .find(|old| old.version == version)
                    .cloned();
                Some((version, kept))
            });
            let (description, revert_to) = match (revert, stable) {
                (true, Some((version, Some(old)))) => (
                    format!("{why}; rolling back to version {version}"),
                    Some(Job {
                        stopped: false,
                        ..old
                    }),
                ),
                (true, Some((version, None))) => (
                    format!(
                        "{why}; version {version} deployed well, but the registry no longer keeps it: not rolled back"
                    ),
                    None,
                ),
                (true, None) => (
                    format!("{why}; no kept version deployed well: not rolled back"),
                    None,
                ),
                (false, _) => (why, None),
            };
            tracing::warn!(deployment = %id, %description, "deployment failed");
            failed = Some(Op::FailDeployment {
                id: id.clone(),
                description,
                revert: revert_to,
                at_ms: now_ms,
            });
        } else if findings.done {
            tracing::info!(deployment = %id, "deployment successful");
            ops.push(change(
                &id,
                DeploymentChange::Status {
                    status: DeploymentStatus::Successful,
                    description: "every new task is healthy".into(),
                    reverted_to: None,
                },
            ));
        } else if findings.awaiting_promotion && deployment.description != AWAITING {
            ops.push(change(
                &id,
                DeploymentChange::Describe {
                    description: AWAITING.into(),
                },
            ));
        }
        if ops.is_empty() && failed.is_none() {
            return done(self, ctx, Ok(Outcome::Updated));
        }
        let mut evals = Vec::new();
        let reverting = matches!(
            &failed,
            Some(Op::FailDeployment {
                revert: Some(_),
                ..
            })
        );
        if let Some(fail) = failed {
            ops.push(fail);
        }
        if reverting {
            self.crash_loops.forget_job(&job.name);
            evals.push(Evaluation::new(&job, Trigger::JobRegister));
        } else if progressed || promoting || ops.len() > 1 {
            evals.push(Evaluation::new(&job, Trigger::Deployment(id.clone())));
        }
        evals.retain(|e| e.status == EvalStatus::Pending);
        if let Some(watch) = self.deployment_watch.get_mut(&id) {
            watch.writing = true;
        }
        self.write_with_evals(ops, evals, ctx, move |master, ctx, written| {
            if let Some(watch) = master.deployment_watch.get_mut(&id) {
                watch.writing = false;
            }
            if let Err(error) = &written {
                tracing::warn!(deployment = %id, %error, "could not record the deployment's progress");
            }
            done(master, ctx, written);
        });
    }
}

impl Master {
    /// [`ListDeployments`]: read linearizably (or stale) from the registry.
    pub(super) fn list_deployments(
        &mut self,
        ListDeployments {
            job,
            namespaces,
            id,
            stale,
            reply,
        }: ListDeployments,
        ctx: &mut Context<Self>,
    ) {
        self.read(stale, ctx, reply, move |master| {
            let mut found: Vec<Deployment> = master.registry.reader().read(|state| match &job {
                Some(job) => state.deployments_of(job).cloned().collect(),
                None => state
                    .deployments
                    .iter()
                    .filter(|(job, _)| namespaces.admits(muster_model::namespace_of(job)))
                    .flat_map(|(_, kept)| kept.iter().cloned())
                    .collect(),
            });
            if let Some(id) = &id {
                found.retain(|d| d.id == *id);
                if found.is_empty() {
                    return Err(ServiceError::UnknownDeployment(id.clone()));
                }
            }
            found.sort_by(|a, b| {
                (b.created_ms, b.modify_index).cmp(&(a.created_ms, a.modify_index))
            });
            Ok(pb::DeploymentList {
                deployments: found.into_iter().map(Into::into).collect(),
                read: Some(master.read_info(stale)),
            })
        });
    }

    /// [`ChangeDeployment`]: once a quorum confirms this master leads, the change written with
    /// an evaluation of the job; a failure rolls back as the deployment's own would.
    pub(super) fn change_deployment(
        &mut self,
        ChangeDeployment {
            id,
            action,
            groups,
            reply,
        }: ChangeDeployment,
        ctx: &mut Context<Self>,
    ) {
        self.with_quorum_leadership(ctx, move |master, ctx, confirmed| {
            if let Err(refusal) = confirmed {
                return reply.send(Err(refusal));
            }
            let found = master.registry.reader().read(|state| {
                let deployment = state.deployment(&id)?.clone();
                let job = state.jobs.get(&deployment.job)?.clone();
                Some((deployment, job))
            });
            let Some((deployment, job)) = found else {
                return reply.send(Err(ServiceError::UnknownDeployment(id)));
            };
            if !deployment.status.is_active() {
                return reply.send(Err(ServiceError::FailedPrecondition(format!(
                    "deployment {id:?} is {}: it changes no more",
                    deployment.status.as_str()
                ))));
            }
            let op_change = match action {
                pb::DeploymentAction::Promote => DeploymentChange::Promote { groups },
                pb::DeploymentAction::Pause => DeploymentChange::Status {
                    status: DeploymentStatus::Paused,
                    description: "paused by an operator".into(),
                    reverted_to: None,
                },
                pb::DeploymentAction::Resume => DeploymentChange::Status {
                    status: DeploymentStatus::Running,
                    description: "resumed by an operator".into(),
                    reverted_to: None,
                },
                pb::DeploymentAction::Fail => {
                    let findings = Findings {
                        failure: Some("failed by an operator".into()),
                        ..Findings::default()
                    };
                    let now_ms = now_ms();
                    // Answered once the failure is written, as it is then.
                    let answer = move |master: &mut Master, ctx: &mut Context<Master>, written| {
                        match refusal(written) {
                            Some(error) => reply.send(Err(error)),
                            None => master.answer_change(id, reply, ctx),
                        }
                    };
                    return master.record_findings(deployment, job, findings, now_ms, ctx, answer);
                }
                pb::DeploymentAction::Unspecified => {
                    return reply.send(Err(ServiceError::InvalidArgument {
                        field: "action".into(),
                        message: "action: say promote, pause, resume or fail".into(),
                    }));
                }
            };
            let evals = vec![Evaluation::new(&job, Trigger::Deployment(id.clone()))];
            let mut ops = vec![change(&id, op_change)];
            // Promoted or resumed: the roll goes on, and its progress deadline starts over.
            if matches!(
                action,
                pb::DeploymentAction::Promote | pb::DeploymentAction::Resume
            ) && let Some(ms) = deployment.progress_deadline_ms()
            {
                ops.push(change(
                    &id,
                    DeploymentChange::Progress {
                        healthy: Vec::new(),
                        unhealthy: Vec::new(),
                        progress_by_ms: Some(now_ms().saturating_add(ms)),
                    },
                ));
            }
            master.write_with_evals(ops, evals, ctx, move |master, ctx, written| {
                if let Some(error) = refusal(written) {
                    return reply.send(Err(error));
                }
                master.answer_change(id, reply, ctx);
            });
        });
    }

    /// Answers a change of deployment `id` with the deployment as the registry holds it once
    /// the change is applied here.
    fn answer_change(
        &mut self,
        id: String,
        reply: Reply<Result<pb::ChangeDeploymentReply, ServiceError>>,
        ctx: &mut Context<Self>,
    ) {
        // Whatever this master wrote is applied once a quorum confirms it still leads.
        self.with_quorum_leadership(ctx, move |master, _ctx, confirmed| {
            let answer = confirmed.and_then(|()| {
                master
                    .registry
                    .reader()
                    .read(|state| state.deployment(&id).cloned())
                    .map(|d| pb::ChangeDeploymentReply {
                        deployment: Some(d.into()),
                    })
                    .ok_or(ServiceError::UnknownDeployment(id))
            });
            reply.send(answer);
        });
    }
}

/// The description of a deployment whose canaries are healthy and wait for an operator.
const AWAITING: &str = "canaries are healthy: promote them to go on (`muster deployment promote`)";

/// Why a write of deployment changes (with evaluations) did not go through, if it did not:
/// the ops are written together, so the registry's refusal of one (not paused, nothing to
/// promote, ended) is inside the outcome.
fn refusal(written: Result<Outcome, WriteError>) -> Option<ServiceError> {
    match written {
        Err(error) => Some(error.into()),
        Ok(Outcome::Together(results)) => results
            .into_iter()
            .find_map(Result::err)
            .map(|e: OpError| WriteError::Rejected(e).into()),
        Ok(_) => None,
    }
}

fn change(id: &str, change: DeploymentChange) -> Op {
    Op::ChangeDeployment {
        id: id.to_owned(),
        change,
    }
}

/// Looks at `deployment` of `job`, whose tasks are `tasks`, at `now` (`now_ms` on the wall
/// clock), with what the watcher remembers of it.
fn examine(
    deployment: &Deployment,
    job: &Job,
    tasks: &[&TaskRecord],
    watch: &mut Watch,
    now: Instant,
    now_ms: u64,
) -> Findings {
    let mut findings = Findings {
        done: true,
        ..Findings::default()
    };
    let system = job.scheduler == muster_model::SchedulerType::System;
    for (name, group) in &deployment.groups {
        let Some(spec) = job.groups.iter().find(|g| g.name == *name) else {
            continue;
        };
        let checks = group.update.health == HealthCriteria::Checks && !spec.checks.is_empty();
        let mut healthy_canaries = 0;
        let mut healthy_own = 0;
        let mut outdated = 0;
        let mut live_own = 0;
        for task in tasks.iter().filter(|t| t.view.group() == name.as_str()) {
            let id = task.id();
            let current = task.view.job_version == 0 || task.view.job_version >= spec.spec_version;
            if !current {
                if !task.is_terminal() {
                    outdated += 1;
                }
                continue;
            }
            let canary = task
                .name()
                .contains(&format!("[{}", muster_scheduler::CANARY_PREFIX));
            if !task.is_terminal() && !canary {
                live_own += 1;
            }
            if group.healthy.contains(id) {
                if !task.is_terminal() {
                    if canary {
                        healthy_canaries += 1;
                    } else {
                        healthy_own += 1;
                    }
                }
                continue;
            }
            if group.unhealthy.contains(id) {
                continue;
            }
            let seen = watch.seen.entry(id.to_owned()).or_insert(Seen {
                first: now,
                healthy_since: None,
            });
            let state = task.state();
            // Only a task placed for this deployment can fail it (one of an earlier version
            // of the same definition, after a change of count alone, is judged healthy only).
            let judged = task.view.job_version >= deployment.job_version;
            let unhealthy = match state {
                _ if !judged => None,
                TaskState::Failed | TaskState::Lost => Some(format!(
                    "task {id} {}{}",
                    if state == TaskState::Lost {
                        "was lost"
                    } else {
                        "failed"
                    },
                    if task.message.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", task.message)
                    }
                )),
                _ if task.view.health == TaskHealth::Unhealthy => {
                    Some(format!("task {id} is unhealthy: {}", task.message))
                }
                _ => None,
            };
            if let Some(why) = unhealthy {
                findings.unhealthy.push((name.clone(), id.to_owned()));
                findings.failure.get_or_insert(why);
                continue;
            }
            if task.is_terminal() {
                // Stopped by a scheduler (a canary retired, a slot given up): no verdict.
                continue;
            }
            let healthy_now =
                state == TaskState::Running && (!checks || task.view.health == TaskHealth::Healthy);
            if healthy_now {
                let since = *seen.healthy_since.get_or_insert(now);
                if now.saturating_duration_since(since) >= group.update.min_healthy_time() {
                    findings.healthy.push((name.clone(), id.to_owned()));
                    if canary {
                        healthy_canaries += 1;
                    } else {
                        healthy_own += 1;
                    }
                }
            } else {
                seen.healthy_since = None;
                if judged
                    && now.saturating_duration_since(seen.first) >= group.update.healthy_deadline()
                {
                    findings.unhealthy.push((name.clone(), id.to_owned()));
                    findings.failure.get_or_insert(format!(
                        "task {id} was not healthy within its healthy_deadline of {}",
                        humantime::format_duration(group.update.healthy_deadline())
                    ));
                }
            }
        }
        if !group.promoted {
            let canaries_healthy = if system {
                healthy_own >= group.desired_canaries as usize
            } else {
                healthy_canaries >= group.desired_canaries as usize
            };
            if canaries_healthy {
                if group.update.auto_promote {
                    findings.promote.push(name.clone());
                } else {
                    findings.awaiting_promotion = true;
                }
            }
            findings.done = false;
            continue;
        }
        let wanted = if system {
            live_own
        } else {
            spec.count as usize
        };
        if outdated > 0 || healthy_own < wanted || healthy_own < live_own {
            findings.done = false;
        }
    }
    if findings.failure.is_none()
        && findings.healthy.is_empty()
        && deployment.progress_by_ms != 0
        && now_ms > deployment.progress_by_ms
        && !findings.done
        && !findings.awaiting_promotion
    {
        findings.failure = Some("no new task turned healthy within its progress_deadline".into());
    }
    findings
}
