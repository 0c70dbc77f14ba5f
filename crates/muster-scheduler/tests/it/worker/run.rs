//! The worker's loop (`run`): queued evaluations settled until it stops, the next evaluation
//! planned while the last one is recorded (as many at once as configured), and the one being
//! recorded settled when it is stopped.

use super::*;

#[tokio::test(start_paused = true)]
async fn run_settles_queued_evaluations_until_stopped() {
    let (fake, _first) = setup(2, 2);
    let db = job(
        "db",
        SchedulerType::Service,
        vec![group("main", 1, 1.0, 256)],
    );
    fake.lock().cluster.jobs.insert("db".into(), db.clone());
    fake.enqueue(eval_for(&db), "tok-db");
    let mut acks = fake.acks.subscribe();

    let (stop_tx, stop_rx) = watch::channel(false);
    let worker = Worker::new(Arc::clone(&fake), spread(), config());
    let running = tokio::spawn(worker.run(stop_rx));
    acks.wait_for(|&n| n == 2).await.expect("acks");
    stop_tx.send(true).expect("worker listening");
    let stats = running.await.expect("worker task");
    assert_eq!(stats.evals_completed, 2);
    assert_eq!(stats.placements_committed, 3);
    assert_eq!(
        fake.live_tasks("web").len() + fake.live_tasks("db").len(),
        3
    );
}

#[tokio::test(start_paused = true)]
async fn run_stops_when_the_sender_is_dropped() {
    let (fake, _eval) = setup(1, 1);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut acks = fake.acks.subscribe();
    let running = tokio::spawn(Worker::new(Arc::clone(&fake), binpack(), config()).run(stop_rx));
    acks.wait_for(|&n| n == 1).await.expect("acks");
    drop(stop_tx);
    let stats = running.await.expect("worker task");
    assert_eq!(stats.evals_completed, 1);
}

#[tokio::test(start_paused = true)]
async fn run_plans_the_next_evaluation_while_the_last_one_is_recorded() {
    pipelined(1).await;
}

#[tokio::test(start_paused = true)]
async fn run_records_as_many_evaluations_at_once_as_configured() {
    pipelined(2).await;
}

/// Three evaluations, a worker with `depth` records in flight at most, and every record held
/// up: `depth + 1` are planned and submitted, `depth` records are under way, and the rest
/// wait until the first is settled; then all settle, each acked before a later one's record
/// starts `depth` places on.
async fn pipelined(depth: usize) {
    let (fake, web) = setup(4, 1);
    let mut evals = vec![web];
    for name in ["db", "api"] {
        let job = job(
            name,
            SchedulerType::Service,
            vec![group("main", 1, 1.0, 256)],
        );
        fake.lock().cluster.jobs.insert(name.into(), job.clone());
        let eval = eval_for(&job);
        fake.enqueue(eval.clone(), name);
        evals.push(eval);
    }
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    fake.lock().complete_gate = Some(Arc::clone(&gate));
    let (stop_tx, stop_rx) = watch::channel(false);
    let pipelined = WorkerConfig {
        settling: depth,
        ..config()
    };
    let running = tokio::spawn(Worker::new(Arc::clone(&fake), spread(), pipelined).run(stop_rx));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let submits = |calls: &[Call]| {
        calls
            .iter()
            .filter(|c| matches!(c, Call::Submit { .. }))
            .count()
    };
    while submits(&fake.calls()) < depth + 1 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", fake.calls());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    let calls = fake.calls();
    let dequeues = calls
        .iter()
        .filter(|c| matches!(c, Call::Dequeue(..)))
        .count();
    assert_eq!(dequeues, depth + 1, "{calls:?}");
    assert!(
        !calls.iter().any(|c| matches!(c, Call::Ack(..))),
        "{calls:?}"
    );
    assert_eq!(
        calls
            .iter()
            .filter(|c| matches!(c, Call::Complete(_)))
            .count(),
        depth,
        "{depth} records at a time: {calls:?}"
    );

    let mut acks = fake.acks.subscribe();
    gate.add_permits(3);
    acks.wait_for(|&n| n == 3).await.expect("acks");
    stop_tx.send(true).expect("worker listening");
    let stats = running.await.expect("worker task");
    assert_eq!(stats.evals_completed, 3);
    let calls = fake.calls();
    let position = |wanted: &dyn Fn(&Call) -> bool| calls.iter().position(wanted);
    for pair in evals.windows(depth + 1) {
        let acked = position(&|c| matches!(c, Call::Ack(id, _) if *id == pair[0].id));
        let recorded = position(&|c| matches!(c, Call::Complete(e) if e.id == pair[depth].id));
        assert!(acked < recorded, "settled in order: {calls:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_stopped_worker_settles_the_evaluation_it_was_recording() {
    let (fake, _eval) = setup(1, 1);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    fake.lock().complete_gate = Some(Arc::clone(&gate));
    let (stop_tx, stop_rx) = watch::channel(false);
    let running = tokio::spawn(Worker::new(Arc::clone(&fake), binpack(), config()).run(stop_rx));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !fake.calls().iter().any(|c| matches!(c, Call::Complete(_))) {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    stop_tx.send(true).expect("worker listening");
    gate.add_permits(1);
    let stats = running.await.expect("worker task");
    assert_eq!(stats.evals_completed, 1);
    assert!(fake.calls().iter().any(|c| matches!(c, Call::Ack(..))));
}
