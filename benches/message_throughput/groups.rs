//! The groups of `message_throughput`, shared by the bench targets that run them on different
//! global allocators (see the targets' own headers).

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

// ---------------------------------------------------------------------------------------------
// Remote: two nodes in this process, one tonic link over loopback, next to raw TCP + prost.
// ---------------------------------------------------------------------------------------------

// The remote groups use the examples' messages (proto/muster/example/v1/ping.proto): `Ping` is
// both the told message and the asked request, `Pong` the answer.

/// Messages told over the link per iteration in `remote_tell`.
const REMOTE_TELLS: u64 = 100_000;
/// Sequential round trips per iteration in `remote_ask`.
const REMOTE_ASKS: u64 = 2_000;
/// Round trips timed one by one for the latency percentiles printed after `remote_ask`.
const LATENCY_SAMPLES: usize = 5_000;

/// Node B, serving `sink` (counts told `Ping`s) and `echo` (answers `Ping`s), and node A, which
/// reaches them over one link. Both nodes live in this process, on the bench runtime.
struct Nodes {
    system: System,
    a: Node,
    b: Node,
}

/// TLS for a bench node, from the shared test CA.
fn tls(name: &str) -> Security {
    TestPki::shared().security(Role::Agent, name)
}

impl Nodes {
    /// Two nodes, A with `a` and B with `b` (TLS, or the plaintext baseline).
    async fn bind(a: Security, b: Security) -> Nodes {
        let system = System::new();
        let b = Node::bind(&system, "127.0.0.1:0", b)
            .await
            .expect("bind node B");
        let a = Node::bind(&system, "127.0.0.1:0", a)
            .await
            .expect("bind node A");
        Nodes { system, a, b }
    }

    /// A handle, on node A, to the process named `name` on node B.
    fn remote(&self, name: &str) -> RemotePid {
        self.a
            .remote(Upid::new(name, self.b.address()).expect("a valid upid"))
    }

    async fn shutdown(self) {
        self.a.shutdown();
        self.b.shutdown();
        self.system.shutdown().await;
    }
}

/// One timed `remote_send` iteration: tell the sink (locally, through its `Pid`) how many ticks
/// to expect, send `n` ticks through node A with `RemotePid::send` (which waits out a full peer
/// queue and yields now and then), and wait for the sink to have counted the last.
async fn remote_send_batch(sink: Pid<Sink>, remote: RemotePid, n: u64) {
    let (done, handled) = oneshot::channel();
    sink.tell(SinkMsg::Expect(n, done))
        .expect("the sink process is running");
    for seq in 0..n {
        if let Err(e) = remote.send(Ping { seq }).await {
            panic!("remote send failed: {e}");
        }
    }
    handled
        .await
        .expect("the sink answers when all ticks are in");
}

/// One timed `remote_tell` iteration: as `remote_send_batch`, with `RemotePid::tell`, which
/// never waits: a full peer queue (`max_queued_per_peer`) is waited out here, as a sender
/// would; `waits` counts how often that happened.
async fn remote_tell_batch(sink: Pid<Sink>, remote: RemotePid, n: u64, waits: Arc<AtomicU64>) {
    let (done, handled) = oneshot::channel();
    sink.tell(SinkMsg::Expect(n, done))
        .expect("the sink process is running");
    for seq in 0..n {
        loop {
            match remote.tell(Ping { seq }) {
                Ok(()) => break,
                Err(RemoteError::QueueFull(_)) => {
                    waits.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
                Err(e) => panic!("remote tell failed: {e}"),
            }
        }
    }
    handled
        .await
        .expect("the sink answers when all ticks are in");
}

/// A connected pair of loopback sockets with Nagle off, as tonic's are.
async fn loopback() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback listener");
    let address = listener.local_addr().expect("listener address");
    let (client, accepted) = tokio::join!(TcpStream::connect(address), listener.accept());
    let client = client.expect("connect over loopback");
    let (server, _) = accepted.expect("accept over loopback");
    for socket in [&client, &server] {
        socket.set_nodelay(true).expect("set TCP_NODELAY");
    }
    (client, server)
}

