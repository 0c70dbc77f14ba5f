//! Draining agents and their eligibility (Nomad's node drain): what operators ask, and how the
//! leader carries a drain to its end.
//!
//! An agent's scheduling (eligible or not, the drain under way) is kept in the registry
//! (`Op::SetScheduling`), so a new leader carries a drain on. The schedulers do the moving
//! (`muster_scheduler::reconcile`: service tasks move a migration step at a time, each running
//! until its replacement runs; batch tasks stay to their end; system tasks go last; past the
//! deadline everything stops). The leader gives them the evaluations that make them do it:
//! - one for each job with a live task on the agent when the drain starts, changes or ends,
//!   and when its deadline passes;
//! - one whenever a task of a job that still has a task on a draining agent runs or ends (a
//!   replacement running lets the next task move);
//! - every [`DRAIN_CHECK`], one for each such job whose tasks move now (a service job, or a
//!   system job once it is all that is left) with none in flight: after a failover, or when
//!   the system tasks' turn comes. A batch task is left to its end or the deadline.
//!
//! The same check marks the deadline passed, and an agent with no live task of a job left
//! drained: eligible no more, its drain over.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use muster_actor::{Context, Reply};
use muster_model::{
    AgentId, AgentScheduling, Drain, EvalStatus, Evaluation, SchedulerType, Trigger,
};
use muster_proto::cluster as pb;
use muster_registry::{Op, OpError, Outcome, WriteError};

use super::{CheckDrains, DrainAgent, SetAgentEligibility};
use crate::error::ServiceError;
use crate::master::Master;
use crate::master::leadership::Role;
use crate::master::registry_writes::now_ms;
use crate::task_record::TaskRecord;

/// How often the leader checks the drains under way.
pub(in crate::master) const DRAIN_CHECK: Duration = Duration::from_secs(1);

/// A drain's deadline when the request names none (Nomad's default).
pub(in crate::master) const DEFAULT_DRAIN_DEADLINE: Duration = Duration::from_secs(3600);

impl Master {
    /// How schedulers may use each agent whose scheduling is not the default, by agent id.
    pub(in crate::master) fn agent_scheduling(&self) -> BTreeMap<String, AgentScheduling> {
        self.registry.reader().read(|state| {
            state
                .scheduling
                .iter()
                .map(|(id, scheduling)| (id.0.clone(), scheduling.clone()))
                .collect()
        })
    }

    /// Starts, changes or cancels an agent's drain (once a quorum confirms this master
    /// leads), with an evaluation for each job with a live task there.
    pub(in crate::master) fn drain_agent(
        &mut self,
        DrainAgent { request, reply }: DrainAgent,
        ctx: &mut Context<Self>,
    ) {
        let agent_id = request.agent_id.clone();
        self.change_scheduling(agent_id, reply, ctx, move |current| {
            let next = drained_by(&request, current, now_ms());
            tracing::info!(agent = %request.agent_id, cancel = request.cancel, force = request.force, deadline_ms = ?next.drain.as_ref().and_then(|d| d.deadline_ms), "agent drain requested");
            Ok(next)
        });
    }

    /// Sets whether schedulers may place new tasks on an agent (once a quorum confirms this
    /// master leads). Refused while the agent drains: the drain decides.
    pub(in crate::master) fn set_agent_eligibility(
        &mut self,
        SetAgentEligibility { request, reply }: SetAgentEligibility,
        ctx: &mut Context<Self>,
    ) {
        let agent_id = request.agent_id.clone();
        self.change_scheduling(agent_id, reply, ctx, move |current| {
            if current.is_draining() && request.eligible {
                return Err(ServiceError::FailedPrecondition(format!(
                    "agent {} is draining: cancel the drain (muster agent drain {} --disable) to make it eligible",
                    request.agent_id, request.agent_id
                )));
            }
            tracing::info!(agent = %request.agent_id, eligible = request.eligible, "agent eligibility set");
            Ok(AgentScheduling {
                eligible: request.eligible,
                ..current
            })
        });
    }

