//! The shape of HashiCorp's "C2M" challenge (two million containers on 6,100 hosts, Nomad
//! 0.11: 22 min 14 s, about 1,500 placements a second with 3 servers), on one real master.
//!
//! 6,100 stand-in agents run in this program on one `Node`, reached by the master over the real
//! transport with mutual TLS, as the broker bench's are; each offers 32 cpus and 128 GiB and
//! counts the tasks it is told to launch (it starts none, so they stay staged). The master is
//! the real one (master process, registrar, single-member raft registry on sled, broker and its
//! 2 in-master scheduler workers), started with TLS and ACLs. Service jobs of 1,000 tasks each
//! (cpus 0.05, mem 128 MiB, a command with arguments and an environment) are submitted through
//! the master's gRPC API with a management token, 16 submissions in flight, until the tasks
//! asked for are placed. The clock starts at the first submission and stops when the agents
//! have been told to launch the last task.
//!
//! It runs four times (the fourth below): with binpack placement, with spread placement, with binpack and
//! every job's group spread evenly over three zones (each agent in one of them, a `spread`
//! block on `zone`: the ranking that counts the job's tasks per zone), and prints for each: a
//! line per 100,000 placements (the time and the rate since the previous line), the time to
//! the last placement and the rate over the whole run, the raft entries written, and the
//! process's heap growth from before the first submission to after the last placement,
//! divided by the tasks. That heap figure covers the whole program, so it is an upper bound on
//! what the master holds per task; the heap is counted by a thin wrapper around mimalloc (the
//! binaries' allocator) that adds up what is allocated and not freed.
//!
//! A fourth run, `Binpack remote`, moves the scheduler out of the master: the master runs no
//! workers, and this binary started again as a second OS process runs two binpack workers
//! behind a `RemoteBackend` over mutual TLS with a `schedule` token, planning against its live
//! copy of the cluster (`Scheduling/WatchCluster`). It prints, besides the rate, the bytes of
//! cluster state the scheduler received over the run and per job, then for one more job
//! submitted into the full cluster, beside the size of a whole snapshot then (what that job's
//! evaluation pulled before the copy). `MUSTER_C2M_PLACEMENT=remote-asking` runs it asking
//! for a snapshot per evaluation instead (slow: each is the whole cluster), and `remote-both`
//! runs in-master binpack, remote and remote-asking one after another.
//!
//! Baseline in the same run, `transport floor`: the same number of launches, each job's 1,000
//! tasks as one-task `LaunchTasks` messages to 1,000 consecutive agents (the shape spread
//! placement sends), told by a node of this program straight to the same stand-in agents over
//! the same TLS transport, without a master.
//!
//! Targets on a 2-core machine: at least 20,000 placements a second sustained (two million in
//! under 100 s), and at most 200 bytes of heap per task.
//!
//! `cargo bench --bench c2m` places 200,000 tasks (200 jobs) per run, which takes well under a
//! minute; `MUSTER_C2M_TASKS=2000000 cargo bench --bench c2m` is the full challenge, and
//! `MUSTER_C2M_PLACEMENT=binpack` (or `spread`, or `zones`) runs one of the three only. This bench
//! is a plain program rather than a criterion group: one run of the full size takes minutes,
//! and its figure is a rate over the run, printed as it goes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream;
use muster::actor::{Context, Node, Pid, Process, RemoteError, System, Upid};
use muster::master::requests::{GetMetrics, GetSnapshot, RegisterAgent};
use muster::master::{MasterConfig, MasterServer, Placement, testing as master_testing};
use muster::proto::cluster as pb;
use muster::proto::model as model_pb;
use muster_security::Role;
use muster_security::testing::TestPki;

#[path = "common/counted.rs"]
mod counted;
#[path = "c2m/remote.rs"]
mod remote;
use counted::heap_in_use;

/// The binaries' allocator, with what is in use counted (see [`heap_in_use`]).
#[global_allocator]
static ALLOCATOR: counted::Counted = counted::Counted;

