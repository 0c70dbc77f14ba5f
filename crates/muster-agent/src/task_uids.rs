//! Dynamic task uids, as systemd's `DynamicUser=`: an agent running as root runs each task
//! whose job names no user (when its config names no `task_user` either) as a uid of the
//! task's own, taken from a configured range ([`UidRange`], by default systemd's dynamic range
//! 61184-65519), its group the same number, with no supplementary groups. No two live tasks of
//! the agent share one, so a task cannot read another's environment in `/proc`, signal it, or
//! open its working directory and output.
//!
//! A uid is held by a [`UidLease`] for as long as the task runs: from its start, or from the
//! agent's re-attach after a restart (the uid is then read back from the owner of the task's
//! working directory, which the task cannot change), until its processes have been reaped. At
//! that end its working directory goes back to root (the agent), so that a later task given
//! the same uid cannot reach what the earlier one left there.
//!
//! The range is the operator's promise that no other user of the machine has those ids: they
//! are not looked up in the user database.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};

/// A range of uids, both ends included, none of them root's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UidRange {
    /// The first uid of the range.
    first: u32,
    /// The last uid of the range, at least `first`.
    last: u32,
}

/// The default of [`AgentConfig::task_uid_range`](crate::AgentConfig::task_uid_range):
/// systemd's range for dynamic users, 61184-65519.
pub const DEFAULT_TASK_UID_RANGE: UidRange = UidRange {
    first: 61184,
    last: 65519,
};

/// Why a text or two numbers are not a [`UidRange`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UidRangeError {
    /// The text is not two numbers joined by `-`.
    #[error("expected START-END (two uids, e.g. 61184-65519), got {0:?}")]
    Malformed(String),
    /// The range starts at root's uid.
    #[error("the range {first}-{last} holds uid 0 (root): tasks must never run as root")]
    HoldsRoot {
        /// Its first uid.
        first: u32,
        /// Its last uid.
        last: u32,
    },
    /// The range ends before it starts.
    #[error("the range {first}-{last} ends before it starts")]
    Reversed {
        /// Its first uid.
        first: u32,
        /// Its last uid.
        last: u32,
    },
}

impl UidRange {
    /// The uids `first` to `last`, both included.
    ///
    /// # Errors
    /// [`UidRangeError::HoldsRoot`] if `first` is 0, [`UidRangeError::Reversed`] if `last` is
    /// below `first`.
    pub const fn new(first: u32, last: u32) -> Result<UidRange, UidRangeError> {
        if first == 0 {
            return Err(UidRangeError::HoldsRoot { first, last });
        }
        if last < first {
            return Err(UidRangeError::Reversed { first, last });
        }
        Ok(UidRange { first, last })
    }

    /// Its first uid.
    pub const fn first(&self) -> u32 {
        self.first
    }

    /// Its last uid.
    pub const fn last(&self) -> u32 {
        self.last
    }

    /// How many uids it holds (at least one).
    pub const fn count(&self) -> u64 {
        self.last as u64 - self.first as u64 + 1
    }

    /// Whether `uid` is in it.
    pub const fn contains(&self, uid: u32) -> bool {
        self.first <= uid && uid <= self.last
    }
}

/// `START-END`, as the flag and the config file take it.
impl fmt::Display for UidRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// From `START-END` (spaces around either number are ignored): `61184-65519`.
impl FromStr for UidRange {
    type Err = UidRangeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let malformed = || UidRangeError::Malformed(text.to_owned());
        let (first, last) = text.split_once('-').ok_or_else(malformed)?;
        let number = |part: &str| {
            let part = part.trim();
            // `u32::from_str` takes a leading `+`: a range does not.
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(malformed());
            }
            part.parse::<u32>().map_err(|_| malformed())
        };
        UidRange::new(number(first)?, number(last)?)
    }
}

