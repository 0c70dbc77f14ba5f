//! The groups of `message_throughput`, shared by the bench targets that run them on different
//! global allocators (see the targets' own headers).
//! The local groups (tell, ask, spawn and stop) are here, the remote ones in `two_nodes`.

use std::future::Future;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, SamplingMode, Throughput, criterion_group};
use kameo::actor::Spawn as _;
use muster::actor::{Context, Node, Pid, Process, RemoteError, RemotePid, Reply, System, Upid};
use muster::proto::example::{Ping, Pong};
use muster_security::testing::TestPki;
use muster_security::{Role, Security};
use tokio::io::{
    AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufStream, BufWriter,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};

mod two_nodes;

/// Messages per iteration in the tell groups.
const TELLS: u64 = 100_000;
/// Sequential round trips per iteration in `ask_round_trip`.
const ASKS: u64 = 10_000;
/// Processes (or tasks) spawned and stopped per iteration in `spawn_stop`.
const SPAWNS: u64 = 10_000;
/// Producers in `tell_four_to_one`.
const PRODUCERS: u64 = 4;
/// Capacity of the bounded mailbox and of the bounded tokio channel.
const BOUND: usize = 1024;

/// The criterion group `name`, as the running bench target names it: the allocator it runs on is
/// part of the name unless it is mimalloc (`target/criterion/<group>/` then keeps the two apart).
fn group_name(name: &str) -> String {
    format!("{name}{}", crate::GROUP_SUFFIX)
}

/// The machine has two cores; more workers would only measure oversubscription.
fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("build the tokio runtime")
}

/// Few samples and short windows, so that the whole file runs in a few minutes. An iteration
/// takes milliseconds, so flat sampling (the same iteration count in every sample) keeps the
/// run within its time instead of growing to 210 iterations for the linear fit.
fn configure(group: &mut BenchmarkGroup<'_, WallTime>, elements: u64) {
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .throughput(Throughput::Elements(elements));
}

/// Runs `work` as a task on a runtime worker, where actor code runs, rather than on the thread
/// criterion blocks on: otherwise every wake-up of that task would cross threads.
async fn on_worker<F>(work: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(work).await.expect("bench task panicked")
}

// ---------------------------------------------------------------------------------------------
// Tell: a counting sink, behind a process or behind a plain channel.
// ---------------------------------------------------------------------------------------------

/// Counts messages, and answers `done` once it has seen as many as it was told to expect.
/// The process and the baseline consumer task run this same code.
#[derive(Default)]
struct Sink {
    left: u64,
    done: Option<oneshot::Sender<()>>,
}

enum SinkMsg {
    /// Arrives before the batch: how many items follow, and whom to tell when they are in.
    Expect(u64, oneshot::Sender<()>),
    Item(u64),
}

impl Sink {
    fn on(&mut self, msg: SinkMsg) {
        match msg {
            SinkMsg::Expect(n, done) => {
                self.left = n;
                self.done = Some(done);
            }
            SinkMsg::Item(x) => {
                black_box(x);
                self.left -= 1;
                if self.left == 0
                    && let Some(done) = self.done.take()
                {
                    let _ = done.send(());
                }
            }
        }
    }
}

impl Process for Sink {
    type Message = SinkMsg;

    async fn handle(&mut self, msg: SinkMsg, _ctx: &mut Context<Self>) {
        self.on(msg);
    }
}

/// The same consumer loop as a plain tokio task.
async fn consume(mut next: impl AsyncRecv) {
    let mut sink = Sink::default();
    while let Some(msg) = next.recv().await {
        sink.on(msg);
    }
}

/// `recv` on both kinds of tokio receiver.
trait AsyncRecv: Send + 'static {
    fn recv(&mut self) -> impl Future<Output = Option<SinkMsg>> + Send;
}

impl AsyncRecv for mpsc::Receiver<SinkMsg> {
    fn recv(&mut self) -> impl Future<Output = Option<SinkMsg>> + Send {
        mpsc::Receiver::recv(self)
    }
}

impl AsyncRecv for mpsc::UnboundedReceiver<SinkMsg> {
    fn recv(&mut self) -> impl Future<Output = Option<SinkMsg>> + Send {
        mpsc::UnboundedReceiver::recv(self)
    }
}

/// Where a producer puts messages; one impl per case, so each loop is monomorphic.
trait Inbox: Clone + Send + Sync + 'static {
    fn put(&self, msg: SinkMsg) -> impl Future<Output = ()> + Send;
}

/// `pid.tell`: never waits (unbounded mailbox).
#[derive(Clone)]
struct Tell(Pid<Sink>);

impl Inbox for Tell {
    fn put(&self, msg: SinkMsg) -> impl Future<Output = ()> + Send {
        self.0.tell(msg).expect("the sink process is running");
        std::future::ready(())
    }
}

