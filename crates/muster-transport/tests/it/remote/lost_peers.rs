//! A peer lost and back: linked processes hear of it and asks fail, the link reconnects on the
//! same address, sends wait for room (or fail at shutdown), tells with a deadline are dropped
//! and failed asks never run when it returns.

use super::*;

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
