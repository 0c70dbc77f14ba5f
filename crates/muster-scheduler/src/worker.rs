//! The worker loop: pull an evaluation, plan it, get the plan applied, settle it.
//!
//! One step ([`Worker::run_once`]):
//! 1. dequeue an evaluation of the configured scheduler types (a long poll);
//! 2. take a snapshot at least as new as the evaluation's modify index;
//! 3. schedule and submit the plan (a plan that changes nothing is not submitted);
//! 4. if the applier rejected placements (another scheduler's plan took the room), take a
//!    snapshot at least as new as the applier's index and schedule again: at most
//!    [`max_attempts`](WorkerConfig::max_attempts) plans in a row that commit nothing, as in
//!    Nomad (a plan that commits anything starts the count over: its job is closer to done, and
//!    blocking it would wait for a capacity change that may never come). Placements still
//!    rejected by the last attempt count as unplaced (held back by their namespace's quota
//!    where the applier says so);
//! 5. if demands remain unplaced, [`block`](Backend::block) the evaluation, otherwise
//!    [`complete`](Backend::complete) it; then ack it.
//!
//! Any backend error after the dequeue nacks the evaluation, so that the broker hands it out
//! again (up to its delivery limit).
//!
//! [`Worker::run`] overlaps step 5 of one evaluation (a registry write) with steps 1 to 4 of
//! the next.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use muster_model::{EvalId, EvalStatus, Evaluation};
use tokio::sync::watch;

use muster_model::Demand;

use crate::plan::{ClusterSnapshot, Placement, Plan, PlanResult};
use crate::scheduler::Scheduler;

/// How many plans in a row that commit nothing a worker submits for one evaluation before it
/// gives up on rejected placements (Nomad's limit).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

/// How many evaluations a running worker may have being recorded while it plans the next
/// ([`WorkerConfig::settling`]).
pub const DEFAULT_SETTLING: usize = 8;

/// An evaluation handed to this worker, with the token that proves it holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct Assignment {
    /// The evaluation.
    pub eval: Evaluation,
    /// Its delivery token, for ack and nack.
    pub token: String,
    /// The master's state index when it handed the evaluation out, if the backend knows it
    /// (0 otherwise): a snapshot at this index or later holds everything the evaluation was
    /// made from. An evaluation's own `modify_index` counts registry writes only, while a
    /// master's state index also counts changes to agents and tasks, so a copy of the cluster
    /// kept apart from the master waits for this one.
    pub state_index: u64,
}

impl Assignment {
    /// The index a snapshot must reach to plan this evaluation: its own write, and everything
    /// the master held when it handed it out ([`state_index`](Self::state_index)).
    pub fn min_index(&self) -> u64 {
        self.eval.modify_index.max(self.state_index)
    }
}

/// Why a worker step failed. Backends report their failures with these variants.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WorkerError {
    /// The backend cannot be reached, or has no leader to talk to.
    #[error("the scheduling backend is unavailable: {0}")]
    Unavailable(String),
    /// Dequeuing failed.
    #[error("dequeue failed: {0}")]
    Dequeue(String),
    /// No snapshot could be had.
    #[error("no cluster snapshot at index {min_index} or later: {reason}")]
    Snapshot {
        /// The index asked for.
        min_index: u64,
        /// Why.
        reason: String,
    },
    /// The backend answered with a snapshot older than the index asked for.
    #[error("the cluster snapshot is at index {got}, older than the required {min_index}")]
    StaleSnapshot {
        /// The index asked for.
        min_index: u64,
        /// The snapshot's index.
        got: u64,
    },
    /// The plan applier did not take the plan.
    #[error("the plan for evaluation {eval} was not applied: {reason}")]
    Submit {
        /// The evaluation.
        eval: EvalId,
        /// Why.
        reason: String,
    },
    /// The ack was refused or lost.
    #[error("ack of evaluation {eval} failed: {reason}")]
    Ack {
        /// The evaluation.
        eval: EvalId,
        /// Why.
        reason: String,
    },
    /// The nack was refused or lost.
    #[error("nack of evaluation {eval} failed: {reason}")]
    Nack {
        /// The evaluation.
        eval: EvalId,
        /// Why.
        reason: String,
    },
    /// Recording the evaluation as blocked failed.
    #[error("blocking evaluation {eval} failed: {reason}")]
    Block {
        /// The evaluation.
        eval: EvalId,
        /// Why.
        reason: String,
    },
    /// Recording the evaluation as complete failed.
    #[error("completing evaluation {eval} failed: {reason}")]
    Complete {
        /// The evaluation.
        eval: EvalId,
        /// Why.
        reason: String,
    },
}

