//! Elections after a pre-vote round (the Raft thesis, §9.6), driven here because openraft 0.9
//! has no pre-vote of its own.
//!
//! openraft runs with elections off (`enable_elect = false`); `drive_elections` watches
//! this member instead. When it has heard no leader for its election timeout (openraft's own
//! rule: a random time between the configured bounds, plus the leader lease while it last knew
//! a leader), it asks every peer whether it *would* vote for it in the next term
//! ([`PreVoteRequest`]), changing nothing on either side. Only when a majority says yes does it
//! call openraft's election (`raft.trigger().elect()`), which raises its term.
//!
//! A peer says yes (`judge`) when it is not the leader, has not heard from a leader within
//! the lease (a committed vote refreshed less than `election_timeout_max` ago), is not in a
//! later term, and the candidate's log is at least as up to date as its own. So a member cut
//! off alone, or from the leader only, keeps its term: it cannot win the pre-vote, and when
//! the network heals it does not depose a healthy leader with a higher term.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use muster_proto::registry::RaftPayload;
use muster_proto::registry::raft_client::RaftClient;
use muster_security::{Role, Security};
use openraft::storage::RaftLogStorage;
use openraft::{LogId, ServerState, Vote};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic::transport::Endpoint;

use crate::codec;
use crate::peer_version::{self, VersionedChannel};
use crate::store::LogStore;
use crate::types::{MAX_RAFT_MESSAGE, NodeId, Raft};

/// "Would you vote for me in the term after `term`?"
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreVoteRequest {
    /// The candidate's current term; it would stand in the next one.
    pub term: u64,
    /// The candidate.
    pub candidate: NodeId,
    /// The last entry in the candidate's log.
    pub last_log_id: Option<LogId<NodeId>>,
}

/// A peer's answer to a [`PreVoteRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreVoteResponse {
    /// Whether it would vote for the candidate.
    pub granted: bool,
    /// The peer's term.
    pub term: u64,
    /// Why not, for the candidate's log.
    pub reason: String,
}

/// How this member's pre-vote rounds went since it started. Clones share the counts.
#[derive(Clone, Debug, Default)]
pub struct ElectionStats {
    won: Arc<AtomicU64>,
    lost: Arc<AtomicU64>,
}

impl ElectionStats {
    /// Rounds a majority granted: each was followed by an election in the next term.
    pub fn won(&self) -> u64 {
        self.won.load(Ordering::Relaxed)
    }

    /// Rounds a majority did not grant: without the pre-vote, each would have raised this
    /// member's term.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }
}

/// Set on a member the leader told to stand ([`ElectNowRequest`](crate::membership::ElectNowRequest)): until it lapses, the member's
/// election driver stands as soon as a pre-vote passes, without waiting out its timeout.
#[derive(Clone, Debug, Default)]
pub(crate) struct ElectNow {
    until: Arc<Mutex<Option<Instant>>>,
}

impl ElectNow {
    /// Stand at once, for the next `window`.
    pub(crate) fn set(&self, window: Duration) {
        *self.until.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + window);
    }

    /// Whether this member was told to stand and the window is still open.
    pub(crate) fn active(&self) -> bool {
        self.until
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|until| Instant::now() < until)
    }

    /// Done: this member leads, or gave up.
    pub(crate) fn clear(&self) {
        *self.until.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// Timing of elections, from the registry config.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ElectionTiming {
    /// How often the driver looks.
    pub(crate) tick: Duration,
    /// The election timeout's bounds.
    pub(crate) timeout: (Duration, Duration),
}

impl ElectionTiming {
    /// How long a member that last heard a leader keeps believing in it: openraft's leader
    /// lease, the longest election timeout. A follower refuses votes (and pre-votes) within it.
    pub(crate) fn lease(&self) -> Duration {
        self.timeout.1
    }

    /// A fresh random election timeout.
    fn random_timeout(&self) -> Duration {
        let (min, max) = self.timeout;
        let spread = max.saturating_sub(min).as_millis() as u64;
        min + Duration::from_millis(fastrand::u64(0..=spread))
    }
}

/// What a member knows of its vote, for a pre-vote on either side: read from raft's state at
/// no cost, every tick.
struct Standing {
    state: ServerState,
    vote: Vote<NodeId>,
    /// How long since its vote was last set or refreshed by a leader; `None` if never.
    quiet: Option<Duration>,
}

async fn standing(raft: &Raft) -> Option<Standing> {
    let (state, vote, modified) = raft
        .with_raft_state(|st| (st.server_state, *st.vote_ref(), st.vote_last_modified()))
        .await
        .ok()?;
    Some(Standing {
        state,
        vote,
        quiet: modified.map(|at| at.elapsed()),
    })
}

