//! The [`Process`] trait: state plus a handler for one message type.

use std::future::Future;

use crate::{Context, ExitReason, ProcessRef};

/// A process owns its state and handles one message at a time.
///
/// `Message` is usually an enum of everything the process understands. Messages are moved into
/// the mailbox and out to [`handle`](Process::handle): no `Clone` bound, no encoding for a local
/// target. Requests that want an answer carry a [`Reply`](crate::Reply) inside the message.
///
/// `handle` is async so a handler can await, but the process takes its next message only when
/// the handler returns. To keep serving while a future runs, hand the future to
/// [`Context::defer`].
///
/// # Examples
/// ```
/// use muster_actor::{Context, Process, Reply};
///
/// #[derive(Default)]
/// struct Counter { n: u64 }
///
/// enum CounterMsg { Add(u64), Get(Reply<u64>) }
///
/// impl Process for Counter {
///     type Message = CounterMsg;
///     async fn handle(&mut self, msg: CounterMsg, _ctx: &mut Context<Self>) {
///         match msg {
///             CounterMsg::Add(k) => self.n += k,
///             CounterMsg::Get(reply) => reply.send(self.n),
///         }
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let counter = muster_actor::spawn(Counter::default());
/// counter.tell(CounterMsg::Add(2))?;
/// assert_eq!(counter.ask(CounterMsg::Get).await?, 2);
/// # Ok(())
/// # }
/// ```
pub trait Process: Send + Sized + 'static {
    /// What the process handles.
    type Message: Send + 'static;

    /// Handles one message. A panic here ends this process only, with
    /// [`ExitReason::Panicked`], and reaches the processes linked to it.
    fn handle(
        &mut self,
        msg: Self::Message,
        ctx: &mut Context<Self>,
    ) -> impl Future<Output = ()> + Send;

    /// Runs once before the first message.
    fn started(&mut self, ctx: &mut Context<Self>) -> impl Future<Output = ()> + Send {
        let _ = ctx;
        async {}
    }

    /// A process this one linked to ([`Context::link`]) has ended. The default does nothing.
    fn exited(&mut self, who: ProcessRef, reason: ExitReason, ctx: &mut Context<Self>) {
        let _ = (who, reason, ctx);
    }

    /// Runs after each message, each continuation of [`Context::defer`] and each exit notice,
    /// before the next is taken: the place to publish what the process's state has become
    /// (a watch channel readers follow), whichever way it changed. The default does nothing.
    fn settled(&mut self, ctx: &mut Context<Self>) {
        let _ = ctx;
    }

    /// Runs once after the last message, unless a handler panicked.
    fn stopped(&mut self, reason: &ExitReason) {
        let _ = reason;
    }
}
