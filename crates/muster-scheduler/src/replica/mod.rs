//! A live copy of the cluster for schedulers in other programs: the leader sends the whole
//! state once, in pages, then each change as it happens, and the copy answers every
//! evaluation's snapshot without a round trip.
//!
//! - [`Feed`] is the leader's side, one per watcher: it compares each new
//!   [`ClusterSnapshot`](crate::ClusterSnapshot) with what the watcher was sent (pointers
//!   first, as a master shares unchanged agent views between snapshots) and sends what
//!   changed: agents whole when new, otherwise their changed fields and tasks; jobs whole when
//!   changed; the small parts (held slots, quotas, deployments, the preemption setting) whole
//!   when any changed. Messages stay under [`PAGE_BYTES`], so no cluster is too big to send.
//! - [`Replica`] is the watcher's side: it applies those messages and gives a snapshot once a
//!   change is complete. [`RemoteBackend`](crate::RemoteBackend) keeps one and waits, for an
//!   evaluation, until it reaches the evaluation's index.
//! - A watch that ends (a dropped connection, a new leader) resumes with the copy's
//!   [digests](digest): 64 bits per agent and job. The leader sends again only the agents and
//!   jobs whose digests differ from its own, so a watcher that reconnects to a leader with
//!   the same state receives little more than the digests' worth.
//!
//! The protocol is `WatchCluster` in `muster.scheduling.v1`.

mod copy;
pub mod digest;
mod feed;
mod wire;

pub use copy::Replica;
pub use feed::{Feed, JobVersions, PAGE_BYTES, job_versions, same_job_versions};

#[cfg(test)]
mod tests;
