//! Master failover in the shape of the Mesos performance working group's benchmark ("Mesos
//! performance working group progress report", Apache Mesos blog, December 2017):
//! synthetic agents re-register with a master that has just taken over, and the timed span
//! runs from the first re-registration sent until every agent has its acknowledgement.
//!
//! Each agent offers cpus:20 mem:10240 and runs 10 active tasks across 5 frameworks, each task
//! cpus:0.1 mem:5 with 10 small labels. The new leader's announcement says it reads running
//! tasks grouped by the labels they share, so agents send them so (one group of 10 an agent,
//! as `muster_agent::reregistration` builds it). The `history` series adds 100 completed tasks
//! (same shape, each with its labels) across 5 completed frameworks per agent. Agents ∈ {1k, 5k, 10k, 20k, 40k, 100k}
//! (the history series stops at 40k), or `MUSTER_FAILOVER_AGENTS=1000,5000` picks sizes.
//!
//! The master is the real one (`MasterServer`: master process, registrar, single-member raft
//! registry on sled in a temp dir). Before each iteration (untimed) the master is shut down and
//! started again on the same data dir, so the new leader loads the admitted agents from the
//! registry and waits for them; the agents' messages are built. Then, timed, every agent sends
//! its `ReregisterAgent` at once and the iteration ends when all acknowledgements are in.
//! Unchanged agents cost no registry write, as in Mesos.
//!
//! Groups, each with a raw baseline of the same shape in the same run:
//! - `failover/in_process`: agents ask the master's `Pid` directly (messages moved, no
//!   encoding). Baseline `tokio_channel`: the same messages, each with a oneshot, through an
//!   unbounded tokio channel to a task that files them in a `HashMap` and answers.
//! - `failover/tonic_tls`: agents ask `master@host:port` from a second `Node` over loopback
//!   (the real transport: mutual TLS, prost, batched envelopes on one HTTP/2 stream).
//!   `tonic_plaintext`: the same with both ends `--insecure`, in the same run, to read TLS's
//!   cost as a ratio. Baseline `raw_tcp`: the same messages length-prefixed on a bare
//!   loopback `TcpStream` to a task that decodes and files them and writes an
//!   acknowledgement back.
//! - `failover_history/in_process` (and its `tokio_channel` baseline): the history series.
//! - `failover_registry_encoding/{restart,in_process}/{msgpack,json}`: 10,000 agents, the
//!   registry written in MessagePack and, in the same run, in JSON (the encoding before it):
//!   `restart` times a stopped master's start until it leads (the part of a failover that
//!   reads the registry), `in_process` the re-registrations as above (which write nothing).
//!
//! Before each size the bench prints (eprintln) the master's memory per agent: the heap in use
//! after a recovery minus before its messages were built, divided by the agents. The messages
//! are moved into the master, so this is what the master holds for them. The heap is counted by
//! a thin wrapper around mimalloc, the binaries' allocator (`common/counted.rs`: bytes
//! allocated and not freed); the times are with mimalloc too.
//! Targets (2-core machine): 40k agents in ≤ 1.9 s in-process and ≤ 6 s over tonic; with
//! history ≤ 13.5 s in-process; 100k agents (1,000,000 tasks) in ≤ 1 s in-process and ≤ 4 s
//! over tonic with mutual TLS; at most 8 KiB of master heap per agent.

use std::collections::HashMap;
use std::time::{Duration, Instant};

#[path = "common/counted.rs"]
mod counted;
use counted::heap_in_use;

/// The binaries' allocator, with what is in use counted (see [`heap_in_use`]).
#[global_allocator]
static ALLOCATOR: counted::Counted = counted::Counted;

use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use futures_util::future::join_all;
use muster::actor::{Node, NodeConfig, System, Upid};
use muster::agent::reregistration::group_by_shared_labels;
use muster::master::requests::{GetMetrics, RegisterAgent, ReregisterAgent};
use muster::master::{MasterConfig, MasterServer};
use muster::proto::cluster as pb;
use muster::proto::cluster::registration_reply::Result as Registration;
use muster::proto::model as model_pb;
use muster::registry::codec::Encoding;
use muster_security::testing::TestPki;
use muster_security::{Role, Security};
use prost::Message as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};

const SIZES: &[usize] = &[1_000, 5_000, 10_000, 20_000, 40_000, 100_000];

