//! [`TimerHandle`]: cancels a delayed message, an interval or a deferred continuation.

use std::future::Future;

/// Handle to work scheduled by [`Context::delay`](crate::Context::delay),
/// [`interval`](crate::Context::interval) or [`defer`](crate::Context::defer).
/// Dropping it lets the work run; [`cancel`](TimerHandle::cancel) stops it.
#[derive(Debug)]
pub struct TimerHandle {
    task: tokio::task::AbortHandle,
}

impl TimerHandle {
    pub(crate) fn spawn(work: impl Future<Output = ()> + Send + 'static) -> Self {
        TimerHandle {
            task: tokio::spawn(work).abort_handle(),
        }
    }

    /// Stops the work if it has not run yet (for an interval: no further ticks).
    pub fn cancel(&self) {
        self.task.abort();
    }

    /// True once the work has run to its end or was cancelled.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}
