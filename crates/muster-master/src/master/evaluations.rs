//! Evaluations: listing them, what scheduler workers report of them (blocked, complete),
//! what the blocked-queue releases or cancels (and the namespaces' news it waits on besides
//! capacity: a quota may allow more), and the leader's periodic convergence check
//! (`evaluations/convergence.rs`), which makes an evaluation for each job whose tasks differ
//! from what it asks.

use muster_actor::{Context, Reply};
use muster_broker::blocked::{BlockedEval, BlockedMsg, QuotaChange};
use muster_model::demand::blocked_description;
use muster_model::{Demand, EvalStatus, Evaluation};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_registry::Op;

use super::{Master, Request, answered_request, notice};
use crate::error::ServiceError;
use crate::visibility::NamespaceFilter;

pub(super) mod convergence;

/// Evaluations a list answers with when the request names no limit.
pub(super) const DEFAULT_EVAL_LIMIT: usize = 50;
/// The most evaluations one list answers with.
pub(super) const MAX_EVAL_LIMIT: usize = 1_000;

/// Evaluations, newest first (`muster eval list`).
#[derive(Debug)]
pub struct ListEvaluations {
    /// A job, an id, a limit, and whether a stale answer will do.
    pub request: pb::ListEvaluationsRequest,
    /// The namespaces to list (the request's, checked against the caller's policies); the
    /// request's job is a name in the request's namespace.
    pub namespaces: NamespaceFilter,
    /// The evaluations and how many matched.
    pub reply: Reply<Result<pb::EvaluationList, ServiceError>>,
}

/// A worker could not place everything the evaluation asks for: it is recorded blocked, its
/// description saying why (the quotas that held tasks back, how many groups found no room),
/// and waits in the blocked-queue for capacity (or its namespace).
#[derive(Debug)]
pub struct BlockEval {
    /// The evaluation.
    pub eval: Evaluation,
    /// What did not fit.
    pub unplaced: Vec<Demand>,
    /// The snapshot index the plan was made against.
    pub snapshot_index: u64,
    /// Done once recorded.
    pub reply: Reply<Result<(), ServiceError>>,
}

/// A worker planned the evaluation fully.
#[derive(Debug)]
pub struct CompleteEval {
    /// The evaluation.
    pub eval: Evaluation,
    /// Done once recorded.
    pub reply: Reply<Result<(), ServiceError>>,
}

/// The blocked-queue released these evaluations (capacity came).
#[derive(Debug)]
pub struct EvalsUnblocked {
    /// The evaluations.
    pub evals: Vec<Evaluation>,
}

/// The blocked-queue canceled these evaluations (a newer one of the same job blocked).
#[derive(Debug)]
pub struct EvalsCanceled {
    /// The evaluations.
    pub evals: Vec<Evaluation>,
}

/// The master's timer: check that every job runs what it asks for.
#[derive(Debug)]
pub struct CheckConvergence;

answered_request!(BlockEval, CompleteEval);
notice!(EvalsUnblocked, EvalsCanceled, CheckConvergence);

impl Request for ListEvaluations {
    fn waits_for_registry(&self) -> bool {
        !self.request.stale
    }
    fn refuse(self, error: ServiceError) {
        self.reply.send(Err(error));
    }
}

impl Master {
    /// [`ListEvaluations`], as a read (see `cluster_state.rs`, `read`).
    pub(super) fn list_evaluations(
        &mut self,
        ListEvaluations {
            request,
            namespaces,
            reply,
        }: ListEvaluations,
        ctx: &mut Context<Self>,
    ) {
        let stale = request.stale;
        let job = match request.job.as_str() {
            "" => String::new(),
            name => muster_model::job_id(&request.namespace, name),
        };
        self.read(stale, ctx, reply, move |master| {
            let (evals, total) = master.evaluations(&job, &request.id, request.limit, &namespaces);
            Ok(pb::EvaluationList {
                evals,
                total,
                read: Some(master.read_info(stale)),
            })
        });
    }

    /// `eval` as a list shows it: a pending one whose scheduler no worker serves says so
    /// (this master's broker knows, while it leads; a standby's lists show what is stored).
    fn with_waiting_reason(&self, mut eval: Evaluation) -> Evaluation {
        if eval.status == EvalStatus::Pending
            && self.leading_term().is_some()
            && let Some(reason) = self.schedulers.unserved_reason(eval.scheduler_name())
        {
            eval.status_description = if eval.status_description.is_empty() {
                reason
            } else {
                format!("{}; {reason}", eval.status_description)
            };
        }
        eval
    }