/// The last entry in this member's log: read from the store (which decodes it), so only
/// when a round is asked for or about to be.
async fn last_log_id(log: &LogStore) -> Option<Option<LogId<NodeId>>> {
    Some(log.clone().get_log_state().await.ok()?.last_log_id)
}

/// This member's answer to `request`: see the module's docs for the rule. A leader handing its
/// leadership to `handing_to` (0: to no one) grants that candidate, if its log is up to date.
pub(crate) async fn judge(
    raft: &Raft,
    log: &LogStore,
    timing: ElectionTiming,
    request: PreVoteRequest,
    handing_to: NodeId,
) -> PreVoteResponse {
    let not_running = || PreVoteResponse {
        granted: false,
        term: 0,
        reason: "this member's raft is not running".into(),
    };
    let Some(me) = standing(raft).await else {
        return not_running();
    };
    let term = me.vote.leader_id().term;
    let refuse = |reason: String| PreVoteResponse {
        granted: false,
        term,
        reason,
    };
    let candidate_votes = raft
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .voter_ids()
        .any(|voter| voter == request.candidate);
    if !candidate_votes {
        return refuse(format!(
            "the candidate {} is not a voter of the group this member knows",
            request.candidate
        ));
    }
    let handing_over = me.state == ServerState::Leader && handing_to == request.candidate;
    if me.state == ServerState::Leader && !handing_over {
        return refuse("this member leads".into());
    }
    if !handing_over
        && me.vote.is_committed()
        && me.quiet.is_some_and(|quiet| quiet < timing.lease())
    {
        return refuse(format!(
            "this member heard its leader {:?} ago, within the lease of {:?}",
            me.quiet.unwrap_or_default(),
            timing.lease()
        ));
    }
    if request.term < term {
        return refuse(format!(
            "the candidate's term {} is behind this member's {term}",
            request.term
        ));
    }
    let Some(my_last_log_id) = last_log_id(log).await else {
        return not_running();
    };
    if let Some(until) = log.votes_withheld(my_last_log_id.map(|id| id.index)) {
        return refuse(format!(
            "this member rejoins after its store was damaged and grants no vote until its log \
             reaches index {until}"
        ));
    }
    if request.last_log_id < my_last_log_id {
        return refuse(format!(
            "the candidate's log ends at {:?}, behind this member's {:?}",
            request.last_log_id, my_last_log_id
        ));
    }
    PreVoteResponse {
        granted: true,
        term,
        reason: String::new(),
    }
}

/// Another member's id and a client for it (or why none could be made).
type PeerRaftClient = (NodeId, Result<RaftClient<VersionedChannel>, String>);

/// The voters of the group and how to reach each other one, as raft's membership has them
/// now (an address in this member's config takes precedence), with the clients made so far.
struct Voters {
    me: NodeId,
    configured: BTreeMap<NodeId, String>,
    security: Security,
    clients: BTreeMap<(NodeId, String), Result<RaftClient<VersionedChannel>, String>>,
}

impl Voters {
    /// Each configuration of the membership (two while a change is in its joint phase), and a
    /// client for every other voter in them.
    fn current(&mut self, raft: &Raft) -> (Vec<BTreeSet<NodeId>>, Vec<PeerRaftClient>) {
        let membership = crate::types::membership_of(raft);
        let configs = membership.get_joint_config().clone();
        let mut peers = Vec::new();
        for id in membership.voter_ids().filter(|id| *id != self.me) {
            let Some(address) = self
                .configured
                .get(&id)
                .cloned()
                .or_else(|| membership.get_node(&id).map(|node| node.addr.clone()))
            else {
                continue;
            };
            let security = &self.security;
            let client = self
                .clients
                .entry((id, address.clone()))
                .or_insert_with(|| peer_client(&address, security))
                .clone();
            peers.push((id, client));
        }
        (configs, peers)
    }
}

/// Whether `granted` (this member included) holds a majority of every configuration.
fn majority_in_each(configs: &[BTreeSet<NodeId>], granted: &BTreeSet<NodeId>) -> bool {
    !configs.is_empty()
        && configs
            .iter()
            .all(|config| config.intersection(granted).count() > config.len() / 2)
}

