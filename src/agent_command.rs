//! `muster agent`: list the agents, drain one (Nomad's `node drain`), and set whether new
//! tasks may be placed on one (Nomad's `node eligibility`).

use std::io::Write;
use std::time::Duration;

use clap::{ArgGroup, Subcommand};
use muster::proto::cluster as pb;

use crate::connection::Connection;
use crate::list_command;
use crate::output::{Format, describe_scheduling, print_json};

#[derive(Debug, Subcommand)]
pub(crate) enum AgentCommand {
    /// Every agent: address, resources, tasks, isolation, whether connected, eligibility and
    /// drain; and those unreachable.
    List {
        /// Answer from the first master that answers, whatever its role (a standby knows no
        /// agents); may be behind: says by how much
        #[arg(long)]
        stale: bool,
    },
    /// Drain an agent: it takes no new tasks; its service tasks move to other agents a few at
    /// a time (each replacement running before the task it replaces stops); batch tasks may
    /// run until the deadline; then whatever is left stops and the agent is marked drained.
    /// Run it again to change the deadline.
    Drain {
        /// The agent's id (`agent-3`, as `muster agent list` shows it).
        id: String,
        /// How long tasks may run on before whatever is left is stopped (`90s`, `30m`, `2h`);
        /// one hour if not given.
        #[arg(long, value_parser = humantime::parse_duration, conflicts_with_all = ["no_deadline", "force", "disable"])]
        deadline: Option<Duration>,
        /// No deadline: tasks are left to end or move.
        #[arg(long, conflicts_with_all = ["force", "disable"])]
        no_deadline: bool,
        /// Stop every task on it now (a deadline already past).
        #[arg(long, conflicts_with = "disable")]
        force: bool,
        /// Cancel the drain under way; the agent takes new tasks again unless
        /// --keep-ineligible.
        #[arg(long)]
        disable: bool,
        /// With --disable: the agent stays ineligible.
        #[arg(long, requires = "disable")]
        keep_ineligible: bool,
    },
    /// Set whether new tasks may be placed on an agent; the tasks it runs stay. Refused while
    /// it drains.
    #[command(group(ArgGroup::new("choice").required(true).args(["enable", "disable"])))]
    Eligibility {
        /// The agent's id.
        id: String,
        /// New tasks may be placed on it.
        #[arg(long)]
        enable: bool,
        /// No new task is placed on it.
        #[arg(long)]
        disable: bool,
    },
}

/// Runs `muster agent ...` against `connection`.
pub(crate) async fn run(
    connection: &Connection,
    command: AgentCommand,
    format: Format,
) -> anyhow::Result<()> {
    let (id, reply) = match command {
        AgentCommand::List { stale } => {
            return list_command::agents(connection, stale, format).await;
        }
        AgentCommand::Drain {
            id,
            deadline,
            no_deadline,
            force,
            disable,
            keep_ineligible,
        } => {
            let request = pb::DrainAgentRequest {
                agent_id: id.clone(),
                deadline_ms: deadline.map_or(0, |d| {
                    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
                }),
                no_deadline,
                force,
                cancel: disable,
                keep_ineligible,
            };
            let reply = connection
                .at_leader(|mut client| {
                    let request = request.clone();
                    async move { client.drain_agent(request).await }
                })
                .await?;
            (id, reply)
        }
        AgentCommand::Eligibility { id, enable, .. } => {
            let request = pb::AgentEligibilityRequest {
                agent_id: id.clone(),
                eligible: enable,
            };
            let reply = connection
                .at_leader(|mut client| {
                    let request = request.clone();
                    async move { client.set_agent_eligibility(request).await }
                })
                .await?;
            (id, reply)
        }
    };
    let doc = muster_api::AgentScheduling::from(reply);
    if format.is_json() {
        return print_json(&doc);
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "agent {id}: {}", describe_scheduling(&doc))?;
    Ok(())
}
