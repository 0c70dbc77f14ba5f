//! The [`RemoteBackend`]'s live copy of the cluster: one task per backend watches the leader
//! (`WatchCluster`) and applies what it sends to a [`Replica`]; evaluations take their
//! snapshots from the copy, waiting for it to reach their index.
//!
//! The task starts with the first snapshot asked for and ends with the last clone of the
//! backend. A watch that ends (the leader stops leading, a connection drops, nothing arrives
//! for [`WATCH_SILENCE`]) is opened again at the leader found then, holding the copy's
//! digests, so that only what differs is sent again. A message the copy cannot apply drops
//! the copy: the next watch sends everything.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use muster_proto::scheduling as pb;
use prost::Message;
use tokio::sync::watch;
use tonic::Code;

use super::{CallError, Inner, RemoteBackend};
use crate::plan::ClusterSnapshot;
use crate::protocol::{WATCH_SILENCE, leader_hint};
use crate::replica::Replica;
use crate::worker::WorkerError;

/// The first wait before opening a watch again.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);

/// The longest wait between two attempts to open a watch.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How long a backend whose master offered no watch asks for snapshots before it tries again.
const UNSUPPORTED_RETRY: Duration = Duration::from_secs(30);

/// What a backend has received of the cluster's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Received {
    /// Whole snapshots asked for (`Scheduling/Snapshot`): how many, and their bytes.
    pub snapshots: u64,
    /// Their encoded size, summed.
    pub snapshot_bytes: u64,
    /// Messages of the watch (`Scheduling/WatchCluster`).
    pub changes: u64,
    /// Their encoded size, summed.
    pub change_bytes: u64,
    /// Watches opened: the first, and each resumed after one ended.
    pub watches: u64,
    /// Snapshots taken from the copy.
    pub copies: u64,
    /// The time evaluations waited for the copy to reach their index, summed, in
    /// microseconds.
    pub waited_micros: u64,
}

/// The copy, shared by the backend's clones and the task that keeps it.
#[derive(Debug, Default)]
pub(super) struct Shared {
    replica: Mutex<Replica>,
    progress: watch::Sender<Progress>,
    received: Mutex<Received>,
    started: std::sync::atomic::AtomicBool,
}

/// Where the copy is.
#[derive(Clone, Debug, Default)]
struct Progress {
    /// The index it is consistent at, if it is.
    index: Option<u64>,
    /// Why the last watch ended or could not be opened.
    trouble: Option<String>,
    /// The leader offers no watches (a master from before them).
    unsupported: bool,
}

/// The leader offers no watches: ask for snapshots instead.
#[derive(Debug)]
pub(super) struct Unsupported;

impl Shared {
    fn replica(&self) -> std::sync::MutexGuard<'_, Replica> {
        self.replica.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn count(&self, add: impl FnOnce(&mut Received)) {
        add(&mut self.received.lock().unwrap_or_else(PoisonError::into_inner));
    }

