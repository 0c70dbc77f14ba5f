//! Named schedulers on one cluster: a real master whose own workers serve the built-in
//! schedulers, a real agent, and a remote worker in the test serving `gang` over the
//! scheduling API (TLS and a token whose policy names `gang` only). Each handles only its own
//! jobs; with the remote one stopped, its jobs wait and say why (the evaluation list, the
//! metrics); started again, it places them.

use std::time::Duration;

use anyhow::{bail, ensure};
use muster_master::requests::GetMetrics;
use muster_master::testing::{self, TestOperator};
use muster_master::{MasterConfig, MasterServer};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_proto::scheduling as spb;
use muster_proto::scheduling::scheduling_client::SchedulingClient;
use muster_scheduler::{Backend, RemoteBackend, Worker, WorkerConfig, WorkerStats};
use muster_security::TokenSecret;
use muster_security::guard::WithToken;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::common::{self, agent_config, member_config};

const DEADLINE: Duration = Duration::from_secs(30);

/// A job of one group of `count` small tasks, planned by `scheduler` (empty: the built-in one).
fn job(name: &str, scheduler: &str, count: u32) -> model_pb::Job {
    model_pb::Job {
        name: name.into(),
        scheduler: model_pb::SchedulerType::Service as i32,
        scheduler_name: scheduler.into(),
        groups: vec![model_pb::TaskGroup {
            name: "g".into(),
            count,
            resources: Some(model_pb::Resources {
                cpus: 0.1,
                mem_mb: 16,
            }),
            command: "sleep".into(),
            args: vec!["60".into()],
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    }
}

/// A remote worker serving `gang` only, placing with the built-in binpack.
fn gang_worker(backend: &RemoteBackend) -> (watch::Sender<bool>, JoinHandle<WorkerStats>) {
    let (stop, stopped) = watch::channel(false);
    let config = WorkerConfig {
        dequeue_timeout: Duration::from_millis(200),
        error_backoff: Duration::from_millis(50),
        ..WorkerConfig::serving(["gang"])
    };
    let worker = Worker::new(backend.clone(), muster_scheduler::binpack(), config);
    (stop, tokio::spawn(worker.run(stopped)))
}

async fn running(master: &MasterServer, name: &str, count: usize) -> anyhow::Result<()> {
    common::job_runs(master, name, count).await.map(drop)
}

/// Polls the evaluation list until job `name`'s newest evaluation says `words`.
async fn eval_says(admin: &mut TestOperator, name: &str, words: &str) -> anyhow::Result<String> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let list = admin
            .list_evaluations(pb::ListEvaluationsRequest {
                job: name.into(),
                ..pb::ListEvaluationsRequest::default()
            })
            .await?
            .into_inner();
        let said = list
            .evals
            .first()
            .map(|e| e.status_description.clone())
            .unwrap_or_default();
        if said.contains(words) {
            return Ok(said);
        }
        if Instant::now() > deadline {
            bail!("the evaluation of {name} says {said:?}, not {words:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn built_in_and_named_schedulers_each_place_only_their_own_jobs() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = MasterConfig {
        workers: 1,
        scheduler_gone_after: Duration::from_millis(300),
        ..member_config(1, &Default::default(), dir.path())
    };
    let master = testing::start_leading(config).await?;
    let (_node, agent, _) = common::start_agent(
        "only",
        agent_config(
            vec![master.address().to_owned()],
            dir.path(),
            "only",
            (4.0, 1024),
        ),
    )
    .await?;
    let root = testing::bootstrap(master.address()).await?;
    let mut admin = testing::operator(master.address(), Some(&root)).await?;
    admin
        .apply_policy(pb::AclPolicy {
            name: "gang-scheduler".into(),
            rules: "[scheduler]\nnamespaces = [\"*\"]\nnames = [\"gang\"]\n".into(),
            ..pb::AclPolicy::default()
        })
        .await?;
    let gang_token =
        testing::create_token(master.address(), &root, "gang", "gang-scheduler").await?;

    // A built-in job runs at once; the gang job waits, saying nobody serves `gang`.
    testing::submit(&master, job("web", "", 2)).await?;
    testing::submit(&master, job("train", "gang", 3)).await?;
    running(&master, "web", 2).await?;
    let said = eval_says(&mut admin, "train", "no scheduler \"gang\"").await?;
    ensure!(said.contains("has connected to this leader"), "{said}");
    ensure!(
        testing::job_status(&master, "train")
            .await?
            .tasks
            .is_empty()
    );

    // Its token may serve `gang` and nothing else.
    let mut client = SchedulingClient::with_interceptor(
        testing::channel(master.address(), &testing::client_security()).await?,
        WithToken::new(Some(&gang_token))?,
    );
    let refused = client
        .dequeue(spb::DequeueRequest {
            scheduler_names: vec!["service".into()],
            timeout_ms: 10,
            ..spb::DequeueRequest::default()
        })
        .await
        .expect_err("the gang token may not serve the built-in service scheduler");
    ensure!(
        refused.code() == tonic::Code::PermissionDenied,
        "{refused:?}"
    );
    ensure!(refused.message().contains("\"service\""), "{refused:?}");
    let backend = remote(&master, &gang_token)?;
    let no_name = backend
        .dequeue(&["not a name".to_owned()], Duration::ZERO)
        .await;
    ensure!(
        format!("{no_name:?}").contains("scheduler_names[0]"),
        "{no_name:?}"
    );

    // The remote scheduler places the gang job, and only it.
    let (stop, worker) = gang_worker(&backend);
    running(&master, "train", 3).await?;
    let _ = stop.send(true);
    let stats = worker.await?;
    ensure!(stats.placements_committed == 3, "{stats:?}");

    // Gone, its next job waits and says since when; the metrics say `gang` is not served.
    testing::submit(&master, job("train-2", "gang", 1)).await?;
    eval_says(
        &mut admin,
        "train-2",
        "no scheduler \"gang\" connected since",
    )
    .await?;
    let metrics = muster_master::metrics::render(master.pid()).await?;
    ensure!(
        metrics.contains("muster_scheduler_served{scheduler=\"gang\"} 0"),
        "{metrics}"
    );
    ensure!(
        metrics.contains("muster_broker_evaluations{scheduler=\"gang\",state=\"ready\"} 1"),
        "{metrics}"
    );
    ensure!(
        master
            .pid()
            .ask(|reply| GetMetrics { reply }.into())
            .await?
            .is_leader
    );

    // With its scheduler gone, a gang job can still be stopped: the stop goes to the built-in
    // scheduler, and its tasks end.
    admin
        .stop_job(pb::StopJobRequest {
            name: "train".into(),
            ..pb::StopJobRequest::default()
        })
        .await?;
    common::job_runs(&master, "train", 0).await?;

    // Back, it places it; the built-in job was never its to touch.
    let (stop, worker) = gang_worker(&backend);
    running(&master, "train-2", 1).await?;
    let _ = stop.send(true);
    let stats = worker.await?;
    ensure!(stats.placements_committed == 1, "{stats:?}");
    ensure!(
        testing::job_status(&master, "web").await?.tasks.len() == 2,
        "the built-in job kept its tasks"
    );

    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

/// A backend reaching `master` with `token`.
fn remote(master: &MasterServer, token: &TokenSecret) -> anyhow::Result<RemoteBackend> {
    Ok(RemoteBackend::connect(
        vec![master.address().to_owned()],
        testing::client_security(),
        Some(token.clone()),
    )?)
}
