//! The evaluation storm of HashiCorp's post "Load shedding in the Nomad eval broker", on the real
//! master.
//!
//! `storm`: 5,000 agents and 10 system jobs. The jobs are submitted and the agents register
//! while no scheduler worker runs, so every registration queues one evaluation per system job:
//! about 50,000 pending evaluations. Then 2 workers (binpack, in the master's process) start,
//! and the clock runs until the broker is empty (nothing ready, unacked, pending or
//! cancelable: every cancellation written). The first evaluation of each job places its task
//! on all 5,000 agents; on its ack the job's other ~4,999 evaluations but the newest become
//! cancelable and are written in batches; the newest finds nothing to do.
//!
//! The agents are 5,000 processes of this program on one `Node`, reached by the master over
//! the real transport: they accept every task. The registry is a real single-member raft group
//! on sled. Printed per run (eprintln): evaluations the schedulers dequeued (scheduler runs),
//! runs per job, and raft entries written during the drain. Targets: at most 2 scheduler runs
//! per job, cancellation entries in the tens (Nomad 1.4.3: +128 entries), drained in under
//! 1 s (Nomad: about 90 s).
//!
//! Baseline `channel_drain`, same run: the same number of evaluations through a tokio channel
//! to 2 consumer tasks that only count them — the floor of moving that many evaluations.
//!
//! `lost_agents` (in `broker/lost_agents.rs`): 500 of 5,000 agents, each running 20 tasks of
//! service jobs and one of each of 100 system jobs, miss their heartbeats at once.
//!
//! Run with `cargo bench --bench broker` (about 8 minutes: the second scenario waits out a
//! failover TTL per iteration), or one scenario with `cargo bench --bench broker -- storm`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use futures_util::future::join_all;
use muster::actor::{Context, Node, Pid, Process, Reply, System};
use muster::master::requests::{GetMetrics, GetSchedulingPids, RegisterAgent, SubmitJob};
use muster::master::{LocalBackend, MasterConfig, MasterServer};
use muster::model::{EvalStatus, Evaluation, Job, SchedulerType, Trigger};
use muster::proto::cluster as pb;
use muster::proto::model as model_pb;
use muster_broker::{BrokerMsg, BrokerStats};
use muster_scheduler::WorkerConfig;
use muster_security::Role;
use muster_security::testing::TestPki;
use tokio::runtime::Runtime;
use tokio::sync::mpsc;

/// The allocator Muster's binaries use (README, performance), so figures match them; the
/// baselines in the same run use it too.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "broker/lost_agents.rs"]
mod lost_agents;

const AGENTS: usize = 5_000;
const SYSTEM_JOBS: usize = 10;

/// A stand-in agent: accepts every launch, task, kill and ping.
struct FakeAgent;

enum FakeAgentMsg {
    Launch,
    Run(Reply<pb::RunTaskReply>),
    Kill(Reply<pb::KillTaskReply>),
    Ping(Reply<pb::Pong>),
}

impl Process for FakeAgent {
    type Message = FakeAgentMsg;
    async fn handle(&mut self, msg: FakeAgentMsg, _ctx: &mut Context<Self>) {
        match msg {
            FakeAgentMsg::Launch => {}
            FakeAgentMsg::Run(reply) => reply.send(pb::RunTaskReply::default()),
            FakeAgentMsg::Kill(reply) => reply.send(pb::KillTaskReply::default()),
            FakeAgentMsg::Ping(reply) => reply.send(pb::Pong::default()),
        }
    }
}

