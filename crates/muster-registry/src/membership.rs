//! Changing the raft group while it runs: who is in it ([`Peer`]), adding a master (a learner
//! that catches up from the leader, then a voter), removing one, and handing leadership to
//! another.
//!
//! Membership lives in raft: every change is an entry openraft commits through joint consensus
//! (`change_membership`), so it survives restarts and every member follows it. A change is made
//! on the leader only; one made elsewhere answers [`MembershipError::NotLeader`] with the leader.
//!
//! Leadership moves as the Raft thesis describes (section 3.10): the leader stops taking
//! writes and sending heartbeats, waits for the chosen member to hold its whole log, and tells
//! it to stand at once ([`ElectNowRequest`]). The others' leases lapse together, and the chosen
//! member, which stands as soon as its pre-vote can pass while the others still wait out a
//! random election timeout, wins.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use muster_proto::registry::RaftPayload;
use muster_security::Security;
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, ServerState};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::codec;
use crate::election::{ElectionTiming, peer_client};
use crate::types::{NodeId, Raft};

/// How long a removed voter is given to hear, as a learner, the configuration without it.
const REMOVED_HEARS_WITHIN: Duration = Duration::from_secs(3);
/// How long a membership change may take to commit once asked for.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the chosen member may take to hold the leader's whole log before it is told to
/// stand.
const TRANSFER_CATCH_UP: Duration = Duration::from_secs(3);

/// One member of the raft group, as the member asked sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peer {
    /// Its raft id.
    pub id: NodeId,
    /// The `host:port` that serves its raft and the rest of its API.
    pub address: String,
    /// Whether it votes (false: a learner, catching up before it is made a voter).
    pub voter: bool,
    /// Whether it leads.
    pub leader: bool,
    /// On the leader: how long ago this member last answered it (zero for the leader itself,
    /// `None` if it never has). Unknown elsewhere.
    pub last_contact: Option<Duration>,
    /// On the leader: the last log index this member is known to hold. Unknown elsewhere,
    /// except for the member asked.
    pub matched_index: Option<u64>,
    /// On the leader: whether this member answered it within the leader lease (the longest
    /// election timeout). Unknown elsewhere.
    pub healthy: Option<bool>,
    /// Its build, as its answers to the leader said it (the member asked: its own). Unknown
    /// elsewhere, and for a master from before versions were said.
    pub version: Option<String>,
}

/// Why a membership change was not made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum MembershipError {
    /// Only the leader changes the group.
    #[error("not the registry leader{}", match leader {
        Some((id, address)) => format!(" (the leader is {id} at {address})"),
        None => " (no leader known)".to_owned(),
    })]
    NotLeader {
        /// The leader's id and address, if known.
        leader: Option<(NodeId, String)>,
    },
    /// The change is not one to make: the message says why and what to do instead.
    #[error("{0}")]
    Refused(String),
    /// The change was asked for but did not finish: the message says how far it got.
    #[error("{0}")]
    Failed(String),
}

/// When each peer last answered this member's raft calls (on the leader: its followers).
/// Clones share the record.
#[derive(Clone, Debug, Default)]
pub struct PeerContacts {
    last: Arc<Mutex<BTreeMap<NodeId, Answered>>>,
}

/// When a peer last answered, and the build its answer said.
type Answered = (Instant, Option<String>);

impl PeerContacts {
    /// Records an answer from `peer` now, which said it runs `version`.
    pub(crate) fn heard(&self, peer: NodeId, version: Option<String>) {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(peer, (Instant::now(), version));
    }

    /// How long ago `peer` last answered, if it ever has.
    pub fn since(&self, peer: NodeId) -> Option<Duration> {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&peer)
            .map(|(at, _)| at.elapsed())
    }

    /// The build `peer` last said it runs.
    pub fn version(&self, peer: NodeId) -> Option<String> {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&peer)
            .and_then(|(_, version)| version.clone())
    }
}

/// "Add me to the group", from a master started with `--join`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JoinRequest {
    /// The new master's id.
    pub id: NodeId,
    /// The address it serves raft on.
    pub address: String,
}

