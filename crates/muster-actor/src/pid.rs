//! [`Pid`]: the typed handle to a local process — tell, ask, dispatch, terminate, wait.

use std::fmt;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;

use crate::exit::ExitWatcher;
use crate::mailbox::{Envelope, Mailbox};
use crate::{AskError, Context, ExitReason, Process, ProcessId, ProcessRef, Reply, TellError};

/// A typed handle to a local process. Cheap to clone; every clone names the same process.
///
/// A process lives until it stops itself, is terminated, panics, or its system shuts down;
/// dropping every `Pid` does not stop it (as in libprocess).
pub struct Pid<P: Process> {
    pub(crate) inner: Arc<Shared<P>>,
}

/// State shared between a process's task and every handle to it.
///
/// Every process has one, so it is kept small: the end's reason, its watchers and a pending
/// termination live under the mailbox's lock (see [`crate::mailbox`]).
pub(crate) struct Shared<P: Process> {
    pub(crate) id: ProcessId,
    pub(crate) mailbox: Mailbox<P>,
    /// Set once the watchers have run; `wait` returns only after that.
    announced: AtomicBool,
    /// Set by the first `wait` that has to park: only then does the end wake `exited`.
    awaited: AtomicBool,
    exited: Notify,
    /// User messages that were still queued when the process ended.
    pub(crate) undelivered: AtomicUsize,
    /// Runs after each handled user message; set once by a pool to track its members' load.
    pub(crate) after_message: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl<P: Process> Shared<P> {
    pub(crate) fn new(id: ProcessId, mailbox: Mailbox<P>) -> Self {
        Shared {
            id,
            mailbox,
            announced: AtomicBool::new(false),
            awaited: AtomicBool::new(false),
            exited: Notify::new(),
            undelivered: AtomicUsize::new(0),
            after_message: OnceLock::new(),
        }
    }

    /// Tells the watchers taken as the mailbox closed (with the reason recorded there), then
    /// the waiters. Called once, by the process's task.
    ///
    /// Watchers go first, so that once `wait` returns every linked process has its exit notice
    /// queued: a message sent to it afterwards arrives after the notice.
    pub(crate) fn announce(&self, reason: &ExitReason, watchers: Vec<ExitWatcher>) {
        for watcher in watchers {
            watcher(reason);
        }
        // SeqCst with `wait`'s two steps: either it sees the announcement, or this sees that it
        // parked (and its waiter is registered with `exited` by then).
        self.announced.store(true, Ordering::SeqCst);
        if self.awaited.load(Ordering::SeqCst) {
            self.exited.notify_waiters();
        }
    }

    /// Runs `watcher` when the process ends, or now if it already has.
    pub(crate) fn on_exit(&self, watcher: ExitWatcher) {
        self.mailbox.on_exit(watcher);
    }

    pub(crate) fn request_terminate(&self, reason: ExitReason) {
        self.mailbox.request_termination(reason);
    }

    pub(crate) async fn wait(&self) -> ExitReason {
        // Fast path, without registering with `exited` (a lock to insert, one to remove).
        if let Some(reason) = self.announced_exit() {
            return reason;
        }
        let mut notified = pin!(self.exited.notified());
        notified.as_mut().enable();
        self.awaited.store(true, Ordering::SeqCst);
        if let Some(reason) = self.announced_exit() {
            return reason;
        }
        notified.await;
        self.mailbox.exit_reason().unwrap_or(ExitReason::Normal)
    }

    /// The exit reason, once the end has been announced to every watcher.
    fn announced_exit(&self) -> Option<ExitReason> {
        if self.announced.load(Ordering::SeqCst) {
            self.mailbox.exit_reason()
        } else {
            None
        }
    }
}

impl<P: Process> Pid<P> {
    /// This process's id.
    pub fn id(&self) -> ProcessId {
        self.inner.id
    }

    /// Moves `msg` into the mailbox without waiting.
    ///
    /// # Errors
    /// [`TellError::Busy`] if a bounded mailbox is full, [`TellError::Stopped`] if the process
    /// has ended; either way the message comes back.
    pub fn tell(&self, msg: P::Message) -> Result<(), TellError<P::Message>> {
        self.inner.mailbox.try_send(msg)
    }

    /// Moves `msgs` into the mailbox in order, under one lock of it, without waiting: a
    /// transport delivering a frame's run of messages to one process wakes it once. Those
    /// that find a bounded mailbox full, or the process ended, go to `refused`, in order.
    pub fn tell_all(&self, msgs: Vec<P::Message>, refused: impl FnMut(TellError<P::Message>)) {
        self.inner.mailbox.try_send_all(msgs, refused);
    }

    /// Runs `watcher` with the process's exit reason when it ends (at once if it has): how a
    /// transport forgets a process's name when the process ends.
    pub fn on_exit(&self, watcher: impl FnOnce(&ExitReason) + Send + 'static) {
        self.inner.on_exit(Box::new(watcher));
    }

