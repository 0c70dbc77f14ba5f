//! The agent against fake masters: processes registered as `master` on their own nodes in this
//! test process, answering registrations as the test tells them and reporting what they got.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use muster_actor::{Context, Pid, Process, Reply, System, Upid};
use muster_agent::{AgentConfig, AgentHandle, AgentSnapshot, AgentStatus};
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
        Ok(AgentNode {
            system,
            node,
            handle,
        })
    }

    fn upid(&self) -> &Upid {
        self.handle.upid()
    }

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

    async fn stop(&self) {
        self.handle.stop().await;
        self.node.shutdown();
        self.system.shutdown().await;
    }
}

/// A config with short timings for tests.
fn config(masters: &[String], data_dir: &Path) -> AgentConfig {
    let mut config = AgentConfig::new(masters.to_vec(), data_dir);
    config.hostname = "test-host".into();
    config.resources = (4.0, 8192);
    config.attributes.insert("rack".into(), "r1".into());
    config.registration_backoff_initial = Duration::from_millis(20);
    config.registration_backoff_max = Duration::from_millis(200);
    config.ask_timeout = Duration::from_secs(2);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_registration_stores_the_id_on_disk() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-1".into())).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;

    let request = master.next_register().await?;
    let info = request.info.context("RegisterAgent without info")?;
    assert_eq!(info.address, agent.upid().to_string());
    assert_eq!(info.hostname, "test-host");
    assert_eq!(info.attributes.get("rack").map(String::as_str), Some("r1"));
    let resources = info.resources.context("no resources")?;
    assert_eq!((resources.cpus, resources.mem_mb), (4.0, 8192));

    let (id, with) = tokio::time::timeout(PATIENCE, agent.handle.registered()).await??;
    assert_eq!(id, "agent-1");
    assert_eq!(with, master.upid()?);
    let stored = std::fs::read_to_string(dir.path().join("agent_id"))?;
    assert_eq!(stored.trim(), "agent-1");
    assert!(!dir.path().join("agent_id.tmp").exists());
    assert_eq!(agent.handle.agent_id().await?.as_deref(), Some("agent-1"));

    let pong = master.ping(agent.upid()).await?;
    assert_eq!(pong.agent_id, "agent-1");
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_reregisters_with_its_stored_id_and_tasks() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-7".into())).await?;
    let first = AgentNode::start(config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    first.registered_with(&master.upid()?).await?;

    let reply = master
        .run_task(first.upid(), shell_task("done", "exit 0"))
        .await?;
    assert_eq!(reply.error, "");
    let reply = master
        .run_task(first.upid(), shell_task("long", "sleep 30"))
        .await?;
    assert_eq!(reply.error, "");
    first
        .wait_until("task `done` to finish", |s| {
            state_of(&s.completed_tasks, "done") == Some(TaskState::Finished)
        })
        .await?;
    // What the metrics say: two launches, one task running (a process), one finished, no
    // re-registration yet.
    let figures = first.handle.figures().await?;
    assert!(figures.registered, "{figures:?}");
    assert_eq!((figures.launches, figures.launch_failures), (2, 0));
    assert_eq!(figures.reregistrations, 0);
    assert_eq!(figures.running.len(), 1, "{figures:?}");
    assert_eq!(figures.running[0].task_id, "long");
    assert!(
        figures.running[0].pid.is_some_and(|pid| pid > 0),
        "{figures:?}"
    );
    assert_eq!(
        figures.completed,
        std::collections::BTreeMap::from([("finished".to_owned(), 1)])
    );
    first.stop().await;

    // A new node (new address), same data directory.
    let second = AgentNode::start(config(&[master.address()], dir.path())).await?;
    let request = master.next_reregister().await?;
    assert_eq!(request.agent_id, "agent-7");
    let info = request.info.context("ReregisterAgent without info")?;
    assert_eq!(info.address, second.upid().to_string());
    assert_eq!(
        state_of(&request.completed_tasks, "done"),
        Some(TaskState::Finished)
    );
    // This agent kills its tasks when it stops: the new one reports it killed.
    assert_eq!(
        state_of(&request.completed_tasks, "long"),
        Some(TaskState::Killed)
    );
    assert!(request.tasks.is_empty(), "{:?}", request.tasks);
    assert_eq!(request.completed_frameworks, vec![framework()]);
    assert_eq!(second.registered_with(&master.upid()?).await?, "agent-7");
    assert!(master.got_nothing(), "no fresh RegisterAgent");
    let figures = second.handle.figures().await?;
    assert_eq!(figures.reregistrations, 1, "{figures:?}");
    assert_eq!(figures.completed.get("killed"), Some(&1), "{figures:?}");

    // Task ids stay unique across the restart.
    let reply = master
        .run_task(second.upid(), shell_task("done", "exit 0"))
        .await?;
    assert!(reply.error.contains("already exists"), "{}", reply.error);
    second.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_not_leader_hint_sends_the_agent_to_the_leader() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut leader = MasterNode::start(Answer::Admit("agent-b".into())).await?;
    let mut standby = MasterNode::start(Answer::NotLeader(leader.upid()?.to_string())).await?;
    // Only the standby is configured: the agent can find the leader by the hint alone.
    let agent = AgentNode::start(config(&[standby.address()], dir.path())).await?;

    standby.next_register().await?;
    leader.next_register().await?;
    assert_eq!(agent.registered_with(&leader.upid()?).await?, "agent-b");
    agent.stop().await;
    standby.shutdown().await;
    leader.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_hint_sends_the_agent_to_the_next_master() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut standby = MasterNode::start(Answer::NotLeader(String::new())).await?;
    let mut leader = MasterNode::start(Answer::Admit("agent-c".into())).await?;
    let agent =
        AgentNode::start(config(&[standby.address(), leader.address()], dir.path())).await?;

    standby.next_register().await?;
    leader.next_register().await?;
    assert_eq!(agent.registered_with(&leader.upid()?).await?, "agent-c");
    agent.stop().await;
    standby.shutdown().await;
    leader.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_retried_later() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Refuse("not today".into())).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;

    master.next_register().await?;
    ensure!(matches!(
        *agent.handle.status().borrow(),
        AgentStatus::Registering
    ));
    master.set_answer(Answer::Admit("agent-r".into()));
    // The agent comes back after its backoff, without anyone prodding it.
    master.next_register().await?;
    assert_eq!(agent.registered_with(&master.upid()?).await?, "agent-r");
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_master_node_moves_the_agent_and_its_running_task_to_another_master()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut a = MasterNode::start(Answer::Admit("agent-9".into())).await?;
    let mut b = MasterNode::start(Answer::Admit("from-b".into())).await?;
    let agent = AgentNode::start(config(&[a.address(), b.address()], dir.path())).await?;
    a.next_register().await?;
    assert_eq!(agent.registered_with(&a.upid()?).await?, "agent-9");

    let reply = a
        .run_task(agent.upid(), shell_task("long", "sleep 30"))
        .await?;
    assert_eq!(reply.error, "");
    let reply = a
        .run_task(agent.upid(), shell_task("quick", "exit 0"))
        .await?;
    assert_eq!(reply.error, "");
    agent
        .wait_until("task `quick` to finish", |s| {
            state_of(&s.completed_tasks, "quick") == Some(TaskState::Finished)
        })
        .await?;

    a.shutdown().await;
    let request = b.next_reregister().await?;
    assert_eq!(request.agent_id, "agent-9");
    assert_eq!(state_of(&request.tasks, "long"), Some(TaskState::Running));
    assert_eq!(
        state_of(&request.completed_tasks, "quick"),
        Some(TaskState::Finished)
    );
    assert_eq!(request.frameworks, vec![framework()]);
    assert_eq!(agent.registered_with(&b.upid()?).await?, "agent-9");
    let snapshot = agent.handle.snapshot().await?;
    assert_eq!(state_of(&snapshot.tasks, "long"), Some(TaskState::Running));
    agent.stop().await;
    b.shutdown().await;
    Ok(())
}

