//! The transport with mutual TLS: who may link, and who may send each message type.

use std::time::Duration;

use muster_actor::{AskError, Context, Process, RemoteError, Reply, System, Upid};
use muster_security::certs::{self, CertRequest};
use muster_security::testing::TestPki;
use muster_security::{DEFAULT_CLUSTER, Peer, Role, Security, Tls};
use muster_transport::{Node, NodeConfig};
use tokio::sync::mpsc;

#[derive(Clone, PartialEq, prost::Message)]
struct Launch {
    #[prost(uint64, tag = "1")]
    seq: u64,
}

impl prost::Name for Launch {
    const NAME: &'static str = "Launch";
    const PACKAGE: &'static str = "muster.test";
}

#[derive(Clone, PartialEq, prost::Message)]
struct Launched {
    #[prost(string, tag = "1")]
    by: String,
}

impl prost::Name for Launched {
    const NAME: &'static str = "Launched";
    const PACKAGE: &'static str = "muster.test";
}

/// Stands in for an agent: accepts `Launch` only from masters, and says who sent it.
struct Runner {
    seen: mpsc::UnboundedSender<Option<Peer>>,
}

enum RunnerMsg {
    Launch(Reply<Launched>, Option<Peer>),
}

impl Process for Runner {
    type Message = RunnerMsg;
    async fn handle(&mut self, msg: RunnerMsg, _ctx: &mut Context<Self>) {
        let RunnerMsg::Launch(reply, sender) = msg;
        let by = sender.as_ref().map(|p| p.name.clone()).unwrap_or_default();
        let _ = self.seen.send(sender);
        reply.send(Launched { by });
    }
}

const WAIT: Duration = Duration::from_secs(10);

/// A node with a "runner" that accepts `Launch` from masters only.
async fn runner_node(
    system: &System,
    security: Security,
) -> anyhow::Result<(Node, mpsc::UnboundedReceiver<Option<Peer>>)> {
    let node = Node::bind(system, "127.0.0.1:0", security).await?;
    let (seen, rx) = mpsc::unbounded_channel();
    let pid = system.spawn(Runner { seen });
    node.register("runner", &pid)?
        .install_ask_from::<Launch, Launched>(&[Role::Master], |_, reply, sender| {
            RunnerMsg::Launch(reply, sender)
        });
    Ok((node, rx))
}

fn runner_at(node: &Node) -> anyhow::Result<Upid> {
    Ok(Upid::new("runner", node.address())?)
}

async fn launch(from: &Node, to: &Node) -> Result<Launched, AskError> {
    let upid =
        runner_at(to).map_err(|e| AskError::Remote(RemoteError::Malformed(e.to_string())))?;
    from.remote(upid).ask_timeout(WAIT, Launch { seq: 1 }).await
}

#[tokio::test]
async fn a_message_type_is_taken_only_from_the_roles_it_was_installed_for() -> anyhow::Result<()> {
    let pki = TestPki::shared();
    let system = System::new();
    let (agent, mut seen) = runner_node(&system, pki.security(Role::Agent, "agent-a")).await?;
    let master = Node::bind(&system, "127.0.0.1:0", pki.security(Role::Master, "m1")).await?;
    let other_agent =
        Node::bind(&system, "127.0.0.1:0", pki.security(Role::Agent, "agent-b")).await?;

    let answer = launch(&master, &agent).await?;
    assert_eq!(answer.by, "m1", "the process is told who sent it");
    assert_eq!(
        seen.recv()
            .await
            .flatten()
            .map(|peer| (peer.role, peer.name)),
        Some((Role::Master, "m1".to_owned()))
    );

    let refused = launch(&other_agent, &agent).await;
    match refused {
        Err(AskError::Remote(RemoteError::Unauthorized(detail))) => {
            assert!(detail.contains("muster.test.Launch"), "{detail}");
            assert!(detail.contains("agent"), "{detail}");
        }
        other => anyhow::bail!("an agent's launch was not refused: {other:?}"),
    }
    assert_eq!(agent.stats().unauthorized, 1);
    assert!(
        seen.try_recv().is_err(),
        "the refused launch never reached the process"
    );

    // The node goes on serving its master.
    assert_eq!(launch(&master, &agent).await?.by, "m1");
    Ok(())
}

#[tokio::test]
async fn a_client_certificate_cannot_link_to_the_transport() -> anyhow::Result<()> {
    let pki = TestPki::shared();
    let system = System::new();
    let (agent, _seen) = runner_node(&system, pki.security(Role::Agent, "agent-a")).await?;
    let client = Node::bind(&system, "127.0.0.1:0", pki.security(Role::Client, "cli")).await?;
    match launch(&client, &agent).await {
        Err(AskError::Remote(RemoteError::Unreachable { reason, .. })) => {
            assert!(reason.contains("client"), "{reason}");
        }
        other => anyhow::bail!("a client linked: {other:?}"),
    }
    Ok(())
}

/// Asks from `stranger` fail at the handshake; the node still serves its master after.
async fn refused_at_the_handshake(stranger: Security) -> anyhow::Result<()> {
    let pki = TestPki::shared();
    let system = System::new();
    let (agent, _seen) = runner_node(&system, pki.security(Role::Agent, "agent-a")).await?;
    let master = Node::bind(&system, "127.0.0.1:0", pki.security(Role::Master, "m1")).await?;
    let stranger = Node::bind(&system, "127.0.0.1:0", stranger).await?;
    match launch(&stranger, &agent).await {
        Err(AskError::Remote(RemoteError::Unreachable { .. } | RemoteError::ConnectionLost(_))) => {
        }
        other => anyhow::bail!("a stranger's launch was not refused: {other:?}"),
    }
    assert_eq!(launch(&master, &agent).await?.by, "m1");
    Ok(())
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused() -> anyhow::Result<()> {
    refused_at_the_handshake(TestPki::foreign().security(Role::Master, "m1")).await
}

#[tokio::test]
async fn a_plaintext_peer_is_dropped_and_the_node_serves_others() -> anyhow::Result<()> {
    refused_at_the_handshake(Security::Insecure).await
}

#[tokio::test]
async fn an_expired_certificate_is_refused() -> anyhow::Result<()> {
    let pki = TestPki::shared();
    let expired = certs::issue_expired(
        pki.ca(),
        &CertRequest {
            role: Role::Master,
            name: "old",
            cluster: DEFAULT_CLUSTER,
            extra_names: &[],
            validity: Duration::from_secs(3600),
        },
    )?;
    let files = pki.write_pair("master-expired", &expired);
    refused_at_the_handshake(Security::Tls(Tls::load(files, DEFAULT_CLUSTER)?)).await
}

#[tokio::test]
async fn insecure_nodes_talk_plaintext_and_accept_every_sender() -> anyhow::Result<()> {
    let system = System::new();
    let (agent, mut seen) = runner_node(&system, Security::Insecure).await?;
    let anyone =
        Node::bind_with(&system, "127.0.0.1:0", NodeConfig::new(Security::Insecure)).await?;
    assert_eq!(launch(&anyone, &agent).await?.by, "");
    assert_eq!(seen.recv().await, Some(None), "no identity without TLS");
    Ok(())
}
