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

/// How to take back one write that was not flushed.
#[derive(Debug)]
enum Undo {
    /// The key's value before the write (`None`: it had none).
    Key(Arc<str>, Vec<u8>, Option<IVec>),
    /// A tree that was dropped, whole.
    Tree(Arc<str>, Map),
}

#[derive(Debug, Default)]
struct Disk {
    /// What reads see: every write, flushed or not.
    trees: BTreeMap<Arc<str>, Map>,
    /// How to take back each write since the last flush, oldest first. A flush forgets them
    /// (what they wrote is durable); a crash replays them newest first, which leaves exactly
    /// what was flushed. Both cost only the writes since the last flush, and the data is
    /// held once.
    undo: Vec<Undo>,
    /// Files beside the trees (the integrity record), durable as soon as written.
    files: BTreeMap<String, Vec<u8>>,
}

impl Disk {
    fn put(&mut self, tree: &Arc<str>, key: Vec<u8>, value: IVec) {
        let map = match self.trees.get_mut(&**tree) {
            Some(map) => map,
            None => self.trees.entry(Arc::clone(tree)).or_default(),
        };
        let before = map.insert(key.clone(), value);
        self.undo.push(Undo::Key(Arc::clone(tree), key, before));
    }

    fn remove(&mut self, tree: &Arc<str>, key: Vec<u8>) {
        if let Some(before) = self.trees.get_mut(&**tree).and_then(|map| map.remove(&key)) {
            self.undo
                .push(Undo::Key(Arc::clone(tree), key, Some(before)));
        }
    }

    fn drop_tree(&mut self, tree: &str) {
        if let Some((name, map)) = self.trees.remove_entry(tree) {
            self.undo.push(Undo::Tree(name, map));
        }
    }

    fn flush(&mut self) {
        self.undo.clear();
    }

    fn crash(&mut self) {
        while let Some(undo) = self.undo.pop() {
            match undo {
                Undo::Key(tree, key, before) => {
                    let map = self.trees.entry(tree).or_default();
                    match before {
                        Some(value) => map.insert(key, value),
                        None => map.remove(&key),
                    };
                }
                Undo::Tree(tree, map) => {
                    self.trees.insert(tree, map);
                }
            }
        }
    }
}

/// A registry store's disk in memory, for deterministic simulations: writes are seen at once,
/// a flush makes every write so far durable, and [`crash`](MemoryDisk::crash) throws away what
/// was not flushed, as a power loss (or a killed sled process) does. The store's integrity
/// record lives on it too, durable as soon as it is written (as the synced file is). Clones
/// share the disk: a simulation keeps one per master and hands it to each incarnation of that
/// master.
///
/// It uses no thread and no real file: every operation is done in place, under a lock held
/// only for that operation.
#[derive(Clone, Default)]
pub struct MemoryDisk {
    disk: Arc<Mutex<Disk>>,
}

impl fmt::Debug for MemoryDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let disk = self.lock();
        f.debug_struct("MemoryDisk")
            .field("trees", &disk.trees.len())
            .field("unflushed_writes", &disk.undo.len())
            .finish()
    }
}

impl MemoryDisk {
    fn lock(&self) -> MutexGuard<'_, Disk> {
        self.disk.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The host lost power: every write since the last flush is gone, and a store opened on
    /// this disk afterwards sees exactly what was flushed. Drop the stores open on it first,
    /// as the power loss would have: what they hold in memory is not on the disk.
    pub fn crash(&self) {
        self.lock().crash();
    }

    /// Everything on the disk is gone but its files (the integrity record): a store
    /// truncated or replaced behind the master's back, for tests of the integrity check.
    pub fn lose_contents(&self) {
        let mut disk = self.lock();
        disk.undo.clear();
        disk.trees.clear();
    }

    pub(super) fn read_file(&self, name: &str) -> Option<Vec<u8>> {
        self.lock().files.get(name).cloned()
    }

    pub(super) fn write_file(&self, name: &str, bytes: Vec<u8>) {
        self.lock().files.insert(name.to_owned(), bytes);
    }

    fn flush(&self) {
        self.lock().flush();
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
            Db::Memory(disk) => Ok(Tree::Memory(disk.clone(), Arc::from(name))),
        }
    }

    /// Removes the named tree, if there is one.
    pub(super) fn drop_tree(&self, name: &str) -> sled::Result<()> {
        match self {
            Db::Sled(db) => db.drop_tree(name).map(drop),
            Db::Memory(disk) => {
                disk.lock().drop_tree(name);
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
    Memory(MemoryDisk, Arc<str>),
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
        f(disk.lock().trees.get(tree))
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
                disk.lock().put(tree, key.to_vec(), value.into());
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
            Tree::Memory(_, _) if is_empty(from, to) => Box::new(std::iter::empty()),
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
                    match value {
                        Some(value) => disk.put(tree, key, value),
                        None => disk.remove(tree, key),
                    }
                }
                Ok(())
            }
        }
    }
}

