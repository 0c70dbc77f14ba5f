//! The transport between nodes: two nodes over loopback in one test process, plus a raw tonic
//! client that sends exactly the bytes a broken or hostile peer would.

use muster_transport::LinkRemote;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use muster_actor::{
    AskError, Context, ExitReason, Process, ProcessRef, RemoteError, Reply, System, Upid,
};
use muster_proto::transport::transport_client::TransportClient;
use muster_proto::transport::{Envelope, ErrorCode, Frame, Hello, Kind};
use muster_security::testing::TestPki;
use muster_security::{Role, Security};
use muster_transport::{Node, NodeConfig};
use prost::Message as _;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

#[derive(Clone, PartialEq, prost::Message)]
struct Ping {
    #[prost(uint64, tag = "1")]
    seq: u64,
    #[prost(bytes = "vec", tag = "2")]
    payload: Vec<u8>,
}

impl prost::Name for Ping {
    const NAME: &'static str = "Ping";
    const PACKAGE: &'static str = "muster.test";
}

#[derive(Clone, PartialEq, prost::Message)]
struct Pong {
    #[prost(uint64, tag = "1")]
    seq: u64,
}

impl prost::Name for Pong {
    const NAME: &'static str = "Pong";
    const PACKAGE: &'static str = "muster.test";
}

/// Answers pings; counts tells; forwards each told ping's seq to the test.
struct Ponger {
    told: mpsc::UnboundedSender<u64>,
}

enum PongerMsg {
    Ping(Ping, Reply<Pong>),
    Note(Ping),
}

impl Process for Ponger {
    type Message = PongerMsg;
    async fn handle(&mut self, msg: PongerMsg, _ctx: &mut Context<Self>) {
        match msg {
            PongerMsg::Ping(ping, reply) => reply.send(Pong { seq: ping.seq + 1 }),
            PongerMsg::Note(ping) => {
                let _ = self.told.send(ping.seq);
            }
        }
    }
}

/// TLS for a cluster member from the test CA: every node of these tests uses it.
fn member() -> Security {
    TestPki::shared().security(Role::Agent, "node")
}

/// The default node config, with [`member`]'s TLS.
fn config() -> NodeConfig {
    NodeConfig::new(member())
}

/// A node with a registered "pong" process; returns the channel of told seqs.
async fn pong_node(
    system: &System,
    config: NodeConfig,
) -> anyhow::Result<(Node, mpsc::UnboundedReceiver<u64>)> {
    let node = Node::bind_with(system, "127.0.0.1:0", config).await?;
    let (told, seqs) = mpsc::unbounded_channel();
    let pid = system.spawn(Ponger { told });
    node.register("pong", &pid)?
        .install_ask::<Ping, Pong>(PongerMsg::Ping)
        .install::<Ping>(PongerMsg::Note);
    Ok((node, seqs))
}

fn pong_at(node: &Node) -> Upid {
    Upid::new("pong", node.address()).expect("valid upid")
}

