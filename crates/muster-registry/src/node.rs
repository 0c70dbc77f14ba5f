//! One master's member of the registry raft group.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use muster_proto::registry::raft_server::RaftServer;
use muster_security::guard::NoTokens;
use muster_security::{Guarded, Requirement, Role, Rules, Security};
use openraft::error::{CheckIsLeaderError, ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, Config, ServerState, SnapshotPolicy};
use tokio::sync::watch;

use crate::election::{self, ElectNow, ElectionStats, ElectionTiming};
use crate::membership::{self, JoinRequest, Membership, MembershipError, Peer, PeerContacts};
use crate::network::{LeaderContact, NetworkFactory, RaftService};
use crate::store::{self, Damage, LogStore, RegistryReader, StoreError, StoreLocation};
use crate::types::{Batch, BatchOutcome, NodeId, Raft};
use crate::write_error::WriteError;

/// How long `catch_up` waits for a quorum to confirm this leader, and then to commit its own
/// first entry.
const CATCH_UP_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one snapshot chunk may take to be sent and written, and the last one to be
/// installed.
const SNAPSHOT_CHUNK_TIMEOUT: Duration = Duration::from_secs(5);

/// How to start a registry member.
#[derive(Clone, Debug)]
pub struct RegistryConfig {
    /// This master's id in the group.
    pub id: NodeId,
    /// Every member of the group, this one included: id to the `host:port` that serves its
    /// raft (and the rest of the master's API). This member reaches its peers at these
    /// addresses; on first start the group's membership is made from them.
    pub members: BTreeMap<NodeId, String>,
    /// Where the log and state machine live: a directory for sled, or an in-memory disk
    /// (deterministic simulations).
    pub store: StoreLocation,
    /// How often the leader sends heartbeats.
    pub heartbeat_interval: Duration,
    /// A follower that hears no heartbeat for a random time in this range starts an election.
    pub election_timeout: (Duration, Duration),
    /// Build a snapshot (and purge the log behind it) after this many entries.
    pub snapshot_after_entries: u64,
    /// How many entries to keep in the log behind a snapshot, for followers that lag a little.
    pub entries_kept_after_snapshot: u64,
    /// TLS between the members (each verifies the other's certificate is a master's), or
    /// plaintext for an insecure cluster.
    pub security: Security,
    /// What to do if the store is damaged (it holds less than its integrity record says it
    /// held). False (the default): refuse to start, naming what is damaged and how to
    /// recover. True: move the directory aside (to `<dir>.damaged-<unix ms>`) and start
    /// empty, to catch up from the other members; the new store keeps the old one's vote
    /// term and grants no vote until its log is back where the old one's was, so a member
    /// that forgot what it acknowledged never helps elect a leader without it.
    pub rejoin_damaged: bool,
    /// How entries, snapshots and raft requests are written: MessagePack (the default), or
    /// JSON, what the registry wrote before (both are always read; peers answer in the
    /// request's encoding). JSON is there to measure the difference in one run.
    pub encoding: crate::codec::Encoding,
    /// Members of a running group to ask to add this one (any of them: a follower names the
    /// leader). Empty: on first start the group is made from `members`. Set: `members` names
    /// this member alone, and on first start it waits, empty, to be added as a learner, catches
    /// up, and becomes a voter. A member already in a group (a restart) ignores it.
    pub join: Vec<String>,
}

impl RegistryConfig {
    /// A single-member group: the dev cluster and the benches.
    pub fn single(
        id: NodeId,
        address: impl Into<String>,
        data_dir: impl Into<PathBuf>,
        security: Security,
    ) -> Self {
        RegistryConfig {
            id,
            members: BTreeMap::from([(id, address.into())]),
            store: StoreLocation::Directory(data_dir.into()),
            heartbeat_interval: Duration::from_millis(100),
            election_timeout: (Duration::from_millis(400), Duration::from_millis(800)),
            snapshot_after_entries: 5_000,
            entries_kept_after_snapshot: 1_000,
            security,
            rejoin_damaged: false,
            encoding: crate::codec::Encoding::default(),
            join: Vec::new(),
        }
    }
}

/// Why a registry member could not start.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The data directory could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The config does not describe a group this member belongs to.
    #[error("invalid registry config: {0}")]
    Config(String),
    /// openraft refused to start.
    #[error("raft failed to start: {0}")]
    Raft(String),
}

