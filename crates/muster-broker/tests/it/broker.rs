//! The eval broker's semantics under tokio's paused clock: priority order, one evaluation in
//! flight per job, cancelable on ack (written in one batch), long-poll dequeue, nack delays,
//! the delivery limit, nack timeouts, and restore after a failover.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use muster_actor::{Pid, System};
use muster_broker::{
    BrokerConfig, BrokerError, BrokerMsg, BrokerStats, Delivery, EvalBroker, RegistryWriter,
};
use muster_model::{EvalId, EvalStatus, Evaluation, SchedulerType, Trigger};
use muster_registry::Op;

/// Records every registry write the broker makes.
#[derive(Clone, Default)]
struct Writes(Arc<Mutex<Vec<Op>>>);

impl Writes {
    fn writer(&self) -> RegistryWriter {
        let writes = self.0.clone();
        RegistryWriter::new(move |op| {
            writes.lock().expect("writes").push(op);
            Box::pin(async { Ok(()) })
        })
    }

    /// The ids set to `status`, write by write.
    fn status_writes(&self, status: EvalStatus) -> Vec<Vec<EvalId>> {
        let mut found = Vec::new();
        for op in self.0.lock().expect("writes").iter() {
            let Op::Together(ops) = op else { continue };
            for op in ops {
                if let Op::SetEvalStatus { ids, status: s, .. } = op
                    && *s == status
                {
                    found.push(ids.clone());
                }
            }
        }
        found
    }
}

