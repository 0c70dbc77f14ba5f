//! The remote groups: two nodes in this process, one tonic link over loopback, next to raw TCP
//! and prost. They use the examples' messages (proto/muster/example/v1/ping.proto): `Ping` is
//! both the told message and the asked request, `Pong` the answer. The ask group also runs
//! a bare tonic bidirectional stream that answers each `Ping` with a `Pong` (the example
//! proto's `Echo` service) over the same mutual TLS: the floor of staying on tonic.

use super::*;

use futures_util::StreamExt as _;
use muster::actor::NodeConfig;
use muster::proto::example::echo_client::EchoClient;
use muster::proto::example::echo_server::{Echo, EchoServer};

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

pub(super) fn bench_remote_tell(c: &mut Criterion) {
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

/// The bare tonic echo: each `Ping` of the stream answered with a `Pong`, nothing else.
struct TonicEcho;

#[tonic::async_trait]
impl Echo for TonicEcho {
    type EchoStream = std::pin::Pin<
        Box<dyn futures_util::Stream<Item = Result<Pong, tonic::Status>> + Send + 'static>,
    >;

    async fn echo(
        &self,
        request: tonic::Request<tonic::Streaming<Ping>>,
    ) -> Result<tonic::Response<Self::EchoStream>, tonic::Status> {
        let answers = request.into_inner().map(|ping| {
            ping.map(|ping| Pong {
                seq: ping.seq,
                from: String::new(),
            })
        });
        Ok(tonic::Response::new(Box::pin(answers)))
    }
}

/// The asking end of the tonic echo floor: one bidirectional stream, over mutual TLS, to a
/// server node serving [`TonicEcho`] beside its transport (as a master serves its APIs).
struct TonicEchoClient {
    /// The server's node (kept for its lifetime).
    _server: Node,
    requests: mpsc::Sender<Ping>,
    answers: tonic::Streaming<Pong>,
}

impl TonicEchoClient {
    async fn connect(system: &System) -> TonicEchoClient {
        let listener = Node::listen("127.0.0.1:0").await.expect("bind the echo");
        let routes = tonic::service::Routes::new(EchoServer::new(TonicEcho));
        let server = Node::serve(system, listener, NodeConfig::new(tls("b")), routes)
            .expect("serve the echo");
        let endpoint =
            tonic::transport::Endpoint::from_shared(format!("http://{}", server.address()))
                .expect("an endpoint");
        let (channel, _) = tls("a")
            .channel(endpoint, &[Role::Agent])
            .await
            .expect("connect to the echo");
        let (requests, to_send) = mpsc::channel::<Ping>(16);
        let outgoing = futures_util::stream::unfold(to_send, |mut to_send| async move {
            to_send.recv().await.map(|ping| (ping, to_send))
        });
        let answers = EchoClient::new(channel)
            .echo(outgoing)
            .await
            .expect("open the echo stream")
            .into_inner();
        TonicEchoClient {
            _server: server,
            requests,
            answers,
        }
    }

    /// One round trip: send the request on the stream, read the answer from it.
    async fn ask(&mut self, seq: u64) -> Pong {
        self.requests
            .send(Ping { seq })
            .await
            .expect("the stream is open");
        self.answers
            .message()
            .await
            .expect("the echo answers")
            .expect("the stream goes on")
    }
}

async fn tonic_asks(tonic: Arc<tokio::sync::Mutex<TonicEchoClient>>, n: u64) {
    let mut tonic = tonic.lock().await;
    for seq in 0..n {
        black_box(tonic.ask(seq).await.seq);
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

/// Round trips per case in one block of `ask_latencies`: the cases take turns block by block,
/// so that a change in the shared machine's load falls on every case alike.
const LATENCY_BLOCK: usize = 100;

/// The round trips `ask_latencies` timed for each case, sorted.
struct AskLatencies {
    muster_tls: Vec<Duration>,
    muster_plaintext: Vec<Duration>,
    tonic_echo: Vec<Duration>,
    raw_tcp: Vec<Duration>,
}

/// Times `LATENCY_SAMPLES` round trips of each case one by one, on a worker, the cases taking
/// turns in blocks of `LATENCY_BLOCK`.
async fn ask_latencies(
    echo: RemotePid,
    plain: RemotePid,
    raw: Arc<tokio::sync::Mutex<RawAskClient>>,
    tonic: Arc<tokio::sync::Mutex<TonicEchoClient>>,
) -> AskLatencies {
    on_worker(async move {
        let mut raw = raw.lock().await;
        let mut tonic = tonic.lock().await;
        let mut latencies = AskLatencies {
            muster_tls: Vec::with_capacity(LATENCY_SAMPLES),
            muster_plaintext: Vec::with_capacity(LATENCY_SAMPLES),
            tonic_echo: Vec::with_capacity(LATENCY_SAMPLES),
            raw_tcp: Vec::with_capacity(LATENCY_SAMPLES),
        };
        let mut seq = 0u64;
        while latencies.muster_tls.len() < LATENCY_SAMPLES {
            time_remote_asks(&echo, &mut latencies.muster_tls, &mut seq).await;
            time_remote_asks(&plain, &mut latencies.muster_plaintext, &mut seq).await;
            for _ in 0..LATENCY_BLOCK {
                seq += 1;
                let start = Instant::now();
                black_box(tonic.ask(seq).await.seq);
                latencies.tonic_echo.push(start.elapsed());
            }
            for _ in 0..LATENCY_BLOCK {
                seq += 1;
                let start = Instant::now();
                black_box(raw.ask(seq).await.seq);
                latencies.raw_tcp.push(start.elapsed());
            }
        }
        for samples in [
            &mut latencies.muster_tls,
            &mut latencies.muster_plaintext,
            &mut latencies.tonic_echo,
            &mut latencies.raw_tcp,
        ] {
            samples.sort_unstable();
        }
        latencies
    })
    .await
}

/// Times `LATENCY_BLOCK` asks of `echo` one by one into `samples`.
async fn time_remote_asks(echo: &RemotePid, samples: &mut Vec<Duration>, seq: &mut u64) {
    for _ in 0..LATENCY_BLOCK {
        *seq += 1;
        let start = Instant::now();
        let pong: Pong = echo.ask(Ping { seq: *seq }).await.expect("echo answers");
        samples.push(start.elapsed());
        black_box(pong.seq);
    }
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

pub(super) fn bench_remote_ask(c: &mut Criterion) {
    let rt = runtime();
    let (nodes, echo, plain, raw, tonic) = rt.block_on(async {
        let (nodes, echo) = ask_pair(tls("a"), tls("b")).await;
        let plain = ask_pair(Security::Insecure, Security::Insecure).await;
        let raw = Arc::new(tokio::sync::Mutex::new(RawAskClient::connect().await));
        let tonic = TonicEchoClient::connect(&nodes.system).await;
        let tonic = Arc::new(tokio::sync::Mutex::new(tonic));
        // Open the stream outside the timed loop.
        tonic_asks(Arc::clone(&tonic), 10).await;
        (nodes, echo, plain, raw, tonic)
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
    group.bench_function("tonic_bidi_echo_tls", |bench| {
        bench
            .to_async(&rt)
            .iter(|| on_worker(tonic_asks(Arc::clone(&tonic), REMOTE_ASKS)));
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
        let latencies = rt.block_on(ask_latencies(
            echo.clone(),
            plain.1.clone(),
            Arc::clone(&raw),
            Arc::clone(&tonic),
        ));
        let median = |sorted: &[Duration]| sorted[sorted.len() / 2].as_secs_f64();
        eprintln!(
            "remote_ask round trip over {LATENCY_SAMPLES} sequential asks each, the cases \
             taking turns {LATENCY_BLOCK} at a time: muster_remote_ask_tls {}; \
             muster_remote_ask_plaintext {}; tonic_bidi_echo_tls {}; raw_tcp_prost {}; \
             p50 muster_remote_ask_tls / tonic_bidi_echo_tls = {:.2}",
            percentiles(&latencies.muster_tls),
            percentiles(&latencies.muster_plaintext),
            percentiles(&latencies.tonic_echo),
            percentiles(&latencies.raw_tcp),
            median(&latencies.muster_tls) / median(&latencies.tonic_echo),
        );
    }
    rt.block_on(nodes.shutdown());
    rt.block_on(plain.0.shutdown());
}