/// Writes `msg` with a 4-byte little-endian length prefix (into the writer's buffer; the
/// caller flushes). `scratch` is reused between messages.
async fn write_framed<W, M>(writer: &mut W, msg: &M, scratch: &mut Vec<u8>)
where
    W: AsyncWrite + Unpin,
    M: prost::Message,
{
    scratch.clear();
    let len = u32::try_from(msg.encoded_len()).expect("a small message");
    scratch.extend_from_slice(&len.to_le_bytes());
    msg.encode(scratch).expect("a Vec grows as needed");
    writer
        .write_all(scratch)
        .await
        .expect("write to the loopback socket");
}

/// Reads one length-prefixed message; `None` once the peer has closed the connection.
async fn read_framed<R, M>(reader: &mut R, scratch: &mut Vec<u8>) -> Option<M>
where
    R: AsyncRead + Unpin,
    M: prost::Message + Default,
{
    let len = match reader.read_u32_le().await {
        Ok(len) => len as usize,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return None,
        Err(e) => panic!("read from the loopback socket: {e}"),
    };
    scratch.resize(len, 0);
    reader
        .read_exact(scratch)
        .await
        .expect("read a whole message");
    Some(M::decode(&scratch[..]).expect("a well-formed message"))
}

/// The sending end of the raw tell baseline: a buffered socket, and the reader task's word
/// that another whole batch has been decoded.
struct RawTellClient {
    writer: BufWriter<TcpStream>,
    batches: mpsc::UnboundedReceiver<()>,
    scratch: Vec<u8>,
}

impl RawTellClient {
    /// Starts the reader task on the other end of a fresh loopback connection.
    async fn connect() -> RawTellClient {
        let (client, server) = loopback().await;
        let (done, batches) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(server);
            let mut scratch = Vec::new();
            let mut count = 0u64;
            while let Some(tick) = read_framed::<_, Ping>(&mut reader, &mut scratch).await {
                black_box(tick.seq);
                count += 1;
                if count.is_multiple_of(REMOTE_TELLS) {
                    let _ = done.send(());
                }
            }
        });
        RawTellClient {
            writer: BufWriter::new(client),
            batches,
            scratch: Vec::new(),
        }
    }

    /// One timed `raw_tcp_prost` tell iteration: write `REMOTE_TELLS` ticks, flush, and wait
    /// until the reader has decoded the last.
    async fn batch(&mut self) {
        for seq in 0..REMOTE_TELLS {
            write_framed(&mut self.writer, &Ping { seq }, &mut self.scratch).await;
        }
        self.writer
            .flush()
            .await
            .expect("flush the loopback socket");
        self.batches
            .recv()
            .await
            .expect("the reader task decodes every batch");
    }
}

/// Nodes with a `sink` on B, a handle to it from A, and the link already up.
async fn tell_pair(
    a: Security,
    b: Security,
    waits: &Arc<AtomicU64>,
) -> (Nodes, Pid<Sink>, RemotePid) {
    let nodes = Nodes::bind(a, b).await;
    let sink = nodes.system.spawn(Sink::default());
    nodes
        .b
        .register("sink", &sink)
        .expect("register the sink")
        .install::<Ping>(|ping| SinkMsg::Item(ping.seq));
    let remote = nodes.remote("sink");
    // Connect the link outside the timed loop.
    remote_tell_batch(sink.clone(), remote.clone(), 1, Arc::clone(waits)).await;
    (nodes, sink, remote)
}