/// From the same text as the flag, `"61184-65519"`.
impl<'de> serde::Deserialize<'de> for UidRange {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Every uid of the range is held by a running task.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no free task uid in {range}: {running} tasks running")]
pub(crate) struct NoFreeUid {
    /// The range.
    pub(crate) range: UidRange,
    /// How many tasks hold one.
    pub(crate) running: usize,
}

/// Which uids of the range are held, and where the search for a free one goes on.
#[derive(Debug)]
struct Held {
    /// Each held uid, with how many leases hold it (more than one only for tasks an earlier run
    /// left sharing one, found as the agent re-attached them).
    uids: BTreeMap<u32, usize>,
    /// The uid the next search starts at: handing uids out in turn, a freed one is not given
    /// again at once.
    next: u32,
}

/// The agent's dynamic task uids: which of its range running tasks hold (see the module).
/// Clones share the same uids.
#[derive(Clone, Debug)]
pub(crate) struct TaskUids {
    range: UidRange,
    held: Arc<Mutex<Held>>,
}

impl TaskUids {
    /// None of `range` held yet.
    pub(crate) fn new(range: UidRange) -> TaskUids {
        TaskUids {
            range,
            held: Arc::new(Mutex::new(Held {
                uids: BTreeMap::new(),
                next: range.first,
            })),
        }
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        // A panic while holding the lock leaves the map as it was: nothing half-done in it.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many uids are held.
    pub(crate) fn in_use(&self) -> usize {
        self.held().uids.len()
    }

    /// Whether a uid is free now (for a check before a task is accepted; [`take`](Self::take)
    /// decides).
    ///
    /// # Errors
    /// [`NoFreeUid`] if every uid of the range is held.
    pub(crate) fn check_free(&self) -> Result<(), NoFreeUid> {
        let running = self.in_use();
        if (running as u64) < self.range.count() {
            Ok(())
        } else {
            Err(NoFreeUid {
                range: self.range,
                running,
            })
        }
    }

    /// A free uid of the range, held for the task whose working directory is `dir` until the
    /// lease ends (or is dropped). Uids are handed out in turn from the last one given.
    ///
    /// # Errors
    /// [`NoFreeUid`] if every uid of the range is held.
    pub(crate) fn take(&self, dir: &Path) -> Result<UidLease, NoFreeUid> {
        let mut held = self.held();
        let (first, last) = (self.range.first, self.range.last);
        let start = if self.range.contains(held.next) {
            held.next
        } else {
            first
        };
        let free = (start..=last)
            .chain(first..start)
            .find(|uid| !held.uids.contains_key(uid))
            .ok_or(NoFreeUid {
                range: self.range,
                running: held.uids.len(),
            })?;
        held.uids.insert(free, 1);
        held.next = if free == last { first } else { free + 1 };
        Ok(self.lease(free, dir))
    }

    /// Holds `uid` for a running task an earlier run of the agent started (see
    /// [`owner_in_range`](Self::owner_in_range)); `None` if it is not in the range (the task
    /// runs as a user of its own, or of an earlier range: no task is given it).
    pub(crate) fn hold(&self, uid: u32, dir: &Path) -> Option<UidLease> {
        if !self.range.contains(uid) {
            return None;
        }
        let mut held = self.held();
        let holders = held.uids.entry(uid).or_insert(0);
        *holders += 1;
        if *holders > 1 {
            tracing::warn!(uid, dir = %dir.display(), "two running tasks found with the same task uid");
        }
        drop(held);
        Some(self.lease(uid, dir))
    }

    /// The owner of `dir` (a task's working directory), if it is a uid of the range: the uid
    /// its task was given.
    pub(crate) fn owner_in_range(&self, dir: &Path) -> Option<u32> {
        let owner = std::fs::symlink_metadata(dir).ok()?.uid();
        self.range.contains(owner).then_some(owner)
    }

    /// `dir`, the working directory of a task that has ended, goes back to root if a uid of
    /// the range owns it (see [`UidLease::end`]); for tasks that ended while no agent ran.
    pub(crate) fn close_dir(&self, dir: &Path) {
        if self.owner_in_range(dir).is_some() {
            close(dir);
        }
    }

    fn lease(&self, uid: u32, dir: &Path) -> UidLease {
        UidLease {
            uid,
            dir: dir.to_owned(),
            uids: self.clone(),
        }
    }

    /// One holder of `uid` is gone.
    fn free(&self, uid: u32) {
        let mut held = self.held();
        if let Some(holders) = held.uids.get_mut(&uid) {
            *holders -= 1;
            if *holders == 0 {
                held.uids.remove(&uid);
            }
        }
    }
}

/// A running task's hold on its uid. [`end`](UidLease::end) it once the task's processes are
/// reaped; dropped without that (the agent stops, its task keeps running for the next run to
/// re-attach), it frees the uid in this run's [`TaskUids`] only.
#[derive(Debug)]
pub(crate) struct UidLease {
    uid: u32,
    /// The task's working directory.
    dir: PathBuf,
    uids: TaskUids,
}

impl UidLease {
    /// The uid.
    pub(crate) fn uid(&self) -> u32 {
        self.uid
    }

