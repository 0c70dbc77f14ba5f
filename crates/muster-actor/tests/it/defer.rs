//! `defer`: a handler hands a future off and returns; the continuation runs on the process later.

use std::time::Duration;

use muster_actor::{Context, Process, Reply, System};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::support::Told;

#[derive(Default)]
struct Fetcher {
    value: Option<u32>,
    /// Requests started and not yet finished.
    pending: usize,
}

enum FetcherMsg {
    /// Waits for `source` off the process, then stores its value and tells `done`.
    Fetch {
        source: oneshot::Receiver<u32>,
        done: oneshot::Sender<()>,
    },
    /// Stores the value given after `after`, and tells `done` (dropped unsent if it never runs).
    FetchLater {
        after: Duration,
        value: u32,
        done: oneshot::Sender<Instant>,
    },
    State(Reply<(Option<u32>, usize)>),
}

impl Process for Fetcher {
    type Message = FetcherMsg;

    async fn handle(&mut self, msg: FetcherMsg, ctx: &mut Context<Self>) {
        match msg {
            FetcherMsg::Fetch { source, done } => {
                self.pending += 1;
                ctx.defer(source, move |fetcher: &mut Fetcher, _ctx, value| {
                    fetcher.value = value.ok();
                    fetcher.pending -= 1;
                    let _ = done.send(());
                });
            }
            FetcherMsg::FetchLater { after, value, done } => {
                self.pending += 1;
                ctx.defer(
                    tokio::time::sleep(after),
                    move |fetcher: &mut Fetcher, _, ()| {
                        fetcher.value = Some(value);
                        fetcher.pending -= 1;
                        let _ = done.send(Instant::now());
                    },
                );
            }
            FetcherMsg::State(reply) => reply.send((self.value, self.pending)),
        }
    }
}

#[tokio::test]
async fn a_deferred_future_does_not_block_the_process() -> anyhow::Result<()> {
    let system = System::new();
    let fetcher = system.spawn(Fetcher::default());
    let (source_tx, source) = oneshot::channel();
    let (done, finished) = oneshot::channel();

    fetcher.tell(FetcherMsg::Fetch { source, done }).told()?;

    // The handler has returned: the process answers while the future is pending.
    assert_eq!(fetcher.ask(FetcherMsg::State).await?, (None, 1));

    source_tx
        .send(7)
        .map_err(|_| anyhow::anyhow!("deferred future dropped"))?;
    finished.await?;
    assert_eq!(fetcher.ask(FetcherMsg::State).await?, (Some(7), 0));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_deferred_timer_continues_on_the_process_when_it_fires() -> anyhow::Result<()> {
    let system = System::new();
    let fetcher = system.spawn(Fetcher::default());
    let start = Instant::now();
    let (done, finished) = oneshot::channel();

    fetcher
        .tell(FetcherMsg::FetchLater {
            after: Duration::from_secs(5),
            value: 9,
            done,
        })
        .told()?;
    assert_eq!(fetcher.ask(FetcherMsg::State).await?, (None, 1));

    let ran_at = finished.await?;
    assert!(ran_at - start >= Duration::from_secs(5), "continued early");
    assert_eq!(fetcher.ask(FetcherMsg::State).await?, (Some(9), 0));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_continuation_is_dropped_once_the_process_has_ended() -> anyhow::Result<()> {
    let system = System::new();
    let fetcher = system.spawn(Fetcher::default());
    let (done, finished) = oneshot::channel();
    fetcher
        .tell(FetcherMsg::FetchLater {
            after: Duration::from_secs(1),
            value: 1,
            done,
        })
        .told()?;
    assert_eq!(fetcher.ask(FetcherMsg::State).await?, (None, 1));

    fetcher.terminate();
    fetcher.wait().await;

    // The timer still fires, but the continuation (and the `done` it owns) is dropped unrun.
    assert!(
        finished.await.is_err(),
        "continuation ran on an ended process"
    );
    Ok(())
}

/// Publishes its count after everything it handles, whichever way the count changed.
struct Published {
    count: u32,
    out: tokio::sync::watch::Sender<u32>,
}

enum PublishedMsg {
    /// Adds one now.
    Add,
    /// Adds one when `source` is ready, in a continuation.
    AddLater(oneshot::Receiver<()>),
}

impl Process for Published {
    type Message = PublishedMsg;

    async fn handle(&mut self, msg: PublishedMsg, ctx: &mut Context<Self>) {
        match msg {
            PublishedMsg::Add => self.count += 1,
            PublishedMsg::AddLater(source) => {
                ctx.defer(source, |published: &mut Published, _, _| {
                    published.count += 1;
                });
            }
        }
    }

    fn settled(&mut self, _ctx: &mut Context<Self>) {
        self.out.send_replace(self.count);
    }
}

#[tokio::test]
async fn settled_runs_after_messages_and_continuations_alike() -> anyhow::Result<()> {
    let system = System::new();
    let (out, mut seen) = tokio::sync::watch::channel(0);
    let pid = system.spawn(Published { count: 0, out });
    pid.tell(PublishedMsg::Add)?;
    tokio::time::timeout(Duration::from_secs(10), seen.wait_for(|&n| n == 1)).await??;
    let (ready, source) = oneshot::channel();
    pid.tell(PublishedMsg::AddLater(source))?;
    let _ = ready.send(());
    // Only the continuation moves the count to 2; no message follows it.
    tokio::time::timeout(Duration::from_secs(10), seen.wait_for(|&n| n == 2)).await??;
    system.shutdown().await;
    Ok(())
}
