//! Back-off for crash-looping tasks: how long the replacement of a task slot that keeps
//! failing waits (Nomad's reschedule delay, Kubernetes' crash-loop back-off).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// How many times a slot failed in a row, and when it last did.
#[derive(Debug, Default)]
pub(super) struct CrashLoops {
    slots: HashMap<String, (u32, Instant)>,
}

/// How many slots to remember before forgetting the quiet ones.
const REMEMBERED_SLOTS: usize = 10_000;

impl CrashLoops {
    /// The task in `slot` failed at `now`: returns how many times in a row it has failed and
    /// how long its replacement waits. The first failure is replaced at once; each further
    /// one waits `base` doubled per failure, at most `max`. A slot quiet for ten times `max`
    /// starts over.
    pub(super) fn failed(
        &mut self,
        slot: &str,
        now: Instant,
        base: Duration,
        max: Duration,
    ) -> (u32, Duration) {
        let forget_after = max.saturating_mul(10);
        if self.slots.len() >= REMEMBERED_SLOTS {
            self.slots
                .retain(|_, (_, last)| now.saturating_duration_since(*last) < forget_after);
        }
        let (failures, last) = self.slots.entry(slot.to_owned()).or_insert((0, now));
        if *failures > 0 && now.saturating_duration_since(*last) >= forget_after {
            *failures = 0;
        }
        *failures = failures.saturating_add(1);
        *last = now;
        let delay = match *failures {
            1 => Duration::ZERO,
            n => base.saturating_mul(2u32.saturating_pow(n - 2)).min(max),
        };
        (*failures, delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replacements_back_off_exponentially_up_to_the_maximum_and_start_over_when_quiet() {
        let mut loops = CrashLoops::default();
        let (base, max) = (Duration::from_secs(10), Duration::from_secs(60));
        let start = Instant::now();
        let delays: Vec<(u32, Duration)> = (0..6)
            .map(|n| loops.failed("web.server[0]", start + Duration::from_secs(n), base, max))
            .collect();
        let secs = |s| Duration::from_secs(s);
        assert_eq!(
            delays,
            vec![
                (1, secs(0)),
                (2, secs(10)),
                (3, secs(20)),
                (4, secs(40)),
                (5, secs(60)),
                (6, secs(60)),
            ]
        );
        // Another slot has its own count.
        assert_eq!(
            loops.failed("web.server[1]", start, base, max),
            (1, secs(0))
        );
        // Quiet for ten times the maximum: a fresh start.
        let later = start + Duration::from_secs(6 + 600);
        assert_eq!(
            loops.failed("web.server[0]", later, base, max),
            (1, secs(0))
        );
    }
}
