//! Task output on a real agent: `stdout` and `stderr` kept within their bounds by the task's
//! executor as the bytes arrive (each file at most the configured size, a stream at most
//! (files kept + 1) × that), while the agent runs and while it does not, and read back by a
//! master's `ReadTaskOutput` ask across rotations. The tasks are real child processes writing
//! numbered lines (`%08d\n`, 9 bytes each, or `seq`'s), so the content read back can be
//! checked byte by byte.
//!
//! The cases that only read (the tail from offset zero, refused ids, the two streams) are in
//! `reads`.

use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use muster_actor::{Context, Pid, Process, Reply, System, Upid};
use muster_agent::AgentConfig;
use muster_proto::cluster::{
    Framework, ReadTaskOutput, RegisterAgent, RegistrationReply, ReregisterAgent, RunTask,
    RunTaskReply, TaskOutputChunk, TaskStatusUpdate, registration_reply,
};
use muster_proto::model::{Task, TaskState};
use muster_security::Role;
use muster_security::testing::TestPki;
use muster_transport::Node;

use crate::common::{AgentNode, agent_config};

mod reads;

/// How long any one expected event may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// How often a test looks again at what it waits for.
const POLL: Duration = Duration::from_millis(10);

/// The rotation size of these tests' agents: 256 KiB, the most one output file holds.
const CAP: u64 = 256 * 1024;

/// Rotated files kept per stream.
const FILES: u32 = 3;

/// The most a stream of these tests' agents keeps on disk: (FILES + 1) × CAP, 1 MiB.
const STREAM_CAP: u64 = (FILES as u64 + 1) * CAP;

/// The most the executor copies at once (its buffer): a rotated file is rotated when the next
/// chunk would not fit, so it holds more than CAP minus this.
const CHUNK: u64 = 64 * 1024;

/// One numbered line: `%08d\n`.
const LINE: usize = 9;

/// A stand-in master: admits the agent (anew, or back under its id) and ignores the rest.
struct FakeMaster;

enum FakeMsg {
    Register(Reply<RegistrationReply>),
    /// A re-registration, by the agent's id.
    Reregister(String, Reply<RegistrationReply>),
    Status,
}

impl Process for FakeMaster {
    type Message = FakeMsg;

    async fn handle(&mut self, msg: FakeMsg, _ctx: &mut Context<Self>) {
        let admit = |id: String| RegistrationReply {
            result: Some(registration_reply::Result::AgentId(id)),
            ..RegistrationReply::default()
        };
        match msg {
            FakeMsg::Register(reply) => reply.send(admit("agent-out".into())),
            FakeMsg::Reregister(agent_id, reply) => reply.send(admit(agent_id)),
            FakeMsg::Status => {}
        }
    }
}

/// The stand-in master on its own system and node, with what it asks agents.
struct MasterNode {
    system: System,
    node: Node,
    _pid: Pid<FakeMaster>,
}

impl MasterNode {
    async fn start() -> anyhow::Result<Self> {
        let system = System::new();
        let node = Node::bind(
            &system,
            "127.0.0.1:0",
            TestPki::shared().security(Role::Master, "master-1"),
        )
        .await?;
        let pid = system.spawn(FakeMaster);
        node.register("master", &pid)?
            .install_ask::<RegisterAgent, RegistrationReply>(|_, reply| FakeMsg::Register(reply))
            .install_ask::<ReregisterAgent, RegistrationReply>(|request, reply| {
                FakeMsg::Reregister(request.agent_id, reply)
            })
            .install::<TaskStatusUpdate>(|_| FakeMsg::Status);
        Ok(MasterNode {
            system,
            node,
            _pid: pid,
        })
    }

    fn address(&self) -> String {
        self.node.address().to_owned()
    }

