//! `muster monitor`: a master's or an agent's log as it happens, from the level asked for
//! (Nomad's `monitor`). The node gathers that level for the stream alone, and stops when it
//! ends; an agent's log comes through the leader.

use std::io::Write as _;

use anyhow::{Context as _, bail};
use muster::proto::cluster as pb;

use crate::connection::Connection;
use crate::output::Format;

/// `muster monitor`'s flags.
#[derive(Debug, clap::Args)]
pub(crate) struct MonitorArgs {
    /// The master to watch, by raft id: `2` or `master-2` [default: the leader].
    #[arg(long, conflicts_with = "agent")]
    node: Option<String>,
    /// The agent to watch instead, by id (`muster agent list`); its log comes through the
    /// leader.
    #[arg(long)]
    agent: Option<String>,
    /// The lowest level shown: trace, debug, info, warn or error.
    #[arg(long, default_value = "info")]
    log_level: String,
}

/// A master's id from `2` or `master-2`.
fn master_id(node: &str) -> anyhow::Result<u64> {
    node.strip_prefix("master-")
        .unwrap_or(node)
        .parse()
        .with_context(|| format!("--node {node:?} is not a master's id (2, or master-2)"))
}

/// Streams the log of the master `args` names until it ends or this program is stopped.
pub(crate) async fn run(
    connection: &Connection,
    args: MonitorArgs,
    format: Format,
) -> anyhow::Result<()> {
    muster_launch::monitor::parse_level(&args.log_level).map_err(anyhow::Error::msg)?;
    if let Some(agent_id) = args.agent {
        let request = pb::MonitorRequest {
            log_level: args.log_level,
            json: format.is_json(),
            agent_id: agent_id.clone(),
        };
        let lines = connection
            .at_leader(|mut client| {
                let request = request.clone();
                async move { client.monitor(request).await }
            })
            .await
            .with_context(|| format!("agent {agent_id}'s log could not be streamed"))?;
        return print_lines(lines, &format!("agent {agent_id}")).await;
    }
    let peers = connection
        .at_leader(|mut client| async move {
            client
                .list_raft_peers(pb::ListRaftPeersRequest { stale: false })
                .await
        })
        .await?;
    let id = match &args.node {
        Some(node) => master_id(node)?,
        None => peers.answered_by,
    };
    let Some(master) = peers.peers.iter().find(|peer| peer.id == id) else {
        let ids: Vec<u64> = peers.peers.iter().map(|peer| peer.id).collect();
        bail!("there is no master {id}; the masters are {ids:?}");
    };
    let mut client = connection.client(&master.address).await?;
    let lines = client
        .monitor(pb::MonitorRequest {
            log_level: args.log_level.clone(),
            json: format.is_json(),
            agent_id: String::new(),
        })
        .await
        .with_context(|| {
            format!(
                "master {id} at {} refused to stream its log",
                master.address
            )
        })?
        .into_inner();
    print_lines(lines, &format!("master {id}")).await
}

/// Prints each line of `node`'s log stream as it arrives, until the stream ends.
async fn print_lines(mut lines: tonic::Streaming<pb::LogLine>, node: &str) -> anyhow::Result<()> {
    while let Some(line) = lines
        .message()
        .await
        .with_context(|| format!("the log stream of {node} broke"))?
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", line.line)?;
        out.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::master_id;

    #[test]
    fn a_master_is_named_by_its_id_with_or_without_its_prefix() {
        assert_eq!(master_id("2").ok(), Some(2));
        assert_eq!(master_id("master-12").ok(), Some(12));
        let refused = master_id("m2").expect_err("not an id").to_string();
        assert!(refused.contains("\"m2\""), "{refused}");
    }
}
