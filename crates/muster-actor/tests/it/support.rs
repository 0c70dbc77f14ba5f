//! Helpers shared by the test modules: polling a future exactly once, turning a failed tell into
//! an error, and a process that reports the exits it hears of.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use muster_actor::{Context, ExitReason, Process, ProcessRef, Reply, TellError};
use tokio::sync::mpsc;

/// Polls `future` once: `Some(output)` if it finished, `None` if it is pending.
///
/// Lets a test start an operation (queue an ask, start a shutdown, wait for mailbox room) and
/// check that it is still pending, without spawning it or sleeping.
pub(crate) async fn poll_once<F: Future + Unpin>(future: &mut F) -> Option<F::Output> {
    std::future::poll_fn(|cx| match Pin::new(&mut *future).poll(cx) {
        Poll::Ready(output) => Poll::Ready(Some(output)),
        Poll::Pending => Poll::Ready(None),
    })
    .await
}

/// `?` for tells: messages holding a [`Reply`] are not `Sync`, so their `TellError` cannot
/// become an `anyhow::Error` directly.
pub(crate) trait Told {
    fn told(self) -> anyhow::Result<()>;
}

impl<M> Told for Result<(), TellError<M>> {
    fn told(self) -> anyhow::Result<()> {
        self.map_err(|err| anyhow::anyhow!("tell failed: {err}"))
    }
}

/// A process that forwards every `exited` notice it gets to the test, and answers pings to
/// show it is alive.
pub(crate) struct Watcher {
    exits: mpsc::UnboundedSender<(ProcessRef, ExitReason)>,
    /// How many notices it has had, for `Ping`.
    heard: usize,
}

/// What a [`Watcher`] handles.
pub(crate) enum WatcherMsg {
    /// Answers with how many exits it has heard of so far.
    Ping(Reply<usize>),
}

impl Watcher {
    /// A watcher, and the receiving end of the exits it hears of.
    pub(crate) fn new() -> (Self, mpsc::UnboundedReceiver<(ProcessRef, ExitReason)>) {
        let (exits, rx) = mpsc::unbounded_channel();
        (Watcher { exits, heard: 0 }, rx)
    }
}

impl Process for Watcher {
    type Message = WatcherMsg;

    async fn handle(&mut self, msg: WatcherMsg, _ctx: &mut Context<Self>) {
        match msg {
            WatcherMsg::Ping(reply) => reply.send(self.heard),
        }
    }

    fn exited(&mut self, who: ProcessRef, reason: ExitReason, _ctx: &mut Context<Self>) {
        self.heard += 1;
        let _ = self.exits.send((who, reason));
    }
}
