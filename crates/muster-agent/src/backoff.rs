//! Registration delays: a random start so that agents that lost their master together do not
//! come back together, and capped exponential backoff with jitter between failed rounds.

use std::time::Duration;

/// The delay before the first attempt (at start, or after losing a master): uniform in
/// `[0, initial)`, from `random` in `[0, 1)`.
pub(crate) fn initial_delay(initial: Duration, random: f64) -> Duration {
    initial.mul_f64(random.clamp(0.0, 1.0))
}

/// The delay after `failed_rounds` (1-based) rounds in a row found no master:
/// `initial × 2^(failed_rounds - 1)`, capped at `max`, times a random factor in `[0.5, 1)` taken
/// from `random` in `[0, 1)`.
pub(crate) fn round_delay(
    initial: Duration,
    max: Duration,
    failed_rounds: u32,
    random: f64,
) -> Duration {
    let doublings = failed_rounds.saturating_sub(1).min(30);
    let capped = initial.saturating_mul(1u32 << doublings).min(max);
    capped.mul_f64(0.5 + 0.5 * random.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initial_delay_is_below_initial() {
        let initial = Duration::from_secs(1);
        assert_eq!(initial_delay(initial, 0.0), Duration::ZERO);
        assert!(initial_delay(initial, 0.999) < initial);
        for _ in 0..1000 {
            assert!(initial_delay(initial, fastrand::f64()) < initial);
        }
    }

    #[test]
    fn round_delay_doubles_up_to_the_cap_with_jitter() {
        let initial = Duration::from_secs(1);
        let max = Duration::from_secs(60);
        assert_eq!(round_delay(initial, max, 1, 1.0), Duration::from_secs(1));
        assert_eq!(round_delay(initial, max, 2, 1.0), Duration::from_secs(2));
        assert_eq!(round_delay(initial, max, 4, 1.0), Duration::from_secs(8));
        assert_eq!(round_delay(initial, max, 7, 1.0), max);
        assert_eq!(round_delay(initial, max, u32::MAX, 1.0), max);
        assert_eq!(round_delay(initial, max, 3, 0.0), Duration::from_secs(2));
        for failed in 1..100 {
            let delay = round_delay(initial, max, failed, fastrand::f64());
            let ceiling = initial.saturating_mul(1 << (failed - 1).min(30)).min(max);
            assert!(
                delay <= ceiling && delay >= ceiling / 2,
                "{failed}: {delay:?}"
            );
        }
    }
}
