//! Scheduler workers inside the master process: a [`Backend`] that talks to the master and
//! its broker by moving messages, and the workers the master server runs. Each worker times
//! the evaluations it runs in the master's instruments (`muster_scheduler_run_seconds`).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use muster_actor::{AskError, Pid};
use muster_broker::{BrokerError, BrokerMsg, EvalBroker};
use muster_model::{EvalId, Evaluation};
use muster_scheduler::{
    Assignment, Backend, ClusterSnapshot, Demand, Plan, PlanResult, Scheduler, Worker,
    WorkerConfig, WorkerError, WorkerStats,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::master::Master;
use crate::master::requests::{
    BlockEval, CompleteEval, GetSchedulingPids, GetSnapshot, SubmitPlan,
};
use crate::metrics::instruments::{MasterInstruments, RunOutcome};

/// A worker's way to the leading master when it runs in the same process.
#[derive(Clone, Debug)]
pub struct LocalBackend {
    master: Pid<Master>,
    broker: Pid<EvalBroker>,
    /// For this process's own workers: a disabled broker (this master does not lead, or not
    /// yet) is a wait, not an error. Remote workers get the error through the scheduling
    /// service, which sends them on to the leader.
    wait_while_disabled: bool,
}

/// How long [`Workers::stop`] waits for the workers to finish what they hold.
pub(crate) const WORKER_STOP_GRACE: Duration = Duration::from_secs(5);

/// How often this process's workers look again at a disabled broker.
const DISABLED_RECHECK: Duration = Duration::from_millis(100);

impl LocalBackend {
    /// Talks to `master` and its `broker`.
    pub fn new(master: Pid<Master>, broker: Pid<EvalBroker>) -> Self {
        LocalBackend {
            master,
            broker,
            wait_while_disabled: false,
        }
    }

    /// The master process it talks to.
    pub fn master(&self) -> &Pid<Master> {
        &self.master
    }

    /// The eval broker it talks to.
    pub fn broker(&self) -> &Pid<EvalBroker> {
        &self.broker
    }
}

fn gone(e: AskError) -> WorkerError {
    WorkerError::Unavailable(e.to_string())
}

impl Backend for LocalBackend {
    async fn dequeue(
        &self,
        schedulers: &[String],
        timeout: Duration,
    ) -> Result<Option<Assignment>, WorkerError> {
        let schedulers = schedulers.to_vec();
        let answer = self
            .broker
            .ask(|reply| BrokerMsg::Dequeue {
                schedulers,
                timeout,
                reply,
            })
            .await
            .map_err(gone)?;
        if self.wait_while_disabled && matches!(answer, Err(BrokerError::Disabled)) {
            tracing::trace!("the broker is disabled (this master does not lead): waiting");
            tokio::time::sleep(timeout.min(DISABLED_RECHECK)).await;
            return Ok(None);
        }
        let delivery = answer.map_err(|e| WorkerError::Dequeue(e.to_string()))?;
        Ok(delivery.map(|d| Assignment {
            eval: d.eval,
            token: d.token,
            // A snapshot asked of the master after this is at least as new.
            state_index: 0,
        }))
    }

    async fn snapshot(&self, min_index: u64) -> Result<ClusterSnapshot, WorkerError> {
        let snapshot = self
            .master
            .ask(|reply| GetSnapshot { reply }.into())
            .await
            .map_err(gone)?;
        if snapshot.index < min_index {
            return Err(WorkerError::StaleSnapshot {
                min_index,
                got: snapshot.index,
            });
        }
        Ok(snapshot)
    }

    async fn submit(&self, plan: Plan) -> Result<PlanResult, WorkerError> {
        let eval = plan.eval.clone();
        self.master
            .ask(|reply| SubmitPlan { plan, reply }.into())
            .await
            .map_err(gone)?
            .map_err(|e| WorkerError::Submit {
                eval,
                reason: e.to_string(),
            })
    }

    async fn ack(&self, eval: &EvalId, token: &str) -> Result<(), WorkerError> {
        let (id, token) = (eval.clone(), token.to_owned());
        self.broker
            .ask(|reply| BrokerMsg::Ack {
                eval: id,
                token,
                reply,
            })
            .await
            .map_err(gone)?
            .map_err(|e| WorkerError::Ack {
                eval: eval.clone(),
                reason: e.to_string(),
            })
    }

    async fn nack(&self, eval: &EvalId, token: &str) -> Result<(), WorkerError> {
        let (id, token) = (eval.clone(), token.to_owned());
        self.broker
            .ask(|reply| BrokerMsg::Nack {
                eval: id,
                token,
                reply,
            })
            .await
            .map_err(gone)?
            .map_err(|e| WorkerError::Nack {
                eval: eval.clone(),
                reason: e.to_string(),
            })
    }

    /// In this process the token is not checked: the caller is the master's own worker (the
    /// scheduling API checks it for workers elsewhere).
    async fn block(
        &self,
        eval: Evaluation,
        _token: &str,
        unplaced: Vec<Demand>,
    ) -> Result<(), WorkerError> {
        let id = eval.id.clone();
        let snapshot_index = eval.snapshot_index;
        self.master
            .ask(|reply| {
                BlockEval {
                    eval,
                    unplaced,
                    snapshot_index,
                    reply,
                }
                .into()
            })
            .await
            .map_err(gone)?
            .map_err(|e| WorkerError::Block {
                eval: id,
                reason: e.to_string(),
            })
    }

    /// As [`block`](LocalBackend::block), the token is not checked here.
    async fn complete(&self, eval: &Evaluation, _token: &str) -> Result<(), WorkerError> {
        let id = eval.id.clone();
        let eval = eval.clone();
        self.master
            .ask(|reply| CompleteEval { eval, reply }.into())
            .await
            .map_err(gone)?
            .map_err(|e| WorkerError::Complete {
                eval: id,
                reason: e.to_string(),
            })
    }
}

/// Scheduler workers running in this process until told to stop.
#[derive(Debug)]
pub struct Workers {
    stop: watch::Sender<bool>,
    running: Vec<JoinHandle<WorkerStats>>,
}

impl Workers {
    /// Starts `count` workers against `backend`, each with the scheduler `make` builds. While
    /// this master does not lead (its broker is disabled) they wait, quietly.
    pub fn start<S: Scheduler + Sync + 'static>(
        count: usize,
        backend: LocalBackend,
        config: WorkerConfig,
        mut make: impl FnMut() -> S,
    ) -> Self {
        let backend = LocalBackend {
            wait_while_disabled: true,
            ..backend
        };
        let (stop, stopped) = watch::channel(false);
        let running = (0..count)
            .map(|_| {
                let (backend, scheduler) = (backend.clone(), make());
                let (config, stopped) = (config.clone(), stopped.clone());
                tokio::spawn(async move {
                    // The master's instruments, to time the runs in. A master that has ended
                    // answers nothing: the worker then runs untimed (and finds no work).
                    let instruments = backend
                        .master
                        .ask(|reply| GetSchedulingPids { reply }.into())
                        .await
                        .ok()
                        .map(|pids| pids.instruments);
                    let backend = TimedBackend {
                        inner: backend,
                        instruments,
                        run: Mutex::new(None),
                    };
                    Worker::new(backend, scheduler, config).run(stopped).await
                })
            })
            .collect();
        Workers { stop, running }
    }

    /// Stops the workers after their current evaluation and returns what each did. A worker
    /// still busy after `WORKER_STOP_GRACE` (5 s) is abandoned (its task aborted, with a warning):
    /// a registry write that cannot commit, on a master left without a quorum, would
    /// otherwise hold the shutdown for good. Its evaluation stays unacked, and the broker of
    /// whichever master leads next hands it out again.
    pub async fn stop(self) -> Vec<WorkerStats> {
        let _ = self.stop.send(true);
        let deadline = tokio::time::Instant::now() + WORKER_STOP_GRACE;
        let mut stats = Vec::new();
        for mut worker in self.running {
            match tokio::time::timeout_at(deadline, &mut worker).await {
                Ok(Ok(done)) => stats.push(done),
                Ok(Err(_)) => {}
                Err(_) => {
                    worker.abort();
                    tracing::warn!(grace = ?WORKER_STOP_GRACE, "a scheduler worker did not stop in time (a registry write that cannot commit?): abandoned");
                }
            }
        }
        stats
    }
}

