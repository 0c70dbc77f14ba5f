//! `muster deployment`: list a job's deployments (or every job's), show one, and promote,
//! pause, resume or fail it (Nomad's `deployment` commands).

use std::io::Write;

use clap::Subcommand;
use muster::proto::cluster as pb;

use crate::connection::Connection;
use crate::output::{Format, print_json, staleness};
use crate::when;

/// `muster deployment ...`
#[derive(Debug, Subcommand)]
pub(crate) enum DeploymentCommand {
    /// Deployments, newest first: one job's, or every job's in the namespace (`-n '*'`: in
    /// every namespace the token may read).
    List {
        /// Only this job's.
        #[arg(long, default_value = "")]
        job: String,
        /// Answer from the first master that answers, whatever its role; may be behind: says
        /// by how much
        #[arg(long)]
        stale: bool,
    },
    /// One deployment: its status and each group's progress.
    Status {
        /// The deployment (`web.v3`, as `deployment list` shows it).
        id: String,
        /// Answer from the first master that answers, whatever its role.
        #[arg(long)]
        stale: bool,
    },
    /// Promote its canaries: the roll goes on.
    Promote {
        /// The deployment.
        id: String,
        /// Only this group's canaries; repeat for several (none: every group's).
        #[arg(long = "group")]
        groups: Vec<String>,
    },
    /// Replace nothing more until it is resumed.
    Pause {
        /// The deployment.
        id: String,
    },
    /// Go on with a paused deployment.
    Resume {
        /// The deployment.
        id: String,
    },
    /// Fail it: nothing more is replaced; with `auto_revert` the job goes back to its last
    /// version that deployed well.
    Fail {
        /// The deployment.
        id: String,
    },
}

/// Runs a `muster deployment` command against `connection`.
pub(crate) async fn run(
    connection: &Connection,
    command: DeploymentCommand,
    format: Format,
) -> anyhow::Result<()> {
    let (id, action, groups) = match command {
        DeploymentCommand::List { job, stale } => {
            return list(connection, job, String::new(), stale, format).await;
        }
        DeploymentCommand::Status { id, stale } => {
            return list(connection, String::new(), id, stale, format).await;
        }
        DeploymentCommand::Promote { id, groups } => (id, pb::DeploymentAction::Promote, groups),
        DeploymentCommand::Pause { id } => (id, pb::DeploymentAction::Pause, Vec::new()),
        DeploymentCommand::Resume { id } => (id, pb::DeploymentAction::Resume, Vec::new()),
        DeploymentCommand::Fail { id } => (id, pb::DeploymentAction::Fail, Vec::new()),
    };
    let reply = connection
        .at_leader(|mut client| {
            let request = pb::ChangeDeploymentRequest {
                namespace: connection.namespace.clone(),
                id: id.clone(),
                action: action as i32,
                groups: groups.clone(),
            };
            async move { client.change_deployment(request).await }
        })
        .await?;
    let Some(deployment) = reply.deployment else {
        anyhow::bail!("the master answered without the deployment");
    };
    let doc = muster_api::DeploymentInfo::from(deployment);
    if format.is_json() {
        return print_json(&doc);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "deployment {} is {}: {}",
        doc.id, doc.status, doc.description
    )?;
    Ok(())
}

/// `deployment list` (with `job`) and `deployment status` (with `id`).
async fn list(
    connection: &Connection,
    job: String,
    id: String,
    stale: bool,
    format: Format,
) -> anyhow::Result<()> {
    let one = !id.is_empty();
    let list = connection
        .read(stale, |mut client| {
            let request = pb::ListDeploymentsRequest {
                namespace: connection.namespace.clone(),
                job: job.clone(),
                id: id.clone(),
                stale,
            };
            async move { client.list_deployments(request).await }
        })
        .await?;
    let stale_line = staleness(list.read.as_ref());
    let doc = muster_api::DeploymentList::from(list);
    let mut out = std::io::stdout().lock();
    if one {
        let Some(deployment) = doc.deployments.first() else {
            anyhow::bail!("no deployment {id:?}");
        };
        if format.is_json() {
            return print_json(deployment);
        }
        if let Some(line) = &stale_line {
            writeln!(out, "{line}")?;
        }
        return print_one(&mut out, deployment);
    }
    if format.is_json() {
        return print_json(&doc);
    }
    if let Some(line) = &stale_line {
        writeln!(out, "{line}")?;
    }
    if doc.deployments.is_empty() {
        writeln!(out, "no deployments")?;
        return Ok(());
    }
    writeln!(
        out,
        "{:<28} {:<16} {:>7} {:<10} DESCRIPTION",
        "ID", "NAMESPACE", "VERSION", "STATUS"
    )?;
    for d in &doc.deployments {
        writeln!(
            out,
            "{:<28} {:<16} {:>7} {:<10} {}",
            d.id, d.namespace, d.job_version, d.status, d.description
        )?;
    }
    Ok(())
}

/// `deployment status`: the deployment, then a line per group.
fn print_one(out: &mut impl Write, d: &muster_api::DeploymentInfo) -> anyhow::Result<()> {
    writeln!(
        out,
        "deployment {} of job {} (namespace {}), version {}",
        d.id, d.job, d.namespace, d.job_version
    )?;
    writeln!(out, "status: {} ({})", d.status, d.description)?;
    writeln!(out, "started: {}", when::when(d.created_ms))?;
    if d.progress_by_ms != 0 && d.status == "running" {
        writeln!(
            out,
            "fails without progress by: {}",
            when::when(d.progress_by_ms)
        )?;
    }
    if let Some(version) = d.reverted_to {
        writeln!(out, "rolled back to version {version}")?;
    }
    writeln!(
        out,
        "{:<16} {:>7} {:>8} {:>8} {:>7} {:>9} {:<8}",
        "GROUP", "DESIRED", "CANARIES", "PROMOTED", "HEALTHY", "UNHEALTHY", "PARALLEL"
    )?;
    for g in &d.groups {
        writeln!(
            out,
            "{:<16} {:>7} {:>8} {:>8} {:>7} {:>9} {:<8}",
            g.name,
            g.desired_total,
            g.desired_canaries,
            if g.promoted { "yes" } else { "no" },
            g.healthy,
            g.unhealthy,
            g.max_parallel
        )?;
    }
    Ok(())
}
