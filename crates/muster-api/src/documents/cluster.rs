//! The document of the cluster's status: who leads, and how its agents stand.

use muster_proto::cluster as cluster_pb;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::ReadInfo;

/// `GET /v1/status`: who leads and how the cluster stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClusterStatus {
    /// The leading master's gRPC address, empty if unknown.
    pub leader: String,
    /// Whether the answering master leads.
    pub is_leader: bool,
    /// The registry's raft term; `null` on a master that has not yet heard of one (a standby
    /// before its first leader).
    pub term: Option<u64>,
    /// The registry's raft commit index as the answering master knows it: on the leader, the
    /// highest index a majority of the masters hold; on a standby, the index it applied (a
    /// lower bound). The index it applied is in `read`.
    pub commit_index: u64,
    /// True while a new leader waits for admitted agents to re-register.
    pub recovering: bool,
    /// True on a cluster run with `--insecure`.
    pub insecure: bool,
    /// Agents connected.
    pub agents_ready: u64,
    /// Agents admitted but not re-registered since a failover.
    pub agents_disconnected: u64,
    /// Agents marked unreachable.
    pub agents_unreachable: u64,
    /// The registry's raft members, as raft's membership on the answering master holds them
    /// (their HTTP addresses filled in by the HTTP API).
    #[serde(default)]
    pub members: Vec<Member>,
    /// How the read was answered.
    pub read: ReadInfo,
}

/// A master of the registry's raft group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Member {
    /// Its raft id.
    pub id: u64,
    /// Its gRPC address (agents, raft, the CLI).
    pub address: String,
    /// Its HTTP API's address, as this master reaches it.
    pub http_address: String,
    /// Whether it leads.
    pub leader: bool,
    /// Whether it votes (false: a learner catching up).
    #[serde(default)]
    pub voter: bool,
    /// Its build, as the answering master knows it (the leader knows every member's); empty
    /// where unknown.
    #[serde(default)]
    pub version: String,
    /// From the leader: whether it answered the leader within the leader lease; `null` on a
    /// standby.
    #[serde(default)]
    pub healthy: Option<bool>,
    /// From the leader: milliseconds since it last answered the leader; `null` on a standby,
    /// or if it never has.
    #[serde(default)]
    pub last_contact_ms: Option<u64>,
}

/// `GET /v1/operator/raft`: the masters' raft group, as the answering master knows it (ask the
/// leader for each member's health).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RaftConfiguration {
    /// The master that answered.
    pub answered_by: u64,
    /// Its raft term.
    pub term: u64,
    /// The registry index it applied.
    pub applied_index: u64,
    /// Every member: voters and learners.
    pub servers: Vec<RaftServer>,
}

/// One master of the raft group and its health.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RaftServer {
    /// Its raft id.
    pub id: u64,
    /// Its gRPC address.
    pub address: String,
    /// False for a learner, still catching up before it votes.
    pub voter: bool,
    /// Whether it leads.
    pub leader: bool,
    /// From the leader: milliseconds since it last answered the leader (0 for the leader);
    /// `null` elsewhere, or if it never has.
    pub last_contact_ms: Option<u64>,
    /// From the leader: the last log index it holds; for the answering master, its own.
    pub log_index: Option<u64>,
    /// From the leader: whether it answered within the leader lease; `null` elsewhere.
    pub healthy: Option<bool>,
    /// Its build, as it said on raft (known to the leader for every member); empty where
    /// unknown.
    #[serde(default)]
    pub version: String,
}

impl From<cluster_pb::RaftPeerList> for RaftConfiguration {
    fn from(list: cluster_pb::RaftPeerList) -> Self {
        RaftConfiguration {
            answered_by: list.answered_by,
            term: list.term,
            applied_index: list.applied_index,
            servers: list
                .peers
                .into_iter()
                .map(|peer| RaftServer {
                    id: peer.id,
                    address: peer.address,
                    voter: peer.voter,
                    leader: peer.leader,
                    last_contact_ms: peer.last_contact_ms,
                    log_index: peer.log_index,
                    healthy: peer.healthy,
                    version: peer.version,
                })
                .collect(),
        }
    }
}

impl From<&cluster_pb::ClusterState> for ClusterStatus {
    fn from(state: &cluster_pb::ClusterState) -> Self {
        ClusterStatus {
            leader: state.leader.clone(),
            is_leader: state.is_leader,
            term: (state.term > 0).then_some(state.term),
            commit_index: state.commit_index,
            recovering: state.recovering,
            insecure: state.insecure,
            agents_ready: state.agents.iter().filter(|a| a.connected).count() as u64,
            agents_disconnected: state.agents.iter().filter(|a| !a.connected).count() as u64,
            agents_unreachable: state.unreachable.len() as u64,
            members: state
                .masters
                .iter()
                .map(|master| Member {
                    id: master.id,
                    address: master.address.clone(),
                    http_address: String::new(),
                    leader: master.leader,
                    voter: master.voter,
                    version: master.version.clone(),
                    healthy: master.healthy,
                    last_contact_ms: master.last_contact_ms,
                })
                .collect(),
            read: state.read.into(),
        }
    }
}