fn eval(id: &str, job: &str, priority: u8, create_index: u64) -> Evaluation {
    Evaluation {
        id: EvalId(id.into()),
        job: job.into(),
        priority,
        scheduler: SchedulerType::Service,
        named_scheduler: None,
        trigger: Trigger::JobRegister,
        status: EvalStatus::Pending,
        status_description: String::new(),
        create_index,
        modify_index: create_index,
        snapshot_index: 0,
        wait_until_ms: 0,
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn start(config: BrokerConfig, writes: &Writes, evals: Vec<Evaluation>) -> Pid<EvalBroker> {
    let broker = System::new().spawn(EvalBroker::new(config));
    broker
        .tell(BrokerMsg::Restore {
            writer: writes.writer(),
            evals,
        })
        .map_err(drop)
        .expect("broker runs");
    broker
}

async fn dequeue(broker: &Pid<EvalBroker>, timeout: Duration) -> Option<Delivery> {
    broker
        .ask(|reply| BrokerMsg::Dequeue {
            schedulers: vec!["service".into(), "batch".into()],
            timeout,
            reply,
        })
        .await
        .expect("broker answers")
        .expect("broker enabled")
}

async fn ack(broker: &Pid<EvalBroker>, delivery: &Delivery) -> Result<(), BrokerError> {
    let (eval, token) = (delivery.eval.id.clone(), delivery.token.clone());
    broker
        .ask(|reply| BrokerMsg::Ack { eval, token, reply })
        .await
        .expect("broker answers")
}

async fn nack(broker: &Pid<EvalBroker>, delivery: &Delivery) -> Result<(), BrokerError> {
    let (eval, token) = (delivery.eval.id.clone(), delivery.token.clone());
    broker
        .ask(|reply| BrokerMsg::Nack { eval, token, reply })
        .await
        .expect("broker answers")
}

async fn stats(broker: &Pid<EvalBroker>) -> BrokerStats {
    broker.ask(BrokerMsg::Stats).await.expect("broker answers")
}

fn id(delivery: &Option<Delivery>) -> Option<&str> {
    delivery.as_ref().map(|d| d.eval.id.0.as_str())
}

#[tokio::test(start_paused = true)]
async fn ready_evaluations_go_out_by_priority_then_age() {
    let writes = Writes::default();
    let broker = start(
        BrokerConfig::default(),
        &writes,
        vec![
            eval("low-old", "a", 50, 1),
            eval("high", "b", 70, 2),
            eval("low-new", "c", 50, 3),
        ],
    );
    let zero = Duration::ZERO;
    assert_eq!(id(&dequeue(&broker, zero).await), Some("high"));
    assert_eq!(id(&dequeue(&broker, zero).await), Some("low-old"));
    assert_eq!(id(&dequeue(&broker, zero).await), Some("low-new"));
    assert_eq!(id(&dequeue(&broker, zero).await), None);
}

#[tokio::test(start_paused = true)]
async fn one_evaluation_in_flight_per_job_and_the_rest_cancelable_on_ack() {
    let writes = Writes::default();
    let mut evals = vec![eval("first", "job", 50, 1)];
    evals.extend((2..=1000).map(|n| eval(&format!("e{n}"), "job", 50, n)));
    let broker = start(BrokerConfig::default(), &writes, evals);

    let first = dequeue(&broker, Duration::ZERO).await;
    assert_eq!(id(&first), Some("first"));
    assert_eq!(id(&dequeue(&broker, Duration::ZERO).await), None);
    assert_eq!(stats(&broker).await.total().pending, 999);

    ack(&broker, first.as_ref().expect("delivery"))
        .await
        .expect("ack");
    // The newest pending evaluation is next; the other 998 are canceled in one write.
    let next = dequeue(&broker, Duration::ZERO).await;
    assert_eq!(id(&next), Some("e1000"));
    let canceled = writes.status_writes(EvalStatus::Canceled);
    assert_eq!(canceled.len(), 1, "one registry write for the whole batch");
    assert_eq!(canceled[0].len(), 998);
    assert!(!canceled[0].contains(&EvalId("e1000".into())));
    let after = stats(&broker).await;
    assert_eq!(after.total().pending, 0);
    assert_eq!(after.total().cancelable, 0);
    assert_eq!(after.canceled, 998);
    assert_eq!(after.registry_writes, 1);
}

#[tokio::test(start_paused = true)]
async fn cancellations_being_written_still_count_as_cancelable() {
    // A registry write that waits for a permit.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let writer = {
        let gate = Arc::clone(&gate);
        RegistryWriter::new(move |_op| {
            let gate = Arc::clone(&gate);
            Box::pin(async move {
                gate.acquire().await.expect("gate open").forget();
                Ok(())
            })
        })
    };
    let broker = System::new().spawn(EvalBroker::new(BrokerConfig::default()));
    let evals = (1..=10)
        .map(|n| eval(&format!("e{n}"), "job", 50, n))
        .collect();
    broker
        .tell(BrokerMsg::Restore { writer, evals })
        .map_err(drop)
        .expect("broker runs");
    let first = dequeue(&broker, Duration::ZERO).await;
    ack(&broker, first.as_ref().expect("delivery"))
        .await
        .expect("ack");
    // The write of the 8 cancellations is under way: they are not canceled yet.
    let during = stats(&broker).await;
    assert_eq!((during.total().cancelable, during.canceled), (8, 0));

    gate.add_permits(1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let after = stats(&broker).await;
        if after.canceled == 8 {
            assert_eq!(after.total().cancelable, 0);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{after:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn dequeue_waits_for_work_and_times_out() {
    let writes = Writes::default();
    let broker = start(BrokerConfig::default(), &writes, Vec::new());
    let waiting = {
        let broker = broker.clone();
        tokio::spawn(async move { dequeue(&broker, Duration::from_secs(5)).await })
    };
    // Let the dequeue park, then enqueue: the parked worker gets it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    broker
        .tell(BrokerMsg::Enqueue(vec![eval("late", "j", 50, 1)]))
        .map_err(drop)
        .expect("broker runs");
    assert_eq!(id(&waiting.await.expect("task")), Some("late"));

    let started = tokio::time::Instant::now();
    assert_eq!(id(&dequeue(&broker, Duration::from_secs(5)).await), None);
    assert_eq!(started.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn nacks_delay_redelivery_and_the_delivery_limit_fails_the_evaluation() {
    let writes = Writes::default();
    let config = BrokerConfig::default();
    let broker = start(
        config.clone(),
        &writes,
        vec![eval("flaky", "j", 50, 1), eval("behind", "j", 50, 2)],
    );

    let first = dequeue(&broker, Duration::ZERO)
        .await
        .expect("first delivery");
    nack(&broker, &first).await.expect("nack");
    assert_eq!(
        id(&dequeue(&broker, Duration::ZERO).await),
        None,
        "not ready during the delay"
    );
    // A long poll: the evaluation comes back once its delay is over.
    let started = tokio::time::Instant::now();
    let second = dequeue(&broker, Duration::from_secs(60))
        .await
        .expect("second delivery");
    assert_eq!(started.elapsed(), config.initial_nack_delay);
    assert_eq!(second.eval.id.0, "flaky");
    nack(&broker, &second).await.expect("nack");
    let started = tokio::time::Instant::now();
    let third = dequeue(&broker, Duration::from_secs(60))
        .await
        .expect("third delivery");
    assert_eq!(
        started.elapsed(),
        config.subsequent_nack_delay,
        "later nacks wait longer"
    );
    nack(&broker, &third).await.expect("nack");

    // Past the limit: failed, written as such, and the job's next evaluation is ready.
    let after = stats(&broker).await;
    assert_eq!(after.total().failed, 1);
    assert_eq!(
        writes.status_writes(EvalStatus::Failed),
        vec![vec![EvalId("flaky".into())]]
    );
    assert_eq!(id(&dequeue(&broker, Duration::ZERO).await), Some("behind"));

    // The failure was written with a follow-up: a new evaluation of the job, held back at
    // least the follow-up delay.
    let follow_ups: Vec<Evaluation> = writes
        .0
        .lock()
        .expect("writes")
        .iter()
        .filter_map(|op| match op {
            Op::Together(ops) => Some(ops.clone()),
            _ => None,
        })
        .flatten()
        .filter_map(|op| match op {
            Op::UpsertEvals(evals) => Some(evals),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(follow_ups.len(), 1, "{follow_ups:?}");
    let follow_up = &follow_ups[0];
    assert_eq!(follow_up.job, "j");
    assert_eq!(
        follow_up.trigger,
        Trigger::FailedFollowUp(EvalId("flaky".into()))
    );
    assert_eq!(follow_up.status, EvalStatus::Pending);
    let delay_ms = config.failed_follow_up_delay.as_millis() as u64;
    let jitter_ms = config.failed_follow_up_jitter.as_millis() as u64;
    let wait = follow_up.wait_until_ms.saturating_sub(now_ms());
    assert!(
        wait + 1_000 >= delay_ms && wait <= delay_ms + jitter_ms,
        "follow-up waits {wait} ms"
    );
    assert_eq!(stats(&broker).await.total().delayed, 1);
}

#[tokio::test(start_paused = true)]
async fn an_evaluation_with_a_wait_is_held_back_until_then() {
    let writes = Writes::default();
    let mut later = eval("later", "j", 90, 1);
    later.wait_until_ms = now_ms() + 30_000;
    let broker = start(
        BrokerConfig::default(),
        &writes,
        vec![later, eval("now", "k", 50, 2)],
    );
    // The held-back one does not go first, though its priority is higher, nor hold up its
    // job's place: it is not in flight yet.
    assert_eq!(id(&dequeue(&broker, Duration::ZERO).await), Some("now"));
    assert_eq!(id(&dequeue(&broker, Duration::ZERO).await), None);
    let held = stats(&broker).await.total();
    assert_eq!((held.delayed, held.ready, held.pending), (1, 0, 0));

    // A long poll gets it when its time comes, not before.
    let started = tokio::time::Instant::now();
    let delivered = dequeue(&broker, Duration::from_secs(600)).await;
    assert_eq!(id(&delivered), Some("later"));
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(29) && waited <= Duration::from_secs(31),
        "held back {waited:?}"
    );
    assert_eq!(stats(&broker).await.total().delayed, 0);
}

#[tokio::test(start_paused = true)]
async fn an_unacked_evaluation_is_nacked_when_its_timer_runs_out() {
    let writes = Writes::default();
    let config = BrokerConfig::default();
    let broker = start(config.clone(), &writes, vec![eval("slow", "j", 50, 1)]);
    let first = dequeue(&broker, Duration::ZERO).await.expect("delivery");
    let started = tokio::time::Instant::now();
    let again = dequeue(&broker, Duration::from_secs(600))
        .await
        .expect("redelivered");
    assert_eq!(
        started.elapsed(),
        config.nack_timeout + config.initial_nack_delay
    );
    assert_eq!(again.eval.id.0, "slow");
    assert_ne!(again.token, first.token);
    // The old token no longer acks.
    assert_eq!(
        ack(&broker, &first).await,
        Err(BrokerError::TokenMismatch(EvalId("slow".into())))
    );
    ack(&broker, &again).await.expect("ack with the new token");
    assert_eq!(
        ack(&broker, &again).await,
        Err(BrokerError::NotOutstanding(EvalId("slow".into())))
    );
}

#[tokio::test(start_paused = true)]
async fn disable_refuses_work_and_restore_rebuilds_from_the_registry() {
    let writes = Writes::default();
    let broker = start(
        BrokerConfig::default(),
        &writes,
        vec![eval("a", "j", 50, 1)],
    );
    let waiting = {
        let broker = broker.clone();
        tokio::spawn(async move {
            broker
                .ask(|reply| BrokerMsg::Dequeue {
                    schedulers: vec!["system".into()],
                    timeout: Duration::from_secs(60),
                    reply,
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    broker
        .tell(BrokerMsg::Disable)
        .map_err(drop)
        .expect("broker runs");
    assert_eq!(
        waiting.await.expect("task").expect("answer"),
        Err(BrokerError::Disabled)
    );

    let mut done = eval("done", "k", 50, 2);
    done.status = EvalStatus::Complete;
    broker
        .tell(BrokerMsg::Restore {
            writer: writes.writer(),
            evals: vec![eval("a", "j", 50, 1), done, eval("b", "l", 60, 3)],
        })
        .map_err(drop)
        .expect("broker runs");
    assert_eq!(id(&dequeue(&broker, Duration::ZERO).await), Some("b"));
    assert_eq!(id(&dequeue(&broker, Duration::ZERO).await), Some("a"));
    assert_eq!(
        id(&dequeue(&broker, Duration::ZERO).await),
        None,
        "completed ones are not restored"
    );
}

async fn dequeue_names(
    broker: &Pid<EvalBroker>,
    names: &[&str],
    timeout: Duration,
) -> Option<Delivery> {
    let schedulers = names.iter().map(|name| (*name).to_owned()).collect();
    broker
        .ask(|reply| BrokerMsg::Dequeue {
            schedulers,
            timeout,
            reply,
        })
        .await
        .expect("broker answers")
        .expect("broker enabled")
}

#[tokio::test(start_paused = true)]
async fn a_named_scheduler_gets_only_its_own_evaluations() {
    let writes = Writes::default();
    let mut gang = eval("g1", "train", 90, 1);
    gang.named_scheduler = Some("gang".into());
    let broker = start(
        BrokerConfig::default(),
        &writes,
        vec![gang, eval("s1", "web", 50, 2)],
    );
    // The built-in workers skip the higher-priority gang evaluation.
    let built_in = dequeue_names(&broker, &["service", "batch", "system"], Duration::ZERO).await;
    assert_eq!(id(&built_in), Some("s1"));
    assert_eq!(
        id(&dequeue_names(&broker, &["service"], Duration::ZERO).await),
        None
    );
    let before = stats(&broker).await;
    assert_eq!(before.by_scheduler.get("gang").map(|q| q.ready), Some(1));
    assert_eq!(before.schedulers.get("gang").map(|p| p.served), Some(false));
    assert_eq!(
        before.schedulers.get("service").map(|p| p.served),
        Some(true)
    );

    // A worker waiting on `gang` is served it when it arrives, and counts as present.
    assert_eq!(
        id(&dequeue_names(&broker, &["gang"], Duration::ZERO).await),
        Some("g1")
    );
    let waiting = {
        let broker = broker.clone();
        tokio::spawn(
            async move { dequeue_names(&broker, &["gang"], Duration::from_secs(60)).await },
        )
    };
    tokio::time::sleep(Duration::from_secs(45)).await;
    let during = stats(&broker).await;
    assert_eq!(during.schedulers.get("gang").map(|p| p.served), Some(true));
    let mut next = eval("g2", "other-training", 90, 3);
    next.named_scheduler = Some("gang".into());
    broker
        .tell(BrokerMsg::Enqueue(vec![next]))
        .map_err(drop)
        .expect("broker runs");
    let delivered = waiting.await.expect("the waiting dequeue ends");
    assert_eq!(id(&delivered), Some("g2"));

    // Long after its last worker left, the name is no longer served.
    tokio::time::sleep(BrokerConfig::default().scheduler_gone_after).await;
    let after = stats(&broker).await;
    let gang = after.schedulers.get("gang").copied().unwrap_or_default();
    assert!(!gang.served && gang.last_served_ms.is_some(), "{gang:?}");
}

#[tokio::test(start_paused = true)]
async fn a_job_moved_to_another_scheduler_does_not_wait_behind_its_old_one() {
    let writes = Writes::default();
    let mut waiting = eval("g1", "train", 50, 1);
    waiting.named_scheduler = Some("gang".into());
    let broker = start(BrokerConfig::default(), &writes, vec![waiting]);
    // No `gang` worker: the job is stopped (or re-pointed), and its new evaluation goes to the
    // built-in service scheduler at once; the old one is canceled.
    broker
        .tell(BrokerMsg::Enqueue(vec![eval("s2", "train", 50, 2)]))
        .map_err(drop)
        .expect("broker runs");
    let delivered = dequeue_names(&broker, &["service"], Duration::ZERO).await;
    assert_eq!(id(&delivered), Some("s2"));
    assert_eq!(
        id(&dequeue_names(&broker, &["gang"], Duration::ZERO).await),
        None
    );
    let after = stats(&broker).await;
    assert_eq!(after.by_scheduler.get("gang").map(|q| q.ready), Some(0));
}
