//! Deterministic randomness for a simulation thread.
//!
//! The standard library seeds every `HashMap` and tokio seeds its schedulers from the
//! operating system's `getrandom`; a run that iterated a map in a different order would take
//! a different path. This binary defines the `getrandom` symbol itself (the standard library
//! looks it up before it falls back to the raw system call), and answers from a generator
//! seeded by the simulation running on the calling thread. Threads that run no simulation get
//! the system's randomness. `fastrand`'s thread generator (backoff jitter, evaluation ids) is
//! seeded alongside.

use std::cell::Cell;

thread_local! {
    static STATE: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Makes this thread's randomness a function of `seed`. Call it first thing on a fresh thread,
/// before anything on it builds a map or a runtime.
pub(crate) fn seed_thread(seed: u64) {
    STATE.with(|s| s.set(Some(seed ^ 0x005e_ed0f_5eed)));
    fastrand::seed(seed);
}

fn next(state: &Cell<Option<u64>>) -> Option<u64> {
    // splitmix64
    let mut z = state.get()?.wrapping_add(0x9e37_79b9_7f4a_7c15);
    state.set(Some(z));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    Some(z ^ (z >> 31))
}

/// The C library's `getrandom(2)` wrapper, replaced for this binary: seeded bytes on a
/// simulation thread, the system call elsewhere.
///
/// # Safety
/// `buf` must be valid for `len` bytes of writes, as for the C function.
#[unsafe(no_mangle)]
unsafe extern "C" fn getrandom(buf: *mut u8, len: usize, flags: u32) -> isize {
    let seeded = STATE
        .try_with(|state| {
            if state.get().is_none() {
                return false;
            }
            let mut written = 0;
            while written < len {
                let Some(word) = next(state) else {
                    return false;
                };
                for byte in word.to_le_bytes() {
                    if written == len {
                        break;
                    }
                    // SAFETY: `written < len` and the caller gives `len` writable bytes.
                    unsafe { buf.add(written).write(byte) };
                    written += 1;
                }
            }
            true
        })
        .unwrap_or(false);
    if seeded {
        return isize::try_from(len).unwrap_or(isize::MAX);
    }
    // SAFETY: the caller's contract is the system call's.
    unsafe { libc::syscall(libc::SYS_getrandom, buf, len, flags) as isize }
}