/// What a worker talks to: the broker, the state it snapshots, the plan applier and the
/// registry, usually all behind the leading master.
///
/// The futures must be `Send` so that a [`Worker`] can run on any tokio thread.
pub trait Backend: Send + Sync {
    /// Waits up to `timeout` for an evaluation for one of the schedulers named `schedulers`
    /// (built-in ones, `service`, `batch`, `system`, or names jobs give); `None` when none
    /// came.
    fn dequeue(
        &self,
        schedulers: &[String],
        timeout: Duration,
    ) -> impl Future<Output = Result<Option<Assignment>, WorkerError>> + Send;

    /// A snapshot of the cluster at state index `min_index` or later.
    fn snapshot(
        &self,
        min_index: u64,
    ) -> impl Future<Output = Result<ClusterSnapshot, WorkerError>> + Send;

    /// Has the plan applied; placements that no longer fit come back rejected.
    fn submit(&self, plan: Plan) -> impl Future<Output = Result<PlanResult, WorkerError>> + Send;

    /// The evaluation is settled: the broker forgets it.
    fn ack(
        &self,
        eval: &EvalId,
        token: &str,
    ) -> impl Future<Output = Result<(), WorkerError>> + Send;

    /// The evaluation was not settled: the broker hands it out again.
    fn nack(
        &self,
        eval: &EvalId,
        token: &str,
    ) -> impl Future<Output = Result<(), WorkerError>> + Send;

    /// Some of the evaluation's tasks found no room (or were held back by their namespace's
    /// quota, [`Demand::over_quota`]): record it blocked and put it in the blocked-queue with
    /// what was left unplaced. Its `snapshot_index` is the index of the last
    /// snapshot it was planned against; `token` is its delivery's.
    fn block(
        &self,
        eval: Evaluation,
        token: &str,
        unplaced: Vec<Demand>,
    ) -> impl Future<Output = Result<(), WorkerError>> + Send;

    /// Everything the evaluation called for is placed: record it complete (`token` is its
    /// delivery's).
    fn complete(
        &self,
        eval: &Evaluation,
        token: &str,
    ) -> impl Future<Output = Result<(), WorkerError>> + Send;
}

impl<B: Backend> Backend for Arc<B> {
    fn dequeue(
        &self,
        schedulers: &[String],
        timeout: Duration,
    ) -> impl Future<Output = Result<Option<Assignment>, WorkerError>> + Send {
        (**self).dequeue(schedulers, timeout)
    }

    fn snapshot(
        &self,
        min_index: u64,
    ) -> impl Future<Output = Result<ClusterSnapshot, WorkerError>> + Send {
        (**self).snapshot(min_index)
    }

    fn submit(&self, plan: Plan) -> impl Future<Output = Result<PlanResult, WorkerError>> + Send {
        (**self).submit(plan)
    }

    fn ack(
        &self,
        eval: &EvalId,
        token: &str,
    ) -> impl Future<Output = Result<(), WorkerError>> + Send {
        (**self).ack(eval, token)
    }

    fn nack(
        &self,
        eval: &EvalId,
        token: &str,
    ) -> impl Future<Output = Result<(), WorkerError>> + Send {
        (**self).nack(eval, token)
    }

    fn block(
        &self,
        eval: Evaluation,
        token: &str,
        unplaced: Vec<Demand>,
    ) -> impl Future<Output = Result<(), WorkerError>> + Send {
        (**self).block(eval, token, unplaced)
    }

    fn complete(
        &self,
        eval: &Evaluation,
        token: &str,
    ) -> impl Future<Output = Result<(), WorkerError>> + Send {
        (**self).complete(eval, token)
    }
}

