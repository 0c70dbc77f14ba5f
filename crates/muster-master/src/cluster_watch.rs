//! `Scheduling/WatchCluster`: one task per watcher feeds it the cluster as it changes.
//!
//! The task follows the master's [`ClusterPulse`]. Each time it moves, the task takes a
//! snapshot (pointers to the agents' views, shared with the master), narrows it to what the
//! watcher's token may see, and sends what a [`Feed`] finds changed since the last. A watcher
//! slower than the changes gets them merged: the channel to it holds two messages, and the next
//! snapshot is compared with what it was last sent, not with every state between.

use std::sync::Arc;
use std::time::Duration;

use muster_actor::Pid;
use muster_scheduler::protocol::WATCH_KEEPALIVE;

use muster_model::namespace_of;
use muster_proto::scheduling as pb;
use muster_scheduler::ClusterSnapshot;
use muster_scheduler::replica::{Feed, JobVersions, job_versions};
use muster_security::Caller;
use tokio::sync::{mpsc, watch};
use tonic::Status;

use crate::error::ServiceError;
use crate::master::Master;
use crate::master::requests::{ClusterPulse, WatchSnapshot};

/// How often a watch looks again with no change seen: what changes with the clock alone (a
/// crash-looping slot's back-off ending) reaches the watcher within this, and a watcher sent
/// nothing since gets the index as it is (the keepalive its silence check waits for).
const LOOK_AGAIN: Duration = WATCH_KEEPALIVE;

/// What of `snapshot` a scheduler holding `caller`'s token sees: jobs, quotas and deployments
/// of the namespaces it may schedule (every agent and task, as all take room), and no job's
/// environment (a scheduler places tasks, it does not run them, and the plan applier takes
/// what a task runs from the stored job; environments hold secrets).
pub(crate) fn visible_to(caller: &Caller, mut snapshot: ClusterSnapshot) -> ClusterSnapshot {
    snapshot
        .jobs
        .retain(|id, _| caller.acl.may_schedule(namespace_of(id)));
    for job in snapshot.jobs.values_mut() {
        for group in &mut job.groups {
            group.env.clear();
        }
    }
    snapshot
        .quotas
        .retain(|namespace, _| caller.acl.may_schedule(namespace));
    snapshot
        .deployments
        .retain(|job, _| caller.acl.may_schedule(namespace_of(job)));
    snapshot
}

/// Feeds the watcher at `out` from the master at `master` until the watcher goes, or this
/// master stops leading: then the last message is the status `redirect` answers, which sends
/// the watcher to the leader.
pub(crate) async fn run<R: Future<Output = Status>>(
    master: Pid<Master>,
    redirect: impl Fn() -> R,
    caller: Caller,
    mut feed: Feed,
    mut pulse: watch::Receiver<ClusterPulse>,
    out: mpsc::Sender<Result<pb::ClusterChange, Status>>,
) {
    let mut last_sent = tokio::time::Instant::now();
    // The registry index of the jobs the feed last took: the master leaves them out while
    // it has applied nothing since.
    let mut jobs_seen_at: Option<u64> = None;
    // Their versions: the master compares them instead of copying every job for the feed.
    let mut jobs_seen: Option<Arc<JobVersions>> = None;
    loop {
        let now = *pulse.borrow_and_update();
        if now.scheduling {
            let watched = match master
                .ask(|reply| {
                    WatchSnapshot {
                        jobs_seen_at,
                        jobs_seen: jobs_seen.clone(),
                        reply,
                    }
                    .into()
                })
                .await
            {
                Ok(watched) => watched,
                Err(gone) => {
                    let _ = out.send(Err(ServiceError::from(gone).into())).await;
                    return;
                }
            };
            if !watched.jobs_unchanged {
                jobs_seen = Some(Arc::new(job_versions(&watched.snapshot.jobs)));
            }
            let snapshot = visible_to(&caller, watched.snapshot);
            let mut changes = feed.changes_with(&snapshot, !watched.jobs_unchanged);
            jobs_seen_at = Some(watched.jobs_at);
            if changes.is_empty() && last_sent.elapsed() >= LOOK_AGAIN {
                changes.push(pb::ClusterChange {
                    index: snapshot.index,
                    complete: true,
                    ..pb::ClusterChange::default()
                });
            }
            for change in changes {
                if out.send(Ok(change)).await.is_err() {
                    return;
                }
                last_sent = tokio::time::Instant::now();
            }
        } else if !now.leading {
            // Standing by now: the watcher goes to the leader.
            let _ = out.send(Err(redirect().await)).await;
            return;
        } else if last_sent.elapsed() >= LOOK_AGAIN {
            // Leading, holding placements while agents re-register: the watcher hears that
            // this master is alive, and that its copy is not at a state of this leader's yet.
            if out.send(Ok(pb::ClusterChange::default())).await.is_err() {
                return;
            }
            last_sent = tokio::time::Instant::now();
        }
        tokio::select! {
            moved = pulse.changed() => {
                if moved.is_err() {
                    let stopped = ServiceError::Unavailable("this master stopped".into());
                    let _ = out.send(Err(stopped.into())).await;
                    return;
                }
            }
            () = out.closed() => return,
            () = tokio::time::sleep(LOOK_AGAIN) => {}
        }
    }
}