/// The largest size the history series runs (100 completed tasks an agent: 4 million tasks).
const MAX_HISTORY_AGENTS: usize = 40_000;

fn sizes() -> Vec<usize> {
    std::env::var("MUSTER_FAILOVER_AGENTS")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| SIZES.to_vec())
}

/// Agent `n`'s info. Its address is a process at a closed loopback port: a new leader
/// announces itself to every admitted agent, and an address that refuses at once costs no
/// lingering connection attempt (on an unroutable address, each would hold a socket until its
/// connect timed out, and 100,000 of them run out of file descriptors).
fn info(n: usize) -> model_pb::AgentInfo {
    model_pb::AgentInfo {
        dynamic_ports: Default::default(),
        hostname: format!("agent-host-{n}"),
        address: format!("agent-{n}@127.0.0.1:1"),
        resources: Some(model_pb::Resources {
            cpus: 20.0,
            mem_mb: 10240,
        }),
        attributes: HashMap::new(),
    }
}

fn task(agent: usize, n: usize, framework: String, state: model_pb::TaskState) -> model_pb::Task {
    model_pb::Task {
        id: format!("task-{agent}-{n}"),
        name: format!("task {n}"),
        framework_id: framework,
        resources: Some(model_pb::Resources {
            cpus: 0.1,
            mem_mb: 5,
        }),
        labels: (0..10)
            .map(|l| model_pb::Label {
                key: format!("k{l}"),
                value: "v".to_owned(),
            })
            .collect(),
        state: state as i32,
        ..model_pb::Task::default()
    }
}

fn framework(prefix: &str, n: usize) -> pb::Framework {
    pb::Framework {
        id: format!("{prefix}-{n}"),
        name: format!("{prefix} {n}"),
    }
}

/// What agent `n` (admitted as `id`) sends to the new leader: the leader announced that it
/// reads running tasks grouped by their labels, so they go grouped, as an agent sends them.
fn reregistration(n: usize, id: &str, history: bool) -> pb::ReregisterAgent {
    let running = (0..10)
        .map(|t| {
            task(
                n,
                t,
                format!("framework-{}", t % 5),
                model_pb::TaskState::Running,
            )
        })
        .collect();
    let (tasks, tasks_sharing_labels) = group_by_shared_labels(running);
    let (completed_frameworks, completed_tasks) = if history {
        (
            (0..5)
                .map(|f| framework("completed-framework", f))
                .collect(),
            (10..110)
                .map(|t| {
                    let framework = format!("completed-framework-{}", t % 5);
                    task(n, t, framework, model_pb::TaskState::Finished)
                })
                .collect(),
        )
    } else {
        (Vec::new(), Vec::new())
    };
    pb::ReregisterAgent {
        agent_id: id.to_owned(),
        info: Some(info(n)),
        frameworks: (0..5).map(|f| framework("framework", f)).collect(),
        tasks,
        completed_frameworks,
        completed_tasks,
        tasks_sharing_labels,
        ..Default::default()
    }
}

/// A master with `agents` admitted, restarted before each measurement.
struct Fixture {
    _dir: tempfile::TempDir,
    config: MasterConfig,
    master: Option<MasterServer>,
    ids: Vec<String>,
}

impl Fixture {
    async fn new(agents: usize, security: Security) -> Fixture {
        Fixture::writing(agents, security, Encoding::MessagePack).await
    }

