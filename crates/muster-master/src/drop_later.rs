//! Frees large values on a helper thread, off the master's.
//!
//! A new leader takes in every task of the cluster as the agents re-register: a million tasks at
//! 100,000 agents, each with a few dozen strings in its wire form. The master interns what it
//! keeps by reference ([`TaskInterner::task`](crate::task_record::TaskInterner::task)); freeing
//! the wire forms is the rest of the work, and it needs nothing from the master, so it goes to
//! a thread of its own, where it runs beside the master on another core.

use std::sync::OnceLock;
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::time::Duration;

/// Values waiting at most: past that, a caller frees its value itself (the helper has fallen
/// behind, and a bounded queue keeps what waits bounded).
const QUEUE: usize = 4096;

/// How long the helper naps between rounds while values keep coming. A helper blocked on its
/// queue is woken by each value sent (a futex call on the sender's thread, which is the
/// master's); one that naps finds what came meanwhile without anyone waking it.
const NAP: Duration = Duration::from_millis(1);

/// Something to free.
type Garbage = Box<dyn Send>;

/// The helper's queue; `None` if the thread could not be started.
static HELPER: OnceLock<Option<SyncSender<Garbage>>> = OnceLock::new();

/// Drops `value` on the helper thread, or here if the helper is busy or could not start. For
/// plain data only: a value still queued when the process exits is never dropped, so one whose
/// `Drop` must run (a file to flush, a lock to release) does not belong here.
pub(crate) fn drop_later<T: Send + 'static>(value: T) {
    let Some(helper) = HELPER.get_or_init(start) else {
        return;
    };
    match helper.try_send(Box::new(value)) {
        Ok(()) => {}
        Err(TrySendError::Full(value) | TrySendError::Disconnected(value)) => drop(value),
    }
}

/// Blocks until everything handed to the helper thread so far is freed, or `timeout` passes;
/// false on timeout. For measuring the heap a master holds (a bench does), since values
/// handed over a moment ago may still be waiting. Not for async code: it blocks its thread.
pub fn wait_for_background_frees(timeout: Duration) -> bool {
    let Some(Some(helper)) = HELPER.get() else {
        return true;
    };
    /// Says when the helper reached it: everything queued before it has been freed.
    struct Marker(mpsc::Sender<()>);
    impl Drop for Marker {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }
    let deadline = std::time::Instant::now() + timeout;
    let (reached, done) = mpsc::channel();
    let mut marker: Garbage = Box::new(Marker(reached));
    // Queued without blocking past the deadline: a full queue is waited out in short naps.
    loop {
        match helper.try_send(marker) {
            Ok(()) => break,
            // The helper is gone, and what it held was freed with its queue.
            Err(TrySendError::Disconnected(_)) => return true,
            Err(TrySendError::Full(back)) => {
                if std::time::Instant::now() >= deadline {
                    return false;
                }
                marker = back;
                std::thread::sleep(NAP);
            }
        }
    }
    done.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
        .is_ok()
}

/// Starts the helper thread.
fn start() -> Option<SyncSender<Garbage>> {
    let (sender, garbage) = mpsc::sync_channel::<Garbage>(QUEUE);
    let started = std::thread::Builder::new()
        .name("muster-drop".into())
        .spawn(move || {
            // Blocks only when a whole nap brought nothing.
            while let Ok(first) = garbage.recv() {
                drop(first);
                loop {
                    std::thread::sleep(NAP);
                    // Each value is dropped as it is counted.
                    if garbage.try_iter().count() == 0 {
                        break;
                    }
                }
            }
        });
    match started {
        Ok(_) => Some(sender),
        Err(error) => {
            tracing::warn!(%error, "cannot start the thread that frees large values; the master frees them itself");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    /// Says on which thread it was dropped.
    struct Tell(mpsc::Sender<Option<String>>);

    impl Drop for Tell {
        fn drop(&mut self) {
            let _ = self
                .0
                .send(std::thread::current().name().map(str::to_owned));
        }
    }

    #[test]
    fn waiting_for_frees_returns_once_what_was_handed_over_is_freed() {
        let (dropped, on) = mpsc::channel();
        for _ in 0..100 {
            drop_later(Tell(dropped.clone()));
        }
        assert!(wait_for_background_frees(Duration::from_secs(10)));
        assert_eq!(
            on.try_iter().count(),
            100,
            "all freed before the wait returned"
        );
    }

    #[test]
    fn a_value_is_dropped_on_the_helper_thread() {
        let (dropped, on) = mpsc::channel();
        drop_later(Tell(dropped.clone()));
        drop_later(vec![Tell(dropped)]);
        for _ in 0..2 {
            let thread = on
                .recv_timeout(Duration::from_secs(10))
                .expect("dropped within 10 s");
            assert_eq!(thread.as_deref(), Some("muster-drop"));
        }
    }
}