    /// Once a quorum confirms this master leads: the scheduling `next` makes of the agent's
    /// current one, written (see [`Master::write_scheduling`]), or why not.
    fn change_scheduling(
        &mut self,
        agent_id: String,
        reply: Reply<Result<pb::AgentSchedulingReply, ServiceError>>,
        ctx: &mut Context<Self>,
        next: impl FnOnce(AgentScheduling) -> Result<AgentScheduling, ServiceError> + Send + 'static,
    ) {
        self.with_quorum_leadership(ctx, move |master, ctx, confirmed| {
            let next = confirmed
                .and_then(|()| master.known_scheduling(&agent_id))
                .and_then(next);
            match next {
                Ok(next) => master.write_scheduling(agent_id, next, reply, ctx),
                Err(refusal) => reply.send(Err(refusal)),
            }
        });
    }

    /// The scheduling of the agent `id` the registry knows (admitted or unreachable).
    fn known_scheduling(&self, id: &str) -> Result<AgentScheduling, ServiceError> {
        let agent = AgentId(id.to_owned());
        self.registry.reader().read(|state| {
            if !state.agents.contains_key(&agent) && !state.unreachable.contains_key(&agent) {
                return Err(ServiceError::UnknownAgent(id.to_owned()));
            }
            Ok(state.scheduling.get(&agent).cloned().unwrap_or_default())
        })
    }

    /// Writes an agent's new scheduling with an evaluation for each job with a live task on
    /// it, and answers with what was stored.
    fn write_scheduling(
        &mut self,
        agent_id: String,
        scheduling: AgentScheduling,
        reply: Reply<Result<pb::AgentSchedulingReply, ServiceError>>,
        ctx: &mut Context<Self>,
    ) {
        let evals = self.evals_for_jobs_on(&agent_id, |_| true);
        let op = Op::SetScheduling {
            id: AgentId(agent_id.clone()),
            scheduling: scheduling.clone(),
        };
        self.write_with_evals(vec![op], evals, ctx, move |master, _ctx, written| {
            let answer = scheduling_written(written).map(|()| {
                master.scheduling_changed(&agent_id);
                pb::AgentSchedulingReply {
                    agent_id,
                    scheduling: Some(scheduling.into()),
                }
            });
            reply.send(answer);
        });
    }

    /// An agent's scheduling changed: its scheduler view is rebuilt, and the drain check
    /// knows whether it drains.
    fn scheduling_changed(&mut self, agent_id: &str) {
        self.cluster.agent_mut(agent_id);
        self.next_index();
        let scheduling = self.agent_scheduling();
        self.draining = draining(&scheduling);
    }

    /// An evaluation (triggered by the agent's drain) for each job with a live task on
    /// `agent_id` that `wanted` admits.
    fn evals_for_jobs_on(&self, agent_id: &str, wanted: impl Fn(&str) -> bool) -> Vec<Evaluation> {
        let Some(agent) = self.cluster.agents.get(agent_id) else {
            return Vec::new();
        };
        let jobs: BTreeSet<&str> = agent
            .tasks
            .iter()
            .filter(|t| !t.is_terminal())
            .filter_map(TaskRecord::job_name)
            .filter(|job| wanted(job))
            .collect();
        self.registry.reader().read(|state| {
            jobs.iter()
                .filter_map(|name| state.jobs.get(*name))
                .map(|job| Evaluation::new(job, Trigger::AgentDrain(AgentId(agent_id.to_owned()))))
                .collect()
        })
    }

    /// The jobs with a live task on the draining agent `agent_id` that the schedulers move
    /// now: its service jobs, and its system jobs once no other live task of a job is left.
    fn movable_jobs_on(&self, agent_id: &str) -> HashSet<String> {
        let Some(agent) = self.cluster.agents.get(agent_id) else {
            return HashSet::new();
        };
        let jobs: HashSet<&str> = agent
            .tasks
            .iter()
            .filter(|t| !t.is_terminal())
            .filter_map(TaskRecord::job_name)
            .collect();
        self.registry.reader().read(|state| {
            let of_type = |wanted: SchedulerType| {
                jobs.iter()
                    .filter(move |name| {
                        state
                            .jobs
                            .get(**name)
                            .is_some_and(|job| job.scheduler == wanted)
                    })
                    .map(|name| (*name).to_owned())
            };
            let mut movable: HashSet<String> = of_type(SchedulerType::Service).collect();
            let only_system = jobs.iter().all(|name| {
                state
                    .jobs
                    .get(*name)
                    .is_none_or(|job| job.scheduler == SchedulerType::System)
            });
            if only_system {
                movable.extend(of_type(SchedulerType::System));
            }
            movable
        })
    }

