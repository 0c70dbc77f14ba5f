//! Bounded mailboxes: `Busy` hands the message back, `send` waits for room, control signals
//! bypass the bound, and an ended process answers `Stopped`.

use std::pin::pin;

use muster_actor::{Context, ExitReason, Process, Reply, System, TellError};
use tokio::sync::oneshot;

use crate::support::{Told, poll_once};

#[derive(Default)]
struct Slow {
    items: Vec<u32>,
}

enum SlowMsg {
    /// Signals `entered`, then waits for `gate`: the process takes nothing else meanwhile.
    Block {
        entered: oneshot::Sender<()>,
        gate: oneshot::Receiver<()>,
    },
    Item(u32),
    Items(Reply<Vec<u32>>),
}

impl Process for Slow {
    type Message = SlowMsg;

    async fn handle(&mut self, msg: SlowMsg, _ctx: &mut Context<Self>) {
        match msg {
            SlowMsg::Block { entered, gate } => {
                let _ = entered.send(());
                let _ = gate.await;
            }
            SlowMsg::Item(n) => self.items.push(n),
            SlowMsg::Items(reply) => reply.send(self.items.clone()),
        }
    }
}

/// Blocks `slow` inside a handler; the returned sender lets it go on.
async fn block(slow: &muster_actor::Pid<Slow>) -> anyhow::Result<oneshot::Sender<()>> {
    let (entered, entered_rx) = oneshot::channel();
    let (open, gate) = oneshot::channel();
    slow.tell(SlowMsg::Block { entered, gate }).told()?;
    entered_rx.await?;
    Ok(open)
}

#[tokio::test]
async fn a_full_bounded_mailbox_answers_busy_with_the_message() -> anyhow::Result<()> {
    let system = System::new();
    let slow = system.spawn_bounded(Slow::default(), 2);
    let open = block(&slow).await?;

    slow.tell(SlowMsg::Item(1)).told()?;
    slow.tell(SlowMsg::Item(2)).told()?;
    for n in [3, 4] {
        match slow.tell(SlowMsg::Item(n)) {
            Err(TellError::Busy(SlowMsg::Item(back))) => assert_eq!(back, n),
            other => panic!("expected Busy(Item({n})), got {other:?}"),
        }
    }

    // A dispatch is a control signal: it is queued even though the mailbox is full, and runs
    // after the two queued items.
    let mut items = pin!(slow.dispatch(|slow, _| slow.items.clone()));
    assert!(poll_once(&mut items).await.is_none(), "ran while blocked");
    let _ = open.send(());
    assert_eq!(items.await?, vec![1, 2]);

    // Drained: tells are taken again.
    slow.tell(SlowMsg::Item(5)).told()?;
    slow.tell(SlowMsg::Item(6)).told()?;
    assert_eq!(slow.ask(SlowMsg::Items).await?, vec![1, 2, 5, 6]);
    Ok(())
}

#[tokio::test]
async fn send_waits_for_room_in_a_full_mailbox() -> anyhow::Result<()> {
    let system = System::new();
    let slow = system.spawn_bounded(Slow::default(), 2);
    let open = block(&slow).await?;
    slow.tell(SlowMsg::Item(1)).told()?;
    slow.tell(SlowMsg::Item(2)).told()?;

    let mut sending = pin!(slow.send(SlowMsg::Item(3)));
    assert!(
        poll_once(&mut sending).await.is_none(),
        "send went through a full mailbox"
    );

    let _ = open.send(());
    sending.await.told()?;
    assert_eq!(slow.ask(SlowMsg::Items).await?, vec![1, 2, 3]);
    Ok(())
}

#[tokio::test]
async fn a_terminated_bounded_process_answers_stopped() -> anyhow::Result<()> {
    let system = System::new();
    let slow = system.spawn_bounded(Slow::default(), 2);
    let open = block(&slow).await?;
    slow.tell(SlowMsg::Item(1)).told()?;
    slow.tell(SlowMsg::Item(2)).told()?;

    // A sender waiting for room is released with `Stopped` when the process ends.
    let mut sending = pin!(slow.send(SlowMsg::Item(3)));
    assert!(poll_once(&mut sending).await.is_none());
    slow.terminate();
    let _ = open.send(());
    assert_eq!(slow.wait().await, ExitReason::Terminated);

    match sending.await {
        Err(TellError::Stopped(SlowMsg::Item(3))) => {}
        other => panic!("expected Stopped(Item(3)), got {other:?}"),
    }
    match slow.tell(SlowMsg::Item(4)) {
        Err(TellError::Stopped(SlowMsg::Item(4))) => {}
        other => panic!("expected Stopped(Item(4)), got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn queued_counts_what_waits_whether_queued_or_taken_in_a_batch() -> anyhow::Result<()> {
    let system = System::new();
    let slow = system.spawn(Slow::default());
    assert_eq!(slow.queued(), 0);
    let open_first = block(&slow).await?;
    assert_eq!(slow.queued(), 0, "the message being handled is not counted");

    // Queued behind the blocked handler: an item, a second block, two items.
    let (entered, entered_rx) = oneshot::channel();
    let (open_second, gate) = oneshot::channel();
    slow.tell(SlowMsg::Item(1)).told()?;
    slow.tell(SlowMsg::Block { entered, gate }).told()?;
    slow.tell(SlowMsg::Item(2)).told()?;
    slow.tell(SlowMsg::Item(3)).told()?;
    assert_eq!(slow.queued(), 4);

    // The process takes all four at once, handles the item and blocks on the second block:
    // the two items left in its batch still wait.
    let _ = open_first.send(());
    entered_rx.await?;
    assert_eq!(slow.queued(), 2);
    slow.tell(SlowMsg::Item(4)).told()?;
    assert_eq!(slow.queued(), 3);

    let _ = open_second.send(());
    assert_eq!(slow.ask(SlowMsg::Items).await?, vec![1, 2, 3, 4]);
    assert_eq!(slow.queued(), 0);
    Ok(())
}