    /// The task has ended and its processes are reaped: its working directory goes back to
    /// root (what it left there is out of reach of the next task given this uid), and the uid
    /// is free.
    pub(crate) fn end(self) {
        close(&self.dir);
    }
}

impl Drop for UidLease {
    fn drop(&mut self) {
        self.uids.free(self.uid);
    }
}

/// Gives `dir` to root, keeping its mode (0700): no one else enters it any more.
fn close(dir: &Path) {
    match std::os::unix::fs::lchown(dir, Some(0), Some(0)) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "cannot give an ended task's directory back to root");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_parses_from_start_end_and_bad_ones_say_why() {
        assert_eq!("61000-61999".parse(), UidRange::new(61000, 61999));
        assert_eq!(" 7 - 7 ".parse::<UidRange>().map(|r| r.count()), Ok(1));
        assert_eq!(DEFAULT_TASK_UID_RANGE.to_string(), "61184-65519");
        assert_eq!(
            DEFAULT_TASK_UID_RANGE.to_string().parse(),
            Ok(DEFAULT_TASK_UID_RANGE)
        );
        for bad in [
            "",
            "61000",
            "61000-",
            "-61999",
            "a-b",
            "1-2-3",
            "+1-2",
            "1-99999999999",
        ] {
            let error = bad.parse::<UidRange>().unwrap_err().to_string();
            assert!(
                error.contains("expected START-END") && error.contains(&format!("{bad:?}")),
                "{bad:?}: {error}"
            );
        }
        let error = "0-100".parse::<UidRange>().unwrap_err().to_string();
        assert!(error.contains("root"), "{error}");
        let error = "61999-61000".parse::<UidRange>().unwrap_err().to_string();
        assert!(
            error.contains("61999-61000") && error.contains("before"),
            "{error}"
        );
    }

    #[test]
    fn uids_are_unique_among_holders_freed_at_their_end_and_given_in_turn() {
        let dir = Path::new("/nonexistent/muster-task");
        let uids = TaskUids::new(UidRange::new(100, 102).unwrap());
        let a = uids.take(dir).unwrap();
        let b = uids.take(dir).unwrap();
        assert_eq!((a.uid(), b.uid()), (100, 101));
        assert_eq!(uids.in_use(), 2);
        a.end();
        assert_eq!(uids.in_use(), 1);
        // In turn: the freed 100 comes after 102.
        let c = uids.take(dir).unwrap();
        assert_eq!(c.uid(), 102);
        let d = uids.take(dir).unwrap();
        assert_eq!(d.uid(), 100);
        assert!(uids.check_free().is_err());
        drop((b, c, d));
        assert_eq!(uids.in_use(), 0);
        // Nothing leaks: many tasks, one after the other, never run out.
        for _ in 0..10 {
            let lease = uids.take(dir).unwrap();
            assert!((100..=102).contains(&lease.uid()));
            lease.end();
        }
        assert_eq!(uids.in_use(), 0);
    }

    #[test]
    fn a_range_of_one_runs_one_task_at_a_time_and_says_so() {
        let dir = Path::new("/nonexistent/muster-task");
        let uids = TaskUids::new(UidRange::new(61184, 61184).unwrap());
        let only = uids.take(dir).unwrap();
        let error = uids.take(dir).unwrap_err().to_string();
        assert_eq!(error, "no free task uid in 61184-61184: 1 tasks running");
        assert_eq!(uids.check_free().unwrap_err().to_string(), error);
        only.end();
        assert!(uids.check_free().is_ok());
        assert_eq!(uids.take(dir).unwrap().uid(), 61184);
    }

    #[test]
    fn uids_of_re_attached_tasks_stay_held_and_others_are_not_counted() {
        let dir = Path::new("/nonexistent/muster-task");
        let uids = TaskUids::new(UidRange::new(200, 201).unwrap());
        assert!(uids.hold(65534, dir).is_none(), "not in the range");
        let recovered = uids.hold(200, dir).unwrap();
        let twin = uids.hold(200, dir).unwrap();
        let new = uids.take(dir).unwrap();
        assert_eq!(new.uid(), 201);
        assert!(uids.take(dir).is_err());
        drop(recovered);
        assert!(uids.take(dir).is_err(), "200 is still held by its twin");
        drop(twin);
        assert_eq!(uids.take(dir).unwrap().uid(), 200);
    }
}
