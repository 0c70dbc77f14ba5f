//! The agent's heartbeats against a fake master that takes them: sent right after registering
//! and then at half of each TTL the master gives; a refused heartbeat makes the agent
//! re-register, an unanswered one makes it count the master as lost.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use muster_actor::{Context, Pid, Process, Reply, System, Upid};
use muster_agent::{AgentConfig, AgentHandle, AgentStatus};
use muster_proto::cluster::{
    Heartbeat, HeartbeatReply, RegisterAgent, RegistrationReply, ReregisterAgent, heartbeat_reply,
    registration_reply,
};
use muster_security::Role;
use muster_security::testing::TestPki;
use muster_transport::Node;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::common::{AgentNode, agent_config};

/// How long any one expected event may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(15);

/// How the fake master answers heartbeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Beats {
    /// With this TTL.
    Ttl(Duration),
    /// Refuse the next one, then go back to this TTL.
    RefuseOnce(Duration),
    /// Never answer (the replies are kept, so the agent's asks time out).
    Silent,
}

/// What the fake master received, and when.
#[derive(Debug)]
enum Got {
    Register,
    Reregister(String),
    Heartbeat(String, Instant),
}

struct FakeMaster {
    beats: Arc<Mutex<Beats>>,
    got: mpsc::UnboundedSender<Got>,
    unanswered: Vec<Reply<HeartbeatReply>>,
}

enum FakeMsg {
    Register(Reply<RegistrationReply>),
    Reregister(String, Reply<RegistrationReply>),
    Heartbeat(Heartbeat, Reply<HeartbeatReply>),
}

fn admitted(id: &str) -> RegistrationReply {
    RegistrationReply {
        result: Some(registration_reply::Result::AgentId(id.to_owned())),
        ..RegistrationReply::default()
    }
}

impl Process for FakeMaster {
    type Message = FakeMsg;

    async fn handle(&mut self, msg: FakeMsg, _ctx: &mut Context<Self>) {
        match msg {
            FakeMsg::Register(reply) => {
                reply.send(admitted("agent-h"));
                let _ = self.got.send(Got::Register);
            }
            FakeMsg::Reregister(agent_id, reply) => {
                reply.send(admitted(&agent_id));
                let _ = self.got.send(Got::Reregister(agent_id));
            }
            FakeMsg::Heartbeat(heartbeat, reply) => {
                // How to answer is decided before the test hears of the heartbeat: a test that
                // changes `beats` on hearing of one changes the answer to the next, never to
                // this one.
                let mut beats = self.beats.lock().unwrap_or_else(|p| p.into_inner());
                let decided = *beats;
                if let Beats::RefuseOnce(then) = decided {
                    *beats = Beats::Ttl(then);
                }
                drop(beats);
                let _ = self
                    .got
                    .send(Got::Heartbeat(heartbeat.agent_id, Instant::now()));
                let result = match decided {
                    Beats::Ttl(ttl) => {
                        heartbeat_reply::Result::TtlMs(ttl.as_millis().try_into().unwrap_or(0))
                    }
                    Beats::RefuseOnce(_) => {
                        heartbeat_reply::Result::Refused("unknown agent; re-register".into())
                    }
                    Beats::Silent => {
                        self.unanswered.push(reply);
                        return;
                    }
                };
                reply.send(HeartbeatReply {
                    result: Some(result),
                    ..HeartbeatReply::default()
                });
            }
        }
    }
}

/// A fake master and an agent, each on its own system and node.
struct Setup {
    master_system: System,
    master_node: Node,
    agent_node: AgentNode,
    beats: Arc<Mutex<Beats>>,
    got: mpsc::UnboundedReceiver<Got>,
    master: Upid,
    agent: AgentHandle,
    _pid: Pid<FakeMaster>,
    _dir: tempfile::TempDir,
}

impl Setup {
    async fn start(beats: Beats, tweak: impl FnOnce(&mut AgentConfig)) -> anyhow::Result<Self> {
        let master_system = System::new();
        let master_node = Node::bind(
            &master_system,
            "127.0.0.1:0",
            TestPki::shared().security(Role::Master, "master-1"),
        )
        .await?;
        let (tx, got) = mpsc::unbounded_channel();
        let beats = Arc::new(Mutex::new(beats));
        let pid = master_system.spawn(FakeMaster {
            beats: Arc::clone(&beats),
            got: tx,
            unanswered: Vec::new(),
        });
        master_node
            .register("master", &pid)?
            .install_ask::<RegisterAgent, RegistrationReply>(|_, reply| FakeMsg::Register(reply))
            .install_ask::<ReregisterAgent, RegistrationReply>(|request, reply| {
                FakeMsg::Reregister(request.agent_id, reply)
            })
            .install_ask::<Heartbeat, HeartbeatReply>(FakeMsg::Heartbeat);
        let master = Upid::new("master", master_node.address())?;

        let dir = tempfile::tempdir()?;
        let mut config = agent_config(&[master_node.address().to_owned()], dir.path());
        config.resources = (1.0, 1024);
        tweak(&mut config);
        let agent_node = AgentNode::start(config).await?;
        let agent = agent_node.handle.clone();
        Ok(Setup {
            master_system,
            master_node,
            agent_node,
            beats,
            got,
            master,
            agent,
            _pid: pid,
            _dir: dir,
        })
    }

    fn set(&self, beats: Beats) {
        *self.beats.lock().unwrap_or_else(|p| p.into_inner()) = beats;
    }