fn bench_remote_tell(c: &mut Criterion) {
    let rt = runtime();
    let waits = Arc::new(AtomicU64::new(0));
    let (nodes, sink, remote, plain, raw) = rt.block_on(async {
        let (nodes, sink, remote) = tell_pair(tls("a"), tls("b"), &waits).await;
        let plain = tell_pair(Security::Insecure, Security::Insecure, &waits).await;
        let raw = RawTellClient::connect().await;
        (
            nodes,
            sink,
            remote,
            plain,
            Arc::new(tokio::sync::Mutex::new(raw)),
        )
    });
    waits.store(0, Ordering::Relaxed);
    let received_before = nodes.b.stats();

    let mut group = c.benchmark_group(group_name("remote_tell"));
    configure(&mut group, REMOTE_TELLS);
    group.bench_function("muster_remote_tell_tls", |bench| {
        bench.to_async(&rt).iter(|| {
            on_worker(remote_tell_batch(
                sink.clone(),
                remote.clone(),
                REMOTE_TELLS,
                Arc::clone(&waits),
            ))
        });
    });
    group.bench_function("muster_remote_send_tls", |bench| {
        bench.to_async(&rt).iter(|| {
            on_worker(remote_send_batch(
                sink.clone(),
                remote.clone(),
                REMOTE_TELLS,
            ))
        });
    });
    group.bench_function("muster_remote_send_plaintext", |bench| {
        bench.to_async(&rt).iter(|| {
            on_worker(remote_send_batch(
                plain.1.clone(),
                plain.2.clone(),
                REMOTE_TELLS,
            ))
        });
    });
    group.bench_function("raw_tcp_prost", |bench| {
        bench.to_async(&rt).iter(|| {
            let raw = Arc::clone(&raw);
            on_worker(async move { raw.lock().await.batch().await })
        });
    });
    group.finish();

    let received = nodes.b.stats();
    let envelopes = received.envelopes_received - received_before.envelopes_received;
    let frames = received.frames_received - received_before.frames_received;
    if frames > 0 {
        eprintln!(
            "remote_tell: {envelopes} envelopes in {frames} frames ({:.0} per frame), \
             {} waits on a full peer queue, {} dead letters",
            envelopes as f64 / frames as f64,
            waits.load(Ordering::Relaxed),
            received.dead_letters(),
        );
    }
    rt.block_on(nodes.shutdown());
    rt.block_on(plain.0.shutdown());
}

/// Answers each remote `Ping` with its `seq`.
struct RemoteEcho;

enum RemoteEchoMsg {
    Ping(Ping, Reply<Pong>),
}

impl Process for RemoteEcho {
    type Message = RemoteEchoMsg;

    async fn handle(&mut self, msg: RemoteEchoMsg, _ctx: &mut Context<Self>) {
        let RemoteEchoMsg::Ping(ping, reply) = msg;
        reply.send(Pong {
            seq: ping.seq,
            from: String::new(),
        });
    }
}

/// The asking end of the raw ask baseline: one buffered socket to a task that answers each
/// `Ping` with a `Pong` and flushes.
struct RawAskClient {
    stream: BufStream<TcpStream>,
    scratch: Vec<u8>,
}

impl RawAskClient {
    async fn connect() -> RawAskClient {
        let (client, server) = loopback().await;
        tokio::spawn(async move {
            let mut stream = BufStream::new(server);
            let mut scratch = Vec::new();
            while let Some(ping) = read_framed::<_, Ping>(&mut stream, &mut scratch).await {
                write_framed(
                    &mut stream,
                    &Pong {
                        seq: ping.seq,
                        from: String::new(),
                    },
                    &mut scratch,
                )
                .await;
                stream.flush().await.expect("flush the answer");
            }
        });
        RawAskClient {
            stream: BufStream::new(client),
            scratch: Vec::new(),
        }
    }

    /// One round trip: write the request, flush, read the answer.
    async fn ask(&mut self, seq: u64) -> Pong {
        write_framed(&mut self.stream, &Ping { seq }, &mut self.scratch).await;
        self.stream.flush().await.expect("flush the request");
        read_framed(&mut self.stream, &mut self.scratch)
            .await
            .expect("the serving task answers")
    }
}

async fn remote_asks(echo: RemotePid, n: u64) {
    for seq in 0..n {
        let pong: Pong = echo.ask(Ping { seq }).await.expect("echo answers");
        black_box(pong.seq);
    }
}

async fn raw_asks(raw: Arc<tokio::sync::Mutex<RawAskClient>>, n: u64) {
    let mut raw = raw.lock().await;
    for seq in 0..n {
        black_box(raw.ask(seq).await.seq);
    }
}