/// How a [`Worker`] behaves.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerConfig {
    /// The names of the schedulers it serves: it is handed only their evaluations. The
    /// built-in ones by default (`service`, `batch`, `system`, see
    /// [`BUILT_IN_SCHEDULERS`](muster_model::BUILT_IN_SCHEDULERS)); a custom scheduler names
    /// its own ([`serving`](Self::serving)), which jobs name with `scheduler = "…"`.
    pub schedulers: Vec<String>,
    /// How long one dequeue long-polls.
    pub dequeue_timeout: Duration,
    /// Plans in a row that commit nothing, per evaluation, at most (0 counts as 1); a plan
    /// that commits part of itself starts the count over (Nomad's retry with progress).
    pub max_attempts: u32,
    /// How long [`Worker::run`] waits after a failed dequeue before the next.
    pub error_backoff: Duration,
    /// How many planned evaluations [`Worker::run`] may have being recorded and acked while
    /// it plans the next (0 counts as 1). Records in flight together share a registry write.
    pub settling: usize,
}

impl WorkerConfig {
    /// The default settings, serving the schedulers named `names` only.
    pub fn serving<I: IntoIterator<Item = S>, S: Into<String>>(names: I) -> Self {
        WorkerConfig {
            schedulers: names.into_iter().map(Into::into).collect(),
            ..WorkerConfig::default()
        }
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            schedulers: muster_model::BUILT_IN_SCHEDULERS
                .iter()
                .map(|name| (*name).to_owned())
                .collect(),
            dequeue_timeout: Duration::from_secs(1),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            error_backoff: Duration::from_millis(500),
            settling: DEFAULT_SETTLING,
        }
    }
}

/// What a worker has done.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Evaluations dequeued.
    pub dequeued: u64,
    /// Dequeues that failed.
    pub dequeue_errors: u64,
    /// Plans submitted.
    pub plans_submitted: u64,
    /// Placements the applier committed.
    pub placements_committed: u64,
    /// Placements the applier rejected.
    pub placements_rejected: u64,
    /// Stops the applier committed.
    pub stops_committed: u64,
    /// Evaluations completed and acked.
    pub evals_completed: u64,
    /// Evaluations blocked and acked.
    pub evals_blocked: u64,
    /// Evaluations nacked after a backend error.
    pub evals_nacked: u64,
    /// Nacks that failed too (the broker's nack timeout hands those evaluations out again).
    pub nack_failures: u64,
}

/// How one evaluation ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Everything is placed; the evaluation is complete and acked.
    Completed {
        /// The evaluation.
        eval: EvalId,
        /// Plans scheduled (submitted or found to change nothing).
        attempts: u32,
        /// Placements committed over all attempts.
        placed: usize,
        /// Stops committed over all attempts.
        stopped: usize,
    },
    /// Some tasks found no room; the evaluation is blocked and acked.
    Blocked {
        /// The evaluation.
        eval: EvalId,
        /// Plans scheduled.
        attempts: u32,
        /// Placements committed over all attempts.
        placed: usize,
        /// Stops committed over all attempts.
        stopped: usize,
        /// What did not fit.
        unplaced: Vec<Demand>,
    },
    /// A backend error interrupted the evaluation; it was nacked.
    Nacked {
        /// The evaluation.
        eval: EvalId,
        /// The error.
        error: WorkerError,
    },
}

impl Outcome {
    /// The evaluation it is about.
    pub fn eval(&self) -> &EvalId {
        match self {
            Outcome::Completed { eval, .. }
            | Outcome::Blocked { eval, .. }
            | Outcome::Nacked { eval, .. } => eval,
        }
    }
}

/// A scheduler worker: pulls evaluations from its [`Backend`] and plans them with its
/// [`Scheduler`]. Run as many as there are cores to spare; they only meet at the applier.
#[derive(Debug)]
pub struct Worker<B, S> {
    backend: B,
    scheduler: S,
    config: WorkerConfig,
    stats: WorkerStats,
}