/// The current leader, as this member knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leadership {
    /// The leader's id and address, if there is one.
    pub leader: Option<(NodeId, String)>,
    /// Whether this member is the leader.
    pub is_self: bool,
    /// The raft term.
    pub term: u64,
}

/// A running registry member: the raft handle, read access to the applied registry, and the
/// service to serve peers' raft traffic.
#[derive(Clone)]
pub struct RegistryNode {
    id: NodeId,
    raft: Raft,
    reader: RegistryReader,
    leadership: watch::Receiver<Leadership>,
    security: Security,
    contact: LeaderContact,
    log: LogStore,
    timing: ElectionTiming,
    elections: ElectionStats,
    membership: Membership,
    elect_now: ElectNow,
}

impl fmt::Debug for RegistryNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryNode")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// Moves a damaged store's directory aside and opens an empty one in its place that
/// remembers the old one's vote term and how far its log reached (see
/// [`RegistryConfig::rejoin_damaged`]).
async fn rejoin_empty(
    config: &RegistryConfig,
    damage: Damage,
) -> Result<(LogStore, store::StateMachineStore), RegistryError> {
    let StoreLocation::Directory(dir) = &config.store else {
        // An in-memory store has no directory to move aside.
        return Err(StoreError::Damaged(damage).into());
    };
    let aside = PathBuf::from(format!(
        "{}.damaged-{}",
        dir.display(),
        muster_model::clock::unix_ms()
    ));
    std::fs::rename(dir, &aside).map_err(|e| {
        RegistryError::Config(format!(
            "{damage}. Asked to rejoin, but cannot move {} aside to {}: {e}",
            dir.display(),
            aside.display()
        ))
    })?;
    std::fs::create_dir_all(dir).map_err(|e| {
        RegistryError::Config(format!("cannot create the data dir {}: {e}", dir.display()))
    })?;
    tracing::warn!(
        damaged = %aside.display(),
        vote_term = damage.vote_term,
        held_up_to = damage.held_up_to,
        "{damage}. Rejoining: the damaged store was moved aside, and this member starts empty, \
         catches up from the others, and grants no vote until its log is back at index {}",
        damage.held_up_to
    );
    let (mut log, state_machine) = store::open_with(&config.store, config.encoding)?;
    log.rejoin(config.id, damage.vote_term, damage.held_up_to)
        .await
        .map_err(|e| RegistryError::Raft(format!("cannot prepare the empty store: {e}")))?;
    Ok((log, state_machine))
}

/// Makes `dir` and everything under it its owner's alone: directories 0700, files 0600
/// (symlinks are left as they are, never followed). New files the store makes later are out of
/// others' reach through the directory.
fn make_private(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            make_private(&entry.path())?;
        } else if kind.is_file() {
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o600))?;
        }
    }
    Ok(())
}

impl RegistryNode {
    /// Opens the store and starts raft. On first start every member initializes the group
    /// with the same membership (openraft accepts this); later starts recover from disk.
    ///
    /// Serve [`raft_service`](Self::raft_service) on this member's address so peers reach it.
    ///
    /// # Errors
    /// [`RegistryError`] naming the data directory, the config problem, or openraft's refusal.
    #[inline(never)]
    pub fn start(
        config: RegistryConfig,
    ) -> Pin<Box<dyn Future<Output = Result<Self, RegistryError>> + Send>> {
        // A plain function that boxes the start: the whole start-up, and every future it awaits, is
        // compiled here once rather than again in each crate that awaits it (an `async fn` is
        // compiled where it is first polled, and release builds share no generic code).
        Box::pin(Self::start_here(config))
    }

