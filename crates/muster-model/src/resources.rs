//! Resources, and the one rule for whether a task fits.
//!
//! Amounts come from job files and agents, so they are outside input: a NaN or negative cpu
//! amount counts as zero, memory saturates instead of overflowing, and a subtraction never goes
//! below zero. Schedulers, the blocked-queue and the plan applier all decide "does it fit" with
//! [`Resources::fits_in`], so a placement a scheduler proposes is one the applier accepts and a
//! capacity change the blocked-queue acts on is one a scheduler can use.

use serde::{Deserialize, Serialize};

/// Slack allowed when comparing cpus, so that sums of fractions (0.1 + 0.2 ...) that equal an
/// agent's total on paper still fit.
pub const CPU_EPSILON: f64 = 1e-9;

/// Resources an agent offers or a task needs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Resources {
    /// CPU cores (fractions allowed).
    pub cpus: f64,
    /// Memory in MiB.
    pub mem_mb: u64,
}

/// A cpu amount made safe to add and compare: NaN and negatives are zero.
pub fn sane_cpus(amount: f64) -> f64 {
    if amount.is_nan() || amount < 0.0 {
        0.0
    } else {
        amount
    }
}

impl Resources {
    /// `self + other`, cpus made sane and memory saturating.
    #[must_use]
    pub fn saturating_add(&self, other: &Resources) -> Resources {
        Resources {
            cpus: sane_cpus(self.cpus) + sane_cpus(other.cpus),
            mem_mb: self.mem_mb.saturating_add(other.mem_mb),
        }
    }

    /// `self - other`, never below zero.
    #[must_use]
    pub fn saturating_sub(&self, other: &Resources) -> Resources {
        let (a, b) = (sane_cpus(self.cpus), sane_cpus(other.cpus));
        Resources {
            cpus: if b >= a { 0.0 } else { a - b },
            mem_mb: self.mem_mb.saturating_sub(other.mem_mb),
        }
    }

    /// The most cpus a task may need and still fit in `self` taken as free resources: the
    /// sane amount plus [`CPU_EPSILON`]. Indexes that compare cpus by value (the
    /// blocked-queue's) compare with this, so they agree with [`fits_in`](Self::fits_in).
    pub fn cpu_headroom(&self) -> f64 {
        sane_cpus(self.cpus) + CPU_EPSILON
    }

    /// Whether a task needing `self` fits in `free`, cpus and memory both. The one fit rule.
    pub fn fits_in(&self, free: &Resources) -> bool {
        sane_cpus(self.cpus) <= free.cpu_headroom() && self.mem_mb <= free.mem_mb
    }
}

/// How full an agent with `total` is when `used` is taken: the mean of its cpu and memory
/// fractions, each in `0.0..=1.0` for a sane agent (a dimension the agent has none of counts as
/// full once anything uses it). Never NaN.
pub fn utilization(used: &Resources, total: &Resources) -> f64 {
    let cpu = fraction(sane_cpus(used.cpus), sane_cpus(total.cpus));
    // u64 -> f64 loses precision only beyond 2^53 MiB, far past any real agent.
    let mem = fraction(used.mem_mb as f64, total.mem_mb as f64);
    (cpu + mem) / 2.0
}

fn fraction(used: f64, total: f64) -> f64 {
    if total <= 0.0 {
        return if used > 0.0 { 1.0 } else { 0.0 };
    }
    let f = used / total;
    if f.is_nan() { 1.0 } else { f }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(cpus: f64, mem_mb: u64) -> Resources {
        Resources { cpus, mem_mb }
    }

    #[test]
    fn sums_of_fractions_fit_their_total() {
        let mut used = r(0.0, 0);
        for _ in 0..10 {
            used = used.saturating_add(&r(0.1, 1));
        }
        // 0.1 added ten times is not exactly 1.0 in floating point.
        assert!(used.fits_in(&r(1.0, 10)));
        assert!(!used.saturating_add(&r(0.01, 0)).fits_in(&r(1.0, 10)));
        assert!(!r(0.0, 11).fits_in(&r(1.0, 10)));
    }

    #[test]
    fn malformed_amounts_neither_panic_nor_poison() {
        assert_eq!(r(1.0, 5).saturating_sub(&r(2.0, 10)), r(0.0, 0));
        assert_eq!(
            r(f64::NAN, u64::MAX).saturating_add(&r(-3.0, 1)),
            r(0.0, u64::MAX)
        );
        assert!(r(f64::NAN, 0).fits_in(&r(0.0, 0)));
        assert!(!r(1.0, 0).fits_in(&r(f64::NAN, 0)));
        assert_eq!(
            r(f64::INFINITY, 0)
                .saturating_sub(&r(f64::INFINITY, 0))
                .cpus,
            0.0
        );
        for (used, total) in [
            (r(1.0, 1), r(0.0, 0)),
            (r(f64::INFINITY, 0), r(f64::INFINITY, 0)),
            (r(f64::NAN, 0), r(f64::NAN, 0)),
        ] {
            assert!(!utilization(&used, &total).is_nan());
        }
        assert_eq!(utilization(&r(1.0, 512), &r(2.0, 1024)), 0.5);
        assert_eq!(utilization(&r(0.0, 0), &r(0.0, 0)), 0.0);
    }

    #[test]
    fn headroom_agrees_with_fits_in() {
        for (need, free) in [
            (0.3, 0.1 + 0.2),
            (0.1 + 0.2, 0.3),
            (1.0, 0.999),
            (0.0, f64::NAN),
        ] {
            assert_eq!(
                sane_cpus(need) <= r(free, 0).cpu_headroom(),
                r(need, 0).fits_in(&r(free, 0)),
                "{need} in {free}"
            );
        }
    }
}