/// "Stand for election now": the leader hands its leadership over.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct ElectNowRequest {
    /// The leader handing over.
    pub leader: NodeId,
    /// Its term.
    pub term: u64,
}

/// The membership half of a registry member: read the group, change it, move leadership.
#[derive(Clone)]
pub(crate) struct Membership {
    pub(crate) me: NodeId,
    pub(crate) raft: Raft,
    pub(crate) contacts: PeerContacts,
    pub(crate) timing: ElectionTiming,
    /// Set while this leader hands its leadership over: it takes no writes and confirms no
    /// reads meanwhile.
    pub(crate) transferring: Arc<AtomicBool>,
    /// The member it hands over to, 0 otherwise: the one candidate it grants a pre-vote.
    pub(crate) handing_to: Arc<AtomicU64>,
    pub(crate) security: Security,
    /// Addresses this member's config gives peers, which take precedence over raft's.
    pub(crate) addresses: Arc<BTreeMap<NodeId, String>>,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

/// The voters of the configuration the group is moving to (the only one, outside a change).
pub(crate) fn voters_now(membership: &openraft::Membership<NodeId, BasicNode>) -> BTreeSet<NodeId> {
    membership
        .get_joint_config()
        .last()
        .cloned()
        .unwrap_or_default()
}

/// The last log index `id` holds, as this leader's replication figures say (`None` off the
/// leader, or before `id` answered).
fn matched_index(metrics: &openraft::RaftMetrics<NodeId, BasicNode>, id: NodeId) -> Option<u64> {
    metrics
        .replication
        .as_ref()
        .and_then(|replication| replication.get(&id).copied().flatten())
        .map(|log_id| log_id.index)
}

/// Turns openraft's refusal of a change into ours.
fn change_error(e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> MembershipError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => {
            MembershipError::NotLeader {
                leader: forward
                    .leader_id
                    .zip(forward.leader_node.map(|node| node.addr)),
            }
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(
            ChangeMembershipError::InProgress(_),
        )) => MembershipError::Refused(
            "another membership change is in progress: try again once it commits".into(),
        ),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            MembershipError::Refused(e.to_string())
        }
        e => MembershipError::Failed(format!("raft refused the change: {e}")),
    }
}

impl Membership {
    /// The group as this member knows it: voters and learners, with the leader's view of each
    /// when this member leads.
    pub(crate) fn peers(&self) -> Vec<Peer> {
        let metrics = self.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        let voters = voters_now(membership);
        let leading = metrics.state == ServerState::Leader;
        membership
            .nodes()
            .map(|(id, node)| {
                let own = *id == self.me;
                let matched = if own {
                    metrics.last_log_index
                } else {
                    matched_index(&metrics, *id)
                };
                Peer {
                    id: *id,
                    address: node.addr.clone(),
                    voter: voters.contains(id),
                    leader: metrics.current_leader == Some(*id),
                    last_contact: match (leading, own) {
                        (_, true) if leading => Some(Duration::ZERO),
                        (true, false) => self.contacts.since(*id),
                        _ => None,
                    },
                    matched_index: matched,
                    healthy: leading.then(|| self.reachable(*id)),
                    version: if own {
                        Some(muster_proto::version::BUILD_VERSION.to_owned())
                    } else {
                        self.contacts.version(*id)
                    },
                }
            })
            .collect()
    }

    /// The group's membership as this member holds it now.
    fn membership(&self) -> openraft::Membership<NodeId, BasicNode> {
        crate::types::membership_of(&self.raft)
    }

    /// The leader as this member knows it.
    fn known_leader(&self) -> Option<(NodeId, String)> {
        let metrics = self.raft.metrics().borrow().clone();
        let id = metrics.current_leader?;
        let address = metrics
            .membership_config
            .membership()
            .get_node(&id)
            .map(|node| node.addr.clone())?;
        Some((id, address))
    }