    async fn start_here(config: RegistryConfig) -> Result<Self, RegistryError> {
        if !config.members.contains_key(&config.id) {
            return Err(RegistryError::Config(format!(
                "member id {} is not among the members {:?}",
                config.id,
                config.members.keys().collect::<Vec<_>>()
            )));
        }
        let (min, max) = config.election_timeout;
        let raft_config = Config {
            cluster_name: "muster-registry".into(),
            heartbeat_interval: heartbeat_of(config.id, config.heartbeat_interval).as_millis()
                as u64,
            election_timeout_min: min.as_millis() as u64,
            election_timeout_max: max.as_millis() as u64,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_after_entries),
            max_in_snapshot_log_to_keep: config.entries_kept_after_snapshot,
            // A follower too far behind for the log gets the snapshot in chunks of the size
            // of one replication batch, each with time to be sent and written on a loaded
            // machine (openraft's default is 3 MiB in 200 ms).
            snapshot_max_chunk_size: store::REPLICATION_BATCH_BYTES as u64,
            install_snapshot_timeout: SNAPSHOT_CHUNK_TIMEOUT.as_millis() as u64,
            // Elections are called by `election::drive_elections`, after a pre-vote round.
            enable_elect: false,
            ..Config::default()
        }
        .validate()
        .map_err(|e| RegistryError::Config(e.to_string()))?;

