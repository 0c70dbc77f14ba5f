//! The mailbox: what a process's queue carries, and the bound on user messages.
//!
//! A mailbox is a `VecDeque` behind a mutex, stored inline in the process's shared state: making
//! one allocates nothing, which keeps spawning cheap (a channel per process costs a heap block
//! of slots and a padded header). A sender holds the lock only to push; the receiver swaps the
//! whole queue out at once and works through the batch without touching the lock, so the two
//! sides rarely meet. The receiver's waker is taken by the first push after it went idle.
//!
//! A bounded mailbox puts a semaphore in front that counts user messages only, so control
//! signals (an exited notice, a dispatch, a stop) always get through even when it is full.
//!
//! The queue's lock also guards the process's end: why it was asked to end, why it ended, and
//! who wants to hear. Closing the queue and recording the end are then one step under one
//! lock, and a process's whole life takes a handful of lock operations.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::task::{Poll, Waker};

use tokio::sync::{Semaphore, TryAcquireError};

use crate::exit::ExitWatcher;
use crate::sync::lock;
use crate::{Context, ExitReason, Process, ProcessRef, TellError};

/// A closure run on the process, with its state and context.
pub(crate) type DispatchFn<P> = Box<dyn FnOnce(&mut P, &mut Context<P>) + Send>;

/// One item in a process's queue.
pub(crate) enum Envelope<P: Process> {
    /// A user message, handled by `Process::handle`.
    Message(P::Message),
    /// A closure to run on the process (dispatch, defer continuations).
    Dispatch(DispatchFn<P>),
    /// A linked process ended. Boxed because it is rare and large (~80 bytes): inline, it
    /// would make every mailbox slot that large, whatever the message size.
    Exited(Box<(ProcessRef, ExitReason)>),
}

/// How many user messages a mailbox holds before `tell` answers `Busy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MailboxCapacity {
    /// No limit: `tell` only fails once the process has stopped.
    #[default]
    Unbounded,
    /// At most this many queued user messages (at least 1; at most
    /// `tokio::sync::Semaphore::MAX_PERMITS`).
    Bounded(usize),
}

/// The queue, kept in the process's shared state.
pub(crate) struct Mailbox<P: Process> {
    queue: Mutex<Queue<Envelope<P>>>,
    /// Boxed: most mailboxes are unbounded, and every process pays for this field.
    limit: Option<Box<Semaphore>>,
    /// Envelopes the receiver has swapped out of the queue and not yet taken: with the
    /// queue's, the mailbox's depth ([`Mailbox::depth`]). Written only by the receiver.
    batched: AtomicUsize,
    /// The queue's [`End`] without its reason ([`RUNNING`], [`REQUESTED`] or [`ENDED`]),
    /// written under the lock: the receiver reads it before every envelope, and a pool before
    /// every message it routes, without taking the lock. Sequentially consistent, so that of
    /// two processes ending at once, each of which then looks at the other (a pool's members
    /// do), at least one sees the other ended.
    phase: AtomicU8,
}

/// [`Mailbox::phase`] while the process runs and nobody asked it to end.
const RUNNING: u8 = 0;
/// [`Mailbox::phase`] once the process has been asked to end.
const REQUESTED: u8 = 1;
/// [`Mailbox::phase`] once the process has ended.
const ENDED: u8 = 2;

struct Queue<T> {
    items: VecDeque<T>,
    /// The receiver, parked until the next push.
    receiver: Option<Waker>,
    /// Set by a termination request: the receiver's next wait returns without an envelope.
    interrupted: bool,
    /// Whether the process runs, was asked to end, or has ended (and takes nothing more).
    end: End,
    /// Who wants to hear about the end; taken as the queue closes.
    watchers: Vec<ExitWatcher>,
}

/// Where a process is in its life, as the mailbox sees it.
enum End {
    /// Running, and nobody has asked it to end.
    Running,
    /// Asked to end, for the first request's reason.
    Requested(ExitReason),
    /// Ended, for this reason: the queue is closed and later pushes fail.
    Ended(ExitReason),
}

impl End {
    /// This end as [`Mailbox::phase`] mirrors it.
    fn phase(&self) -> u8 {
        match self {
            End::Running => RUNNING,
            End::Requested(_) => REQUESTED,
            End::Ended(_) => ENDED,
        }
    }
}

impl<T> Queue<T> {
    fn is_closed(&self) -> bool {
        matches!(self.end, End::Ended(_))
    }
}

/// What closing a mailbox leaves for the process's task to finish outside the lock.
pub(crate) struct Closed {
    /// User messages that were queued and will never be handled.
    pub(crate) undelivered: usize,
    /// The watchers to tell about the end.
    pub(crate) watchers: Vec<ExitWatcher>,
}

