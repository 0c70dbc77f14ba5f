//! Locking shared by the transport's modules.

use std::sync::{Mutex, MutexGuard};
use std::task::Waker;

/// Locks a mutex whose data stays consistent even if a holder panicked (every critical section
/// in this crate is a push, a take or a lookup).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Parks the task of `waker` in `slot` (for the next push to wake), keeping the waker already
/// there if it wakes the same task: no clone on every poll of an idle task.
pub(crate) fn park(slot: &mut Option<Waker>, waker: &Waker) {
    if !slot.as_ref().is_some_and(|parked| parked.will_wake(waker)) {
        *slot = Some(waker.clone());
    }
}
