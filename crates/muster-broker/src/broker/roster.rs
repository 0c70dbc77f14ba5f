//! Which scheduler names workers serve ([`SchedulerRoster`]): what lets an evaluation for a
//! name nobody serves say so, read by whoever holds a copy (the master's lists) without
//! asking the broker.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::protocol::SchedulerPresence;

/// The scheduler names workers serve, as the broker sees its dequeues: a name is served while
/// a worker waits on it, and for [`gone_after`](Self::new) after a worker last asked for it
/// (a worker between two long polls is planning, not gone). Cloning shares it.
#[derive(Clone, Debug)]
pub struct SchedulerRoster {
    inner: Arc<Mutex<Roster>>,
    gone_after: Duration,
}

#[derive(Debug, Default)]
struct Roster {
    /// When each name was last asked for, on tokio's clock and as Unix time in ms.
    last: HashMap<String, (Instant, u64)>,
    /// How many dequeues wait on each name now.
    waiting: HashMap<String, usize>,
}

impl SchedulerRoster {
    /// An empty roster: a name counts as no longer served `gone_after` after its last
    /// worker's last dequeue ended.
    pub fn new(gone_after: Duration) -> Self {
        SchedulerRoster {
            inner: Arc::default(),
            gone_after,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Roster> {
        // Every change leaves the maps whole: a panic elsewhere cannot leave them half-done.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A worker asked for `names` now (or its dequeue on them ended, still wanted).
    pub(super) fn asked(&self, names: &[String]) {
        let now = (Instant::now(), muster_model::clock::unix_ms());
        let mut roster = self.lock();
        for name in names {
            match roster.last.get_mut(name) {
                Some(last) => *last = now,
                None => {
                    roster.last.insert(name.clone(), now);
                }
            }
        }
    }

    /// A dequeue on `names` starts waiting (`true`) or stops (`false`).
    pub(super) fn waiting(&self, names: &[String], starts: bool) {
        let mut roster = self.lock();
        for name in names {
            if starts {
                *roster.waiting.entry(name.clone()).or_default() += 1;
            } else if let Some(n) = roster.waiting.get_mut(name) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    roster.waiting.remove(name);
                }
            }
        }
    }

    /// No dequeue waits any more (the broker stopped serving).
    pub(super) fn none_waiting(&self) {
        self.lock().waiting.clear();
    }

    /// Whether a worker serves `name` now.
    pub fn presence(&self, name: &str) -> SchedulerPresence {
        let roster = self.lock();
        self.presence_in(&roster, name, Instant::now())
    }

    /// Every name a worker has asked for, and whether one serves it now.
    pub fn all(&self) -> BTreeMap<String, SchedulerPresence> {
        let roster = self.lock();
        let now = Instant::now();
        roster
            .last
            .keys()
            .map(|name| (name.clone(), self.presence_in(&roster, name, now)))
            .collect()
    }

    fn presence_in(&self, roster: &Roster, name: &str, now: Instant) -> SchedulerPresence {
        let last = roster.last.get(name);
        let recent =
            last.is_some_and(|(at, _)| now.saturating_duration_since(*at) < self.gone_after);
        SchedulerPresence {
            served: recent || roster.waiting.contains_key(name),
            last_served_ms: last.map(|(_, ms)| *ms),
        }
    }

    /// Why evaluations for `scheduler` wait, if no worker serves it: `no scheduler "gang"
    /// connected since …` (the time of its last dequeue, in UTC) or `… has connected to this
    /// leader`.
    pub fn unserved_reason(&self, scheduler: &str) -> Option<String> {
        let presence = self.presence(scheduler);
        if presence.served {
            return None;
        }
        Some(match presence.last_served_ms {
            Some(ms) => {
                let at = std::time::UNIX_EPOCH + Duration::from_millis(ms);
                format!(
                    "no scheduler {scheduler:?} connected since {}",
                    humantime::format_rfc3339_seconds(at)
                )
            }
            None => format!("no scheduler {scheduler:?} has connected to this leader"),
        })
    }
}

impl Default for SchedulerRoster {
    fn default() -> Self {
        SchedulerRoster::new(super::protocol::BrokerConfig::default().scheduler_gone_after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_name_is_served_while_a_worker_waits_and_for_a_while_after() {
        let roster = SchedulerRoster::new(Duration::from_secs(5));
        let gang = vec!["gang".to_owned()];
        assert_eq!(roster.presence("gang"), SchedulerPresence::default());
        let never = roster.unserved_reason("gang").unwrap_or_default();
        assert!(never.contains("has connected"), "{never}");

        roster.asked(&gang);
        roster.waiting(&gang, true);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(roster.presence("gang").served, "a waiting worker serves it");
        roster.waiting(&gang, false);
        assert!(!roster.presence("gang").served, "its last ask is long past");
        roster.asked(&gang);
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(roster.presence("gang").served);
        assert_eq!(roster.unserved_reason("gang"), None);
        tokio::time::advance(Duration::from_secs(2)).await;
        let reason = roster.unserved_reason("gang").unwrap_or_default();
        assert!(
            reason.starts_with("no scheduler \"gang\" connected since "),
            "{reason}"
        );
        assert_eq!(roster.all().keys().collect::<Vec<_>>(), ["gang"]);
    }
}
