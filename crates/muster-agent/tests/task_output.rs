//! Task output on a real agent: `stdout` and `stderr` rotated copy-truncate style past the
//! configured size, and read back by a master's `ReadTaskOutput` ask across rotations. The
//! tasks are real child processes writing numbered lines (`%08d\n`, 9 bytes each), so the
//! content read back can be checked line by line.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use muster_actor::{Context, Node, Pid, Process, Reply, System, Upid};
use muster_agent::{AgentConfig, AgentHandle};
use muster_proto::cluster::{
    Framework, ReadTaskOutput, RegisterAgent, RegistrationReply, ReregisterAgent, RunTask,
    RunTaskReply, TaskOutputChunk, TaskStatusUpdate, registration_reply,
};
use muster_proto::model::{Task, TaskState};
use muster_security::Role;
use muster_security::testing::TestPki;

/// How long any one expected event may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// How often a test looks again at what it waits for.
const POLL: Duration = Duration::from_millis(10);

/// The rotation size of these tests' agents: 256 KiB.
const CAP: u64 = 256 * 1024;

/// Rotated files kept per stream.
const FILES: u32 = 3;

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

    /// Reads a task's whole kept stdout from offset 0, `limit` bytes at a time, following
    /// `next_offset` until a read returns nothing. Returns the first answer's `first_offset`,
    /// the bytes, and the offset after them.
    async fn read_all(
        &self,
        agent: &Upid,
        task_id: &str,
        limit: u32,
    ) -> anyhow::Result<(u64, Vec<u8>, u64)> {
        let first = self.read(agent, task_id, false, 0, limit).await?;
        ensure!(first.error.is_empty(), "read failed: {}", first.error);
        ensure!(
            first.offset == first.first_offset,
            "a read from 0 starts at the first kept byte: {first:?}"
        );
        let mut data = first.data.to_vec();
        let mut next = first.next_offset;
        loop {
            let chunk = self.read(agent, task_id, false, next, limit).await?;
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

/// An agent on its own system and node.
struct AgentNode {
    system: System,
    node: Node,
    handle: AgentHandle,
}

impl AgentNode {
    async fn start(config: AgentConfig) -> anyhow::Result<Self> {
        let system = System::new();
        let node = Node::bind(
            &system,
            "127.0.0.1:0",
            TestPki::shared().security(Role::Agent, "agent-1"),
        )
        .await?;
        let handle = muster_agent::start(&node, config).await?;
        tokio::time::timeout(PATIENCE, handle.registered())
            .await
            .context("the agent did not register in time")??;
        Ok(AgentNode {
            system,
            node,
            handle,
        })
    }

    fn upid(&self) -> &Upid {
        self.handle.upid()
    }

    /// Waits until task `id` has ended, in state FINISHED.
    async fn finished(&self, id: &str) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + PATIENCE;
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
                "task {id} did not finish in time; running: {:?}",
                snapshot.tasks
            );
        }
    }

    async fn stop(&self) {
        self.handle.stop().await;
        self.node.shutdown();
        self.system.shutdown().await;
    }
}

/// An agent config for `master` with the tests' rotation settings, checking every 20 ms.
fn config(master: &MasterNode, data_dir: &Path) -> AgentConfig {
    let mut config = AgentConfig::new(vec![master.address()], data_dir);
    config.hostname = "test-host".into();
    config.resources = (4.0, 8192);
    config.registration_backoff_initial = Duration::from_millis(20);
    config.registration_backoff_max = Duration::from_millis(200);
    config.ask_timeout = Duration::from_secs(2);
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

/// The stream's files in `dir`, oldest first: the rotated ones (`stdout.<k>`, highest k first)
/// and then the live one. Fails on leftovers of a rotation.
fn stream_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut rotated = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        ensure!(
            name != "stdout.rotating" && name != "stdout.base.tmp",
            "a rotation left {name} behind"
        );
        if let Some(number) = name
            .strip_prefix("stdout.")
            .and_then(|k| k.parse::<u32>().ok())
        {
            rotated.push(number);
        }
    }
    rotated.sort_unstable_by(|a, b| b.cmp(a));
    let mut files: Vec<PathBuf> = rotated
        .into_iter()
        .map(|k| dir.join(format!("stdout.{k}")))
        .collect();
    files.push(dir.join("stdout"));
    Ok(files)
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

