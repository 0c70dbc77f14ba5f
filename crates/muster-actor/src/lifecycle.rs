//! The task behind every process: started, one envelope at a time, stopped, then the exit notice.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::Poll;

use futures_util::FutureExt;

use crate::mailbox::{Envelope, MailboxReceiver};
use crate::reply::HoldingAnswers;
use crate::{Context, ExitReason, Process};

/// The process's task: [`run_unheld`] with answers held between polls. Local answers its
/// handlers send while more messages are queued are held, and whatever is still held goes out
/// as each poll ends (see [`crate::reply`]).
pub(crate) fn run<P: Process>(process: P, ctx: Context<P>) -> impl Future<Output = ()> + Send {
    HoldingAnswersWhilePolled {
        task: run_unheld(process, MailboxReceiver::new(), ctx),
    }
}

pin_project_lite::pin_project! {
    /// Wraps every poll of `task` in a [`HoldingAnswers`] scope. A plain struct rather than an
    /// `async` block around `poll_fn`, which would keep the task's arguments twice: every
    /// process's task is this future, so its size is paid per process.
    struct HoldingAnswersWhilePolled<F> {
        #[pin]
        task: F,
    }
}

impl<F: Future> Future for HoldingAnswersWhilePolled<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
        let _holding = HoldingAnswers::begin();
        self.project().task.poll(cx)
    }
}

async fn run_unheld<P: Process>(
    mut process: P,
    mut mailbox: MailboxReceiver<P>,
    mut ctx: Context<P>,
) {
    let reason = live(&mut process, &mut mailbox, &mut ctx).await;
    if !matches!(reason, ExitReason::Panicked(_)) {
        let stopped = std::panic::catch_unwind(AssertUnwindSafe(|| process.stopped(&reason)));
        if let Err(panic) = stopped {
            tracing::warn!(process = %ctx.id(), panic = %panic_message(&*panic), "stopped() panicked");
        }
    }
    drop(process);

    let shared = &ctx.pid().inner;
    let closed = mailbox.close(&shared.mailbox, reason.clone());
    shared
        .undelivered
        .store(closed.undelivered, std::sync::atomic::Ordering::Release);
    ctx.system().add_dead_letters(closed.undelivered as u64);
    ctx.system().unregister(ctx.id());
    if let ExitReason::Panicked(message) = &reason {
        tracing::error!(process = %ctx.id(), %message, "process panicked");
    }
    shared.announce(&reason, closed.watchers);
}

/// Runs the process until it stops, is terminated or panics.
async fn live<P: Process>(
    process: &mut P,
    mailbox: &mut MailboxReceiver<P>,
    ctx: &mut Context<P>,
) -> ExitReason {
    let shared = std::sync::Arc::clone(&ctx.pid().inner);
    if let Err(panic) = AssertUnwindSafe(process.started(ctx)).catch_unwind().await {
        return ExitReason::Panicked(panic_message(&*panic));
    }
    loop {
        if let Some(reason) = ctx.stop_requested.take() {
            return *reason;
        }
        let Some(envelope) = mailbox.recv(&shared.mailbox).await else {
            // Interrupted: a termination request arrived while the queue was empty.
            if let Some(reason) = shared.mailbox.termination() {
                return reason;
            }
            continue;
        };
        if let Some(reason) = shared.mailbox.termination() {
            // Put back, to be dropped (and counted) with the rest as the mailbox closes: an
            // ask inside it then answers `Stopped`, as the queue is closed by then.
            mailbox.put_back(envelope);
            return reason;
        }
        // Answers are held only while more is queued behind this envelope.
        crate::reply::hold_answers(mailbox.has_batched());
        let outcome = match envelope {
            Envelope::Message(msg) => {
                shared.mailbox.release_one();
                let outcome = AssertUnwindSafe(process.handle(msg, ctx))
                    .catch_unwind()
                    .await;
                if let Some(hook) = shared.after_message.get() {
                    hook();
                }
                outcome
            }
            Envelope::Dispatch(f) => std::panic::catch_unwind(AssertUnwindSafe(|| f(process, ctx))),
            Envelope::Exited(exit) => {
                let (who, reason) = *exit;
                std::panic::catch_unwind(AssertUnwindSafe(|| process.exited(who, reason, ctx)))
            }
        };
        if let Err(panic) = outcome {
            return ExitReason::Panicked(panic_message(&*panic));
        }
        if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| process.settled(ctx))) {
            return ExitReason::Panicked(panic_message(&*panic));
        }
        crate::reply::send_held_if_due();
    }
}

/// The text of a panic payload (`panic!("...")` gives a `&str` or a `String`).
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_owned()
    }
}
