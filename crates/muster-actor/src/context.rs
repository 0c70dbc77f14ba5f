//! [`Context`]: what a handler can do besides changing its own state — stop, link, timers,
//! defer, spawn.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::mailbox::Envelope;
use crate::pid::Shared;
use crate::{ExitReason, Pid, Process, ProcessId, ProcessRef, System, TimerHandle};

/// Handed to every handler of a process, next to its state.
pub struct Context<P: Process> {
    pid: Pid<P>,
    system: System,
    /// Set by `stop`; boxed because it is set at most once and every process's task holds it.
    pub(crate) stop_requested: Option<Box<ExitReason>>,
}

impl<P: Process> Context<P> {
    pub(crate) fn new(pid: Pid<P>, system: System) -> Self {
        Context {
            pid,
            system,
            stop_requested: None,
        }
    }

    /// This process's own handle.
    pub fn pid(&self) -> &Pid<P> {
        &self.pid
    }

    /// This process's id.
    pub fn id(&self) -> ProcessId {
        self.pid.id()
    }

    /// The system this process runs in.
    pub fn system(&self) -> &System {
        &self.system
    }

    /// Ends the process with [`ExitReason::Normal`] once the current handler returns.
    pub fn stop(&mut self) {
        self.stop_with(ExitReason::Normal);
    }

    /// Ends the process with `reason` once the current handler returns.
    pub fn stop_with(&mut self, reason: ExitReason) {
        self.stop_requested.get_or_insert_with(|| Box::new(reason));
    }

    /// Starts a child process in the same system.
    pub fn spawn<Q: Process>(&self, process: Q) -> Pid<Q> {
        self.system.spawn(process)
    }

    /// Links this process to `other`: when `other` ends, this process's
    /// [`exited`](Process::exited) runs with `other`'s id and reason. If `other` has already
    /// ended, the notice comes at once.
    pub fn link<Q: Process>(&self, other: &Pid<Q>) {
        let target = ProcessRef::Local(other.id());
        let me = self.weak();
        other.inner.on_exit(Box::new(move |reason: &ExitReason| {
            if let Some(me) = me.upgrade() {
                me.mailbox
                    .signal(Envelope::Exited(Box::new((target, reason.clone()))));
            }
        }));
    }

    /// A function that delivers an `exited` notice to this process (while it runs): how a
    /// transport links a process to something that is not a local process, such as a
    /// connection to another node.
    pub fn exit_notifier(&self) -> impl Fn(ProcessRef, ExitReason) + Send + Sync + 'static {
        let me = self.weak();
        move |who, reason| {
            if let Some(me) = me.upgrade() {
                me.mailbox.signal(Envelope::Exited(Box::new((who, reason))));
            }
        }
    }

    /// Sends `msg` to this process after `delay` (on tokio time, so a paused test clock
    /// controls it). Dropping the handle does not cancel; [`TimerHandle::cancel`] does.
    pub fn delay(&self, delay: Duration, msg: P::Message) -> TimerHandle {
        let me = self.weak();
        // Measured from this call, not from whenever the timer task first runs (which is after
        // the current handler yields, possibly much later).
        let deadline = tokio::time::Instant::now() + delay;
        TimerHandle::spawn(async move {
            tokio::time::sleep_until(deadline).await;
            if let Some(me) = me.upgrade() {
                let _ = me.mailbox.try_send(msg);
            }
        })
    }

    /// Sends `make()` to this process every `period`, the first after one period, until the
    /// process ends or the handle is cancelled. A tick that finds a bounded mailbox full is
    /// skipped.
    ///
    /// # Panics
    /// If `period` is zero.
    pub fn interval(
        &self,
        period: Duration,
        mut make: impl FnMut() -> P::Message + Send + 'static,
    ) -> TimerHandle {
        // Checked here so the panic reaches the caller, not the timer task.
        assert!(!period.is_zero(), "interval period must be non-zero");
        let me = self.weak();
        // As for `delay`: the first tick is one period after this call.
        let start = tokio::time::Instant::now() + period;
        TimerHandle::spawn(async move {
            let mut ticks = tokio::time::interval_at(start, period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(me) = me.upgrade() else { return };
                if let Err(crate::TellError::Stopped(_)) = me.mailbox.try_send(make()) {
                    return;
                }
            }
        })
    }

    /// Runs `future` off the process, then `then` back on it with the output, between two
    /// messages. The handler returns at once, so the process keeps serving meanwhile (libprocess's
    /// `defer`). If the process has ended by then, `then` is dropped.
    pub fn defer<F, T>(
        &self,
        future: F,
        then: impl FnOnce(&mut P, &mut Context<P>, T) + Send + 'static,
    ) -> TimerHandle
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let me = self.weak();
        TimerHandle::spawn(async move {
            let output = future.await;
            if let Some(me) = me.upgrade() {
                me.mailbox.signal(Envelope::Dispatch(Box::new(
                    move |process: &mut P, ctx: &mut Context<P>| then(process, ctx, output),
                )));
            }
        })
    }

    fn weak(&self) -> Weak<Shared<P>> {
        Arc::downgrade(&self.pid.inner)
    }
}

impl<P: Process> fmt::Debug for Context<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").field("pid", &self.pid).finish()
    }
}
