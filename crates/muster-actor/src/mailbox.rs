//! The mailbox: what a process's queue carries, and the bound on user messages.
//!
//! Every mailbox is an unbounded tokio channel of [`Envelope`]s. A bounded mailbox puts a
//! semaphore in front of it that counts user messages only, so control signals (an exited
//! notice, a dispatch, a stop) always get through even when the mailbox is full.

use tokio::sync::{Semaphore, TryAcquireError, mpsc};

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
    /// Wakes the process so it notices a termination request.
    Wake,
}

/// How many user messages a mailbox holds before `tell` answers `Busy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MailboxCapacity {
    /// No limit: `tell` only fails once the process has stopped.
    #[default]
    Unbounded,
    /// At most this many queued user messages.
    Bounded(usize),
}

/// The sending half, kept in the process's shared state.
pub(crate) struct MailboxSender<P: Process> {
    tx: mpsc::UnboundedSender<Envelope<P>>,
    limit: Option<Semaphore>,
}

/// The receiving half, owned by the process's task.
pub(crate) struct MailboxReceiver<P: Process> {
    rx: mpsc::UnboundedReceiver<Envelope<P>>,
}

pub(crate) fn mailbox<P: Process>(
    capacity: MailboxCapacity,
) -> (MailboxSender<P>, MailboxReceiver<P>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let limit = match capacity {
        MailboxCapacity::Unbounded => None,
        MailboxCapacity::Bounded(n) => Some(Semaphore::new(n)),
    };
    (MailboxSender { tx, limit }, MailboxReceiver { rx })
}

impl<P: Process> MailboxSender<P> {
    /// Queues a user message without waiting.
    pub(crate) fn try_send(&self, msg: P::Message) -> Result<(), TellError<P::Message>> {
        if let Some(limit) = &self.limit {
            match limit.try_acquire() {
                Ok(permit) => permit.forget(),
                Err(TryAcquireError::NoPermits) => return Err(TellError::Busy(msg)),
                Err(TryAcquireError::Closed) => return Err(TellError::Stopped(msg)),
            }
        }
        self.push(msg)
    }

    /// Queues a user message, waiting for room in a bounded mailbox.
    pub(crate) async fn send(&self, msg: P::Message) -> Result<(), TellError<P::Message>> {
        if let Some(limit) = &self.limit {
            match limit.acquire().await {
                Ok(permit) => permit.forget(),
                Err(_closed) => return Err(TellError::Stopped(msg)),
            }
        }
        self.push(msg)
    }

    fn push(&self, msg: P::Message) -> Result<(), TellError<P::Message>> {
        self.tx
            .send(Envelope::Message(msg))
            .map_err(|mpsc::error::SendError(envelope)| match envelope {
                Envelope::Message(msg) => TellError::Stopped(msg),
                // `push` only ever sends `Envelope::Message`.
                _ => unreachable!("push sent a non-message envelope"),
            })
    }

    /// Queues a control signal; false if the process has stopped.
    pub(crate) fn signal(&self, envelope: Envelope<P>) -> bool {
        self.tx.send(envelope).is_ok()
    }

    /// Called by the receiver as each user message leaves the queue.
    pub(crate) fn release_one(&self) {
        if let Some(limit) = &self.limit {
            limit.add_permits(1);
        }
    }

    /// Makes every later send fail with `Stopped`, waking senders waiting for room.
    pub(crate) fn close(&self) {
        if let Some(limit) = &self.limit {
            limit.close();
        }
    }
}

impl<P: Process> MailboxReceiver<P> {
    pub(crate) async fn recv(&mut self) -> Option<Envelope<P>> {
        self.rx.recv().await
    }

    /// Closes the queue and counts the user messages still in it: they will never be handled.
    pub(crate) fn close_and_drain(&mut self) -> usize {
        self.rx.close();
        let mut undelivered = 0;
        while let Ok(envelope) = self.rx.try_recv() {
            if matches!(envelope, Envelope::Message(_)) {
                undelivered += 1;
            }
        }
        undelivered
    }
}