/// Polls `check` until it holds or 5 s pass (for effects on the far side of a link).
async fn eventually(what: &str, mut check: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !check() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

#[tokio::test]
async fn remote_tell_and_ask_round_trip_between_two_nodes() -> anyhow::Result<()> {
    let system = System::new();
    let (b, mut seqs) = pong_node(&system, config()).await?;
    let a = Node::bind(&system, "127.0.0.1:0", member()).await?;
    let pong = a.remote(pong_at(&b));

    let answer: Pong = pong
        .ask(Ping {
            seq: 41,
            payload: vec![],
        })
        .await?;
    assert_eq!(answer.seq, 42);

    for seq in 0..1000 {
        pong.tell(Ping {
            seq,
            payload: vec![],
        })?;
    }
    for expected in 0..1000 {
        let seq = seqs.recv().await.context("ponger gone")?;
        assert_eq!(seq, expected, "tells arrive in order");
    }
    assert!(
        b.stats().frames_received < 1001,
        "envelopes are batched into frames"
    );
    assert_eq!(b.stats().dead_letters(), 0);
    // Every frame a wrote (its greeting and the tells) arrived, and so did b's answer: each
    // side's bytes received are the other's bytes sent. Nothing was lost, so no reconnect.
    let (a_stats, b_stats) = (a.stats(), b.stats());
    assert!(a_stats.bytes_sent > 1000, "{a_stats:?}");
    assert_eq!(a_stats.bytes_sent, b_stats.bytes_received);
    assert!(b_stats.bytes_sent > 0, "{b_stats:?}");
    assert_eq!(b_stats.bytes_sent, a_stats.bytes_received);
    assert_eq!((a_stats.reconnects, b_stats.reconnects), (0, 0));
    Ok(())
}

#[tokio::test]
async fn tells_and_asks_keep_their_order_across_many_frames() -> anyhow::Result<()> {
    let system = System::new();
    let (b, mut seqs) = pong_node(&system, config()).await?;
    let mut small_frames = config();
    small_frames.max_batch = 7;
    let a = Node::bind_with(&system, "127.0.0.1:0", small_frames).await?;
    let pong = a.remote(pong_at(&b));

    for round in 0..10u64 {
        for seq in round * 100..(round + 1) * 100 {
            pong.tell(Ping {
                seq,
                payload: vec![0; (seq % 5) as usize],
            })?;
        }
        // Handled after the round's tells, which went before it on the link.
        let answer: Pong = pong
            .ask(Ping {
                seq: round,
                payload: vec![],
            })
            .await?;
        assert_eq!(answer.seq, round + 1);
        for expected in round * 100..(round + 1) * 100 {
            assert_eq!(
                seqs.try_recv().ok(),
                Some(expected),
                "tells arrive in order"
            );
        }
    }
    let frames = b.stats().frames_received;
    assert!(
        frames >= 1000 / 7,
        "at most 7 envelopes a frame: {frames} frames"
    );
    assert_eq!(b.stats().dead_letters(), 0);
    Ok(())
}

#[tokio::test]
async fn a_run_of_tells_to_one_process_sends_its_head_once_a_frame() -> anyhow::Result<()> {
    let system = System::new();
    let (b, mut seqs) = pong_node(&system, config()).await?;
    let a = Node::bind(&system, "127.0.0.1:0", member()).await?;
    let pong = a.remote(pong_at(&b));
    // The answer to an ask comes after b's response headers, which say it reads `same_head`.
    let _: Pong = pong
        .ask(Ping {
            seq: 0,
            payload: vec![],
        })
        .await?;
    let before = b.stats();

    const TELLS: u64 = 1000;
    for seq in 0..TELLS {
        pong.tell(Ping {
            seq,
            payload: vec![],
        })?;
    }
    for expected in 0..TELLS {
        assert_eq!(seqs.recv().await, Some(expected), "tells arrive in order");
    }
    let after = b.stats();
    let frames = after.frames_received - before.frames_received;
    let per_tell = (after.bytes_received - before.bytes_received) / TELLS;
    // A whole envelope here is 33 bytes ("pong", "muster.test.Ping", a 3-byte body); one that
    // repeats the head before it, 9.
    assert!(
        per_tell <= 9 + 33 * frames / TELLS + 1,
        "{per_tell} bytes a tell over {frames} frames"
    );
    assert_eq!(after.dead_letters(), 0);
    Ok(())
}

#[tokio::test]
async fn envelopes_that_repeat_the_head_before_them_reach_its_process() -> anyhow::Result<()> {
    let system = System::new();
    let (b, mut seqs) = pong_node(&system, config()).await?;
    let (frames, mut inbound) = raw_link(&b).await?;
    let ping = |seq| {
        Bytes::from(
            Ping {
                seq,
                payload: vec![],
            }
            .encode_to_vec(),
        )
    };
    let repeat = |seq, request_id| Envelope {
        same_head: true,
        body: ping(seq),
        request_id,
        ..Envelope::default()
    };
    let tell = |to: &str, seq| Envelope {
        kind: Kind::Tell as i32,
        to: Bytes::copy_from_slice(to.as_bytes()),
        type_name: Bytes::from_static(b"muster.test.Ping"),
        body: ping(seq),
        ..Envelope::default()
    };
    frames
        .send(Frame {
            hello: None,
            envelopes: vec![
                // Nothing before it to repeat: malformed.
                repeat(100, 0),
                tell("pong", 1),
                repeat(2, 0),
                repeat(3, 0),
                // An unknown process, and the tell that repeats it: two dead letters.
                tell("nobody", 101),
                repeat(102, 0),
                tell("pong", 4),
                // An ask, and one that repeats its head (kind included).
                ask_envelope(10, "pong", "muster.test.Ping", ping(5).to_vec()),
                repeat(6, 11),
            ],
        })
        .await?;
    let answers = answers(&mut inbound, &[10, 11]).await?;
    for (id, seq) in [(10, 5), (11, 6)] {
        assert_eq!(answers[&id].kind, Kind::Reply as i32, "{:?}", answers[&id]);
        assert_eq!(Pong::decode(answers[&id].body.clone())?.seq, seq + 1);
    }
    for expected in [1, 2, 3, 4] {
        assert_eq!(seqs.recv().await, Some(expected));
    }
    eventually("the dead letters counted", || {
        let stats = b.stats();
        (stats.malformed, stats.unknown_process) == (1, 2)
    })
    .await?;
    assert!(seqs.try_recv().is_err(), "nothing else was delivered");
    Ok(())
}

#[tokio::test]
async fn unknown_process_and_unknown_type_are_errors_and_the_link_carries_on() -> anyhow::Result<()>
{
    let system = System::new();
    let (b, _seqs) = pong_node(&system, config()).await?;
    let a = Node::bind(&system, "127.0.0.1:0", member()).await?;

    let nobody = a.remote(Upid::new("nobody", b.address())?);
    let err = nobody.ask::<Ping, Pong>(Ping::default()).await.unwrap_err();
    assert_eq!(
        err,
        AskError::Remote(RemoteError::UnknownProcess("nobody".into()))
    );
    nobody.tell(Ping::default())?;
    eventually("a dead letter for the unknown process", || {
        b.stats().unknown_process == 2
    })
    .await?;

    // Pong is not installed as a request type on "pong".
    let pong = a.remote(pong_at(&b));
    let err = pong.ask::<Pong, Pong>(Pong { seq: 1 }).await.unwrap_err();
    assert_eq!(
        err,
        AskError::Remote(RemoteError::UnknownType("muster.test.Pong".into()))
    );

    let answer: Pong = pong
        .ask(Ping {
            seq: 1,
            payload: vec![],
        })
        .await?;
    assert_eq!(answer.seq, 2, "the link still carries traffic");
    assert!(system.dead_letters() >= 3);
    Ok(())
}

#[tokio::test]
async fn oversized_messages_fail_at_the_sender_with_sizes() -> anyhow::Result<()> {
    let system = System::new();
    let (b, _seqs) = pong_node(&system, config()).await?;
    let mut config = config();
    config.max_message_size = 1024 * 1024;
    let a = Node::bind_with(&system, "127.0.0.1:0", config).await?;
    let pong = a.remote(pong_at(&b));
    let big = Ping {
        seq: 1,
        payload: vec![7; 2 * 1024 * 1024],
    };
    match pong.tell(big.clone()) {
        Err(RemoteError::Oversized { size, limit }) => {
            assert!(size > 2 * 1024 * 1024);
            assert_eq!(limit, 1024 * 1024);
        }
        other => anyhow::bail!("expected Oversized, got {other:?}"),
    }
    let err = pong.ask::<Ping, Pong>(big).await.unwrap_err();
    assert!(matches!(
        err,
        AskError::Remote(RemoteError::Oversized { .. })
    ));
    let answer: Pong = pong
        .ask(Ping {
            seq: 5,
            payload: vec![],
        })
        .await?;
    assert_eq!(answer.seq, 6);
    Ok(())
}

/// A raw link to `node`, as a misbehaving peer (with a member's certificate) would open it.
async fn raw_link(node: &Node) -> anyhow::Result<(mpsc::Sender<Frame>, tonic::Streaming<Frame>)> {
    raw_link_as(node, &member()).await
}

/// A raw link to `node` opened with `security`.
async fn raw_link_as(
    node: &Node,
    security: &Security,
) -> anyhow::Result<(mpsc::Sender<Frame>, tonic::Streaming<Frame>)> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", node.address()))?;
    let (channel, _) = security
        .channel(endpoint, &[Role::Master, Role::Agent])
        .await?;
    let mut client = TransportClient::new(channel)
        .max_decoding_message_size(64 * 1024 * 1024)
        .max_encoding_message_size(64 * 1024 * 1024);
    let (frames, rx) = mpsc::channel(16);
    frames
        .send(Frame {
            hello: Some(Hello {
                node: "127.0.0.1:1".into(),
                reads_same_head: false,
            }),
            envelopes: vec![],
        })
        .await?;
    let inbound = client
        .link(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok((frames, inbound))
}

fn ask_envelope(request_id: u64, to: &str, type_name: &str, body: Vec<u8>) -> Envelope {
    Envelope {
        kind: Kind::Ask as i32,
        to: Bytes::copy_from_slice(to.as_bytes()),
        type_name: Bytes::copy_from_slice(type_name.as_bytes()),
        body: Bytes::from(body),
        request_id,
        ..Envelope::default()
    }
}

/// Reads answers until every one of `request_ids` has arrived (one frame may carry several).
async fn answers(
    inbound: &mut tonic::Streaming<Frame>,
    request_ids: &[u64],
) -> anyhow::Result<std::collections::HashMap<u64, Envelope>> {
    let mut answers = std::collections::HashMap::new();
    while !request_ids.iter().all(|id| answers.contains_key(id)) {
        let frame = tokio::time::timeout(Duration::from_secs(10), inbound.message())
            .await
            .context("no answer within 10 s")??
            .context("link closed")?;
        answers.extend(frame.envelopes.into_iter().map(|e| (e.request_id, e)));
    }
    Ok(answers)
}

#[tokio::test]
async fn malformed_oversized_and_unknown_kind_envelopes_get_errors_and_the_link_goes_on()
-> anyhow::Result<()> {
    let system = System::new();
    let mut config = config();
    config.max_message_size = 1024 * 1024;
    let (b, _seqs) = pong_node(&system, config).await?;
    let (frames, mut inbound) = raw_link(&b).await?;

    // Field 1 declared as a varint but truncated: not a Ping.
    let garbage = vec![0x08, 0xff, 0xff];
    let oversized = Ping {
        seq: 1,
        payload: vec![1; 2 * 1024 * 1024],
    }
    .encode_to_vec();
    let valid = Ping {
        seq: 9,
        payload: vec![],
    }
    .encode_to_vec();
    let mut unknown_kind = ask_envelope(4, "pong", "muster.test.Ping", valid.clone());
    unknown_kind.kind = 99;
    let mut not_utf8 = ask_envelope(5, "pong", "muster.test.Ping", valid.clone());
    not_utf8.to = Bytes::from_static(&[0xff, 0xfe]);
    frames
        .send(Frame {
            hello: None,
            envelopes: vec![
                ask_envelope(1, "pong", "muster.test.Ping", garbage),
                ask_envelope(2, "pong", "muster.test.Ping", oversized),
                unknown_kind,
                not_utf8,
                ask_envelope(3, "pong", "muster.test.Ping", valid),
            ],
        })
        .await?;

    let mut answers = answers(&mut inbound, &[1, 2, 3, 4, 5]).await?;
    let mut answer = |id| answers.remove(&id).context("answered twice?");
    let malformed = answer(1)?;
    assert_eq!(malformed.kind, Kind::Error as i32);
    assert_eq!(malformed.error_code, ErrorCode::Malformed as i32);
    assert!(
        malformed.error.contains("muster.test.Ping"),
        "{}",
        malformed.error
    );

    let too_big = answer(2)?;
    assert_eq!(too_big.error_code, ErrorCode::Oversized as i32);

    let unknown = answer(4)?;
    assert_eq!(unknown.error_code, ErrorCode::Malformed as i32);
    assert!(unknown.error.contains("kind 99"), "{}", unknown.error);

    let bad_name = answer(5)?;
    assert_eq!(bad_name.error_code, ErrorCode::Malformed as i32);

    let reply = answer(3)?;
    assert_eq!(reply.kind, Kind::Reply as i32);
    assert_eq!(Pong::decode(reply.body)?.seq, 10);

    let stats = b.stats();
    assert_eq!((stats.malformed, stats.oversized), (3, 1));
    Ok(())
}

/// Frames written as raw bytes (so a test can send what no encoder would), answers read as
/// `Frame`s.
#[derive(Clone, Copy, Default)]
struct RawFrames;

impl tonic::codec::Codec for RawFrames {
    type Encode = Vec<u8>;
    type Decode = Frame;
    type Encoder = RawFrames;
    type Decoder = RawFrames;

    fn encoder(&mut self) -> RawFrames {
        RawFrames
    }

    fn decoder(&mut self) -> RawFrames {
        RawFrames
    }
}

impl tonic::codec::Encoder for RawFrames {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawFrames {
    type Item = Frame;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Frame>, tonic::Status> {
        Frame::decode(src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

/// An envelope as one element of a frame's `envelopes` (field 2): key, length, bytes.
fn element(envelope: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0x12];
    prost::encode_length_delimiter(envelope.len(), &mut bytes).expect("a Vec grows");
    bytes.extend_from_slice(envelope);
    bytes
}

#[tokio::test]
async fn a_broken_envelope_is_refused_by_id_and_the_rest_of_its_frame_delivered()
-> anyhow::Result<()> {
    let system = System::new();
    let (b, _seqs) = pong_node(&system, config()).await?;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", b.address()))?;
    let (channel, _) = member()
        .channel(endpoint, &[Role::Master, Role::Agent])
        .await?;
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await?;
    let (frames, rx) = mpsc::channel::<Vec<u8>>(16);
    frames
        .send(
            Frame {
                hello: Some(Hello {
                    node: "127.0.0.1:1".into(),
                    reads_same_head: false,
                }),
                envelopes: vec![],
            }
            .encode_to_vec(),
        )
        .await?;
    let mut inbound = client
        .streaming(
            tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
            tonic::codegen::http::uri::PathAndQuery::from_static(
                "/muster.transport.v1.Transport/Link",
            ),
            RawFrames,
        )
        .await?
        .into_inner();
    let ask = |id: u64| {
        let body = Ping {
            seq: id,
            payload: vec![],
        }
        .encode_to_vec();
        element(&ask_envelope(id, "pong", "muster.test.Ping", body).encode_to_vec())
    };

    // Ask 1; then an envelope with request id 7 whose `to` claims 50 bytes it does not have;
    // then ask 3, in the same frame.
    let mut frame = ask(1);
    frame.extend(element(&[0x28, 7, 0x12, 50]));
    frame.extend(ask(3));
    frames.send(frame).await?;
    let mut first = answers(&mut inbound, &[1, 7, 3]).await?;
    assert_eq!(first[&1].kind, Kind::Reply as i32);
    assert_eq!(first[&3].kind, Kind::Reply as i32);
    let refused = first.remove(&7).context("request 7 answered")?;
    assert_eq!(refused.kind, Kind::Error as i32);
    assert_eq!(refused.error_code, ErrorCode::Malformed as i32);
    assert_eq!(b.stats().malformed, 1);

    // A frame whose last element runs past its end: what came before it is delivered, and
    // the link carries the next frame.
    let mut frame = ask(4);
    frame.extend([0x12, 100, 1, 2]);
    frames.send(frame).await?;
    assert_eq!(
        answers(&mut inbound, &[4]).await?[&4].kind,
        Kind::Reply as i32
    );
    frames.send(ask(5)).await?;
    assert_eq!(
        answers(&mut inbound, &[5]).await?[&5].kind,
        Kind::Reply as i32
    );
    assert_eq!(b.stats().malformed, 2);
    assert_eq!(b.stats().reconnects, 0);
    Ok(())
}

#[tokio::test]
async fn a_reply_dropped_by_the_remote_handler_is_an_error_not_a_hang() -> anyhow::Result<()> {
    struct Silent;
    impl Process for Silent {
        type Message = (Ping, Reply<Pong>);
        async fn handle(&mut self, _msg: Self::Message, _ctx: &mut Context<Self>) {}
    }
    let system = System::new();
    let b = Node::bind(&system, "127.0.0.1:0", member()).await?;
    let silent = system.spawn(Silent);
    b.register("silent", &silent)?
        .install_ask::<Ping, Pong>(|ping, reply| (ping, reply));
    let a = Node::bind(&system, "127.0.0.1:0", member()).await?;
    let remote = a.remote(Upid::new("silent", b.address())?);
    let err = remote.ask::<Ping, Pong>(Ping::default()).await.unwrap_err();
    assert_eq!(err, AskError::Remote(RemoteError::NoReply));
    Ok(())
}

#[tokio::test]
async fn a_name_is_freed_when_its_process_ends_and_cannot_be_taken_twice() -> anyhow::Result<()> {
    let system = System::new();
    let (b, _seqs) = pong_node(&system, config()).await?;
    let (told, _rx) = mpsc::unbounded_channel();
    let second = system.spawn(Ponger { told });
    let taken = b.register("pong", &second).unwrap_err();
    assert!(taken.to_string().contains("already registered"), "{taken}");
    second.terminate();
    second.wait().await;
    assert!(
        b.register(
            "bad@name",
            &system.spawn(Ponger {
                told: mpsc::unbounded_channel().0
            })
        )
        .is_err()
    );
    Ok(())
}

#[tokio::test]
async fn bind_to_a_port_in_use_names_the_address() -> anyhow::Result<()> {
    let system = System::new();
    let a = Node::bind(&system, "127.0.0.1:0", member()).await?;
    let err = Node::bind(&system, a.address(), member())
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains(a.address()), "{text}");
    assert!(
        Node::bind(&system, "not an address", member())
            .await
            .is_err()
    );
    Ok(())
}

/// Links to a remote process and reports its exit to the test.
struct Watcher {
    exits: mpsc::UnboundedSender<(ProcessRef, ExitReason)>,
}

impl Process for Watcher {
    type Message = muster_transport::RemotePid;
    async fn handle(&mut self, remote: Self::Message, ctx: &mut Context<Self>) {
        ctx.link_remote(&remote);
        let _ = self.exits.send((
            ProcessRef::Remote(remote.upid().clone()),
            ExitReason::Normal,
        ));
    }
    fn exited(&mut self, who: ProcessRef, reason: ExitReason, _ctx: &mut Context<Self>) {
        let _ = self.exits.send((who, reason));
    }
}

#[tokio::test]
async fn linked_processes_hear_of_a_lost_connection_and_asks_fail() -> anyhow::Result<()> {
    let system = System::new();
    let (b, _seqs) = pong_node(&system, config()).await?;
    let a = Node::bind(&system, "127.0.0.1:0", member()).await?;
    let pong = a.remote(pong_at(&b));
    let _: Pong = pong.ask(Ping::default()).await?;

    let (exits, mut heard) = mpsc::unbounded_channel();
    let watcher = system.spawn(Watcher { exits });
    watcher.tell(pong.clone()).ok().context("watcher gone")?;
    let (_, linked) = heard.recv().await.context("watcher gone")?;
    assert_eq!(linked, ExitReason::Normal, "link made");

    b.shutdown();
    let (who, reason) = tokio::time::timeout(Duration::from_secs(10), heard.recv())
        .await?
        .context("watcher gone")?;
    assert_eq!(who, ProcessRef::Remote(pong_at(&b)));
    assert!(
        matches!(reason, ExitReason::ConnectionLost { .. }),
        "{reason:?}"
    );
    assert!(
        watcher.is_alive(),
        "a lost link does not kill the linked process"
    );

    let err = pong
        .ask_timeout::<Ping, Pong>(Duration::from_secs(10), Ping::default())
        .await;
    assert!(
        matches!(
            err,
            Err(AskError::Remote(
                RemoteError::ConnectionLost(_) | RemoteError::Unreachable { .. }
            ))
        ),
        "{err:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_link_reconnects_when_its_peer_comes_back_on_the_same_address() -> anyhow::Result<()> {
    let system = System::new();
    let (b, _seqs) = pong_node(&system, config()).await?;
    let address = b.address().to_owned();
    let mut config = config();
    config.reconnect_max = Duration::from_millis(200);
    let a = Node::bind_with(&system, "127.0.0.1:0", config).await?;
    let pong = a.remote(pong_at(&b));
    let first: Pong = pong
        .ask(Ping {
            seq: 1,
            payload: vec![],
        })
        .await?;
    assert_eq!(first.seq, 2);

    b.shutdown();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let b = rebind(&system, &address).await?;
    let (told, _seqs) = mpsc::unbounded_channel();
    let pid = system.spawn(Ponger { told });
    b.register("pong", &pid)?
        .install_ask::<Ping, Pong>(PongerMsg::Ping);

    // Asks made while the link is down fail (lost, then unreachable); once the backoff brings the link
    // back, the same handle works again.
    let answer = loop {
        match pong
            .ask_timeout::<Ping, Pong>(
                Duration::from_secs(1),
                Ping {
                    seq: 7,
                    payload: vec![],
                },
            )
            .await
        {
            Ok(answer) => break answer,
            Err(
                AskError::Remote(RemoteError::ConnectionLost(_) | RemoteError::Unreachable { .. })
                | AskError::Timeout(_),
            ) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => anyhow::bail!("no reconnect within 10 s: {e}"),
        }
    };
    assert_eq!(answer.seq, 8);
    b.shutdown();
    Ok(())
}

/// Binds a node on `address` again, once the server that had it lets go of the port (its
/// graceful stop completes in the background).
async fn rebind(system: &System, address: &str) -> anyhow::Result<Node> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match Node::bind(system, address, member()).await {
            Ok(node) => return Ok(node),
            Err(_port_still_held) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => return Err(anyhow::Error::new(e).context("rebinding a peer's address")),
        }
    }
}

/// An address nobody listens on (a port the OS just handed out and took back).
fn vacant_address() -> anyhow::Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.to_string())
}

