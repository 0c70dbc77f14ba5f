//! Where the store's bytes live: sled on a real disk, or a [`MemoryDisk`] in a simulation.
//!
//! The log and the state machine are written once, against the few operations below (trees of
//! ordered keys, batches, a flush that makes every write so far durable). sled provides them
//! for real. A [`MemoryDisk`] provides them in memory for a deterministic simulation, where
//! sled cannot run (it spawns threads and writes the real disk), and keeps the distinction
//! that matters there: what was flushed survives [`MemoryDisk::crash`], the rest does not.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};

use sled::IVec;

type Map = BTreeMap<Vec<u8>, IVec>;

#[derive(Debug)]
enum Write {
    Put(String, Vec<u8>, IVec),
    Remove(String, Vec<u8>),
    DropTree(String),
}

#[derive(Debug, Default)]
struct Disk {
    /// What reads see.
    live: BTreeMap<String, Map>,
    /// What a crash leaves.
    durable: BTreeMap<String, Map>,
    /// Writes since the last flush, in order.
    pending: Vec<Write>,
    /// Files beside the trees (the integrity record), durable as soon as written.
    files: BTreeMap<String, Vec<u8>>,
}

impl Disk {
    fn apply(trees: &mut BTreeMap<String, Map>, write: &Write) {
        match write {
            Write::Put(tree, key, value) => {
                trees
                    .entry(tree.clone())
                    .or_default()
                    .insert(key.clone(), value.clone());
            }
            Write::Remove(tree, key) => {
                if let Some(map) = trees.get_mut(tree) {
                    map.remove(key);
                }
            }
            Write::DropTree(tree) => {
                trees.remove(tree);
            }
        }
    }

    fn write(&mut self, write: Write) {
        Self::apply(&mut self.live, &write);
        self.pending.push(write);
    }
}

/// A registry store's disk in memory, for deterministic simulations: writes are seen at once,
/// a flush makes every write so far durable, and [`crash`](MemoryDisk::crash) throws away what
/// was not flushed, as a power loss (or a killed sled process) does. Clones share the disk: a
/// simulation keeps one per master and hands it to each incarnation of that master.
#[derive(Clone, Default)]
pub struct MemoryDisk {
    disk: Arc<Mutex<Disk>>,
}

impl fmt::Debug for MemoryDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let disk = self.lock();
        f.debug_struct("MemoryDisk")
            .field("trees", &disk.live.len())
            .field("unflushed_writes", &disk.pending.len())
            .finish()
    }
}

impl MemoryDisk {
    fn lock(&self) -> MutexGuard<'_, Disk> {
        self.disk.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The host lost power: every write since the last flush is gone.
    pub fn crash(&self) {
        let mut disk = self.lock();
        disk.pending.clear();
        disk.live = disk.durable.clone();
    }

    /// Everything on the disk is gone but its files (the integrity record): a store
    /// truncated or replaced behind the master's back, for tests of the integrity check.
    pub fn lose_contents(&self) {
        let mut disk = self.lock();
        disk.pending.clear();
        disk.live.clear();
        disk.durable.clear();
    }

    pub(super) fn read_file(&self, name: &str) -> Option<Vec<u8>> {
        self.lock().files.get(name).cloned()
    }

    pub(super) fn write_file(&self, name: &str, bytes: Vec<u8>) {
        self.lock().files.insert(name.to_owned(), bytes);
    }

    fn flush(&self) {
        let mut disk = self.lock();
        let pending = std::mem::take(&mut disk.pending);
        for write in &pending {
            Disk::apply(&mut disk.durable, write);
        }
    }
}

/// One store's database.
#[derive(Clone, Debug)]
pub(super) enum Db {
    Sled(sled::Db),
    Memory(MemoryDisk),
}

impl Db {
    /// The named tree, created if missing.
    pub(super) fn open_tree(&self, name: &str) -> sled::Result<Tree> {
        match self {
            Db::Sled(db) => db.open_tree(name).map(Tree::Sled),
            Db::Memory(disk) => Ok(Tree::Memory(disk.clone(), name.to_owned())),
        }
    }

    /// Removes the named tree, if there is one.
    pub(super) fn drop_tree(&self, name: &str) -> sled::Result<()> {
        match self {
            Db::Sled(db) => db.drop_tree(name).map(drop),
            Db::Memory(disk) => {
                disk.lock().write(Write::DropTree(name.to_owned()));
                Ok(())
            }
        }
    }

