//! Scenario 2 of the broker bench, on the real master: 500 of 5,000 agents miss their
//! heartbeats at once.
//!
//! The cluster: 5,000 agents, 100 service jobs of count 1,000 (100,000 tasks, 20 on every
//! agent, from 20 different jobs) and 100 system jobs (one task on every agent: 500,000
//! tasks). Every task needs cpus 0.01 and 1 MiB; every agent offers 16 cpus and 64 GiB, so
//! everything fits. The lost agents are the first 500 registered; each service job has 100
//! tasks on them.
//!
//! Setup (untimed), without scheduling 600,000 placements: a master with no worker admits the
//! 5,000 agents (before any job exists, so no registration makes system-job evaluations) and
//! stores the 200 jobs. It is shut down and a new master starts on the same data dir: a
//! failover. The new leader gives every admitted agent the same first heartbeat deadline
//! (`failover_heartbeat_ttl` + `heartbeat_grace` after it takes the lead), and rebuilds its
//! view of the cluster from the agents' re-registrations: each agent re-registers with its 120
//! tasks, RUNNING, built as the master's plan applier builds the tasks it launches for a job
//! (slot name, job and group, framework = job). A re-registration keeps the shared
//! first deadline only if the agent's normal heartbeat deadline would fall before it, so the
//! normal TTL is made short (`heartbeats_per_second` 500: 10 s to 20 s with 5,000 agents) and
//! the failover TTL long (25 s; asserted). The 4,500 agents that stay then heartbeat as real
//! agents do (at once, then at half of each TTL the master answers with, until the end of the
//! iteration); the 500 lost ones never do. Right after the re-registrations 2 scheduler
//! workers (binpack, in this process, as in `storm`) start and drain the 200 evaluations of the
//! job submissions, which the new leader's broker restored: every task is in place, so they
//! place nothing (asserted). All of this must be done before the shared deadline (asserted;
//! it takes about 5 s).
//!
//! Timed: from the shared deadline to an empty broker. At the deadline the master's heartbeat
//! sweep (every 10 ms here) takes the 500 agents out in one pass and marks them unreachable in
//! one raft entry, with one evaluation for each job any of them ran a task of and each system
//! job: 200 evaluations (one per agent and job, as Nomad makes them, would be 120 per agent,
//! 60,000 in all, left to the broker to coalesce). The clock starts at the deadline itself, which the bench
//! knows to well under a millisecond: the last agent re-registers alone, ending the master's
//! recovery, whose clock starts when it sets the deadline, and the master reports how long
//! the recovery took. (The earliest bound is used, so the time may be overstated by the width
//! of the bound, never understated.) The clock stops when all 500 are recorded unreachable and
//! the broker is empty (nothing ready, unacked, pending or cancelable: every cancellation
//! written). Inside the interval the 4,500 live agents go on heartbeating (about 600 a
//! second), as they would, and the bench polls the master's metrics and the broker's stats
//! every millisecond.
//!
//! Printed on the first iteration (eprintln): the setup's phases and the growth of resident
//! memory; then agents marked unreachable and when the sweep and the registry writes were
//! seen, evaluations created, scheduler runs (total, per job, most for one job), tasks placed
//! (500 × 20 = 10,000 replacement service tasks) and placements the applier rejected (the 2
//! binpack workers often pick the same agent; rejected ones are planned again), evaluations
//! canceled and the broker's registry writes for them, raft entries written during the
//! interval, the time, and the workers' time in backend calls. Asserted: the 500 were taken
//! out together and no other agent, no evaluation failed or blocked, all 10,000 replacements
//! placed, every evaluation created run or canceled. Targets: at most 2
//! scheduler runs per job, cancellation raft entries in the tens.
//!
//! Baseline `channel_drain`, same run: the scenario's 60,000 (agent, job) pairs as evaluations
//! through a tokio channel to 2 consumer tasks that only count them.
//!
//! The agents are 5,000 processes of this program on one `Node`, reached by the master over
//! the real transport; they accept every task (`RunTask` asks and `LaunchTasks` tells), kill
//! and ping, and report nothing. An iteration takes about 36 s (the 25 s failover TTL is most
//! of it); the group runs 11 (one warm-up, 10 samples), about 7 minutes.
//!
//! The jobs, the agents' re-registrations and heartbeats, and the counting backend are in
//! `cluster`; the scenario's run is here.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::Criterion;
use futures_util::future::join_all;
use muster::actor::{Node, Pid, System};
use muster::master::requests::{
    GetMetrics, GetSchedulingPids, Heartbeat, RegisterAgent, ReregisterAgent, SubmitJob,
};
use muster::master::{LocalBackend, MasterConfig, MasterServer};
use muster::model::AgentId;
use muster::model::{EvalId, Evaluation, Job, SchedulerType, Trigger};
use muster::proto::cluster as pb;
use muster::proto::cluster::heartbeat_reply::Result as HeartbeatAnswer;
use muster::proto::cluster::registration_reply::Result as Registration;
use muster::proto::model as model_pb;
use muster_broker::{BrokerMsg, BrokerStats, EvalBroker};
use muster_scheduler::{WorkerConfig, WorkerStats};
use muster_security::Role;
use muster_security::testing::TestPki;
use tokio::sync::watch;