/// A node whose links queue at most 4 envelopes, with a handle on it to "pong" at `address`
/// (where nobody listens yet), 4 tells sent with `send`, filling the queue, and a fifth `send`
/// on its own task, checked to be waiting.
async fn waiting_send_to(
    system: &System,
    address: &str,
) -> anyhow::Result<(Node, JoinHandle<Result<(), RemoteError>>)> {
    let mut small_queue = config();
    small_queue.max_queued_per_peer = 4;
    small_queue.reconnect_max = Duration::from_millis(100);
    let a = Node::bind_with(system, "127.0.0.1:0", small_queue).await?;
    let pong = a.remote(Upid::new("pong", address)?);
    for seq in 0..4 {
        pong.send(Ping {
            seq,
            payload: vec![],
        })
        .await?;
    }
    let refused = pong.tell(Ping {
        seq: 99,
        payload: vec![],
    });
    assert!(
        matches!(refused, Err(RemoteError::QueueFull(_))),
        "the queue is full: {refused:?}"
    );
    let fifth = tokio::spawn(async move {
        pong.send(Ping {
            seq: 4,
            payload: vec![],
        })
        .await
    });
    // This test runtime has one thread: a few turns let the send run as far as it can.
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert!(!fifth.is_finished(), "send waits while the queue is full");
    Ok((a, fifth))
}