    /// Ok if this member leads and is not handing its leadership over.
    fn leading(&self) -> Result<(), MembershipError> {
        let metrics = self.raft.metrics().borrow().clone();
        if metrics.state == ServerState::Leader
            && metrics.current_leader == Some(self.me)
            && !self.transferring.load(Ordering::Acquire)
        {
            Ok(())
        } else if metrics.current_leader == Some(self.me) {
            Err(MembershipError::Refused(format!(
                "master {} is handing its leadership over: try again in a few seconds",
                self.me
            )))
        } else {
            Err(MembershipError::NotLeader {
                leader: self.known_leader(),
            })
        }
    }

    /// Whether `peer` answered this leader within the lease (this member always has).
    fn reachable(&self, peer: NodeId) -> bool {
        peer == self.me
            || self
                .contacts
                .since(peer)
                .is_some_and(|since| since <= self.timing.lease())
    }

    /// Adds master `id` at `address`: first as a learner, which catches up from this leader
    /// (by snapshot if the log behind it was purged) within `catch_up`, then as a voter. Asking
    /// again for a member already in the group at the same address finishes what is left.
    pub(crate) async fn add(
        &self,
        id: NodeId,
        address: &str,
        catch_up: Duration,
    ) -> Result<(), MembershipError> {
        self.leading()?;
        if address
            .rsplit_once(':')
            .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
        {
            return Err(MembershipError::Refused(format!(
                "{address:?} is not HOST:PORT"
            )));
        }
        self.finish_joint_change().await?;
        let membership = self.membership();
        if let Some((other, _)) = membership
            .nodes()
            .find(|(other, node)| **other != id && node.addr == address)
        {
            return Err(MembershipError::Refused(format!(
                "{address} is already master {other}'s address: remove {other} first"
            )));
        }
        match membership.get_node(&id) {
            Some(node) if node.addr != address => {
                return Err(MembershipError::Refused(format!(
                    "master {id} is already a member, at {}: give the new master a new id",
                    node.addr
                )));
            }
            Some(_) if voters_now(&membership).contains(&id) => return Ok(()),
            Some(_) => {}
            None => {
                if let Some(configured) = self.addresses.get(&id)
                    && configured != address
                {
                    return Err(MembershipError::Refused(format!(
                        "master {id} is configured at {configured} (--peer) on this leader: \
                         give the new master a new id"
                    )));
                }
                tracing::info!(id, address, "adding a master as a learner");
                self.change(ChangeMembers::AddNodes(BTreeMap::from([(
                    id,
                    BasicNode::new(address),
                )])))
                .await?;
            }
        }
        self.caught_up(
            id,
            catch_up,
            "it stays a learner: ask again to make it a voter once it has",
        )
        .await?;
        tracing::info!(id, address, "the learner caught up: making it a voter");
        self.change(ChangeMembers::AddVoterIds(BTreeSet::from([id])))
            .await
    }

    /// Waits up to `within` for member `id` to hold this leader's log as it is now; if it
    /// does not, the failure says so and then `otherwise` (what stays as it was).
    async fn caught_up(
        &self,
        id: NodeId,
        within: Duration,
        otherwise: &str,
    ) -> Result<(), MembershipError> {
        let target = self.raft.metrics().borrow().last_log_index.unwrap_or(0);
        let mut metrics = self.raft.metrics();
        let reached = tokio::time::timeout(
            within,
            metrics.wait_for(|m| {
                m.state != ServerState::Leader
                    || matched_index(m, id).is_some_and(|index| index >= target)
            }),
        )
        .await;
        match reached {
            Err(_) => Err(MembershipError::Failed(format!(
                "master {id} did not catch up with this leader's log (index {target}) within \
                 {within:?}; {otherwise}"
            ))),
            Ok(Err(_)) => Err(MembershipError::Failed("raft stopped".into())),
            Ok(Ok(now)) if now.state != ServerState::Leader => {
                drop(now);
                Err(MembershipError::NotLeader {
                    leader: self.known_leader(),
                })
            }
            Ok(Ok(_)) => Ok(()),
        }
    }

