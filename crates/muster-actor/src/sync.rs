//! Locking shared by the runtime's modules.

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex whose data stays consistent even if a holder panicked (every critical section
/// in this crate is a push, a take or a lookup).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
