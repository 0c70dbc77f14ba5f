//! The store's own integrity record, `muster-store.json` beside sled's files: what the store
//! is known to hold at least, written (atomically, synced) whenever that grows in a way that
//! is rare: a new vote (an election), a new purge point (a snapshot), and, at most every
//! [`LOG_FLOOR_EVERY`], the log's committed and durable end. At open the store is checked
//! against it, so a database that lost its state (truncated, half-copied, bit-flipped so that
//! sled's recovery stops early, replaced by an empty one) refuses to start instead of starting
//! with fewer entries, or empty, and rejoining as a member that forgot what it acknowledged.
//!
//! sled checks its own pages (a torn or corrupt segment is an error at open); this record
//! catches what sled's recovery cannot know was there.

use std::fs;
use std::io::{self, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::disk::MemoryDisk;

/// The file's name, in the store's directory.
pub const MARKER_FILE: &str = "muster-store.json";

/// The record's format.
const FORMAT: u32 = 1;

/// What the store is known to hold at least.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Floor {
    /// The record's format.
    pub(super) format: u32,
    /// The term of the last vote the store saved.
    pub(super) vote_term: u64,
    /// The index of the last purge point the store saved (the log before it lives in the
    /// snapshot).
    pub(super) purged_index: Option<u64>,
    /// An index up to which the store held its log durably, every entry of it committed (so
    /// never truncated by raft): its log or snapshot must reach it. A lower bound, raised at
    /// most every [`LOG_FLOOR_EVERY`]; absent in records written before it existed.
    #[serde(default)]
    pub(super) log_index: Option<u64>,
    /// Set when the store was started empty in place of a damaged one (`rejoin_damaged`): it
    /// may have acknowledged entries up to this index and lost them, so until its log reaches
    /// it again this member grants no vote and no pre-vote (a vote from a member that forgot
    /// what it acknowledged could elect a leader without a committed entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) rejoin_until: Option<u64>,
}

/// Why a store was refused, and what its record says it held: enough to start over empty
/// without forgetting its vote or what it acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// What is damaged and how to recover, naming the store.
    pub message: String,
    /// The term of the last vote the store saved.
    pub vote_term: u64,
    /// The highest index it is known to have held (committed and durable, or purged into a
    /// snapshot); 0 if the record cannot say.
    pub held_up_to: u64,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl Damage {
    /// A damage the record cannot say more about than `message`.
    fn unknown(message: String) -> Self {
        Damage {
            message,
            vote_term: 0,
            held_up_to: 0,
        }
    }
}

/// How often, at most, the record's log floor is raised (a write and a sync of the record):
/// the newest entries of that long may be lost undetected, the rest may not.
pub(super) const LOG_FLOOR_EVERY: Duration = Duration::from_millis(200);

/// What the store holds now, as read at open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Held {
    pub(super) vote_term: Option<u64>,
    pub(super) purged_index: Option<u64>,
    pub(super) snapshot_index: Option<u64>,
    pub(super) log_entries: usize,
    /// The index of the last entry in its log.
    pub(super) last_log_index: Option<u64>,
}

impl Held {
    fn is_empty(&self) -> bool {
        self.vote_term.is_none() && self.log_entries == 0 && self.snapshot_index.is_none()
    }
}

/// Where the record is kept: a file beside sled's, or on a [`MemoryDisk`] (written
/// durably at once, as the file is synced).
#[derive(Clone, Debug)]
pub(super) enum MarkerPlace {
    File(PathBuf),
    Memory(MemoryDisk),
}

impl MarkerPlace {
    /// In the store directory `dir`.
    pub(super) fn in_dir(dir: &Path) -> Self {
        MarkerPlace::File(dir.join(MARKER_FILE))
    }

    fn name(&self) -> String {
        match self {
            MarkerPlace::File(path) => path.display().to_string(),
            MarkerPlace::Memory(_) => format!("the in-memory store's {MARKER_FILE}"),
        }
    }

