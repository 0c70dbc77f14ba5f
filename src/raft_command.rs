//! `muster operator raft list-peers|add-peer|remove-peer|transfer-leadership`: the masters'
//! raft group, seen and changed while it runs (Nomad's `nomad operator raft`).

use std::io::Write as _;

use clap::Subcommand;
use muster::proto::cluster as pb;

use crate::connection::Connection;
use crate::output::{Format, print_json};

/// `muster operator raft ...`
#[derive(Debug, Subcommand)]
pub(crate) enum RaftCommand {
    /// The masters of the group: id, address, voter or learner, the leader, and from the
    /// leader when each last answered, how much of the log it holds, whether it is healthy and
    /// its build (operator read).
    ListPeers {
        /// Answer from the master given, whatever its role: its own view, without health.
        #[arg(long)]
        stale: bool,
    },
    /// Add a running master to the group: it becomes a learner, catches up from the leader,
    /// then votes (operator write). A master started with --join does this itself.
    AddPeer {
        /// The new master's id (its --id).
        id: u64,
        /// Its address, HOST:PORT, as the other masters reach it.
        address: String,
    },
    /// Remove a master from the group (operator write). Refused for the leader (transfer
    /// leadership first), and when the voters left that answer would be fewer than their
    /// quorum, unless --force.
    RemovePeer {
        /// The master's id.
        id: u64,
        /// Remove it even if the voters left that answer would be fewer than their quorum.
        #[arg(long)]
        force: bool,
    },
    /// Hand leadership to another voter, before maintenance on the leader's host (operator
    /// write). Writes wait while it moves, about one election timeout.
    TransferLeadership {
        /// The voter to take over; by default, the one that answers and holds the most log.
        #[arg(long)]
        to: Option<u64>,
    },
}

/// Runs `command` against the cluster's leader.
pub(crate) async fn run(
    connection: &Connection,
    command: RaftCommand,
    format: Format,
) -> anyhow::Result<()> {
    let list = match command {
        RaftCommand::ListPeers { stale } => {
            connection
                .read(stale, |mut client| async move {
                    client
                        .list_raft_peers(pb::ListRaftPeersRequest { stale })
                        .await
                })
                .await?
        }
        RaftCommand::AddPeer { id, address } => {
            connection
                .at_leader(|mut client| {
                    let address = address.clone();
                    async move {
                        client
                            .add_raft_peer(pb::AddRaftPeerRequest { id, address })
                            .await
                    }
                })
                .await?
        }
        RaftCommand::RemovePeer { id, force } => {
            connection
                .at_leader(|mut client| async move {
                    client
                        .remove_raft_peer(pb::RemoveRaftPeerRequest { id, force })
                        .await
                })
                .await?
        }
        RaftCommand::TransferLeadership { to } => {
            let reply = connection
                .at_leader(|mut client| async move {
                    client
                        .transfer_leadership(pb::TransferLeadershipRequest { to })
                        .await
                })
                .await?;
            if format.is_json() {
                return print_json(&serde_json::json!({
                    "leader": reply.leader,
                    "address": reply.address,
                }));
            }
            writeln!(
                std::io::stdout().lock(),
                "Master {} at {} leads now",
                reply.leader,
                reply.address
            )?;
            return Ok(());
        }
    };
    if format.is_json() {
        return print_json(&muster_api::RaftConfiguration::from(list));
    }
    print_peers(&list)
}

/// The group as a table.
fn print_peers(list: &pb::RaftPeerList) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<6} {:<24} {:<8} {:<7} {:<13} {:<10} {:<8} VERSION",
        "ID", "ADDRESS", "ROLE", "LEADER", "LAST CONTACT", "LOG INDEX", "HEALTHY"
    )?;
    let unknown = || "-".to_owned();
    for peer in &list.peers {
        writeln!(
            out,
            "{:<6} {:<24} {:<8} {:<7} {:<13} {:<10} {:<8} {}",
            peer.id,
            peer.address,
            if peer.voter { "voter" } else { "learner" },
            if peer.leader { "yes" } else { "no" },
            peer.last_contact_ms
                .map_or_else(unknown, |ms| format!("{ms}ms")),
            peer.log_index
                .map_or_else(unknown, |index| index.to_string()),
            peer.healthy
                .map_or_else(unknown, |healthy| if healthy { "yes" } else { "no" }
                    .to_owned()),
            if peer.version.is_empty() {
                "-"
            } else {
                peer.version.as_str()
            },
        )?;
    }
    writeln!(
        out,
        "answered by master {} (term {}, applied index {})",
        list.answered_by, list.term, list.applied_index
    )?;
    Ok(())
}