        if let StoreLocation::Directory(dir) = &config.store {
            std::fs::create_dir_all(dir).map_err(|e| {
                RegistryError::Config(format!("cannot create the data dir {}: {e}", dir.display()))
            })?;
        }
        let (log, state_machine) = match store::open_with(&config.store, config.encoding) {
            Err(StoreError::Damaged(damage)) if config.rejoin_damaged => {
                rejoin_empty(&config, damage).await?
            }
            opened => opened?,
        };
        if let StoreLocation::Directory(dir) = &config.store {
            // The registry holds job environments and token hashes: its owner's alone.
            make_private(dir).map_err(|e| {
                RegistryError::Config(format!(
                    "cannot make the data dir {} private (0700, files 0600): {e}",
                    dir.display()
                ))
            })?;
        }
        let reader = state_machine.reader();
        let timing = ElectionTiming {
            tick: heartbeat_of(config.id, config.heartbeat_interval),
            timeout: config.election_timeout,
        };
        let contacts = PeerContacts::default();
        let raft = Raft::new(
            config.id,
            Arc::new(raft_config),
            NetworkFactory::new(config.security.clone(), config.members.clone())
                .with_encoding(config.encoding)
                .with_contacts(contacts.clone()),
            log.clone(),
            state_machine,
        )
        .await
        .map_err(|e| RegistryError::Raft(e.to_string()))?;

        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| RegistryError::Raft(e.to_string()))?;
        if !initialized && config.join.is_empty() {
            let members: BTreeMap<NodeId, BasicNode> = config
                .members
                .iter()
                .map(|(id, addr)| (*id, BasicNode::new(addr)))
                .collect();
            match raft.initialize(members).await {
                Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(e) => return Err(RegistryError::Raft(e.to_string())),
            }
        }

        let elections = ElectionStats::default();
        let elect_now = ElectNow::default();
        tokio::spawn(election::drive_elections(
            raft.clone(),
            log.clone(),
            config.id,
            config.members.clone(),
            config.security.clone(),
            timing,
            elections.clone(),
            elect_now.clone(),
        ));
        // Whenever it is given: a master restarted before it became a voter still has to ask,
        // and one that is a voter already finds so and stops.
        if !config.join.is_empty() {
            tokio::spawn(membership::join(
                raft.clone(),
                config.security.clone(),
                config.join.clone(),
                JoinRequest {
                    id: config.id,
                    address: config.members[&config.id].clone(),
                },
            ));
        }
        let membership = Membership {
            me: config.id,
            raft: raft.clone(),
            contacts,
            timing,
            transferring: Arc::new(AtomicBool::new(false)),
            handing_to: Arc::new(AtomicU64::new(0)),
            security: config.security.clone(),
            addresses: Arc::new(config.members.clone()),
        };
        let leadership = watch_leadership(&raft, config.id, timing);
        Ok(RegistryNode {
            id: config.id,
            raft,
            reader,
            leadership,
            security: config.security,
            contact: LeaderContact::default(),
            log,
            timing,
            elections,
            membership,
            elect_now,
        })
    }

    /// This member's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The raft handle.
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// Read access to the applied registry.
    pub fn reader(&self) -> &RegistryReader {
        &self.reader
    }

    /// The members of the group (voters and learners), id to address, as raft's membership
    /// holds it now on this member.
    pub fn members(&self) -> BTreeMap<NodeId, String> {
        // Read in place: a master names the group in every heartbeat reply, and needs no
        // member's replication status for it.
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        metrics
            .membership_config
            .membership()
            .nodes()
            .map(|(id, node)| (*id, node.addr.clone()))
            .collect()
    }

    /// The group, with the leader's view of each member when this member leads: `muster
    /// operator raft list-peers`.
    pub fn raft_peers(&self) -> Vec<Peer> {
        self.membership.peers()
    }

    /// Adds master `id` at `address` to the group: a learner that catches up from this leader
    /// within `catch_up`, then a voter. Leader only.
    ///
    /// # Errors
    /// [`MembershipError`]: not the leader, the id or address taken, or the change did not
    /// finish (what was done is named).
    pub async fn add_peer(
        &self,
        id: NodeId,
        address: &str,
        catch_up: Duration,
    ) -> Result<(), MembershipError> {
        self.membership.add(id, address, catch_up).await
    }

    /// Removes master `id` from the group. Leader only; refused for the leader itself, and,
    /// unless `force`, when the voters left that answer would be fewer than their quorum.
    ///
    /// # Errors
    /// [`MembershipError`], naming why.
    pub async fn remove_peer(&self, id: NodeId, force: bool) -> Result<(), MembershipError> {
        self.membership.remove(id, force).await
    }

    /// Hands leadership to voter `to`, or to the one that answers and holds the most of the log,
    /// and returns the new leader. Leader only; writes are refused while it happens.
    ///
    /// # Errors
    /// [`MembershipError`], naming why, or who was elected instead.
    pub async fn transfer_leadership(&self, to: Option<NodeId>) -> Result<NodeId, MembershipError> {
        self.membership.transfer(to).await
    }

    /// The service that answers peers' raft traffic, taking it from master certificates
    /// only; add it to this member's tonic server.
    pub fn raft_service(&self) -> Guarded<RaftServer<RaftService>> {
        Guarded::new(
            RaftService::new(
                self.raft.clone(),
                self.contact.clone(),
                self.log.clone(),
                self.timing,
                self.membership.clone(),
                self.elect_now.clone(),
            )
            .into_server(),
            Rules::new(Requirement::Certificate(&[Role::Master])),
            &self.security,
            Arc::new(NoTokens),
        )
    }

    /// The registry's commit index as this member knows it. On the leader, the highest index
    /// a majority of the voters hold, from openraft's replication figures (once the leader has
    /// applied an entry of its own term, as a leading master has, that is raft's commit
    /// index); on a follower, which openraft 0.9 does not tell its commit index, the index it
    /// applied, a lower bound.
    pub fn commit_index(&self) -> u64 {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let applied = metrics.last_applied.map_or(0, |id| id.index);
        let Some(replication) = &metrics.replication else {
            return applied;
        };
        let own = metrics.last_log_index.unwrap_or(0);
        let matched = metrics
            .membership_config
            .membership()
            .voter_ids()
            .map(|voter| {
                if voter == self.id {
                    own
                } else {
                    replication
                        .get(&voter)
                        .copied()
                        .flatten()
                        .map_or(0, |id| id.index)
                }
            });
        majority_index(matched).max(applied)
    }

    /// How long ago this member last accepted entries or a heartbeat from a leader (`None`
    /// if it never has): on a follower, how stale its registry may be.
    pub fn last_leader_contact(&self) -> Option<Duration> {
        self.contact.since()
    }

    /// How this member's pre-vote rounds went.
    pub fn election_stats(&self) -> &ElectionStats {
        &self.elections
    }

    /// Follows who leads. Changes when the leader or the term changes, or when this member,
    /// leading, stops or starts hearing from a quorum within its lease.
    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.clone()
    }

    /// Writes one batch as one raft entry and returns each operation's result. Only the leader
    /// writes; others, and a leader whose lease lapsed, answer [`WriteError::NotLeader`] with
    /// the leader if known.
    ///
    /// # Errors
    /// [`WriteError`].
    ///
    /// A write in flight when this leader's lease lapses (no quorum answered it, see
    /// [`leadership`](Self::leadership)) ends at once with [`WriteError::Failed`] saying it may
    /// or may not commit, rather than waiting for a quorum that may never come back.
    pub async fn write(&self, batch: Batch) -> Result<BatchOutcome, WriteError> {
        let mut leadership = self.leadership.clone();
        let standing = leadership.borrow().clone();
        if self.membership.transferring.load(Ordering::Acquire) {
            // Handing leadership over: a write now would renew the followers' leases.
            return Err(WriteError::NotLeader { leader: None });
        }
        if !standing.is_self {
            // Raft may still have this member lead, with its lease lapsed: such a write would
            // wait for a quorum that is not there.
            return Err(WriteError::NotLeader {
                leader: standing.leader,
            });
        }
        let lapsed = leadership.wait_for(|now| !now.is_self);
        let written = tokio::select! {
            biased;
            written = self.raft.client_write(batch) => written,
            _ = lapsed => {
                return Err(WriteError::Failed(
                    "this master lost its quorum (no answer within its lease) while the \
                     write was in flight: it may or may not commit"
                        .into(),
                ));
            }
        };
        match written {
            Ok(response) => Ok(response.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                Err(WriteError::NotLeader {
                    leader: forward
                        .leader_id
                        .zip(forward.leader_node.map(|node| node.addr)),
                })
            }
            Err(e) => Err(WriteError::Failed(e.to_string())),
        }
    }

    /// Waits until this member is leader and has applied every entry committed before it
    /// became leader, so the registry it reads is complete.
    ///
    /// # Errors
    /// [`WriteError::NotLeader`] if leadership moved meanwhile.
    ///
    /// A leader that took its term up again after a restart may hold entries of that term,
    /// written before the crash, that it has not yet committed anew: raft commits them only
    /// with a later entry of the leader's term. So when its log reaches past what it has
    /// committed, it commits an empty batch of its own first, and then waits for all of it:
    /// an evaluation stored before the crash is in the registry it reads, not applied later
    /// behind its back.
    pub async fn catch_up(&self) -> Result<(), WriteError> {
        if self.membership.transferring.load(Ordering::Acquire) {
            // Handing leadership over: no new read lease may start (see `membership`).
            return Err(WriteError::NotLeader { leader: None });
        }
        // Bounded as the write below is: a confirmation round a quorum never answers (a peer
        // that voted and then went quiet) would otherwise keep this master starting for good.
        let confirmed =
            tokio::time::timeout(CATCH_UP_WRITE_TIMEOUT, self.raft.ensure_linearizable())
                .await
                .map_err(|_| {
                    WriteError::Failed(format!(
                        "no quorum confirmed this leader within {CATCH_UP_WRITE_TIMEOUT:?}"
                    ))
                })?;
        match confirmed {
            Ok(Some(log_id)) => {
                let last = self.raft.metrics().borrow().last_log_index.unwrap_or(0);
                if last > log_id.index {
                    // Bounded: without a quorum the write would wait for good; the caller
                    // tries to lead again.
                    tokio::time::timeout(CATCH_UP_WRITE_TIMEOUT, self.write(Batch { ops: Vec::new() }))
                        .await
                        .map_err(|_| {
                            WriteError::Failed(format!(
                                "no quorum committed this leader's first entry within {CATCH_UP_WRITE_TIMEOUT:?}"
                            ))
                        })??;
                }
                self.reader.wait_applied(log_id.index.max(last)).await;
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                Err(WriteError::NotLeader {
                    leader: f.leader_id.zip(f.leader_node.map(|node| node.addr)),
                })
            }
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e))) => {
                Err(WriteError::Failed(e.to_string()))
            }
            Err(e) => Err(WriteError::Failed(e.to_string())),
        }
    }

    /// Stops raft. The store is closed when the last handle is dropped.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft did not stop cleanly");
        }
    }

    /// Members other than this one.
    pub fn peers(&self) -> BTreeSet<NodeId> {
        self.members()
            .into_keys()
            .filter(|id| *id != self.id)
            .collect()
    }
}