const AGENTS: usize = 6_100;
const TASKS_PER_JOB: usize = 1_000;
const DEFAULT_TASKS: usize = 200_000;
const SUBMISSIONS_IN_FLIGHT: usize = 16;
const REPORT_EVERY: u64 = 100_000;
const AGENT_CPUS: f64 = 32.0;
const AGENT_MEM_MB: u64 = 128 * 1024;
const TASK_CPUS: f64 = 0.05;
const TASK_MEM_MB: u64 = 128;

// ---------------------------------------------------------------------------------------------
// The stand-in agents.

/// A stand-in agent: counts the tasks it is told to launch, answers the rest.
struct CountingAgent {
    launched: Arc<AtomicU64>,
}

enum CountingAgentMsg {
    Launch(usize),
    Run(muster::actor::Reply<pb::RunTaskReply>),
    Kill(muster::actor::Reply<pb::KillTaskReply>),
    Ping(muster::actor::Reply<pb::Pong>),
}

impl Process for CountingAgent {
    type Message = CountingAgentMsg;
    async fn handle(&mut self, msg: CountingAgentMsg, _ctx: &mut Context<Self>) {
        match msg {
            CountingAgentMsg::Launch(tasks) => {
                self.launched.fetch_add(tasks as u64, Ordering::Relaxed);
            }
            CountingAgentMsg::Run(reply) => {
                self.launched.fetch_add(1, Ordering::Relaxed);
                reply.send(pb::RunTaskReply::default());
            }
            CountingAgentMsg::Kill(reply) => reply.send(pb::KillTaskReply::default()),
            CountingAgentMsg::Ping(reply) => reply.send(pb::Pong::default()),
        }
    }
}

/// 6,100 stand-in agents on one node, and the count of tasks they were told to launch.
struct Agents {
    node: Node,
    _pids: Vec<Pid<CountingAgent>>,
    launched: Arc<AtomicU64>,
}

impl Agents {
    async fn start(system: &System) -> Agents {
        let node = Node::bind(
            system,
            "127.0.0.1:0",
            TestPki::shared().security(Role::Agent, "c2m-agents"),
        )
        .await
        .expect("the agents' node binds");
        let launched = Arc::new(AtomicU64::new(0));
        let pids = (0..AGENTS)
            .map(|n| {
                let pid = system.spawn(CountingAgent {
                    launched: launched.clone(),
                });
                node.register(&agent_name(n), &pid)
                    .expect("agent names are unique")
                    .install::<pb::LaunchTasks>(|launch| {
                        CountingAgentMsg::Launch(launch.tasks.len())
                    })
                    .install_ask::<pb::RunTask, pb::RunTaskReply>(|_, r| CountingAgentMsg::Run(r))
                    .install_ask::<pb::KillTask, pb::KillTaskReply>(|_, r| {
                        CountingAgentMsg::Kill(r)
                    })
                    .install_ask::<pb::Ping, pb::Pong>(|_, r| CountingAgentMsg::Ping(r));
                pid
            })
            .collect();
        Agents {
            node,
            _pids: pids,
            launched,
        }
    }

    fn upid(&self, n: usize) -> Upid {
        Upid::new(agent_name(n), self.node.address()).expect("a valid upid")
    }