    /// A task of `job` ran or ended: if the job still has a live task on a draining agent,
    /// its scheduler runs again to move the next one (or stop the one replaced).
    pub(in crate::master) fn drain_progressed(&mut self, job: &str, ctx: &mut Context<Self>) {
        if self.draining.is_empty() || self.leading_term().is_none() {
            return;
        }
        let on_draining = self.draining.iter().find(|id| {
            self.cluster.agents.get(*id).is_some_and(|agent| {
                agent
                    .tasks
                    .iter()
                    .any(|t| !t.is_terminal() && t.job() == job)
            })
        });
        let Some(agent_id) = on_draining.cloned() else {
            return;
        };
        let evals = self.evals_for_jobs_on(&agent_id, |name| name == job);
        self.write_with_evals(Vec::new(), evals, ctx, |_master, _ctx, written| {
            if let Err(error) = written {
                tracing::warn!(%error, "could not write a drain's evaluation");
            }
        });
    }

    /// The leader's check of the drains under way (every [`DRAIN_CHECK`]): a deadline passed
    /// stops what is left; an agent with no live task of a job left is drained; a job with a
    /// task on a draining agent and no evaluation in flight gets one.
    pub(in crate::master) fn check_drains(&mut self, _timer: CheckDrains, ctx: &mut Context<Self>) {
        let Role::Leading { recovery, .. } = &self.role else {
            return;
        };
        if recovery.is_some() {
            return;
        }
        let scheduling = self.agent_scheduling();
        self.draining = draining(&scheduling);
        if self.draining.is_empty() {
            return;
        }
        let now = now_ms();
        let in_flight: HashSet<String> = self.registry.reader().read(|state| {
            state
                .evals
                .values()
                .filter(|e| matches!(e.status, EvalStatus::Pending | EvalStatus::Blocked))
                .map(|e| e.job.clone())
                .collect()
        });
        let mut ops = Vec::new();
        let mut evals = Vec::new();
        for (agent_id, current) in &scheduling {
            let Some(drain) = &current.drain else {
                continue;
            };
            let runs_tasks = self.cluster.agents.get(agent_id).is_some_and(|agent| {
                agent
                    .tasks
                    .iter()
                    .any(|t| !t.is_terminal() && t.job_name().is_some())
            });
            let id = AgentId(agent_id.clone());
            if !runs_tasks {
                tracing::info!(agent = %agent_id, "agent drained");
                ops.push(Op::SetScheduling {
                    id,
                    scheduling: AgentScheduling {
                        eligible: false,
                        drain: None,
                        drained_at_ms: now,
                    },
                });
            } else if !drain.past_deadline && drain.deadline_ms.is_some_and(|at| now >= at) {
                tracing::warn!(agent = %agent_id, "the drain's deadline passed: stopping what is left");
                ops.push(Op::SetScheduling {
                    id,
                    scheduling: AgentScheduling {
                        drain: Some(Drain {
                            past_deadline: true,
                            ..drain.clone()
                        }),
                        ..current.clone()
                    },
                });
                evals.extend(self.evals_for_jobs_on(agent_id, |_| true));
            } else {
                // Jobs whose tasks there move now: service jobs, and system jobs once they
                // are all that is left (batch tasks wait for their end or the deadline).
                let movable = self.movable_jobs_on(agent_id);
                evals.extend(self.evals_for_jobs_on(agent_id, |job| {
                    movable.contains(job) && !in_flight.contains(job)
                }));
            }
        }
        // One evaluation per job, whichever agents it is on.
        let mut seen = HashSet::new();
        evals.retain(|eval| seen.insert(eval.job.clone()));
        if ops.is_empty() && evals.is_empty() {
            return;
        }
        let changed: Vec<String> = ops
            .iter()
            .filter_map(|op| match op {
                Op::SetScheduling { id, .. } => Some(id.0.clone()),
                _ => None,
            })
            .collect();
        self.write_with_evals(
            ops,
            evals,
            ctx,
            move |master, _ctx, written| match written {
                Ok(_) => {
                    for id in &changed {
                        master.scheduling_changed(id);
                    }
                }
                Err(error) => tracing::warn!(%error, "could not write the drains' progress"),
            },
        );
    }
}

