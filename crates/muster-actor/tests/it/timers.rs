//! Timers on tokio's paused clock: `delay`, `interval`, `TimerHandle::cancel`.

use std::time::Duration;

use muster_actor::{Context, Pid, Process, Reply, System, TimerHandle};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::support::Told;

const MS: Duration = Duration::from_millis(1);

/// Records when each `Fire` or `Tick` arrived, as an offset from `start`, and reports it.
struct Clocked {
    start: Instant,
    arrivals: Vec<Duration>,
    arrived: mpsc::UnboundedSender<Duration>,
    timer: Option<TimerHandle>,
}

enum ClockedMsg {
    Fire,
    Tick,
    /// Schedules `Fire` after `delay`, then keeps the process busy for `busy` (virtual time),
    /// like a handler doing work after setting a timer.
    DelayThenWork {
        delay: Duration,
        busy: Duration,
    },
    /// Starts ticking every `period`, then keeps the process busy for `busy`.
    IntervalThenWork {
        period: Duration,
        busy: Duration,
    },
    Arrivals(Reply<Vec<Duration>>),
}

impl Process for Clocked {
    type Message = ClockedMsg;

    async fn handle(&mut self, msg: ClockedMsg, ctx: &mut Context<Self>) {
        match msg {
            ClockedMsg::Fire | ClockedMsg::Tick => {
                let at = self.start.elapsed();
                self.arrivals.push(at);
                let _ = self.arrived.send(at);
            }
            ClockedMsg::DelayThenWork { delay, busy } => {
                ctx.delay(delay, ClockedMsg::Fire);
                tokio::time::advance(busy).await;
            }
            ClockedMsg::IntervalThenWork { period, busy } => {
                self.timer = Some(ctx.interval(period, || ClockedMsg::Tick));
                tokio::time::advance(busy).await;
            }
            ClockedMsg::Arrivals(reply) => reply.send(self.arrivals.clone()),
        }
    }
}

fn spawn_clocked(system: &System) -> (Pid<Clocked>, mpsc::UnboundedReceiver<Duration>) {
    let (arrived, rx) = mpsc::unbounded_channel();
    let pid = system.spawn(Clocked {
        start: Instant::now(),
        arrivals: Vec::new(),
        arrived,
        timer: None,
    });
    (pid, rx)
}

#[tokio::test(start_paused = true)]
async fn delay_delivers_after_the_delay_and_not_before() -> anyhow::Result<()> {
    let system = System::new();
    let (pid, mut arrived) = spawn_clocked(&system);
    pid.dispatch(|_, ctx| drop(ctx.delay(Duration::from_secs(1), ClockedMsg::Fire)))
        .await?;

    tokio::time::advance(999 * MS).await;
    // The ask is a barrier: anything delivered so far has been handled.
    assert!(pid.ask(ClockedMsg::Arrivals).await?.is_empty());
    assert!(arrived.try_recv().is_err(), "delivered before 1 s");

    tokio::time::advance(MS).await;
    assert_eq!(arrived.recv().await, Some(Duration::from_secs(1)));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn delay_counts_from_the_call_not_from_when_the_timer_task_runs() -> anyhow::Result<()> {
    let system = System::new();
    let (pid, mut arrived) = spawn_clocked(&system);

    // The timer task cannot run before the handler yields, and the handler first spends
    // 400 ms: the delay must still end 1 s after `delay` was called.
    pid.tell(ClockedMsg::DelayThenWork {
        delay: Duration::from_secs(1),
        busy: 400 * MS,
    })
    .told()?;

    assert_eq!(arrived.recv().await, Some(Duration::from_secs(1)));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn interval_ticks_once_per_period_until_cancelled() -> anyhow::Result<()> {
    let system = System::new();
    let (pid, _arrived) = spawn_clocked(&system);
    pid.dispatch(|clocked, ctx| {
        clocked.timer = Some(ctx.interval(100 * MS, || ClockedMsg::Tick));
    })
    .await?;

    // On the paused clock, sleeping lets time pass tick by tick: every tick due before the
    // wake-up is delivered and handled first.
    tokio::time::sleep(1050 * MS).await;
    let expected: Vec<Duration> = (1..=10).map(|k| k * 100 * MS).collect();
    assert_eq!(pid.ask(ClockedMsg::Arrivals).await?, expected);

    let cancelled = pid
        .dispatch(|clocked, _| clocked.timer.take().map(|timer| timer.cancel()).is_some())
        .await?;
    assert!(cancelled);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(pid.ask(ClockedMsg::Arrivals).await?, expected);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn interval_counts_from_the_call_not_from_when_the_timer_task_runs() -> anyhow::Result<()> {
    let system = System::new();
    let (pid, _arrived) = spawn_clocked(&system);

    pid.tell(ClockedMsg::IntervalThenWork {
        period: 100 * MS,
        busy: 50 * MS,
    })
    .told()?;

    tokio::time::sleep(350 * MS).await;
    assert_eq!(
        pid.ask(ClockedMsg::Arrivals).await?,
        vec![100 * MS, 200 * MS, 300 * MS]
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_delay_is_never_delivered() -> anyhow::Result<()> {
    let system = System::new();
    let (pid, _arrived) = spawn_clocked(&system);
    let handle = pid
        .dispatch(|_, ctx| ctx.delay(Duration::from_secs(1), ClockedMsg::Fire))
        .await?;

    handle.cancel();
    tokio::time::sleep(Duration::from_secs(2)).await;

    assert!(pid.ask(ClockedMsg::Arrivals).await?.is_empty());
    assert!(handle.is_finished());
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn timers_stop_when_the_process_ends() -> anyhow::Result<()> {
    let system = System::new();
    let (pid, _arrived) = spawn_clocked(&system);
    let handle = pid
        .dispatch(|_, ctx| ctx.interval(100 * MS, || ClockedMsg::Tick))
        .await?;

    pid.terminate();
    pid.wait().await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // The first tick after the end finds the mailbox closed and ends the interval.
    assert!(handle.is_finished());
    Ok(())
}

#[tokio::test]
async fn an_interval_of_zero_panics_in_the_caller() -> anyhow::Result<()> {
    let system = System::new();
    let (pid, _arrived) = spawn_clocked(&system);

    // The documented panic happens in the handler that asked for the interval.
    let result = pid
        .dispatch(|_, ctx| drop(ctx.interval(Duration::ZERO, || ClockedMsg::Tick)))
        .await;

    assert_eq!(result.unwrap_err(), muster_actor::AskError::Stopped);
    assert!(matches!(
        pid.wait().await,
        muster_actor::ExitReason::Panicked(message) if message.contains("non-zero")
    ));
    Ok(())
}
