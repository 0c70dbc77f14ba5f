//! The registry on disk holds job environments and token hashes: a master's data directory is
//! its user's alone (0700), and so is every file in it (0600), even where an operator made the
//! directory open beforehand.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use muster_master::testing;

use crate::common::{master_config, start_master};

/// Every entry under `dir`, at any depth, with its mode.
fn modes_under(dir: &Path) -> anyhow::Result<Vec<(PathBuf, u32, bool)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let mode = entry.metadata()?.mode() & 0o777;
        found.push((entry.path(), mode, kind.is_dir()));
        if kind.is_dir() {
            found.extend(modes_under(&entry.path())?);
        }
    }
    Ok(found)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_masters_data_dir_and_its_files_are_its_own() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let data = master_config(dir.path()).data_dir;
    std::fs::create_dir_all(&data)?;
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755))?;
    let master = start_master(dir.path()).await?;
    testing::bootstrap(master.address()).await?;
    let mut job = muster_proto::model::Job {
        name: "vault".into(),
        ..muster_proto::model::Job::default()
    };
    job.groups.push(muster_proto::model::TaskGroup {
        name: "main".into(),
        count: 1,
        resources: Some(muster_proto::model::Resources {
            cpus: 0.1,
            mem_mb: 16,
        }),
        command: "sleep".into(),
        env: [("API_KEY".to_owned(), "hunter2".to_owned())].into(),
        ..muster_proto::model::TaskGroup::default()
    });
    testing::submit(&master, job).await?;

    assert_eq!(std::fs::metadata(&data)?.mode() & 0o777, 0o700);
    let entries = modes_under(&data)?;
    assert!(!entries.is_empty(), "nothing in {}", data.display());
    for (path, mode, is_dir) in entries {
        let private = if is_dir { 0o700 } else { 0o600 };
        assert_eq!(
            mode & 0o077,
            0,
            "{} is {mode:o}, not {private:o}",
            path.display()
        );
    }
    master.shutdown().await;
    Ok(())
}
