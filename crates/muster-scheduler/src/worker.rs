//! The worker loop: pull an evaluation, plan it, get the plan applied, settle it.
//!
//! One step ([`Worker::run_once`]):
//! 1. dequeue an evaluation of the configured scheduler types (a long poll);
//! 2. take a snapshot at least as new as the evaluation's modify index;
//! 3. schedule and submit the plan (a plan that changes nothing is not submitted);
//! 4. if the applier rejected placements (another scheduler's plan took the room), take a
//!    snapshot at least as new as the applier's index and schedule again: at most
//!    [`max_attempts`](WorkerConfig::max_attempts) plans in all, as in Nomad. Placements still
//!    rejected by the last attempt count as unplaced;
//! 5. if demands remain unplaced, [`block`](Backend::block) the evaluation, otherwise
//!    [`complete`](Backend::complete) it; then ack it.
//!
//! Any backend error after the dequeue nacks the evaluation, so that the broker hands it out
//! again (up to its delivery limit).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use muster_model::{EvalId, EvalStatus, Evaluation, SchedulerType};
use tokio::sync::watch;

use muster_model::Demand;

use crate::plan::{ClusterSnapshot, Placement, Plan, PlanResult};
use crate::scheduler::Scheduler;

/// How many plans a worker submits for one evaluation before it gives up on rejected
/// placements (Nomad's limit).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

/// An evaluation handed to this worker, with the token that proves it holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct Assignment {
    /// The evaluation.
    pub eval: Evaluation,
    /// Its delivery token, for ack and nack.
    pub token: String,
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
    /// Waits up to `timeout` for an evaluation of one of `schedulers`; `None` when none came.
    fn dequeue(
        &self,
        schedulers: &[SchedulerType],
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

    /// Some of the evaluation's tasks found no room: record it blocked and put it in the
    /// blocked-queue with what did not fit. Its `snapshot_index` is the index of the last
    /// snapshot it was planned against.
    fn block(
        &self,
        eval: Evaluation,
        unplaced: Vec<Demand>,
    ) -> impl Future<Output = Result<(), WorkerError>> + Send;

    /// Everything the evaluation called for is placed: record it complete.
    fn complete(&self, eval: &Evaluation) -> impl Future<Output = Result<(), WorkerError>> + Send;
}

impl<B: Backend> Backend for Arc<B> {
    fn dequeue(
        &self,
        schedulers: &[SchedulerType],
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
        unplaced: Vec<Demand>,
    ) -> impl Future<Output = Result<(), WorkerError>> + Send {
        (**self).block(eval, unplaced)
    }

    fn complete(&self, eval: &Evaluation) -> impl Future<Output = Result<(), WorkerError>> + Send {
        (**self).complete(eval)
    }
}

