//! The transport between nodes: two nodes over loopback in one test process, plus a raw tonic
//! client that sends exactly the bytes a broken or hostile peer would (`hostile_peers`), and
//! peers lost and back (`lost_peers`).

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

mod hostile_peers;
mod lost_peers;
mod versions;

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

/// A raw link to `node` opened with `security`, its hello saying no version (a node from
/// before versions, which speaks protocol 1).
async fn raw_link_as(
    node: &Node,
    security: &Security,
) -> anyhow::Result<(mpsc::Sender<Frame>, tonic::Streaming<Frame>)> {
    let hello = Hello {
        node: "127.0.0.1:1".into(),
        reads_same_head: false,
        ..Hello::default()
    };
    raw_link_saying(node, security, hello).await
}

/// A raw link to `node` opened with `security`, greeting it with `hello`.
async fn raw_link_saying(
    node: &Node,
    security: &Security,
    hello: Hello,
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
            hello: Some(hello),
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
