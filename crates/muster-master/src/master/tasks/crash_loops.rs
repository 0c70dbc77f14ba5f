//! Back-off for crash-looping tasks: how long the replacement of a task slot that keeps
//! failing waits (Nomad's reschedule delay, Kubernetes' crash-loop back-off), and when a slot
//! is placed no more: its group's reschedule policy (Nomad's `reschedule` block), or the
//! master's own back-off for a group without one.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use muster_model::ReschedulePolicy;
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
    /// When it was placed again, within its policy's interval (newest last).
    attempts: VecDeque<Instant>,
    /// Its policy's attempts are used up: held until its job changes.
    given_up: bool,
}

/// What becomes of a slot whose task failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::master) enum Reschedule {
    /// Placed again after `wait`; the slot has failed `failures` times in a row.
    After {
        /// Failures in a row.
        failures: u32,
        /// How long its replacement waits.
        wait: Duration,
    },
    /// Placed no more: its policy's attempts are used up, as this says.
    GiveUp(String),
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
                .retain(|_, s| s.given_up || now.saturating_duration_since(s.last) < forget_after);
        }
        let entry = self.slots.entry(slot.to_owned()).or_insert(Slot {
            failures: 0,
            last: now,
            held_until: now,
            attempts: VecDeque::new(),
            given_up: false,
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

    /// The task in `slot` failed at `now`, in a group with reschedule policy `policy`
    /// (`None`: the master's own back-off, [`failed`](Self::failed), from `base` up to
    /// `max`): whether and when it is placed again. A slot given up on is held (left empty
    /// by schedulers) until [`forget_job`](Self::forget_job).
    pub(in crate::master) fn rescheduled(
        &mut self,
        slot: &str,
        now: Instant,
        policy: Option<&ReschedulePolicy>,
        base: Duration,
        max: Duration,
    ) -> Reschedule {
        let Some(policy) = policy else {
            let (failures, wait) = self.failed(slot, now, base, max);
            return Reschedule::After { failures, wait };
        };
        let (failures, _) = self.failed(slot, now, base, max);
        let Some(entry) = self.slots.get_mut(slot) else {
            return Reschedule::After {
                failures,
                wait: Duration::ZERO,
            };
        };
        let interval = policy.interval();
        while entry
            .attempts
            .front()
            .is_some_and(|at| now.saturating_duration_since(*at) >= interval)
        {
            entry.attempts.pop_front();
        }
        if !policy.unlimited && entry.attempts.len() >= policy.attempts as usize {
            entry.given_up = true;
            return Reschedule::GiveUp(format!(
                "it was placed again {} times within {} (its reschedule policy)",
                policy.attempts,
                humantime::format_duration(interval)
            ));
        }
        if !policy.unlimited {
            entry.attempts.push_back(now);
        }
        let wait = policy.delay(failures);
        entry.held_until = now + wait.saturating_sub(HOLD_MARGIN);
        Reschedule::After { failures, wait }
    }

    /// `job` changed (or was stopped, or purged): its slots start over, those given up on
    /// included.
    pub(in crate::master) fn forget_job(&mut self, job: &str) {
        self.slots.retain(|slot, _| {
            !(slot.len() > job.len() && slot.starts_with(job) && slot.as_bytes()[job.len()] == b'.')
        });
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
            .filter(|(_, s)| s.given_up || s.held_until > now)
            .map(|(name, _)| name.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_places_a_slot_again_up_to_its_attempts_then_holds_it_until_its_job_changes() {
        let mut loops = CrashLoops::default();
        let policy = ReschedulePolicy {
            attempts: 2,
            interval_ms: 60_000,
            delay_ms: 5_000,
            delay_function: muster_model::DelayFunction::Exponential,
            max_delay_ms: 60_000,
            unlimited: false,
        };
        let (base, max) = (Duration::from_secs(10), Duration::from_secs(60));
        let start = Instant::now();
        let at = |s| start + Duration::from_secs(s);
        let slot = "web.api[0]";
        let secs = Duration::from_secs;
        assert_eq!(
            loops.rescheduled(slot, at(0), Some(&policy), base, max),
            Reschedule::After {
                failures: 1,
                wait: secs(5)
            }
        );
        assert_eq!(
            loops.rescheduled(slot, at(10), Some(&policy), base, max),
            Reschedule::After {
                failures: 2,
                wait: secs(10)
            }
        );
        let Reschedule::GiveUp(why) = loops.rescheduled(slot, at(20), Some(&policy), base, max)
        else {
            panic!("a third failure within the minute is given up on")
        };
        assert!(why.contains("2 times within 1m"), "{why}");
        assert!(loops.held(at(10_000)).contains(slot), "held for good");
        // Another job's slot of a similar name is not forgotten with it.
        loops.failed("web-2.api[0]", at(0), base, max);
        loops.forget_job("web");
        assert!(loops.held(at(10_000)).is_empty());
        assert!(loops.slots.contains_key("web-2.api[0]"));
        assert!(!loops.slots.contains_key(slot));
        // Unlimited: never given up.
        let unlimited = ReschedulePolicy {
            unlimited: true,
            ..policy
        };
        for n in 0..10 {
            assert!(matches!(
                loops.rescheduled(slot, at(100 + n), Some(&unlimited), base, max),
                Reschedule::After { .. }
            ));
        }
    }

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
