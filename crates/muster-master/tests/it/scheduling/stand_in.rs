//! The master against a stand-in agent that records what it is sent and answers kills as the
//! test says ([`Recorder`]): launches never confirmed, kills lost, refused or answered late,
//! an agent back from unreachable, and a batch slot updated while its task finishes.

use super::*;

/// A stand-in agent that records what the master sends it and runs nothing.
struct Recorder {
    launches: tokio::sync::mpsc::UnboundedSender<pb::LaunchTasks>,
    kills: tokio::sync::mpsc::UnboundedSender<pb::KillTask>,
    /// How to answer the next kills, in order (then: the task is being killed).
    kill_answers: std::collections::VecDeque<KillAnswer>,
}

/// A stand-in agent's answer to a kill.
enum KillAnswer {
    /// None: the reply is dropped, as a kill lost on a broken link.
    Lost,
    /// The agent runs no such task.
    Unknown,
    /// The agent follows a newer term than the kill's: refused by fencing.
    Fenced,
    /// The task had already finished by itself when the kill came.
    AlreadyFinished,
}

enum RecorderMsg {
    Launch(pb::LaunchTasks),
    Kill(pb::KillTask, muster_actor::Reply<pb::KillTaskReply>),
}

impl muster_actor::Process for Recorder {
    type Message = RecorderMsg;
    async fn handle(&mut self, msg: RecorderMsg, _ctx: &mut muster_actor::Context<Self>) {
        match msg {
            RecorderMsg::Launch(launch) => {
                let _ = self.launches.send(launch);
            }
            RecorderMsg::Kill(kill, reply) => {
                let task_id = kill.task_id.clone();
                let kill_term = kill.term;
                let _ = self.kills.send(kill);
                match self.kill_answers.pop_front() {
                    None => reply.send(pb::KillTaskReply::default()),
                    Some(KillAnswer::Lost) => drop(reply),
                    Some(KillAnswer::Unknown) => reply.send(pb::KillTaskReply {
                        error: format!("no task {task_id:?} runs on this agent"),
                        ..pb::KillTaskReply::default()
                    }),
                    Some(KillAnswer::Fenced) => reply.send(pb::KillTaskReply {
                        error: format!(
                            "refused a KillTask: it comes from a leader of term {}, but this \
                             agent follows term {}",
                            kill_term,
                            kill_term + 1
                        ),
                        follows_term: kill_term + 1,
                        ..pb::KillTaskReply::default()
                    }),
                    Some(KillAnswer::AlreadyFinished) => reply.send(pb::KillTaskReply {
                        error: format!("task {task_id:?} has already ended (TASK_STATE_FINISHED)"),
                        ended_as: model_pb::TaskState::Finished as i32,
                        ..pb::KillTaskReply::default()
                    }),
                }
            }
        }
    }
}

/// A leading master and a registered stand-in agent ([`Recorder`]) that answers kills as
/// `kill_answers` says.
struct StandInCluster {
    _dir: tempfile::TempDir,
    master: MasterServer,
    master_upid: muster_actor::Upid,
    node: Node,
    agent_id: String,
    launched: tokio::sync::mpsc::UnboundedReceiver<pb::LaunchTasks>,
    killed: tokio::sync::mpsc::UnboundedReceiver<pb::KillTask>,
}

impl StandInCluster {
    async fn start(
        config: impl FnOnce(MasterConfig) -> MasterConfig,
        kill_answers: std::collections::VecDeque<KillAnswer>,
        hostname: &str,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let master =
            testing::start_leading(config(playing_many_agents(master_config(dir.path())))).await?;
        let master_upid = master_upid(&master)?;
        let node = agent_node(&System::new(), "agent-1").await?;
        let (launches, launched) = tokio::sync::mpsc::unbounded_channel();
        let (kills, killed) = tokio::sync::mpsc::unbounded_channel();
        let recorder = node.system().spawn(Recorder {
            launches,
            kills,
            kill_answers,
        });
        node.register("agent", &recorder)?
            .install::<pb::LaunchTasks>(RecorderMsg::Launch)
            .install_ask::<pb::KillTask, pb::KillTaskReply>(RecorderMsg::Kill);
        let (agent_id, _) = register_stand_in(&node, &master_upid, hostname).await?;
        Ok(StandInCluster {
            _dir: dir,
            master,
            master_upid,
            node,
            agent_id,
            launched,
            killed,
        })
    }