impl<B: Backend, S: Scheduler> Worker<B, S> {
    /// A worker planning with `scheduler` against `backend`.
    pub fn new(backend: B, scheduler: S, config: WorkerConfig) -> Self {
        Worker {
            backend,
            scheduler,
            config,
            stats: WorkerStats::default(),
        }
    }

    /// What it has done so far.
    pub fn stats(&self) -> &WorkerStats {
        &self.stats
    }

    /// Its backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Its scheduler.
    pub fn scheduler(&self) -> &S {
        &self.scheduler
    }

    /// Its configuration.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// Runs until `stop` turns true (or its sender is dropped), then returns the stats.
    ///
    /// Pipelined: while evaluations already planned are recorded and acked (registry writes,
    /// mostly disk), the worker dequeues and plans the next; with
    /// [`settling`](WorkerConfig::settling) of them in flight it waits for the oldest before
    /// it settles another. The broker hands out one evaluation per job at a time, so those in
    /// flight are always of different jobs.
    ///
    /// The stop interrupts a dequeue's long poll or the backoff after a failed dequeue, never
    /// an evaluation in progress: that one is settled (acked or nacked) first.
    pub async fn run(self, mut stop: watch::Receiver<bool>) -> WorkerStats
    where
        B: 'static,
    {
        let mut worker = Worker {
            backend: Arc::new(self.backend),
            scheduler: self.scheduler,
            config: self.config,
            stats: self.stats,
        };
        tracing::debug!(scheduler = worker.scheduler.name(), "worker started");
        let depth = worker.config.settling.max(1);
        let mut settling: VecDeque<tokio::task::JoinHandle<Settled>> = VecDeque::new();
        loop {
            if *stop.borrow_and_update() {
                break;
            }
            let dequeued = tokio::select! {
                biased;
                changed = stop.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    continue;
                }
                dequeued = worker.dequeue() => dequeued,
            };
            match dequeued {
                Ok(Some(assignment)) => {
                    let planned = worker.plan(&assignment).await;
                    while settling.len() >= depth {
                        if let Some(oldest) = settling.pop_front() {
                            worker.count_settled(oldest.await);
                        }
                    }
                    let backend = Arc::clone(&worker.backend);
                    settling.push_back(tokio::spawn(async move {
                        match planned {
                            Ok(planned) => settle(&*backend, assignment, planned).await,
                            Err(error) => nack(&*backend, assignment, error).await,
                        }
                    }));
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(%error, "dequeue failed");
                    tokio::select! {
                        biased;
                        changed = stop.changed() => {
                            if changed.is_err() {
                                break;
                            }
                        }
                        () = tokio::time::sleep(worker.config.error_backoff) => {}
                    }
                }
            }
        }
        for in_flight in settling {
            worker.count_settled(in_flight.await);
        }
        tracing::debug!(scheduler = worker.scheduler.name(), stats = ?worker.stats, "worker stopped");
        worker.stats
    }

    /// One step: dequeue one evaluation (waiting up to the dequeue timeout) and settle it.
    ///
    /// `Ok(None)`: nothing to do. `Ok(Some(Outcome::Nacked { .. }))`: a backend error
    /// interrupted the evaluation and it was nacked. `Err`: the dequeue failed, or a backend
    /// error interrupted the evaluation and the nack failed too (the error returned is the
    /// first one).
    pub async fn run_once(&mut self) -> Result<Option<Outcome>, WorkerError> {
        let Some(assignment) = self.dequeue().await? else {
            return Ok(None);
        };
        let settled = match self.plan(&assignment).await {
            Ok(planned) => settle(&self.backend, assignment, planned).await,
            Err(error) => nack(&self.backend, assignment, error).await,
        };
        self.count_settled(Ok(settled.clone()));
        match settled {
            Settled::Outcome(outcome) => Ok(Some(outcome)),
            Settled::Unsettled(error) => Err(error),
        }
    }

    async fn dequeue(&mut self) -> Result<Option<Assignment>, WorkerError> {
        let dequeued = self
            .backend
            .dequeue(&self.config.schedulers, self.config.dequeue_timeout)
            .await;
        match &dequeued {
            Ok(Some(_)) => self.stats.dequeued += 1,
            Ok(None) => {}
            Err(_) => self.stats.dequeue_errors += 1,
        }
        dequeued
    }

    /// Counts how an evaluation was settled (a settling task that panicked counts as a
    /// failed nack: the broker's nack timeout hands the evaluation out again).
    fn count_settled(&mut self, settled: Result<Settled, tokio::task::JoinError>) {
        match settled {
            Ok(Settled::Outcome(Outcome::Completed { .. })) => self.stats.evals_completed += 1,
            Ok(Settled::Outcome(Outcome::Blocked { .. })) => self.stats.evals_blocked += 1,
            Ok(Settled::Outcome(Outcome::Nacked { .. })) => self.stats.evals_nacked += 1,
            Ok(Settled::Unsettled(error)) => {
                self.stats.nack_failures += 1;
                tracing::warn!(%error, "evaluation left unsettled");
            }
            Err(error) => {
                self.stats.nack_failures += 1;
                tracing::error!(%error, "settling an evaluation panicked");
            }
        }
    }

    /// Steps 2 to 4: plans the evaluation until its plan is applied whole, nothing is left to
    /// change, or the attempts run out; returns how to record it.
    async fn plan(&mut self, assignment: &Assignment) -> Result<Planned, WorkerError> {
        let mut eval = assignment.eval.clone();
        let max_attempts = self.config.max_attempts.max(1);
        let mut min_index = assignment.min_index();
        let (mut attempts, mut placed, mut stopped) = (0u32, 0usize, 0usize);
        let mut fruitless = 0u32;
        let (snapshot_index, unplaced) = loop {
            attempts += 1;
            let snapshot = self.snapshot(min_index).await?;
            let mut plan = self.scheduler.schedule(&eval, &snapshot);
            plan.eval_token.clone_from(&assignment.token);
            let mut unplaced = plan.unplaced.clone();
            if plan.is_noop() {
                break (snapshot.index, unplaced);
            }
            let result = self.backend.submit(plan).await?;
            self.stats.plans_submitted += 1;
            self.stats.placements_committed += result.committed.len() as u64;
            self.stats.placements_rejected += result.rejected.len() as u64;
            self.stats.stops_committed += result.stopped.len() as u64;
            placed += result.committed.len();
            stopped += result.stopped.len();
            if result.rejected.is_empty() {
                break (snapshot.index, unplaced);
            }
            tracing::debug!(
                eval = %eval.id,
                attempt = attempts,
                rejected = result.rejected.len(),
                "placements rejected"
            );
            if result.committed.is_empty() && result.stopped.is_empty() {
                fruitless += 1;
            } else {
                fruitless = 0;
            }
            if fruitless >= max_attempts {
                for placement in &result.rejected {
                    let mut demand = demand_of(placement, &snapshot);
                    demand.over_quota = result.over_quota.get(&placement.task_id).cloned();
                    if !unplaced.contains(&demand) {
                        unplaced.push(demand);
                    }
                }
                break (snapshot.index, unplaced);
            }
            min_index = min_index.max(result.index);
        };

        eval.snapshot_index = snapshot_index;
        let id = eval.id.clone();
        Ok(if unplaced.is_empty() {
            eval.status = EvalStatus::Complete;
            eval.status_description.clear();
            Planned {
                eval,
                unplaced,
                outcome: Outcome::Completed {
                    eval: id,
                    attempts,
                    placed,
                    stopped,
                },
            }
        } else {
            eval.status = EvalStatus::Blocked;
            eval.status_description = muster_model::demand::blocked_description(&unplaced);
            Planned {
                eval,
                unplaced: unplaced.clone(),
                outcome: Outcome::Blocked {
                    eval: id,
                    attempts,
                    placed,
                    stopped,
                    unplaced,
                },
            }
        })
    }

    async fn snapshot(&self, min_index: u64) -> Result<ClusterSnapshot, WorkerError> {
        let snapshot = self.backend.snapshot(min_index).await?;
        if snapshot.index < min_index {
            return Err(WorkerError::StaleSnapshot {
                min_index,
                got: snapshot.index,
            });
        }
        Ok(snapshot)
    }
}