/// Times `LATENCY_SAMPLES` round trips one by one, on a worker, for both cases, and returns
/// the sorted samples of each.
async fn ask_latencies(
    echo: RemotePid,
    raw: Arc<tokio::sync::Mutex<RawAskClient>>,
) -> (Vec<Duration>, Vec<Duration>) {
    let muster = on_worker(async move {
        let mut samples = Vec::with_capacity(LATENCY_SAMPLES);
        for seq in 0..LATENCY_SAMPLES as u64 {
            let start = Instant::now();
            let pong: Pong = echo.ask(Ping { seq }).await.expect("echo answers");
            samples.push(start.elapsed());
            black_box(pong.seq);
        }
        samples
    });
    let muster = muster.await;
    let raw = on_worker(async move {
        let mut raw = raw.lock().await;
        let mut samples = Vec::with_capacity(LATENCY_SAMPLES);
        for seq in 0..LATENCY_SAMPLES as u64 {
            let start = Instant::now();
            black_box(raw.ask(seq).await.seq);
            samples.push(start.elapsed());
        }
        samples
    })
    .await;
    let sorted = |mut samples: Vec<Duration>| {
        samples.sort_unstable();
        samples
    };
    (sorted(muster), sorted(raw))
}

/// `p50 / p90 / p99` of sorted samples, in µs.
fn percentiles(sorted: &[Duration]) -> String {
    let at = |q: f64| {
        let i = ((sorted.len() as f64 * q) as usize).min(sorted.len() - 1);
        sorted[i].as_secs_f64() * 1e6
    };
    format!(
        "p50 {:.1} µs, p90 {:.1} µs, p99 {:.1} µs",
        at(0.5),
        at(0.9),
        at(0.99)
    )
}

/// Nodes with an `echo` on B, a handle to it from A, and the link already up.
async fn ask_pair(a: Security, b: Security) -> (Nodes, RemotePid) {
    let nodes = Nodes::bind(a, b).await;
    let pid = nodes.system.spawn(RemoteEcho);
    nodes
        .b
        .register("echo", &pid)
        .expect("register the echo")
        .install_ask::<Ping, Pong>(RemoteEchoMsg::Ping);
    let echo = nodes.remote("echo");
    // Connect the link outside the timed loop.
    remote_asks(echo.clone(), 10).await;
    (nodes, echo)
}

fn bench_remote_ask(c: &mut Criterion) {
    let rt = runtime();
    let (nodes, echo, plain, raw) = rt.block_on(async {
        let (nodes, echo) = ask_pair(tls("a"), tls("b")).await;
        let plain = ask_pair(Security::Insecure, Security::Insecure).await;
        let raw = Arc::new(tokio::sync::Mutex::new(RawAskClient::connect().await));
        (nodes, echo, plain, raw)
    });

    let mut ran = false;
    let mut group = c.benchmark_group(group_name("remote_ask"));
    configure(&mut group, REMOTE_ASKS);
    group.bench_function("muster_remote_ask_tls", |bench| {
        ran = true;
        bench
            .to_async(&rt)
            .iter(|| on_worker(remote_asks(echo.clone(), REMOTE_ASKS)));
    });
    group.bench_function("muster_remote_ask_plaintext", |bench| {
        bench
            .to_async(&rt)
            .iter(|| on_worker(remote_asks(plain.1.clone(), REMOTE_ASKS)));
    });
    group.bench_function("raw_tcp_prost", |bench| {
        bench
            .to_async(&rt)
            .iter(|| on_worker(raw_asks(Arc::clone(&raw), REMOTE_ASKS)));
    });
    group.finish();

    // Criterion's time per iteration divided by `REMOTE_ASKS` is the mean round trip; the
    // median (the target) needs each round trip timed on its own. Skipped when the group was
    // filtered out.
    if ran {
        let (muster, raw_tcp) = rt.block_on(ask_latencies(echo.clone(), Arc::clone(&raw)));
        let (plaintext, _) = rt.block_on(ask_latencies(plain.1.clone(), Arc::clone(&raw)));
        eprintln!(
            "remote_ask round trip over {LATENCY_SAMPLES} sequential asks: \
             muster_remote_ask_tls {}; muster_remote_ask_plaintext {}; raw_tcp_prost {}",
            percentiles(&muster),
            percentiles(&plaintext),
            percentiles(&raw_tcp)
        );
    }
    rt.block_on(nodes.shutdown());
    rt.block_on(plain.0.shutdown());
}

criterion_group!(
    local,
    bench_tell_one_to_one,
    bench_tell_four_to_one,
    bench_ask_round_trip,
    bench_spawn_stop
);
criterion_group!(remote, bench_remote_tell, bench_remote_ask);
