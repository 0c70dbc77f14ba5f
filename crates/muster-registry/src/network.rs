//! Raft traffic between masters over tonic: the client openraft calls, and the service that
//! hands requests to the local raft.
//!
//! Payloads are openraft's own serde types as JSON; snapshot data travels as raw bytes. One
//! HTTP/2 channel per peer, connected lazily, TCP_NODELAY set, and every call bounded by the
//! deadline openraft gives it. With TLS, each end verifies that the other's certificate is a
//! master's: the client through its connector, the server through the guard
//! [`RegistryNode::raft_service`](crate::RegistryNode::raft_service) installs.

// openraft's error types are large by design and these functions return them as openraft asks.
#![allow(clippy::result_large_err)]

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
use openraft::{BasicNode, SnapshotMeta, Vote};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use crate::types::{NodeId, Raft, TypeConfig};

/// The largest raft message a master sends or accepts: a batch of registry operations or one
/// snapshot chunk, JSON-encoded.
pub const MAX_RAFT_MESSAGE: usize = 64 * 1024 * 1024;

/// Makes a [`PeerClient`] per peer for openraft.
#[derive(Clone, Debug)]
pub struct NetworkFactory {
    security: Security,
}

impl NetworkFactory {
    /// Peers reached with `security` (TLS verifying each peer is a master, or plaintext).
    pub fn new(security: Security) -> Self {
        NetworkFactory { security }
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        let client = Endpoint::from_shared(format!("http://{}", node.addr))
            .map(|endpoint| {
                // HTTP/2 keepalive: a connection a partition cut silently (no reset reaches
                // either end) is noticed within a few seconds and replaced, instead of every
                // call on it timing out until TCP gives up, minutes later.
                let endpoint = endpoint
                    .tcp_nodelay(true)
                    .connect_timeout(Duration::from_secs(1))
                    .http2_keep_alive_interval(RAFT_KEEPALIVE_INTERVAL)
                    .keep_alive_timeout(RAFT_KEEPALIVE_TIMEOUT)
                    .keep_alive_while_idle(true);
                let channel = self.security.lazy_channel(endpoint, &[Role::Master]);
                RaftClient::new(channel)
                    .max_decoding_message_size(MAX_RAFT_MESSAGE)
                    .max_encoding_message_size(MAX_RAFT_MESSAGE)
            })
            .map_err(|e| format!("bad raft address {:?} for node {target}: {e}", node.addr));
        PeerClient { target, client }
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
    client: Result<RaftClient<Channel>, String>,
}

type RpcResult<T, E = RaftError<NodeId>> = Result<T, RPCError<NodeId, BasicNode, E>>;

/// Why a call did not reach the peer's raft, as a std error for openraft's wrappers.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct CallFailed(String);

impl PeerClient {
    fn client<E: Error>(&self) -> RpcResult<RaftClient<Channel>, E> {
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
        let answer: Result<T, E> = serde_json::from_slice(&payload.into_inner().json)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

fn request<T: Serialize, E: Error>(
    value: &T,
    option: &RPCOption,
) -> RpcResult<Request<RaftPayload>, E> {
    let json = serde_json::to_vec(value).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
    let mut request = Request::new(RaftPayload { json: json.into() });
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
        let request = request(&rpc, &option)?;
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
        let header_json =
            serde_json::to_vec(&header).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut request = Request::new(SnapshotChunk {
            header_json: header_json.into(),
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
        let request = request(&rpc, &option)?;
        let reply = self.client()?.vote(request).await;
        self.finish(reply)
    }
}

/// The tonic service that hands peers' raft requests to the local raft.
#[derive(Clone)]
pub struct RaftService {
    raft: Raft,
    contact: LeaderContact,
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
    /// Serves `raft`, recording each accepted AppendEntries in `contact`.
    pub fn new(raft: Raft, contact: LeaderContact) -> Self {
        RaftService { raft, contact }
    }

    /// The service with the raft message limits set, ready to add to a tonic server.
    pub fn into_server(self) -> RaftServer<RaftService> {
        RaftServer::new(self)
            .max_decoding_message_size(MAX_RAFT_MESSAGE)
            .max_encoding_message_size(MAX_RAFT_MESSAGE)
    }
}

fn decode_request<T: DeserializeOwned>(what: &str, json: &[u8]) -> Result<T, Status> {
    serde_json::from_slice(json)
        .map_err(|e| Status::invalid_argument(format!("malformed {what} request: {e}")))
}

fn answer<T: Serialize, E: Serialize>(
    result: &Result<T, E>,
) -> Result<Response<RaftPayload>, Status> {
    let json = serde_json::to_vec(result)
        .map_err(|e| Status::internal(format!("cannot encode the raft answer: {e}")))?;
    Ok(Response::new(RaftPayload { json: json.into() }))
}

#[tonic::async_trait]
impl raft_server::Raft for RaftService {
    async fn append_entries(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let rpc: AppendEntriesRequest<TypeConfig> =
            decode_request("AppendEntries", &request.into_inner().json)?;
        let answered = self.raft.append_entries(rpc).await;
        if matches!(answered, Ok(openraft::raft::AppendEntriesResponse::Success)) {
            self.contact.heard();
        }
        answer(&answered)
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc: VoteRequest<NodeId> = decode_request("Vote", &request.into_inner().json)?;
        answer(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<SnapshotChunk>,
    ) -> Result<Response<RaftPayload>, Status> {
        let chunk = request.into_inner();
        let header: SnapshotHeader = decode_request("InstallSnapshot", &chunk.header_json)?;
        let rpc = InstallSnapshotRequest {
            vote: header.vote,
            meta: header.meta,
            offset: header.offset,
            data: chunk.data.to_vec(),
            done: header.done,
        };
        answer(&self.raft.install_snapshot(rpc).await)
    }
}