#[tokio::test]
async fn send_waits_for_room_while_the_peer_is_away_and_delivers_in_order_once_it_comes()
-> anyhow::Result<()> {
    let system = System::new();
    let address = vacant_address()?;
    let (_a, fifth) = waiting_send_to(&system, &address).await?;

    let b = rebind(&system, &address).await?;
    let (told, mut seqs) = mpsc::unbounded_channel();
    let pid = system.spawn(Ponger { told });
    b.register("pong", &pid)?.install::<Ping>(PongerMsg::Note);
    fifth.await??;
    for expected in 0..5 {
        let seq = tokio::time::timeout(Duration::from_secs(10), seqs.recv())
            .await?
            .context("ponger gone")?;
        assert_eq!(seq, expected, "sends arrive in order, the waiting one last");
    }
    b.shutdown();
    Ok(())
}

#[tokio::test]
async fn a_send_waiting_for_room_fails_when_its_node_shuts_down() -> anyhow::Result<()> {
    let system = System::new();
    let address = vacant_address()?;
    let (a, fifth) = waiting_send_to(&system, &address).await?;
    a.shutdown();
    let outcome = tokio::time::timeout(Duration::from_secs(10), fifth).await??;
    assert!(
        matches!(outcome, Err(RemoteError::ConnectionLost(_))),
        "the waiting send is told the link is gone: {outcome:?}"
    );
    Ok(())
}