/// One worker's backend: a [`LocalBackend`] that times the evaluation the worker holds, from
/// its dequeue to its ack or nack, by how it ended.
#[derive(Debug)]
struct TimedBackend {
    inner: LocalBackend,
    instruments: Option<Arc<MasterInstruments>>,
    /// The evaluation in hand: when it was dequeued, and how it ends so far.
    run: Mutex<Option<(Instant, RunOutcome)>>,
}

impl TimedBackend {
    fn set_run(&self, run: impl FnOnce(&mut Option<(Instant, RunOutcome)>)) {
        run(&mut self.run.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// The run in hand ended, `nacked` or as recorded.
    fn end_run(&self, nacked: bool) {
        let mut ended = None;
        self.set_run(|run| ended = run.take());
        if let (Some(instruments), Some((started, outcome))) = (&self.instruments, ended) {
            let outcome = if nacked { RunOutcome::Nacked } else { outcome };
            instruments.scheduler_run(outcome, started.elapsed());
        }
    }
}

impl Backend for TimedBackend {
    async fn dequeue(
        &self,
        schedulers: &[String],
        timeout: Duration,
    ) -> Result<Option<Assignment>, WorkerError> {
        let assignment = self.inner.dequeue(schedulers, timeout).await?;
        if assignment.is_some() {
            self.set_run(|run| *run = Some((Instant::now(), RunOutcome::Complete)));
        }
        Ok(assignment)
    }

    async fn snapshot(&self, min_index: u64) -> Result<ClusterSnapshot, WorkerError> {
        self.inner.snapshot(min_index).await
    }

    async fn submit(&self, plan: Plan) -> Result<PlanResult, WorkerError> {
        self.inner.submit(plan).await
    }

    async fn ack(&self, eval: &EvalId, token: &str) -> Result<(), WorkerError> {
        self.inner.ack(eval, token).await?;
        // A failed ack is followed by a nack, which ends the run.
        self.end_run(false);
        Ok(())
    }

    async fn nack(&self, eval: &EvalId, token: &str) -> Result<(), WorkerError> {
        let nacked = self.inner.nack(eval, token).await;
        self.end_run(true);
        nacked
    }

    async fn block(
        &self,
        eval: Evaluation,
        token: &str,
        unplaced: Vec<Demand>,
    ) -> Result<(), WorkerError> {
        self.inner.block(eval, token, unplaced).await?;
        self.set_run(|run| {
            if let Some((_, outcome)) = run {
                *outcome = RunOutcome::Blocked;
            }
        });
        Ok(())
    }

    async fn complete(&self, eval: &Evaluation, token: &str) -> Result<(), WorkerError> {
        self.inner.complete(eval, token).await
    }
}
