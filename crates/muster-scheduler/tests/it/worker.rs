//! The worker loop against an in-memory backend: a broker queue, a cluster state with a
//! serial plan applier, and failure injection.
//! One evaluation at a time here; the loop over a queue of them is in `run`.

use crate::common;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use common::*;
use muster_model::{EvalId, EvalStatus, Evaluation, SchedulerType};
use muster_scheduler::{
    Assignment, Backend, ClusterSnapshot, Demand, Outcome, Plan, PlanResult, TaskState, TaskView,
    Worker, WorkerConfig, WorkerError, WorkerStats, binpack, spread,
};
use tokio::sync::watch;

mod run;

/// One call the worker made.
#[derive(Clone, Debug, PartialEq)]
enum Call {
    Dequeue(Vec<String>, Duration),
    Snapshot(u64),
    Submit { place: usize, stop: usize },
    Ack(EvalId, String),
    Nack(EvalId, String),
    Block(Evaluation, Vec<Demand>),
    Complete(Evaluation),
}

/// Which backend operation fails.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Snapshot,
    Submit,
    Ack,
    Nack,
    Block,
    Complete,
}

type Hook = Box<dyn FnOnce(&mut ClusterSnapshot) + Send>;

#[derive(Default)]
struct State {
    queue: VecDeque<Assignment>,
    cluster: ClusterSnapshot,
    calls: Vec<Call>,
    failing: Vec<Op>,
    /// Run against the cluster just before the plan of the same position is applied: another
    /// scheduler's plan committed first.
    before_submit: VecDeque<Hook>,
    /// The applier rejects every placement.
    reject_all: bool,
    /// The applier rejects every placement as over a quota, for this reason.
    over_quota: Option<String>,
    /// The applier commits at most this many placements of each plan and rejects the rest
    /// (another scheduler's plans keep taking the room).
    commit_at_most: Option<usize>,
    /// Answer snapshots this much older than the cluster.
    snapshot_lag: u64,
    /// When set, each `complete` waits for a permit (a registry write held up).
    complete_gate: Option<Arc<tokio::sync::Semaphore>>,
}

struct Fake {
    state: Mutex<State>,
    acks: watch::Sender<usize>,
}

