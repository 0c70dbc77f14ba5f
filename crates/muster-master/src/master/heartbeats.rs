//! Agent heartbeats: the deadlines the leading master tracks, and the TTLs it hands out.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Master;

/// The heartbeat deadlines of the agents the leading master tracks, in the order they fall due:
/// one periodic sweep takes the overdue ones, with no timer per agent. Both indexes share one
/// copy of each agent's id, so moving a deadline allocates nothing.
#[derive(Debug, Default)]
pub(super) struct HeartbeatDeadlines {
    by_deadline: BTreeSet<(Instant, Arc<str>)>,
    by_agent: HashMap<Arc<str>, Instant>,
}

impl HeartbeatDeadlines {
    /// How many agents are tracked.
    pub(super) fn len(&self) -> usize {
        self.by_agent.len()
    }

    pub(super) fn get(&self, id: &str) -> Option<Instant> {
        self.by_agent.get(id).copied()
    }

    /// Sets (or moves) the agent's deadline.
    pub(super) fn set(&mut self, id: &str, deadline: Instant) {
        let key = match self.by_agent.get_key_value(id) {
            Some((key, old)) => {
                let entry = (*old, Arc::clone(key));
                self.by_deadline.remove(&entry);
                entry.1
            }
            None => Arc::from(id),
        };
        self.by_agent.insert(Arc::clone(&key), deadline);
        self.by_deadline.insert((deadline, key));
    }

    pub(super) fn remove(&mut self, id: &str) {
        if let Some((key, old)) = self.by_agent.remove_entry(id) {
            self.by_deadline.remove(&(old, key));
        }
    }

    /// Takes out the agents whose deadline is at or before `now`, earliest first.
    pub(super) fn take_expired(&mut self, now: Instant) -> Vec<String> {
        let mut expired = Vec::new();
        while let Some((deadline, _)) = self.by_deadline.first() {
            if *deadline > now {
                break;
            }
            if let Some((_, id)) = self.by_deadline.pop_first() {
                self.by_agent.remove(&id);
                expired.push(id.as_ref().to_owned());
            }
        }
        expired
    }

    pub(super) fn clear(&mut self) {
        self.by_deadline.clear();
        self.by_agent.clear();
    }
}

/// The longest heartbeat TTL the master gives, whatever the config says (keeps the arithmetic
/// on instants from overflowing).
pub(super) const MAX_HEARTBEAT_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The TTL before stagger for `agents` agents: `max(min_ttl, agents / per_second s)`.
fn base_ttl(min_ttl: Duration, per_second: f64, agents: usize) -> Duration {
    let scaled = if per_second > 0.0 {
        Duration::try_from_secs_f64(agents as f64 / per_second).unwrap_or(MAX_HEARTBEAT_TTL)
    } else {
        Duration::ZERO
    };
    min_ttl.max(scaled).min(MAX_HEARTBEAT_TTL)
}

/// How often the leading master looks for overdue heartbeats: a tenth of the minimum TTL,
/// between 10 ms and 1 s.
pub(super) fn sweep_period(min_ttl: Duration) -> Duration {
    (min_ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

impl Master {
    /// The agent was just heard from: gives it a new TTL (with stagger) and moves its deadline
    /// to that TTL plus the grace from now. Returns the TTL.
    pub(super) fn heartbeat_received(&mut self, id: &str) -> Duration {
        let (ttl, deadline) = self.next_heartbeat(self.heartbeats.get(id).is_none());
        self.heartbeats.set(id, deadline);
        ttl
    }

    /// An agent was just heard from, and its deadline is never moved earlier: the long first
    /// TTL a new leader gave it stays until a heartbeat reaches past it.
    pub(super) fn heartbeat_received_not_earlier(&mut self, id: &str) {
        let current = self.heartbeats.get(id);
        let (_, deadline) = self.next_heartbeat(current.is_none());
        if current.is_none_or(|current| deadline > current) {
            self.heartbeats.set(id, deadline);
        }
    }

    /// A new TTL (with stagger) for an agent heard from now, and the deadline it gives, that
    /// TTL plus the grace from now; `new_agent`: the agent is not tracked yet.
    fn next_heartbeat(&self, new_agent: bool) -> (Duration, Instant) {
        // The agent itself counts: a first heartbeat is for one more agent.
        let agents = self.heartbeats.len() + usize::from(new_agent);
        let base = base_ttl(
            self.config.heartbeat_min_ttl,
            self.config.heartbeats_per_second,
            agents,
        );
        let ttl = base + base.mul_f64(fastrand::f64());
        let deadline = Instant::now() + ttl + self.config.heartbeat_grace.min(MAX_HEARTBEAT_TTL);
        (ttl, deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ttl_grows_with_the_agents_past_the_minimum() {
        let min = Duration::from_secs(10);
        assert_eq!(base_ttl(min, 50.0, 0), min);
        assert_eq!(base_ttl(min, 50.0, 500), min);
        assert_eq!(base_ttl(min, 50.0, 40_000), Duration::from_secs(800));
        assert_eq!(base_ttl(min, 0.0, 40_000), min);
        assert_eq!(base_ttl(min, f64::NAN, 40_000), min);
        assert_eq!(base_ttl(min, 1e-300, 40_000), MAX_HEARTBEAT_TTL);
    }

    #[test]
    fn the_sweep_period_is_a_tenth_of_the_minimum_ttl_within_bounds() {
        assert_eq!(
            sweep_period(Duration::from_secs(10)),
            Duration::from_secs(1)
        );
        assert_eq!(
            sweep_period(Duration::from_millis(200)),
            Duration::from_millis(20)
        );
        assert_eq!(sweep_period(Duration::ZERO), Duration::from_millis(10));
    }

    #[test]
    fn deadlines_come_out_in_order_and_move_when_set_again() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut deadlines = HeartbeatDeadlines::default();
        deadlines.set("a", at(30));
        deadlines.set("b", at(10));
        deadlines.set("c", at(20));
        deadlines.set("b", at(40));
        deadlines.remove("c");
        assert_eq!(deadlines.len(), 2);
        assert!(deadlines.take_expired(at(29)).is_empty());
        assert_eq!(deadlines.take_expired(at(40)), ["a", "b"]);
        assert_eq!(deadlines.len(), 0);
        assert_eq!(deadlines.by_deadline.len(), 0);
    }
}
