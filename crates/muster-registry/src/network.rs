//! Raft traffic between masters over tonic: the client openraft calls, and the service that
//! hands requests to the local raft.
//!
//! Payloads are openraft's own serde types in the registry's binary encoding ([`codec`]);
//! snapshot data travels as raw bytes. One
//! HTTP/2 channel per peer, connected lazily, TCP_NODELAY set, and every call bounded by the
//! deadline openraft gives it. With TLS, each end verifies that the other's certificate is a
//! master's: the client through its connector, the server through the guard
//! [`RegistryNode::raft_service`](crate::RegistryNode::raft_service) installs.

// openraft's error types are large by design and these functions return them as openraft asks.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use muster_proto::registry::raft_client::RaftClient;
use muster_proto::registry::raft_server::{self, RaftServer};
use muster_proto::registry::{RaftPayload, SnapshotChunk};
use muster_security::{Role, Security};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::storage::RaftLogStorage as _;
use openraft::{BasicNode, SnapshotMeta, Vote};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tonic::transport::Endpoint;
use tonic::{Request, Response, Status};

use crate::codec;
use crate::election::{self, ElectNow, ElectionTiming, PreVoteRequest};
use crate::membership::{ElectNowRequest, JOIN_CATCH_UP, JoinRequest, Membership, PeerContacts};
use crate::peer_version::{self, VersionedChannel};
use crate::store::LogStore;
use crate::types::{MAX_RAFT_MESSAGE, NodeId, Raft, TypeConfig};

/// Makes a [`PeerClient`] per peer for openraft.
#[derive(Clone, Debug)]
pub struct NetworkFactory {
    security: Security,
    addresses: Arc<BTreeMap<NodeId, String>>,
    encoding: codec::Encoding,
    contacts: PeerContacts,
}

impl NetworkFactory {
    /// Peers reached with `security` (TLS verifying each peer is a master, or plaintext), at
    /// the address `addresses` gives each (this member's own list of the group, as its config
    /// has it); a peer not in it, at the address raft's membership holds for it.
    pub fn new(security: Security, addresses: BTreeMap<NodeId, String>) -> Self {
        NetworkFactory {
            security,
            addresses: Arc::new(addresses),
            encoding: codec::Encoding::default(),
            contacts: PeerContacts::default(),
        }
    }

    /// The same, sending requests in `encoding` (peers answer in the request's).
    pub fn with_encoding(self, encoding: codec::Encoding) -> Self {
        NetworkFactory { encoding, ..self }
    }

    /// The same, recording in `contacts` when each peer last answered.
    pub fn with_contacts(self, contacts: PeerContacts) -> Self {
        NetworkFactory { contacts, ..self }
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        // Two connections: one for whatever openraft sends, and one for the heartbeat that
        // goes beside a large payload, so that it never waits behind the payload's bytes.
        let address = self.addresses.get(&target).unwrap_or(&node.addr);
        let connect = || {
            Endpoint::from_shared(format!("http://{address}"))
                .map(|endpoint| {
                    // HTTP/2 keepalive: a connection a partition cut silently (no reset
                    // reaches either end) is noticed within a few seconds and replaced,
                    // instead of every call on it timing out until TCP gives up, minutes
                    // later.
                    let endpoint = endpoint
                        .tcp_nodelay(true)
                        .connect_timeout(Duration::from_secs(1))
                        .http2_keep_alive_interval(RAFT_KEEPALIVE_INTERVAL)
                        .keep_alive_timeout(RAFT_KEEPALIVE_TIMEOUT)
                        .keep_alive_while_idle(true);
                    let channel = self.security.lazy_channel(endpoint, &[Role::Master]);
                    RaftClient::new(peer_version::versioned(channel))
                        .max_decoding_message_size(MAX_RAFT_MESSAGE)
                        .max_encoding_message_size(MAX_RAFT_MESSAGE)
                })
                .map_err(|e| format!("bad raft address {address:?} for node {target}: {e}"))
        };
        PeerClient {
            target,
            client: connect(),
            heartbeats: connect(),
            encoding: self.encoding,
            contacts: self.contacts.clone(),
        }
    }
}