    async fn run_task(&self, agent: &Upid, id: &str, script: &str) -> anyhow::Result<()> {
        let request = RunTask {
            framework: Some(Framework {
                id: "fw-1".into(),
                name: "output tests".into(),
            }),
            task: Some(Task {
                id: id.into(),
                name: id.into(),
                command: "sh".into(),
                args: vec!["-c".into(), script.into()],
                ..Task::default()
            }),
            term: 0,
        };
        let reply = self
            .node
            .remote(agent.clone())
            .ask_timeout::<RunTask, RunTaskReply>(PATIENCE, request)
            .await?;
        ensure!(reply.error.is_empty(), "task {id} refused: {}", reply.error);
        Ok(())
    }

    async fn read(
        &self,
        agent: &Upid,
        task_id: &str,
        stderr: bool,
        offset: u64,
        limit: u32,
    ) -> anyhow::Result<TaskOutputChunk> {
        let request = ReadTaskOutput {
            task_id: task_id.into(),
            stderr,
            offset,
            limit,
        };
        Ok(self
            .node
            .remote(agent.clone())
            .ask_timeout::<ReadTaskOutput, TaskOutputChunk>(PATIENCE, request)
            .await?)
    }

    /// Reads a task's whole kept stdout (or stderr) from offset 0, `limit` bytes at a time,
    /// following `next_offset` until a read returns nothing. Returns the first answer's
    /// `first_offset`, the bytes, and the offset after them.
    async fn read_all(
        &self,
        agent: &Upid,
        task_id: &str,
        stderr: bool,
        limit: u32,
    ) -> anyhow::Result<(u64, Vec<u8>, u64)> {
        let first = self.read(agent, task_id, stderr, 0, limit).await?;
        ensure!(first.error.is_empty(), "read failed: {}", first.error);
        ensure!(
            first.offset == first.first_offset,
            "a read from 0 starts at the first kept byte: {first:?}"
        );
        let mut data = first.data.to_vec();
        let mut next = first.next_offset;
        loop {
            let chunk = self.read(agent, task_id, stderr, next, limit).await?;
            ensure!(chunk.error.is_empty(), "read failed: {}", chunk.error);
            ensure!(
                chunk.offset == next && chunk.next_offset == next + chunk.data.len() as u64,
                "a read from {next} answered {:?}",
                (chunk.offset, chunk.next_offset, chunk.data.len())
            );
            if chunk.data.is_empty() {
                return Ok((first.first_offset, data, next));
            }
            data.extend_from_slice(&chunk.data);
            next = chunk.next_offset;
        }
    }

    async fn shutdown(&self) {
        self.node.shutdown();
        self.system.shutdown().await;
    }
}

/// What these tests wait for of an agent.
impl AgentNode {
    /// Waits until task `id` has ended, in state FINISHED.
    async fn finished(&self, id: &str) -> anyhow::Result<()> {
        self.finished_within(id, PATIENCE).await
    }

    /// Waits until task `id` has ended, in state FINISHED, for at most `patience`.
    async fn finished_within(&self, id: &str, patience: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + patience;
        let mut poll = tokio::time::interval(POLL);
        loop {
            poll.tick().await;
            let snapshot = self.handle.snapshot().await?;
            if let Some(task) = snapshot.completed_tasks.iter().find(|t| t.id == id) {
                ensure!(
                    task.state == TaskState::Finished as i32,
                    "task {id} ended so: {task:?}"
                );
                return Ok(());
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "task {id} did not finish within {patience:?}; running: {:?}",
                snapshot.tasks
            );
        }
    }
}

/// [`agent_config`] for `master` with the tests' rotation settings, checking every 20 ms.
fn config(master: &MasterNode, data_dir: &Path) -> AgentConfig {
    let mut config = agent_config(&[master.address()], data_dir);
    config.task_output_max_bytes = CAP;
    config.task_output_files = FILES;
    config.task_output_check_interval = Duration::from_millis(20);
    config
}

/// Lines `from..to`, numbered, as the tasks write them.
fn numbered(from: usize, to: usize) -> Vec<u8> {
    (from..to)
        .flat_map(|n| format!("{n:08}\n").into_bytes())
        .collect()
}