    /// The first task of the next launch the stand-in receives.
    async fn next_launched_task(&mut self) -> anyhow::Result<model_pb::Task> {
        let launch = tokio::time::timeout(DEADLINE, self.launched.recv())
            .await?
            .context("a launch")?;
        launch
            .tasks
            .first()
            .and_then(|run| run.task.clone())
            .context("a task in the launch")
    }

    async fn shutdown(self) {
        self.node.shutdown();
        self.master.shutdown().await;
    }
}

/// A launch the agent never confirms is LOST after the launch timeout and replaced; when the
/// agent reports the lost task running after all, the master kills it rather than let it run
/// beside its replacement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_launch_is_lost_and_a_late_report_of_it_is_killed() -> anyhow::Result<()> {
    let mut cluster = StandInCluster::start(
        |config| MasterConfig {
            launch_timeout: Duration::from_millis(300),
            ..config
        },
        Default::default(),
        "silent",
    )
    .await?;
    submit(&cluster.master, one_sleeper()).await?;
    // The launch arrives; the agent says nothing about it.
    let first = cluster.next_launched_task().await?;
    let replaced = job_when(
        &cluster.master,
        "web",
        "the unconfirmed task lost and replaced",
        |s| {
            let lost = s.tasks.iter().any(|t| {
                t.task.as_ref().is_some_and(|t| {
                    t.id == first.id && t.state == model_pb::TaskState::Lost as i32
                })
            });
            lost && live(s).len() == 1
        },
    )
    .await?;
    let lost = replaced
        .tasks
        .iter()
        .filter_map(|t| t.task.as_ref())
        .find(|t| t.id == first.id)
        .context("the lost task")?;
    assert!(
        lost.message.contains("no word from the agent"),
        "{:?}",
        lost.message
    );

    // Late news: the agent reports the lost task starting, then running. The master kills it,
    // and the RUNNING that follows does not bring it back.
    let to_master = cluster.node.remote(cluster.master_upid.clone());
    for state in [model_pb::TaskState::Starting, model_pb::TaskState::Running] {
        let mut late = first.clone();
        late.state = state as i32;
        to_master.tell(pb::TaskStatusUpdate {
            agent_id: cluster.agent_id.clone(),
            task: Some(late),
        })?;
    }
    let kill = tokio::time::timeout(DEADLINE, cluster.killed.recv())
        .await?
        .context("a kill")?;
    assert_eq!(kill.task_id, first.id);
    // An ask on the same link is handled after both updates.
    to_master
        .ask_timeout::<pb::Heartbeat, pb::HeartbeatReply>(
            DEADLINE,
            pb::Heartbeat {
                agent_id: cluster.agent_id.clone(),
            },
        )
        .await?;
    let status = testing::job_status(&cluster.master, "web").await?;
    let states: Vec<i32> = status
        .tasks
        .iter()
        .filter_map(|t| t.task.as_ref())
        .filter(|t| t.id == first.id)
        .map(|t| t.state)
        .collect();
    assert_eq!(
        states,
        [
            model_pb::TaskState::Killed as i32,
            model_pb::TaskState::Lost as i32
        ],
        "being killed (and lost before), never running again"
    );
    cluster.shutdown().await;
    Ok(())
}