    /// Finishes a change a cancelled caller left in its joint phase (both configurations in
    /// force): the voters become those of the later one.
    async fn finish_joint_change(&self) -> Result<(), MembershipError> {
        let membership = self.membership();
        let configs = membership.get_joint_config();
        if configs.len() < 2 {
            return Ok(());
        }
        let last = voters_now(&membership);
        tracing::warn!(?configs, "finishing a membership change left half-done");
        self.change(ChangeMembers::ReplaceAllVoters(last)).await
    }

    /// Removes master `id` from the group. Refused for the leader itself (move leadership
    /// first), and, unless `force`, when the voters left that answer this leader would be fewer
    /// than a quorum of them.
    pub(crate) async fn remove(&self, id: NodeId, force: bool) -> Result<(), MembershipError> {
        self.leading()?;
        self.finish_joint_change().await?;
        let membership = self.membership();
        if membership.get_node(&id).is_none() {
            let members: Vec<NodeId> = membership.nodes().map(|(id, _)| *id).collect();
            return Err(MembershipError::Refused(format!(
                "master {id} is not a member; the members are {members:?}"
            )));
        }
        if id == self.me {
            return Err(MembershipError::Refused(format!(
                "master {id} leads: move leadership first (`muster operator raft \
                 transfer-leadership`), then remove it"
            )));
        }
        let voters = voters_now(&membership);
        if !voters.contains(&id) {
            return self
                .change(ChangeMembers::RemoveNodes(BTreeSet::from([id])))
                .await;
        }
        let left: Vec<NodeId> = voters.iter().copied().filter(|v| *v != id).collect();
        let reachable = left.iter().filter(|v| self.reachable(**v)).count();
        let quorum = left.len() / 2 + 1;
        if reachable < quorum && !force {
            return Err(MembershipError::Refused(format!(
                "removing master {id} would leave {reachable} of its {} voters answering, fewer \
                 than the {quorum} a quorum needs: the group could not commit anything. Bring \
                 the others back first, or pass --force",
                left.len()
            )));
        }
        // First a learner, so that it hears the configuration without it (a member dropped at
        // once never would, and would stand for elections with the old one); then gone.
        self.change(ChangeMembers::RemoveVoters(BTreeSet::from([id])))
            .await?;
        let _ = self
            .caught_up(id, REMOVED_HEARS_WITHIN, "it is removed anyway")
            .await;
        self.change(ChangeMembers::RemoveNodes(BTreeSet::from([id])))
            .await
    }