    /// As [`Fixture::new`], its registry written in `encoding`.
    async fn writing(agents: usize, security: Security, encoding: Encoding) -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = MasterConfig {
            registry_encoding: encoding,
            listen: "127.0.0.1:0".into(),
            data_dir: dir.path().join("master"),
            // No pings inside the measurement; the deadline is far beyond it.
            ping_interval: Duration::from_secs(3600),
            // The stand-in agents do not heartbeat: no TTL runs out inside a run.
            heartbeat_min_ttl: Duration::from_secs(24 * 3600),
            // Every stand-in agent presents the one certificate of their shared node.
            agents_per_certificate: usize::MAX,
            ..MasterConfig::new(security)
        };
        let master = start(&config).await;
        let pid = master.pid().clone();
        let registered = join_all((0..agents).map(|n| {
            let pid = pid.clone();
            async move {
                let request = pb::RegisterAgent {
                    info: Some(info(n)),
                    ..Default::default()
                };
                pid.ask(|r| {
                    RegisterAgent {
                        request,
                        reply: r,
                        sender: None,
                    }
                    .into()
                })
                .await
            }
        }))
        .await;
        let ids = registered
            .into_iter()
            .map(|reply| match reply.expect("master answers").result {
                Some(Registration::AgentId(id)) => id,
                other => panic!("registration failed: {other:?}"),
            })
            .collect();
        Fixture {
            _dir: dir,
            config,
            master: Some(master),
            ids,
        }
    }

    /// Kills the leading master's state: shut it down and start it again on the same data
    /// dir, leading and waiting for the admitted agents.
    async fn fail_over(&mut self) -> &MasterServer {
        self.stop().await;
        self.master.insert(start(&self.config).await)
    }

    /// Shuts the master down.
    async fn stop(&mut self) {
        if let Some(master) = self.master.take() {
            master.shutdown().await;
        }
    }

    /// Starts the stopped master again on its data dir; the time until it leads (opening the
    /// registry, reading its snapshot and log, winning its election).
    async fn restart(&mut self) -> Duration {
        let started = Instant::now();
        self.master = Some(start(&self.config).await);
        started.elapsed()
    }
}

