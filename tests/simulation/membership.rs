//! The group changed under the faults, in a third of the seeds: two more masters start with
//! `--join` and become voters (three grow to five), and later an operator removes them again
//! through the operator API (`RemoveRaftPeer`, after `TransferLeadership` when one of them
//! leads). The clients' operations go on throughout and are held to the same checks.

use std::collections::BTreeSet;
use std::time::Duration;

use muster_proto::cluster as pb;
use muster_registry::MemoryDisk;

use crate::cluster::{self, MasterHost};
use crate::record::{self, Record};

/// When the operator starts removing the two joined masters (they join at 4 s and 5 s).
const REMOVE_FROM: Duration = Duration::from_secs(12);
/// How long the group has to grow to five, and then to return to three.
const WITHIN: Duration = Duration::from_secs(40);
/// One call's deadline: a call into a partition never answers.
const CALL_DEADLINE: Duration = Duration::from_secs(3);

/// Whether seed `seed` changes the group.
pub(crate) fn changes_group(seed: u64) -> bool {
    seed.is_multiple_of(3)
}

/// Adds to `sim` two masters that join the group of `founders`, and the operator that removes
/// them again ([`operate`]).
pub(crate) fn join_and_leave(sim: &mut turmoil::Sim<'_>, founders: &[MasterHost], record: &Record) {
    let first = founders.len() as u64 + 1;
    let joiners: Vec<MasterHost> = (first..first + 2)
        .map(|id| MasterHost {
            name: format!("m{id}"),
            id,
            disk: MemoryDisk::default(),
            // Fixed, apart from the founders' and each other's (see `MasterHost`).
            election_timeout: Duration::from_millis(400 + 300 * (id - 1) + 50),
            // Under the faults, which start at 3 s.
            joins_at: Some(Duration::from_secs(id)),
        })
        .collect();
    for joiner in &joiners {
        let (host, all, record) = (joiner.clone(), founders.to_vec(), record.clone());
        sim.host(joiner.name.as_str(), move || {
            cluster::run_master(host.clone(), all.clone(), record.clone())
        });
    }
    let everyone: Vec<MasterHost> = founders.iter().chain(&joiners).cloned().collect();
    let ids = joiners.iter().map(|j| j.id).collect();
    let record = record.clone();
    sim.client("operator", async move {
        operate(cluster::master_addresses(&everyone), ids, record).await
    });
}

/// The voters, as whichever of `masters` answers first as leader knows them, and that leader.
async fn voters(masters: &[String], record: &Record) -> Option<(BTreeSet<u64>, Option<u64>)> {
    let token = record.token()?;
    for address in masters {
        let Ok(Ok(mut client)) = tokio::time::timeout(
            CALL_DEADLINE,
            muster_master::testing::operator(address, Some(&token)),
        )
        .await
        else {
            continue;
        };
        let Ok(Ok(list)) = tokio::time::timeout(
            CALL_DEADLINE,
            client.list_raft_peers(pb::ListRaftPeersRequest { stale: false }),
        )
        .await
        else {
            continue;
        };
        let list = list.into_inner();
        let leader = list.peers.iter().find(|p| p.leader).map(|p| p.id);
        if leader != Some(list.answered_by) {
            continue;
        }
        let voters = list
            .peers
            .iter()
            .filter(|p| p.voter)
            .map(|p| p.id)
            .collect();
        return Some((voters, leader));
    }
    None
}

/// Sends `call` to every one of `masters` in turn until one answers it; whether one did.
async fn at_leader<F, Fut, T>(masters: &[String], record: &Record, call: F) -> bool
where
    F: Fn(muster_master::testing::TestOperator) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let Some(token) = record.token() else {
        return false;
    };
    for address in masters {
        let Ok(Ok(client)) = tokio::time::timeout(
            CALL_DEADLINE,
            muster_master::testing::operator(address, Some(&token)),
        )
        .await
        else {
            continue;
        };
        match tokio::time::timeout(CALL_DEADLINE * 4, call(client)).await {
            Ok(Ok(_)) => return true,
            Ok(Err(status)) => record.log(format!("operator at {address}: {}", status.message())),
            Err(_) => {}
        }
    }
    false
}

/// The operator: waits for the two joiners, `joined`, to vote, then removes them; every
/// master's address is in `masters`. Fails the run if the group does not grow to five, or
/// does not return to three, in time.
async fn operate(
    masters: Vec<String>,
    joined: Vec<u64>,
    record: Record,
) -> Result<(), Box<dyn std::error::Error>> {
    let founders: BTreeSet<u64> = (1..=3).collect();
    let all: BTreeSet<u64> = founders.iter().chain(&joined).copied().collect();
    let deadline = record::now() + WITHIN;
    loop {
        if let Some((voters, _)) = voters(&masters, &record).await
            && voters == all
        {
            record.log(format!("the group grew to {} voters", all.len()));
            break;
        }
        if record::now() > deadline {
            return Err(format!("the group did not grow to {all:?} within {WITHIN:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(REMOVE_FROM.saturating_sub(record::now())).await;
    let deadline = record::now() + WITHIN;
    loop {
        let Some((voters, leader)) = voters(&masters, &record).await else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        if voters == founders {
            record.log("the group is back to three voters");
            return Ok(());
        }
        if record::now() > deadline {
            return Err(format!(
                "the group did not return to {founders:?} within {WITHIN:?}: voters {voters:?}"
            )
            .into());
        }
        let Some(leaving) = joined.iter().copied().find(|id| voters.contains(id)) else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        if leader == Some(leaving) {
            let moved = at_leader(&masters, &record, |mut client| async move {
                client
                    .transfer_leadership(pb::TransferLeadershipRequest { to: None })
                    .await
            })
            .await;
            record.log(format!(
                "operator: hand leadership off master {leaving}: {moved}"
            ));
        } else {
            let removed = at_leader(&masters, &record, |mut client| async move {
                client
                    .remove_raft_peer(pb::RemoveRaftPeerRequest {
                        id: leaving,
                        force: false,
                    })
                    .await
            })
            .await;
            record.log(format!("operator: remove master {leaving}: {removed}"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
