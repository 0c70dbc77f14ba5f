//! Agent heartbeats: the deadlines the leading master tracks, and the TTLs it hands out.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use muster_actor::Context;

use super::CheckHeartbeats;
use crate::master::Master;

/// The heartbeat deadlines of the agents the leading master tracks, in the order they fall due:
/// one periodic sweep takes the overdue ones, with no timer per agent.
///
/// Moving a deadline is the common case (every heartbeat moves one), so it is a map update and
/// a push on a min-heap; the deadline it replaces stays in the heap, stale, until it comes to
/// the top and is found not to be the agent's deadline any more. The heap is rebuilt from the
/// map when stale entries outnumber live ones, so it holds at most about twice as many entries
/// as there are agents. The map and the heap share one copy of each agent's id.
#[derive(Debug, Default)]
pub(in crate::master) struct HeartbeatDeadlines {
    by_agent: HashMap<Arc<str>, Instant>,
    /// Every deadline in `by_agent`, and deadlines since moved or removed (stale).
    due: BinaryHeap<Reverse<(Instant, Arc<str>)>>,
}

impl HeartbeatDeadlines {
    /// How many agents are tracked.
    pub(in crate::master) fn len(&self) -> usize {
        self.by_agent.len()
    }

    pub(in crate::master) fn get(&self, id: &str) -> Option<Instant> {
        self.by_agent.get(id).copied()
    }

    /// Sets (or moves) the agent's deadline.
    pub(in crate::master) fn set(&mut self, id: &str, deadline: Instant) {
        let key = match self.by_agent.get_key_value(id) {
            Some((key, _)) => Arc::clone(key),
            None => Arc::from(id),
        };
        self.by_agent.insert(Arc::clone(&key), deadline);
        self.due.push(Reverse((deadline, key)));
        self.compact_if_mostly_stale();
    }

    pub(in crate::master) fn remove(&mut self, id: &str) {
        self.by_agent.remove(id);
        self.compact_if_mostly_stale();
    }

    /// Takes out the agents whose deadline is at or before `now`, earliest first.
    pub(in crate::master) fn take_expired(&mut self, now: Instant) -> Vec<String> {
        let mut expired = Vec::new();
        while let Some(Reverse((deadline, _))) = self.due.peek() {
            if *deadline > now {
                break;
            }
            let Some(Reverse((deadline, id))) = self.due.pop() else {
                break;
            };
            // Only if it is still the agent's deadline (not moved or removed since).
            if self.by_agent.get(&id) == Some(&deadline) {
                self.by_agent.remove(&id);
                expired.push(id.as_ref().to_owned());
            }
        }
        expired
    }

    pub(in crate::master) fn clear(&mut self) {
        self.due.clear();
        self.by_agent.clear();
    }

    /// Rebuilds the heap from the live deadlines once most of its entries are stale.
    fn compact_if_mostly_stale(&mut self) {
        if self.due.len() > 2 * self.by_agent.len() + 64 {
            self.due = self
                .by_agent
                .iter()
                .map(|(id, deadline)| Reverse((*deadline, Arc::clone(id))))
                .collect();
        }
    }
}

/// The longest heartbeat TTL the master gives, whatever the config says (keeps the arithmetic
/// on instants from overflowing).
pub(in crate::master) const MAX_HEARTBEAT_TTL: Duration = Duration::from_secs(24 * 60 * 60);

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
pub(in crate::master) fn sweep_period(min_ttl: Duration) -> Duration {
    (min_ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

impl Master {
    /// The agent was just heard from: gives it a new TTL (with stagger) and moves its deadline
    /// to that TTL plus the grace from now. Returns the TTL.
    pub(in crate::master) fn heartbeat_received(&mut self, id: &str) -> Duration {
        let (ttl, deadline) = self.next_heartbeat(self.heartbeats.get(id).is_none());
        self.heartbeats.set(id, deadline);
        ttl
    }

    /// An agent was just heard from, and its deadline is never moved earlier: the long first
    /// TTL a new leader gave it stays until a heartbeat reaches past it.
    pub(in crate::master) fn heartbeat_received_not_earlier(&mut self, id: &str) {
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

    /// Marks the connected agents whose heartbeat deadline passed unreachable. Agents still
    /// awaited after a failover are left to the re-registration deadline (and its removal
    /// limit).
    pub(in crate::master) fn check_heartbeats(
        &mut self,
        _timer: CheckHeartbeats,
        ctx: &mut Context<Self>,
    ) {
        if self.leading_term().is_none() {
            return;
        }
        let mut gone = Vec::new();
        for id in self.heartbeats.take_expired(Instant::now()) {
            let Some(agent) = self.cluster.agents.get_mut(&id) else {
                continue;
            };
            if !agent.connected {
                continue;
            }
            agent.connected = false;
            tracing::warn!(agent = %id, "agent missed its heartbeat deadline");
            gone.push(id);
        }
        self.mark_unreachable(gone, false, ctx);
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
    }

    #[test]
    fn deadlines_moved_many_times_keep_the_heap_bounded_and_expire_once() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut deadlines = HeartbeatDeadlines::default();
        let ids: Vec<String> = (0..100).map(|n| format!("agent-{n}")).collect();
        for round in 0..50 {
            for (n, id) in ids.iter().enumerate() {
                deadlines.set(id, at(1_000 + round * 10 + n as u64));
            }
            assert!(deadlines.due.len() <= 2 * ids.len() + 64 + 1);
        }
        // Moved earlier: the later, stale deadline does not expire it a second time.
        deadlines.set("agent-0", at(5));
        deadlines.remove("agent-1");
        assert_eq!(deadlines.take_expired(at(5)), ["agent-0"]);
        let expired = deadlines.take_expired(at(10_000));
        assert_eq!(expired.len(), 98);
        assert!(!expired.iter().any(|id| id == "agent-0" || id == "agent-1"));
        let mut sorted = expired.clone();
        sorted.sort_by_key(|id| deadlines_order(id));
        assert_eq!(expired, sorted, "earliest first");
        assert!(deadlines.take_expired(at(20_000)).is_empty());
        assert_eq!(deadlines.len(), 0);
    }

    /// The order the last round's deadlines fall due in: by the agent's number.
    fn deadlines_order(id: &str) -> u64 {
        id.trim_start_matches("agent-").parse().unwrap_or(u64::MAX)
    }
}
