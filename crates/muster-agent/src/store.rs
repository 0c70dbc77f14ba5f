//! The agent's files under its data directory:
//!
//! - `agent_id`: the id the master gave it, written atomically (temporary file, fsync, rename,
//!   fsync of the directory) so that a restarted agent re-registers instead of registering anew;
//! - `meta/tasks/<task id>.pb`: one checkpoint per task it knows (a prost-encoded
//!   [`RunTask`] holding the framework and the task with its latest state), so that a restarted
//!   agent can tell the master what became of them;
//! - `meta/tasks/<task id>.{executor,pid,status,output-lock}`: what a restarted agent needs to
//!   find the task's executor again, what the executor records (see `executor`), and the lock
//!   between the executor's rotations of the task's output and the agent's reads (see
//!   `output`);
//! - `tasks/<task id>/`: each task's working directory (0700), with its `stdout` and `stderr`
//!   (0600), owned by the task's user while it runs (a task of a dynamic uid's goes back to
//!   root once it has ended); `tasks/` itself is 0711, so a task cannot list the others' ids;
//! - `meta/term`: the highest leader term the agent obeys; `meta/alive`: when it was last
//!   alive.
//!
//! The agent process does this file work through `blocking`: off the runtime's threads on a
//! multi-threaded runtime, inline on a current-thread one (see `blocking`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use muster_proto::cluster::{Framework, RunTask};
use muster_proto::model::Task;
use prost::Message as _;

use muster_actor::Upid;

use crate::AgentError;
use crate::atomic_file::write_atomically;

/// Name of the file holding the agent id, in the data directory.
pub const AGENT_ID_FILE: &str = "agent_id";

const PROBE_FILE: &str = ".muster-agent-probe";

/// The mode of the data directory and of `tasks/` in it: others may pass through them to
/// their own task's directory, never list them.
pub const DATA_DIR_MODE: u32 = 0o711;

/// The mode of `meta/` (ids, terms, task checkpoints holding environments) and of each task's
/// working directory: its owner's alone.
pub const PRIVATE_DIR_MODE: u32 = 0o700;

/// Creates the data directory if needed (0711, and `meta/` in it 0700, tightened if they were
/// looser) and checks that the agent can write in it, by writing and removing a probe file.
///
/// # Errors
/// [`AgentError::DataDir`] naming the directory and what the operating system said.
pub fn check_data_dir(path: &Path) -> Result<(), AgentError> {
    use std::os::unix::fs::PermissionsExt as _;
    let fail = |source| AgentError::DataDir {
        path: path.to_owned(),
        source,
    };
    fs::create_dir_all(path).map_err(fail)?;
    fs::set_permissions(path, fs::Permissions::from_mode(DATA_DIR_MODE)).map_err(fail)?;
    let meta = path.join("meta");
    fs::create_dir_all(&meta).map_err(fail)?;
    fs::set_permissions(&meta, fs::Permissions::from_mode(PRIVATE_DIR_MODE)).map_err(fail)?;
    let probe = path.join(PROBE_FILE);
    fs::write(&probe, b"probe").map_err(fail)?;
    fs::remove_file(&probe).map_err(fail)?;
    Ok(())
}

/// The stored agent id, if the agent has one.
///
/// # Errors
/// [`AgentError::StateFile`] if the file exists but cannot be read,
/// [`AgentError::InvalidStoredId`] if it is empty or not UTF-8.
pub fn read_agent_id(data_dir: &Path) -> Result<Option<String>, AgentError> {
    let path = data_dir.join(AGENT_ID_FILE);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(AgentError::StateFile { path, source }),
    };
    let text = String::from_utf8(bytes).map_err(|_| AgentError::InvalidStoredId {
        path: path.clone(),
        reason: "not UTF-8".into(),
    })?;
    let id = text.trim();
    if id.is_empty() {
        return Err(AgentError::InvalidStoredId {
            path,
            reason: "the file is empty".into(),
        });
    }
    Ok(Some(id.to_owned()))
}

/// Stores the agent id: writes a temporary file, syncs it, renames it over `agent_id` and syncs
/// the directory, so that a crash leaves either the old file or the new one.
///
/// # Errors
/// [`AgentError::StateFile`] naming the file that could not be written.
pub fn write_agent_id(data_dir: &Path, id: &str) -> Result<(), AgentError> {
    let path = data_dir.join(AGENT_ID_FILE);
    write_atomically(&path, format!("{id}\n").as_bytes(), true)
        .map_err(|source| AgentError::StateFile { path, source })
}