/// Whether no key lies between `from` and `to` by the bounds alone (sled then yields nothing;
/// `BTreeMap::range` would panic on some of these).
fn is_empty(from: Bound<&[u8]>, to: Bound<&[u8]>) -> bool {
    match (from, to) {
        (Bound::Included(from), Bound::Included(to)) => from > to,
        (Bound::Included(from) | Bound::Excluded(from), Bound::Excluded(to))
        | (Bound::Excluded(from), Bound::Included(to)) => from >= to,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Contents = BTreeMap<String, Vec<(Vec<u8>, Vec<u8>)>>;

    /// The non-empty trees and their pairs.
    fn contents(disk: &MemoryDisk) -> Contents {
        disk.lock()
            .trees
            .iter()
            .filter(|(_, map)| !map.is_empty())
            .map(|(name, map)| {
                let pairs = map.iter().map(|(k, v)| (k.clone(), v.to_vec())).collect();
                (name.to_string(), pairs)
            })
            .collect()
    }

    fn tree(db: &Db, name: &str) -> Tree {
        db.open_tree(name).expect("a memory tree opens")
    }

    #[tokio::test]
    async fn a_crash_leaves_exactly_what_was_flushed() {
        let disk = MemoryDisk::default();
        let db = Db::Memory(disk.clone());
        let (a, b) = (tree(&db, "a"), tree(&db, "b"));
        a.insert(b"1", b"one".as_slice()).expect("insert");
        a.insert(b"2", b"two".as_slice()).expect("insert");
        b.insert(b"x", b"ex".as_slice()).expect("insert");
        db.flush().await.expect("flush");
        let flushed = contents(&disk);

        // Overwrites, removals, a new key, a batch, a dropped and rewritten tree: all lost.
        a.insert(b"1", b"uno".as_slice()).expect("insert");
        a.insert(b"3", b"three".as_slice()).expect("insert");
        let mut batch = Batch::default();
        batch.remove(b"2");
        batch.insert(b"4", b"four".as_slice());
        a.apply_batch(batch).expect("batch");
        db.drop_tree("b").expect("drop");
        b.insert(b"y", b"why".as_slice()).expect("insert");
        assert_eq!(
            a.get(b"1").expect("get").as_deref(),
            Some(b"uno".as_slice())
        );
        assert_eq!(a.get(b"2").expect("get"), None, "writes are seen at once");
        assert_eq!(b.get(b"x").expect("get"), None);
        assert_eq!(
            format!("{disk:?}"),
            "MemoryDisk { trees: 2, unflushed_writes: 6 }"
        );

        disk.crash();
        assert_eq!(contents(&disk), flushed);
        assert_eq!(a.len(), 2);
        assert_eq!(b.get(b"x").expect("get").as_deref(), Some(b"ex".as_slice()));

        // What is flushed after the crash stays; a second crash takes back only the rest.
        a.insert(b"5", b"five".as_slice()).expect("insert");
        db.flush().await.expect("flush");
        let mut batch = Batch::default();
        batch.remove(b"5");
        a.apply_batch(batch).expect("batch");
        assert_eq!(a.get(b"5").expect("get"), None);
        disk.crash();
        assert_eq!(
            a.get(b"5").expect("get").as_deref(),
            Some(b"five".as_slice())
        );
    }

    #[test]
    fn files_are_durable_at_once_and_lose_contents_keeps_them() {
        let disk = MemoryDisk::default();
        disk.write_file("record", b"r1".to_vec());
        disk.crash();
        assert_eq!(disk.read_file("record"), Some(b"r1".to_vec()));
        disk.lock()
            .put(&Arc::from("t"), b"k".to_vec(), IVec::from(b"v".as_slice()));
        disk.flush();
        disk.lose_contents();
        assert!(contents(&disk).is_empty());
        assert_eq!(disk.read_file("record"), Some(b"r1".to_vec()));
    }

    #[test]
    fn ranges_with_crossed_or_empty_bounds_are_empty() {
        let db = Db::Memory(MemoryDisk::default());
        let t = tree(&db, "t");
        for key in [b"1", b"2", b"3"] {
            t.insert(key, key.as_slice()).expect("insert");
        }
        let keys = |from, to| -> Vec<Vec<u8>> {
            t.range(from, to)
                .map(|pair| pair.map(|(k, _)| k.to_vec()).expect("read"))
                .collect()
        };
        let (one, two, three) = (b"1".as_slice(), b"2".as_slice(), b"3".as_slice());
        assert!(keys(Bound::Included(three), Bound::Included(one)).is_empty());
        assert!(keys(Bound::Excluded(two), Bound::Excluded(two)).is_empty());
        assert!(keys(Bound::Excluded(two), Bound::Included(two)).is_empty());
        assert!(keys(Bound::Included(two), Bound::Excluded(two)).is_empty());
        assert_eq!(
            keys(Bound::Included(two), Bound::Included(two)),
            [b"2".to_vec()]
        );
        assert_eq!(
            keys(Bound::Excluded(one), Bound::Unbounded),
            [b"2".to_vec(), b"3".to_vec()]
        );
        assert_eq!(
            keys(Bound::Unbounded, Bound::Excluded(three)),
            [b"1".to_vec(), b"2".to_vec()]
        );
    }
}
