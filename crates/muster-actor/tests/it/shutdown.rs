//! `System::shutdown`: every process ends with `Shutdown`, and undelivered messages are counted.

use std::pin::pin;
use std::time::Duration;

use muster_actor::{
    AskError, Context, ExitReason, Process, Reply, Restart, ShutdownReport, Supervisor,
    SupervisorMsg, System, TellError,
};
use tokio::sync::oneshot;

use crate::support::{Told, poll_once};

/// Handles `Item`s, but can be made to wait inside a handler first.
#[derive(Default)]
struct Stuck {
    items: Vec<u32>,
}

enum StuckMsg {
    /// Signals `entered`, then waits for `gate`.
    Block {
        entered: oneshot::Sender<()>,
        gate: oneshot::Receiver<()>,
    },
    Item(u32),
    Items(Reply<Vec<u32>>),
}

impl Process for Stuck {
    type Message = StuckMsg;

    async fn handle(&mut self, msg: StuckMsg, _ctx: &mut Context<Self>) {
        match msg {
            StuckMsg::Block { entered, gate } => {
                let _ = entered.send(());
                let _ = gate.await;
            }
            StuckMsg::Item(n) => self.items.push(n),
            StuckMsg::Items(reply) => reply.send(self.items.clone()),
        }
    }
}

/// Blocks `stuck` inside a handler; the returned sender lets it go on.
async fn block(stuck: &muster_actor::Pid<Stuck>) -> anyhow::Result<oneshot::Sender<()>> {
    let (entered, entered_rx) = oneshot::channel();
    let (open, gate) = oneshot::channel();
    stuck.tell(StuckMsg::Block { entered, gate }).told()?;
    entered_rx.await?;
    Ok(open)
}

#[tokio::test]
async fn shutdown_ends_every_process_and_counts_what_was_left_queued() -> anyhow::Result<()> {
    let system = System::new();
    let idle = [
        system.spawn(Stuck::default()),
        system.spawn(Stuck::default()),
    ];
    let mut supervisor = Supervisor::new(3, Duration::from_secs(10));
    let child = supervisor.child("child", Restart::Permanent, Stuck::default);
    let supervisor = system.spawn(supervisor);
    assert_eq!(supervisor.ask(SupervisorMsg::Restarts).await?, 0);
    let child = child.pid().expect("started");

    // One process is stuck in a handler with three items and an ask queued behind it.
    let stuck = system.spawn(Stuck::default());
    let open = block(&stuck).await?;
    for n in 0..3 {
        stuck.tell(StuckMsg::Item(n)).told()?;
    }
    let mut queued_ask = pin!(stuck.ask(StuckMsg::Items));
    assert!(poll_once(&mut queued_ask).await.is_none());
    assert_eq!(system.len(), 5);

    // The first poll asks every process to stop; the stuck one finishes its handler first.
    let mut shutdown = pin!(system.shutdown());
    assert!(poll_once(&mut shutdown).await.is_none());
    let _ = open.send(());
    let report = shutdown.await;

    assert_eq!(
        report,
        ShutdownReport {
            processes: 5,
            undelivered: 4,
        }
    );
    assert!(system.is_empty());
    assert_eq!(system.dead_letters(), 4);
    for pid in idle.iter().chain([&stuck]) {
        assert_eq!(pid.wait().await, ExitReason::Shutdown);
    }
    assert_eq!(child.wait().await, ExitReason::Shutdown);
    assert_eq!(supervisor.wait().await, ExitReason::Shutdown);
    assert_eq!(queued_ask.await.unwrap_err(), AskError::Stopped);
    assert!(matches!(
        stuck.tell(StuckMsg::Item(9)),
        Err(TellError::Stopped(StuckMsg::Item(9)))
    ));
    Ok(())
}

#[tokio::test]
async fn shutdown_also_ends_processes_spawned_while_it_runs() -> anyhow::Result<()> {
    let system = System::new();
    let stuck = system.spawn(Stuck::default());
    let open = block(&stuck).await?;

    let mut shutdown = pin!(system.shutdown());
    assert!(poll_once(&mut shutdown).await.is_none());
    let late = system.spawn(Stuck::default());
    let _ = open.send(());

    assert_eq!(
        shutdown.await,
        ShutdownReport {
            processes: 2,
            undelivered: 0,
        }
    );
    assert_eq!(late.wait().await, ExitReason::Shutdown);
    assert!(system.is_empty());
    Ok(())
}

#[tokio::test]
async fn the_first_request_to_end_gives_the_reason_and_a_waiter_parked_before_the_end_hears_it()
-> anyhow::Result<()> {
    let system = System::new();
    let stuck = system.spawn(Stuck::default());
    let open = block(&stuck).await?;
    let mut waiting = pin!(stuck.wait());
    assert!(poll_once(&mut waiting).await.is_none());

    // Terminated first, then shut down: the first reason stands.
    stuck.terminate();
    let mut shutdown = pin!(system.shutdown());
    assert!(poll_once(&mut shutdown).await.is_none());
    assert!(stuck.is_alive());
    assert_eq!(stuck.exit_reason(), None);
    let _ = open.send(());

    assert_eq!(waiting.await, ExitReason::Terminated);
    assert_eq!(shutdown.await.processes, 1);
    // A request after the end changes nothing.
    stuck.terminate();
    assert!(!stuck.is_alive());
    assert_eq!(stuck.exit_reason(), Some(ExitReason::Terminated));
    assert_eq!(stuck.wait().await, ExitReason::Terminated);
    Ok(())
}

#[tokio::test]
async fn shutting_down_an_empty_system_reports_nothing() {
    let system = System::new();
    assert_eq!(system.shutdown().await, ShutdownReport::default());
    assert_eq!(system.dead_letters(), 0);
}