/// A shell fragment writing lines `$n` up to (not including) `$end`, one write per line.
const WRITE_LINES: &str = "while [ $n -lt $end ]; do printf '%08d\\n' $n; n=$((n+1)); done";

/// The stdout files in `dir`, oldest first: the rotated ones (`stdout.<k>`, highest k first)
/// and then the live one. Fails on leftovers of a rotation.
fn stream_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    files_of(dir, "stdout")
}

/// `stream`'s files in `dir` (`stream` is `stdout` or `stderr`), as [`stream_files`] says.
fn files_of(dir: &Path, stream: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut rotated = Vec::new();
    let prefix = format!("{stream}.");
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        ensure!(
            name != format!("{stream}.rotating") && name != format!("{stream}.base.tmp"),
            "a rotation left {name} behind"
        );
        if let Some(number) = name
            .strip_prefix(&prefix)
            .and_then(|k| k.parse::<u32>().ok())
        {
            rotated.push(number);
        }
    }
    rotated.sort_unstable_by(|a, b| b.cmp(a));
    let mut files: Vec<PathBuf> = rotated
        .into_iter()
        .map(|k| dir.join(format!("{stream}.{k}")))
        .collect();
    files.push(dir.join(stream));
    Ok(files)
}

/// The bytes `stream`'s files in `dir` take together, the live one and the rotated ones. The
/// executor may be rotating them meanwhile: a file renamed away between the listing and its
/// size counts as empty, and every file holds at most CAP whenever it is looked at.
fn bytes_on_disk(dir: &Path, stream: &str) -> anyhow::Result<u64> {
    let prefix = format!("{stream}.");
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = name == stream
            || name
                .strip_prefix(&prefix)
                .is_some_and(|k| k.parse::<u32>().is_ok());
        if !ours {
            continue;
        }
        match std::fs::metadata(entry.path()) {
            Ok(meta) => total += meta.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(anyhow::Error::new(e).context(name)),
        }
    }
    Ok(total)
}

/// Holds a shared `flock` on task `id`'s output lock in the agent's `data_dir`, as an agent's
/// read does, until the file returned is dropped: the task's executor does not rotate its
/// output meanwhile, so what is looked at is not renamed under the look.
fn read_lock(data_dir: &Path, id: &str) -> anyhow::Result<File> {
    let path = data_dir.join(format!("meta/tasks/{id}.output-lock"));
    let file = File::open(&path).with_context(|| path.display().to_string())?;
    loop {
        // SAFETY: flock takes a descriptor (open for as long as `file` is) and an operation.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH) } == 0 {
            return Ok(file);
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(anyhow::Error::new(error).context(path.display().to_string()));
        }
    }
}