impl Fake {
    fn new(cluster: ClusterSnapshot) -> Arc<Self> {
        Arc::new(Fake {
            state: Mutex::new(State {
                cluster,
                ..State::default()
            }),
            acks: watch::channel(0).0,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("fake backend state")
    }

    fn enqueue(&self, eval: Evaluation, token: &str) {
        self.lock().queue.push_back(Assignment {
            state_index: 0,
            eval,
            token: token.to_owned(),
        });
    }

    fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    fn fail(&self, op: Op) -> Result<(), String> {
        if self.lock().failing.contains(&op) {
            Err(format!("injected {op:?} failure"))
        } else {
            Ok(())
        }
    }

    fn live_tasks(&self, job: &str) -> Vec<(String, TaskView)> {
        let state = self.lock();
        state
            .cluster
            .agents
            .iter()
            .flat_map(|a| {
                a.tasks()
                    .iter()
                    .map(move |t| (a.id.0.clone(), TaskView::clone(t)))
            })
            .filter(|(_, t)| *t.job() == *job && !t.state.is_terminal())
            .collect()
    }
}

impl Backend for Fake {
    async fn dequeue(
        &self,
        schedulers: &[String],
        timeout: Duration,
    ) -> Result<Option<Assignment>, WorkerError> {
        let next = {
            let mut state = self.lock();
            state
                .calls
                .push(Call::Dequeue(schedulers.to_vec(), timeout));
            state.queue.pop_front()
        };
        if next.is_none() {
            // A long poll that finds nothing (the test clock is paused: no real waiting).
            tokio::time::sleep(timeout).await;
        }
        Ok(next)
    }

    async fn snapshot(&self, min_index: u64) -> Result<ClusterSnapshot, WorkerError> {
        self.lock().calls.push(Call::Snapshot(min_index));
        self.fail(Op::Snapshot)
            .map_err(|reason| WorkerError::Snapshot { min_index, reason })?;
        let state = self.lock();
        let mut snapshot = state.cluster.clone();
        snapshot.index = snapshot.index.saturating_sub(state.snapshot_lag);
        Ok(snapshot)
    }

    async fn submit(&self, plan: Plan) -> Result<PlanResult, WorkerError> {
        self.lock().calls.push(Call::Submit {
            place: plan.place.len(),
            stop: plan.stop.len(),
        });
        self.fail(Op::Submit)
            .map_err(|reason| WorkerError::Submit {
                eval: plan.eval.clone(),
                reason,
            })?;
        let mut state = self.lock();
        if let Some(hook) = state.before_submit.pop_front() {
            hook(&mut state.cluster);
            state.cluster.index += 1;
        }
        // The serial applier: stops first, then each placement against what is free now.
        let mut result = PlanResult::default();
        let reject_all = state.reject_all || state.over_quota.is_some();
        let over_quota = state.over_quota.clone();
        let mut room = state.commit_at_most.unwrap_or(usize::MAX);
        for stop in plan.stop {
            for agent in state
                .cluster
                .agents
                .iter_mut()
                .filter(|a| a.id == stop.agent)
            {
                Arc::make_mut(agent).update_tasks(|tasks| {
                    for task in tasks.iter_mut().filter(|t| *t.id() == *stop.task_id) {
                        Arc::make_mut(task).state = TaskState::Killed;
                    }
                });
            }
            result.stopped.push(stop);
        }
        for placement in plan.place {
            let agent = state
                .cluster
                .agents
                .iter_mut()
                .find(|a| a.id == placement.agent);
            match agent {
                Some(agent)
                    if !reject_all
                        && room > 0
                        && agent.fits(&placement.resources)
                        && agent.tasks().iter().all(|t| *t.id() != *placement.task_id) =>
                {
                    room -= 1;
                    let task = placement.staged_task();
                    Arc::make_mut(agent).update_tasks(|tasks| tasks.push(Arc::new(task)));
                    result.committed.push(placement);
                }
                _ => {
                    if let Some(reason) = &over_quota {
                        let id = placement.task_id.clone();
                        result.over_quota.insert(id, reason.clone());
                    }
                    result.rejected.push(placement);
                }
            }
        }
        state.cluster.index += 1;
        result.index = state.cluster.index;
        Ok(result)
    }

    async fn ack(&self, eval: &EvalId, token: &str) -> Result<(), WorkerError> {
        self.lock()
            .calls
            .push(Call::Ack(eval.clone(), token.to_owned()));
        self.fail(Op::Ack).map_err(|reason| WorkerError::Ack {
            eval: eval.clone(),
            reason,
        })?;
        self.acks.send_modify(|n| *n += 1);
        Ok(())
    }

    async fn nack(&self, eval: &EvalId, token: &str) -> Result<(), WorkerError> {
        self.lock()
            .calls
            .push(Call::Nack(eval.clone(), token.to_owned()));
        self.fail(Op::Nack).map_err(|reason| WorkerError::Nack {
            eval: eval.clone(),
            reason,
        })
    }

    async fn block(
        &self,
        eval: Evaluation,
        _token: &str,
        unplaced: Vec<Demand>,
    ) -> Result<(), WorkerError> {
        self.lock().calls.push(Call::Block(eval.clone(), unplaced));
        self.fail(Op::Block).map_err(|reason| WorkerError::Block {
            eval: eval.id.clone(),
            reason,
        })
    }

    async fn complete(&self, eval: &Evaluation, _token: &str) -> Result<(), WorkerError> {
        let gate = {
            let mut state = self.lock();
            state.calls.push(Call::Complete(eval.clone()));
            state.complete_gate.clone()
        };
        if let Some(gate) = gate {
            gate.acquire().await.expect("gate open").forget();
        }
        self.fail(Op::Complete)
            .map_err(|reason| WorkerError::Complete {
                eval: eval.id.clone(),
                reason,
            })
    }
}

fn config() -> WorkerConfig {
    WorkerConfig {
        schedulers: vec!["service".into(), "batch".into()],
        dequeue_timeout: Duration::from_millis(250),
        ..WorkerConfig::default()
    }
}

/// A cluster of `agents` (4 cpus, 4 GiB each) at index 10 running nothing, with a job `web`
/// of `count` 1-cpu tasks, and its evaluation (modify index 10) queued under token "tok".
fn setup(agents: usize, count: u32) -> (Arc<Fake>, Evaluation) {
    let web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", count, 1.0, 256)],
    );
    let cluster = snapshot(
        10,
        (1..=agents)
            .map(|i| agent(&format!("a{i}"), 4.0, 4096))
            .collect(),
        vec![web.clone()],
    );
    let fake = Fake::new(cluster);
    let mut eval = eval_for(&web);
    eval.create_index = 9;
    eval.modify_index = 10;
    fake.enqueue(eval.clone(), "tok");
    (fake, eval)
}

#[tokio::test(start_paused = true)]
async fn the_success_path_places_completes_and_acks() {
    let (fake, eval) = setup(2, 3);
    let mut worker = Worker::new(Arc::clone(&fake), spread(), config());
    let outcome = worker.run_once().await.expect("step");
    assert_eq!(
        outcome,
        Some(Outcome::Completed {
            eval: eval.id.clone(),
            attempts: 1,
            placed: 3,
            stopped: 0
        })
    );
    let mut completed = eval.clone();
    completed.status = EvalStatus::Complete;
    completed.snapshot_index = 10;
    assert_eq!(
        fake.calls(),
        [
            Call::Dequeue(
                vec!["service".to_owned(), "batch".to_owned()],
                Duration::from_millis(250)
            ),
            Call::Snapshot(10),
            Call::Submit { place: 3, stop: 0 },
            Call::Complete(completed),
            Call::Ack(eval.id.clone(), "tok".into()),
        ]
    );
    assert_eq!(fake.live_tasks("web").len(), 3);
    assert_eq!(
        *worker.stats(),
        WorkerStats {
            dequeued: 1,
            plans_submitted: 1,
            placements_committed: 3,
            evals_completed: 1,
            ..WorkerStats::default()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_partial_rejection_refreshes_and_places_the_rest() {
    // Binpack plans 2 tasks on each agent (the job's anti-affinity spreads them); meanwhile
    // another scheduler's task of 3 CPUs lands on a1, so one of this plan's a1 placements no
    // longer fits.
    let (fake, eval) = setup(3, 6);
    fake.lock()
        .before_submit
        .push_back(Box::new(|cluster: &mut ClusterSnapshot| {
            Arc::make_mut(&mut cluster.agents[0]).update_tasks(|tasks| {
                tasks.push(Arc::new(task(
                    "other.x[0]",
                    "other",
                    "x",
                    3.0,
                    256,
                    TaskState::Staging,
                )));
            });
        }));
    let mut worker = Worker::new(Arc::clone(&fake), binpack(), config());
    let outcome = worker.run_once().await.expect("step");
    assert_eq!(
        outcome,
        Some(Outcome::Completed {
            eval: eval.id.clone(),
            attempts: 2,
            placed: 6,
            stopped: 0
        })
    );
    let calls = fake.calls();
    // The first plan (2 on each agent) lost one a1 placement; the applier's index was 12
    // (the other scheduler's commit, then this plan), and the retry planned against it.
    assert_eq!(calls[1], Call::Snapshot(10));
    assert_eq!(calls[2], Call::Submit { place: 6, stop: 0 });
    assert_eq!(calls[3], Call::Snapshot(12));
    assert_eq!(calls[4], Call::Submit { place: 1, stop: 0 });
    assert!(matches!(&calls[5], Call::Complete(e) if e.snapshot_index == 12));
    assert_eq!(calls[6], Call::Ack(eval.id.clone(), "tok".into()));
    assert_eq!(calls.len(), 7);

    let live = fake.live_tasks("web");
    assert_eq!(live.len(), 6);
    let mut names: Vec<&str> = live.iter().map(|(_, t)| t.name()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 6, "every slot filled once: {names:?}");
    assert_eq!(live.iter().filter(|(a, _)| a == "a1").count(), 1);
    let stats = worker.stats();
    assert_eq!(
        (
            stats.plans_submitted,
            stats.placements_committed,
            stats.placements_rejected,
            stats.evals_completed
        ),
        (2, 6, 1, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_lack_of_capacity_blocks_the_evaluation() {
    let (fake, eval) = setup(1, 6);
    let mut worker = Worker::new(Arc::clone(&fake), binpack(), config());
    let outcome = worker.run_once().await.expect("step");
    let demand = Demand {
        gang_fitting: 0,
        gang: 0,
        resources: res(1.0, 256),
        constraints: vec![],
        over_quota: None,
    };
    assert_eq!(
        outcome,
        Some(Outcome::Blocked {
            eval: eval.id.clone(),
            attempts: 1,
            placed: 4,
            stopped: 0,
            unplaced: vec![demand.clone()],
        })
    );
    let calls = fake.calls();
    let Some(Call::Block(blocked, demands)) = calls.get(3) else {
        panic!("expected a block, got {calls:?}");
    };
    assert_eq!(blocked.status, EvalStatus::Blocked);
    assert_eq!(blocked.snapshot_index, 10);
    assert_eq!(demands, &[demand]);
    assert_eq!(calls[4], Call::Ack(eval.id.clone(), "tok".into()));
    assert!(!calls.iter().any(|c| matches!(c, Call::Complete(_))));
    assert_eq!(worker.stats().evals_blocked, 1);
    assert_eq!(worker.stats().evals_completed, 0);

    // Capacity arrives and the evaluation comes back: only the two missing slots are placed.
    {
        let mut state = fake.lock();
        state.cluster.agents.push(Arc::new(agent("a2", 4.0, 4096)));
        state.cluster.index += 1;
    }
    let mut again = eval.clone();
    again.modify_index = 12;
    fake.enqueue(again, "tok2");
    let outcome = worker.run_once().await.expect("step");
    assert!(
        matches!(outcome, Some(Outcome::Completed { placed: 2, .. })),
        "{outcome:?}"
    );
    assert_eq!(fake.live_tasks("web").len(), 6);
}

#[tokio::test(start_paused = true)]
async fn placements_the_applier_refuses_over_a_quota_block_waiting_for_it() {
    let (fake, _) = setup(2, 2);
    let reason = "namespace \"default\" is at its quota of 0 tasks (it would have 1)";
    fake.lock().over_quota = Some(reason.to_owned());
    let mut worker = Worker::new(Arc::clone(&fake), spread(), config());
    let outcome = worker.run_once().await.expect("step");
    let Some(Outcome::Blocked { unplaced, .. }) = outcome else {
        panic!("expected a block, got {outcome:?}");
    };
    assert_eq!(unplaced.len(), 1, "{unplaced:?}");
    assert_eq!(unplaced[0].over_quota.as_deref(), Some(reason));
    let calls = fake.calls();
    let Some(Call::Block(blocked, _)) = calls.iter().find(|c| matches!(c, Call::Block(..))) else {
        panic!("expected a block, got {calls:?}");
    };
    assert_eq!(blocked.status_description, reason);
}

#[tokio::test(start_paused = true)]
async fn placements_rejected_on_every_attempt_block_after_three() {
    let (fake, eval) = setup(2, 2);
    fake.lock().reject_all = true;
    let mut worker = Worker::new(Arc::clone(&fake), spread(), config());
    let outcome = worker.run_once().await.expect("step");
    assert_eq!(
        outcome,
        Some(Outcome::Blocked {
            eval: eval.id.clone(),
            attempts: 3,
            placed: 0,
            stopped: 0,
            unplaced: vec![Demand {
                gang_fitting: 0,
                gang: 0,
                resources: res(1.0, 256),
                constraints: vec![],
                over_quota: None,
            }],
        })
    );
    let calls = fake.calls();
    let snapshots: Vec<&Call> = calls
        .iter()
        .filter(|c| matches!(c, Call::Snapshot(_)))
        .collect();
    assert_eq!(
        snapshots,
        [
            &Call::Snapshot(10),
            &Call::Snapshot(11),
            &Call::Snapshot(12)
        ]
    );
    assert_eq!(worker.stats().plans_submitted, 3);
    assert_eq!(worker.stats().placements_rejected, 6);
    assert_eq!(
        calls.last(),
        Some(&Call::Ack(eval.id.clone(), "tok".into()))
    );
}

#[tokio::test(start_paused = true)]
async fn a_plan_that_commits_part_starts_the_attempts_over() {
    // Every plan loses all but one placement to other schedulers (two workers binpacking onto
    // the same agents do this), more times in a row than `max_attempts`: each plan still makes
    // progress, so the worker plans again until every slot is placed, as Nomad's retry with
    // progress does. Blocking instead would wait for a capacity change that may never come.
    let (fake, eval) = setup(2, 6);
    fake.lock().commit_at_most = Some(1);
    let mut worker = Worker::new(Arc::clone(&fake), spread(), config());
    let outcome = worker.run_once().await.expect("step");
    assert_eq!(
        outcome,
        Some(Outcome::Completed {
            eval: eval.id.clone(),
            attempts: 6,
            placed: 6,
            stopped: 0
        })
    );
    assert_eq!(fake.live_tasks("web").len(), 6);
    assert_eq!(worker.stats().placements_rejected, 5 + 4 + 3 + 2 + 1);
}

#[tokio::test(start_paused = true)]
async fn a_backend_failure_nacks() {
    for op in [Op::Snapshot, Op::Submit, Op::Complete, Op::Ack] {
        let (fake, eval) = setup(2, 2);
        fake.lock().failing.push(op);
        let mut worker = Worker::new(Arc::clone(&fake), spread(), config());
        let outcome = worker.run_once().await.expect("step");
        let Some(Outcome::Nacked {
            eval: nacked,
            error,
        }) = outcome
        else {
            panic!("{op:?}: expected a nack, got {outcome:?}");
        };
        assert_eq!(nacked, eval.id);
        let expected_reason = format!("injected {op:?} failure");
        let matches_op = match (&error, op) {
            (
                WorkerError::Snapshot {
                    min_index: 10,
                    reason,
                },
                Op::Snapshot,
            )
            | (WorkerError::Submit { reason, .. }, Op::Submit)
            | (WorkerError::Complete { reason, .. }, Op::Complete)
            | (WorkerError::Ack { reason, .. }, Op::Ack) => reason == &expected_reason,
            _ => false,
        };
        assert!(matches_op, "{op:?}: {error}");
        let calls = fake.calls();
        assert_eq!(
            calls.last(),
            Some(&Call::Nack(eval.id.clone(), "tok".into())),
            "{op:?}"
        );
        assert_eq!(
            calls.iter().filter(|c| matches!(c, Call::Ack(..))).count(),
            usize::from(op == Op::Ack),
            "{op:?}: acked only when the ack itself was what failed"
        );
        let stats = worker.stats();
        assert_eq!(
            (
                stats.evals_nacked,
                stats.evals_completed,
                stats.evals_blocked
            ),
            (1, 0, 0),
            "{op:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_block_nacks() {
    let (fake, eval) = setup(1, 8);
    fake.lock().failing.push(Op::Block);
    let mut worker = Worker::new(Arc::clone(&fake), binpack(), config());
    let outcome = worker.run_once().await.expect("step");
    assert!(
        matches!(
            &outcome,
            Some(Outcome::Nacked {
                error: WorkerError::Block { .. },
                ..
            })
        ),
        "{outcome:?}"
    );
    assert_eq!(
        fake.calls().last(),
        Some(&Call::Nack(eval.id, "tok".into()))
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_nack_returns_the_first_error() {
    let (fake, _eval) = setup(2, 2);
    fake.lock().failing.extend([Op::Submit, Op::Nack]);
    let mut worker = Worker::new(Arc::clone(&fake), spread(), config());
    let error = worker.run_once().await.expect_err("both failed");
    assert!(matches!(error, WorkerError::Submit { .. }), "{error}");
    assert_eq!(worker.stats().nack_failures, 1);
    assert_eq!(worker.stats().evals_nacked, 0);
}

#[tokio::test(start_paused = true)]
async fn a_stale_snapshot_is_refused() {
    let (fake, eval) = setup(2, 2);
    fake.lock().snapshot_lag = 3;
    let mut worker = Worker::new(Arc::clone(&fake), spread(), config());
    let outcome = worker.run_once().await.expect("step");
    assert_eq!(
        outcome,
        Some(Outcome::Nacked {
            eval: eval.id,
            error: WorkerError::StaleSnapshot {
                min_index: 10,
                got: 7
            }
        })
    );
    assert!(
        !fake
            .calls()
            .iter()
            .any(|c| matches!(c, Call::Submit { .. }))
    );
}

#[tokio::test(start_paused = true)]
async fn nothing_to_do_submits_nothing() {
    let (fake, eval) = setup(2, 2);
    let mut worker = Worker::new(Arc::clone(&fake), spread(), config());
    worker.run_once().await.expect("first");
    // The same job evaluated again: everything is in place, no plan is submitted.
    fake.enqueue(eval.clone(), "tok2");
    let outcome = worker.run_once().await.expect("second");
    assert_eq!(
        outcome,
        Some(Outcome::Completed {
            eval: eval.id,
            attempts: 1,
            placed: 0,
            stopped: 0
        })
    );
    assert_eq!(worker.stats().plans_submitted, 1);
    // An empty queue: the dequeue times out and nothing else happens.
    let before = fake.calls().len();
    assert_eq!(worker.run_once().await.expect("third"), None);
    let calls = fake.calls();
    assert_eq!(calls.len(), before + 1);
    assert!(matches!(calls.last(), Some(Call::Dequeue(..))));
}

#[tokio::test(start_paused = true)]
async fn a_stopped_job_has_its_tasks_stopped() {
    let (fake, eval) = setup(2, 3);
    let mut worker = Worker::new(Arc::clone(&fake), spread(), config());
    worker.run_once().await.expect("place");
    fake.lock()
        .cluster
        .jobs
        .get_mut("web")
        .expect("web")
        .stopped = true;
    fake.enqueue(eval.clone(), "tok2");
    let outcome = worker.run_once().await.expect("stop");
    assert!(
        matches!(
            outcome,
            Some(Outcome::Completed {
                placed: 0,
                stopped: 3,
                ..
            })
        ),
        "{outcome:?}"
    );
    assert!(fake.live_tasks("web").is_empty());
    assert_eq!(worker.stats().stops_committed, 3);
}