/// A kill that does not arrive (its link broke, the agent did not answer) is sent again until
/// the agent answers; an agent that answers it runs no such task ends it for the master. Before,
/// a lost kill left the task marked "being killed" for good: not counted as running, so nothing
/// noticed that it ran beside its replacement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_kill_is_sent_again_and_an_unknown_task_ends() -> anyhow::Result<()> {
    let mut cluster = StandInCluster::start(
        |config| MasterConfig {
            ping_timeout: Duration::from_millis(300),
            ..config
        },
        [KillAnswer::Lost, KillAnswer::Unknown].into(),
        "forgetful",
    )
    .await?;
    submit(&cluster.master, one_sleeper()).await?;
    let mut task = cluster.next_launched_task().await?;
    task.state = model_pb::TaskState::Running as i32;
    cluster
        .node
        .remote(cluster.master_upid.clone())
        .tell(pb::TaskStatusUpdate {
            agent_id: cluster.agent_id.clone(),
            task: Some(task.clone()),
        })?;
    job_when(&cluster.master, "web", "the task running", |s| {
        live(s).len() == 1
    })
    .await?;

    cluster
        .master
        .pid()
        .ask(|reply| {
            StopJob {
                name: "web".into(),
                reply,
            }
            .into()
        })
        .await?
        .map_err(anyhow::Error::msg)?;
    for attempt in ["the kill", "the kill sent again"] {
        let kill = tokio::time::timeout(DEADLINE, cluster.killed.recv())
            .await?
            .with_context(|| attempt.to_owned())?;
        assert_eq!(kill.task_id, task.id, "{attempt}");
    }
    let status = job_when(&cluster.master, "web", "the unknown task ended", |s| {
        s.tasks
            .iter()
            .filter_map(|t| t.task.as_ref())
            .any(|t| t.id == task.id && t.message.contains("the kill was answered: no task"))
    })
    .await?;
    assert!(live(&status).is_empty(), "{status:#?}");
    let metrics = cluster
        .master
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await?;
    assert_eq!(metrics.kill_retries, 1);
    assert!(
        cluster.killed.try_recv().is_err(),
        "an answered kill is not sent again"
    );
    cluster.shutdown().await;
    Ok(())
}