/// Forgets the stored agent id (the master does not know it): the agent registers anew.
///
/// # Errors
/// [`AgentError::StateFile`] naming the file that could not be removed.
pub fn remove_agent_id(data_dir: &Path) -> Result<(), AgentError> {
    let path = data_dir.join(AGENT_ID_FILE);
    match fs::remove_file(&path) {
        Err(source) if source.kind() != io::ErrorKind::NotFound => {
            Err(AgentError::StateFile { path, source })
        }
        _ => Ok(()),
    }
}

/// Name of the file the running agent rewrites now and then, under `meta/`: the wall-clock
/// time in it (milliseconds since the Unix epoch, from [`muster_model::clock`]) says, when the
/// agent starts again, how long it was down.
const ALIVE_FILE: &str = "alive";

/// Records that the agent is alive now (rewrites `meta/alive`).
pub(crate) fn touch_alive(data_dir: &Path) -> io::Result<()> {
    let dir = data_dir.join("meta");
    fs::create_dir_all(&dir)?;
    let now = muster_model::clock::unix_ms();
    write_atomically(&dir.join(ALIVE_FILE), format!("{now}\n").as_bytes(), false)
}

/// When the agent was last alive (its last [`touch_alive`]), in milliseconds since the Unix
/// epoch, if it ever recorded it. A file of an older agent, with no time in it, counts from
/// its modification time.
pub(crate) fn last_alive_ms(data_dir: &Path) -> io::Result<Option<u64>> {
    let path = data_dir.join("meta").join(ALIVE_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if let Ok(ms) = text.trim().parse::<u64>() {
        return Ok(Some(ms));
    }
    let modified = fs::metadata(&path)?.modified()?;
    Ok(Some(
        modified.duration_since(UNIX_EPOCH).map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        }),
    ))
}

/// Name of the file holding the highest leader term the agent has obeyed, under `meta/`.
const TERM_FILE: &str = "term";

/// Name of the file holding the agent's registration number, under `meta/`.
const REGISTRATION_FILE: &str = "registration";

/// The highest leader term the agent has obeyed (0 if none).
///
/// # Errors
/// [`AgentError::StateFile`] if the file exists but cannot be read or holds no number: the
/// agent must not start forgetting a term it promised to hold.
pub(crate) fn read_term(data_dir: &Path) -> Result<u64, AgentError> {
    read_number(data_dir, TERM_FILE, "not a term number")
}

/// Records, durably, that the agent follows leader term `term` from now on.
pub(crate) fn write_term(data_dir: &Path, term: u64) -> Result<(), AgentError> {
    write_number(data_dir, TERM_FILE, term)
}

/// The agent's last registration number (0 if it never registered): launches stamped with an
/// earlier one are refused.
///
/// # Errors
/// [`AgentError::StateFile`] if the file exists but cannot be read or holds no number: the
/// agent must not start taking launches meant for an earlier registration of itself.
pub(crate) fn read_registration(data_dir: &Path) -> Result<u64, AgentError> {
    read_number(data_dir, REGISTRATION_FILE, "not a registration number")
}

/// Records, durably, the agent's registration number `registration`.
pub(crate) fn write_registration(data_dir: &Path, registration: u64) -> Result<(), AgentError> {
    write_number(data_dir, REGISTRATION_FILE, registration)
}

/// Name of the file holding the masters the leader last named, under `meta/`: one
/// `master@host:port` a line.
const MASTERS_FILE: &str = "masters";

/// The masters the leader last named ([`write_learned_masters`]), none if it never named
/// any. A file that cannot be read, or a line that is no address, is skipped with a warning:
/// the configured masters still stand.
pub(crate) fn read_learned_masters(data_dir: &Path) -> Vec<Upid> {
    let path = data_dir.join("meta").join(MASTERS_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Vec::new(),
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "cannot read the masters last named; using the configured ones");
            return Vec::new();
        }
    };
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .filter_map(|line| match line.parse::<Upid>() {
            Ok(upid) => Some(upid),
            Err(error) => {
                tracing::warn!(path = %path.display(), line, %error, "skipping a line that names no master");
                None
            }
        })
        .collect()
}

/// Records, durably, the masters the leader named, for the agent's next start.
pub(crate) fn write_learned_masters(data_dir: &Path, masters: &[Upid]) -> Result<(), AgentError> {
    let dir = data_dir.join("meta");
    let path = dir.join(MASTERS_FILE);
    let text: String = masters.iter().map(|m| format!("{m}\n")).collect();
    fs::create_dir_all(&dir)
        .and_then(|()| write_atomically(&path, text.as_bytes(), true))
        .map_err(|source| AgentError::StateFile { path, source })
}

