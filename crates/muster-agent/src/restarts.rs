//! Restarts in place: what a task's [`RestartPolicy`] says when it fails (Nomad's `restart`
//! block, applied by the agent).
//!
//! Restarts are counted in a window of the policy's interval, opened by the first restart.
//! Within it, up to `attempts` restarts come `delay` after each failure; past them the task
//! fails (mode `fail`) or waits for the window to close and starts counting anew (mode
//! `delay`). A window that has closed starts over.

use std::time::Duration;

use muster_model::{RestartMode, RestartPolicy};
use tokio::time::Instant;

/// What becomes of a task that failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Restart {
    /// Start it again after this long; the restart's number in its window, and the window's
    /// allowance.
    After {
        /// How long to wait.
        wait: Duration,
        /// This restart's number within the window (1 for the first).
        attempt: u32,
    },
    /// It FAILED for good, for this reason.
    GiveUp(String),
}

/// A task's restarts in the current window.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RestartCount {
    /// When the window opened (the first restart in it).
    window_start: Option<Instant>,
    /// Restarts in it.
    count: u32,
}

impl RestartCount {
    /// The task failed at `now`: whether and when it starts again under `policy` (none: never).
    pub(crate) fn failed(&mut self, policy: Option<&RestartPolicy>, now: Instant) -> Restart {
        let Some(policy) = policy.filter(|p| p.attempts > 0 || p.mode == RestartMode::Delay) else {
            return Restart::GiveUp("its group restarts no task in place".into());
        };
        let interval = policy.interval();
        let window_open = self
            .window_start
            .is_some_and(|start| now.saturating_duration_since(start) < interval);
        if !window_open {
            self.window_start = Some(now);
            self.count = 0;
        }
        if self.count < policy.attempts {
            self.count += 1;
            return Restart::After {
                wait: policy.delay(),
                attempt: self.count,
            };
        }
        match policy.mode {
            RestartMode::Fail => Restart::GiveUp(format!(
                "it failed after {} restarts within {} (its restart policy)",
                policy.attempts,
                humantime::format_duration(interval)
            )),
            RestartMode::Delay => {
                // Wait for the window to close, then count anew from there.
                let closes = self.window_start.map_or(now, |start| start + interval);
                let wait = closes.saturating_duration_since(now).max(policy.delay());
                self.window_start = Some(now + wait);
                self.count = 1;
                Restart::After { wait, attempt: 1 }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(mode: RestartMode) -> RestartPolicy {
        RestartPolicy {
            attempts: 2,
            interval_ms: 60_000,
            delay_ms: 1_000,
            mode,
        }
    }

    #[test]
    fn a_task_restarts_up_to_its_attempts_per_window_then_fails() {
        let start = Instant::now();
        let at = |s| start + Duration::from_secs(s);
        let mut count = RestartCount::default();
        let fail = policy(RestartMode::Fail);
        let wait = Duration::from_secs(1);
        assert_eq!(
            count.failed(Some(&fail), at(0)),
            Restart::After { wait, attempt: 1 }
        );
        assert_eq!(
            count.failed(Some(&fail), at(5)),
            Restart::After { wait, attempt: 2 }
        );
        let Restart::GiveUp(why) = count.failed(Some(&fail), at(10)) else {
            panic!("a third failure within the minute fails the task")
        };
        assert!(why.contains("2 restarts within 1m"), "{why}");
        // Once the window closed, it counts anew.
        assert_eq!(
            count.failed(Some(&fail), at(61)),
            Restart::After { wait, attempt: 1 }
        );
        // No policy, or no attempts: never.
        assert!(matches!(
            RestartCount::default().failed(None, at(0)),
            Restart::GiveUp(_)
        ));
    }

    #[test]
    fn delay_mode_waits_for_the_window_to_close() {
        let start = Instant::now();
        let at = |s| start + Duration::from_secs(s);
        let mut count = RestartCount::default();
        let delay = policy(RestartMode::Delay);
        count.failed(Some(&delay), at(0));
        count.failed(Some(&delay), at(10));
        assert_eq!(
            count.failed(Some(&delay), at(20)),
            Restart::After {
                wait: Duration::from_secs(40),
                attempt: 1
            }
        );
        // The new window opened at the restart (60 s): one more attempt is left in it.
        assert_eq!(
            count.failed(Some(&delay), at(70)),
            Restart::After {
                wait: Duration::from_secs(1),
                attempt: 2
            }
        );
    }
}
