//! The masters' raft group as operators see and change it (`muster operator raft ...`, the
//! `ListRaftPeers`, `AddRaftPeer`, `RemoveRaftPeer` and `TransferLeadership` calls, and
//! `GET /v1/operator/raft`): the registry member's membership, in wire form, with its
//! refusals mapped to gRPC statuses.

use muster_proto::cluster as pb;
use muster_registry::{MembershipError, RegistryNode};
use tonic::Status;

use crate::error::ServiceError;

/// How long the leader waits for a master added by hand to catch up before answering that it
/// stays a learner for now.
const ADD_CATCH_UP: std::time::Duration = std::time::Duration::from_secs(30);

/// The group as `registry` knows it.
pub(crate) fn list(registry: &RegistryNode) -> pb::RaftPeerList {
    let metrics = registry.raft().metrics().borrow().clone();
    pb::RaftPeerList {
        peers: registry
            .raft_peers()
            .into_iter()
            .map(|peer| pb::RaftPeer {
                id: peer.id,
                address: peer.address,
                voter: peer.voter,
                leader: peer.leader,
                last_contact_ms: peer.last_contact.map(|since| since.as_millis() as u64),
                log_index: peer.matched_index,
                healthy: peer.healthy,
                version: peer.version.unwrap_or_default(),
            })
            .collect(),
        answered_by: registry.id(),
        term: metrics.vote.leader_id().term,
        applied_index: metrics.last_applied.map_or(0, |id| id.index),
    }
}

/// Ok on the leader; elsewhere the refusal leader-only calls answer with, naming the leader.
pub(crate) fn leading(registry: &RegistryNode) -> Result<(), Status> {
    let leadership = registry.leadership().borrow().clone();
    if leadership.is_self {
        return Ok(());
    }
    Err(ServiceError::not_leader(leadership.leader.map(|(_, address)| address)).into())
}

/// The status a refused or unfinished change answers with.
fn status(error: MembershipError) -> Status {
    match error {
        MembershipError::NotLeader { leader } => {
            ServiceError::not_leader(leader.map(|(_, address)| address)).into()
        }
        MembershipError::Refused(why) => Status::failed_precondition(why),
        MembershipError::Failed(why) => Status::unavailable(why),
    }
}

/// Adds master `id` at `address`: a learner, then a voter.
pub(crate) async fn add(registry: &RegistryNode, id: u64, address: &str) -> Result<(), Status> {
    if id == 0 {
        return Err(Status::invalid_argument("a master's id must be at least 1"));
    }
    registry
        .add_peer(id, address, ADD_CATCH_UP)
        .await
        .map_err(status)
}

/// Removes master `id`.
pub(crate) async fn remove(registry: &RegistryNode, id: u64, force: bool) -> Result<(), Status> {
    registry.remove_peer(id, force).await.map_err(status)
}

/// Hands leadership to `to`, or to the best other voter.
pub(crate) async fn transfer(
    registry: &RegistryNode,
    to: Option<u64>,
) -> Result<pb::TransferLeadershipReply, Status> {
    let leader = registry.transfer_leadership(to).await.map_err(status)?;
    Ok(pb::TransferLeadershipReply {
        leader,
        address: registry.members().remove(&leader).unwrap_or_default(),
    })
}