/// Answers pings and reports each one it handled.
struct CountingPonger {
    handled: mpsc::UnboundedSender<u64>,
}

impl Process for CountingPonger {
    type Message = (Ping, Reply<Pong>);
    async fn handle(&mut self, (ping, reply): Self::Message, _ctx: &mut Context<Self>) {
        let _ = self.handled.send(ping.seq);
        reply.send(Pong { seq: ping.seq + 1 });
    }
}

/// A tell with a deadline is for the connection of the moment: sent while the peer is away
/// (the first dial fails), it is dropped and counted, never delivered when the peer comes back,
/// while a plain tell sent beside it waits and arrives.
#[tokio::test]
async fn tells_with_a_deadline_sent_while_the_peer_is_away_are_dropped_not_carried_to_its_return()
-> anyhow::Result<()> {
    let system = System::new();
    let address = vacant_address()?;
    let mut config = config();
    config.reconnect_max = Duration::from_millis(100);
    let a = Node::bind_with(&system, "127.0.0.1:0", config).await?;
    let pong = a.remote(Upid::new("pong", &address)?);
    let far = tokio::time::Instant::now() + Duration::from_secs(600);
    pong.tell_until(
        Ping {
            seq: 1,
            payload: vec![],
        },
        far,
    )?;
    pong.tell(Ping {
        seq: 2,
        payload: vec![],
    })?;
    // The dial fails (nobody listens): the connection the first was queued for never was.
    eventually("a failed dial", || a.stats().reconnects > 0).await?;

    let b = rebind(&system, &address).await?;
    let (told, mut seqs) = mpsc::unbounded_channel();
    let pid = system.spawn(Ponger { told });
    b.register("pong", &pid)?.install::<Ping>(PongerMsg::Note);
    let first = tokio::time::timeout(Duration::from_secs(10), seqs.recv()).await?;
    assert_eq!(
        first,
        Some(2),
        "the plain tell arrives, the expired one does not"
    );
    // Once the link is up again, a tell with a deadline goes through like any other.
    pong.tell_until(
        Ping {
            seq: 3,
            payload: vec![],
        },
        far,
    )?;
    let next = tokio::time::timeout(Duration::from_secs(10), seqs.recv()).await?;
    assert_eq!(next, Some(3));
    assert_eq!(a.stats().expired_tells, 1);
    b.shutdown();
    Ok(())
}