/// How often a raft connection is pinged (HTTP/2 PING).
const RAFT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// How long a ping may go unanswered before the connection is closed and made anew.
const RAFT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(2);

/// openraft's connection to one peer.
#[derive(Debug)]
pub struct PeerClient {
    target: NodeId,
    /// Every call openraft makes.
    client: Result<RaftClient<VersionedChannel>, String>,
    /// The heartbeats sent beside large payloads ([`HEARTBEAT_BESIDE_PAYLOAD_BYTES`]).
    heartbeats: Result<RaftClient<VersionedChannel>, String>,
    /// How requests are written.
    encoding: codec::Encoding,
    /// Where an answer from the peer is recorded.
    contacts: PeerContacts,
}

/// An AppendEntries whose encoding is larger than this is sent with an empty AppendEntries
/// (a heartbeat) beside it, on a connection of its own. openraft sends a follower one request
/// at a time, and a heartbeat waits behind a payload: a follower receiving a large one would
/// otherwise hear nothing from its leader until the last byte arrived, and one that never
/// arrives in time (a slow link, a loaded machine) would start an election. The heartbeat
/// carries the payload's vote, previous log id and commit index, so it says nothing the
/// payload does not; raft takes a repeated or reordered AppendEntries in its stride.
pub const HEARTBEAT_BESIDE_PAYLOAD_BYTES: usize = 64 * 1024;

type RpcResult<T, E = RaftError<NodeId>> = Result<T, RPCError<NodeId, BasicNode, E>>;

/// Why a call did not reach the peer's raft, as a std error for openraft's wrappers.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct CallFailed(String);

impl PeerClient {
    fn client<E: Error>(&self) -> RpcResult<RaftClient<VersionedChannel>, E> {
        self.client
            .clone()
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&CallFailed(e))))
    }

    /// Decodes the peer's `Result<T, E>` answer, or turns a failed call into openraft's error.
    fn finish<T, E>(&self, reply: Result<Response<RaftPayload>, Status>) -> RpcResult<T, E>
    where
        T: DeserializeOwned,
        E: Error + DeserializeOwned,
    {
        let payload = reply.map_err(|status| {
            let failed = CallFailed(format!(
                "raft call to node {} failed: {}",
                self.target,
                status.message()
            ));
            match status.code() {
                tonic::Code::Unavailable => RPCError::Unreachable(Unreachable::new(&failed)),
                _ => RPCError::Network(NetworkError::new(&failed)),
            }
        })?;
        let version = peer_version::said(payload.metadata());
        let answer: Result<T, E> = codec::decode(&payload.into_inner().body)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        self.contacts.heard(self.target, version);
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

fn request<T: Serialize, E: Error>(
    encoding: codec::Encoding,
    value: &T,
    option: &RPCOption,
) -> RpcResult<Request<RaftPayload>, E> {
    let body =
        codec::encode_as(encoding, value).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
    let mut request = Request::new(RaftPayload { body: body.into() });
    request.set_timeout(option.hard_ttl());
    Ok(request)
}

/// A snapshot chunk without its data, which travels beside it as raw bytes.
#[derive(Serialize, Deserialize)]
struct SnapshotHeader {
    vote: Vote<NodeId>,
    meta: SnapshotMeta<NodeId, BasicNode>,
    offset: u64,
    done: bool,
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>> {
        let beside = AppendEntriesRequest::<TypeConfig> {
            vote: rpc.vote,
            prev_log_id: rpc.prev_log_id,
            leader_commit: rpc.leader_commit,
            entries: Vec::new(),
        };
        let request = request(self.encoding, &rpc, &option)?;
        drop(rpc);
        if request.get_ref().body.len() > HEARTBEAT_BESIDE_PAYLOAD_BYTES
            && let Ok(mut heartbeats) = self.heartbeats.clone()
            && let Ok(heartbeat) =
                self::request::<_, RaftError<NodeId>>(self.encoding, &beside, &option)
        {
            // Its answer says nothing the payload's will not: it is not awaited.
            tokio::spawn(async move {
                let _ = heartbeats.append_entries(heartbeat).await;
            });
        }
        let reply = self.client()?.append_entries(request).await;
        self.finish(reply)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        let header = SnapshotHeader {
            vote: rpc.vote,
            meta: rpc.meta,
            offset: rpc.offset,
            done: rpc.done,
        };
        let header = codec::encode_as(self.encoding, &header)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut request = Request::new(SnapshotChunk {
            header: header.into(),
            data: rpc.data.into(),
        });
        request.set_timeout(option.hard_ttl());
        let reply = self.client()?.install_snapshot(request).await;
        self.finish(reply)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>> {
        let request = request(self.encoding, &rpc, &option)?;
        let reply = self.client()?.vote(request).await;
        self.finish(reply)
    }
}

/// The tonic service that hands peers' raft requests to the local raft, and answers their
/// pre-votes ([`crate::election`]).
#[derive(Clone)]
pub struct RaftService {
    raft: Raft,
    contact: LeaderContact,
    log: LogStore,
    timing: ElectionTiming,
    membership: Membership,
    elect_now: ElectNow,
}

/// When this member last heard from a leader (an AppendEntries it accepted, heartbeats
/// included): how far behind a stale read on a follower may be.
#[derive(Clone, Debug, Default)]
pub struct LeaderContact {
    last: Arc<std::sync::Mutex<Option<tokio::time::Instant>>>,
}

impl LeaderContact {
    /// Records a contact now.
    fn heard(&self) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(tokio::time::Instant::now());
    }

    /// How long ago the last contact was, if there was one.
    pub fn since(&self) -> Option<std::time::Duration> {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|at| at.elapsed())
    }
}

