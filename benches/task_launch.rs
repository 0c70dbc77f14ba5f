//! What starting a task on an agent costs, from `RunTask` to the agent's answer (the task has
//! exec'd under its executor, in its cgroup, as its user, and is checkpointed), against the
//! floor of the same shape in the same run:
//!
//! - `agent_run_task`: a real agent on a TLS node (cgroups where the machine allows), asked
//!   locally to run `true`, one task after another;
//! - `raw_spawn`: `tokio::process::Command::new("true").spawn()`, which returns once the child
//!   has exec'd.
//!
//! The children are reaped outside the timed part. Run with
//! `cargo bench --bench task_launch`.

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use muster::actor::{Node, System};
use muster::agent::{AgentConfig, AgentMsg};
use muster::proto::cluster::{Framework, RunTask, RunTaskReply};
use muster::proto::model::Task;
use muster_security::Role;
use muster_security::testing::TestPki;

fn run_true(id: u64) -> RunTask {
    RunTask {
        framework: Some(Framework {
            id: "bench".into(),
            name: "bench".into(),
        }),
        task: Some(Task {
            id: format!("true-{id}"),
            command: "true".into(),
            ..Task::default()
        }),
        term: 0,
    }
}

fn task_launch(c: &mut Criterion) {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => panic!("no tokio runtime: {e}"),
    };
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => panic!("no temporary directory: {e}"),
    };
    let (system, node, agent) = runtime.block_on(async {
        let system = System::new();
        let node = Node::bind(
            &system,
            "127.0.0.1:0",
            TestPki::shared().security(Role::Agent, "bench-agent"),
        )
        .await
        .unwrap_or_else(|e| panic!("cannot bind: {e}"));
        // No master answers: the agent keeps its updates; the launches are what is measured.
        let mut config = AgentConfig::new(vec!["127.0.0.1:9".into()], dir.path());
        config.completed_task_history = 100;
        let agent = muster::agent::start(&node, config)
            .await
            .unwrap_or_else(|e| panic!("cannot start the agent: {e}"));
        (system, node, agent)
    });

    let mut group = c.benchmark_group("task_launch");
    group.measurement_time(Duration::from_secs(10));
    let mut next_id = 0_u64;
    group.bench_function("agent_run_task", |b| {
        b.to_async(&runtime).iter_custom(|iters| {
            let pid = agent.pid().clone();
            let first = next_id;
            next_id += iters;
            async move {
                let mut spent = Duration::ZERO;
                for id in first..first + iters {
                    let started = Instant::now();
                    let reply: Result<RunTaskReply, _> = pid
                        .ask(|reply| AgentMsg::run_task(run_true(id), reply))
                        .await;
                    spent += started.elapsed();
                    match reply {
                        Ok(reply) if reply.error.is_empty() => {}
                        Ok(reply) => panic!("task refused: {}", reply.error),
                        Err(e) => panic!("agent gone: {e}"),
                    }
                }
                spent
            }
        });
    });
    group.bench_function("raw_spawn", |b| {
        b.to_async(&runtime).iter_custom(|iters| async move {
            let mut spent = Duration::ZERO;
            let mut children = Vec::with_capacity(iters as usize);
            for _ in 0..iters {
                let started = Instant::now();
                let child = tokio::process::Command::new("true")
                    .spawn()
                    .unwrap_or_else(|e| panic!("cannot spawn: {e}"));
                spent += started.elapsed();
                children.push(child);
            }
            for mut child in children {
                let _ = child.wait().await;
            }
            spent
        });
    });
    group.finish();
    runtime.block_on(async {
        agent.stop().await;
        node.shutdown();
        system.shutdown().await;
    });
}

criterion_group!(benches, task_launch);
criterion_main!(benches);
