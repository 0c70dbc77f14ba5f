//! What the agent keeps on disk is its own: the data directory lets others pass to their own
//! task's directory but not list it, `meta/` (ids, terms, checkpoints holding environments)
//! and every file in it are the agent's alone, `tasks/` lets a task pass to its own directory
//! but not list the others, and each task's directory and output are its task's alone.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

use super::*;

/// The permission bits of `path` (not followed if a link).
pub(super) fn mode(path: &Path) -> anyhow::Result<u32> {
    Ok(std::fs::symlink_metadata(path)
        .with_context(|| format!("{}", path.display()))?
        .mode()
        & 0o777)
}

/// Every regular file under `dir`, at any depth.
fn files_under(dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            found.extend(files_under(&entry.path())?);
        } else {
            found.push(entry.path());
        }
    }
    Ok(found)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_dir_is_closed_and_each_tasks_directory_is_its_own() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("agent");
    // Made open beforehand, as an operator's mkdir under umask 022 would: tightened at start.
    std::fs::create_dir_all(data.join("meta"))?;
    for open in [&data, &data.join("meta")] {
        std::fs::set_permissions(open, std::fs::Permissions::from_mode(0o755))?;
    }
    let mut master = MasterNode::start(Answer::Admit("agent-m".into())).await?;
    let agent = AgentNode::start(config(&[master.address()], &data)).await?;
    master.next_register().await?;
    let id = agent.registered_with(&master.upid()?).await?;
    let mut secretive = shell_task("secretive", "echo $$ > pid; exec sleep 60");
    if let Some(task) = secretive.task.as_mut() {
        task.env.insert("SECRET".into(), "hunter2".into());
    }
    assert_eq!(master.run_task(agent.upid(), secretive).await?.error, "");
    master.expect_started(&id, "secretive").await?;

    assert_eq!(mode(&data)?, 0o711, "the data directory");
    assert_eq!(mode(&data.join("meta"))?, 0o700, "meta/");
    let kept = files_under(&data.join("meta"))?;
    assert!(
        kept.iter()
            .any(|f| f.to_string_lossy().contains("secretive")),
        "no checkpoint of the task in {kept:?}"
    );
    for file in &kept {
        assert_eq!(mode(file)?, 0o600, "{}", file.display());
    }
    assert_eq!(mode(&data.join("tasks"))?, 0o711, "tasks/");
    let task_dir = data.join("tasks/secretive");
    assert_eq!(mode(&task_dir)?, 0o700, "the task's directory");
    for output in ["stdout", "stderr"] {
        assert_eq!(mode(&task_dir.join(output))?, 0o600, "{output}");
    }
    // Its owner is the task's user, whoever that is here (the agent's own when not root).
    let pid = pid_in(&task_dir.join("pid")).await?;
    assert_eq!(
        std::fs::metadata(&task_dir)?.uid(),
        uid_of(pid)?,
        "the task's directory belongs to the task's user"
    );

    agent.stop().await;
    master.shutdown().await;
    Ok(())
}