    fn read(&self) -> io::Result<Option<Vec<u8>>> {
        match self {
            MarkerPlace::File(path) => match fs::read(path) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            },
            MarkerPlace::Memory(disk) => Ok(disk.read_file(MARKER_FILE)),
        }
    }

    /// Writes the record: temporary file, sync, rename, sync of the directory.
    fn write(&self, bytes: Vec<u8>) -> io::Result<()> {
        let path = match self {
            MarkerPlace::File(path) => path,
            MarkerPlace::Memory(disk) => {
                disk.write_file(MARKER_FILE, bytes);
                return Ok(());
            }
        };
        let tmp = path.with_extension("json.tmp");
        {
            // Beside the registry, as private as it is.
            let mut file = fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
        }
        fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

/// The record, shared by the store's halves.
#[derive(Clone, Debug)]
pub(super) struct Marker {
    place: MarkerPlace,
    floor: Arc<Mutex<Floor>>,
    /// The last index appended and flushed, and the last committed one, as the log store
    /// saw them: the log floor's candidates.
    durable: Arc<AtomicU64>,
    committed: Arc<AtomicU64>,
    /// When the log floor was last raised.
    floor_raised: Arc<Mutex<Option<tokio::time::Instant>>>,
}

impl Marker {
    /// Checks `held` against the record at `place` and returns the record to keep up to date
    /// (`store` names the store in errors).
    /// A store with no record yet gets one for what it holds (a new store, or one from before
    /// the record existed).
    ///
    /// # Errors
    /// The record cannot be read or written, or the store holds less than it says: the
    /// message names the directory, what is missing, and how to recover.
    pub(super) fn check(store: &str, place: MarkerPlace, held: Held) -> Result<Marker, Damage> {
        let recorded = match place.read() {
            Ok(Some(bytes)) => Some(serde_json::from_slice::<Floor>(&bytes).map_err(|e| {
                Damage::unknown(format!(
                    "{} is unreadable ({e}); {}",
                    place.name(),
                    RECOVERY
                ))
            })?),
            Ok(None) => None,
            Err(e) => {
                return Err(Damage::unknown(format!(
                    "cannot read {}: {e}",
                    place.name()
                )));
            }
        };
        let floor = match recorded {
            Some(floor) => {
                if let Some(missing) = missing(&floor, &held) {
                    return Err(Damage {
                        message: format!(
                            "the registry store at {store} is damaged: {missing}; {RECOVERY}"
                        ),
                        vote_term: floor.vote_term,
                        held_up_to: floor
                            .log_index
                            .max(floor.purged_index)
                            .max(floor.rejoin_until)
                            .unwrap_or(0),
                    });
                }
                floor
            }
            None => Floor {
                format: FORMAT,
                vote_term: held.vote_term.unwrap_or(0),
                purged_index: held.purged_index,
                log_index: None,
                rejoin_until: None,
            },
        };
        let marker = Marker {
            place,
            floor: Arc::new(Mutex::new(floor)),
            durable: Arc::default(),
            committed: Arc::default(),
            floor_raised: Arc::default(),
        };
        if recorded.is_none() {
            marker.write(&floor).map_err(|e| {
                Damage::unknown(format!("cannot write {}: {e}", marker.place.name()))
            })?;
        }
        Ok(marker)
    }

    /// Records that this store, started empty in place of a damaged one, may have
    /// acknowledged entries up to `index`: it withholds votes until its log reaches it.
    pub(super) fn rejoining_until(&self, index: u64) -> io::Result<()> {
        self.raise(|floor| {
            Some(Floor {
                rejoin_until: Some(index).max(floor.rejoin_until),
                ..*floor
            })
        })
    }

    /// The index this member's log must reach before it votes again, if it is rejoining and
    /// its log (ending at `last_index`) has not reached it yet. Once it has, the record
    /// forgets it.
    pub(super) fn votes_withheld(&self, last_index: Option<u64>) -> io::Result<Option<u64>> {
        let until = {
            let floor = self.floor.lock().unwrap_or_else(|p| p.into_inner());
            floor.rejoin_until
        };
        let Some(until) = until else {
            return Ok(None);
        };
        if last_index.unwrap_or(0) < until {
            return Ok(Some(until));
        }
        self.raise(|floor| {
            floor.rejoin_until.map(|_| Floor {
                rejoin_until: None,
                ..*floor
            })
        })?;
        Ok(None)
    }

    /// Records that the store saved a vote of `term`.
    pub(super) fn saw_vote(&self, term: u64) -> io::Result<()> {
        self.raise(|floor| {
            (term > floor.vote_term).then_some(Floor {
                vote_term: term,
                ..*floor
            })
        })
    }

    /// Records that the store saved the purge point `index`.
    pub(super) fn saw_purge(&self, index: u64) -> io::Result<()> {
        self.raise(|floor| {
            (floor.purged_index < Some(index)).then_some(Floor {
                purged_index: Some(index),
                ..*floor
            })
        })
    }

    /// Records that the log holds entries up to `index`, flushed.
    pub(super) fn saw_appended(&self, index: u64) {
        self.durable.store(index, Ordering::Release);
    }

    /// Records that entries up to `index` are committed, and raises the log floor to what is
    /// both committed and durable if it was last raised [`LOG_FLOOR_EVERY`] ago or more.
    pub(super) fn saw_committed(&self, index: u64) -> io::Result<()> {
        self.committed.fetch_max(index, Ordering::AcqRel);
        let now = tokio::time::Instant::now();
        {
            let mut raised = self.floor_raised.lock().unwrap_or_else(|p| p.into_inner());
            if raised.is_some_and(|at| now.saturating_duration_since(at) < LOG_FLOOR_EVERY) {
                return Ok(());
            }
            *raised = Some(now);
        }
        let reached = self
            .durable
            .load(Ordering::Acquire)
            .min(self.committed.load(Ordering::Acquire));
        self.raise(|floor| {
            (reached > 0 && floor.log_index < Some(reached)).then_some(Floor {
                log_index: Some(reached),
                ..*floor
            })
        })
    }

    fn raise(&self, next: impl FnOnce(&Floor) -> Option<Floor>) -> io::Result<()> {
        let mut floor = self.floor.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(raised) = next(&floor) {
            self.write(&raised)?;
            *floor = raised;
        }
        Ok(())
    }

    fn write(&self, floor: &Floor) -> io::Result<()> {
        let bytes = serde_json::to_vec_pretty(floor).map_err(io::Error::other)?;
        self.place.write(bytes)
    }
}

/// How to recover, said with every refusal.
const RECOVERY: &str = "refusing to start over it. To recover, start this master with \
    --rejoin-damaged (or move the directory aside and start it again): it starts empty, catches \
    up from the other members, and votes only once it holds what it held. A single master has \
    no other member: restore the directory from a copy, or start empty and restore a snapshot \
    (muster operator snapshot restore)";

/// What the store lacks against the record, if anything.
fn missing(floor: &Floor, held: &Held) -> Option<String> {
    if floor.format > FORMAT {
        return Some(format!(
            "its record has format {}, newer than this master's {FORMAT}",
            floor.format
        ));
    }
    if held.is_empty() && (floor.vote_term > 0 || floor.purged_index.is_some()) {
        return Some("it holds no vote, no log and no snapshot, but it has held them".into());
    }
    if held.vote_term.unwrap_or(0) < floor.vote_term {
        return Some(format!(
            "its vote is of term {}, but it saved one of term {}",
            held.vote_term.unwrap_or(0),
            floor.vote_term
        ));
    }
    if let Some(floor_index) = floor.log_index {
        let end = [held.last_log_index, held.snapshot_index, held.purged_index]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(0);
        if end < floor_index {
            return Some(format!(
                "its log and snapshot end at index {end}, but it held committed entries up to \
                 index {floor_index}"
            ));
        }
    }
    if let Some(purged) = floor.purged_index {
        if held.purged_index.unwrap_or(0) < purged {
            return Some(format!(
                "its log was purged up to index {purged}, but it no longer says so"
            ));
        }
        if held.snapshot_index.unwrap_or(0) < purged {
            return Some(format!(
                "its snapshot does not cover the purged log (up to index {purged})"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_that_lost_what_its_record_says_is_refused() -> Result<(), String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let new = Held::default();
        let marker =
            Marker::check("dir", MarkerPlace::in_dir(dir.path()), new).map_err(|d| d.message)?;
        marker.saw_vote(3).map_err(|e| e.to_string())?;
        marker.saw_purge(100).map_err(|e| e.to_string())?;
        let whole = Held {
            vote_term: Some(3),
            purged_index: Some(100),
            snapshot_index: Some(120),
            log_entries: 7,
            last_log_index: Some(127),
        };
        assert!(Marker::check("dir", MarkerPlace::in_dir(dir.path()), whole).is_ok());
        let error =
            Marker::check("dir", MarkerPlace::in_dir(dir.path()), Held::default()).unwrap_err();
        assert!(
            error.message.contains("holds no vote")
                && error.message.contains("move the directory aside"),
            "{error}"
        );
        // What a member starting over empty must not forget.
        assert_eq!((error.vote_term, error.held_up_to), (3, 100));
        let older_vote = Held {
            vote_term: Some(2),
            ..whole
        };
        assert!(
            Marker::check("dir", MarkerPlace::in_dir(dir.path()), older_vote)
                .unwrap_err()
                .message
                .contains("term 3")
        );
        let no_snapshot = Held {
            snapshot_index: None,
            ..whole
        };
        assert!(
            Marker::check("dir", MarkerPlace::in_dir(dir.path()), no_snapshot)
                .unwrap_err()
                .message
                .contains("snapshot")
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_log_shorter_than_its_committed_and_durable_end_is_refused() -> Result<(), String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let marker = Marker::check("dir", MarkerPlace::in_dir(dir.path()), Held::default())
            .map_err(|d| d.message)?;
        marker.saw_vote(2).map_err(|e| e.to_string())?;
        // Committed beyond what is durable here: the floor is what is both.
        marker.saw_appended(40);
        marker.saw_committed(55).map_err(|e| e.to_string())?;
        let held = |last| Held {
            vote_term: Some(2),
            log_entries: 40,
            last_log_index: Some(last),
            ..Held::default()
        };
        assert!(Marker::check("dir", MarkerPlace::in_dir(dir.path()), held(40)).is_ok());
        let error = Marker::check("dir", MarkerPlace::in_dir(dir.path()), held(25)).unwrap_err();
        assert!(
            error.message.contains("end at index 25") && error.message.contains("up to index 40"),
            "{error}"
        );
        assert_eq!((error.vote_term, error.held_up_to), (2, 40));
        Ok(())
    }

    #[test]
    fn a_rejoining_store_withholds_votes_until_its_log_reaches_what_it_held() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let place = || MarkerPlace::in_dir(dir.path());
        let marker = Marker::check("dir", place(), Held::default())
            .map_err(|d| io::Error::other(d.message))?;
        assert_eq!(
            marker.votes_withheld(None)?,
            None,
            "a store that never rejoined"
        );
        marker.rejoining_until(40)?;
        assert_eq!(marker.votes_withheld(None)?, Some(40));
        assert_eq!(marker.votes_withheld(Some(39))?, Some(40));
        // Kept across a restart: a member that stops before it caught up still withholds.
        let reopened = Marker::check("dir", place(), Held::default())
            .map_err(|d| io::Error::other(d.message))?;
        assert_eq!(reopened.votes_withheld(Some(12))?, Some(40));
        assert_eq!(reopened.votes_withheld(Some(40))?, None);
        // Caught up once is enough, for good.
        assert_eq!(reopened.votes_withheld(Some(1))?, None);
        let again = Marker::check("dir", place(), Held::default())
            .map_err(|d| io::Error::other(d.message))?;
        assert_eq!(again.votes_withheld(Some(1))?, None);
        Ok(())
    }
}