/// The number in `meta/<file>` (0 if there is none).
fn read_number(data_dir: &Path, file: &str, malformed: &str) -> Result<u64, AgentError> {
    let path = data_dir.join("meta").join(file);
    match fs::read_to_string(&path) {
        Ok(text) => text.trim().parse().map_err(|_| AgentError::StateFile {
            path,
            source: io::Error::new(io::ErrorKind::InvalidData, malformed.to_owned()),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(source) => Err(AgentError::StateFile { path, source }),
    }
}

/// Writes `number` to `meta/<file>`, durably.
fn write_number(data_dir: &Path, file: &str, number: u64) -> Result<(), AgentError> {
    let dir = data_dir.join("meta");
    let path = dir.join(file);
    fs::create_dir_all(&dir)
        .and_then(|()| write_atomically(&path, format!("{number}\n").as_bytes(), true))
        .map_err(|source| AgentError::StateFile { path, source })
}

/// Runs blocking file work off the runtime's threads; inline on a current-thread runtime,
/// whose one thread would wait for it anyway, and where a deterministic simulation cannot
/// have work finish on another thread at a time of the operating system's choosing (the work
/// is small: a checkpoint, an id, a term).
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, AgentError> + Send + 'static,
) -> Result<T, AgentError> {
    if tokio::runtime::Handle::current().runtime_flavor()
        == tokio::runtime::RuntimeFlavor::CurrentThread
    {
        return work();
    }
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        Err(AgentError::StateFile {
            path: PathBuf::new(),
            source: std::io::Error::other(format!("file work did not finish: {e}")),
        })
    })
}

/// The directory of task checkpoints.
pub(crate) fn checkpoint_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("meta").join("tasks")
}

/// The working directory of task `task_id` (which [`check_task_id`] accepted).
pub(crate) fn task_dir(data_dir: &Path, task_id: &str) -> PathBuf {
    data_dir.join("tasks").join(task_id)
}

/// Why a task id cannot be used (see [`check_task_id`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TaskIdError {
    /// The id is empty.
    #[error("the task has an empty id")]
    Empty,
    /// The id cannot name a directory: this one.
    #[error("task id {0:?} cannot name a directory (no '/', NUL, '.' or '..', at most 200 bytes)")]
    NoDirectory(String),
}

/// A task id must name a directory: non-empty, no `/`, no NUL, not `.` or `..`, at most 200
/// bytes.
pub(crate) fn check_task_id(task_id: &str) -> Result<(), TaskIdError> {
    if task_id.is_empty() {
        return Err(TaskIdError::Empty);
    }
    if task_id == "." || task_id == ".." || task_id.contains(['/', '\0']) || task_id.len() > 200 {
        return Err(TaskIdError::NoDirectory(task_id.to_owned()));
    }
    Ok(())
}

/// Records `task` of `framework` (its latest state) under the data directory.
pub(crate) fn write_checkpoint(
    data_dir: &Path,
    framework: &Framework,
    task: &Task,
) -> io::Result<()> {
    let dir = checkpoint_dir(data_dir);
    fs::create_dir_all(&dir)?;
    let record = RunTask {
        framework: Some(framework.clone()),
        task: Some(task.clone()),
        term: 0,
    };
    write_atomically(
        &dir.join(format!("{}.pb", task.id)),
        &record.encode_to_vec(),
        false,
    )
}

