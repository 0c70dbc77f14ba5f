//! Arithmetic on [`Resources`] that never panics and never produces NaN.
//!
//! Amounts come from job files and agents, so they are outside input: a NaN or negative cpu
//! amount counts as zero (as in the blocked-queue), memory saturates instead of overflowing, and
//! a subtraction never goes below zero.

use muster_registry::Resources;

/// Slack allowed when comparing cpus, so that sums of fractions (0.1 + 0.2 ...) that equal an
/// agent's total on paper still fit.
const CPU_EPSILON: f64 = 1e-9;

/// A cpu amount made safe to add and compare: NaN and negatives are zero.
pub(crate) fn cpus(amount: f64) -> f64 {
    if amount.is_nan() || amount < 0.0 {
        0.0
    } else {
        amount
    }
}

/// `a + b`.
pub(crate) fn add(a: &Resources, b: &Resources) -> Resources {
    Resources {
        cpus: cpus(a.cpus) + cpus(b.cpus),
        mem_mb: a.mem_mb.saturating_add(b.mem_mb),
    }
}

/// `a - b`, never below zero.
pub(crate) fn sub(a: &Resources, b: &Resources) -> Resources {
    let (a_cpus, b_cpus) = (cpus(a.cpus), cpus(b.cpus));
    Resources {
        cpus: if b_cpus >= a_cpus {
            0.0
        } else {
            a_cpus - b_cpus
        },
        mem_mb: a.mem_mb.saturating_sub(b.mem_mb),
    }
}

/// Whether `need` fits in `free`, cpus and memory both.
pub(crate) fn fits(need: &Resources, free: &Resources) -> bool {
    cpus(need.cpus) <= cpus(free.cpus) + CPU_EPSILON && need.mem_mb <= free.mem_mb
}

/// How full an agent with `total` is when `used` is taken: the mean of its cpu and memory
/// fractions, each in `0.0..=1.0` for a sane agent (a dimension the agent has none of counts as
/// full once anything uses it). Never NaN.
pub fn utilization(used: &Resources, total: &Resources) -> f64 {
    let cpu = fraction(cpus(used.cpus), cpus(total.cpus));
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
            used = add(&used, &r(0.1, 1));
        }
        // 0.1 added ten times is not exactly 1.0 in floating point.
        assert!(fits(&used, &r(1.0, 10)));
        assert!(!fits(&add(&used, &r(0.01, 0)), &r(1.0, 10)));
        assert!(!fits(&r(0.0, 11), &r(1.0, 10)));
    }

    #[test]
    fn malformed_amounts_neither_panic_nor_poison() {
        assert_eq!(sub(&r(1.0, 5), &r(2.0, 10)), r(0.0, 0));
        assert_eq!(add(&r(f64::NAN, u64::MAX), &r(-3.0, 1)), r(0.0, u64::MAX));
        assert!(fits(&r(f64::NAN, 0), &r(0.0, 0)));
        assert_eq!(sub(&r(f64::INFINITY, 0), &r(f64::INFINITY, 0)).cpus, 0.0);
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
}
