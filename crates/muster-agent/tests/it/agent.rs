//! The agent against fake masters: processes registered as `master` on their own nodes in this
//! test process, answering registrations as the test tells them and reporting what they got.
//! This file holds the fake masters and the agents they face; the cases are by area:
//! `registration`, `launches`, `processes`, `recovery`, `simulated`, `file_modes` and
//! `task_uids`.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use muster_actor::{Context, Pid, Process, Reply, System, Upid};
use muster_agent::{AgentConfig, AgentSnapshot, AgentStatus};
use muster_proto::cluster::{
    Framework, KillTask, KillTaskReply, LaunchTasks, LeaderAnnouncement, Ping, Pong, RegisterAgent,
    RegistrationReply, ReregisterAgent, RunTask, RunTaskReply, TaskStatusUpdate,
    registration_reply,
};
use muster_proto::model::{Label, NotLeader, Task, TaskState};
use muster_security::Role;
use muster_security::testing::TestPki;
use muster_transport::Node;
use tokio::sync::mpsc;

use crate::common::{AgentNode, agent_config};

mod file_modes;
mod launches;
mod processes;
mod recovery;
mod registration;
mod simulated;
mod task_uids;

/// How long any one expected event may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(60);

/// How a fake master answers registrations.
#[derive(Debug, Clone)]
enum Answer {
    /// Admit a new agent under this id; take re-registering agents back under their own id.
    Admit(String),
    /// Say "not the leader", naming this leader (empty: unknown).
    NotLeader(String),
    /// Refuse, with this reason.
    Refuse(String),
    /// Take re-registering agents back, telling them to kill these tasks (given up as lost);
    /// admit new ones under the id.
    AdmitKilling(String, Vec<String>),
    /// Answer re-registrations that the id is unknown; admit new agents under this id.
    Forgotten(String),
    /// Admit as `Admit` does, as the leader of this term.
    AdmitInTerm(String, u64),
}

impl Answer {
    fn reply(&self, reregistering: Option<&str>) -> RegistrationReply {
        let mut kill_tasks = Vec::new();
        let mut term = 0;
        let result = match (self, reregistering) {
            (Answer::AdmitInTerm(id, in_term), reregistering) => {
                term = *in_term;
                registration_reply::Result::AgentId(reregistering.unwrap_or(id).to_owned())
            }
            (Answer::Admit(_), Some(id)) => registration_reply::Result::AgentId(id.to_owned()),
            (Answer::Admit(id) | Answer::Forgotten(id), None) => {
                registration_reply::Result::AgentId(id.clone())
            }
            (Answer::AdmitKilling(_, kill), Some(id)) => {
                kill_tasks.clone_from(kill);
                registration_reply::Result::AgentId(id.to_owned())
            }
            (Answer::AdmitKilling(id, _), None) => registration_reply::Result::AgentId(id.clone()),
            (Answer::Forgotten(_), Some(id)) => {
                registration_reply::Result::UnknownAgent(format!("agent id {id:?} is unknown"))
            }
            (Answer::NotLeader(leader), _) => registration_reply::Result::NotLeader(NotLeader {
                leader: leader.clone(),
            }),
            (Answer::Refuse(reason), _) => registration_reply::Result::Refused(reason.clone()),
        };
        RegistrationReply {
            result: Some(result),
            kill_tasks,
            term,
            reads_tasks_sharing_labels: false,
        }
    }
}

/// What a fake master received.
#[derive(Debug)]
enum Got {
    Register(RegisterAgent),
    Reregister(ReregisterAgent),
}

/// A task status update a fake master received, with how many registrations it had admitted
/// by then (so a test can tell whether an update came before or after a re-registration).
#[derive(Debug)]
struct Update {
    admitted_before: usize,
    update: TaskStatusUpdate,
}

struct FakeMaster {
    answer: Arc<Mutex<Answer>>,
    /// Whether its answers say it reads running tasks grouped by their labels.
    reads_grouped: Arc<AtomicBool>,
    got: mpsc::UnboundedSender<Got>,
    admitted: usize,
    updates: mpsc::UnboundedSender<Update>,
}

enum FakeMsg {
    Register(RegisterAgent, Reply<RegistrationReply>),
    Reregister(ReregisterAgent, Reply<RegistrationReply>),
    Status(TaskStatusUpdate),
}

impl Process for FakeMaster {
    type Message = FakeMsg;

    async fn handle(&mut self, msg: FakeMsg, _ctx: &mut Context<Self>) {
        let answer = self
            .answer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if matches!(msg, FakeMsg::Register(..) | FakeMsg::Reregister(..))
            && matches!(
                answer,
                Answer::Admit(_) | Answer::AdmitKilling(..) | Answer::AdmitInTerm(..)
            )
        {
            self.admitted += 1;
        }
        match msg {
            FakeMsg::Register(request, reply) => {
                reply.send(answer.reply(None));
                let _ = self.got.send(Got::Register(request));
            }
            FakeMsg::Reregister(request, reply) => {
                let mut answer = answer.reply(Some(&request.agent_id));
                answer.reads_tasks_sharing_labels = self.reads_grouped.load(Ordering::Relaxed);
                reply.send(answer);
                let _ = self.got.send(Got::Reregister(request));
            }
            FakeMsg::Status(update) => {
                let _ = self.updates.send(Update {
                    admitted_before: self.admitted,
                    update,
                });
            }
        }
    }
}