/// Starts `count` stand-in agents on one new node, named `agent-{n}` there; returns the node
/// and their pids (which keep them alive).
async fn start_fake_agents(system: &System, count: usize) -> (Node, Vec<Pid<FakeAgent>>) {
    let node = Node::bind(
        system,
        "127.0.0.1:0",
        TestPki::shared().security(Role::Agent, "fake-agents"),
    )
    .await
    .expect("agents node");
    let mut agents = Vec::with_capacity(count);
    for n in 0..count {
        let agent = system.spawn(FakeAgent);
        node.register(&format!("agent-{n}"), &agent)
            .expect("name free")
            .install::<pb::LaunchTasks>(|_| FakeAgentMsg::Launch)
            .install_ask::<pb::RunTask, pb::RunTaskReply>(|_, r| FakeAgentMsg::Run(r))
            .install_ask::<pb::KillTask, pb::KillTaskReply>(|_, r| FakeAgentMsg::Kill(r))
            .install_ask::<pb::Ping, pb::Pong>(|_, r| FakeAgentMsg::Ping(r));
        agents.push(agent);
    }
    (node, agents)
}

/// The runtime both scenarios run on: 2 workers, as on this machine.
fn bench_runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Both scenarios' criterion settings: one long iteration per sample, 10 samples.
fn configure(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(1));
}

/// The master with its jobs submitted and its agents registered, no worker running yet.
struct Storm {
    _dir: tempfile::TempDir,
    master: MasterServer,
    agents_node: Node,
    _agents: Vec<Pid<FakeAgent>>,
    queued: usize,
}