#[path = "lost_agents/cluster.rs"]
mod cluster;

use cluster::{
    Counting, agent_info, broker_empty, broker_stats, heartbeat, job_spec, metrics, mib,
    reregistration, resident, service_job_name, service_slot, start_master, system_job_name,
};

const AGENTS: usize = 5_000;
/// The agents that miss their heartbeats: the first this many registered.
const LOST: usize = 500;
const SERVICE_JOBS: usize = 100;
const SERVICE_COUNT: usize = 1_000;
const SYSTEM_JOBS: usize = 100;
/// Service tasks per agent.
const SERVICE_PER_AGENT: usize = SERVICE_JOBS * SERVICE_COUNT / AGENTS;
const _: () = assert!(SERVICE_PER_AGENT * AGENTS == SERVICE_JOBS * SERVICE_COUNT);
const SERVICE_GROUP: &str = "web";
const SYSTEM_GROUP: &str = "daemon";
const TASK_CPUS: f64 = 0.01;
const TASK_MEM_MB: u64 = 1;

/// Every admitted agent's first deadline after the failover is this (plus the grace) after the
/// new master takes the lead.
const FAILOVER_TTL: Duration = Duration::from_secs(25);
const HEARTBEAT_GRACE: Duration = Duration::from_secs(1);
/// Makes the normal TTL 10 s (up to 20 s with stagger) for 5,000 agents.
const HEARTBEATS_PER_SECOND: f64 = 500.0;
/// Below the scaled TTL, so it never applies; it sets the heartbeat sweep to every 10 ms.
const HEARTBEAT_MIN_TTL: Duration = Duration::from_millis(100);
/// How long before the earliest possible deadline the bench starts watching for the sweep.
const WATCH_AHEAD: Duration = Duration::from_millis(200);

/// The evaluations marking the lost agents unreachable creates, all in one sweep: one per job
/// any of them ran a task of, and one per system job.
fn evaluations_expected() -> usize {
    let mut jobs: Vec<usize> = (0..LOST)
        .flat_map(|n| (0..SERVICE_PER_AGENT).map(move |s| service_slot(n, s).0))
        .collect();
    jobs.sort_unstable();
    jobs.dedup();
    jobs.len() + SYSTEM_JOBS
}

/// The (lost agent, job) pairs: one per job each lost agent ran a task of, and one per system
/// job: the evaluations one per agent and job would make.
fn agent_job_pairs() -> usize {
    (0..LOST)
        .map(|n| {
            let mut jobs: Vec<usize> = (0..SERVICE_PER_AGENT)
                .map(|s| service_slot(n, s).0)
                .collect();
            jobs.sort_unstable();
            jobs.dedup();
            jobs.len() + SYSTEM_JOBS
        })
        .sum()
}