/// How a [`Worker`] behaves.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerConfig {
    /// The scheduler types it takes evaluations of.
    pub schedulers: Vec<SchedulerType>,
    /// How long one dequeue long-polls.
    pub dequeue_timeout: Duration,
    /// Plans submitted per evaluation at most (0 counts as 1).
    pub max_attempts: u32,
    /// How long [`Worker::run`] waits after a failed dequeue before the next.
    pub error_backoff: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            schedulers: SchedulerType::ALL.to_vec(),
            dequeue_timeout: Duration::from_secs(1),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            error_backoff: Duration::from_millis(500),
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
    /// The stop interrupts a dequeue's long poll or the backoff after a failed dequeue, never
    /// an evaluation in progress: that one is settled (acked or nacked) first.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) -> WorkerStats {
        tracing::debug!(scheduler = self.scheduler.name(), "worker started");
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
                dequeued = self.dequeue() => dequeued,
            };
            match dequeued {
                Ok(Some(assignment)) => {
                    if let Err(error) = self.handle(assignment).await {
                        tracing::warn!(%error, "evaluation left unsettled");
                    }
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
                        () = tokio::time::sleep(self.config.error_backoff) => {}
                    }
                }
            }
        }
        tracing::debug!(scheduler = self.scheduler.name(), stats = ?self.stats, "worker stopped");
        self.stats
    }

    /// One step: dequeue one evaluation (waiting up to the dequeue timeout) and settle it.
    ///
    /// `Ok(None)`: nothing to do. `Ok(Some(Outcome::Nacked { .. }))`: a backend error
    /// interrupted the evaluation and it was nacked. `Err`: the dequeue failed, or a backend
    /// error interrupted the evaluation and the nack failed too (the error returned is the
    /// first one).
    pub async fn run_once(&mut self) -> Result<Option<Outcome>, WorkerError> {
        match self.dequeue().await? {
            Some(assignment) => self.handle(assignment).await.map(Some),
            None => Ok(None),
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

    /// Settles one evaluation, nacking it on error.
    async fn handle(&mut self, assignment: Assignment) -> Result<Outcome, WorkerError> {
        let error = match self.process(&assignment).await {
            Ok(outcome) => return Ok(outcome),
            Err(error) => error,
        };
        let eval = assignment.eval.id;
        tracing::warn!(%eval, %error, "nacking evaluation");
        match self.backend.nack(&eval, &assignment.token).await {
            Ok(()) => {
                self.stats.evals_nacked += 1;
                Ok(Outcome::Nacked { eval, error })
            }
            Err(nack_error) => {
                self.stats.nack_failures += 1;
                tracing::warn!(%eval, error = %nack_error, "nack failed");
                Err(error)
            }
        }
    }

    async fn process(&mut self, assignment: &Assignment) -> Result<Outcome, WorkerError> {
        let mut eval = assignment.eval.clone();
        let max_attempts = self.config.max_attempts.max(1);
        let mut min_index = eval.modify_index;
        let (mut attempts, mut placed, mut stopped) = (0u32, 0usize, 0usize);
        let (snapshot_index, unplaced) = loop {
            attempts += 1;
            let snapshot = self.snapshot(min_index).await?;
            let plan = self.scheduler.schedule(&eval, &snapshot);
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
            if attempts >= max_attempts {
                for placement in &result.rejected {
                    let demand = demand_of(placement, &snapshot);
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
        let outcome = if unplaced.is_empty() {
            eval.status = EvalStatus::Complete;
            eval.status_description.clear();
            self.backend.complete(&eval).await?;
            Outcome::Completed {
                eval: id,
                attempts,
                placed,
                stopped,
            }
        } else {
            eval.status = EvalStatus::Blocked;
            eval.status_description = format!(
                "{} task group(s) could not place all their tasks",
                unplaced.len()
            );
            self.backend.block(eval, unplaced.clone()).await?;
            Outcome::Blocked {
                eval: id,
                attempts,
                placed,
                stopped,
                unplaced,
            }
        };
        self.backend
            .ack(&assignment.eval.id, &assignment.token)
            .await?;
        match outcome {
            Outcome::Completed { .. } => self.stats.evals_completed += 1,
            Outcome::Blocked { .. } => self.stats.evals_blocked += 1,
            Outcome::Nacked { .. } => {}
        }
        Ok(outcome)
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
        resources: placement.resources.clone(),
        constraints,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use muster_model::AgentId;
    use muster_model::{Constraint, ConstraintOp, Job, TaskGroup};

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
            groups: vec![TaskGroup {
                name: "fe".into(),
                constraints: vec![rack.clone()],
                ..TaskGroup::default()
            }],
            stopped: false,
            version: 1,
        };
        let snapshot = ClusterSnapshot {
            index: 1,
            agents: Vec::new(),
            jobs: BTreeMap::from([("web".to_owned(), job)]),
            held: Default::default(),
            job_index: None,
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
            command: String::new(),
            args: Vec::new(),
            env: BTreeMap::new(),
            job_version: 1,
            user: String::new(),
        };
        assert_eq!(demand_of(&placement("fe"), &snapshot).constraints, [rack]);
        // A group the snapshot no longer has: no constraints to report.
        let gone = demand_of(&placement("cache"), &snapshot);
        assert!(gone.constraints.is_empty());
        assert_eq!(gone.resources.mem_mb, 2);
    }
}
