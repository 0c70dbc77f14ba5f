//! Jobs scheduled end to end in one test process: a real master with its scheduler workers,
//! real agents on their own nodes running real child processes. A job too big for the cluster
//! places what fits and blocks; an agent joining releases the blocked evaluation and the rest
//! is placed. A batch job runs to completion and reports its exit.
//!
//! The master against a stand-in agent that only records what it is sent is in `stand_in`.

use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use muster_actor::System;
use muster_master::requests::{GetMetrics, GetState, ListEvaluations, ListJobs, StopJob};
use muster_master::testing::{self, job_when, submit};
use muster_master::{MasterConfig, MasterServer};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_transport::Node;
use tokio::time::Instant;

use crate::common::{
    agent_node, master_config, master_upid, playing_many_agents, register_played, start_master,
    start_pinnable_agent, trigger_of,
};

mod stand_in;

const DEADLINE: Duration = Duration::from_secs(30);

fn group(name: &str, count: u32, cpus: f64, command: &str, args: &[&str]) -> model_pb::TaskGroup {
    model_pb::TaskGroup {
        name: name.into(),
        count,
        resources: Some(model_pb::Resources { cpus, mem_mb: 64 }),
        command: command.into(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        ..model_pb::TaskGroup::default()
    }
}

fn live(status: &pb::JobStatusReply) -> Vec<&pb::JobTask> {
    let ended = [
        model_pb::TaskState::Finished as i32,
        model_pb::TaskState::Failed as i32,
        model_pb::TaskState::Killed as i32,
        model_pb::TaskState::Lost as i32,
    ];
    status
        .tasks
        .iter()
        .filter(|t| t.task.as_ref().is_some_and(|t| !ended.contains(&t.state)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_too_big_blocks_and_an_agent_joining_unblocks_it() -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let dir = tempfile::tempdir()?;
    let master = start_master(dir.path()).await?;
    let (_first_node, first, _) =
        start_pinnable_agent(&master, dir.path(), "first", (2.0, 1024)).await?;

    submit(&master, three_servers()).await?;
    let blocked = job_when(
        &master,
        "web",
        "two tasks placed and the rest blocked",
        |s| {
            live(s).len() == 2
                && s.evals
                    .iter()
                    .any(|e| e.status == model_pb::EvalStatus::Blocked as i32)
        },
    )
    .await?;
    let (first_id, _) = first.registered().await?;
    assert!(live(&blocked).iter().all(|t| t.agent_id == first_id));
    // The job list counts what it asks and its evaluation still to do.
    let list = list_jobs(&master, "").await?;
    let [web] = &list.jobs[..] else {
        bail!("one job listed: {list:?}");
    };
    assert_eq!((web.name.as_str(), web.desired), ("web", 3));
    assert_eq!(web.evals_in_flight, 1, "the blocked evaluation");
    assert!(list_jobs(&master, "nomatch").await?.jobs.is_empty());

    // A second agent joins: the blocked evaluation is released and the third task placed there.
    let (_second_node, second, _) =
        start_pinnable_agent(&master, dir.path(), "second", (2.0, 1024)).await?;
    let (second_id, _) = second.registered().await?;
    let placed = job_when(&master, "web", "the third task placed", |s| {
        live(s).len() == 3
    })
    .await?;
    assert_eq!(
        live(&placed)
            .iter()
            .filter(|t| t.agent_id == second_id)
            .count(),
        1
    );
    let mut names: Vec<String> = live(&placed)
        .iter()
        .filter_map(|t| t.task.as_ref().map(|t| t.name.clone()))
        .collect();
    names.sort();
    assert_eq!(names, ["web.server[0]", "web.server[1]", "web.server[2]"]);

    // The agents really run them.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let running = first.snapshot().await?.tasks.len() + second.snapshot().await?.tasks.len();
        if running == 3 {
            break;
        }
        if Instant::now() > deadline {
            bail!("the agents run {running} tasks, not 3");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deadline = Instant::now() + DEADLINE;
    loop {
        let list = list_jobs(&master, "we").await?;
        let web = list.jobs.first().context("web listed")?;
        if web.running == 3 {
            assert_eq!(web.evals_in_flight, 0, "{web:?}");
            assert_eq!(
                web.staging + web.starting + web.failed + web.lost,
                0,
                "{web:?}"
            );
            break;
        }
        if Instant::now() > deadline {
            bail!("the list never counted 3 running: {web:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Its evaluations, newest first (the blocked one was released, not replaced; a second
    // submission makes another); a limit keeps the newest and says how many there are.
    submit(&master, three_servers()).await?;
    let all = list_evals(&master, "web", 0).await?;
    assert_eq!(all.total, 2, "{all:?}");
    let indexes: Vec<u64> = all.evals.iter().map(|e| e.create_index).collect();
    assert!(indexes.windows(2).all(|w| w[0] >= w[1]), "{indexes:?}");
    let newest = list_evals(&master, "web", 1).await?;
    assert_eq!(newest.evals.len(), 1);
    assert_eq!(newest.total, all.total);
    assert_eq!(newest.evals[0].id, all.evals[0].id);
    assert!(list_evals(&master, "other", 0).await?.evals.is_empty());

    first.stop().await;
    second.stop().await;
    master.shutdown().await;
    Ok(())
}

/// A service job `web` of three `sleep 30` tasks of one CPU each.
fn three_servers() -> model_pb::Job {
    model_pb::Job {
        name: "web".into(),
        scheduler: model_pb::SchedulerType::Service as i32,
        groups: vec![group("server", 3, 1.0, "sleep", &["30"])],
        ..model_pb::Job::default()
    }
}

async fn list_jobs(master: &MasterServer, prefix: &str) -> anyhow::Result<pb::JobList> {
    let request = pb::ListJobsRequest {
        stale: false,
        prefix: prefix.into(),
        namespace: String::new(),
    };
    master
        .pid()
        .ask(|reply| {
            ListJobs {
                request,
                namespaces: muster_master::visibility::NamespaceFilter::All,
                reply,
            }
            .into()
        })
        .await?
        .map_err(anyhow::Error::msg)
}

async fn list_evals(
    master: &MasterServer,
    job: &str,
    limit: u32,
) -> anyhow::Result<pb::EvaluationList> {
    let request = pb::ListEvaluationsRequest {
        stale: false,
        job: job.into(),
        limit,
        id: String::new(),
        namespace: String::new(),
    };
    master
        .pid()
        .ask(|reply| {
            ListEvaluations {
                request,
                namespaces: muster_master::visibility::NamespaceFilter::All,
                reply,
            }
            .into()
        })
        .await?
        .map_err(anyhow::Error::msg)
}

fn state_of(task: &pb::JobTask) -> i32 {
    task.task.as_ref().map_or(0, |t| t.state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_tasks_finish_failed_service_tasks_are_replaced_and_stop_kills() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let master = start_master(dir.path()).await?;
    let (_node, agent, _) = start_pinnable_agent(&master, dir.path(), "only", (4.0, 1024)).await?;

    // A batch task runs to completion, and the agent's report reaches the master.
    submit(
        &master,
        model_pb::Job {
            name: "once".into(),
            scheduler: model_pb::SchedulerType::Batch as i32,
            groups: vec![group("run", 1, 0.5, "sh", &["-c", "exit 0"])],
            ..model_pb::Job::default()
        },
    )
    .await?;
    let finished = job_when(&master, "once", "the batch task finishing", |s| {
        s.tasks.len() == 1
            && s.tasks
                .iter()
                .all(|t| state_of(t) == model_pb::TaskState::Finished as i32)
    })
    .await?;
    assert_eq!(
        finished.tasks[0].task.as_ref().map(|t| t.exit_code),
        Some(0)
    );

    // A service task that fails is replaced by a new task in the same slot.
    submit(
        &master,
        model_pb::Job {
            name: "flaky".into(),
            scheduler: model_pb::SchedulerType::Service as i32,
            groups: vec![group("svc", 1, 0.5, "sh", &["-c", "exit 3"])],
            ..model_pb::Job::default()
        },
    )
    .await?;
    let replaced = job_when(&master, "flaky", "a failed task replaced", |s| {
        s.tasks
            .iter()
            .filter(|t| state_of(t) == model_pb::TaskState::Failed as i32)
            .count()
            >= 2
    })
    .await?;
    assert!(
        replaced
            .evals
            .iter()
            .any(|e| trigger_of(e).starts_with("TaskEnded"))
    );
    let ids: std::collections::BTreeSet<&str> = replaced
        .tasks
        .iter()
        .filter_map(|t| t.task.as_ref().map(|t| t.id.as_str()))
        .collect();
    assert_eq!(
        ids.len(),
        replaced.tasks.len(),
        "every replacement has a fresh id"
    );
    // It keeps failing: the replacement after the second failure in a row is held back
    // (10 s by default, doubling after that) instead of restarting it at once.
    let backing_off = job_when(&master, "flaky", "a held-back replacement", |s| {
        s.evals
            .iter()
            .any(|e| e.status_description.contains("ended 2 times in a row"))
    })
    .await?;
    let held = backing_off
        .evals
        .iter()
        .find(|e| e.status_description.contains("ended 2 times in a row"))
        .context("the held-back evaluation")?;
    assert!(
        held.status_description.contains("replaced after 10s")
            && trigger_of(held).starts_with("TaskEnded"),
        "{held:?}"
    );
    master
        .pid()
        .ask(|reply| {
            StopJob {
                name: "flaky".into(),
                reply,
            }
            .into()
        })
        .await?
        .map_err(anyhow::Error::msg)?;

    // Stopping a job kills its running tasks.
    submit(
        &master,
        model_pb::Job {
            name: "sleepy".into(),
            scheduler: model_pb::SchedulerType::Service as i32,
            groups: vec![group("nap", 2, 0.5, "sleep", &["30"])],
            ..model_pb::Job::default()
        },
    )
    .await?;
    job_when(&master, "sleepy", "two tasks running", |s| {
        s.tasks
            .iter()
            .filter(|t| state_of(t) == model_pb::TaskState::Running as i32)
            .count()
            == 2
    })
    .await?;
    master
        .pid()
        .ask(|reply| {
            StopJob {
                name: "sleepy".into(),
                reply,
            }
            .into()
        })
        .await?
        .map_err(anyhow::Error::msg)?;
    job_when(&master, "sleepy", "both tasks killed", |s| {
        s.stopped
            && s.tasks.len() == 2
            && s.tasks
                .iter()
                .all(|t| state_of(t) == model_pb::TaskState::Killed as i32)
    })
    .await?;
    let deadline = Instant::now() + DEADLINE;
    while !agent.snapshot().await?.tasks.is_empty() {
        if Instant::now() > deadline {
            bail!("the agent still runs the stopped job's tasks");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_agents_tasks_are_rescheduled_elsewhere() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = testing::start_leading(MasterConfig {
        // Agents stay connected by heartbeating (at half their TTL); short TTLs so that the
        // lost one is noticed quickly, with room for a loaded machine (at 500 ms each the
        // survivor was once marked lost too while the machine was busy).
        heartbeat_min_ttl: Duration::from_secs(2),
        heartbeat_grace: Duration::from_secs(2),
        placement: muster_master::Placement::Spread,
        ..master_config(dir.path())
    })
    .await?;
    let (doomed_node, doomed, _) =
        start_pinnable_agent(&master, dir.path(), "doomed", (2.0, 1024)).await?;
    let (_node, survivor, _) =
        start_pinnable_agent(&master, dir.path(), "survivor", (2.0, 1024)).await?;
    let (doomed_id, _) = doomed.registered().await?;
    let (survivor_id, _) = survivor.registered().await?;

    submit(
        &master,
        model_pb::Job {
            name: "api".into(),
            scheduler: model_pb::SchedulerType::Service as i32,
            groups: vec![group("server", 2, 0.5, "sleep", &["30"])],
            ..model_pb::Job::default()
        },
    )
    .await?;
    // Spread: one task on each agent.
    job_when(&master, "api", "one task on each agent", |s| {
        let on = |agent: &str| live(s).iter().filter(|t| t.agent_id == agent).count();
        on(&doomed_id) == 1 && on(&survivor_id) == 1
    })
    .await?;

    // The doomed agent's node goes away: it misses its heartbeats, is marked unreachable with an
    // evaluation for the job in the same write, and its task is placed on the survivor.
    doomed.stop().await;
    doomed_node.shutdown();
    let rescheduled = job_when(&master, "api", "the lost task placed again", |s| {
        live(s).iter().filter(|t| t.agent_id == survivor_id).count() == 2
    })
    .await?;
    assert!(
        rescheduled
            .evals
            .iter()
            .any(|e| trigger_of(e).contains("AgentUnreachable")),
        "{:?}",
        rescheduled.evals
    );
    let state = master.pid().ask(|reply| GetState { reply }.into()).await?;
    assert_eq!(
        state
            .unreachable
            .iter()
            .map(|a| a.id.as_str())
            .collect::<Vec<_>>(),
        [doomed_id.as_str()]
    );

    survivor.stop().await;
    master.shutdown().await;
    Ok(())
}

/// Registers a stand-in agent served by `node` (as `agent@{node}`, 4 cpus, 4 GiB) with the
/// master at `master`; returns its id and the info it registered with.
async fn register_stand_in(
    node: &Node,
    master: &muster_actor::Upid,
    hostname: &str,
) -> anyhow::Result<(String, model_pb::AgentInfo)> {
    let info = model_pb::AgentInfo {
        hostname: hostname.into(),
        address: format!("agent@{}", node.address()),
        resources: Some(model_pb::Resources {
            cpus: 4.0,
            mem_mb: 4096,
        }),
        ..model_pb::AgentInfo::default()
    };
    let agent_id = register_played(node, master, info.clone(), DEADLINE).await?;
    Ok((agent_id, info))
}

/// A service job `web` of one `sleep 30` task.
fn one_sleeper() -> model_pb::Job {
    model_pb::Job {
        name: "web".into(),
        scheduler: model_pb::SchedulerType::Service as i32,
        groups: vec![group("server", 1, 1.0, "sleep", &["30"])],
        ..model_pb::Job::default()
    }
}

/// An agent that re-registers without a task the master launched on it (the one-way launch
/// was lost, or the agent lost its state): the task is LOST and the job gets a replacement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launched_task_the_agent_does_not_report_is_lost_and_replaced() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = start_master(dir.path()).await?;
    let master_upid = master_upid(&master)?;
    // A stand-in agent: a node with no process behind the agent's name, so every launch sent
    // to it is lost on arrival.
    let node = agent_node(&System::new(), "agent-1").await?;
    let (agent_id, info) = register_stand_in(&node, &master_upid, "forgetful").await?;

    submit(&master, one_sleeper()).await?;
    let staged = job_when(&master, "web", "the task staged", |s| live(s).len() == 1).await?;
    let first = live(&staged)[0]
        .task
        .as_ref()
        .map(|t| t.id.clone())
        .context("a task")?;

    // It comes back (say after a lost link) running nothing.
    let reregistered = node
        .remote(master_upid)
        .ask_timeout::<pb::ReregisterAgent, pb::RegistrationReply>(
            DEADLINE,
            pb::ReregisterAgent {
                agent_id: agent_id.clone(),
                info: Some(info),
                ..pb::ReregisterAgent::default()
            },
        )
        .await?;
    anyhow::ensure!(
        matches!(
            reregistered.result,
            Some(pb::registration_reply::Result::AgentId(_))
        ),
        "re-registration refused: {reregistered:?}"
    );
    let replaced = job_when(&master, "web", "the lost task replaced", |s| {
        let lost = s.tasks.iter().any(|t| {
            t.task
                .as_ref()
                .is_some_and(|t| t.id == first && t.state == model_pb::TaskState::Lost as i32)
        });
        lost && live(s).len() == 1
    })
    .await?;
    let lost = replaced
        .tasks
        .iter()
        .filter_map(|t| t.task.as_ref())
        .find(|t| t.id == first)
        .context("the lost task")?;
    assert!(
        lost.message.contains("did not report"),
        "{:?}",
        lost.message
    );
    let replacement = live(&replaced)[0].task.as_ref().context("a task")?;
    assert_ne!(replacement.id, first, "a new task replaces it");
    assert!(
        replaced
            .evals
            .iter()
            .any(|e| trigger_of(e).contains("TaskEnded")),
        "{:?}",
        replaced.evals
    );
    node.shutdown();
    master.shutdown().await;
    Ok(())
}

/// Resubmitting a job replaces the tasks of the groups whose definition changed (Nomad's
/// destructive update) and only those: a count change alone adds tasks beside the running ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_updated_group_has_its_tasks_replaced_and_only_that_group() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = start_master(dir.path()).await?;
    let (_node, agent, _) = start_pinnable_agent(&master, dir.path(), "only", (4.0, 1024)).await?;
    let spec = |a_count: u32, b_args: &[&str]| model_pb::Job {
        name: "site".into(),
        scheduler: model_pb::SchedulerType::Service as i32,
        groups: vec![
            group("a", a_count, 0.5, "sleep", &["30"]),
            group("b", 1, 0.5, "sleep", b_args),
        ],
        ..model_pb::Job::default()
    };
    let in_group =
        |task: &model_pb::Task, group: &str| task.name.starts_with(&format!("site.{group}["));
    let running = |s: &pb::JobStatusReply, group: &str| -> Vec<model_pb::Task> {
        s.tasks
            .iter()
            .filter_map(|t| t.task.as_ref())
            .filter(|t| in_group(t, group) && t.state == model_pb::TaskState::Running as i32)
            .cloned()
            .collect()
    };

    submit(&master, spec(1, &["30"])).await?;
    let first = job_when(&master, "site", "both groups running", |s| {
        running(s, "a").len() == 1 && running(s, "b").len() == 1
    })
    .await?;
    let a_id = running(&first, "a")[0].id.clone();
    let b_id = running(&first, "b")[0].id.clone();

    // `a` unchanged but for its count, `b`'s arguments changed.
    submit(&master, spec(2, &["31"])).await?;
    let is_live = |s: &pb::JobStatusReply, id: &str| {
        live(s)
            .iter()
            .any(|t| t.task.as_ref().is_some_and(|t| t.id == id))
    };
    let updated = job_when(&master, "site", "b replaced and a second a placed", |s| {
        let b_killed = s
            .tasks
            .iter()
            .filter_map(|t| t.task.as_ref())
            .any(|t| t.id == b_id && t.state == model_pb::TaskState::Killed as i32);
        let new_b = running(s, "b");
        b_killed
            && is_live(s, &a_id)
            && live(s).len() == 3
            && new_b.len() == 1
            && new_b[0].id != b_id
    })
    .await?;
    let new_b = &running(&updated, "b")[0];
    assert_eq!(
        new_b.args,
        ["31"],
        "the replacement runs the new definition"
    );
    let live_a: Vec<&model_pb::Task> = live(&updated)
        .iter()
        .filter_map(|t| t.task.as_ref())
        .filter(|t| in_group(t, "a"))
        .collect();
    assert_eq!(live_a.len(), 2, "{live_a:?}");
    assert!(
        updated
            .tasks
            .iter()
            .filter_map(|t| t.task.as_ref())
            .filter(|t| in_group(t, "a"))
            .all(|t| t.state != model_pb::TaskState::Killed as i32),
        "a count change restarts nothing: {:#?}",
        updated.tasks
    );

    agent.stop().await;
    master.shutdown().await;
    Ok(())
}