/// Runs this member's elections for good (until raft stops): see the module's docs. The
/// voters are raft's membership at each round. While `elect_now` is set (the leader hands its
/// leadership here), the member stands as soon as a pre-vote passes.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn drive_elections(
    raft: Raft,
    log: LogStore,
    me: NodeId,
    configured: BTreeMap<NodeId, String>,
    security: Security,
    timing: ElectionTiming,
    stats: ElectionStats,
    elect_now: ElectNow,
) {
    let mut voters = Voters {
        me,
        configured,
        security,
        clients: BTreeMap::new(),
    };
    let mut timeout = timing.random_timeout();
    // Not before one election timeout from now: members started together do not all stand
    // at once.
    let mut not_before = tokio::time::Instant::now() + timeout;
    let mut ticks = tokio::time::interval(timing.tick);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let urgent = elect_now.active();
        if !urgent && tokio::time::Instant::now() < not_before {
            continue;
        }
        let Some(standing) = standing(&raft).await else {
            return;
        };
        if standing.state == ServerState::Leader || standing.state == ServerState::Learner {
            if standing.state == ServerState::Leader {
                elect_now.clear();
            }
            continue;
        }
        let wait = if standing.vote.is_committed() {
            timing.lease() + timeout
        } else {
            timeout
        };
        if !urgent && standing.quiet.is_some_and(|quiet| quiet < wait) {
            continue;
        }
        let (configs, peers) = voters.current(&raft);
        if !configs.iter().any(|config| config.contains(&me)) {
            continue;
        }
        let Some(last_log_id) = last_log_id(&log).await else {
            return;
        };
        let request = PreVoteRequest {
            term: standing.vote.leader_id().term,
            candidate: me,
            last_log_id,
        };
        let mut granted = pre_vote_round(&peers, request, timing.timeout.0).await;
        granted.insert(me);
        // A leader elected while the round was out (another member's round, a moment ahead)
        // makes its answers stale: standing now would depose it.
        let Some(after) = self::standing(&raft).await else {
            return;
        };
        if after.vote != standing.vote || after.state != standing.state {
            tracing::debug!(
                before = %standing.vote,
                after = %after.vote,
                "pre-vote overtaken: this member's vote changed during the round"
            );
        } else if majority_in_each(&configs, &granted) {
            stats.won.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                term = request.term,
                granted = granted.len(),
                urgent,
                "pre-vote won: standing for election"
            );
            if raft.trigger().elect().await.is_err() {
                return;
            }
        } else {
            if !urgent {
                stats.lost.fetch_add(1, Ordering::Relaxed);
            }
            tracing::debug!(
                term = request.term,
                granted = granted.len(),
                "pre-vote lost: not standing"
            );
        }
        timeout = timing.random_timeout();
        not_before = tokio::time::Instant::now() + timeout;
    }
}

/// Asks every peer at once; those that granted within `deadline`. A peer that does not know
/// the call (a master from before it) counts as granting: it votes as raft always did.
async fn pre_vote_round(
    peers: &[PeerRaftClient],
    request: PreVoteRequest,
    deadline: Duration,
) -> BTreeSet<NodeId> {
    let Ok(body) = codec::encode(&request) else {
        return BTreeSet::new();
    };
    let asks = peers.iter().map(|(peer, client)| {
        let body = body.clone();
        async move {
            let Ok(mut client) = client.clone() else {
                return false;
            };
            let mut call = tonic::Request::new(RaftPayload { body: body.into() });
            call.set_timeout(deadline);
            let answer = tokio::time::timeout(deadline, client.pre_vote(call)).await;
            match answer {
                Ok(Ok(reply)) => match codec::decode::<PreVoteResponse>(&reply.into_inner().body) {
                    Ok(response) => {
                        if !response.granted {
                            tracing::debug!(peer, reason = %response.reason, "pre-vote refused");
                        }
                        response.granted
                    }
                    Err(error) => {
                        tracing::warn!(peer, %error, "malformed pre-vote answer");
                        false
                    }
                },
                Ok(Err(status)) => status.code() == tonic::Code::Unimplemented,
                Err(_) => false,
            }
        }
    });
    futures_util::future::join_all(asks)
        .await
        .into_iter()
        .zip(peers)
        .filter(|(granted, _)| *granted)
        .map(|(_, (peer, _))| *peer)
        .collect()
}

/// A raft client for the member at `address`, connected on first use.
pub(crate) fn peer_client(
    address: &str,
    security: &Security,
) -> Result<RaftClient<VersionedChannel>, String> {
    let endpoint = Endpoint::from_shared(format!("http://{address}"))
        .map_err(|e| format!("bad raft address {address:?}: {e}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(1));
    let channel = security.lazy_channel(endpoint, &[Role::Master]);
    Ok(RaftClient::new(peer_version::versioned(channel))
        .max_decoding_message_size(MAX_RAFT_MESSAGE)
        .max_encoding_message_size(MAX_RAFT_MESSAGE))
}