impl std::fmt::Debug for RaftService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftService").finish_non_exhaustive()
    }
}

impl RaftService {
    /// Serves `raft`, recording each accepted AppendEntries in `contact`; pre-votes are judged
    /// from `raft`'s state and `log`; joins go to `membership`, and a leader's hand-over sets
    /// `elect_now`.
    pub(crate) fn new(
        raft: Raft,
        contact: LeaderContact,
        log: LogStore,
        timing: ElectionTiming,
        membership: Membership,
        elect_now: ElectNow,
    ) -> Self {
        RaftService {
            raft,
            contact,
            log,
            timing,
            membership,
            elect_now,
        }
    }

    /// The service with the raft message limits set, ready to add to a tonic server.
    pub fn into_server(self) -> RaftServer<RaftService> {
        RaftServer::new(self)
            .max_decoding_message_size(MAX_RAFT_MESSAGE)
            .max_encoding_message_size(MAX_RAFT_MESSAGE)
    }
}

fn decode_request<T: DeserializeOwned>(what: &str, body: &[u8]) -> Result<T, Status> {
    codec::decode(body)
        .map_err(|e| Status::invalid_argument(format!("malformed {what} request: {e}")))
}

/// A peer's `what` request, once its sender's version is checked ([`peer_version::check`]),
/// and the encoding to answer in.
fn read_request<T: DeserializeOwned>(
    what: &str,
    request: Request<RaftPayload>,
) -> Result<(T, codec::Encoding), Status> {
    peer_version::check(request.metadata())?;
    let body = request.into_inner().body;
    Ok((decode_request(what, &body)?, codec::Encoding::of(&body)))
}

