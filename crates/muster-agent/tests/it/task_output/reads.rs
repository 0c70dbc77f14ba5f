//! Reads of a task's output through the master's `ReadTaskOutput` ask: from offset zero, the
//! exact tail of what the task wrote; unknown and escaping task ids refused; stdout and stderr
//! told apart.

use super::*;

/// A task whose writes are not lines (`seq` through stdio's 4 KiB buffer, so the executor's
/// chunks and the files' boundaries fall anywhere in a line): reading from 0 returns exactly
/// the tail of what it wrote, the rotated files are full to within one chunk, and the stream
/// keeps at most its cap on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_from_zero_returns_exactly_the_tail_of_what_the_task_wrote() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = MasterNode::start().await?;
    let agent = AgentNode::start_registered(config(&master, dir.path())).await?;
    let last = 400_000; // 2.7 MB
    master
        .run_task(agent.upid(), "seq", &format!("seq 1 {last}"))
        .await?;
    agent.finished("seq").await?;

    let written = seq(last);
    let (first_offset, data, end) = master.read_all(agent.upid(), "seq", false, 0).await?;
    ensure!(end == written.len() as u64, "{end} != {}", written.len());
    let tail = written
        .get(usize::try_from(first_offset)?..)
        .context("first offset past the end")?;
    if data != tail {
        let at = data.iter().zip(tail).position(|(a, b)| a != b);
        bail!(
            "read {} bytes, expected the last {}; first difference at {at:?}",
            data.len(),
            tail.len()
        );
    }
    // FILES rotated files, each full to within one chunk; the live file the rest.
    let task_dir = dir.path().join("tasks/seq");
    for k in 1..=FILES {
        let len = std::fs::metadata(task_dir.join(format!("stdout.{k}")))?.len();
        ensure!(
            len <= CAP && len > CAP - CHUNK,
            "stdout.{k} holds {len} bytes"
        );
    }
    ensure!(!task_dir.join(format!("stdout.{}", FILES + 1)).exists());
    let on_disk = bytes_on_disk(&task_dir, "stdout")?;
    ensure!(
        on_disk == data.len() as u64 && on_disk <= STREAM_CAP,
        "{on_disk} bytes on disk, {} read, cap {STREAM_CAP}",
        data.len()
    );
    ensure!(
        first_offset == end - on_disk,
        "first offset {first_offset}, end {end}, {on_disk} bytes on disk"
    );

    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

/// Reads name an unknown task, refuse ids that could leave the data directory, and tell a
/// running task's stdout from its stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_refuse_unknown_and_escaping_ids_and_tell_the_streams_apart() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // A file outside the data directory that a `..` id would reach.
    std::fs::create_dir_all(dir.path().join("outside"))?;
    std::fs::write(dir.path().join("outside/stdout"), "secret\n")?;
    let data_dir = dir.path().join("agent");
    let master = MasterNode::start().await?;
    let agent = AgentNode::start_registered(config(&master, &data_dir)).await?;

    let unknown = master
        .read(agent.upid(), "no-such-task", false, 0, 0)
        .await?;
    ensure!(
        unknown.error.contains("\"no-such-task\"") && unknown.data.is_empty(),
        "{unknown:?}"
    );
    for id in ["../../outside", "..", ".", "a/b", ""] {
        let refused = master.read(agent.upid(), id, false, 0, 0).await?;
        ensure!(
            !refused.error.is_empty() && refused.data.is_empty(),
            "id {id:?} read: {refused:?}"
        );
        ensure!(
            id.is_empty() || refused.error.contains(&format!("{id:?}")),
            "the error names the id {id:?}: {}",
            refused.error
        );
    }

    let script = "echo hello; echo oops >&2; exec sleep 60";
    master.run_task(agent.upid(), "talker", script).await?;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut poll = tokio::time::interval(POLL);
    let out = loop {
        poll.tick().await;
        let out = master.read(agent.upid(), "talker", false, 0, 0).await?;
        ensure!(out.error.is_empty(), "{}", out.error);
        if !out.data.is_empty() {
            break out;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the task wrote nothing in time"
        );
    };
    ensure!(&out.data[..] == b"hello\n", "{out:?}");
    ensure!(out.task_running && (out.first_offset, out.next_offset) == (0, 6));
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let err = loop {
        poll.tick().await;
        let err = master.read(agent.upid(), "talker", true, 0, 0).await?;
        if !err.data.is_empty() || tokio::time::Instant::now() > deadline {
            break err;
        }
    };
    ensure!(&err.data[..] == b"oops\n" && err.task_running, "{err:?}");

    agent.stop().await;
    master.shutdown().await;
    Ok(())
}