/// The cluster re-registered with a new leading master, the job submissions' evaluations
/// drained, the shared deadline still ahead.
struct Recovered {
    _dir: tempfile::TempDir,
    master: MasterServer,
    agents_node: Node,
    _agents: Vec<Pid<super::FakeAgent>>,
    broker: Pid<EvalBroker>,
    backend: Counting,
    workers: Vec<tokio::task::JoinHandle<WorkerStats>>,
    stop: watch::Sender<bool>,
    heartbeats: Vec<tokio::task::JoinHandle<()>>,
    refused: Arc<AtomicU64>,
    /// The shared deadline is no earlier than this.
    earliest_deadline: Instant,
    /// And no later than this.
    latest_deadline: Instant,
    setup: String,
    resident_before: u64,
}

impl Recovered {
    async fn build(report: bool) -> Recovered {
        let dir = tempfile::tempdir().expect("temp dir");
        let first = MasterConfig {
            listen: "127.0.0.1:0".into(),
            data_dir: dir.path().join("master"),
            workers: 0,
            ping_interval: Duration::from_secs(3600),
            // Nothing times out on the first master: it only admits and stores.
            heartbeat_min_ttl: Duration::from_secs(24 * 3600),
            ..MasterConfig::new(TestPki::shared().security(Role::Master, "master-1"))
        };
        let (master, _, _) = start_master(&first).await;

        let system = System::new();
        let (agents_node, agents) = super::start_fake_agents(&system, AGENTS).await;
        let address = agents_node.address().to_owned();

        // Admitted before any job exists: no registration makes a system-job evaluation.
        let pid = master.pid().clone();
        let ids: Vec<String> = join_all((0..AGENTS).map(|n| {
            let pid = pid.clone();
            let info = agent_info(n, &address);
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
        .await
        .into_iter()
        .map(|reply| match reply.expect("master answers").result {
            Some(Registration::AgentId(id)) => id,
            other => panic!("registration failed: {other:?}"),
        })
        .collect();
        let specs = (0..SERVICE_JOBS)
            .map(|j| {
                job_spec(
                    service_job_name(j),
                    model_pb::SchedulerType::Service,
                    SERVICE_GROUP,
                    SERVICE_COUNT as u32,
                )
            })
            .chain((0..SYSTEM_JOBS).map(|j| {
                job_spec(
                    system_job_name(j),
                    model_pb::SchedulerType::System,
                    SYSTEM_GROUP,
                    0,
                )
            }));
        for spec in specs {
            pid.ask(|reply| {
                SubmitJob {
                    job: Some(spec),
                    reply,
                }
                .into()
            })
            .await
            .expect("master answers")
            .expect("job accepted");
        }

        let resident_before = resident();
        let messages: Vec<pb::ReregisterAgent> = ids
            .iter()
            .enumerate()
            .map(|(n, id)| reregistration(n, id, &address))
            .collect();

        // The failover.
        master.shutdown().await;
        let second = MasterConfig {
            heartbeat_min_ttl: HEARTBEAT_MIN_TTL,
            heartbeats_per_second: HEARTBEATS_PER_SECOND,
            heartbeat_grace: HEARTBEAT_GRACE,
            failover_heartbeat_ttl: FAILOVER_TTL,
            reregistration_timeout: Duration::from_secs(3600),
            // The stand-in agents never confirm a launch; the replacements stay staged.
            launch_timeout: Duration::from_secs(3600),
            ..first
        };
        let starting = Instant::now();
        let (master, lead_not_before, leading) = start_master(&second).await;

        // All agents but the last re-register at once, then the last alone: its
        // re-registration ends the recovery between `asked` and `answered`.
        let pid = master.pid().clone();
        let mut messages = messages;
        let last = messages.pop().expect("agents");
        let mut replies = join_all(messages.into_iter().map(|message| {
            let pid = pid.clone();
            async move {
                pid.ask(|r| {
                    ReregisterAgent {
                        request: message,
                        reply: r,
                        sender: None,
                    }
                    .into()
                })
                .await
            }
        }))
        .await;
        let asked = Instant::now();
        replies.push(
            pid.ask(|r| {
                ReregisterAgent {
                    request: last,
                    reply: r,
                    sender: None,
                }
                .into()
            })
            .await,
        );
        let answered = Instant::now();
        for reply in replies {
            let reply = reply.expect("master answers");
            assert!(
                matches!(reply.result, Some(Registration::AgentId(_))),
                "re-registration refused: {reply:?}"
            );
        }
        let reregistered = answered;
        // The master starts the recovery's clock as it takes the lead and gives every agent
        // the shared deadline, and reports how long the recovery took: so the deadline is
        // known to within the last re-registration's round trip (and within when it took the
        // lead, a looser bound).
        let recovery = metrics(&master).await.recovery_seconds;
        assert!(
            recovery > 0.0,
            "the last re-registration ended the recovery"
        );
        let recovery = Duration::from_secs_f64(recovery);
        let ttl = FAILOVER_TTL + HEARTBEAT_GRACE;
        let earliest_deadline = (lead_not_before + ttl).max(asked - recovery + ttl);
        let latest_deadline = (leading + ttl).min(answered - recovery + ttl);
        assert!(
            earliest_deadline <= latest_deadline,
            "the deadline's bounds agree"
        );
        // A re-registration keeps the shared first deadline only if the agent's normal one
        // (now + up to twice the base TTL + grace) would come before it.
        let longest_normal = Duration::from_secs_f64(2.0 * AGENTS as f64 / HEARTBEATS_PER_SECOND);
        assert!(
            reregistered + longest_normal + HEARTBEAT_GRACE <= earliest_deadline,
            "the re-registrations took {:?} after the master started: too late for every agent \
             to keep the shared failover deadline; raise FAILOVER_TTL",
            reregistered - starting
        );

        let pids = pid
            .ask(|reply| GetSchedulingPids { reply }.into())
            .await
            .expect("master answers");
        let backend = Counting {
            inner: LocalBackend::new(pid.clone(), pids.broker.clone()),
            counts: Arc::default(),
        };
        let (stop, stopped) = watch::channel(false);
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
        // The agents that stay heartbeat; the first LOST never do.
        let refused = Arc::new(AtomicU64::new(0));
        let heartbeats: Vec<_> = ids[LOST..]
            .iter()
            .map(|id| {
                tokio::spawn(heartbeat(
                    pid.clone(),
                    id.clone(),
                    stopped.clone(),
                    refused.clone(),
                ))
            })
            .collect();

        // The job submissions' evaluations, restored by the new leader, find everything in
        // place.
        let restored = broker_stats(&pids.broker).await;
        while !broker_empty(&broker_stats(&pids.broker).await) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let drained = Instant::now();
        let counts = backend.take();
        let setup_metrics = metrics(&master).await;
        assert!(
            drained < earliest_deadline - WATCH_AHEAD,
            "setup ran {:?} past the master's start, too close to the shared deadline ({:?}); \
             raise FAILOVER_TTL",
            drained - starting,
            FAILOVER_TTL + HEARTBEAT_GRACE
        );
        assert_eq!(
            (
                setup_metrics.agents_connected,
                setup_metrics.agents_unreachable
            ),
            (AGENTS as u64, 0),
            "every agent connected before the deadline"
        );
        assert_eq!(counts.placed, 0, "the setup's evaluations place nothing");
        let resident_after = resident();
        let setup = if report {
            format!(
                "lost_agents setup: failover master leading in {:?}; {AGENTS} re-registrations \
                 ({} tasks) in {:?}; {} restored evaluations drained in {:?} ({} runs, {} \
                 placed); deadline {:?} to {:?} after the start, {:?} of slack; resident \
                 memory +{:.0} MiB (the re-registrations moved into the master, its views and \
                 broker)",
                leading - starting,
                AGENTS * (SERVICE_PER_AGENT + SYSTEM_JOBS),
                reregistered - leading,
                restored.total().ready + restored.total().unacked + restored.total().pending,
                drained - reregistered,
                counts.runs(),
                counts.placed,
                earliest_deadline - starting,
                latest_deadline - starting,
                earliest_deadline - drained,
                mib(resident_after as i64 - resident_before as i64),
            )
        } else {
            String::new()
        };
        Recovered {
            _dir: dir,
            master,
            agents_node,
            _agents: agents,
            broker: pids.broker,
            backend,
            workers,
            stop,
            heartbeats,
            refused,
            earliest_deadline,
            latest_deadline,
            setup,
            resident_before,
        }
    }

    /// Waits for the deadline, and times the master from it to an empty broker.
    async fn lose_agents(self, report: bool) -> Duration {
        tokio::time::sleep_until((self.earliest_deadline - WATCH_AHEAD).into()).await;
        let before = metrics(&self.master).await;
        let broker_before = broker_stats(&self.broker).await;
        // The workers' idle dequeues since the setup.
        let idle = self.backend.take();
        assert_eq!(idle.runs(), 0, "nothing to schedule before the deadline");
        // The clock starts at the shared deadline: at the earliest it can be, so it counts up
        // to `latest_deadline - earliest_deadline` (well under a millisecond) too much.
        let started = self.earliest_deadline;
        let (swept, connected, mut unreachable) = loop {
            let now = metrics(&self.master).await;
            if now.agents_connected < AGENTS as u64 {
                break (Instant::now(), now.agents_connected, now.agents_unreachable);
            }
            assert!(
                Instant::now() < self.latest_deadline + Duration::from_secs(5),
                "no agent was taken out by 5 s past the deadline"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        // How the agents' moves to unreachable land (each entry the registrar writes carries
        // the moves queued while the one before it was written), as polled.
        let mut landed = vec![(swept - started, unreachable)];
        let mut marked = None;
        loop {
            if marked.is_none() {
                let now = metrics(&self.master).await;
                if now.agents_unreachable != unreachable {
                    unreachable = now.agents_unreachable;
                    landed.push((started.elapsed(), unreachable));
                }
                if unreachable >= LOST as u64 {
                    marked = Some(started.elapsed());
                }
            }
            if marked.is_some() && broker_empty(&broker_stats(&self.broker).await) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let took = started.elapsed();

        let _ = self.stop.send(true);
        let mut stats = Vec::new();
        for worker in self.workers {
            stats.push(worker.await.expect("worker"));
        }
        for heartbeat in self.heartbeats {
            heartbeat.await.expect("heartbeat task");
        }
        let after = metrics(&self.master).await;
        let broker = broker_stats(&self.broker).await;
        let counts = self.backend.take();
        let canceled = broker.canceled - broker_before.canceled;
        let created = counts.runs() + canceled;
        if report {
            let resident = resident();
            let runs = counts.runs();
            let max = counts.runs.values().copied().max().unwrap_or(0);
            let most_run = |prefix: &str| {
                counts
                    .runs
                    .iter()
                    .filter(|(job, _)| job.starts_with(prefix))
                    .map(|(_, runs)| *runs)
                    .max()
                    .unwrap_or(0)
            };
            let dequeued: u64 = stats.iter().map(|s| s.dequeued).sum();
            let plans: u64 = stats.iter().map(|s| s.plans_submitted).sum();
            let in_calls: Duration = counts.spent.values().sum();
            let landed: Vec<String> = landed
                .iter()
                .map(|(at, agents)| format!("{agents} by {at:.0?}"))
                .collect();
            eprintln!("{}", self.setup);
            eprintln!(
                "lost_agents: {} of {AGENTS} agents marked unreachable ({} taken out by one \
                 sweep, seen {:?} to {:?} after the deadline; all {LOST} written {:?} after \
                 the deadline; recorded unreachable, as polled: {}); {created} evaluations \
                 created for {} jobs ({} expected, for {} agent-job pairs); empty broker after {took:?}: {runs} \
                 scheduler runs on {} jobs ({:.2} per job, at \
                 most {max} for one job: {} for a service job, {} for a system job; {dequeued} \
                 dequeued in the whole iteration), {plans} plans submitted in the whole \
                 iteration, {} tasks placed ({} placements rejected by the applier and \
                 retried, {} stopped, {} evaluations blocked), {canceled} evaluations canceled \
                 in {} broker registry writes, {} raft entries during the interval; resident \
                 +{:.0} MiB since before the re-registrations",
                after.agents_unreachable,
                AGENTS as u64 - connected,
                swept.saturating_duration_since(self.latest_deadline),
                swept.saturating_duration_since(self.earliest_deadline),
                marked.unwrap_or_default(),
                landed.join(", "),
                SERVICE_JOBS + SYSTEM_JOBS,
                evaluations_expected(),
                agent_job_pairs(),
                counts.runs.len(),
                runs as f64 / (SERVICE_JOBS + SYSTEM_JOBS) as f64,
                most_run("service-"),
                most_run("system-"),
                counts.placed,
                counts.rejected,
                counts.stopped,
                counts.blocked,
                broker.registry_writes - broker_before.registry_writes,
                after.registry_entries - before.registry_entries,
                mib(resident as i64 - self.resident_before as i64),
            );
            eprintln!(
                "lost_agents: the workers' time in backend calls: {:?}; the rest of their 2 × \
                 {took:?} ({:?}) is planning, or waiting for a thread",
                counts.spent,
                (2 * took).saturating_sub(in_calls),
            );
        } else if std::env::var_os("MUSTER_BENCH_TRACE").is_some() {
            eprintln!(
                "lost_agents iteration: empty broker after {took:?}, all marked after {:?}; {} \
                 runs (at most {} for one job), {} broker writes, {} raft entries; resident {:.0} \
                 MiB",
                marked.unwrap_or_default(),
                counts.runs(),
                counts.runs.values().copied().max().unwrap_or(0),
                broker.registry_writes - broker_before.registry_writes,
                after.registry_entries - before.registry_entries,
                mib(resident() as i64),
            );
        }
        assert_eq!(
            connected,
            (AGENTS - LOST) as u64,
            "the sweep took out exactly the lost agents, all at once"
        );
        assert_eq!(
            after.agents_unreachable, LOST as u64,
            "only the lost agents were marked"
        );
        assert_eq!(
            self.refused.load(Ordering::Relaxed),
            0,
            "no heartbeat refused"
        );
        assert_eq!(broker.total().failed, 0, "no evaluation failed");
        assert_eq!(
            (counts.placed, counts.blocked),
            ((LOST * SERVICE_PER_AGENT) as u64, 0),
            "every lost service task replaced, no evaluation blocked"
        );
        assert_eq!(
            created,
            evaluations_expected() as u64,
            "every evaluation created was run or canceled"
        );
        self.agents_node.shutdown();
        self.master.shutdown().await;
        took
    }
}

/// The floor: the same number of evaluations through a channel to 2 counting consumers.
async fn channel_drain(count: usize) -> Duration {
    let job = Job {
        name: service_job_name(0),
        priority: 50,
        scheduler: SchedulerType::Service,
        named_scheduler: None,
        groups: Vec::new(),
        stopped: false,
        version: 1,
    };
    let evals: Vec<Evaluation> = (0..count)
        .map(|_| Evaluation::new(&job, Trigger::AgentUnreachable(AgentId("agent-0".into()))))
        .collect();
    super::drain_through_channel(evals).await
}

/// Scenario 2: the criterion group `lost_agents` (`unreachable_drain`, `channel_drain`).
pub(crate) fn lost_agents(c: &mut Criterion) {
    let runtime = super::bench_runtime();
    let mut group = c.benchmark_group("lost_agents");
    super::configure(&mut group);
    let mut first = true;
    group.bench_function("unreachable_drain", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    let report = std::mem::take(&mut first);
                    runtime.block_on(async {
                        let recovered = Recovered::build(report).await;
                        recovered.lose_agents(report).await
                    })
                })
                .sum()
        });
    });
    let evaluations = agent_job_pairs();
    group.bench_function("channel_drain", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| runtime.block_on(channel_drain(evaluations)))
                .sum()
        });
    });
    group.finish();
}