/// Where `stream`'s live file in `dir` starts, from its `.base` file (0 before any rotation).
fn base_of(dir: &Path, stream: &str) -> anyhow::Result<u64> {
    match std::fs::read_to_string(dir.join(format!("{stream}.base"))) {
        Ok(text) => Ok(text.trim().parse()?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// What `seq 1 <last>` writes.
fn seq(last: u64) -> Vec<u8> {
    (1..=last)
        .flat_map(|n| format!("{n}\n").into_bytes())
        .collect()
}

/// The numbers of a file's lines. Each file starts at a line: the task writes one line per
/// write, and a truncation falls between two writes. Only a rotated file may end in part of a
/// line, if its copy caught a write half done (the rest of it then went with the truncation).
fn lines_of(bytes: &[u8], rotated: bool) -> anyhow::Result<Vec<u64>> {
    let whole = match bytes.iter().rposition(|b| *b == b'\n') {
        Some(last) => &bytes[..=last],
        None => &bytes[..0],
    };
    ensure!(
        rotated || whole.len() == bytes.len(),
        "the live file ends in part of a line"
    );
    whole
        .split(|b| *b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| {
            ensure!(line.len() == LINE - 1, "not a numbered line: {line:?}");
            Ok(std::str::from_utf8(line)?.parse::<u64>()?)
        })
        .collect()
}

/// A task that writes 3 MB as fast as a shell loop can, one line per write: no file of its
/// passes the cap, and what a master reads from offset 0 is what the files keep, from the first
/// kept byte on, in order. No line is lost, at the files' boundaries either: the executor is the
/// files' only writer, and each of its chunks (all the pipe held) is whole lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_writing_past_the_cap_keeps_bounded_files_and_reads_cross_them() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let master = MasterNode::start().await?;
    let agent = AgentNode::start_registered(config(&master, dir.path())).await?;
    let lines = 340_000; // 3.06 MB
    let script = format!("n=0; end={lines}; {WRITE_LINES}");
    master.run_task(agent.upid(), "writer", &script).await?;
    agent.finished("writer").await?;

    // The files: FILES rotated ones, each within the cap, however fast the task wrote.
    let task_dir = dir.path().join("tasks/writer");
    let files = stream_files(&task_dir)?;
    ensure!(
        files.len() == FILES as usize + 1,
        "3 MB over a 256 KiB cap fills all {FILES} rotated files: {files:?}"
    );
    let mut kept = Vec::new();
    let mut numbers = Vec::new();
    for (index, path) in files.iter().enumerate() {
        let bytes = std::fs::read(path)?;
        ensure!(
            bytes.len() as u64 <= CAP,
            "{} holds {} bytes, past the cap",
            path.display(),
            bytes.len()
        );
        let rotated = index + 1 < files.len();
        let in_file = lines_of(&bytes, rotated)?;
        // Within a file, no line is lost: every number follows the one before.
        for pair in in_file.windows(2) {
            ensure!(
                pair[1] == pair[0] + 1,
                "{} skips from line {} to {}",
                path.display(),
                pair[0],
                pair[1]
            );
        }
        numbers.push(in_file);
        kept.extend_from_slice(&bytes);
    }
    let base: u64 = std::fs::read_to_string(task_dir.join("stdout.base"))?
        .trim()
        .parse()?;
    let rotated_bytes: u64 = files[..files.len() - 1]
        .iter()
        .map(|path| std::fs::metadata(path).map(|meta| meta.len()))
        .sum::<std::io::Result<u64>>()?;

    // Between files, lines go on: none is lost at a rotation.
    let mut lost = 0;
    for pair in numbers.windows(2) {
        let (Some(last), Some(next)) = (pair[0].last(), pair[1].first()) else {
            continue;
        };
        ensure!(next > last, "line {next} follows line {last}");
        lost += next - last - 1;
    }
    let all: Vec<u64> = numbers.concat();
    ensure!(
        all.last() == Some(&(lines as u64 - 1)),
        "the last line written is kept: {:?}",
        all.last()
    );
    ensure!(lost == 0, "{lost} lines lost at rotation boundaries");

    // Read back from 0 in pieces that cross the files' boundaries: it starts at the first
    // kept byte, past the start, and is exactly the files' bytes, oldest first.
    let (first_offset, data, end) = master
        .read_all(agent.upid(), "writer", false, 100_000)
        .await?;
    ensure!(
        first_offset > 0,
        "3 MB over a 256 KiB cap rotated some away"
    );
    ensure!(
        first_offset == base - rotated_bytes,
        "first offset {first_offset}, base {base}, rotated bytes {rotated_bytes}"
    );
    ensure!(end == base + std::fs::metadata(task_dir.join("stdout"))?.len());
    ensure!(data == kept, "what was read is not what the files keep");
    // In offsets, the kept bytes are the tail of the stream: exactly where the first kept line
    // was written, nothing being lost.
    let first_line = all.first().copied().unwrap_or_default();
    ensure!(
        first_offset == first_line * LINE as u64,
        "first offset {first_offset}, not where line {first_line} was written"
    );

    // A read past the end answers at the end, with nothing; one with a limit, no more.
    let past = master
        .read(agent.upid(), "writer", false, end + 1_000, 0)
        .await?;
    ensure!(past.error.is_empty() && past.data.is_empty(), "{past:?}");
    ensure!((past.offset, past.next_offset) == (end, end), "{past:?}");
    let small = master
        .read(agent.upid(), "writer", false, first_offset, 10)
        .await?;
    ensure!(
        small.data.len() == 10 && small.data[..] == kept[..10],
        "{small:?}"
    );
    ensure!(!small.task_running, "the writer has finished");

    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

/// A task writing ten times its streams' cap, on both streams at once, as fast as `seq` can:
/// once it has ended, each stream takes at most its cap on disk (the bound is the cap itself:
/// the executor rotates before a chunk would take a file past its size, so not even one chunk
/// more), and reading it back still works and returns its newest bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_writing_ten_times_its_cap_keeps_at_most_the_cap_on_disk() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = MasterNode::start().await?;
    let mut config = config(&master, dir.path());
    let max_bytes = 64 * 1024;
    let files = 1;
    config.task_output_max_bytes = max_bytes;
    config.task_output_files = files;
    let cap = (u64::from(files) + 1) * max_bytes; // 128 KiB
    let agent = AgentNode::start_registered(config).await?;
    let last = 210_000;
    let written = seq(last);
    ensure!(
        written.len() as u64 >= 10 * cap,
        "seq 1 {last} writes too little"
    );
    master
        .run_task(
            agent.upid(),
            "flood",
            &format!("seq 1 {last} & seq 1 {last} >&2; wait"),
        )
        .await?;
    agent.finished("flood").await?;

    let task_dir = dir.path().join("tasks/flood");
    for (stream, stderr) in [("stdout", false), ("stderr", true)] {
        for path in files_of(&task_dir, stream)? {
            let len = std::fs::metadata(&path)?.len();
            ensure!(
                len <= max_bytes,
                "{} holds {len} bytes, past {max_bytes}",
                path.display()
            );
        }
        let on_disk = bytes_on_disk(&task_dir, stream)?;
        ensure!(
            on_disk <= cap,
            "{stream} takes {on_disk} bytes on disk, past its cap of {cap} (one chunk more \
             would be {})",
            cap + CHUNK
        );
        // And more than one file's worth: a rotation happens only when the next chunk would
        // not fit in the live file, and that chunk starts the new live file, so the newest
        // rotated file and the live file together hold more than `max_bytes`.
        ensure!(
            on_disk > max_bytes,
            "{stream} keeps only {on_disk} bytes: too little of its cap of {cap}"
        );
        let (first_offset, data, end) = master.read_all(agent.upid(), "flood", stderr, 0).await?;
        ensure!(
            end == written.len() as u64,
            "{stream} ends at {end}, not {}",
            written.len()
        );
        ensure!(
            data.len() as u64 == on_disk && first_offset == end - on_disk,
            "{stream}: read {} bytes from {first_offset}, {on_disk} on disk",
            data.len()
        );
        ensure!(
            written.ends_with(&data),
            "{stream}: what was read is not the newest of what was written"
        );
        ensure!(data.ends_with(format!("\n{last}\n").as_bytes()));
    }

    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

/// A task keeps writing while its agent is down: its executor goes on copying its output (no
/// broken pipe), keeping it within its bounds, and the next run of the agent reads it back
/// with its offsets, while the task still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_keeps_writing_bounded_output_while_its_agent_is_down() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = MasterNode::start().await?;
    // The first run leaves its task running when it stops.
    let mut first_config = config(&master, dir.path());
    first_config.stop_tasks_on_exit = false;
    let first = AgentNode::start_registered(first_config).await?;
    // 1 000 lines, then (once the test says, the agent being down) 120 000 lines more: 1 MB,
    // past STREAM_CAP, so the oldest are rotated away while no agent runs.
    let (before, after) = (1_000, 120_000);
    let lines = before + after;
    let script = format!(
        "n=0; end={before}; {WRITE_LINES}; while [ ! -e go ]; do sleep 0.01; done; \
         end={lines}; {WRITE_LINES}; exec sleep 60"
    );
    master.run_task(first.upid(), "kept", &script).await?;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut poll = tokio::time::interval(POLL);
    loop {
        poll.tick().await;
        let chunk = master.read(first.upid(), "kept", false, 0, 0).await?;
        ensure!(chunk.error.is_empty(), "{}", chunk.error);
        if chunk.data[..] == numbered(0, before)[..] {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the task's first lines were not read in time: {} bytes",
            chunk.data.len()
        );
    }
    first.stop().await;

    // Now the task writes the rest, with no agent.
    let task_dir = dir.path().join("tasks/kept");
    std::fs::write(task_dir.join("go"), "")?;
    let written = (lines * LINE) as u64;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        poll.tick().await;
        // Looked at as a read does, holding the task's output lock: not in the middle of a
        // rotation, whose renames a listing could see a name twice through.
        let held = read_lock(dir.path(), "kept")?;
        let live = std::fs::metadata(task_dir.join("stdout")).map_or(0, |meta| meta.len());
        let end = base_of(&task_dir, "stdout")? + live;
        let on_disk = bytes_on_disk(&task_dir, "stdout")?;
        drop(held);
        ensure!(
            on_disk <= STREAM_CAP,
            "{on_disk} bytes on disk, past the cap of {STREAM_CAP}"
        );
        if end == written {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "with no agent, the task's output reached {end} of {written} bytes in time"
        );
    }

    let second = AgentNode::start_registered(config(&master, dir.path())).await?;
    let (first_offset, data, end) = master.read_all(second.upid(), "kept", false, 0).await?;
    ensure!(end == written, "{end} != {written}");
    ensure!(first_offset > 0, "some was rotated away");
    let all = numbered(0, lines);
    ensure!(
        data[..] == all[usize::try_from(first_offset)?..],
        "what was read is not the tail of what was written"
    );
    let chunk = master.read(second.upid(), "kept", false, end, 0).await?;
    ensure!(
        chunk.task_running,
        "the task still runs under the second agent"
    );

    second.stop().await;
    master.shutdown().await;
    Ok(())
}

/// A task that ends leaving a child behind that holds its stdout and stderr open (`sleep 30
/// &`): its executor does not wait for the pipes to close (only for the task), so the task is
/// reported finished promptly, with its output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_leaves_a_child_holding_its_output_is_finished_promptly() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let master = MasterNode::start().await?;
    let agent = AgentNode::start_registered(config(&master, dir.path())).await?;
    master
        .run_task(agent.upid(), "leaver", "sleep 30 & echo hi")
        .await?;
    // Well before the child's 30 s.
    agent
        .finished_within("leaver", Duration::from_secs(15))
        .await?;
    let out = master.read(agent.upid(), "leaver", false, 0, 0).await?;
    ensure!(out.error.is_empty(), "{}", out.error);
    ensure!(&out.data[..] == b"hi\n" && !out.task_running, "{out:?}");

    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

/// A task that closes its stdout early and writes to its stderr afterwards: the closed pipe is
/// not the end of the task's output, its stderr is still captured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_closes_its_stdout_early_still_has_its_stderr_captured() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = MasterNode::start().await?;
    let agent = AgentNode::start_registered(config(&master, dir.path())).await?;
    master
        .run_task(agent.upid(), "closer", "exec 1>&-; sleep 0.2; echo x >&2")
        .await?;
    agent.finished("closer").await?;
    let err = master.read(agent.upid(), "closer", true, 0, 0).await?;
    ensure!(err.error.is_empty(), "{}", err.error);
    ensure!(
        &err.data[..] == b"x\n" && (err.offset, err.next_offset) == (0, 2),
        "{err:?}"
    );
    let out = master.read(agent.upid(), "closer", false, 0, 0).await?;
    ensure!(out.error.is_empty(), "{}", out.error);
    ensure!(out.data.is_empty() && out.next_offset == 0, "{out:?}");

    agent.stop().await;
    master.shutdown().await;
    Ok(())
}