async fn start(config: &MasterConfig) -> MasterServer {
    let deadline = Instant::now() + Duration::from_secs(30);
    let master = loop {
        match MasterServer::start(config.clone()).await {
            Ok(master) => break master,
            // The previous master's store closes once its last handle is gone.
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("master did not start: {e}"),
        }
    };
    while !master
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await
        .expect("master answers")
        .is_leader
    {
        assert!(Instant::now() < deadline, "master did not lead");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    master
}

fn check_admitted(replies: impl IntoIterator<Item = pb::RegistrationReply>) {
    for reply in replies {
        assert!(
            matches!(reply.result, Some(Registration::AgentId(_))),
            "re-registration refused: {reply:?}"
        );
    }
}

/// Re-registers every agent with the master's `Pid`; returns the time to the last ack.
async fn in_process(fixture: &mut Fixture, history: bool) -> Duration {
    let messages: Vec<_> = fixture
        .ids
        .iter()
        .enumerate()
        .map(|(n, id)| reregistration(n, id, history))
        .collect();
    let pid = fixture.fail_over().await.pid().clone();
    let started = Instant::now();
    let replies = join_all(messages.into_iter().map(|m| {
        let pid = pid.clone();
        async move {
            pid.ask(|r| {
                ReregisterAgent {
                    request: m,
                    reply: r,
                    sender: None,
                }
                .into()
            })
            .await
        }
    }))
    .await;
    let took = started.elapsed();
    check_admitted(replies.into_iter().map(|r| r.expect("master answers")));
    took
}

/// Re-registers every agent over the tonic transport from a second node.
async fn over_tonic(fixture: &mut Fixture, agents_node: &Node) -> Duration {
    let messages: Vec<_> = fixture
        .ids
        .iter()
        .enumerate()
        .map(|(n, id)| reregistration(n, id, false))
        .collect();
    let address = fixture.fail_over().await.address().to_owned();
    // Open the connection outside the span: an ask to a process that is not there.
    let nobody: Upid = format!("nobody@{address}").parse().expect("upid");
    let _ = agents_node
        .remote(nobody)
        .ask::<pb::Ping, pb::Pong>(pb::Ping::default())
        .await;
    let master = agents_node.remote(format!("master@{address}").parse().expect("upid"));
    let started = Instant::now();
    let replies = join_all(
        messages
            .into_iter()
            .map(|m| master.ask::<pb::ReregisterAgent, pb::RegistrationReply>(m)),
    )
    .await;
    let took = started.elapsed();
    check_admitted(replies.into_iter().map(|r| r.expect("master answers")));
    took
}

/// The floor of the in-process shape: each message with a oneshot through an unbounded
/// channel to a task that files it and answers.
async fn tokio_channel(agents: usize, history: bool) -> Duration {
    let (tx, mut rx) = mpsc::unbounded_channel::<(pb::ReregisterAgent, oneshot::Sender<String>)>();
    let filer = tokio::spawn(async move {
        let mut filed = HashMap::new();
        while let Some((message, ack)) = rx.recv().await {
            let id = message.agent_id.clone();
            filed.insert(id.clone(), message);
            let _ = ack.send(id);
        }
        filed.len()
    });
    let messages: Vec<_> = (0..agents)
        .map(|n| reregistration(n, &format!("agent-{n}"), history))
        .collect();
    let started = Instant::now();
    let acks = join_all(messages.into_iter().map(|m| {
        let (ack, acked) = oneshot::channel();
        let sent = tx.send((m, ack));
        async move {
            assert!(sent.is_ok(), "the filer task runs");
            acked.await.expect("filer answers")
        }
    }))
    .await;
    let took = started.elapsed();
    assert_eq!(acks.len(), agents);
    drop(tx);
    assert_eq!(filer.await.expect("filer"), agents);
    took
}

/// The floor of the tonic shape: length-prefixed prost on a bare loopback TCP connection to
/// a task that decodes, files and acknowledges each message.
async fn raw_tcp(agents: usize) -> Duration {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let server = tokio::spawn(async move {
        let (socket, _) = listener.accept().await.expect("accept");
        socket.set_nodelay(true).expect("nodelay");
        let (read, write) = socket.into_split();
        let mut read = BufReader::new(read);
        let mut write = BufWriter::new(write);
        let mut filed = HashMap::new();
        let mut buffer = Vec::new();
        for _ in 0..agents {
            let len = read.read_u32().await.expect("length") as usize;
            buffer.resize(len, 0);
            read.read_exact(&mut buffer).await.expect("body");
            let message = pb::ReregisterAgent::decode(&buffer[..]).expect("decode");
            let ack = pb::RegistrationReply {
                result: Some(Registration::AgentId(message.agent_id.clone())),
                ..pb::RegistrationReply::default()
            }
            .encode_to_vec();
            filed.insert(message.agent_id.clone(), message);
            write.write_u32(ack.len() as u32).await.expect("ack length");
            write.write_all(&ack).await.expect("ack");
            if read.buffer().is_empty() {
                write.flush().await.expect("flush");
            }
        }
        write.flush().await.expect("flush");
    });
    let socket = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    socket.set_nodelay(true).expect("nodelay");
    let (read, write) = socket.into_split();
    let messages: Vec<_> = (0..agents)
        .map(|n| reregistration(n, &format!("agent-{n}"), false))
        .collect();
    let started = Instant::now();
    let reader = tokio::spawn(async move {
        let mut read = BufReader::new(read);
        let mut buffer = Vec::new();
        for _ in 0..agents {
            let len = read.read_u32().await.expect("length") as usize;
            buffer.resize(len, 0);
            read.read_exact(&mut buffer).await.expect("ack");
            pb::RegistrationReply::decode(&buffer[..]).expect("decode ack");
        }
    });
    let mut write = BufWriter::new(write);
    for message in messages {
        let bytes = message.encode_to_vec();
        write.write_u32(bytes.len() as u32).await.expect("length");
        write.write_all(&bytes).await.expect("body");
    }
    write.flush().await.expect("flush");
    reader.await.expect("reader");
    let took = started.elapsed();
    server.await.expect("server");
    took
}

/// Prints the master's resident memory per agent after one recovery.
fn report_memory(runtime: &Runtime, fixture: &mut Fixture, history: bool) {
    runtime.block_on(async {
        fixture.fail_over().await;
        let before = heap_in_use();
        let agents = fixture.ids.len();
        let pid = fixture.master.as_ref().expect("master").pid().clone();
        let messages: Vec<_> = fixture
            .ids
            .iter()
            .enumerate()
            .map(|(n, id)| reregistration(n, id, history))
            .collect();
        let replies = join_all(messages.into_iter().map(|m| {
            let pid = pid.clone();
            async move {
                pid.ask(|r| {
                    ReregisterAgent {
                        request: m,
                        reply: r,
                        sender: None,
                    }
                    .into()
                })
                .await
            }
        }))
        .await;
        check_admitted(replies.into_iter().map(|r| r.expect("master answers")));
        // The agents' messages are freed beside the master: count the heap once they are.
        assert!(
            muster::master::wait_for_background_frees(Duration::from_secs(60)),
            "the messages were freed"
        );
        let after = heap_in_use();
        eprintln!(
            "failover{}: master memory per agent at {agents} agents: {:.1} KiB",
            if history { "_history" } else { "" },
            (after - before).max(0) as f64 / agents as f64 / 1024.0
        );
    });
}

fn group(c: &mut Criterion, runtime: &Runtime, name: &str, history: bool) {
    let mut group = c.benchmark_group(name);
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_secs(1));
    let agents_system = System::new();
    // Every agent of the bench shares this one link, where real agents have one each: room for
    // all their re-registrations at once (the default, 65,536, is a limit per peer).
    let shared_link = |security| {
        let mut config = NodeConfig::new(security);
        config.max_queued_per_peer = 1 << 20;
        config
    };
    let agents_node = runtime
        .block_on(Node::bind_with(
            &agents_system,
            "127.0.0.1:0",
            shared_link(TestPki::shared().security(Role::Agent, "fake-agents")),
        ))
        .expect("agents node");
    let plaintext_node = runtime
        .block_on(Node::bind_with(
            &agents_system,
            "127.0.0.1:0",
            shared_link(Security::Insecure),
        ))
        .expect("plaintext agents node");
    for agents in sizes()
        .into_iter()
        .filter(|&n| !history || n <= MAX_HISTORY_AGENTS)
    {
        group.throughput(Throughput::Elements(agents as u64));
        let master_tls = TestPki::shared().security(Role::Master, "master-1");
        let mut fixture = runtime.block_on(Fixture::new(agents, master_tls));
        report_memory(runtime, &mut fixture, history);
        group.bench_function(BenchmarkId::new("in_process", agents), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| runtime.block_on(in_process(&mut fixture, history)))
                    .sum()
            });
        });
        group.bench_function(BenchmarkId::new("tokio_channel", agents), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| runtime.block_on(tokio_channel(agents, history)))
                    .sum()
            });
        });
        if !history {
            group.bench_function(BenchmarkId::new("tonic_tls", agents), |b| {
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| runtime.block_on(over_tonic(&mut fixture, &agents_node)))
                        .sum()
                });
            });
            let mut plaintext = runtime.block_on(Fixture::new(agents, Security::Insecure));
            group.bench_function(BenchmarkId::new("tonic_plaintext", agents), |b| {
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| runtime.block_on(over_tonic(&mut plaintext, &plaintext_node)))
                        .sum()
                });
            });
            if let Some(master) = plaintext.master.take() {
                runtime.block_on(master.shutdown());
            }
            group.bench_function(BenchmarkId::new("raw_tcp", agents), |b| {
                b.iter_custom(|iters| (0..iters).map(|_| runtime.block_on(raw_tcp(agents))).sum());
            });
        }
        if let Some(master) = fixture.master.take() {
            runtime.block_on(master.shutdown());
        }
    }
    agents_node.shutdown();
    plaintext_node.shutdown();
    group.finish();
}