/// The ids of `tasks`, sorted.
fn ids(tasks: &[Task]) -> Vec<&str> {
    let mut ids: Vec<&str> = tasks.iter().map(|t| t.id.as_str()).collect();
    ids.sort_unstable();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_tasks_go_grouped_by_labels_only_to_a_master_that_said_it_reads_them()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut a = MasterNode::start(Answer::Admit("agent-7".into())).await?;
    let mut b = MasterNode::start(Answer::Admit("agent-7".into())).await?;
    b.read_grouped_tasks();
    let agent = AgentNode::start(config(&[a.address(), b.address()], dir.path())).await?;
    a.next_register().await?;
    agent.registered_with(&a.upid()?).await?;
    let web = vec![Label {
        key: "tier".into(),
        value: "web".into(),
    }];
    let mut labelled = shell_task("labelled", "sleep 30");
    if let Some(task) = labelled.task.as_mut() {
        task.labels.clone_from(&web);
    }
    for request in [labelled, shell_task("plain", "sleep 30")] {
        assert_eq!(a.run_task(agent.upid(), request).await?.error, "");
    }
    agent
        .wait_until("both tasks to run", |s| s.tasks.len() == 2)
        .await?;
    let expect_grouped = |request: &ReregisterAgent| {
        assert_eq!(ids(&request.tasks), ["plain"]);
        assert_eq!(request.tasks_sharing_labels.len(), 1);
        let group = &request.tasks_sharing_labels[0];
        assert_eq!(group.labels, web);
        assert_eq!(ids(&group.tasks), ["labelled"]);
        assert!(group.tasks[0].labels.is_empty());
    };
    let expect_whole = |request: &ReregisterAgent| {
        assert!(request.tasks_sharing_labels.is_empty());
        assert_eq!(ids(&request.tasks), ["labelled", "plain"]);
        assert_eq!(
            find(&request.tasks, "labelled").map(|t| &t.labels),
            Some(&web)
        );
    };

    // b leads, and says it reads them.
    b.announce(agent.upid(), 1)?;
    expect_grouped(&b.next_reregister().await?);
    agent.registered_with(&b.upid()?).await?;
    // a leads, and does not.
    a.announce(agent.upid(), 2)?;
    expect_whole(&a.next_reregister().await?);
    agent.registered_with(&a.upid()?).await?;
    b.announce(agent.upid(), 3)?;
    expect_grouped(&b.next_reregister().await?);
    agent.registered_with(&b.upid()?).await?;

    // b's node goes, and a master of an earlier version comes up at its address: it never
    // said it reads them. a sends the agent there.
    let address = b.address();
    b.shutdown().await;
    a.set_answer(Answer::NotLeader(format!("master@{address}")));
    let mut older = MasterNode::start_on(&address, Answer::Admit("agent-7".into())).await?;
    expect_whole(&older.next_reregister().await?);
    agent.registered_with(&older.upid()?).await?;

    agent.stop().await;
    a.shutdown().await;
    older.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_master_counts_as_lost() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-s".into())).await?;
    let mut config = config(&[master.address()], dir.path());
    config.master_silence_timeout = Duration::from_millis(300);
    let agent = AgentNode::start(config).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    // The fake master never pings: the agent gives up on it and re-registers.
    let request = master.next_reregister().await?;
    assert_eq!(request.agent_id, "agent-s");
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_keep_the_master_from_counting_as_lost() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-p".into())).await?;
    let mut config = config(&[master.address()], dir.path());
    config.master_silence_timeout = Duration::from_secs(1);
    let agent = AgentNode::start(config).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    // Three silence timeouts' worth of pings, ten per timeout (pacing, not synchronisation).
    for _ in 0..30 {
        assert_eq!(master.ping(agent.upid()).await?.agent_id, "agent-p");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(
        master.got_nothing(),
        "the agent re-registered although pinged"
    );
    ensure!(
        matches!(
            *agent.handle.status().borrow(),
            AgentStatus::Registered { .. }
        ),
        "still registered"
    );
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_task_runs_real_children_and_refuses_bad_requests() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-t".into())).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    let to = agent.upid().clone();

    let mut with_env = shell_task("fail", "echo \"$GREETING\" > out.txt; exit 3");
    if let Some(task) = with_env.task.as_mut() {
        task.env.insert("GREETING".into(), "hello".into());
    }
    assert_eq!(master.run_task(&to, with_env).await?.error, "");
    assert_eq!(
        master
            .run_task(&to, shell_task("long", "sleep 30"))
            .await?
            .error,
        ""
    );
    let snapshot = agent
        .wait_until("task `fail` to complete", |s| {
            find(&s.completed_tasks, "fail").is_some()
        })
        .await?;
    let failed = find(&snapshot.completed_tasks, "fail").context("fail")?;
    assert_eq!(TaskState::try_from(failed.state)?, TaskState::Failed);
    assert_eq!(failed.exit_code, 3);
    assert_eq!(failed.framework_id, "fw-1");
    assert_eq!(state_of(&snapshot.tasks, "long"), Some(TaskState::Running));
    assert_eq!(snapshot.frameworks, vec![framework()]);
    // It ran in its own working directory, with its environment.
    let out = std::fs::read_to_string(dir.path().join("tasks/fail/out.txt"))?;
    assert_eq!(out.trim(), "hello");

    // A command that cannot start: an error naming it, nothing running.
    let mut bad = shell_task("bad", "");
    if let Some(task) = bad.task.as_mut() {
        task.command = "/nonexistent/muster-test-command".into();
        task.args.clear();
    }
    let error = master.run_task(&to, bad).await?.error;
    assert!(
        error.contains("/nonexistent/muster-test-command") && error.contains("bad"),
        "{error}"
    );
    let snapshot = agent.handle.snapshot().await?;
    assert!(find(&snapshot.tasks, "bad").is_none());
    assert!(find(&snapshot.completed_tasks, "bad").is_none());

    // Duplicates, and requests that name no framework or no usable id.
    let error = master
        .run_task(&to, shell_task("long", "exit 0"))
        .await?
        .error;
    assert!(error.contains("already exists"), "{error}");
    let error = master
        .run_task(&to, shell_task("fail", "exit 0"))
        .await?
        .error;
    assert!(error.contains("already exists"), "{error}");
    let mut no_framework = shell_task("orphan", "exit 0");
    no_framework.framework = None;
    let error = master.run_task(&to, no_framework).await?.error;
    assert!(error.contains("no framework"), "{error}");
    let error = master
        .run_task(&to, shell_task("../escape", "exit 0"))
        .await?
        .error;
    assert!(error.contains("cannot name a directory"), "{error}");
    let error = master
        .run_task(
            &to,
            RunTask {
                framework: Some(framework()),
                task: None,
                term: 0,
            },
        )
        .await?
        .error;
    assert!(error.contains("no task"), "{error}");

    let snapshot = agent.handle.snapshot().await?;
    assert_eq!(snapshot.tasks.len(), 1, "{:?}", snapshot.tasks);
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launch_tasks_starts_each_and_reports_refusals_as_failed_updates() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-l".into())).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    let to = agent.upid().clone();

    let mut bad = shell_task("bad", "");
    if let Some(task) = bad.task.as_mut() {
        task.command = "/nonexistent/muster-launch-command".into();
        task.args.clear();
    }
    // One message, no answer: three tasks, the middle one cannot start, the last repeats a
    // running task's id.
    let launch = LaunchTasks {
        tasks: vec![
            shell_task("first", "sleep 30"),
            bad,
            shell_task("first", "exit 0"),
        ],
        term: 0,
        ..Default::default()
    };
    master.node.remote(to.clone()).tell(launch)?;

    master.expect_started("agent-l", "first").await?;
    // Accepted (STARTING), then its command cannot start: FAILED.
    master
        .expect_update("agent-l", "bad", TaskState::Starting)
        .await?;
    let refused = master
        .expect_update("agent-l", "bad", TaskState::Failed)
        .await?;
    assert!(
        refused
            .message
            .contains("/nonexistent/muster-launch-command"),
        "the reason travels with the update: {:?}",
        refused.message
    );
    assert_eq!(refused.exit_code, -1);
    // The duplicate is refused without an update that would end the running `first`.
    let snapshot = agent.handle.snapshot().await?;
    assert_eq!(state_of(&snapshot.tasks, "first"), Some(TaskState::Running));
    assert!(find(&snapshot.tasks, "bad").is_none());
    // Updates come in order: the next one is for a later launch, none for the duplicate.
    let later = LaunchTasks {
        tasks: vec![shell_task("later", "sleep 30")],
        term: 0,
        ..Default::default()
    };
    master.node.remote(to.clone()).tell(later)?;
    master.expect_started("agent-l", "later").await?;
    // Four launches, two of them refused or failed; the metrics show the two running tasks'
    // memory, read from their cgroups or processes.
    let figures = agent.handle.figures().await?;
    assert_eq!(
        (figures.launches, figures.launch_failures),
        (4, 2),
        "{figures:?}"
    );
    let text = muster_agent::metrics::gather(&agent.handle, &agent.node).await?;
    for line in [
        "muster_agent_task_launches_total 4",
        "muster_agent_task_launch_failures_total 2",
        "muster_agent_tasks{state=\"running\"} 2",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
    }
    let memory = text
        .lines()
        .filter(|l| l.starts_with("muster_agent_task_memory_bytes{task=\""))
        .count();
    assert_eq!(memory, 2, "{text}");
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_for_an_earlier_registration_or_past_its_deadline_is_refused_as_lost()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-f".into())).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;
    let first = master.next_register().await?.registration;
    agent.registered_with(&master.upid()?).await?;
    assert!(first >= 1, "the agent names its registration");
    agent.stop().await;
    // A restarted agent registers under a higher number: it was written down.
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;
    let registration = master.next_reregister().await?.registration;
    agent.registered_with(&master.upid()?).await?;
    assert!(registration > first, "{registration} after {first}");
    let to = master.node.remote(agent.upid().clone());
    let now_ms = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?;

    // Stamped with the earlier registration: it waited in a queue while the agent registered
    // again, and the master has counted it lost.
    to.tell(LaunchTasks {
        tasks: vec![shell_task("stale", "sleep 30")],
        registration: first,
        ..Default::default()
    })?;
    let lost = master
        .expect_update("agent-f", "stale", TaskState::Lost)
        .await?;
    assert!(lost.message.contains("registration"), "{:?}", lost.message);
    // Past its deadline.
    to.tell(LaunchTasks {
        tasks: vec![shell_task("late", "sleep 30")],
        registration,
        deadline_unix_ms: now_ms.saturating_sub(1_000),
        ..Default::default()
    })?;
    let lost = master
        .expect_update("agent-f", "late", TaskState::Lost)
        .await?;
    assert!(lost.message.contains("expired"), "{:?}", lost.message);
    // For this registration, in time: it runs.
    to.tell(LaunchTasks {
        tasks: vec![shell_task("fresh", "sleep 30")],
        registration,
        deadline_unix_ms: now_ms + 60_000,
        ..Default::default()
    })?;
    master.expect_started("agent-f", "fresh").await?;
    let snapshot = agent.handle.snapshot().await?;
    assert!(find(&snapshot.tasks, "stale").is_none());
    assert!(find(&snapshot.tasks, "late").is_none());
    agent.stop().await;
    master.shutdown().await;
    Ok(())
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_s_processes_end_with_it_and_with_the_agent() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-k".into())).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    let to = agent.upid().clone();

    // The task's main process exits and leaves a background process behind.
    let script = "sleep 30 & echo $! > bg.pid; exit 0";
    assert_eq!(
        master
            .run_task(&to, shell_task("leaves", script))
            .await?
            .error,
        ""
    );
    let straggler = pid_in(&dir.path().join("tasks/leaves/bg.pid")).await?;
    agent
        .wait_until("task `leaves` to finish", |s| {
            state_of(&s.completed_tasks, "leaves") == Some(TaskState::Finished)
        })
        .await?;
    ends(straggler, "the finished task's background process").await?;

    // A running task and its child end when the agent stops.
    let script = "echo $$ > leader.pid; sleep 30 & echo $! > child.pid; wait";
    assert_eq!(
        master
            .run_task(&to, shell_task("runs", script))
            .await?
            .error,
        ""
    );
    let leader = pid_in(&dir.path().join("tasks/runs/leader.pid")).await?;
    let child = pid_in(&dir.path().join("tasks/runs/child.pid")).await?;
    ensure!(!has_ended(leader) && !has_ended(child), "the task runs");
    agent.stop().await;
    ends(leader, "the task's main process").await?;
    ends(child, "the task's child").await?;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_master_is_told_when_a_task_runs_and_when_it_ends() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-u".into())).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    let to = agent.upid().clone();

    assert_eq!(
        master
            .run_task(&to, shell_task("ok", "exit 0"))
            .await?
            .error,
        ""
    );
    let running = master.expect_started("agent-u", "ok").await?;
    assert_eq!(running.framework_id, "fw-1");
    assert_eq!(running.command, "sh");
    let finished = master
        .expect_update("agent-u", "ok", TaskState::Finished)
        .await?;
    assert_eq!(finished.exit_code, 0);

    assert_eq!(
        master
            .run_task(&to, shell_task("three", "exit 3"))
            .await?
            .error,
        ""
    );
    master.expect_started("agent-u", "three").await?;
    let failed = master
        .expect_update("agent-u", "three", TaskState::Failed)
        .await?;
    assert_eq!(failed.exit_code, 3);

    // What the master was told is what the agent has.
    let snapshot = agent.handle.snapshot().await?;
    assert_eq!(find(&snapshot.completed_tasks, "ok"), Some(&finished));
    assert_eq!(find(&snapshot.completed_tasks, "three"), Some(&failed));
    // A refused task changes no state: no update for it.
    let error = master
        .run_task(&to, shell_task("three", "exit 0"))
        .await?
        .error;
    assert!(error.contains("already exists"), "{error}");
    assert_eq!(
        master
            .run_task(&to, shell_task("last", "exit 0"))
            .await?
            .error,
        ""
    );
    master.expect_started("agent-u", "last").await?;
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_task_stops_a_task_that_honours_sigterm_within_the_grace() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-x".into())).await?;
    let mut config = config(&[master.address()], dir.path());
    let grace = Duration::from_secs(10);
    config.kill_grace = grace;
    let agent = AgentNode::start(config).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    let to = agent.upid().clone();

    let script = "echo $$ > leader.pid; sleep 30 & echo $! > child.pid; wait";
    assert_eq!(
        master
            .run_task(&to, shell_task("long", script))
            .await?
            .error,
        ""
    );
    master.expect_started("agent-x", "long").await?;
    let leader = pid_in(&dir.path().join("tasks/long/leader.pid")).await?;
    let child = pid_in(&dir.path().join("tasks/long/child.pid")).await?;

    let asked = tokio::time::Instant::now();
    assert_eq!(master.kill_task(&to, "long").await?.error, "");
    let killed = master
        .expect_update("agent-x", "long", TaskState::Killed)
        .await?;
    let took = asked.elapsed();
    ensure!(
        took < grace,
        "a task that honours SIGTERM took {took:?} to stop (grace {grace:?})"
    );
    // The shell died of the SIGTERM: 128 + 15.
    assert_eq!(killed.exit_code, 143);
    ends(leader, "the killed task's main process").await?;
    ends(child, "the killed task's child").await?;

    let snapshot = agent.handle.snapshot().await?;
    assert!(snapshot.tasks.is_empty(), "{:?}", snapshot.tasks);
    assert_eq!(find(&snapshot.completed_tasks, "long"), Some(&killed));
    // An ended task cannot be killed again.
    let error = master.kill_task(&to, "long").await?.error;
    assert!(
        error.contains("\"long\"") && error.contains("already ended"),
        "{error}"
    );
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_task_sends_sigkill_after_the_grace_to_a_task_that_ignores_sigterm()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-y".into())).await?;
    let mut config = config(&[master.address()], dir.path());
    let grace = Duration::from_millis(300);
    config.kill_grace = grace;
    let agent = AgentNode::start(config).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    let to = agent.upid().clone();

    // The pid files are written after the trap is set: once they are there, SIGTERM is ignored
    // (by the shell and, inherited, by its child).
    let script = "trap '' TERM; echo $$ > leader.pid; sleep 30 & echo $! > child.pid; wait";
    assert_eq!(
        master
            .run_task(&to, shell_task("stubborn", script))
            .await?
            .error,
        ""
    );
    master.expect_started("agent-y", "stubborn").await?;
    let leader = pid_in(&dir.path().join("tasks/stubborn/leader.pid")).await?;
    let child = pid_in(&dir.path().join("tasks/stubborn/child.pid")).await?;

    let asked = tokio::time::Instant::now();
    assert_eq!(master.kill_task(&to, "stubborn").await?.error, "");
    let killed = master
        .expect_update("agent-y", "stubborn", TaskState::Killed)
        .await?;
    let took = asked.elapsed();
    ensure!(
        took >= grace,
        "a task that ignores SIGTERM ended after {took:?}, before the grace of {grace:?}"
    );
    // The shell died of the SIGKILL: 128 + 9.
    assert_eq!(killed.exit_code, 137);
    ends(leader, "the killed task's main process").await?;
    ends(child, "the killed task's child").await?;
    let snapshot = agent.handle.snapshot().await?;
    assert_eq!(
        state_of(&snapshot.completed_tasks, "stubborn"),
        Some(TaskState::Killed)
    );
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_task_for_an_unknown_task_names_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-z".into())).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;

    let error = master.kill_task(agent.upid(), "no-such-task").await?.error;
    assert!(error.contains("\"no-such-task\""), "{error}");
    let snapshot = agent.handle.snapshot().await?;
    assert!(snapshot.tasks.is_empty() && snapshot.completed_tasks.is_empty());
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_made_while_unregistered_is_sent_after_the_next_registration()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut a = MasterNode::start(Answer::Admit("agent-q".into())).await?;
    let mut b = MasterNode::start(Answer::Refuse("not yet".into())).await?;
    let agent = AgentNode::start(config(&[a.address(), b.address()], dir.path())).await?;
    a.next_register().await?;
    agent.registered_with(&a.upid()?).await?;
    let to = agent.upid().clone();
    assert_eq!(
        a.run_task(&to, shell_task("q", "sleep 30")).await?.error,
        ""
    );
    a.expect_started("agent-q", "q").await?;

    // A goes away; B refuses: the agent has no master.
    a.shutdown().await;
    b.next_reregister().await?;
    // The task ends meanwhile (B's node asks for it: any node can).
    assert_eq!(b.kill_task(&to, "q").await?.error, "");
    agent
        .wait_until("task `q` to be killed", |s| {
            state_of(&s.completed_tasks, "q") == Some(TaskState::Killed)
                && s.status == AgentStatus::Registering
        })
        .await?;

    b.set_answer(Answer::Admit("unused".into()));
    assert_eq!(agent.registered_with(&b.upid()?).await?, "agent-q");
    // Only the latest state of the task, and only after B took the agent.
    let Update {
        admitted_before,
        update,
    } = b.next_update().await?;
    let task = update.task.context("TaskStatusUpdate without a task")?;
    assert_eq!(
        (update.agent_id.as_str(), task.id.as_str()),
        ("agent-q", "q")
    );
    assert_eq!(TaskState::try_from(task.state)?, TaskState::Killed);
    assert_eq!(
        admitted_before, 1,
        "the update reached B before B admitted the agent"
    );
    agent.stop().await;
    b.shutdown().await;
    Ok(())
}

/// A shell task with resources (so that its cgroup has limits).
fn bounded_task(id: &str, script: &str, mem_mb: u64) -> RunTask {
    let mut request = shell_task(id, script);
    if let Some(task) = request.task.as_mut() {
        task.resources = Some(muster_proto::model::Resources { cpus: 0.5, mem_mb });
    }
    request
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cgroups_bound_memory_and_a_kill_reaches_every_process() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-cg".into())).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;
    let registered = master.next_register().await?;
    // This machine (and CI's) has writable cgroups: the test is about them.
    let isolation = isolation_of(&registered);
    ensure!(
        isolation.starts_with("cgroup-"),
        "the agent could not use cgroups here ({isolation}); these tests need them"
    );
    agent.registered_with(&master.upid()?).await?;
    let to = agent.upid().clone();

    // 16 MiB, and a pipeline that holds 200 MB: the kernel kills it, the agent says why.
    let hog = "head -c 200000000 /dev/zero | tail > /dev/null";
    assert_eq!(
        master
            .run_task(&to, bounded_task("hog", hog, 16))
            .await?
            .error,
        ""
    );
    master.expect_started("agent-cg", "hog").await?;
    let failed = master
        .expect_update("agent-cg", "hog", TaskState::Failed)
        .await?;
    assert_eq!(failed.message, "out of memory", "{failed:?}");

    // A grandchild in a session of its own is still the task's: a kill ends it too.
    let script = "setsid sh -c 'echo $$ > escapee.pid; exec sleep 300' & wait";
    assert_eq!(
        master
            .run_task(&to, bounded_task("escape", script, 64))
            .await?
            .error,
        ""
    );
    master.expect_started("agent-cg", "escape").await?;
    let escapee = pid_in(&dir.path().join("tasks/escape/escapee.pid")).await?;
    ensure!(!has_ended(escapee), "the grandchild runs");
    assert_eq!(master.kill_task(&to, "escape").await?.error, "");
    master
        .expect_update("agent-cg", "escape", TaskState::Killed)
        .await?;
    ends(escapee, "the setsid grandchild").await?;

    // A task within its limits finishes as usual.
    assert_eq!(
        master
            .run_task(&to, bounded_task("small", "exit 0", 64))
            .await?
            .error,
        ""
    );
    master.expect_started("agent-cg", "small").await?;
    master
        .expect_update("agent-cg", "small", TaskState::Finished)
        .await?;
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_cgroups_the_agent_says_so() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-pg".into())).await?;
    let mut config = config(&[master.address()], dir.path());
    config.cgroups = false;
    let agent = AgentNode::start(config).await?;
    let registered = master.next_register().await?;
    assert_eq!(isolation_of(&registered), "process-group");
    agent.stop().await;
    master.shutdown().await;
    Ok(())
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_takes_back_its_running_tasks_and_the_real_end_of_the_others()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-r".into())).await?;
    let first = AgentNode::start(keeping_config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    first.registered_with(&master.upid()?).await?;
    let service = "echo $$ > pid; exec sleep 60";
    let batch = "echo $$ > pid; while [ ! -e release ]; do sleep 0.02; done; exit 7";
    for (id, script) in [("service", service), ("batch", batch)] {
        assert_eq!(
            master
                .run_task(first.upid(), shell_task(id, script))
                .await?
                .error,
            ""
        );
    }
    let service_pid = pid_in(&dir.path().join("tasks/service/pid")).await?;
    let batch_pid = pid_in(&dir.path().join("tasks/batch/pid")).await?;
    first.stop().await;
    ensure!(
        !has_ended(service_pid),
        "the service task outlives its agent"
    );

    // The batch task ends while no agent runs.
    std::fs::write(dir.path().join("tasks/batch/release"), "")?;
    ends(batch_pid, "the batch task").await?;
    // Ended is not yet recorded: its executor writes the wait status once it has reaped it.
    // An agent that starts before then finds the executor still there and re-attaches.
    let status = dir.path().join("meta/tasks/batch.status");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !status.exists() {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the executor never recorded the batch task's end in {}",
            status.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let second = AgentNode::start(keeping_config(&[master.address()], dir.path())).await?;
    let request = master.next_reregister().await?;
    let service_task = find(&request.tasks, "service").context("service not reported")?;
    assert_eq!(service_task.state, TaskState::Running as i32);
    assert_eq!(request.tasks.len(), 1, "{:?}", request.tasks);
    let batch_task = find(&request.completed_tasks, "batch").context("batch not reported")?;
    assert_eq!(
        (batch_task.state, batch_task.exit_code),
        (TaskState::Failed as i32, 7),
        "{batch_task:?}"
    );
    ensure!(!has_ended(service_pid), "the service task still runs");
    second.registered_with(&master.upid()?).await?;

    // The re-attached task is the agent's as before: a kill reaches it, and its end is seen.
    assert_eq!(master.kill_task(second.upid(), "service").await?.error, "");
    let killed = await_state(&mut master, "service", TaskState::Killed).await?;
    assert_eq!(killed.exit_code, 128 + 15, "{killed:?}");
    ends(service_pid, "the killed service task").await?;
    second.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_agent_kills_what_the_master_gave_up_and_an_unknown_id_registers_anew()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-g".into())).await?;
    let first = AgentNode::start(keeping_config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    first.registered_with(&master.upid()?).await?;
    for id in ["replaced", "kept"] {
        let script = "echo $$ > pid; exec sleep 60";
        assert_eq!(
            master
                .run_task(first.upid(), shell_task(id, script))
                .await?
                .error,
            ""
        );
    }
    let replaced = pid_in(&dir.path().join("tasks/replaced/pid")).await?;
    let kept = pid_in(&dir.path().join("tasks/kept/pid")).await?;
    first.stop().await;

    // The master gave `replaced` up while the agent was away: it goes first thing.
    master.set_answer(Answer::AdmitKilling(
        "agent-g".into(),
        vec!["replaced".into()],
    ));
    let second = AgentNode::start(keeping_config(&[master.address()], dir.path())).await?;
    master.next_reregister().await?;
    let killed = await_state(&mut master, "replaced", TaskState::Killed).await?;
    assert_eq!(killed.exit_code, 128 + 9, "{killed:?}");
    ends(replaced, "the replaced task").await?;
    ensure!(!has_ended(kept), "the task the master still wants runs on");
    second.stop().await;

    // The master does not know the id at all: the agent's tasks go, and it registers anew,
    // forgetting the term it followed (a rebuilt cluster counts its terms from the start).
    std::fs::write(dir.path().join("meta/term"), "9\n")?;
    master.set_answer(Answer::Forgotten("agent-h".into()));
    let third = AgentNode::start(keeping_config(&[master.address()], dir.path())).await?;
    let refused = master.next_reregister().await?;
    assert_eq!(refused.agent_id, "agent-g");
    master.next_register().await?;
    assert_eq!(third.registered_with(&master.upid()?).await?, "agent-h");
    ends(kept, "a task run under the unknown id").await?;
    assert_eq!(
        muster_agent::store::read_agent_id(dir.path())?.as_deref(),
        Some("agent-h")
    );
    assert_eq!(third.handle.snapshot().await?.term, 0);
    assert_eq!(
        master
            .run_task(third.upid(), shell_task("after", "exit 0"))
            .await?
            .error,
        "",
        "a command of the new cluster's term 0 is obeyed"
    );
    third.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_down_past_its_recovery_timeout_kills_what_it_left_before_registering()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-t".into())).await?;
    let first = AgentNode::start(keeping_config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    first.registered_with(&master.upid()?).await?;
    let script = "echo $$ > pid; exec sleep 60";
    assert_eq!(
        master
            .run_task(first.upid(), shell_task("stale", script))
            .await?
            .error,
        ""
    );
    let pid = pid_in(&dir.path().join("tasks/stale/pid")).await?;
    // The task's files belong to the user it runs as.
    let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(
        dir.path().join("tasks/stale/stdout"),
    )?);
    assert_eq!(owner, uid_of(pid)?, "stdout belongs to the task's user");
    first.stop().await;
    ensure!(!has_ended(pid), "the task outlives its agent");

    // The agent was last alive an hour ago: past its 15-minute recovery timeout. The file
    // holds that time (milliseconds since the Unix epoch).
    let alive = std::fs::read_to_string(dir.path().join("meta/alive"))?;
    let alive_ms: u64 = alive.trim().parse().context("meta/alive holds no time")?;
    let hour_ago = alive_ms.saturating_sub(3_600_000);
    std::fs::write(dir.path().join("meta/alive"), format!("{hour_ago}\n"))?;
    let second = AgentNode::start(keeping_config(&[master.address()], dir.path())).await?;
    let request = master.next_reregister().await?;
    // Killed before the agent said anything to the master.
    ensure!(
        has_ended(pid),
        "the stale task still ran at re-registration"
    );
    assert!(request.tasks.is_empty(), "{:?}", request.tasks);
    let stale = find(&request.completed_tasks, "stale").context("stale not reported")?;
    assert_eq!(stale.state, TaskState::Killed as i32, "{stale:?}");
    assert!(stale.message.contains("recovery timeout"), "{stale:?}");
    second.stop().await;
    master.shutdown().await;
    Ok(())
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_may_name_only_a_user_the_agent_allows() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // Only root switches users; a non-root agent's refusal is a unit test.
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-u".into())).await?;
    let mut config = config(&[master.address()], dir.path());
    config.allowed_task_users = vec!["daemon".into()];
    let agent = AgentNode::start(config).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    let as_user = |id: &str, user: &str| {
        let mut request = shell_task(id, "echo $$ > pid; exec sleep 60");
        if let Some(task) = &mut request.task {
            task.user = user.into();
        }
        request
    };
    let refused = master
        .run_task(agent.upid(), as_user("as-root", "root"))
        .await?;
    assert!(
        refused.error.contains("\"root\"") && refused.error.contains("does not allow"),
        "{}",
        refused.error
    );
    assert_eq!(
        master
            .run_task(agent.upid(), as_user("as-daemon", "daemon"))
            .await?
            .error,
        ""
    );
    let pid = pid_in(&dir.path().join("tasks/as-daemon/pid")).await?;
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    let daemon: u32 = passwd
        .lines()
        .find_map(|line| line.strip_prefix("daemon:x:"))
        .and_then(|rest| rest.split(':').next())
        .and_then(|uid| uid.parse().ok())
        .context("no daemon user")?;
    assert_eq!(uid_of(pid)?, daemon);
    agent.stop().await;
    ends(pid, "the task").await?;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_of_an_older_leader_term_are_refused_counted_and_remembered_across_restarts()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::AdmitInTerm("agent-f".into(), 5)).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    agent
        .wait_until("the agent to follow term 5", |s| s.term == 5)
        .await?;
    let in_term = |id: &str, term| {
        let mut request = shell_task(id, "exec sleep 60");
        request.term = term;
        request
    };
    // A deposed leader of term 4 cannot launch or kill.
    let refused = master.run_task(agent.upid(), in_term("old", 4)).await?;
    assert!(
        refused.error.contains("term 4") && refused.error.contains("follows term 5"),
        "{}",
        refused.error
    );
    let remote = master.node.remote(agent.upid().clone());
    remote.tell(LaunchTasks {
        tasks: vec![in_term("old-launch", 4)],
        term: 4,
        ..Default::default()
    })?;
    assert_eq!(
        master
            .run_task(agent.upid(), in_term("new", 5))
            .await?
            .error,
        ""
    );
    let kill = KillTask {
        task_id: "new".into(),
        term: 3,
    };
    let refused: KillTaskReply = remote.ask_timeout(PATIENCE, kill).await?;
    assert!(refused.error.contains("term 3"), "{}", refused.error);
    let snapshot = agent
        .wait_until("three refusals", |s| s.stale_commands_refused == 3)
        .await?;
    assert!(
        find(&snapshot.tasks, "new").is_some(),
        "{:?}",
        snapshot.tasks
    );
    for stale in ["old", "old-launch"] {
        assert!(!snapshot.tasks.iter().any(|t| t.id == stale));
        assert!(!snapshot.completed_tasks.iter().any(|t| t.id == stale));
    }
    agent.stop().await;

    // The promise holds across a restart, before any master speaks to the agent.
    master.set_answer(Answer::Refuse("not now".into()));
    let restarted = AgentNode::start(config(&[master.address()], dir.path())).await?;
    let snapshot = restarted.handle.snapshot().await?;
    assert_eq!(snapshot.term, 5);
    let refused = master
        .run_task(restarted.upid(), in_term("older", 2))
        .await?;
    assert!(refused.error.contains("term 2"), "{}", refused.error);
    restarted.stop().await;
    master.shutdown().await;
    Ok(())
}

/// The clock of the simulated tasks in these tests: the time since the first reading.
fn simulated_clock() -> Duration {
    static START: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(tokio::time::Instant::now).elapsed()
}

/// A task of `command` with `args`, for simulated tasks, as a leader of `term` sends it.
fn simulated_task(id: &str, command: &str, args: &[&str], term: u64) -> RunTask {
    RunTask {
        framework: Some(framework()),
        task: Some(Task {
            id: id.into(),
            name: format!("sim.main[{id}]"),
            command: command.into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            ..Task::default()
        }),
        term,
    }
}

/// On one thread, as in a simulation: the agent's logic runs simulated tasks as it runs
/// processes (updates, exit codes, kills, fencing terms), its next run re-attaches them and
/// hears how those that ended meanwhile ended, a machine crash loses them, and an agent that
/// stops kills them; and it makes no working directory, executor file or cgroup for them.
#[tokio::test(flavor = "current_thread")]
async fn simulated_tasks_go_through_the_agent_s_logic_across_restarts_and_a_reboot()
-> anyhow::Result<()> {
    use muster_agent::runner::CustomRunner;
    use muster_agent::simulated::SimulatedTasks;

    let dir = tempfile::tempdir()?;
    let machine = SimulatedTasks::new(simulated_clock);
    let mut master = MasterNode::start(Answer::AdmitInTerm("agent-sim".into(), 2)).await?;
    // Tasks outlive the agent, as the binary's do; cgroups asked for, and not used.
    let mut config = keeping_config(&[master.address()], dir.path());
    config.task_runner = Some(CustomRunner::new(machine.clone()));
    let first = AgentNode::start(config.clone()).await?;
    let registered = master.next_register().await?;
    assert_eq!(isolation_of(&registered), "none");
    first.registered_with(&master.upid()?).await?;
    let to = first.upid().clone();

    async fn run(master: &MasterNode, to: &Upid, request: RunTask) -> anyhow::Result<String> {
        Ok(master.run_task(to, request).await?.error)
    }
    let request = simulated_task("done", "sleep", &["0.1"], 2);
    assert_eq!(run(&master, &to, request).await?, "");
    master.expect_started("agent-sim", "done").await?;
    let done = master
        .expect_update("agent-sim", "done", TaskState::Finished)
        .await?;
    assert_eq!(done.exit_code, 0);
    let request = simulated_task("three", "exit", &["3"], 3);
    assert_eq!(run(&master, &to, request).await?, "");
    master.expect_started("agent-sim", "three").await?;
    let failed = master
        .expect_update("agent-sim", "three", TaskState::Failed)
        .await?;
    assert_eq!(failed.exit_code, 3);
    let refused = run(&master, &to, simulated_task("stale", "serve", &[], 2)).await?;
    assert!(refused.contains("term 2"), "{refused}");
    let bad = run(&master, &to, simulated_task("bad", "sleep", &["later"], 3)).await?;
    assert!(bad.contains("sleep needs a number"), "{bad}");
    master
        .expect_update("agent-sim", "bad", TaskState::Starting)
        .await?;
    master
        .expect_update("agent-sim", "bad", TaskState::Failed)
        .await?;
    for (id, args) in [("server", vec![]), ("nap", vec!["0.3"])] {
        let command = if id == "nap" { "sleep" } else { "serve" };
        let request = simulated_task(id, command, &args, 3);
        assert_eq!(run(&master, &to, request).await?, "");
        master.expect_started("agent-sim", id).await?;
    }
    first.stop().await;
    assert!(machine.kills().is_empty(), "{:?}", machine.kills());

    // The nap ends while no agent runs.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while machine.running_names().len() > 1 {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the nap never ended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = AgentNode::start(config.clone()).await?;
    let request = master.next_reregister().await?;
    let server = find(&request.tasks, "server").context("server not re-attached")?;
    assert_eq!(server.state, TaskState::Running as i32);
    assert_eq!(request.tasks.len(), 1, "{:?}", request.tasks);
    let nap = find(&request.completed_tasks, "nap").context("nap not reported")?;
    assert_eq!(
        (nap.state, nap.exit_code, nap.message.as_str()),
        (
            TaskState::Finished as i32,
            0,
            "it ended while the agent was down"
        )
    );
    second.registered_with(&master.upid()?).await?;

    // The re-attached task is the agent's as before: a kill (of a leader of term 4) reaches
    // it, and its end is seen.
    let kill = KillTask {
        task_id: "server".into(),
        term: 4,
    };
    let answer: KillTaskReply = master
        .node
        .remote(second.upid().clone())
        .ask_timeout(PATIENCE, kill)
        .await?;
    assert_eq!(answer.error, "");
    let killed = await_state(&mut master, "server", TaskState::Killed).await?;
    assert_eq!(killed.exit_code, 128 + libc::SIGTERM, "{killed:?}");
    let to = second.upid().clone();
    let request = simulated_task("doomed", "serve", &[], 4);
    assert_eq!(run(&master, &to, request).await?, "");
    master.expect_started("agent-sim", "doomed").await?;
    second.stop().await;

    // The machine crashes: the next run finds the task gone.
    machine.reboot();
    // This run kills its tasks when it stops.
    config.stop_tasks_on_exit = true;
    let fourth = AgentNode::start(config).await?;
    let request = master.next_reregister().await?;
    let doomed = find(&request.completed_tasks, "doomed").context("doomed not reported")?;
    assert_eq!(doomed.state, TaskState::Lost as i32, "{doomed:?}");
    assert!(request.tasks.is_empty(), "{:?}", request.tasks);
    fourth.registered_with(&master.upid()?).await?;

    // An agent that kills its tasks as it stops kills simulated ones too.
    let to = fourth.upid().clone();
    let request = simulated_task("last", "serve", &[], 4);
    assert_eq!(run(&master, &to, request).await?, "");
    master.expect_started("agent-sim", "last").await?;
    fourth.stop().await;
    assert!(machine.running_names().is_empty());

    let launched: Vec<(String, u64)> = machine
        .launches()
        .into_iter()
        .map(|l| (l.task_id, l.term))
        .collect();
    let expected = [
        ("done", 2),
        ("three", 3),
        ("server", 3),
        ("nap", 3),
        ("doomed", 4),
        ("last", 4),
    ];
    assert_eq!(launched, expected.map(|(id, term)| (id.to_owned(), term)));
    let kills: Vec<(String, Option<u64>, i32)> = machine
        .kills()
        .into_iter()
        .map(|k| (k.task_id, k.term, k.signal))
        .collect();
    assert_eq!(
        kills,
        vec![
            ("server".to_owned(), Some(4), libc::SIGTERM),
            ("last".to_owned(), None, libc::SIGKILL),
        ]
    );
    // Nothing of the machine's: no working directory, no executor files.
    ensure!(
        !dir.path().join("tasks").exists(),
        "a working directory was made"
    );
    for entry in std::fs::read_dir(dir.path().join("meta/tasks"))? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        ensure!(name.ends_with(".pb"), "an executor file: {name}");
    }
    master.shutdown().await;
    Ok(())
}
