//! The wall clock: what evaluations and records are stamped with, and what a delayed
//! evaluation's `wait_until_ms` counts in (it must mean the same on the next leader, so it is
//! wall time, not a process's monotonic clock).
//!
//! Timers and timeouts use tokio's clock, which tests pause and a simulation drives. The wall
//! clock is the system's unless a deterministic simulation [`install`]s its own, once, before
//! anything reads it: then simulated time stamps the records too, and a seed replays exactly.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

static CLOCK: OnceLock<fn() -> u64> = OnceLock::new();

/// Milliseconds since the Unix epoch (0 with a system clock set before it).
pub fn unix_ms() -> u64 {
    CLOCK.get_or_init(|| system_unix_ms)()
}

/// The system's wall clock, in milliseconds since the Unix epoch.
pub fn system_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Why [`install`] refused.
#[derive(Debug, thiserror::Error)]
#[error("the process's wall clock is already chosen: install one before anything reads it")]
pub struct ClockChosen;

/// Makes `clock` (milliseconds since the Unix epoch) this process's wall clock.
///
/// # Errors
/// [`ClockChosen`] if a clock was installed, or read, before.
pub fn install(clock: fn() -> u64) -> Result<(), ClockChosen> {
    CLOCK.set(clock).map_err(|_| ClockChosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wall_clock_is_the_system_s_unless_one_was_installed() {
        let before = system_unix_ms();
        let read = unix_ms();
        assert!(read >= before && read <= system_unix_ms());
        assert!(
            install(|| 0).is_err(),
            "a clock already read cannot be swapped"
        );
    }
}
