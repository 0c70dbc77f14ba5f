//! [`System`]: the set of running processes — spawning, dead letters, graceful shutdown.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::mailbox::{Mailbox, MailboxCapacity};
use crate::pid::{Control, Shared};
use crate::sync::lock;
use crate::{Context, Pid, Process, ProcessId, lifecycle};

/// Registry shards: spawn and exit lock one shard, so two threads rarely meet on one lock.
const SHARDS: usize = 16;

/// One shard's lock, alone on its cache lines: the thread spawning and the one where processes
/// end would otherwise contend on neighbouring shards' line.
#[derive(Default)]
#[repr(align(128))]
struct Shard(Mutex<Processes>);

/// One shard of the running processes, by id.
type Processes = HashMap<u64, Arc<dyn Control>, BuildHasherDefault<IdHasher>>;

/// Hashes process ids, which are unique sequential numbers the system hands out (nobody can
/// choose them to collide), with one multiplication (Fibonacci hashing) instead of SipHash:
/// spawn and exit each hash once on the hot path.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // A multiplication mixes upwards: the low bits of ids in one shard (equal modulo the
        // shard count) stay equal, and the table picks buckets by the low bits. Rotating
        // brings the well-mixed high half down.
        self.0.rotate_left(32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = (self.0 ^ id).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A set of processes that can be shut down together. Cheap to clone: clones share the set.
///
/// Processes run on the ambient tokio runtime. Most programs use one system, the
/// [`global`](System::global) one behind [`spawn`](crate::spawn); tests make their own.
#[derive(Clone)]
pub struct System {
    inner: Arc<SystemInner>,
}

struct SystemInner {
    next_id: AtomicU64,
    processes: [Shard; SHARDS],
    dead_letters: AtomicU64,
}

/// What [`System::shutdown`] stopped and what it could not deliver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ShutdownReport {
    /// Processes that were running and have now ended.
    pub processes: usize,
    /// User messages still queued in their mailboxes, never handled.
    pub undelivered: usize,
}

impl System {
    /// An empty system.
    pub fn new() -> Self {
        System {
            inner: Arc::new(SystemInner {
                next_id: AtomicU64::new(1),
                processes: std::array::from_fn(|_| Shard::default()),
                dead_letters: AtomicU64::new(0),
            }),
        }
    }

    /// The process-wide default system, used by [`crate::spawn`].
    pub fn global() -> &'static System {
        static GLOBAL: OnceLock<System> = OnceLock::new();
        GLOBAL.get_or_init(System::new)
    }

    /// Starts `process` with an unbounded mailbox.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn<P: Process>(&self, process: P) -> Pid<P> {
        self.spawn_with(process, MailboxCapacity::Unbounded)
    }

    /// Starts `process` with a mailbox of `capacity` user messages: beyond that,
    /// [`Pid::tell`] answers [`TellError::Busy`](crate::TellError::Busy).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn_bounded<P: Process>(&self, process: P, capacity: usize) -> Pid<P> {
        self.spawn_with(process, MailboxCapacity::Bounded(capacity))
    }

    /// Starts `process` with the given mailbox capacity.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn_with<P: Process>(&self, process: P, capacity: MailboxCapacity) -> Pid<P> {
        let id = ProcessId(self.inner.next_id.fetch_add(1, Ordering::Relaxed));
        let pid = Pid {
            inner: Arc::new(Shared::new(id, Mailbox::new(capacity))),
        };
        lock(self.shard(id)).insert(id.0, pid.inner.clone());
        tokio::spawn(lifecycle::run(
            process,
            Context::new(pid.clone(), self.clone()),
        ));
        pid
    }

    /// How many processes are running.
    pub fn len(&self) -> usize {
        self.inner.processes.iter().map(|s| lock(&s.0).len()).sum()
    }

    /// True when no process runs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Messages that could not be delivered: left in a mailbox when its process ended, or
    /// arrived from another node for a process or type that does not exist here.
    pub fn dead_letters(&self) -> u64 {
        self.inner.dead_letters.load(Ordering::Relaxed)
    }

    /// Counts `n` more dead letters: messages a transport could not deliver here (no such
    /// process or message type, a malformed envelope).
    pub fn add_dead_letters(&self, n: u64) {
        if n > 0 {
            self.inner.dead_letters.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub(crate) fn unregister(&self, id: ProcessId) {
        lock(self.shard(id)).remove(&id.0);
    }

    fn shard(&self, id: ProcessId) -> &Mutex<Processes> {
        &self.inner.processes[(id.0 % SHARDS as u64) as usize].0
    }

    /// Stops every process after its current message, waits for all of them to end and reports
    /// the messages they left undelivered. Processes spawned while it runs are stopped too.
    ///
    /// # Cancel safety
    /// Cancelling stops the waiting; the processes asked to stop still stop.
    pub async fn shutdown(&self) -> ShutdownReport {
        let mut report = ShutdownReport::default();
        loop {
            let running: Vec<Arc<dyn Control>> = self
                .inner
                .processes
                .iter()
                .flat_map(|shard| lock(&shard.0).values().cloned().collect::<Vec<_>>())
                .collect();
            if running.is_empty() {
                return report;
            }
            for process in &running {
                process.terminate_with(crate::ExitReason::Shutdown);
            }
            for process in &running {
                process.wait_boxed().await;
                report.processes += 1;
                report.undelivered += process.undelivered();
            }
        }
    }
}

impl Default for System {
    fn default() -> Self {
        System::new()
    }
}

impl fmt::Debug for System {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("System")
            .field("processes", &self.len())
            .field("dead_letters", &self.dead_letters())
            .finish()
    }
}

/// Starts `process` in the [global](System::global) system with an unbounded mailbox.
///
/// # Panics
/// Outside a tokio runtime.
pub fn spawn<P: Process>(process: P) -> Pid<P> {
    System::global().spawn(process)
}