    async fn next(&mut self) -> anyhow::Result<Got> {
        tokio::time::timeout(PATIENCE, self.got.recv())
            .await
            .context("the fake master got nothing in time")?
            .context("fake master gone")
    }

    /// The next heartbeat's arrival; it must name `agent-h`.
    async fn next_heartbeat(&mut self) -> anyhow::Result<Instant> {
        match self.next().await? {
            Got::Heartbeat(id, at) if id == "agent-h" => Ok(at),
            other => bail!("expected a heartbeat from agent-h, got {other:?}"),
        }
    }

    async fn registered(&self) -> anyhow::Result<()> {
        let (id, master) = tokio::time::timeout(PATIENCE, self.agent.registered()).await??;
        ensure!(id == "agent-h" && master == self.master, "{id} at {master}");
        Ok(())
    }

    async fn stop(self) {
        self.agent.stop().await;
        self.agent_node.node.shutdown();
        self.master_node.shutdown();
        self.agent_node.system.shutdown().await;
        self.master_system.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_heartbeats_within_its_ttl_and_reregisters_when_refused() -> anyhow::Result<()> {
    let ttl = Duration::from_millis(400);
    let mut setup = Setup::start(Beats::Ttl(ttl), |_| {}).await?;
    ensure!(matches!(setup.next().await?, Got::Register));
    setup.registered().await?;

    // The first right after registering, then one per half TTL: never late, never early.
    let mut last = setup.next_heartbeat().await?;
    for _ in 0..5 {
        let at = setup.next_heartbeat().await?;
        let gap = at - last;
        ensure!(
            gap >= ttl / 2 - Duration::from_millis(10) && gap < ttl,
            "{gap:?} between heartbeats with a TTL of {ttl:?}"
        );
        last = at;
    }

    // A refused heartbeat: the agent re-registers under its id, then heartbeats again.
    setup.set(Beats::RefuseOnce(ttl));
    loop {
        match setup.next().await? {
            Got::Heartbeat(..) => continue,
            Got::Reregister(id) => {
                ensure!(id == "agent-h");
                break;
            }
            Got::Register => bail!("registered anew instead of re-registering"),
        }
    }
    setup.registered().await?;
    setup.next_heartbeat().await?;
    setup.next_heartbeat().await?;
    ensure!(matches!(
        *setup.agent.status().borrow(),
        AgentStatus::Registered { .. }
    ));
    setup.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_stops_answering_heartbeats_counts_as_lost() -> anyhow::Result<()> {
    // Heartbeats far more often than the silence timeout: only the unanswered heartbeat can
    // tell. The timeout leaves a loaded machine room to answer the heartbeats that are
    // answered.
    let mut setup = Setup::start(Beats::Ttl(Duration::from_millis(200)), |config| {
        config.master_silence_timeout = Duration::from_secs(1);
    })
    .await?;
    ensure!(matches!(setup.next().await?, Got::Register));
    setup.registered().await?;
    setup.next_heartbeat().await?;
    setup.next_heartbeat().await?;
    setup.set(Beats::Silent);
    loop {
        match setup.next().await? {
            Got::Heartbeat(..) => continue,
            Got::Reregister(id) => {
                ensure!(id == "agent-h");
                break;
            }
            Got::Register => bail!("registered anew instead of re-registering"),
        }
    }
    setup.stop().await;
    Ok(())
}

/// A heartbeat lost in a cut link is waited for no longer than the TTL the master gave (past
/// it the master counts the agent late and may replace its tasks), not the whole silence
/// timeout: the agent re-registers, and hears at once what it must kill. Before, it waited
/// the silence timeout (75 s by default) while its replaced tasks ran twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_heartbeat_is_waited_for_no_longer_than_its_ttl() -> anyhow::Result<()> {
    let mut setup = Setup::start(Beats::Ttl(Duration::from_secs(1)), |config| {
        // Far beyond PATIENCE: only the TTL can end the wait in time.
        config.master_silence_timeout = Duration::from_secs(120);
    })
    .await?;
    ensure!(matches!(setup.next().await?, Got::Register));
    setup.registered().await?;
    setup.next_heartbeat().await?;
    setup.set(Beats::Silent);
    loop {
        match setup.next().await? {
            Got::Heartbeat(..) => continue,
            Got::Reregister(id) => {
                ensure!(id == "agent-h");
                break;
            }
            Got::Register => bail!("registered anew instead of re-registering"),
        }
    }
    setup.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_ttl_does_not_count_as_silence() -> anyhow::Result<()> {
    // The master answers at once but gives a TTL ten times the silence timeout: the agent must
    // stay registered through several silence timeouts without a heartbeat.
    let mut setup = Setup::start(Beats::Ttl(Duration::from_secs(10)), |config| {
        config.master_silence_timeout = Duration::from_secs(1);
    })
    .await?;
    ensure!(matches!(setup.next().await?, Got::Register));
    setup.registered().await?;
    setup.next_heartbeat().await?;
    // Pacing, not synchronisation: three silence timeouts pass (the next heartbeat is due
    // at half the TTL, 5 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(
        setup.got.try_recv().is_err(),
        "the agent re-registered or heartbeat early"
    );
    ensure!(matches!(
        *setup.agent.status().borrow(),
        AgentStatus::Registered { .. }
    ));
    setup.stop().await;
    Ok(())
}