/// Turns openraft's metrics into a [`Leadership`] watch that changes only when the leader,
/// the term, or this member's standing as leader does.
///
/// A leader that has not heard from a quorum for the lease (the longest election timeout)
/// does not count as leading here, though raft still has it lead: openraft 0.9 never steps a
/// leader down by itself ("check quorum"), and a leader cut off from the other members would
/// otherwise take writes that hang until the client gives up. Its master stands by, refusing
/// with "not the leader" at once, and leads again, in the same term, if a quorum answers
/// before another member is elected. A lone member always leads.
fn watch_leadership(
    raft: &Raft,
    me: NodeId,
    timing: ElectionTiming,
) -> watch::Receiver<Leadership> {
    let mut server = raft.server_metrics();
    let mut data = raft.data_metrics();
    let lease = timing.lease();
    let read = move |m: &openraft::metrics::RaftServerMetrics<NodeId, BasicNode>, lapsed: bool| {
        let leader = m.current_leader.map(|id| {
            let addr = m
                .membership_config
                .membership()
                .get_node(&id)
                .map(|node| node.addr.clone())
                .unwrap_or_default();
            (id, addr)
        });
        let raft_leads = m.state == ServerState::Leader && m.current_leader == Some(me);
        Leadership {
            is_self: raft_leads && !lapsed,
            leader: if raft_leads && lapsed { None } else { leader },
            term: m.vote.leader_id().term,
        }
    };
    let (tx, rx) = watch::channel(read(&server.borrow(), false));
    tokio::spawn(async move {
        // When a quorum last answered this member as leader, as far as it knows, and when it
        // took up its leadership (before the first answer).
        let mut quorum_acked: Option<tokio::time::Instant> = None;
        let mut leading_since: Option<tokio::time::Instant> = None;
        let mut ticks = tokio::time::interval(timing.tick);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                changed = server.changed() => if changed.is_err() { break },
                changed = data.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let since = data.borrow_and_update().millis_since_quorum_ack;
                    quorum_acked = since.and_then(|ms| {
                        tokio::time::Instant::now().checked_sub(Duration::from_millis(ms))
                    });
                }
                _ = ticks.tick() => {}
            }
            let metrics = server.borrow_and_update().clone();
            let now = tokio::time::Instant::now();
            let raft_leads =
                metrics.state == ServerState::Leader && metrics.current_leader == Some(me);
            if !raft_leads {
                leading_since = None;
            } else if leading_since.is_none() {
                leading_since = Some(now);
            }
            let alone = metrics.membership_config.membership().voter_ids().count() <= 1;
            let last_heard = quorum_acked.max(leading_since);
            let lapsed = raft_leads
                && !alone
                && last_heard.is_some_and(|at| now.saturating_duration_since(at) > lease);
            let next = read(&metrics, lapsed);
            tx.send_if_modified(|current| {
                let changed = *current != next;
                if changed {
                    if current.is_self && lapsed {
                        tracing::warn!(
                            term = next.term,
                            ?lease,
                            "no quorum answered this leader within its lease: standing by"
                        );
                    }
                    *current = next;
                }
                changed
            });
            if tx.is_closed() {
                break;
            }
        }
    });
    rx
}