    pub(super) fn received(&self) -> Received {
        *self.received.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn count_snapshot(&self, bytes: usize) {
        self.count(|r| {
            r.snapshots += 1;
            r.snapshot_bytes += bytes as u64;
        });
    }

    pub(super) fn index(&self) -> Option<u64> {
        self.progress.borrow().index
    }

    pub(super) fn unsupported(&self) -> bool {
        self.progress.borrow().unsupported
    }

    /// A snapshot of the copy at `min_index` or later, waiting up to `wait` for it.
    pub(super) async fn snapshot_at(
        &self,
        min_index: u64,
        wait: Duration,
    ) -> Result<Result<ClusterSnapshot, WorkerError>, Unsupported> {
        let started = tokio::time::Instant::now();
        let deadline = started + wait;
        let mut progress = self.progress.subscribe();
        loop {
            let reached = |p: &Progress| p.unsupported || p.index.is_some_and(|i| i >= min_index);
            let waited = tokio::time::timeout_at(deadline, progress.wait_for(reached)).await;
            let now = self.progress.borrow().clone();
            if now.unsupported {
                return Err(Unsupported);
            }
            if waited.is_err() {
                return Ok(Err(match (now.index, now.trouble) {
                    (Some(got), _) => WorkerError::StaleSnapshot { min_index, got },
                    (None, Some(trouble)) => WorkerError::Unavailable(format!(
                        "no copy of the cluster at index {min_index} within {wait:?}: {trouble}"
                    )),
                    (None, None) => WorkerError::Unavailable(format!(
                        "no copy of the cluster at index {min_index} within {wait:?}: the \
                         leader's first snapshot is still arriving"
                    )),
                }));
            }
            // The copy may have moved on, part way into the next change, since: look again.
            if let Some(snapshot) = self.replica().snapshot()
                && snapshot.index >= min_index
            {
                let waited = started.elapsed().as_micros();
                self.count(|r| {
                    r.copies += 1;
                    r.waited_micros += u64::try_from(waited).unwrap_or(u64::MAX);
                });
                return Ok(Ok(snapshot));
            }
        }
    }

    fn publish(&self, change: impl FnOnce(&mut Progress)) {
        self.progress.send_modify(change);
    }

    /// Applies one message of the watch to the copy and publishes where it is; a message it
    /// cannot take drops the copy.
    fn take(&self, change: pb::ClusterChange) -> Result<(), muster_model::FieldError> {
        let bytes = change.encoded_len() as u64;
        self.count(|r| {
            r.changes += 1;
            r.change_bytes += bytes;
        });
        let applied = {
            let mut replica = self.replica();
            let applied = replica.apply(change);
            if applied.is_err() {
                *replica = Replica::new();
            }
            applied.map(|()| replica.index())
        };
        match applied {
            Ok(index) => {
                self.publish(|p| {
                    p.index = index;
                    p.trouble = None;
                });
                Ok(())
            }
            Err(malformed) => {
                self.publish(|p| p.index = None);
                Err(malformed)
            }
        }
    }
}

/// Starts the task that keeps `inner`'s copy, unless it runs already.
pub(super) fn start(inner: &Arc<Inner>) {
    use std::sync::atomic::Ordering;
    if inner.replica.started.swap(true, Ordering::AcqRel) {
        return;
    }
    tokio::spawn(follow(
        Arc::downgrade(inner),
        Arc::clone(&inner.replica),
        inner.alive.subscribe(),
    ));
}

/// Keeps the copy until the backend is dropped.
async fn follow(backend: Weak<Inner>, shared: Arc<Shared>, mut alive: watch::Receiver<()>) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        let Some(inner) = backend.upgrade() else {
            return;
        };
        let remote = RemoteBackend { inner };
        let holding = shared.replica().digest();
        // Bounded, as the backend is held meanwhile: a master that takes the call and never
        // answers must not keep it (and this task) alive.
        let limit = remote.inner.config.call_timeout;
        let opened = tokio::select! {
            opened = tokio::time::timeout(limit, remote.open_watch(holding)) => opened
                .unwrap_or_else(|_| Err(CallError::Unavailable(format!(
                    "the master at {} did not open the watch within {limit:?}",
                    remote.current()
                )))),
            _ = alive.changed() => return,
        };
        let wait = match opened {
            Ok((address, stream)) => {
                shared.count(|r| r.watches += 1);
                shared.publish(|p| p.unsupported = false);
                drop(remote);
                let ended = tokio::select! {
                    ended = keep(&shared, stream) => ended,
                    _ = alive.changed() => return,
                };
                tracing::debug!(master = %address, "the watch of the cluster ended: {ended}");
                if let Some(inner) = backend.upgrade() {
                    RemoteBackend { inner }.move_on(&address, ended.leader);
                }
                shared.publish(|p| p.trouble = Some(ended.why));
                // A watch that brought something starts the back-off afresh; one that failed
                // at once backs off as an open that failed would.
                if ended.received_any {
                    backoff = FIRST_BACKOFF;
                }
                backoff
            }
            Err(CallError::Status(status)) if status.code() == Code::Unimplemented => {
                // A master from before watches (or, in a rolling upgrade, an older standby
                // answering first): snapshots are asked for meanwhile, and a watch is tried
                // again after a while.
                tracing::info!(
                    "the master offers no watch of the cluster: asking for a snapshot per \
                     evaluation, and trying again in {UNSUPPORTED_RETRY:?}"
                );
                shared.publish(|p| p.unsupported = true);
                UNSUPPORTED_RETRY
            }
            Err(CallError::Unavailable(why)) => {
                shared.publish(|p| p.trouble = Some(why));
                backoff
            }
            Err(CallError::Status(status)) => {
                shared.publish(|p| p.trouble = Some(super::reason(&status)));
                backoff
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = alive.changed() => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Why a watch ended.
struct Ended {
    why: String,
    /// The leader a standby named.
    leader: Option<String>,
    /// Whether any message arrived before it ended.
    received_any: bool,
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

/// Applies the watch's messages to the copy until it ends.
async fn keep(shared: &Shared, mut stream: tonic::Streaming<pb::ClusterChange>) -> Ended {
    let mut received_any = false;
    loop {
        let message = match tokio::time::timeout(WATCH_SILENCE, stream.message()).await {
            Err(_) => {
                return Ended {
                    why: format!("the leader sent nothing for {WATCH_SILENCE:?}"),
                    leader: None,
                    received_any,
                };
            }
            Ok(message) => message,
        };
        let change = match message {
            Ok(Some(change)) => change,
            Ok(None) => {
                return Ended {
                    why: "the leader ended the watch".into(),
                    leader: None,
                    received_any,
                };
            }
            Err(status) => {
                let leader = (status.code() == Code::FailedPrecondition)
                    .then(|| leader_hint(&status))
                    .flatten();
                return Ended {
                    why: super::reason(&status),
                    leader,
                    received_any,
                };
            }
        };
        received_any = true;
        let applied = shared.take(change);
        match applied {
            Ok(()) => {}
            Err(malformed) => {
                return Ended {
                    why: format!(
                        "the leader sent a change the copy cannot take ({}); watching afresh",
                        malformed.within("change")
                    ),
                    leader: None,
                    received_any,
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(index: u64) -> pb::ClusterChange {
        pb::ClusterChange {
            index,
            complete: true,
            ..pb::ClusterChange::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_evaluation_waits_for_the_copy_to_reach_its_index() {
        let shared = Arc::new(Shared::default());
        shared.take(at(4)).expect("a valid change");
        let waiting = tokio::spawn({
            let shared = Arc::clone(&shared);
            async move { shared.snapshot_at(5, Duration::from_secs(5)).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "index 4 is not enough");
        // Part way through a change is not enough either.
        shared
            .take(pb::ClusterChange {
                index: 5,
                ..pb::ClusterChange::default()
            })
            .expect("a valid change");
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a change part way");
        shared.take(at(5)).expect("a valid change");
        let snapshot = waiting
            .await
            .expect("the waiter ends")
            .expect("watches are offered")
            .expect("a snapshot");
        assert_eq!(snapshot.index, 5);
    }

    #[tokio::test(start_paused = true)]
    async fn an_evaluation_the_copy_does_not_reach_in_time_is_stale() {
        let shared = Shared::default();
        shared.take(at(4)).expect("a valid change");
        let answer = shared
            .snapshot_at(9, Duration::from_secs(5))
            .await
            .expect("watches are offered");
        assert!(
            matches!(
                answer,
                Err(WorkerError::StaleSnapshot {
                    min_index: 9,
                    got: 4
                })
            ),
            "{answer:?}"
        );
        // A copy that never started says why.
        let empty = Shared::default();
        empty.publish(|p| p.trouble = Some("the master at 127.0.0.1:1 refused".into()));
        let answer = empty
            .snapshot_at(1, Duration::from_secs(5))
            .await
            .expect("watches are offered");
        let Err(WorkerError::Unavailable(why)) = answer else {
            panic!("not unavailable: {answer:?}");
        };
        assert!(why.contains("127.0.0.1:1 refused"), "{why}");
    }

    #[test]
    fn a_change_the_copy_cannot_take_drops_it() {
        let shared = Shared::default();
        shared.take(at(4)).expect("a valid change");
        let broken = pb::ClusterChange {
            agents: vec![pb::AgentChange {
                id: "never-sent".into(),
                ..pb::AgentChange::default()
            }],
            ..at(5)
        };
        assert!(shared.take(broken).is_err());
        assert_eq!(shared.progress.borrow().index, None);
        assert_eq!(shared.replica().digest(), pb::ReplicaDigest::default());
        assert_eq!(shared.received().changes, 2);
    }
}
