//! Nodes say their build and wire protocols in their hello: a node whose protocols do not
//! overlap this one's is refused, both ways, with both builds named; a node from before
//! versions were said is taken as speaking protocol 1.

use muster_actor::System;
use muster_proto::transport::Hello;
use muster_transport::{Node, NodeConfig};

use super::{Ping, Pong, config, member, pong_at, pong_node, raw_link_saying};

#[tokio::test]
async fn a_node_of_another_wire_protocol_is_refused_with_both_builds_named() -> anyhow::Result<()> {
    let system = System::new();
    let mut newer = config();
    newer.version = ("9.0.0".into(), 2..=2);
    let (b, _seqs) = pong_node(&system, newer).await?;
    let a = Node::bind(&system, "127.0.0.1:0", member()).await?;

    // `a` dials `b`: `b` refuses the link, and `a`'s ask fails with why.
    let refused = a
        .remote(pong_at(&b))
        .ask::<Ping, Pong>(Ping {
            seq: 1,
            payload: vec![],
        })
        .await
        .expect_err("a node of protocol 1 reached one of protocol 2");
    let why = refused.to_string();
    assert!(why.contains("wire protocols 1..=1"), "{why}");
    assert!(why.contains("wire protocols 2..=2"), "{why}");

    // `b` dials `a`: `b` sees `a`'s answer and refuses it itself.
    let (c, _seqs) = pong_node(&system, config()).await?;
    let refused = b
        .remote(pong_at(&c))
        .ask::<Ping, Pong>(Ping {
            seq: 1,
            payload: vec![],
        })
        .await
        .expect_err("a node of protocol 2 reached one of protocol 1");
    let why = refused.to_string();
    assert!(why.contains("incompatible versions"), "{why}");
    assert!(
        why.contains("9.0.0") && why.contains(muster_proto::version::BUILD_VERSION),
        "{why}"
    );

    // Overlapping ranges talk.
    let mut wide = config();
    wide.version = ("9.1.0".into(), 1..=2);
    let d = Node::bind_with(&system, "127.0.0.1:0", wide).await?;
    let answer: Pong = d
        .remote(pong_at(&c))
        .ask(Ping {
            seq: 41,
            payload: vec![],
        })
        .await?;
    assert_eq!(answer.seq, 42);
    Ok(())
}

#[tokio::test]
async fn a_raw_hello_of_an_unknown_protocol_is_refused_naming_it() -> anyhow::Result<()> {
    let system = System::new();
    let b = Node::bind_with(&system, "127.0.0.1:0", NodeConfig::new(member())).await?;
    let hello = Hello {
        node: "127.0.0.1:1".into(),
        reads_same_head: false,
        version: "7.7.7".into(),
        oldest_protocol: 5,
        newest_protocol: 6,
    };
    let refused = raw_link_saying(&b, &member(), hello)
        .await
        .expect_err("refused");
    let why = refused.to_string();
    assert!(
        why.contains("127.0.0.1:1 runs muster 7.7.7 (wire protocols 5..=6)"),
        "{why}"
    );
    Ok(())
}