/// A task that writes 3 MB as fast as a shell loop can, one line per write: its files stay
/// bounded while it writes, and what a master reads from offset 0 is what the files keep, from
/// the first kept byte on, in order. Lines may be lost only where one file ends and the next
/// begins: the copy-truncate window (shown, not hidden: the lost lines are counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_writing_past_the_cap_keeps_bounded_files_and_reads_cross_them() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let master = MasterNode::start().await?;
    let agent = AgentNode::start(config(&master, dir.path())).await?;
    let lines = 340_000; // 3.06 MB
    let script = format!("n=0; end={lines}; {WRITE_LINES}");
    master.run_task(agent.upid(), "writer", &script).await?;
    agent.finished("writer").await?;

    // The files: at most FILES rotated ones, each within the cap plus what the task wrote in
    // about one check interval. A shell loop writes a few MB/s here, some 80 KB in one 20 ms
    // interval; the slack is a whole cap more, for checks that run late on a loaded machine.
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
            bytes.len() as u64 <= 2 * CAP,
            "{} holds {} bytes, past the cap and one interval's writing",
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

    // Between files, lines go forward; the ones missing there are the copy-truncate loss.
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
    eprintln!(
        "kept lines {:?}..={:?}; lost {lost} lines at rotation boundaries",
        all.first(),
        all.last()
    );

    // Read back from 0 in pieces that cross the files' boundaries: it starts at the first
    // kept byte, past the start, and is exactly the files' bytes, oldest first.
    let (first_offset, data, end) = master.read_all(agent.upid(), "writer", 100_000).await?;
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
    // In offsets, the kept bytes are the tail of the stream: the bytes before them, the ones
    // rotated away, were written too (lines lost at boundaries are not counted).
    let first_line = all.first().copied().unwrap_or_default();
    ensure!(
        first_offset <= first_line * LINE as u64,
        "first offset {first_offset} past where line {first_line} was written"
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

/// Lines in one burst: the file passes the cap with the burst's last line only, so no rotation
/// can start while the task is writing a burst.
const BURST: usize = (CAP as usize / LINE) + 1;

/// A task that writes bursts just past the cap and waits until the agent has rotated each before
/// the next: no write falls in a copy-truncate window, so nothing is lost, and reading from 0
/// returns exactly the tail of what it wrote: the last FILES bursts and the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_from_zero_returns_exactly_the_tail_of_what_the_task_wrote() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = MasterNode::start().await?;
    let agent = AgentNode::start(config(&master, dir.path())).await?;
    let bursts = 11; // 2.9 MB
    let rest = 1_000;
    let script = format!(
        "n=0; b=0; while [ $b -lt {bursts} ]; do end=$((n+{BURST})); {WRITE_LINES}; \
         while [ -s stdout ]; do sleep 0.01; done; b=$((b+1)); done; \
         end=$((n+{rest})); {WRITE_LINES}"
    );
    master.run_task(agent.upid(), "bursts", &script).await?;
    agent.finished("bursts").await?;

    let written = numbered(0, bursts * BURST + rest);
    let burst_bytes = (BURST * LINE) as u64;
    let (first_offset, data, end) = master.read_all(agent.upid(), "bursts", 0).await?;
    ensure!(
        first_offset == (bursts as u64 - u64::from(FILES)) * burst_bytes,
        "the first {} bursts were rotated away, not {first_offset} bytes",
        bursts as u32 - FILES
    );
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
    // Each rotated file is one burst, the live file the rest.
    let task_dir = dir.path().join("tasks/bursts");
    for k in 1..=FILES {
        let len = std::fs::metadata(task_dir.join(format!("stdout.{k}")))?.len();
        ensure!(len == burst_bytes, "stdout.{k} holds {len} bytes");
    }
    ensure!(!task_dir.join(format!("stdout.{}", FILES + 1)).exists());
    ensure!(std::fs::metadata(task_dir.join("stdout"))?.len() == (rest * LINE) as u64);

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
    let agent = AgentNode::start(config(&master, &data_dir)).await?;

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

/// An agent restarted while its task runs rotates that task's output too, and reads keep their
/// offsets across the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_rotates_the_output_of_the_tasks_it_takes_back() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = MasterNode::start().await?;
    // The first run never gets to check, and leaves its task running when it stops.
    let mut first_config = config(&master, dir.path());
    first_config.task_output_check_interval = Duration::from_secs(3600);
    first_config.stop_tasks_on_exit = false;
    let first = AgentNode::start(first_config).await?;
    let lines = BURST + 100;
    let script = format!("n=0; end={lines}; {WRITE_LINES}; exec sleep 60");
    master.run_task(first.upid(), "kept", &script).await?;
    let stdout = dir.path().join("tasks/kept/stdout");
    let written = (lines * LINE) as u64;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut poll = tokio::time::interval(POLL);
    loop {
        poll.tick().await;
        let len = std::fs::metadata(&stdout).map_or(0, |meta| meta.len());
        if len == written {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the task wrote {len} of {written} bytes in time"
        );
    }
    ensure!(!dir.path().join("tasks/kept/stdout.1").exists());
    first.stop().await;

    let second = AgentNode::start(config(&master, dir.path())).await?;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let chunk = loop {
        poll.tick().await;
        let chunk = master.read(second.upid(), "kept", false, 0, 0).await?;
        ensure!(chunk.error.is_empty(), "{}", chunk.error);
        if std::fs::metadata(&stdout)?.len() == 0 {
            break chunk;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the re-attached task's output was not rotated in time"
        );
    };
    ensure!(
        chunk.task_running,
        "the task still runs under the second agent"
    );
    let rotated = std::fs::read(dir.path().join("tasks/kept/stdout.1"))?;
    ensure!(
        rotated == numbered(0, lines),
        "stdout.1 holds what the task wrote"
    );
    // Nothing was rotated away yet: all of it reads from 0, now out of stdout.1.
    let again = master.read(second.upid(), "kept", false, 0, 0).await?;
    ensure!(
        (again.first_offset, again.offset, again.next_offset) == (0, 0, written),
        "{:?}",
        (again.first_offset, again.offset, again.next_offset)
    );
    ensure!(again.data[..] == numbered(0, lines)[..]);

    second.stop().await;
    master.shutdown().await;
    Ok(())
}