#[tokio::test]
async fn asks_that_failed_while_the_peer_was_down_never_run_when_it_returns() -> anyhow::Result<()>
{
    let system = System::new();
    // Reserve an address, then free it: nothing listens there for now.
    let placeholder = Node::bind(&system, "127.0.0.1:0", member()).await?;
    let address = placeholder.address().to_owned();
    placeholder.shutdown();

    let mut config = config();
    config.reconnect_max = Duration::from_millis(100);
    let a = Node::bind_with(&system, "127.0.0.1:0", config).await?;
    let pong = a.remote(Upid::new("pong", &address)?);
    for seq in 0..5 {
        let failed = pong
            .ask::<Ping, Pong>(Ping {
                seq,
                payload: vec![],
            })
            .await;
        assert!(failed.is_err(), "nobody listens yet: {failed:?}");
    }

    let (handled, mut seen) = mpsc::unbounded_channel();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let b = rebind(&system, &address).await?;
    let pid = system.spawn(CountingPonger { handled });
    b.register("pong", &pid)?
        .install_ask::<Ping, Pong>(|ping, reply| (ping, reply));

    let answer = loop {
        match pong
            .ask_timeout::<Ping, Pong>(
                Duration::from_secs(1),
                Ping {
                    seq: 100,
                    payload: vec![],
                },
            )
            .await
        {
            Ok(answer) => break answer,
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => anyhow::bail!("no reconnect within 10 s: {e}"),
        }
    };
    assert_eq!(answer.seq, 101);
    // Everything the peer handled, in order: only the asks someone was still waiting for.
    pid.dispatch(|_, _| ()).await?;
    let mut handled_seqs = Vec::new();
    while let Ok(seq) = seen.try_recv() {
        handled_seqs.push(seq);
    }
    assert!(
        handled_seqs.iter().all(|&seq| seq == 100),
        "asks already reported as failed were run later: {handled_seqs:?}"
    );
    Ok(())
}
#[tokio::test]
async fn after_shutdown_a_node_refuses_at_once_instead_of_hanging() -> anyhow::Result<()> {
    let system = System::new();
    let (b, _seqs) = pong_node(&system, config()).await?;
    let a = Node::bind(&system, "127.0.0.1:0", member()).await?;
    a.shutdown();
    let pong = a.remote(pong_at(&b));
    let err = pong
        .ask_timeout::<Ping, Pong>(Duration::from_secs(30), Ping::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, AskError::Remote(RemoteError::ConnectionLost(_))),
        "{err:?}"
    );
    assert!(matches!(
        pong.tell(Ping::default()),
        Err(RemoteError::ConnectionLost(_))
    ));
    Ok(())
}
