//! `ask` and `ask_timeout`: the answer, a timeout, a dropped reply, an ended process.

use std::time::Duration;

use muster_actor::{AskError, Context, ExitReason, Process, Reply, System, TellError};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::support::{Told, poll_once};

#[derive(Default)]
struct Keeper {
    /// Replies it keeps without answering, so the asker waits until its timeout.
    held: Vec<Reply<u32>>,
}

enum KeeperMsg {
    Double(u32, Reply<u32>),
    /// Keeps the reply and never answers.
    Hold(Reply<u32>),
    /// Drops the reply without answering.
    Ignore(Reply<u32>),
    /// How many replies it holds.
    Held(Reply<usize>),
    /// Nothing to do; a message without a reply.
    Note(u32),
    /// Signals `entered`, then waits for `gate` before taking the next message.
    Block {
        entered: oneshot::Sender<()>,
        gate: oneshot::Receiver<()>,
    },
}

impl Process for Keeper {
    type Message = KeeperMsg;

    async fn handle(&mut self, msg: KeeperMsg, _ctx: &mut Context<Self>) {
        match msg {
            KeeperMsg::Double(n, reply) => reply.send(2 * n),
            KeeperMsg::Hold(reply) => self.held.push(reply),
            KeeperMsg::Ignore(reply) => drop(reply),
            KeeperMsg::Held(reply) => reply.send(self.held.len()),
            KeeperMsg::Note(_) => {}
            KeeperMsg::Block { entered, gate } => {
                let _ = entered.send(());
                let _ = gate.await;
            }
        }
    }
}

#[tokio::test]
async fn ask_returns_the_handlers_answer() -> anyhow::Result<()> {
    let system = System::new();
    let keeper = system.spawn(Keeper::default());

    assert_eq!(keeper.ask(|reply| KeeperMsg::Double(21, reply)).await?, 42);
    assert_eq!(
        keeper
            .ask_timeout(Duration::from_secs(1), |reply| KeeperMsg::Double(4, reply))
            .await?,
        8
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn ask_timeout_expires_while_the_handler_keeps_the_reply() -> anyhow::Result<()> {
    let system = System::new();
    let keeper = system.spawn(Keeper::default());
    let start = Instant::now();

    let err = keeper
        .ask_timeout(Duration::from_secs(1), KeeperMsg::Hold)
        .await
        .unwrap_err();

    assert_eq!(err, AskError::Timeout(Duration::from_secs(1)));
    assert!(start.elapsed() >= Duration::from_secs(1), "timed out early");
    // The process still holds the reply and still serves.
    assert_eq!(keeper.ask(KeeperMsg::Held).await?, 1);
    assert!(keeper.is_alive());
    Ok(())
}

#[tokio::test]
async fn ask_fails_with_no_reply_when_the_handler_drops_it() -> anyhow::Result<()> {
    let system = System::new();
    let keeper = system.spawn(Keeper::default());

    assert_eq!(
        keeper.ask(KeeperMsg::Ignore).await.unwrap_err(),
        AskError::NoReply
    );
    // Dropping a reply is not a failure of the process.
    assert_eq!(keeper.ask(|reply| KeeperMsg::Double(1, reply)).await?, 2);
    Ok(())
}

#[tokio::test]
async fn ask_to_a_terminated_process_fails_with_stopped() -> anyhow::Result<()> {
    let system = System::new();
    let keeper = system.spawn(Keeper::default());
    keeper.terminate();
    assert_eq!(keeper.wait().await, ExitReason::Terminated);

    assert_eq!(
        keeper
            .ask(|reply| KeeperMsg::Double(1, reply))
            .await
            .unwrap_err(),
        AskError::Stopped
    );
    assert_eq!(
        keeper.dispatch(|_, _| ()).await.unwrap_err(),
        AskError::Stopped
    );
    match keeper.tell(KeeperMsg::Note(7)) {
        Err(TellError::Stopped(KeeperMsg::Note(7))) => {}
        other => panic!("expected Stopped with the message back, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn asks_queued_when_a_process_is_terminated_fail_with_stopped() -> anyhow::Result<()> {
    let system = System::new();
    let keeper = system.spawn(Keeper::default());
    let (entered, entered_rx) = oneshot::channel();
    let (open_gate, gate) = oneshot::channel();
    keeper.tell(KeeperMsg::Block { entered, gate }).told()?;
    entered_rx.await?;

    let mut queued = std::pin::pin!(keeper.ask(|reply| KeeperMsg::Double(1, reply)));
    assert!(
        poll_once(&mut queued).await.is_none(),
        "answered while blocked"
    );
    keeper.terminate();
    let _ = open_gate.send(());

    assert_eq!(queued.await.unwrap_err(), AskError::Stopped);
    assert_eq!(keeper.wait().await, ExitReason::Terminated);
    Ok(())
}

#[tokio::test]
async fn an_ask_already_taken_from_the_queue_fails_with_stopped_when_termination_comes_first()
-> anyhow::Result<()> {
    let system = System::new();
    let keeper = system.spawn(Keeper::default());
    // Both queued before the process first runs, so it takes them from the queue together and
    // holds the ask while it handles `Block`.
    let (entered, entered_rx) = oneshot::channel();
    let (open_gate, gate) = oneshot::channel();
    keeper.tell(KeeperMsg::Block { entered, gate }).told()?;
    let mut taken = std::pin::pin!(keeper.ask(|reply| KeeperMsg::Double(1, reply)));
    assert!(poll_once(&mut taken).await.is_none(), "answered too soon");
    entered_rx.await?;
    assert_eq!(keeper.queued(), 1, "the ask waits in the process's batch");

    keeper.terminate();
    let _ = open_gate.send(());

    assert_eq!(taken.await.unwrap_err(), AskError::Stopped);
    assert_eq!(keeper.wait().await, ExitReason::Terminated);
    assert_eq!(
        system.dead_letters(),
        1,
        "the unhandled ask is counted once"
    );
    Ok(())
}