/// `pid.send().await`: waits for room in a bounded mailbox.
#[derive(Clone)]
struct SendWait(Pid<Sink>);

impl Inbox for SendWait {
    async fn put(&self, msg: SinkMsg) {
        self.0.send(msg).await.expect("the sink process is running");
    }
}

impl Inbox for mpsc::Sender<SinkMsg> {
    async fn put(&self, msg: SinkMsg) {
        if self.send(msg).await.is_err() {
            panic!("the consumer task is running");
        }
    }
}

impl Inbox for mpsc::UnboundedSender<SinkMsg> {
    fn put(&self, msg: SinkMsg) -> impl Future<Output = ()> + Send {
        if self.send(msg).is_err() {
            panic!("the consumer task is running");
        }
        std::future::ready(())
    }
}

/// One timed iteration: announce `TELLS` items, let `producers` tasks send `TELLS / producers`
/// each, and wait for the sink to have handled the last one.
async fn tell_batch<I: Inbox>(inbox: &I, producers: u64) {
    let (done, handled) = oneshot::channel();
    // Queued before any producer starts, so the sink knows the count before the first item.
    inbox.put(SinkMsg::Expect(TELLS, done)).await;
    let share = TELLS / producers;
    let tasks: Vec<_> = (0..producers)
        .map(|p| {
            let inbox = inbox.clone();
            tokio::spawn(async move {
                for i in p * share..(p + 1) * share {
                    inbox.put(SinkMsg::Item(i)).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("producer panicked");
    }
    handled
        .await
        .expect("the sink answers when all items are in");
}

/// The four tell cases of one group, one set of receivers for the whole group.
fn bench_tells(c: &mut Criterion, name: &str, producers: u64) {
    let rt = runtime();
    let system = System::new();
    let (unbounded, bounded, tokio_bounded, tokio_unbounded) = {
        let _in_runtime = rt.enter();
        let (tokio_bounded, rx) = mpsc::channel(BOUND);
        rt.spawn(consume(rx));
        let (tokio_unbounded, rx) = mpsc::unbounded_channel();
        rt.spawn(consume(rx));
        (
            Tell(system.spawn(Sink::default())),
            SendWait(system.spawn_bounded(Sink::default(), BOUND)),
            tokio_bounded,
            tokio_unbounded,
        )
    };

    let mut group = c.benchmark_group(group_name(name));
    configure(&mut group, TELLS);
    group.bench_function("muster_tell_unbounded", |b| {
        b.to_async(&rt).iter(|| tell_batch(&unbounded, producers));
    });
    group.bench_function("muster_send_bounded_1024", |b| {
        b.to_async(&rt).iter(|| tell_batch(&bounded, producers));
    });
    group.bench_function("tokio_mpsc_bounded_1024", |b| {
        b.to_async(&rt)
            .iter(|| tell_batch(&tokio_bounded, producers));
    });
    group.bench_function("tokio_mpsc_unbounded", |b| {
        b.to_async(&rt)
            .iter(|| tell_batch(&tokio_unbounded, producers));
    });
    group.finish();

    rt.block_on(async {
        for pid in [&unbounded.0, &bounded.0] {
            pid.terminate();
            pid.wait().await;
        }
    });
}

fn bench_tell_one_to_one(c: &mut Criterion) {
    bench_tells(c, "tell_one_to_one", 1);
}

fn bench_tell_four_to_one(c: &mut Criterion) {
    bench_tells(c, "tell_four_to_one", PRODUCERS);
}

// ---------------------------------------------------------------------------------------------
// Ask: sequential request/response from one task.
// ---------------------------------------------------------------------------------------------

/// Answers each ping with how many it has served.
#[derive(Default)]
struct Echo {
    served: u64,
}

enum EchoMsg {
    Ping(Reply<u64>),
}

impl Process for Echo {
    type Message = EchoMsg;

    async fn handle(&mut self, msg: EchoMsg, _ctx: &mut Context<Self>) {
        let EchoMsg::Ping(reply) = msg;
        self.served += 1;
        reply.send(self.served);
    }
}

fn bench_ask_round_trip(c: &mut Criterion) {
    let rt = runtime();
    let system = System::new();
    let (echo, requests) = {
        let _in_runtime = rt.enter();
        let (requests, mut rx) = mpsc::unbounded_channel::<oneshot::Sender<u64>>();
        rt.spawn(async move {
            let mut served = 0;
            while let Some(reply) = rx.recv().await {
                served += 1;
                let _ = reply.send(served);
            }
        });
        (system.spawn(Echo::default()), requests)
    };

    let mut group = c.benchmark_group(group_name("ask_round_trip"));
    configure(&mut group, ASKS);
    group.bench_function("muster_ask", |b| {
        b.to_async(&rt).iter(|| {
            let echo = echo.clone();
            on_worker(async move {
                for _ in 0..ASKS {
                    black_box(echo.ask(EchoMsg::Ping).await.expect("echo answers"));
                }
            })
        });
    });
    group.bench_function("tokio_mpsc_oneshot", |b| {
        b.to_async(&rt).iter(|| {
            let requests = requests.clone();
            on_worker(async move {
                for _ in 0..ASKS {
                    let (reply, answer) = oneshot::channel();
                    if requests.send(reply).is_err() {
                        panic!("the serving task is running");
                    }
                    black_box(answer.await.expect("the serving task answers"));
                }
            })
        });
    });
    group.finish();

    rt.block_on(async {
        echo.terminate();
        echo.wait().await;
    });
}

// ---------------------------------------------------------------------------------------------
// Spawn and stop: the whole life of a process that does nothing.
// ---------------------------------------------------------------------------------------------

struct Idle;

impl Process for Idle {
    type Message = ();

    async fn handle(&mut self, _msg: (), _ctx: &mut Context<Self>) {}
}

fn bench_spawn_stop(c: &mut Criterion) {
    let rt = runtime();
    let system = System::new();

    let mut group = c.benchmark_group(group_name("spawn_stop"));
    configure(&mut group, SPAWNS);
    group.bench_function("muster_spawn_terminate_wait", |b| {
        b.to_async(&rt).iter(|| {
            let system = system.clone();
            on_worker(async move {
                let pids: Vec<Pid<Idle>> = (0..SPAWNS).map(|_| system.spawn(Idle)).collect();
                for pid in &pids {
                    pid.terminate();
                }
                for pid in &pids {
                    black_box(pid.wait().await);
                }
            })
        });
    });
    group.bench_function("tokio_spawn_oneshot_join", |b| {
        b.to_async(&rt).iter(|| {
            on_worker(async move {
                let tasks: Vec<_> = (0..SPAWNS)
                    .map(|_| {
                        let (stop, stopped) = oneshot::channel::<()>();
                        let task = tokio::spawn(async move {
                            let _ = stopped.await;
                        });
                        (stop, task)
                    })
                    .collect();
                let mut joins = Vec::with_capacity(tasks.len());
                for (stop, task) in tasks {
                    let _ = stop.send(());
                    joins.push(task);
                }
                for task in joins {
                    task.await.expect("task ends cleanly");
                }
            })
        });
    });
    group.bench_function("kameo_spawn_stop_wait", |b| {
        b.to_async(&rt).iter(|| {
            on_worker(async move {
                let actors: Vec<_> = (0..SPAWNS)
                    .map(|_| KameoIdle::spawn_with_mailbox(KameoIdle, kameo::mailbox::unbounded()))
                    .collect();
                for actor in &actors {
                    actor.stop_gracefully().await.expect("the actor is running");
                }
                for actor in &actors {
                    actor.wait_for_shutdown().await;
                }
            })
        });
    });
    group.bench_function("ractor_spawn_stop_join", |b| {
        b.to_async(&rt).iter(|| {
            on_worker(async move {
                let mut actors = Vec::with_capacity(SPAWNS as usize);
                for _ in 0..SPAWNS {
                    let spawned = ractor::Actor::spawn(None, RactorIdle, ()).await;
                    actors.push(spawned.expect("the actor starts"));
                }
                for (actor, _) in &actors {
                    actor.stop(None);
                }
                for (_, task) in actors {
                    task.await.expect("the actor ends cleanly");
                }
            })
        });
    });
    group.finish();
    assert!(system.is_empty(), "every spawned process has ended");
}

/// `Idle` as a kameo actor (unbounded mailbox, as Muster's `spawn`): stopped with
/// `stop_gracefully`, awaited with `wait_for_shutdown`.
struct KameoIdle;

impl kameo::Actor for KameoIdle {
    type Args = Self;
    type Error = kameo::error::Infallible;

    async fn on_start(
        args: Self,
        _actor_ref: kameo::actor::ActorRef<Self>,
    ) -> Result<Self, Self::Error> {
        Ok(args)
    }
}

/// `Idle` as a ractor actor: `Actor::spawn` (which waits for `pre_start`), `stop`, and the
/// `JoinHandle` it returns.
struct RactorIdle;

impl ractor::Actor for RactorIdle {
    type Msg = ();
    type State = ();
    type Arguments = ();

    async fn pre_start(
        &self,
        _myself: ractor::ActorRef<()>,
        _args: (),
    ) -> Result<(), ractor::ActorProcessingErr> {
        Ok(())
    }
}

criterion_group!(
    local,
    bench_tell_one_to_one,
    bench_tell_four_to_one,
    bench_ask_round_trip,
    bench_spawn_stop
);
criterion_group!(
    remote,
    two_nodes::bench_remote_tell,
    two_nodes::bench_remote_ask
);
