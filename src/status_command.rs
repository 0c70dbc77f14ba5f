//! `muster status`: the cluster as the leader (or with `--stale` the master given) has it.
//! Its table of agents is also `muster agent list`'s.

use std::io::Write;

use muster::proto::cluster as pb;

use crate::connection::Connection;
use crate::output::{Format, describe_scheduling, print_json, staleness, state_name};
use crate::when;

/// The cluster state: linearizable from the leader (following a standby's hint), or with
/// `stale` from the master given, as it has it.
pub(crate) async fn read_state(
    connection: &Connection,
    stale: bool,
) -> anyhow::Result<pb::ClusterState> {
    connection
        .read(stale, |mut client| async move {
            client.get_state(pb::GetStateRequest { stale }).await
        })
        .await
}

/// `muster status`: the leader, the security in force, the agents with their tasks, and the
/// jobs that own tasks (a task's owner is its job; the wire calls it a framework, after Mesos).
pub(crate) async fn run(
    connection: &Connection,
    stale: bool,
    format: Format,
) -> anyhow::Result<()> {
    let state = read_state(connection, stale).await?;
    if format.is_json() {
        return print_json(&muster_api::ClusterStatus::from(&state));
    }
    let mut out = std::io::stdout().lock();
    if let Some(line) = staleness(state.read.as_ref()) {
        writeln!(out, "{line}")?;
    }
    writeln!(
        out,
        "leader {} (term {}){}",
        state.leader,
        state.term,
        if state.recovering { ", recovering" } else { "" }
    )?;
    writeln!(
        out,
        "security: {}",
        if state.insecure {
            "INSECURE (--insecure: no TLS, no roles, no tokens)"
        } else {
            "mutual TLS, roles, ACL tokens"
        }
    )?;
    for master in &state.masters {
        writeln!(
            out,
            "master {} {} {}{} muster {}",
            master.id,
            master.address,
            if master.voter { "voter" } else { "learner" },
            if master.leader { " leader" } else { "" },
            if master.version.is_empty() {
                "(version unknown)"
            } else {
                master.version.as_str()
            }
        )?;
    }
    print_agents(&mut out, &state)?;
    if !state.frameworks.is_empty() {
        let names: Vec<&str> = state.frameworks.iter().map(|f| f.id.as_str()).collect();
        writeln!(out, "jobs with tasks: {}", names.join(", "))?;
    }
    Ok(())
}

/// The agents of `state`: a count, a table of the connected and disconnected ones with their
/// tasks, and the unreachable ones (`muster status`, `muster agent list`).
pub(crate) fn print_agents(out: &mut impl Write, state: &pb::ClusterState) -> anyhow::Result<()> {
    writeln!(
        out,
        "agents: {} ({} connected), {} unreachable",
        state.agents.len(),
        state.agents.iter().filter(|a| a.connected).count(),
        state.unreachable.len()
    )?;
    if !state.agents.is_empty() {
        writeln!(
            out,
            "  {:<12} {:<20} {:<28} {:>6} {:>8} {:>6}  {:<13} {:<9}  {:<8}  SCHEDULING",
            "ID",
            "HOSTNAME",
            "ADDRESS",
            "CPUS",
            "MEM MB",
            "TASKS",
            "ISOLATION",
            "CONNECTED",
            "VERSION"
        )?;
    }
    for agent in &state.agents {
        let info = agent.info.clone().unwrap_or_default();
        let resources = info.resources.unwrap_or_default();
        let isolation = info
            .attributes
            .get(muster::agent::ISOLATION_ATTRIBUTE)
            .map_or("?", String::as_str);
        let scheduling = muster_api::AgentScheduling::new(&agent.id, agent.scheduling.as_ref());
        writeln!(
            out,
            "  {:<12} {:<20} {:<28} {:>6} {:>8} {:>6}  {:<13} {:<9}  {:<8}  {}",
            agent.id,
            info.hostname,
            info.address,
            resources.cpus,
            resources.mem_mb,
            agent.tasks.len(),
            isolation,
            agent.connected,
            if agent.version.is_empty() {
                "?"
            } else {
                agent.version.as_str()
            },
            describe_scheduling(&scheduling)
        )?;
        for task in &agent.tasks {
            let task_state = state_name(task.state);
            writeln!(
                out,
                "      task {} ({}) {} {}",
                task.id, task.framework_id, task_state, task.command
            )?;
        }
    }
    for agent in &state.unreachable {
        writeln!(
            out,
            "  unreachable {} since {}",
            agent.id,
            when::when(agent.marked_at_ms)
        )?;
    }
    Ok(())
}