fn system_job(n: usize) -> model_pb::Job {
    model_pb::Job {
        name: format!("system-{n}"),
        priority: 50,
        scheduler: model_pb::SchedulerType::System as i32,
        groups: vec![model_pb::TaskGroup {
            name: "daemon".into(),
            count: 0,
            resources: Some(model_pb::Resources {
                cpus: 0.1,
                mem_mb: 16,
            }),
            command: "daemon".into(),
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    }
}

async fn broker_stats(master: &MasterServer) -> BrokerStats {
    let pids = master
        .pid()
        .ask(|reply| GetSchedulingPids { reply }.into())
        .await
        .expect("master answers");
    pids.broker
        .ask(BrokerMsg::Stats)
        .await
        .expect("broker answers")
}

async fn registry_entries(master: &MasterServer) -> u64 {
    master
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await
        .expect("master answers")
        .registry_entries
}

impl Storm {
    async fn build() -> Storm {
        let dir = tempfile::tempdir().expect("temp dir");
        let master = MasterServer::start(MasterConfig {
            listen: "127.0.0.1:0".into(),
            data_dir: dir.path().join("master"),
            workers: 0,
            ping_interval: Duration::from_secs(3600),
            // The stand-in agents do not heartbeat: no TTL runs out inside a run.
            heartbeat_min_ttl: Duration::from_secs(24 * 3600),
            // They never confirm a launch either: the placements stay staged.
            launch_timeout: Duration::from_secs(3600),
            // Every stand-in agent presents the one certificate of their shared node.
            agents_per_certificate: usize::MAX,
            ..MasterConfig::new(TestPki::shared().security(Role::Master, "master-1"))
        })
        .await
        .expect("master starts");
        while !master
            .pid()
            .ask(|reply| GetMetrics { reply }.into())
            .await
            .expect("master answers")
            .is_leader
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for n in 0..SYSTEM_JOBS {
            master
                .pid()
                .ask(|reply| {
                    SubmitJob {
                        job: Some(system_job(n)),
                        reply,
                    }
                    .into()
                })
                .await
                .expect("master answers")
                .expect("job accepted");
        }

        let system = System::new();
        let (agents_node, agents) = start_fake_agents(&system, AGENTS).await;
        let pid = master.pid().clone();
        let address = agents_node.address().to_owned();
        join_all((0..AGENTS).map(|n| {
            let pid = pid.clone();
            let info = model_pb::AgentInfo {
                dynamic_ports: Default::default(),
                hostname: format!("host-{n}"),
                address: format!("agent-{n}@{address}"),
                resources: Some(model_pb::Resources {
                    cpus: 16.0,
                    mem_mb: 65_536,
                }),
                attributes: Default::default(),
            };
            async move {
                pid.ask(|r| {
                    RegisterAgent {
                        request: pb::RegisterAgent {
                            info: Some(info),
                            ..Default::default()
                        },
                        reply: r,
                        sender: None,
                    }
                    .into()
                })
                .await
            }
        }))
        .await;

        // Every registration's evaluations are written and queued.
        let wanted = SYSTEM_JOBS * (AGENTS + 1);
        let deadline = Instant::now() + Duration::from_secs(120);
        let queued = loop {
            let total = broker_stats(&master).await.total();
            let queued = total.ready + total.pending;
            if queued >= wanted {
                break queued;
            }
            assert!(
                Instant::now() < deadline,
                "only {queued} of {wanted} evaluations queued"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        Storm {
            _dir: dir,
            master,
            agents_node,
            _agents: agents,
            queued,
        }
    }

    /// Starts 2 workers and waits until the broker is empty. Returns the time, and prints the
    /// storm's counts.
    async fn drain(self, report: bool) -> Duration {
        let entries_before = registry_entries(&self.master).await;
        let pids = self
            .master
            .pid()
            .ask(|reply| GetSchedulingPids { reply }.into())
            .await
            .expect("master answers");
        let started = Instant::now();
        let backend = Timed {
            inner: LocalBackend::new(self.master.pid().clone(), pids.broker.clone()),
            spent: Arc::default(),
        };
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let worker = muster_scheduler::Worker::new(
                    backend.clone(),
                    muster_scheduler::binpack(),
                    WorkerConfig {
                        dequeue_timeout: Duration::from_millis(50),
                        ..WorkerConfig::default()
                    },
                );
                tokio::spawn(worker.run(stopped.clone()))
            })
            .collect();
        loop {
            let stats: BrokerStats = pids.broker.ask(BrokerMsg::Stats).await.expect("broker");
            let total = stats.total();
            if total.ready + total.unacked + total.pending + total.cancelable == 0 {
                break;
            }

            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let took = started.elapsed();
        let _ = stop.send(true);
        let mut stats = Vec::new();
        for worker in workers {
            stats.push(worker.await.expect("worker"));
        }
        if std::env::var_os("MUSTER_BENCH_TRACE").is_some() {
            eprintln!(
                "time in backend calls (both workers): {:?}",
                backend.spent.lock().expect("timings")
            );
        }
        let entries = registry_entries(&self.master).await - entries_before;
        let broker = broker_stats(&self.master).await;
        if report {
            let runs: u64 = stats.iter().map(|s| s.dequeued).sum();
            let placed: u64 = stats.iter().map(|s| s.placements_committed).sum();
            eprintln!(
                "storm: {} evaluations queued for {SYSTEM_JOBS} system jobs on {AGENTS} agents; \
                 drained in {took:?}: {runs} scheduler runs ({:.1} per job), {placed} tasks \
                 placed, {} canceled in {} broker writes, {entries} raft entries during the drain",
                self.queued,
                runs as f64 / SYSTEM_JOBS as f64,
                broker.canceled,
                broker.registry_writes,
            );
            let failed = broker.total().failed;
            assert_eq!(failed, 0, "no evaluation failed");
        }
        self.agents_node.shutdown();
        self.master.shutdown().await;
        took
    }
}

/// Time spent in each backend call, for `MUSTER_BENCH_TRACE`.
#[derive(Clone)]
struct Timed {
    inner: LocalBackend,
    spent: Arc<std::sync::Mutex<std::collections::BTreeMap<&'static str, Duration>>>,
}

impl Timed {
    async fn time<T>(&self, what: &'static str, call: impl std::future::Future<Output = T>) -> T {
        let started = Instant::now();
        let out = call.await;
        *self.spent.lock().expect("timings").entry(what).or_default() += started.elapsed();
        out
    }
}

impl muster_scheduler::Backend for Timed {
    async fn dequeue(
        &self,
        schedulers: &[String],
        timeout: Duration,
    ) -> Result<Option<muster_scheduler::Assignment>, muster_scheduler::WorkerError> {
        self.time("dequeue", self.inner.dequeue(schedulers, timeout))
            .await
    }
    async fn snapshot(
        &self,
        min_index: u64,
    ) -> Result<muster_scheduler::ClusterSnapshot, muster_scheduler::WorkerError> {
        self.time("snapshot", self.inner.snapshot(min_index)).await
    }
    async fn submit(
        &self,
        plan: muster_scheduler::Plan,
    ) -> Result<muster_scheduler::PlanResult, muster_scheduler::WorkerError> {
        self.time("submit", self.inner.submit(plan)).await
    }
    async fn ack(
        &self,
        eval: &muster::model::EvalId,
        token: &str,
    ) -> Result<(), muster_scheduler::WorkerError> {
        self.time("ack", self.inner.ack(eval, token)).await
    }
    async fn nack(
        &self,
        eval: &muster::model::EvalId,
        token: &str,
    ) -> Result<(), muster_scheduler::WorkerError> {
        self.time("nack", self.inner.nack(eval, token)).await
    }
    async fn block(
        &self,
        eval: Evaluation,
        token: &str,
        unplaced: Vec<muster_scheduler::Demand>,
    ) -> Result<(), muster_scheduler::WorkerError> {
        self.time("block", self.inner.block(eval, token, unplaced))
            .await
    }
    async fn complete(
        &self,
        eval: &Evaluation,
        token: &str,
    ) -> Result<(), muster_scheduler::WorkerError> {
        self.time("complete", self.inner.complete(eval, token))
            .await
    }
}

/// The floor: the same number of evaluations through a channel to 2 counting consumers.
async fn channel_drain(count: usize) -> Duration {
    let job = Job {
        name: "system-0".into(),
        priority: 50,
        scheduler: SchedulerType::System,
        named_scheduler: None,
        groups: Vec::new(),
        stopped: false,
        version: 1,
    };
    let evals: Vec<Evaluation> = (0..count)
        .map(|_| Evaluation::new(&job, Trigger::JobRegister))
        .collect();
    drain_through_channel(evals).await
}

/// Moves `evals` through a tokio channel to 2 consumer tasks that only count them, and
/// returns how long that took: the floor both scenarios are read against.
async fn drain_through_channel(evals: Vec<Evaluation>) -> Duration {
    let count = evals.len();
    let (tx, rx) = mpsc::unbounded_channel::<Evaluation>();
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let seen = Arc::new(AtomicU64::new(0));
    for eval in evals {
        tx.send(eval).expect("consumers run");
    }
    drop(tx);
    let started = Instant::now();
    let consumers: Vec<_> = (0..2)
        .map(|_| {
            let rx = rx.clone();
            let seen = seen.clone();
            tokio::spawn(async move {
                while let Some(eval) = rx.lock().await.recv().await {
                    if eval.status == EvalStatus::Pending {
                        seen.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for consumer in consumers {
        consumer.await.expect("consumer");
    }
    let took = started.elapsed();
    assert_eq!(seen.load(Ordering::Relaxed), count as u64);
    took
}

fn storm(c: &mut Criterion) {
    let runtime = bench_runtime();
    let mut group = c.benchmark_group("broker");
    configure(&mut group);
    let mut first = true;
    group.bench_function("storm_drain", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    let report = std::mem::take(&mut first);
                    runtime.block_on(async {
                        let storm = Storm::build().await;
                        storm.drain(report).await
                    })
                })
                .sum()
        });
    });
    group.bench_function("channel_drain", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| runtime.block_on(channel_drain(SYSTEM_JOBS * (AGENTS + 1))))
                .sum()
        });
    });
    group.finish();
}

criterion_group!(benches, storm, lost_agents::lost_agents);
criterion_main!(benches);