/// The receiving side's current batch, owned by the process's task.
pub(crate) struct MailboxReceiver<P: Process> {
    batch: VecDeque<Envelope<P>>,
}

impl<P: Process> Mailbox<P> {
    pub(crate) fn new(capacity: MailboxCapacity) -> Self {
        let limit = match capacity {
            MailboxCapacity::Unbounded => None,
            MailboxCapacity::Bounded(n) => {
                Some(Box::new(Semaphore::new(n.clamp(1, Semaphore::MAX_PERMITS))))
            }
        };
        Mailbox {
            queue: Mutex::new(Queue {
                items: VecDeque::new(),
                receiver: None,
                interrupted: false,
                end: End::Running,
                watchers: Vec::new(),
            }),
            limit,
            batched: AtomicUsize::new(0),
            phase: AtomicU8::new(RUNNING),
        }
    }

    /// Envelopes waiting: queued, or swapped out by the receiver and not yet taken (the one
    /// being handled is not counted). A moment's figure, for metrics.
    pub(crate) fn depth(&self) -> usize {
        let queued = lock(&self.queue).items.len();
        queued + self.batched.load(Ordering::Relaxed)
    }

    /// Queues a user message without waiting.
    pub(crate) fn try_send(&self, msg: P::Message) -> Result<(), TellError<P::Message>> {
        if let Some(limit) = &self.limit {
            match limit.try_acquire() {
                Ok(permit) => permit.forget(),
                Err(TryAcquireError::NoPermits) => return Err(TellError::Busy(msg)),
                Err(TryAcquireError::Closed) => return Err(TellError::Stopped(msg)),
            }
        }
        self.push_message(msg)
    }

    /// Queues user messages in order, under one lock, without waiting. Those that find a
    /// bounded mailbox full, or the process stopped, go to `refused` (after the lock is let
    /// go, so that dropping them runs no code under it).
    pub(crate) fn try_send_all(
        &self,
        msgs: Vec<P::Message>,
        mut refused: impl FnMut(TellError<P::Message>),
    ) {
        let mut turned_away = Vec::new();
        let receiver = {
            let mut queue = lock(&self.queue);
            for msg in msgs {
                if queue.is_closed() {
                    turned_away.push(TellError::Stopped(msg));
                    continue;
                }
                if let Some(limit) = &self.limit {
                    match limit.try_acquire() {
                        Ok(permit) => permit.forget(),
                        Err(TryAcquireError::NoPermits) => {
                            turned_away.push(TellError::Busy(msg));
                            continue;
                        }
                        Err(TryAcquireError::Closed) => {
                            turned_away.push(TellError::Stopped(msg));
                            continue;
                        }
                    }
                }
                queue.items.push_back(Envelope::Message(msg));
            }
            queue.receiver.take()
        };
        if let Some(receiver) = receiver {
            receiver.wake();
        }
        for refusal in turned_away {
            refused(refusal);
        }
    }

    /// Queues a user message, waiting for room if a bounded mailbox is full.
    pub(crate) async fn send(&self, msg: P::Message) -> Result<(), TellError<P::Message>> {
        if let Some(limit) = &self.limit {
            match limit.acquire().await {
                Ok(permit) => permit.forget(),
                Err(_closed) => return Err(TellError::Stopped(msg)),
            }
        }
        self.push_message(msg)
    }

    fn push_message(&self, msg: P::Message) -> Result<(), TellError<P::Message>> {
        self.push(Envelope::Message(msg))
            .map_err(|envelope| match envelope {
                Envelope::Message(msg) => TellError::Stopped(msg),
                // `push` hands back exactly the envelope it was given.
                _ => unreachable!("push_message sent a non-message envelope"),
            })
    }

    /// Queues a control signal; false if the process has stopped.
    pub(crate) fn signal(&self, envelope: Envelope<P>) -> bool {
        self.push(envelope).is_ok()
    }

    fn push(&self, envelope: Envelope<P>) -> Result<(), Envelope<P>> {
        let mut queue = lock(&self.queue);
        if queue.is_closed() {
            return Err(envelope);
        }
        queue.items.push_back(envelope);
        let receiver = queue.receiver.take();
        drop(queue);
        if let Some(receiver) = receiver {
            receiver.wake();
        }
        Ok(())
    }

    /// Records a request to end with `reason` (the first request's reason stands) and makes
    /// the receiver look up from its queue without queueing anything: no allocation, and no
    /// envelope that could be mistaken for work. Nothing happens once the process has ended.
    pub(crate) fn request_termination(&self, reason: ExitReason) {
        let receiver = {
            let mut queue = lock(&self.queue);
            if !matches!(queue.end, End::Running) {
                return;
            }
            self.set_end(&mut queue, End::Requested(reason));
            queue.interrupted = true;
            queue.receiver.take()
        };
        if let Some(receiver) = receiver {
            receiver.wake();
        }
    }