/// An evaluation planned to the end, to be recorded (complete or blocked) and acked.
#[derive(Debug)]
struct Planned {
    /// The evaluation with its new status.
    eval: Evaluation,
    /// What did not fit (empty when complete).
    unplaced: Vec<Demand>,
    /// What the worker reports once it is recorded and acked.
    outcome: Outcome,
}

/// How settling one evaluation ended.
#[derive(Clone, Debug)]
enum Settled {
    /// Recorded and acked, or nacked after an error.
    Outcome(Outcome),
    /// An error, and the nack failed too (the first error).
    Unsettled(WorkerError),
}

/// Step 5: records the planned evaluation complete or blocked, then acks it; nacks it if
/// either fails.
async fn settle<B: Backend>(backend: &B, assignment: Assignment, planned: Planned) -> Settled {
    let recorded = if planned.unplaced.is_empty() {
        backend.complete(&planned.eval, &assignment.token).await
    } else {
        backend
            .block(planned.eval, &assignment.token, planned.unplaced)
            .await
    };
    let acked = match recorded {
        Ok(()) => backend.ack(&assignment.eval.id, &assignment.token).await,
        Err(error) => Err(error),
    };
    match acked {
        Ok(()) => Settled::Outcome(planned.outcome),
        Err(error) => nack(backend, assignment, error).await,
    }
}