    /// Commits one membership change, within [`CHANGE_TIMEOUT`].
    async fn change(
        &self,
        change: ChangeMembers<NodeId, BasicNode>,
    ) -> Result<(), MembershipError> {
        tracing::info!(?change, "changing the raft group");
        let deadline = Instant::now() + CHANGE_TIMEOUT;
        loop {
            // On a task of its own: openraft commits a change in two entries (joint, then the
            // new configuration) inside this one future, and a caller that gives up (a
            // deadline, a client gone) must not stop it half-way.
            let raft = self.raft.clone();
            let attempt = change.clone();
            let changing = tokio::spawn(async move { raft.change_membership(attempt, true).await });
            let outcome = match tokio::time::timeout_at(deadline, changing).await {
                Err(_) => {
                    return Err(MembershipError::Failed(format!(
                        "the change did not commit within {CHANGE_TIMEOUT:?}: a quorum of both \
                         the old and the new voters must acknowledge it. It goes on, and \
                         commits once they do"
                    )));
                }
                Ok(Err(e)) => {
                    return Err(MembershipError::Failed(format!("the change failed: {e}")));
                }
                Ok(Ok(outcome)) => outcome,
            };
            match outcome {
                Ok(_) => return Ok(()),
                // The change before this one has not committed its last entry yet: it will.
                Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(
                    ChangeMembershipError::InProgress(_),
                ))) if Instant::now() + self.timing.tick < deadline => {
                    tokio::time::sleep(self.timing.tick).await;
                }
                Err(e) => return Err(change_error(e)),
            }
        }
    }

    /// Hands this leader's leadership to `to`, or to the voter that answers and holds the most
    /// of the log. Returns the new leader.
    pub(crate) async fn transfer(&self, to: Option<NodeId>) -> Result<NodeId, MembershipError> {
        self.leading()?;
        let metrics = self.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership().clone();
        let voters = voters_now(&membership);
        let matched = |id: NodeId| matched_index(&metrics, id).unwrap_or(0);
        let target = match to {
            Some(id) if id == self.me => return Ok(id),
            Some(id) if !voters.contains(&id) => {
                return Err(MembershipError::Refused(format!(
                    "master {id} is not a voter; the voters are {voters:?}"
                )));
            }
            Some(id) if !self.reachable(id) => {
                return Err(MembershipError::Refused(format!(
                    "master {id} has not answered this leader within {:?}: it cannot take over",
                    self.timing.lease()
                )));
            }
            Some(id) => id,
            None => voters
                .iter()
                .copied()
                .filter(|id| *id != self.me && self.reachable(*id))
                .max_by_key(|id| (matched(*id), std::cmp::Reverse(*id)))
                .ok_or_else(|| {
                    MembershipError::Refused(
                        "no other voter answers this leader: add a master, or bring one back, \
                         first"
                            .into(),
                    )
                })?,
        };
        let address = self
            .addresses
            .get(&target)
            .cloned()
            .or_else(|| membership.get_node(&target).map(|node| node.addr.clone()))
            .unwrap_or_default();
        let term = metrics.vote.leader_id().term;
        tracing::info!(target, term, "handing leadership over");

        // No writes and no new read leases from here; the target catches up with heartbeats
        // still on (without them the others' leases would run out first).
        let began = Instant::now();
        let quiet = Quiet::begin(self, target);
        self.caught_up(target, TRANSFER_CATCH_UP, "leadership stays here")
            .await?;
        // Now no heartbeats, so every follower's lease runs out; and the master's read lease
        // (half the shortest election timeout from its last confirmation, none since `began`)
        // has lapsed before anyone may be elected.
        quiet.silence();
        tokio::time::sleep_until(began + self.timing.timeout.0 / 2).await;
        let told = tell_elect_now(
            &self.security,
            &address,
            ElectNowRequest {
                leader: self.me,
                term,
            },
            self.timing.lease(),
        )
        .await;
        if let Err(reason) = told {
            return Err(MembershipError::Failed(format!(
                "could not tell master {target} at {address} to stand: {reason}; leadership \
                 stays here"
            )));
        }
        // Its election waits for the others' leases to lapse, then one pre-vote round and
        // one vote round.
        let deadline = Instant::now() + self.timing.lease() * 3 + self.timing.timeout.1 * 2;
        let mut server = self.raft.server_metrics();
        loop {
            let leader = {
                let now = server.borrow_and_update();
                (now.vote.leader_id().term > term).then_some(now.current_leader)
            };
            match leader {
                Some(Some(leader)) if leader == target => {
                    tracing::info!(target, "leadership handed over");
                    return Ok(target);
                }
                Some(Some(other)) if other != self.me => {
                    return Err(MembershipError::Failed(format!(
                        "master {other} was elected instead of {target}"
                    )));
                }
                _ => {}
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(MembershipError::Failed(format!(
                    "master {target} was told to stand but no new leader was seen within the \
                     deadline; this master takes writes again"
                )));
            }
            if tokio::time::timeout(remaining, server.changed())
                .await
                .is_ok_and(|changed| changed.is_err())
            {
                return Err(MembershipError::Failed("raft stopped".into()));
            }
        }
    }
}

/// While alive, the leader takes no writes and confirms no reads, and once silenced sends no
/// heartbeats; all resume when it drops.
struct Quiet<'a> {
    membership: &'a Membership,
}