    /// Moves the queue (locked by the caller) to `end`, and its mirror with it.
    fn set_end(&self, queue: &mut Queue<Envelope<P>>, end: End) {
        self.phase.store(end.phase(), Ordering::SeqCst);
        queue.end = end;
    }

    /// Why the process was asked to end, if it was. Lock-free until a request has been made.
    pub(crate) fn termination(&self) -> Option<ExitReason> {
        if self.phase.load(Ordering::SeqCst) != REQUESTED {
            return None;
        }
        match &lock(&self.queue).end {
            End::Requested(reason) => Some(reason.clone()),
            End::Running | End::Ended(_) => None,
        }
    }

    /// True once the process has ended (or is ending) and takes no more envelopes.
    pub(crate) fn is_closed(&self) -> bool {
        self.phase.load(Ordering::SeqCst) == ENDED
    }

    /// Why the process ended, once it has.
    pub(crate) fn exit_reason(&self) -> Option<ExitReason> {
        match &lock(&self.queue).end {
            End::Ended(reason) => Some(reason.clone()),
            End::Running | End::Requested(_) => None,
        }
    }

    /// Runs `watcher` when the process ends, or now (outside the lock) if it already has.
    pub(crate) fn on_exit(&self, watcher: ExitWatcher) {
        let mut queue = lock(&self.queue);
        match &queue.end {
            End::Ended(reason) => {
                let reason = reason.clone();
                drop(queue);
                watcher(&reason);
            }
            End::Running | End::Requested(_) => queue.watchers.push(watcher),
        }
    }

    /// Called by the receiver as each user message leaves the queue.
    pub(crate) fn release_one(&self) {
        if let Some(limit) = &self.limit {
            limit.add_permits(1);
        }
    }
}

impl<P: Process> MailboxReceiver<P> {
    pub(crate) fn new() -> Self {
        MailboxReceiver {
            batch: VecDeque::new(),
        }
    }

    /// Returns `envelope`, just taken, to the front of the batch.
    pub(crate) fn put_back(&mut self, envelope: Envelope<P>) {
        self.batch.push_front(envelope);
    }

    /// Whether envelopes taken from the queue are still waiting in this batch.
    pub(crate) fn has_batched(&self) -> bool {
        !self.batch.is_empty()
    }

    /// The next envelope, waiting for one if the queue is empty; `None` if
    /// interrupted by a [termination request](Mailbox::request_termination) while waiting.
    pub(crate) async fn recv(&mut self, mailbox: &Mailbox<P>) -> Option<Envelope<P>> {
        loop {
            if let Some(envelope) = self.batch.pop_front() {
                mailbox.batched.store(self.batch.len(), Ordering::Relaxed);
                // Give other tasks on this worker a turn now and then, as a channel would.
                tokio::task::consume_budget().await;
                return Some(envelope);
            }
            let interrupted = std::future::poll_fn(|cx| {
                let mut queue = lock(&mailbox.queue);
                if std::mem::take(&mut queue.interrupted) {
                    return Poll::Ready(true);
                }
                if queue.items.is_empty() {
                    crate::sync::park(&mut queue.receiver, cx.waker());
                    return Poll::Pending;
                }
                std::mem::swap(&mut queue.items, &mut self.batch);
                mailbox.batched.store(self.batch.len(), Ordering::Relaxed);
                Poll::Ready(false)
            })
            .await;
            if interrupted {
                return None;
            }
        }
    }

    /// Closes the queue, records why the process ended and takes the watchers to tell.
    /// Senders fail from now on, including those waiting for room; the user messages still
    /// queued are counted, as they will never be handled.
    pub(crate) fn close(&mut self, mailbox: &Mailbox<P>, reason: ExitReason) -> Closed {
        if let Some(limit) = &mailbox.limit {
            limit.close();
        }
        let (queued, watchers) = {
            let mut queue = lock(&mailbox.queue);
            queue.receiver = None;
            mailbox.set_end(&mut queue, End::Ended(reason));
            (
                std::mem::take(&mut queue.items),
                std::mem::take(&mut queue.watchers),
            )
        };
        mailbox.batched.store(0, Ordering::Relaxed);
        let left = self.batch.drain(..).chain(queued);
        // Dropped outside the lock: a message's Drop may run code (a remote reply answers).
        let undelivered = left
            .filter(|envelope| matches!(envelope, Envelope::Message(_)))
            .count();
        Closed {
            undelivered,
            watchers,
        }
    }
}
