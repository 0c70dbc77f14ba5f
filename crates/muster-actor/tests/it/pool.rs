//! Pools: answers come back, loads drain, and (as in the nanomsg load-balancing test,
//! art4711/nanomsg-lb-test) one slow member does not hold up a burst under least-loaded routing
//! the way it does under round-robin.

use std::time::Duration;

use muster_actor::{Context, Pool, PoolBuilder, Process, Reply, Routing, System};
use tokio::time::Instant;

/// A pool member that answers with its index and the square of the request.
struct Worker {
    index: usize,
    cost: Cost,
}

/// What a request costs a member, on tokio time.
#[derive(Clone, Copy)]
enum Cost {
    /// Waits on a timer: other members run meanwhile.
    Sleep(Duration),
    /// Busy, as if computing: the (paused) clock moves on by this much while the member works.
    ///
    /// Tokio timers have a resolution of 1 ms, so `sleep(10 µs)` costs a whole millisecond of
    /// paused time; with four fast members, 99 such requests would need about 1.3 s of queueing
    /// whatever the routing, and no pool could meet the test's 1.5 × bound. Advancing the clock
    /// keeps the fast requests at their 10 µs.
    Busy(Duration),
}

enum WorkerMsg {
    Work(u64, Reply<(usize, u64)>),
}

impl Process for Worker {
    type Message = WorkerMsg;

    async fn handle(&mut self, msg: WorkerMsg, _ctx: &mut Context<Self>) {
        match msg {
            WorkerMsg::Work(n, reply) => {
                match self.cost {
                    Cost::Sleep(cost) => tokio::time::sleep(cost).await,
                    Cost::Busy(cost) => tokio::time::advance(cost).await,
                }
                reply.send((self.index, n * n));
            }
        }
    }
}

const SLOW: Duration = Duration::from_secs(2);
const FAST: Duration = Duration::from_micros(10);
const REQUESTS: u64 = 100;

/// The nanomsg load-balancing test's shape: member 0 takes 2 s per request, the other four 10 µs.
fn slow_member_pool(system: &System, routing: Routing) -> Pool<Worker> {
    PoolBuilder::new(5)
        .routing(routing)
        .spawn(system, |index| Worker {
            index,
            cost: if index == 0 {
                Cost::Sleep(SLOW)
            } else {
                Cost::Busy(FAST)
            },
        })
}

/// Issues `REQUESTS` requests at once, each from its own task, and sums their latencies.
async fn burst(pool: &Pool<Worker>) -> anyhow::Result<Duration> {
    let tasks: Vec<_> = (0..REQUESTS)
        .map(|n| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                let answer = pool.ask(|reply| WorkerMsg::Work(n, reply)).await;
                (answer, start.elapsed())
            })
        })
        .collect();
    let mut total = Duration::ZERO;
    for (n, task) in (0..REQUESTS).zip(tasks) {
        let ((_, square), latency) = match task.await? {
            (Ok(answer), latency) => (answer, latency),
            (Err(err), _) => anyhow::bail!("request {n} failed: {err}"),
        };
        assert_eq!(square, n * n);
        total += latency;
    }
    Ok(total)
}

/// The sum of latencies if no request ever waited: 99 fast requests and one slow one.
fn ideal_total() -> Duration {
    SLOW + FAST * (REQUESTS as u32 - 1)
}

#[tokio::test(start_paused = true)]
async fn seed_004_least_loaded_keeps_a_burst_off_the_slow_member() -> anyhow::Result<()> {
    let system = System::new();
    let pool = slow_member_pool(&system, Routing::LeastLoaded);

    let total = burst(&pool).await?;

    println!(
        "least-loaded: total latency {total:?} for {REQUESTS} requests (ideal {:?})",
        ideal_total()
    );
    assert!(
        total.as_secs_f64() <= 1.5 * ideal_total().as_secs_f64(),
        "least-loaded total latency {total:?} exceeds 1.5 × {:?}",
        ideal_total()
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn seed_004_round_robin_queues_a_fifth_of_the_burst_on_the_slow_member() -> anyhow::Result<()>
{
    let system = System::new();
    let pool = slow_member_pool(&system, Routing::RoundRobin);

    let total = burst(&pool).await?;

    println!(
        "round-robin: total latency {total:?} for {REQUESTS} requests (ideal {:?})",
        ideal_total()
    );
    // Member 0 gets every fifth request: 20 queued requests waiting 2, 4, …, 40 s ≈ 420 s.
    assert!(
        total.as_secs_f64() >= 10.0 * ideal_total().as_secs_f64(),
        "round-robin total latency {total:?} is below 10 × {:?}",
        ideal_total()
    );
    Ok(())
}

#[tokio::test]
async fn pool_answers_and_its_loads_drain_back_to_zero() -> anyhow::Result<()> {
    let system = System::new();
    let pool = PoolBuilder::new(3).spawn(&system, |index| Worker {
        index,
        cost: Cost::Sleep(Duration::ZERO),
    });

    let tasks: Vec<_> = (0..30u64)
        .map(|n| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.ask(|reply| WorkerMsg::Work(n, reply)).await })
        })
        .collect();
    let mut served_by = [0usize; 3];
    for (n, task) in (0..30u64).zip(tasks) {
        let (index, square) = task.await??;
        assert_eq!(square, n * n);
        served_by[index] += 1;
    }
    assert_eq!(served_by.iter().sum::<usize>(), 30);

    // A dispatch on each member runs after its last request's bookkeeping.
    for member in pool.members() {
        member.dispatch(|_, _| ()).await?;
    }
    assert_eq!(pool.loads(), vec![0, 0, 0]);
    assert_eq!(pool.backlog(), 0);
    Ok(())
}

#[tokio::test]
async fn ended_members_are_routed_around_and_a_pool_with_none_left_says_stopped() {
    let system = System::new();
    for routing in [Routing::LeastLoaded, Routing::RoundRobin] {
        let pool = PoolBuilder::new(3)
            .routing(routing)
            .spawn(&system, |index| Worker {
                index,
                cost: Cost::Sleep(Duration::ZERO),
            });
        let members = pool.members();
        members[0].terminate();
        members[0].wait().await;
        for n in 0..20 {
            let (index, square) = pool
                .ask(|reply| WorkerMsg::Work(n, reply))
                .await
                .expect("a live member answers");
            assert_ne!(index, 0, "{routing:?} routed to the ended member");
            assert_eq!(square, n * n);
        }
        for member in &members[1..] {
            member.terminate();
            member.wait().await;
        }
        let asked = pool.ask(|reply| WorkerMsg::Work(2, reply)).await;
        assert_eq!(asked, Err(muster_actor::AskError::Stopped), "{routing:?}");
    }
}

#[tokio::test]
async fn a_message_told_to_a_member_directly_does_not_wedge_the_pool() {
    let system = System::new();
    let pool = PoolBuilder::new(1).spawn(&system, |index| Worker {
        index,
        cost: Cost::Sleep(Duration::ZERO),
    });
    let member = &pool.members()[0];
    let (index, square) = member
        .ask(|reply| WorkerMsg::Work(3, reply))
        .await
        .expect("the member answers");
    assert_eq!((index, square), (0, 9));
    assert_eq!(
        pool.loads(),
        vec![0],
        "an unrouted message is not released twice"
    );
    let answer = pool.ask(|reply| WorkerMsg::Work(4, reply)).await;
    assert_eq!(answer, Ok((0, 16)));
}