/// This member's heartbeat interval: the configured one, a few percent longer for each member
/// id (up to 18%).
///
/// openraft draws a member's election timeout once, when it starts, and checks it on its tick
/// (every one and a half heartbeats). Two members whose timeouts land on the same tick stand in
/// the same term every time and split every vote: with ticks of one length, for good (two
/// masters started together did so in about a third of runs, seen in a test that waited 30 s
/// for a leader). With ticks of different lengths the two members' timeouts round up to
/// different tick boundaries from one election to the next, and the tie breaks within a few
/// terms.
fn heartbeat_of(member: NodeId, configured: Duration) -> Duration {
    configured.mul_f64(1.0 + 0.03 * (member % 7) as f64)
}

/// The highest index held by a majority of the voters whose matched indexes are given: the
/// middle one, counting from the highest.
fn majority_index(matched: impl Iterator<Item = u64>) -> u64 {
    let mut matched: Vec<u64> = matched.collect();
    matched.sort_unstable_by(|a, b| b.cmp(a));
    matched.get(matched.len() / 2).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::majority_index;

    #[test]
    fn the_commit_index_is_what_a_majority_holds() {
        assert_eq!(majority_index([7].into_iter()), 7, "one voter");
        assert_eq!(majority_index([9, 4, 7].into_iter()), 7);
        assert_eq!(majority_index([9, 4].into_iter()), 4, "two voters: both");
        assert_eq!(majority_index([5, 9, 1, 7, 3].into_iter()), 5);
        assert_eq!(majority_index(std::iter::empty()), 0);
    }
}
