//! The store's own integrity record, `muster-store.json` beside sled's files: what the store
//! is known to hold at least, written (atomically, synced) whenever that grows in a way that
//! is rare: a new vote (an election), a new purge point (a snapshot). At open the store is
//! checked against it, so a database that lost its state (truncated, half-copied, replaced by
//! an empty one) refuses to start instead of starting empty and rejoining as a blank member.
//!
//! sled checks its own pages (a torn or corrupt segment is an error at open); this record
//! catches what sled's recovery cannot know was there.

use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

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
}

/// What the store holds now, as read at open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Held {
    pub(super) vote_term: Option<u64>,
    pub(super) purged_index: Option<u64>,
    pub(super) snapshot_index: Option<u64>,
    pub(super) log_entries: usize,
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
            let mut file = fs::File::create(&tmp)?;
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
    pub(super) fn check(store: &str, place: MarkerPlace, held: Held) -> Result<Marker, String> {
        let recorded = match place.read() {
            Ok(Some(bytes)) => Some(
                serde_json::from_slice::<Floor>(&bytes)
                    .map_err(|e| format!("{} is unreadable ({e}); {}", place.name(), RECOVERY))?,
            ),
            Ok(None) => None,
            Err(e) => return Err(format!("cannot read {}: {e}", place.name())),
        };
        let floor = match recorded {
            Some(floor) => {
                if let Some(missing) = missing(&floor, &held) {
                    return Err(format!(
                        "the registry store at {store} is damaged: {missing}; {RECOVERY}"
                    ));
                }
                floor
            }
            None => Floor {
                format: FORMAT,
                vote_term: held.vote_term.unwrap_or(0),
                purged_index: held.purged_index,
            },
        };
        let marker = Marker {
            place,
            floor: Arc::new(Mutex::new(floor)),
        };
        if recorded.is_none() {
            marker
                .write(&floor)
                .map_err(|e| format!("cannot write {}: {e}", marker.place.name()))?;
        }
        Ok(marker)
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
const RECOVERY: &str = "refusing to start over it. To recover, move the directory aside and \
    start this master again: it rejoins its group and catches up from the other members (a \
    single master has no other member: restore the directory from a copy)";

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
        let marker = Marker::check("dir", MarkerPlace::in_dir(dir.path()), new)?;
        marker.saw_vote(3).map_err(|e| e.to_string())?;
        marker.saw_purge(100).map_err(|e| e.to_string())?;
        let whole = Held {
            vote_term: Some(3),
            purged_index: Some(100),
            snapshot_index: Some(120),
            log_entries: 7,
        };
        assert!(Marker::check("dir", MarkerPlace::in_dir(dir.path()), whole).is_ok());
        let error =
            Marker::check("dir", MarkerPlace::in_dir(dir.path()), Held::default()).unwrap_err();
        assert!(
            error.contains("holds no vote") && error.contains("move the directory aside"),
            "{error}"
        );
        let older_vote = Held {
            vote_term: Some(2),
            ..whole
        };
        assert!(
            Marker::check("dir", MarkerPlace::in_dir(dir.path()), older_vote)
                .unwrap_err()
                .contains("term 3")
        );
        let no_snapshot = Held {
            snapshot_index: None,
            ..whole
        };
        assert!(
            Marker::check("dir", MarkerPlace::in_dir(dir.path()), no_snapshot)
                .unwrap_err()
                .contains("snapshot")
        );
        Ok(())
    }
}
