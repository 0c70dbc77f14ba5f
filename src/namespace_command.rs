//! `muster namespace`: create, change, list and delete namespaces (Nomad's `namespace apply`,
//! `list`, `delete`).

use std::io::Write as _;

use clap::Subcommand;
use muster::proto::cluster as pb;

use crate::connection::Connection;
use crate::output::{Format, print_json};

/// `muster namespace ...`
#[derive(Debug, Subcommand)]
pub(crate) enum NamespaceCommand {
    /// Create a namespace, or change one (a management token).
    Apply {
        /// Its name: letters, digits, '-' and '_'.
        name: String,
        /// What it is for.
        #[arg(long, default_value = "")]
        description: String,
        /// The most cpus its live tasks may hold together (no limit if absent).
        #[arg(long)]
        quota_cpus: Option<f64>,
        /// The most memory its live tasks may hold together, in MiB.
        #[arg(long)]
        quota_mem_mb: Option<u64>,
        /// The most live tasks it may hold.
        #[arg(long)]
        quota_tasks: Option<u64>,
    },
    /// The namespaces the token may read jobs in.
    List,
    /// Delete a namespace with its stopped jobs (a management token); refused for `default`
    /// and while a job in it runs.
    Delete {
        /// Its name.
        name: String,
    },
}

/// A namespace as JSON (the HTTP API's document).
fn document(namespace: &pb::Namespace) -> muster_api::NamespaceInfo {
    muster_api::NamespaceInfo::from(namespace.clone())
}

/// Runs a `muster namespace` command.
pub(crate) async fn run(
    connection: &Connection,
    command: NamespaceCommand,
    format: Format,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match command {
        NamespaceCommand::Apply {
            name,
            description,
            quota_cpus,
            quota_mem_mb,
            quota_tasks,
        } => {
            let namespace = pb::Namespace {
                name: name.clone(),
                description,
                quota_cpus,
                quota_mem_mb,
                quota_tasks,
            };
            connection
                .at_leader(|mut client| {
                    let namespace = namespace.clone();
                    async move { client.apply_namespace(namespace).await }
                })
                .await?;
            if format.is_json() {
                drop(out);
                return print_json(&document(&namespace));
            }
            writeln!(out, "namespace {name} applied")?;
        }
        NamespaceCommand::List => {
            let list = connection
                .at_leader(|mut client| async move {
                    client.list_namespaces(pb::ListNamespacesRequest {}).await
                })
                .await?;
            if format.is_json() {
                drop(out);
                let namespaces: Vec<_> = list.namespaces.iter().map(document).collect();
                return print_json(&serde_json::json!({ "namespaces": namespaces }));
            }
            writeln!(out, "{:<24} {:<28} DESCRIPTION", "NAME", "QUOTA")?;
            for namespace in &list.namespaces {
                let quota = document(namespace).quota_text();
                writeln!(
                    out,
                    "{:<24} {:<28} {}",
                    namespace.name, quota, namespace.description
                )?;
            }
        }
        NamespaceCommand::Delete { name } => {
            connection
                .at_leader(|mut client| {
                    let name = name.clone();
                    async move {
                        client
                            .delete_namespace(pb::DeleteNamespaceRequest { name })
                            .await
                    }
                })
                .await?;
            if format.is_json() {
                drop(out);
                return print_json(&serde_json::json!({ "deleted": name }));
            }
            writeln!(out, "namespace {name} deleted")?;
        }
    }
    Ok(())
}