/// The agents of `scheduling` that drain.
fn draining(scheduling: &BTreeMap<String, AgentScheduling>) -> BTreeSet<String> {
    scheduling
        .iter()
        .filter(|(_, s)| s.is_draining())
        .map(|(id, _)| id.clone())
        .collect()
}

/// The scheduling `request` asks for, over the agent's `current` one, at `now_ms`.
fn drained_by(
    request: &pb::DrainAgentRequest,
    current: AgentScheduling,
    now_ms: u64,
) -> AgentScheduling {
    if request.cancel {
        return AgentScheduling {
            eligible: !request.keep_ineligible,
            drain: None,
            ..current
        };
    }
    let deadline_ms = if request.force {
        Some(now_ms)
    } else if request.no_deadline {
        None
    } else {
        let after = match request.deadline_ms {
            0 => u64::try_from(DEFAULT_DRAIN_DEADLINE.as_millis()).unwrap_or(u64::MAX),
            ms => ms,
        };
        Some(now_ms.saturating_add(after))
    };
    AgentScheduling {
        eligible: false,
        drain: Some(Drain {
            started_ms: current.drain.as_ref().map_or(now_ms, |d| d.started_ms),
            deadline_ms,
            past_deadline: request.force,
        }),
        ..current
    }
}

/// What a scheduling write's outcome means for the operator who asked.
fn scheduling_written(written: Result<Outcome, WriteError>) -> Result<(), ServiceError> {
    match written {
        Ok(Outcome::Together(results)) => match results.first() {
            Some(Ok(Outcome::Updated)) => Ok(()),
            Some(Err(OpError::UnknownAgent(id))) => Err(ServiceError::UnknownAgent(id.0.clone())),
            other => Err(ServiceError::Aborted(format!(
                "the agent's scheduling was not stored: {other:?}"
            ))),
        },
        Ok(other) => Err(ServiceError::Aborted(format!(
            "unexpected registry outcome: {other:?}"
        ))),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> pb::DrainAgentRequest {
        pb::DrainAgentRequest {
            agent_id: "agent-1".into(),
            ..pb::DrainAgentRequest::default()
        }
    }

    #[test]
    fn a_drain_makes_the_agent_ineligible_with_the_deadline_asked_or_an_hour() {
        let default = drained_by(&request(), AgentScheduling::default(), 1_000);
        assert!(!default.eligible);
        assert_eq!(
            default.drain,
            Some(Drain {
                started_ms: 1_000,
                deadline_ms: Some(1_000 + 3_600_000),
                past_deadline: false,
            })
        );
        let short = drained_by(
            &pb::DrainAgentRequest {
                deadline_ms: 5_000,
                ..request()
            },
            default.clone(),
            2_000,
        );
        let drain = short.drain.expect("draining");
        assert_eq!(drain.deadline_ms, Some(7_000));
        assert_eq!(drain.started_ms, 1_000, "a changed drain keeps its start");
        let open = drained_by(
            &pb::DrainAgentRequest {
                no_deadline: true,
                ..request()
            },
            AgentScheduling::default(),
            2_000,
        );
        assert_eq!(open.drain.and_then(|d| d.deadline_ms), None);
        let forced = drained_by(
            &pb::DrainAgentRequest {
                force: true,
                ..request()
            },
            AgentScheduling::default(),
            2_000,
        );
        assert!(forced.drain.is_some_and(|d| d.past_deadline));
    }

    #[test]
    fn a_cancelled_drain_leaves_the_agent_eligible_unless_asked_not_to() {
        let draining = drained_by(&request(), AgentScheduling::default(), 1_000);
        let cancelled = drained_by(
            &pb::DrainAgentRequest {
                cancel: true,
                ..request()
            },
            draining.clone(),
            2_000,
        );
        assert_eq!(cancelled, AgentScheduling::default());
        let kept = drained_by(
            &pb::DrainAgentRequest {
                cancel: true,
                keep_ineligible: true,
                ..request()
            },
            draining,
            2_000,
        );
        assert!(!kept.eligible && kept.drain.is_none());
    }
}