/// A kill refused for its term says nothing about the task: the master keeps it as being
/// killed (counted, not ended), instead of counting it as gone while it may still run.
#[tokio::test]
async fn a_kill_refused_for_its_term_does_not_end_the_task() -> anyhow::Result<()> {
    let mut cluster =
        StandInCluster::start(|config| config, [KillAnswer::Fenced].into(), "fenced").await?;
    submit(&cluster.master, one_sleeper()).await?;
    let mut task = cluster.next_launched_task().await?;
    task.state = model_pb::TaskState::Running as i32;
    cluster
        .node
        .remote(cluster.master_upid.clone())
        .tell(pb::TaskStatusUpdate {
            agent_id: cluster.agent_id.clone(),
            task: Some(task.clone()),
        })?;
    job_when(&cluster.master, "web", "the task running", |s| {
        live(s).len() == 1
    })
    .await?;
    cluster
        .master
        .pid()
        .ask(|reply| {
            StopJob {
                name: "web".into(),
                reply,
            }
            .into()
        })
        .await?
        .map_err(anyhow::Error::msg)?;
    let kill = tokio::time::timeout(DEADLINE, cluster.killed.recv())
        .await?
        .context("the kill")?;
    assert_eq!(kill.task_id, task.id);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let metrics = cluster
            .master
            .pid()
            .ask(|reply| GetMetrics { reply }.into())
            .await?;
        if metrics.kills_fenced == 1 {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the fenced answer was never counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = testing::job_status(&cluster.master, "web").await?;
    let kept = status
        .tasks
        .iter()
        .filter_map(|t| t.task.as_ref())
        .find(|t| t.id == task.id)
        .context("the task is gone from the job")?;
    assert_eq!(
        kept.state,
        model_pb::TaskState::Killed as i32,
        "still being killed, not ended: {kept:#?}"
    );
    assert!(!kept.message.contains("the kill was answered"), "{kept:#?}");
    cluster.shutdown().await;
    Ok(())
}

/// An agent marked unreachable comes back. The tasks it reports running were replaced, so the
/// answer to its re-registration names them to kill, and the master sends the kills as well,
/// again until they end: an answer lost on the way must not leave them running beside their
/// replacements. A task it does not report, but starts later (a launch held up in the
/// network), is killed as soon as it reports in. Both were found by the simulation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_back_from_unreachable_keeps_what_nothing_replaced_and_a_late_start_is_killed()
-> anyhow::Result<()> {
    let mut cluster = StandInCluster::start(
        |config| MasterConfig {
            heartbeat_min_ttl: Duration::from_millis(200),
            heartbeat_grace: Duration::from_millis(100),
            ..config
        },
        Default::default(),
        "returning",
    )
    .await?;
    submit(
        &cluster.master,
        model_pb::Job {
            name: "web".into(),
            scheduler: model_pb::SchedulerType::Service as i32,
            groups: vec![group("server", 2, 1.0, "sleep", &["30"])],
            ..model_pb::Job::default()
        },
    )
    .await?;
    let launch = tokio::time::timeout(DEADLINE, cluster.launched.recv())
        .await?
        .context("a launch")?;
    let tasks: Vec<model_pb::Task> = launch.tasks.iter().filter_map(|r| r.task.clone()).collect();
    let [reported, late] = tasks.as_slice() else {
        bail!("expected both tasks in one launch: {tasks:?}");
    };
    let to_master = cluster.node.remote(cluster.master_upid.clone());
    for task in [reported, late] {
        let mut running = task.clone();
        running.state = model_pb::TaskState::Running as i32;
        to_master.tell(pb::TaskStatusUpdate {
            agent_id: cluster.agent_id.clone(),
            task: Some(running),
        })?;
    }
    // The stand-in never heartbeats: it is marked unreachable.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let state = cluster
            .master
            .pid()
            .ask(|reply| GetState { reply }.into())
            .await?;
        if state.unreachable.iter().any(|a| a.id == cluster.agent_id) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the stand-in was not marked unreachable"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Back, running one of the two.
    let info = model_pb::AgentInfo {
        hostname: "returning".into(),
        address: format!("agent@{}", cluster.node.address()),
        resources: Some(model_pb::Resources {
            cpus: 4.0,
            mem_mb: 4096,
        }),
        ..model_pb::AgentInfo::default()
    };
    let mut still_running = reported.clone();
    still_running.state = model_pb::TaskState::Running as i32;
    let answer = to_master
        .ask_timeout::<pb::ReregisterAgent, pb::RegistrationReply>(
            DEADLINE,
            pb::ReregisterAgent {
                agent_id: cluster.agent_id.clone(),
                info: Some(info),
                tasks: vec![still_running],
                ..pb::ReregisterAgent::default()
            },
        )
        .await?;
    // It is the only agent: nothing could replace its tasks, so the one it still runs is
    // kept (killing it would leave the job below its count), not killed.
    assert!(answer.kill_tasks.is_empty(), "{answer:?}");
    let kept = job_when(&cluster.master, "web", "the returning task kept", |s| {
        live(s)
            .iter()
            .any(|t| t.task.as_ref().is_some_and(|t| t.id == reported.id))
    })
    .await?;
    assert!(
        live(&kept)
            .iter()
            .all(|t| t.task.as_ref().is_none_or(|t| t.id != late.id)),
        "the task it did not report is not live: {kept:?}"
    );

    // The other one, not reported when the agent came back, reports in later: a start it had
    // given up on is killed as soon as it reports in.
    let mut started_late = late.clone();
    started_late.state = model_pb::TaskState::Running as i32;
    to_master.tell(pb::TaskStatusUpdate {
        agent_id: cluster.agent_id.clone(),
        task: Some(started_late),
    })?;
    let kill = tokio::time::timeout(DEADLINE, cluster.killed.recv())
        .await?
        .context("a kill of the late task")?;
    assert_eq!(kill.task_id, late.id);
    cluster.shutdown().await;
    Ok(())
}

fn one_batch_step(args: &[&str]) -> model_pb::Job {
    model_pb::Job {
        name: "etl".into(),
        scheduler: model_pb::SchedulerType::Batch as i32,
        groups: vec![group("step", 1, 1.0, "sleep", args)],
        ..model_pb::Job::default()
    }
}

/// Waits until every evaluation of `job` has ended (none pending or blocked).
async fn evaluations_settled(master: &MasterServer, job: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let evals = list_evals(master, job, 100).await?;
        let open = [
            model_pb::EvalStatus::Pending as i32,
            model_pb::EvalStatus::Blocked as i32,
        ];
        if !evals.evals.iter().any(|e| open.contains(&e.status)) {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "evaluations of {job} still open: {evals:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Tells the master, as the stand-in agent, that `task` is now in `state`.
fn report(
    cluster: &StandInCluster,
    task: &model_pb::Task,
    state: model_pb::TaskState,
) -> anyhow::Result<()> {
    let mut task = task.clone();
    task.state = state as i32;
    cluster
        .node
        .remote(cluster.master_upid.clone())
        .tell(pb::TaskStatusUpdate {
            agent_id: cluster.agent_id.clone(),
            task: Some(task),
        })?;
    Ok(())
}

/// An update of a batch job stops its running task, and places the slot anew only once the
/// task's end is reported: a task that finished before the kill reached it (reported as such,
/// or the kill answered "already finished") ran to completion and is not run again; one the
/// kill stopped is replaced at the new version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_updated_batch_slot_is_placed_anew_only_if_its_task_did_not_finish_first()
-> anyhow::Result<()> {
    for ending in ["reported finished", "kill answered finished", "killed"] {
        let answers = match ending {
            "kill answered finished" => [KillAnswer::AlreadyFinished].into(),
            _ => Default::default(),
        };
        let mut cluster = StandInCluster::start(|config| config, answers, "batch").await?;
        submit(&cluster.master, one_batch_step(&["30"])).await?;
        let first = cluster.next_launched_task().await?;
        report(&cluster, &first, model_pb::TaskState::Running)?;
        job_when(&cluster.master, "etl", "the step running", |s| {
            s.tasks
                .iter()
                .filter_map(|t| t.task.as_ref())
                .any(|t| t.id == first.id && t.state == model_pb::TaskState::Running as i32)
        })
        .await?;

        submit(&cluster.master, one_batch_step(&["31"])).await?;
        let kill = tokio::time::timeout(DEADLINE, cluster.killed.recv())
            .await?
            .context("the kill of the outdated step")?;
        assert_eq!(kill.task_id, first.id, "{ending}");
        evaluations_settled(&cluster.master, "etl").await?;
        assert!(
            cluster.launched.try_recv().is_err(),
            "{ending}: nothing placed while the outdated step's end is unknown"
        );

        match ending {
            "reported finished" => report(&cluster, &first, model_pb::TaskState::Finished)?,
            "killed" => report(&cluster, &first, model_pb::TaskState::Killed)?,
            _ => {}
        }
        if ending == "killed" {
            let second = cluster.next_launched_task().await?;
            assert_eq!(second.name, first.name, "the same slot, placed anew");
            assert_eq!(second.args, ["31"], "at the new version");
        } else {
            let status = job_when(&cluster.master, "etl", "the step finished", |s| {
                s.tasks
                    .iter()
                    .filter_map(|t| t.task.as_ref())
                    .any(|t| t.id == first.id && t.state == model_pb::TaskState::Finished as i32)
            })
            .await?;
            assert!(live(&status).is_empty(), "{ending}: {status:#?}");
            // A RUNNING the agent sent before the end, arriving after it (the answer to a kill
            // travels apart from status updates), does not bring the task back. A second
            // registration over the same link, answered, shows the report was handled.
            report(&cluster, &first, model_pb::TaskState::Running)?;
            register_stand_in(&cluster.node, &cluster.master_upid, "witness").await?;
            let status = job_when(&cluster.master, "etl", "the status", |_| true).await?;
            assert!(
                live(&status).is_empty(),
                "{ending}: a late RUNNING revived the ended step: {status:#?}"
            );
            evaluations_settled(&cluster.master, "etl").await?;
            assert!(
                cluster.launched.try_recv().is_err(),
                "{ending}: a step that finished first is not run again"
            );
        }
        cluster.shutdown().await;
    }
    Ok(())
}