    /// Moves `msg` into the mailbox, waiting for room if a bounded mailbox is full.
    ///
    /// # Errors
    /// [`TellError::Stopped`] with the message if the process has ended.
    ///
    /// # Cancel safety
    /// Cancelling while waiting for room drops `msg` and queues nothing.
    pub async fn send(&self, msg: P::Message) -> Result<(), TellError<P::Message>> {
        self.inner.mailbox.send(msg).await
    }

    /// Sends the request built by `make` and waits for the handler's answer.
    ///
    /// `make` receives the [`Reply`] to put in the message: `pid.ask(Msg::Get)`.
    /// Waits for room in a bounded mailbox, like [`send`](Pid::send).
    ///
    /// # Errors
    /// [`AskError::Stopped`] if the process ended before handling the request,
    /// [`AskError::NoReply`] if the handler dropped the reply (returning without answering, or
    /// panicking).
    ///
    /// # Cancel safety
    /// Cancelling drops the request if it was not queued yet, and the answer if it was.
    pub async fn ask<R>(&self, make: impl FnOnce(Reply<R>) -> P::Message) -> Result<R, AskError> {
        let (reply, answer) = Reply::local();
        if self.send(make(reply)).await.is_err() {
            return Err(AskError::Stopped);
        }
        match answer.await {
            Ok(value) => Ok(value),
            // The queue closes before queued requests are dropped, so this is decided.
            Err(_dropped) if self.inner.mailbox.is_closed() => Err(AskError::Stopped),
            Err(_dropped) => Err(AskError::NoReply),
        }
    }

    /// [`ask`](Pid::ask) with a deadline.
    ///
    /// # Errors
    /// As `ask`, plus [`AskError::Timeout`] when no answer came within `timeout`.
    ///
    /// # Cancel safety
    /// As `ask`.
    pub async fn ask_timeout<R>(
        &self,
        timeout: Duration,
        make: impl FnOnce(Reply<R>) -> P::Message,
    ) -> Result<R, AskError> {
        tokio::time::timeout(timeout, self.ask(make))
            .await
            .unwrap_or(Err(AskError::Timeout(timeout)))
    }

    /// Runs `f` on the process, between two messages, and returns its result.
    ///
    /// The closure bypasses the mailbox bound, like every control signal.
    ///
    /// # Errors
    /// [`AskError::Stopped`] if the process ended before running it.
    pub async fn dispatch<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut P, &mut Context<P>) -> R + Send + 'static,
    ) -> Result<R, AskError> {
        let (reply, answer) = Reply::local();
        let queued = self.inner.mailbox.signal(Envelope::Dispatch(Box::new(
            move |process: &mut P, ctx: &mut Context<P>| reply.send(f(process, ctx)),
        )));
        if !queued {
            return Err(AskError::Stopped);
        }
        answer.await.map_err(|_| AskError::Stopped)
    }

    /// Asks the process to end after its current message, with [`ExitReason::Terminated`].
    /// Messages still queued are counted as undelivered. Idempotent.
    pub fn terminate(&self) {
        self.inner.request_terminate(ExitReason::Terminated);
    }

    /// Waits until the process has ended and returns why.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn wait(&self) -> ExitReason {
        self.inner.wait().await
    }

    /// Why the process ended, or `None` while it runs. It is set as the mailbox closes, a
    /// moment before the process leaves its system's count and its linked processes hear of
    /// it; after [`wait`](Pid::wait) returns, all of that has happened.
    pub fn exit_reason(&self) -> Option<ExitReason> {
        self.inner.mailbox.exit_reason()
    }

    /// True while the process runs (see [`exit_reason`](Pid::exit_reason) for when it turns).
    pub fn is_alive(&self) -> bool {
        !self.inner.mailbox.is_closed()
    }

    /// How many envelopes wait in the process's mailbox: user messages, asks, dispatches and
    /// deferred continuations not yet handled (the one being handled is not counted). A
    /// moment's figure, for metrics: it may be stale as soon as it is read.
    pub fn queued(&self) -> usize {
        self.inner.mailbox.depth()
    }

    /// The reference linked processes receive in `exited`.
    pub fn process_ref(&self) -> ProcessRef {
        ProcessRef::Local(self.inner.id)
    }
}

impl<P: Process> Clone for Pid<P> {
    fn clone(&self) -> Self {
        Pid {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<P: Process> PartialEq for Pid<P> {
    fn eq(&self, other: &Self) -> bool {
        self.inner.id == other.inner.id
    }
}

impl<P: Process> Eq for Pid<P> {}

impl<P: Process> fmt::Debug for Pid<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Pid").field(&self.inner.id.0).finish()
    }
}

/// What a [`System`](crate::System) needs of any process, whatever its type.
pub(crate) trait Control: Send + Sync {
    fn terminate_with(&self, reason: ExitReason);
    fn undelivered(&self) -> usize;
    fn wait_boxed(&self) -> futures_util::future::BoxFuture<'_, ExitReason>;
}

impl<P: Process> Control for Shared<P> {
    fn terminate_with(&self, reason: ExitReason) {
        self.request_terminate(reason);
    }

    fn undelivered(&self) -> usize {
        self.undelivered.load(Ordering::Acquire)
    }

    fn wait_boxed(&self) -> futures_util::future::BoxFuture<'_, ExitReason> {
        Box::pin(self.wait())
    }
}