/// A fake master on its own system and node.
struct MasterNode {
    system: System,
    node: Node,
    answer: Arc<Mutex<Answer>>,
    reads_grouped: Arc<AtomicBool>,
    got: mpsc::UnboundedReceiver<Got>,
    updates: mpsc::UnboundedReceiver<Update>,
    _pid: Pid<FakeMaster>,
}

impl MasterNode {
    async fn start(answer: Answer) -> anyhow::Result<Self> {
        Self::start_on("127.0.0.1:0", answer).await
    }

    /// A fake master listening on `address`.
    async fn start_on(address: &str, answer: Answer) -> anyhow::Result<Self> {
        let system = System::new();
        // An address a stopped node just gave up may take a moment to be free again.
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let node = loop {
            let security = TestPki::shared().security(Role::Master, "master-1");
            match Node::bind(&system, address, security).await {
                Ok(node) => break node,
                Err(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(e.into()),
            }
        };
        let (tx, got) = mpsc::unbounded_channel();
        let (updates_tx, updates) = mpsc::unbounded_channel();
        let answer = Arc::new(Mutex::new(answer));
        let reads_grouped = Arc::new(AtomicBool::new(false));
        let pid = system.spawn(FakeMaster {
            answer: Arc::clone(&answer),
            reads_grouped: Arc::clone(&reads_grouped),
            got: tx,
            admitted: 0,
            updates: updates_tx,
        });
        node.register("master", &pid)?
            .install_ask::<RegisterAgent, RegistrationReply>(FakeMsg::Register)
            .install_ask::<ReregisterAgent, RegistrationReply>(FakeMsg::Reregister)
            .install::<TaskStatusUpdate>(FakeMsg::Status);
        Ok(MasterNode {
            system,
            node,
            answer,
            reads_grouped,
            got,
            updates,
            _pid: pid,
        })
    }

    fn address(&self) -> String {
        self.node.address().to_owned()
    }

    fn upid(&self) -> anyhow::Result<Upid> {
        Ok(Upid::new("master", self.node.address())?)
    }

    /// Makes its admissions say that it reads running tasks grouped by their labels.
    fn read_grouped_tasks(&self) {
        self.reads_grouped.store(true, Ordering::Relaxed);
    }

    /// Tells `agent` that this master now leads, in `term`.
    fn announce(&self, agent: &Upid, term: u64) -> anyhow::Result<()> {
        let announcement = LeaderAnnouncement {
            leader: self.upid()?.to_string(),
            term,
            reads_tasks_sharing_labels: self.reads_grouped.load(Ordering::Relaxed),
        };
        self.node.remote(agent.clone()).tell(announcement)?;
        Ok(())
    }

    fn set_answer(&self, answer: Answer) {
        *self.answer.lock().unwrap_or_else(|p| p.into_inner()) = answer;
    }

    /// The next registration this master receives.
    async fn next(&mut self) -> anyhow::Result<Got> {
        tokio::time::timeout(PATIENCE, self.got.recv())
            .await
            .with_context(|| format!("master {} got no registration in time", self.address()))?
            .context("fake master gone")
    }

    async fn next_register(&mut self) -> anyhow::Result<RegisterAgent> {
        match self.next().await? {
            Got::Register(request) => Ok(request),
            other => bail!("expected RegisterAgent, got {other:?}"),
        }
    }

    async fn next_reregister(&mut self) -> anyhow::Result<ReregisterAgent> {
        match self.next().await? {
            Got::Reregister(request) => Ok(request),
            other => bail!("expected ReregisterAgent, got {other:?}"),
        }
    }

    /// Nothing received so far (without waiting).
    fn got_nothing(&mut self) -> bool {
        self.got.try_recv().is_err()
    }

    async fn run_task(&self, agent: &Upid, request: RunTask) -> anyhow::Result<RunTaskReply> {
        Ok(self
            .node
            .remote(agent.clone())
            .ask_timeout::<RunTask, RunTaskReply>(PATIENCE, request)
            .await?)
    }

    async fn kill_task(&self, agent: &Upid, task_id: &str) -> anyhow::Result<KillTaskReply> {
        let request = KillTask {
            task_id: task_id.into(),
            term: 0,
        };
        Ok(self
            .node
            .remote(agent.clone())
            .ask_timeout::<KillTask, KillTaskReply>(PATIENCE, request)
            .await?)
    }

    /// The next task status update this master receives.
    async fn next_update(&mut self) -> anyhow::Result<Update> {
        tokio::time::timeout(PATIENCE, self.updates.recv())
            .await
            .with_context(|| {
                format!(
                    "master {} got no task status update in time",
                    self.address()
                )
            })?
            .context("fake master gone")
    }

    /// The next task status update, which must be for `task_id` in `state`; returns its task.
    async fn expect_update(
        &mut self,
        agent_id: &str,
        task_id: &str,
        state: TaskState,
    ) -> anyhow::Result<Task> {
        let Update { update, .. } = self.next_update().await?;
        let task = update.task.context("TaskStatusUpdate without a task")?;
        ensure!(
            update.agent_id == agent_id && task.id == task_id && task.state == state as i32,
            "expected {task_id} {state:?} from {agent_id}, got {:?} {:?} from {}",
            task.id,
            TaskState::try_from(task.state),
            update.agent_id
        );
        Ok(task)
    }

    /// The next two updates: `task_id` STARTING, then RUNNING; returns the running task.
    async fn expect_started(&mut self, agent_id: &str, task_id: &str) -> anyhow::Result<Task> {
        self.expect_update(agent_id, task_id, TaskState::Starting)
            .await?;
        self.expect_update(agent_id, task_id, TaskState::Running)
            .await
    }

    async fn ping(&self, agent: &Upid) -> anyhow::Result<Pong> {
        let ping = Ping {
            master: self.upid()?.to_string(),
        };
        Ok(self
            .node
            .remote(agent.clone())
            .ask_timeout::<Ping, Pong>(PATIENCE, ping)
            .await?)
    }

    async fn shutdown(&self) {
        self.node.shutdown();
        self.system.shutdown().await;
    }
}

/// What these tests wait for of an agent.
impl AgentNode {
    /// Waits until the agent is registered with `master`.
    async fn registered_with(&self, master: &Upid) -> anyhow::Result<String> {
        let mut status = self.handle.status();
        let seen = tokio::time::timeout(
            PATIENCE,
            status.wait_for(|s| {
                matches!(s, AgentStatus::Registered { master: m, .. } if m == master)
                    || *s == AgentStatus::Stopped
            }),
        )
        .await
        .with_context(|| format!("agent not registered with {master} in time"))?
        .context("agent gone")?;
        match &*seen {
            AgentStatus::Registered { agent_id, .. } => Ok(agent_id.clone()),
            other => bail!("agent ended up {other:?}"),
        }
    }