/// The answer to a request, written in the request's encoding, saying this master's version.
fn answer<T: Serialize>(
    encoding: codec::Encoding,
    value: &T,
) -> Result<Response<RaftPayload>, Status> {
    let body = codec::encode_as(encoding, value)
        .map_err(|e| Status::internal(format!("cannot encode the raft answer: {e}")))?;
    let mut response = Response::new(RaftPayload { body: body.into() });
    peer_version::say(response.metadata_mut());
    Ok(response)
}

#[tonic::async_trait]
impl raft_server::Raft for RaftService {
    async fn append_entries(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let (rpc, encoding): (AppendEntriesRequest<TypeConfig>, _) =
            read_request("AppendEntries", request)?;
        let answered = self.raft.append_entries(rpc).await;
        if matches!(answered, Ok(openraft::raft::AppendEntriesResponse::Success)) {
            self.contact.heard();
        }
        answer(encoding, &answered)
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let (rpc, encoding): (VoteRequest<NodeId>, _) = read_request("Vote", request)?;
        let last_log_id = self
            .log
            .clone()
            .get_log_state()
            .await
            .map_err(|e| Status::unavailable(format!("cannot read this member's log: {e}")))?
            .last_log_id;
        if let Some(until) = self.log.votes_withheld(last_log_id.map(|id| id.index)) {
            // Rejoining after its store was damaged: it may have acknowledged entries it no
            // longer holds, so it helps no candidate win until it holds them again.
            tracing::info!(candidate = ?rpc.vote, until, "vote withheld: this member rejoins and its log has not reached what it held");
            let vote = self.raft.metrics().borrow().vote;
            let refused: Result<VoteResponse<NodeId>, RaftError<NodeId>> = Ok(VoteResponse {
                vote,
                vote_granted: false,
                last_log_id,
            });
            return answer(encoding, &refused);
        }
        answer(encoding, &self.raft.vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<SnapshotChunk>,
    ) -> Result<Response<RaftPayload>, Status> {
        peer_version::check(request.metadata())?;
        let chunk = request.into_inner();
        let encoding = codec::Encoding::of(&chunk.header);
        let header: SnapshotHeader = decode_request("InstallSnapshot", &chunk.header)?;
        let rpc = InstallSnapshotRequest {
            vote: header.vote,
            meta: header.meta,
            offset: header.offset,
            data: chunk.data.to_vec(),
            done: header.done,
        };
        answer(encoding, &self.raft.install_snapshot(rpc).await)
    }

    async fn pre_vote(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let (asked, encoding): (PreVoteRequest, _) = read_request("PreVote", request)?;
        let handing_to = self
            .membership
            .handing_to
            .load(std::sync::atomic::Ordering::Acquire);
        let response = election::judge(&self.raft, &self.log, self.timing, asked, handing_to).await;
        answer(encoding, &response)
    }

    async fn join(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let (asked, encoding): (JoinRequest, _) = read_request("Join", request)?;
        tracing::info!(id = asked.id, address = %asked.address, "a master asks to join");
        let added = self
            .membership
            .add(asked.id, &asked.address, JOIN_CATCH_UP)
            .await;
        answer(encoding, &added)
    }

    async fn elect_now(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let (asked, encoding): (ElectNowRequest, _) = read_request("ElectNow", request)?;
        let metrics = self.raft.metrics().borrow().clone();
        let answered: Result<(), String> = if metrics.current_leader != Some(asked.leader)
            || metrics.vote.leader_id().term != asked.term
        {
            Err(format!(
                "this member knows leader {:?} in term {}, not {} in term {}",
                metrics.current_leader,
                metrics.vote.leader_id().term,
                asked.leader,
                asked.term
            ))
        } else if !crate::membership::voters_now(metrics.membership_config.membership())
            .contains(&self.membership.me)
        {
            Err("this member is not a voter".into())
        } else {
            tracing::info!(
                leader = asked.leader,
                term = asked.term,
                "told to stand: the leader hands over"
            );
            // Its election needs the others' leases to lapse first.
            self.elect_now.set(self.timing.lease() * 3);
            Ok(())
        };
        answer(encoding, &answered)
    }
}