    /// Up to `limit` evaluations ([`DEFAULT_EVAL_LIMIT`] for 0, at most [`MAX_EVAL_LIMIT`])
    /// of `job` (every job's of `namespaces` if empty), newest first, and how many matched.
    fn evaluations(
        &self,
        job: &str,
        id: &str,
        limit: u32,
        namespaces: &NamespaceFilter,
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
                .filter(|e| namespaces.admits_job(&e.job))
                .filter(|e| id.is_empty() || e.id.0 == id)
                .collect();
            matched.sort_by(|a, b| b.create_index.cmp(&a.create_index).then(a.id.cmp(&b.id)));
            let total = matched.len() as u64;
            let evals = matched
                .into_iter()
                .take(limit)
                .cloned()
                .map(|eval| self.with_waiting_reason(eval).into())
                .collect();
            (evals, total)
        })
    }

    /// A worker could not place everything: the evaluation is recorded blocked and waits in
    /// the blocked-queue for capacity, or for its namespace where its quota held tasks back.
    pub(super) fn block_eval(
        &mut self,
        BlockEval {
            mut eval,
            unplaced,
            snapshot_index,
            reply,
        }: BlockEval,
        ctx: &mut Context<Self>,
    ) {
        eval.status = EvalStatus::Blocked;
        eval.status_description = blocked_description(&unplaced);
        eval.snapshot_index = snapshot_index;
        let demands = unplaced;
        self.write_status(eval.clone(), ctx, move |master, written| {
            if written.is_ok() {
                master.instruments.evaluation_blocked();
                let _ = master
                    .blocked
                    .tell(BlockedMsg::Block(BlockedEval { eval, demands }));
            }
            reply.send(written);
        });
    }

    /// A worker planned the evaluation fully.
    pub(super) fn complete_eval(
        &mut self,
        CompleteEval { mut eval, reply }: CompleteEval,
        ctx: &mut Context<Self>,
    ) {
        eval.status = EvalStatus::Complete;
        self.write_status(eval, ctx, move |master, written| {
            if written.is_ok() {
                master.instruments.evaluation_completed();
            }
            reply.send(written);
        });
    }

    /// Records an evaluation's new status (complete, blocked) in the registry.
    fn write_status(
        &mut self,
        eval: Evaluation,
        ctx: &mut Context<Self>,
        done: impl FnOnce(&mut Master, Result<(), ServiceError>) + Send + 'static,
    ) {
        if self.leading_term().is_none() {
            let why = self.not_leading();
            return done(self, Err(why));
        }
        self.write_with_evals(Vec::new(), vec![eval], ctx, move |master, _ctx, written| {
            done(master, written.map(drop).map_err(ServiceError::from));
        });
    }

    /// The blocked-queue released these: pending again in the registry, then to the broker.
    pub(super) fn evals_unblocked(
        &mut self,
        EvalsUnblocked { evals }: EvalsUnblocked,
        ctx: &mut Context<Self>,
    ) {
        if evals.is_empty() {
            return;
        }
        let evals = evals
            .into_iter()
            .map(|mut e| {
                e.status = EvalStatus::Pending;
                e.status_description = if e.status_description.is_empty() {
                    "unblocked: capacity changed".into()
                } else {
                    format!("unblocked: {}", e.status_description)
                };
                e
            })
            .collect();
        self.write_with_evals(Vec::new(), evals, ctx, |_master, _ctx, written| {
            if let Err(e) = written {
                tracing::warn!(error = %e, "could not record unblocked evaluations");
            }
        });
    }

    /// Tells the blocked-queue that `namespace`'s quota may allow more as of `index`: a task
    /// of it ended (news only if the namespace has a quota setting a limit), or
    /// (`quota_changed`) its quota changed.
    pub(super) fn quota_freed(&self, namespace: &str, quota_changed: bool, index: u64) {
        let limited = || {
            self.registry.reader().read(|state| {
                state
                    .namespaces
                    .get(namespace)
                    .is_some_and(|ns| !ns.quota.is_unlimited())
            })
        };
        if quota_changed || limited() {
            let change = QuotaChange {
                namespace: namespace.to_owned(),
                quota_changed,
                index,
            };
            let _ = self.blocked.tell(BlockedMsg::QuotaFreed(change));
        }
    }

    /// The blocked-queue replaced these with newer ones of the same job.
    pub(super) fn evals_canceled(
        &mut self,
        EvalsCanceled { evals }: EvalsCanceled,
        ctx: &mut Context<Self>,
    ) {
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
}