    /// Polls the agent's state until `check` holds.
    async fn wait_until(
        &self,
        what: &str,
        check: impl Fn(&AgentSnapshot) -> bool,
    ) -> anyhow::Result<AgentSnapshot> {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let snapshot = self.handle.snapshot().await?;
            if check(&snapshot) {
                return Ok(snapshot);
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; agent state: {snapshot:#?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// [`agent_config`], in rack `r1` (the attribute `rack=r1`).
fn config(masters: &[String], data_dir: &Path) -> AgentConfig {
    let mut config = agent_config(masters, data_dir);
    config.attributes.insert("rack".into(), "r1".into());
    config
}

fn framework() -> Framework {
    Framework {
        id: "fw-1".into(),
        name: "test framework".into(),
    }
}

fn shell_task(id: &str, script: &str) -> RunTask {
    RunTask {
        framework: Some(framework()),
        task: Some(Task {
            id: id.into(),
            name: id.into(),
            command: "sh".into(),
            args: vec!["-c".into(), script.into()],
            ..Task::default()
        }),
        term: 0,
    }
}

fn find<'a>(tasks: &'a [Task], id: &str) -> Option<&'a Task> {
    tasks.iter().find(|t| t.id == id)
}

fn state_of(tasks: &[Task], id: &str) -> Option<TaskState> {
    find(tasks, id).and_then(|t| TaskState::try_from(t.state).ok())
}

/// True once process `pid` has ended (gone, or a zombie nobody reaped yet).
fn has_ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

/// Reads a pid a task wrote to a file in its working directory, once it is there.
async fn pid_in(path: &Path) -> anyhow::Result<u32> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(pid) = text.trim().parse()
        {
            return Ok(pid);
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no pid in {} in time",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn ends(pid: u32, what: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !has_ended(pid) {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{what} (pid {pid}) still runs"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// The isolation the agent reported when it registered.
fn isolation_of(register: &RegisterAgent) -> String {
    register
        .info
        .as_ref()
        .and_then(|info| info.attributes.get(muster_agent::ISOLATION_ATTRIBUTE))
        .cloned()
        .unwrap_or_default()
}

/// A config whose agent leaves its tasks running when it stops, as the binary does.
fn keeping_config(masters: &[String], data_dir: &Path) -> AgentConfig {
    let mut config = config(masters, data_dir);
    config.stop_tasks_on_exit = false;
    config
}

/// Waits until the task's update on the master is `state`, skipping earlier ones for it.
async fn await_state(
    master: &mut MasterNode,
    task_id: &str,
    state: TaskState,
) -> anyhow::Result<Task> {
    loop {
        let Update { update, .. } = master.next_update().await?;
        if let Some(task) = update.task
            && task.id == task_id
            && task.state == state as i32
        {
            return Ok(task);
        }
    }
}

/// The real uid of process `pid`.
fn uid_of(pid: u32) -> anyhow::Result<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .and_then(|uid| uid.parse().ok())
        .context("no Uid line")
}