/// Forgets the checkpoint of task `task_id` (dropped from the completed history), with its
/// executor's files.
pub(crate) fn remove_checkpoint(data_dir: &Path, task_id: &str) -> io::Result<()> {
    executor_files(data_dir, task_id).remove()?;
    match fs::remove_file(checkpoint_dir(data_dir).join(format!("{task_id}.pb"))) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The files of task `task_id`'s executor, beside its checkpoint.
pub(crate) fn executor_files(data_dir: &Path, task_id: &str) -> crate::executor::Files {
    crate::executor::Files::new(&checkpoint_dir(data_dir), task_id)
}

/// A task read back from its checkpoint.
#[derive(Debug)]
pub(crate) struct Checkpoint {
    pub(crate) written: SystemTime,
    pub(crate) framework: Framework,
    pub(crate) task: Task,
}

/// Every readable task checkpoint, oldest first. A checkpoint that cannot be read or decoded
/// is skipped with a warning: one bad file must not keep the agent from starting.
pub(crate) fn read_checkpoints(data_dir: &Path) -> Result<Vec<Checkpoint>, AgentError> {
    let dir = checkpoint_dir(data_dir);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(AgentError::StateFile { path: dir, source }),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| AgentError::StateFile {
            path: dir.clone(),
            source,
        })?;
        let path = entry.path();
        if path.extension().is_none_or(|ext| ext != "pb") {
            continue;
        }
        let read = fs::read(&path).and_then(|bytes| {
            let written = entry.metadata()?.modified()?;
            RunTask::decode(bytes.as_slice())
                .map(|record| (written, record))
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
        });
        match read {
            Ok((
                written,
                RunTask {
                    framework: Some(framework),
                    task: Some(task),
                    ..
                },
            )) if !task.id.is_empty() => found.push(Checkpoint {
                written,
                framework,
                task,
            }),
            Ok(_) => {
                tracing::warn!(path = %path.display(), "skipping a task checkpoint without a task or framework");
            }
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "skipping an unreadable task checkpoint");
            }
        }
    }
    found.sort_by(|a, b| {
        a.written
            .cmp(&b.written)
            .then_with(|| a.task.id.cmp(&b.task.id))
    });
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_masters_the_leader_named_round_trip_and_a_bad_line_is_skipped() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        assert!(
            read_learned_masters(dir.path()).is_empty(),
            "none named yet"
        );
        let named: Vec<Upid> = vec!["master@10.0.0.1:5050".parse()?, "master@h2:5051".parse()?];
        write_learned_masters(dir.path(), &named)?;
        assert_eq!(read_learned_masters(dir.path()), named);
        let file = dir.path().join("meta").join(MASTERS_FILE);
        std::fs::write(&file, "master@10.0.0.1:5050\nnot an address\n\n")?;
        assert_eq!(read_learned_masters(dir.path()), named[..1].to_vec());
        Ok(())
    }

    #[test]
    fn agent_id_round_trips_and_leaves_no_temporary_file() -> Result<(), AgentError> {
        let dir = tempfile::tempdir().map_err(|source| AgentError::DataDir {
            path: "tempdir".into(),
            source,
        })?;
        assert_eq!(read_agent_id(dir.path())?, None);
        write_agent_id(dir.path(), "a-1")?;
        assert_eq!(read_agent_id(dir.path())?.as_deref(), Some("a-1"));
        write_agent_id(dir.path(), "a-2")?;
        assert_eq!(read_agent_id(dir.path())?.as_deref(), Some("a-2"));
        assert!(!dir.path().join("agent_id.tmp").exists());
        Ok(())
    }

    #[test]
    fn an_empty_id_file_is_an_error_naming_the_file() {
        let Ok(dir) = tempfile::tempdir() else {
            panic!("no tempdir")
        };
        let path = dir.path().join(AGENT_ID_FILE);
        assert!(fs::write(&path, "\n").is_ok());
        let err = read_agent_id(dir.path())
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("agent_id") && err.contains("empty"), "{err}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: std::env::var("MUSTER_FUZZ_CASES")
                .ok()
                .and_then(|cases| cases.parse().ok())
                .unwrap_or(500),
            failure_persistence: None,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// Whatever bytes a checkpoint, an executor record, the term or the agent id file
        /// holds, reading them answers (a skipped checkpoint, an error), never a panic.
        #[test]
        fn the_agent_s_files_decode_anything_without_panicking(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)
        ) {
            let dir = tempfile::tempdir().map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
            let checkpoints = checkpoint_dir(dir.path());
            fs::create_dir_all(&checkpoints).map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
            for name in ["t.pb", "t.executor", "t.status", "t.pid"] {
                fs::write(checkpoints.join(name), &bytes).map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
            }
            fs::write(dir.path().join("meta").join("term"), &bytes).map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
            fs::write(dir.path().join(AGENT_ID_FILE), &bytes).map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
            let _ = read_checkpoints(dir.path());
            let files = executor_files(dir.path(), "t");
            let _ = crate::executor::Record::read(&files);
            let _ = files.read_status();
            let _ = files.read_task_pid();
            let _ = read_term(dir.path());
            let _ = read_agent_id(dir.path());
        }
    }

    #[test]
    fn task_ids_that_cannot_name_a_directory_are_refused() {
        assert!(check_task_id("web-1").is_ok());
        for bad in ["", ".", "..", "a/b", "a\0b"] {
            assert!(check_task_id(bad).is_err(), "{bad:?}");
        }
    }
}