impl<'a> Quiet<'a> {
    fn begin(membership: &'a Membership, to: NodeId) -> Self {
        membership.transferring.store(true, Ordering::Release);
        membership.handing_to.store(to, Ordering::Release);
        Quiet { membership }
    }

    /// No more heartbeats.
    fn silence(&self) {
        self.membership.raft.runtime_config().heartbeat(false);
    }
}

impl Drop for Quiet<'_> {
    fn drop(&mut self) {
        self.membership.raft.runtime_config().heartbeat(true);
        self.membership.transferring.store(false, Ordering::Release);
    }
}

/// Sends `request` to the member at `address`.
async fn tell_elect_now(
    security: &Security,
    address: &str,
    request: ElectNowRequest,
    deadline: Duration,
) -> Result<(), String> {
    let mut client = peer_client(address, security)?;
    let body = codec::encode(&request).map_err(|e| e.to_string())?;
    let mut call = tonic::Request::new(RaftPayload { body: body.into() });
    call.set_timeout(deadline);
    let reply = tokio::time::timeout(deadline, client.elect_now(call))
        .await
        .map_err(|_| format!("no answer within {deadline:?}"))?
        .map_err(|status| status.message().to_owned())?;
    let answer: Result<(), String> =
        codec::decode(&reply.into_inner().body).map_err(|e| e.to_string())?;
    answer
}

/// Asks the members at `seeds` (any of them; a follower names the leader) to add this member,
/// `request`, until one answers that it is a voter. Runs until then, or until `raft` stops or
/// shows this member a voter by itself (a restart after the join finished).
pub(crate) async fn join(raft: Raft, security: Security, seeds: Vec<String>, request: JoinRequest) {
    let Ok(body) = codec::encode(&request) else {
        return;
    };
    let mut backoff = Duration::from_millis(200);
    let mut hinted: Option<String> = None;
    loop {
        if raft.metrics().has_changed().is_err() {
            return;
        }
        let is_voter = {
            let metrics = raft.metrics().borrow().clone();
            voters_now(metrics.membership_config.membership()).contains(&request.id)
        };
        if is_voter {
            tracing::info!(id = request.id, "this master is a voter of the group");
            return;
        }
        let targets: Vec<String> = hinted.take().into_iter().chain(seeds.clone()).collect();
        for seed in targets {
            let Ok(mut client) = peer_client(&seed, &security) else {
                tracing::warn!(seed, "--join: not a usable address");
                continue;
            };
            let mut call = tonic::Request::new(RaftPayload {
                body: body.clone().into(),
            });
            // Long enough for a snapshot to reach this member; the leader bounds its own part.
            call.set_timeout(JOIN_CALL_TIMEOUT);
            let answer = match client.join(call).await {
                Ok(reply) => codec::decode::<Result<(), MembershipError>>(&reply.into_inner().body)
                    .unwrap_or_else(|e| {
                        Err(MembershipError::Failed(format!("malformed answer: {e}")))
                    }),
                Err(status) => Err(MembershipError::Failed(status.message().to_owned())),
            };
            match answer {
                Ok(()) => {
                    tracing::info!(id = request.id, seed, "joined the group as a voter");
                    return;
                }
                Err(MembershipError::NotLeader {
                    leader: Some((_, address)),
                }) if !address.is_empty() => {
                    hinted = Some(address);
                    break;
                }
                Err(e) => tracing::warn!(seed, error = %e, "--join: not added yet"),
            }
        }
        // After a hint too: two members that name each other must not be asked in a spin.
        tokio::time::sleep(if hinted.is_some() {
            Duration::from_millis(100)
        } else {
            backoff
        })
        .await;
        if hinted.is_none() {
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}

/// How long one `Join` call may take: the leader waits up to [`JOIN_CATCH_UP`] for the new
/// member to catch up, then commits two membership entries.
const JOIN_CALL_TIMEOUT: Duration = Duration::from_secs(75);
/// How long the leader waits for a joining member to catch up before answering that it
/// stays a learner for now.
pub(crate) const JOIN_CATCH_UP: Duration = Duration::from_secs(60);
