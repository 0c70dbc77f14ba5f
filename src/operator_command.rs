//! `muster operator snapshot save|restore`: a point-in-time copy of the registry, and putting
//! one back (Nomad's `nomad operator snapshot`); `muster operator raft` is in `raft_command`.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Subcommand;
use muster::proto::cluster as pb;
use muster::registry::snapshot_file;

use crate::connection::Connection;
use crate::output::{Format, print_json};
use crate::raft_command::RaftCommand;

/// `muster operator ...`
#[derive(Debug, Subcommand)]
pub(crate) enum OperatorCommand {
    /// Save or restore a snapshot of the registry (management token).
    Snapshot {
        #[command(subcommand)]
        command: SnapshotCommand,
    },
    /// See and change the masters' raft group while it runs.
    Raft {
        #[command(subcommand)]
        command: RaftCommand,
    },
}

/// `muster operator snapshot ...`
#[derive(Debug, Subcommand)]
pub(crate) enum SnapshotCommand {
    /// Save the registry (agents, jobs, evaluations, tokens) to FILE, as the leader has it
    /// once a quorum confirms it leads. The file is written beside FILE and renamed into
    /// place: an interrupted save leaves no partial file.
    Save {
        /// Where to write the snapshot.
        file: PathBuf,
    },
    /// Replace the registry with the snapshot in FILE. The file is checked (format, length,
    /// SHA-256) first; a damaged one changes nothing.
    Restore {
        /// The snapshot to restore.
        file: PathBuf,
    },
}

/// Runs `command` against the cluster.
pub(crate) async fn run(
    connection: &Connection,
    command: OperatorCommand,
    format: Format,
) -> anyhow::Result<()> {
    let command = match command {
        OperatorCommand::Snapshot { command } => command,
        OperatorCommand::Raft { command } => {
            return crate::raft_command::run(connection, command, format).await;
        }
    };
    match command {
        SnapshotCommand::Save { file } => save(connection, &file, format).await,
        SnapshotCommand::Restore { file } => restore(connection, &file, format).await,
    }
}

async fn save(connection: &Connection, file: &Path, format: Format) -> anyhow::Result<()> {
    let snapshot = connection
        .at_leader(
            |mut client| async move { client.snapshot_save(pb::SnapshotSaveRequest {}).await },
        )
        .await?;
    let (header, state) = snapshot_file::decode(&snapshot.data)
        .context("the master sent a snapshot that does not verify")?;
    let temporary = file.with_extension("partial");
    muster_security::certs::write_private(&temporary, &snapshot.data)
        .with_context(|| format!("cannot write {}", temporary.display()))?;
    std::fs::rename(&temporary, file)
        .with_context(|| format!("cannot move the snapshot into {}", file.display()))?;
    if format.is_json() {
        return print_json(&serde_json::json!({
            "file": file.display().to_string(),
            "index": header.index,
            "term": header.term,
            "sha256": header.sha256,
            "jobs": state.jobs.len(),
            "agents": state.agents.len(),
            "evaluations": state.evals.len(),
            "tokens": state.tokens.len(),
        }));
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "Saved the registry at index {} (term {}) to {}: {} jobs, {} agents, {} evaluations, {} tokens; SHA-256 {}",
        header.index,
        header.term,
        file.display(),
        state.jobs.len(),
        state.agents.len(),
        state.evals.len(),
        state.tokens.len(),
        header.sha256
    )?;
    Ok(())
}

async fn restore(connection: &Connection, file: &Path, format: Format) -> anyhow::Result<()> {
    let data = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    // Refused here already if damaged: nothing is sent.
    let (header, _) = snapshot_file::decode(&data)
        .with_context(|| format!("{} cannot be restored", file.display()))?;
    let data = bytes::Bytes::from(data);
    let reply = connection
        .at_leader(|mut client| {
            let data = data.clone();
            async move { client.snapshot_restore(pb::RegistrySnapshot { data }).await }
        })
        .await?;
    if format.is_json() {
        return print_json(&serde_json::json!({
            "restored_from_index": header.index,
            "index": reply.index,
        }));
    }
    writeln!(
        std::io::stdout().lock(),
        "Restored the registry saved at index {} (now at index {}); agents re-register and jobs converge to the snapshot",
        header.index,
        reply.index
    )?;
    Ok(())
}