    /// Waits until `total` tasks have been launched in all, printing a line per
    /// [`REPORT_EVERY`]; returns the time from `started` to the last, or `Err` with the count
    /// past `deadline`.
    async fn wait_launched(
        &self,
        total: u64,
        started: Instant,
        deadline: Duration,
    ) -> Result<Duration, u64> {
        // From the count so far: a second wait (one more job) reports only its own progress.
        let already = self.launched.load(Ordering::Relaxed);
        let mut next_report = ((already / REPORT_EVERY + 1) * REPORT_EVERY).min(total);
        let mut last = (already, started.elapsed());
        loop {
            let launched = self.launched.load(Ordering::Relaxed);
            let now = started.elapsed();
            while launched >= next_report {
                let rate = (next_report - last.0) as f64 / (now - last.1).as_secs_f64();
                eprintln!(
                    "  {next_report:>9} placed at {:>7.2} s  ({:>7.0} placements/s since the \
                     previous line)",
                    now.as_secs_f64(),
                    rate,
                );
                last = (next_report, now);
                next_report = (next_report + REPORT_EVERY).min(total.max(next_report + 1));
            }
            if launched >= total {
                return Ok(now);
            }
            if now > deadline {
                return Err(launched);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

fn agent_name(n: usize) -> String {
    format!("agent-{n}")
}

// ---------------------------------------------------------------------------------------------
// The jobs.

/// How a run places: the master's placer, whether jobs spread over zones, and where the
/// scheduler runs.
#[derive(Clone, Copy, Debug)]
struct Variant {
    placement: Placement,
    zones: bool,
    scheduler: Where,
}

/// Where a run's scheduler workers are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    /// The master's own two.
    InMaster,
    /// Two in a second process (binpack), each evaluation planned against its live copy of
    /// the cluster.
    Remote,
    /// The same, each evaluation asking for a whole snapshot (before the copy).
    RemoteAsking,
}

/// The zones agents are dealt out over in a run with zones.
const ZONES: usize = 3;

fn job(j: usize, zones: bool) -> model_pb::Job {
    let spreads = if zones {
        vec![model_pb::Spread {
            attribute: "zone".into(),
            weight: 50,
            targets: Vec::new(),
        }]
    } else {
        Vec::new()
    };
    model_pb::Job {
        name: format!("c2m-{j:04}"),
        priority: 50,
        scheduler: model_pb::SchedulerType::Service as i32,
        groups: vec![model_pb::TaskGroup {
            name: "cache".into(),
            count: TASKS_PER_JOB as u32,
            resources: Some(model_pb::Resources {
                cpus: TASK_CPUS,
                mem_mb: TASK_MEM_MB,
            }),
            command: "redis-server".into(),
            args: vec!["--port".into(), "6379".into(), "--save".into(), "".into()],
            env: [
                ("REDIS_MAXMEMORY".to_owned(), "100mb".to_owned()),
                ("ENVIRONMENT".to_owned(), "c2m".to_owned()),
            ]
            .into(),
            spreads,
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    }
}

/// The task the master would send for slot `slot` of job `j`: the floor's message.
fn run_task(spec: &model_pb::Job, slot: usize) -> pb::RunTask {
    let group = &spec.groups[0];
    let name = format!("{}.{}[{slot}]", spec.name, group.name);
    pb::RunTask {
        framework: Some(pb::Framework {
            id: spec.name.clone(),
            name: spec.name.clone(),
        }),
        task: Some(model_pb::Task {
            id: format!("{name}-{:08x}", slot * 7919),
            name,
            job: spec.name.clone(),
            group: group.name.clone(),
            job_version: 1,
            framework_id: spec.name.clone(),
            resources: group.resources,
            command: group.command.clone(),
            args: group.args.clone(),
            env: group.env.clone(),
            ..model_pb::Task::default()
        }),
        term: 1,
    }
}

// ---------------------------------------------------------------------------------------------
// One run on the real master.

struct Figures {
    took: Duration,
    entries: u64,
    heap_per_task: f64,
    /// For a remote scheduler: what it received.
    remote: Option<RemoteFigures>,
}

/// What a remote scheduler received over the wire.
struct RemoteFigures {
    /// In the whole run.
    run_bytes: u64,
    /// For one more job submitted once the run's tasks were all placed.
    one_job_bytes: u64,
    /// A whole snapshot of the cluster then: what that job's evaluation pulled before the copy.
    whole_snapshot_bytes: u64,
    /// Watches opened, and the messages they brought.
    watches: u64,
    changes: u64,
    /// Snapshots taken from the copy in the run, and the mean wait for the copy to reach an
    /// evaluation's index.
    copies: u64,
    mean_wait: Duration,
}

async fn metrics(master: &MasterServer) -> pb::MasterMetrics {
    master
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await
        .expect("the master answers")
}

async fn run(variant: Variant, tasks: usize) -> Figures {
    let Variant {
        placement,
        zones,
        scheduler,
    } = variant;
    let dir = tempfile::tempdir().expect("a temp dir");
    let master = master_testing::start_leading(MasterConfig {
        listen: "127.0.0.1:0".into(),
        data_dir: dir.path().join("master"),
        placement,
        workers: if scheduler == Where::InMaster { 2 } else { 0 },
        ping_interval: Duration::from_secs(3600),
        // The stand-in agents do not heartbeat, and never report a task running.
        heartbeat_min_ttl: Duration::from_secs(24 * 3600),
        launch_timeout: Duration::from_secs(3600),
        reconcile_interval: Duration::from_secs(3600),
        // Every stand-in agent presents the one certificate of their shared node.
        agents_per_certificate: usize::MAX,
        ..MasterConfig::new(TestPki::shared().security(Role::Master, "master-1"))
    })
    .await
    .expect("the master starts and leads");
    let token = master_testing::bootstrap(master.address())
        .await
        .expect("ACLs bootstrap");
    let mut remote_scheduler = if scheduler == Where::InMaster {
        None
    } else {
        let schedule =
            master_testing::create_token(master.address(), &token, "c2m-scheduler", "schedule")
                .await
                .expect("a schedule token");
        let asks = scheduler == Where::RemoteAsking;
        Some(remote::SchedulerProcess::start(
            master.address(),
            &schedule,
            asks,
        ))
    };

    let system = System::new();
    let agents = Agents::start(&system).await;
    let address = agents.node.address().to_owned();
    stream::iter(0..AGENTS)
        .for_each_concurrent(64, |n| {
            let pid = master.pid().clone();
            let info = model_pb::AgentInfo {
                dynamic_ports: Default::default(),
                hostname: format!("host-{n}"),
                address: format!("{}@{address}", agent_name(n)),
                resources: Some(model_pb::Resources {
                    cpus: AGENT_CPUS,
                    mem_mb: AGENT_MEM_MB,
                }),
                attributes: if zones {
                    [("zone".to_owned(), format!("zone-{}", n % ZONES))].into()
                } else {
                    Default::default()
                },
            };
            async move {
                let reply = pid
                    .ask(|r| {
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
                    .expect("the master answers");
                assert!(
                    matches!(
                        reply.result,
                        Some(pb::registration_reply::Result::AgentId(_))
                    ),
                    "the agent is admitted: {reply:?}"
                );
            }
        })
        .await;

    let client = master_testing::operator(master.address(), Some(&token))
        .await
        .expect("an operator client connects");
    let entries_before = metrics(&master).await.registry_entries;
    let heap_before = heap_in_use();
    let started = Instant::now();
    let jobs = tasks.div_ceil(TASKS_PER_JOB);
    let submit = stream::iter(0..jobs).for_each_concurrent(SUBMISSIONS_IN_FLIGHT, |j| {
        let mut client = client.clone();
        async move {
            client
                .submit_job(pb::SubmitJobRequest {
                    job: Some(job(j, zones)),
                })
                .await
                .expect("the job is accepted");
        }
    });
    // Generous: a tenth of the target rate, plus a minute.
    let deadline = Duration::from_secs(60 + tasks as u64 / 2_000);
    let total = (jobs * TASKS_PER_JOB) as u64;
    let (_, took) = tokio::join!(submit, agents.wait_launched(total, started, deadline));
    let took = match took {
        Ok(took) => took,
        Err(launched) => {
            explain_shortfall(client).await;
            panic!("only {launched} of {total} tasks launched in {deadline:?}");
        }
    };
    let entries = metrics(&master).await.registry_entries - entries_before;
    let heap_per_task = (heap_in_use() - heap_before) as f64 / total as f64;
    let remote = match remote_scheduler.as_mut() {
        None => None,
        Some(process) => {
            let after_run = process.report().await;
            // One more job, in the cluster as full as the run left it.
            client
                .clone()
                .submit_job(pb::SubmitJobRequest {
                    job: Some(job(jobs, zones)),
                })
                .await
                .expect("the job is accepted");
            let more = total + TASKS_PER_JOB as u64;
            if let Err(launched) = agents.wait_launched(more, started, deadline * 2).await {
                panic!("only {launched} of {more} tasks launched");
            }
            let snapshot = master
                .pid()
                .ask(|reply| GetSnapshot { reply }.into())
                .await
                .expect("the master answers");
            // Until the copy holds what the job changed (a copy asking per evaluation has none).
            let mut after_one = process.report().await;
            let caught_up = Instant::now() + Duration::from_secs(30);
            while scheduler != Where::RemoteAsking
                && after_one.index < snapshot.index
                && Instant::now() < caught_up
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
                after_one = process.report().await;
            }
            let whole = muster::proto::scheduling::ClusterSnapshot::from(snapshot);
            Some(RemoteFigures {
                run_bytes: after_run.bytes_since(&remote::Report::default()),
                one_job_bytes: after_one.bytes_since(&after_run),
                whole_snapshot_bytes: prost::Message::encoded_len(&whole) as u64,
                watches: after_one.watches,
                changes: after_one.changes,
                copies: after_run.copies,
                mean_wait: Duration::from_micros(after_run.waited_micros / after_run.copies.max(1)),
            })
        }
    };
    if let Some(scheduler) = remote_scheduler {
        scheduler.stop().await;
    }

    agents.node.shutdown();
    master.shutdown().await;
    system.shutdown().await;
    Figures {
        took,
        entries,
        heap_per_task,
        remote,
    }
}

/// Prints the jobs short of their count and the evaluations not complete, for a run that
/// did not place everything.
async fn explain_shortfall(mut client: master_testing::TestOperator) {
    let jobs = client
        .list_jobs(pb::ListJobsRequest::default())
        .await
        .expect("jobs listed")
        .into_inner();
    for job in jobs
        .jobs
        .iter()
        .filter(|job| job.staging + job.running < job.desired)
    {
        eprintln!("short: {job:?}");
    }
    let evals = client
        .list_evaluations(pb::ListEvaluationsRequest {
            limit: 1000,
            ..Default::default()
        })
        .await
        .expect("evaluations listed")
        .into_inner();
    for eval in evals
        .evals
        .iter()
        .filter(|eval| eval.status != model_pb::EvalStatus::Complete as i32)
    {
        eprintln!("not complete: {eval:?}");
    }
}

/// The floor: the same launches told straight to the stand-in agents by a node of this program.
async fn transport_floor(tasks: usize) -> Duration {
    let system = System::new();
    let agents = Agents::start(&system).await;
    let sender = Node::bind(
        &system,
        "127.0.0.1:0",
        TestPki::shared().security(Role::Master, "master-1"),
    )
    .await
    .expect("the sender's node binds");
    let remotes: Vec<_> = (0..AGENTS).map(|n| sender.remote(agents.upid(n))).collect();
    let jobs = tasks.div_ceil(TASKS_PER_JOB);
    let total = (jobs * TASKS_PER_JOB) as u64;
    let started = Instant::now();
    let send = async {
        for j in 0..jobs {
            let spec = job(j, false);
            for slot in 0..TASKS_PER_JOB {
                let agent = (j * TASKS_PER_JOB + slot) % AGENTS;
                // A full queue for the agents' node is waited out, as a sender would.
                loop {
                    let launch = pb::LaunchTasks {
                        tasks: vec![run_task(&spec, slot)],
                        term: 1,
                        ..Default::default()
                    };
                    match remotes[agent].tell(launch) {
                        Ok(()) => break,
                        Err(RemoteError::QueueFull(_)) => tokio::task::yield_now().await,
                        Err(e) => panic!("the launch is sent: {e}"),
                    }
                }
            }
            tokio::task::yield_now().await;
        }
    };
    let deadline = Duration::from_secs(60 + tasks as u64 / 2_000);
    let (_, took) = tokio::join!(send, agents.wait_launched(total, started, deadline));
    let took = took.unwrap_or_else(|launched| {
        panic!("only {launched} of {total} launches arrived in {deadline:?}")
    });
    sender.shutdown();
    agents.node.shutdown();
    system.shutdown().await;
    took
}

fn main() {
    if std::env::var_os(remote::MASTER).is_some() {
        // Started by a remote run as its scheduler.
        return remote::run_scheduler();
    }
    if std::env::args().any(|arg| arg == "--list") {
        // `cargo bench -- --list` and test discovery: nothing to list but the bench itself.
        println!("c2m: benchmark");
        return;
    }
    let tasks = match std::env::var("MUSTER_C2M_TASKS") {
        Ok(value) => value
            .parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or_else(|| panic!("MUSTER_C2M_TASKS={value:?} is not a positive number")),
        Err(_) => DEFAULT_TASKS,
    };
    let variant = |placement, zones, scheduler| Variant {
        placement,
        zones,
        scheduler,
    };
    let binpack = variant(Placement::Binpack, false, Where::InMaster);
    let spread = variant(Placement::Spread, false, Where::InMaster);
    let zones = variant(Placement::Binpack, true, Where::InMaster);
    let remote = variant(Placement::Binpack, false, Where::Remote);
    let asking = variant(Placement::Binpack, false, Where::RemoteAsking);
    let variants = match std::env::var("MUSTER_C2M_PLACEMENT").as_deref() {
        Err(_) => vec![binpack, spread, zones, remote],
        Ok("binpack") => vec![binpack],
        Ok("spread") => vec![spread],
        Ok("zones") => vec![zones],
        Ok("remote") => vec![remote],
        Ok("remote-asking") => vec![asking],
        Ok("remote-both") => vec![binpack, remote, asking],
        Ok(other) => panic!(
            "MUSTER_C2M_PLACEMENT={other:?} is not binpack, spread, zones, remote, \
             remote-asking or remote-both"
        ),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        eprintln!(
            "c2m: {tasks} tasks in jobs of {TASKS_PER_JOB} on {AGENTS} agents (mutual TLS, ACLs)"
        );
        for variant in variants {
            let name = match variant {
                Variant { zones: true, .. } => "Binpack+zones".to_owned(),
                Variant {
                    scheduler: Where::Remote,
                    ..
                } => "Binpack remote".to_owned(),
                Variant {
                    scheduler: Where::RemoteAsking,
                    ..
                } => "Binpack remote asking".to_owned(),
                Variant { placement, .. } => format!("{placement:?}"),
            };
            eprintln!("{name}:");
            let figures = run(variant, tasks).await;
            eprintln!(
                "c2m {name}: {tasks} placed in {:.2} s = {:.0} placements/s; {} raft \
                 entries; heap {:.0} B per task",
                figures.took.as_secs_f64(),
                tasks as f64 / figures.took.as_secs_f64(),
                figures.entries,
                figures.heap_per_task,
            );
            if let Some(remote) = figures.remote {
                let jobs = tasks.div_ceil(TASKS_PER_JOB) as u64;
                eprintln!(
                    "c2m {name} wire: {} B of cluster state over the run = {} B per job; one \
                     more job after: {} B (a whole snapshot then: {} B); {} watch(es), {} \
                     messages; {} snapshots of the copy, waiting {:?} on average for its index",
                    remote.run_bytes,
                    remote.run_bytes / jobs.max(1),
                    remote.one_job_bytes,
                    remote.whole_snapshot_bytes,
                    remote.watches,
                    remote.changes,
                    remote.copies,
                    remote.mean_wait,
                );
            }
        }
        eprintln!("transport floor:");
        let floor = transport_floor(tasks).await;
        eprintln!(
            "c2m transport floor: {tasks} launches in {:.2} s = {:.0} launches/s",
            floor.as_secs_f64(),
            tasks as f64 / floor.as_secs_f64(),
        );
    });
}