/// The registry's encoding in a failover, same run: a master with [`ENCODING_AGENTS`]
/// admitted writing MessagePack, and one writing JSON (the encoding before it). `restart/...`
/// times a stopped master's start until it leads (its registry opened, snapshot and log read,
/// election won): the part of a failover that reads the registry. `in_process/...` is the
/// re-registration span the `failover` group measures, which writes nothing to the registry.
fn registry_encoding(c: &mut Criterion, runtime: &Runtime) {
    let mut group = c.benchmark_group("failover_registry_encoding");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_secs(1));
    group.throughput(Throughput::Elements(ENCODING_AGENTS as u64));
    for (name, encoding) in [("msgpack", Encoding::MessagePack), ("json", Encoding::Json)] {
        let security = TestPki::shared().security(Role::Master, "master-1");
        let mut fixture = runtime.block_on(Fixture::writing(ENCODING_AGENTS, security, encoding));
        group.bench_function(BenchmarkId::new("restart", name), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        runtime.block_on(async {
                            fixture.stop().await;
                            fixture.restart().await
                        })
                    })
                    .sum()
            });
        });
        group.bench_function(BenchmarkId::new("in_process", name), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| runtime.block_on(in_process(&mut fixture, false)))
                    .sum()
            });
        });
        runtime.block_on(fixture.stop());
    }
    group.finish();
}

/// Agents admitted in `failover_registry_encoding`.
const ENCODING_AGENTS: usize = 10_000;

fn failover(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    group(c, &runtime, "failover", false);
    group(c, &runtime, "failover_history", true);
    registry_encoding(c, &runtime);
}

criterion_group!(benches, failover);
criterion_main!(benches);