    /// Makes every write so far durable (sled: fsync of the whole database).
    pub(super) async fn flush(&self) -> sled::Result<()> {
        match self {
            Db::Sled(db) => db.flush_async().await.map(drop),
            Db::Memory(disk) => {
                disk.flush();
                Ok(())
            }
        }
    }
}

/// Ordered keys to values, in a [`Db`].
#[derive(Clone)]
pub(super) enum Tree {
    Sled(sled::Tree),
    Memory(MemoryDisk, String),
}

/// Writes applied to a [`Tree`] together.
#[derive(Default)]
pub(super) struct Batch {
    writes: Vec<(Vec<u8>, Option<IVec>)>,
}

impl Batch {
    pub(super) fn insert(&mut self, key: &[u8], value: impl Into<IVec>) {
        self.writes.push((key.to_vec(), Some(value.into())));
    }

    pub(super) fn remove(&mut self, key: &[u8]) {
        self.writes.push((key.to_vec(), None));
    }
}

/// A key and its value.
pub(super) type Pair = (IVec, IVec);

impl Tree {
    fn with_map<T>(disk: &MemoryDisk, tree: &str, f: impl FnOnce(Option<&Map>) -> T) -> T {
        f(disk.lock().live.get(tree))
    }

    pub(super) fn get(&self, key: &[u8]) -> sled::Result<Option<IVec>> {
        match self {
            Tree::Sled(tree) => tree.get(key),
            Tree::Memory(disk, tree) => Ok(Self::with_map(disk, tree, |map| {
                map.and_then(|m| m.get(key)).cloned()
            })),
        }
    }

    pub(super) fn insert(&self, key: &[u8], value: impl Into<IVec>) -> sled::Result<()> {
        match self {
            Tree::Sled(tree) => tree.insert(key, value).map(drop),
            Tree::Memory(disk, tree) => {
                disk.lock()
                    .write(Write::Put(tree.clone(), key.to_vec(), value.into()));
                Ok(())
            }
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Tree::Sled(tree) => tree.len(),
            Tree::Memory(disk, tree) => Self::with_map(disk, tree, |map| map.map_or(0, Map::len)),
        }
    }

    pub(super) fn last(&self) -> sled::Result<Option<Pair>> {
        match self {
            Tree::Sled(tree) => tree.last(),
            Tree::Memory(disk, tree) => Ok(Self::with_map(disk, tree, |map| {
                map.and_then(|m| m.last_key_value())
                    .map(|(k, v)| (IVec::from(k.as_slice()), v.clone()))
            })),
        }
    }

    /// The pairs with keys in `(from, to)`, in order. sled's are read lazily; the memory
    /// disk's are copied out first (it holds a lock while it reads).
    pub(super) fn range(
        &self,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
    ) -> Box<dyn Iterator<Item = sled::Result<Pair>> + '_> {
        match self {
            Tree::Sled(tree) => Box::new(tree.range::<&[u8], _>((from, to))),
            Tree::Memory(disk, tree) => {
                let pairs: Vec<sled::Result<Pair>> = Self::with_map(disk, tree, |map| {
                    map.map(|m| {
                        m.range::<[u8], _>((from, to))
                            .map(|(k, v)| Ok((IVec::from(k.as_slice()), v.clone())))
                            .collect()
                    })
                    .unwrap_or_default()
                });
                Box::new(pairs.into_iter())
            }
        }
    }

    pub(super) fn apply_batch(&self, batch: Batch) -> sled::Result<()> {
        match self {
            Tree::Sled(tree) => {
                let mut sled_batch = sled::Batch::default();
                for (key, value) in batch.writes {
                    match value {
                        Some(value) => sled_batch.insert(key, value),
                        None => sled_batch.remove(key),
                    }
                }
                tree.apply_batch(sled_batch)
            }
            Tree::Memory(disk, tree) => {
                let mut disk = disk.lock();
                for (key, value) in batch.writes {
                    disk.write(match value {
                        Some(value) => Write::Put(tree.clone(), key, value),
                        None => Write::Remove(tree.clone(), key),
                    });
                }
                Ok(())
            }
        }
    }
}
