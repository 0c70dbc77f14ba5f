//! Back-off for crash-looping tasks: how long the replacement of a task slot that keeps
//! failing waits (Nomad's reschedule delay, Kubernetes' crash-loop back-off).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;

/// How many times a slot failed in a row, when it last did, and until when its replacement
/// waits.
#[derive(Debug, Default)]
pub(in crate::master) struct CrashLoops {
    slots: HashMap<String, Slot>,
}

#[derive(Debug)]
struct Slot {
    failures: u32,
    last: Instant,
    held_until: Instant,
}

/// How much earlier than its replacement's evaluation a slot's hold ends.
const HOLD_MARGIN: Duration = Duration::from_secs(1);

/// How many slots to remember before forgetting the quiet ones.
const REMEMBERED_SLOTS: usize = 10_000;

impl CrashLoops {
    /// The task in `slot` failed at `now`: returns how many times in a row it has failed and
    /// how long its replacement waits. The first failure is replaced at once; each further
    /// one waits `base` doubled per failure, at most `max`. A slot quiet for ten times `max`
    /// starts over.
    pub(in crate::master) fn failed(
        &mut self,
        slot: &str,
        now: Instant,
        base: Duration,
        max: Duration,
    ) -> (u32, Duration) {
        let forget_after = max.saturating_mul(10);
        if self.slots.len() >= REMEMBERED_SLOTS {
            self.slots
                .retain(|_, s| now.saturating_duration_since(s.last) < forget_after);
        }
        let entry = self.slots.entry(slot.to_owned()).or_insert(Slot {
            failures: 0,
            last: now,
            held_until: now,
        });
        if entry.failures > 0 && now.saturating_duration_since(entry.last) >= forget_after {
            entry.failures = 0;
        }
        entry.failures = entry.failures.saturating_add(1);
        entry.last = now;
        let delay = match entry.failures {
            1 => Duration::ZERO,
            n => base.saturating_mul(2u32.saturating_pow(n - 2)).min(max),
        };
        // The hold ends a little before the held evaluation is due (the broker counts on the
        // wall clock, in whole milliseconds), so that evaluation never finds its own slot held.
        entry.held_until = now + delay.saturating_sub(HOLD_MARGIN);
        (entry.failures, delay)
    }

    /// The slot's replacement will not come (its evaluation could not be written): stop
    /// holding it, so the job's next evaluation places it.
    pub(in crate::master) fn release(&mut self, slot: &str) {
        if let Some(entry) = self.slots.get_mut(slot) {
            entry.held_until = entry.last;
        }
    }

    /// The slots whose replacement still waits at `now`: schedulers leave them empty.
    pub(in crate::master) fn held(&self, now: Instant) -> BTreeSet<String> {
        self.slots
            .iter()
            .filter(|(_, s)| s.held_until > now)
            .map(|(name, _)| name.clone())
            .collect()
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
        // Held while the last replacement waits.
        let held = loops.held(start + Duration::from_secs(6));
        assert!(held.contains("web.server[0]") && !held.contains("web.server[1]"));
        assert!(loops.held(start + Duration::from_secs(5 + 61)).is_empty());
        // A replacement that will not come (its write failed) holds nothing.
        loops.release("web.server[0]");
        assert!(loops.held(start + Duration::from_secs(6)).is_empty());
        // Quiet for ten times the maximum: a fresh start.
        let later = start + Duration::from_secs(6 + 600);
        assert_eq!(
            loops.failed("web.server[0]", later, base, max),
            (1, secs(0))
        );
    }
}