/// Hands the evaluation back to the broker after `error`.
async fn nack<B: Backend>(backend: &B, assignment: Assignment, error: WorkerError) -> Settled {
    let eval = assignment.eval.id;
    tracing::warn!(%eval, %error, "nacking evaluation");
    match backend.nack(&eval, &assignment.token).await {
        Ok(()) => Settled::Outcome(Outcome::Nacked { eval, error }),
        Err(nack_error) => {
            tracing::warn!(%eval, error = %nack_error, "nack failed");
            Settled::Unsettled(error)
        }
    }
}

/// The demand of a rejected placement: its resources and its group's constraints as the
/// snapshot has them.
fn demand_of(placement: &Placement, snapshot: &ClusterSnapshot) -> Demand {
    let constraints = snapshot
        .jobs
        .get(&placement.job)
        .and_then(|job| job.groups.iter().find(|g| g.name == placement.group))
        .map(|group| group.constraints.clone())
        .unwrap_or_default();
    Demand {
        gang_fitting: 0,
        gang: 0,
        resources: placement.resources.clone(),
        constraints,
        over_quota: None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use muster_model::AgentId;
    use muster_model::{Constraint, ConstraintOp, Job, SchedulerType, TaskGroup};

    use super::*;

    #[test]
    fn a_rejected_placement_demands_its_groups_constraints() {
        let rack = Constraint {
            attribute: "rack".into(),
            op: ConstraintOp::Equal,
            value: "r1".into(),
        };
        let job = Job {
            name: "web".into(),
            priority: 50,
            scheduler: SchedulerType::Service,
            named_scheduler: None,
            groups: vec![TaskGroup {
                name: "fe".into(),
                constraints: vec![rack.clone()],
                ..TaskGroup::default()
            }],
            stopped: false,
            version: 1,
        };
        let snapshot = ClusterSnapshot {
            preemption: Default::default(),
            deployments: Default::default(),
            index: 1,
            agents: Vec::new(),
            jobs: BTreeMap::from([("web".to_owned(), job)]),
            held: Default::default(),
            job_index: None,
            quotas: BTreeMap::new(),
        };
        let placement = |group: &str| Placement {
            agent: AgentId("a1".into()),
            task_id: "t".into(),
            name: "n".into(),
            job: "web".into(),
            group: group.into(),
            resources: muster_model::Resources {
                cpus: 1.0,
                mem_mb: 2,
            },
            job_version: 1,
            ports: Vec::new(),
        };
        assert_eq!(demand_of(&placement("fe"), &snapshot).constraints, [rack]);
        // A group the snapshot no longer has: no constraints to report.
        let gone = demand_of(&placement("cache"), &snapshot);
        assert!(gone.constraints.is_empty());
        assert_eq!(gone.resources.mem_mb, 2);
    }
}
