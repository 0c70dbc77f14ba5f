//! What the agent's integration-test modules share: an agent's settings for tests, an agent on
//! a node of its own in this process, the `muster-agent` binary as a child process, and a real
//! master for it to register with (jobs are submitted to it with
//! [`muster_master::testing::submit`]).
//!
//! Every master and agent here speaks mutual TLS with a certificate of the shared test CA
//! ([`TestPki::shared`]), as in production.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context as _;
use muster_actor::{System, Upid};
use muster_agent::{AgentConfig, AgentHandle};
use muster_master::{MasterConfig, MasterServer};
use muster_security::Role;
use muster_security::testing::TestPki;
use muster_transport::Node;

/// The `muster-agent` binary Cargo built for these tests.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_muster-agent");

/// How long an agent, in process or a child, may take to start and register.
pub(crate) const WAIT: Duration = Duration::from_secs(30);

/// An agent's settings for tests: reporting to `masters`, its data in `data_dir`, the host
/// `test-host` with 4 CPUs and 8 GiB, quick registration retries (after 20 ms, backing off to
/// 200 ms) and asks that give up after 2 s.
pub(crate) fn agent_config(masters: &[String], data_dir: &Path) -> AgentConfig {
    let mut config = AgentConfig::new(masters.to_vec(), data_dir);
    config.hostname = "test-host".into();
    config.resources = (4.0, 8192);
    config.registration_backoff_initial = Duration::from_millis(20);
    config.registration_backoff_max = Duration::from_millis(200);
    config.ask_timeout = Duration::from_secs(2);
    config
}

/// An agent in this process on its own system and node, presenting the certificate `agent-1`.
/// Modules add the waits they need in `impl AgentNode` blocks of their own.
pub(crate) struct AgentNode {
    /// Its actor system.
    pub(crate) system: System,
    /// Its node.
    pub(crate) node: Node,
    /// The agent.
    pub(crate) handle: AgentHandle,
}

impl AgentNode {
    /// Starts an agent on `config`; it registers in the background.
    pub(crate) async fn start(config: AgentConfig) -> anyhow::Result<Self> {
        let system = System::new();
        let node = Node::bind(
            &system,
            "127.0.0.1:0",
            TestPki::shared().security(Role::Agent, "agent-1"),
        )
        .await?;
        let handle = muster_agent::start(&node, config).await?;
        Ok(AgentNode {
            system,
            node,
            handle,
        })
    }

    /// [`AgentNode::start`], then waits (up to [`WAIT`]) until the agent has registered.
    pub(crate) async fn start_registered(config: AgentConfig) -> anyhow::Result<Self> {
        let agent = AgentNode::start(config).await?;
        tokio::time::timeout(WAIT, agent.handle.registered())
            .await
            .context("the agent did not register in time")??;
        Ok(agent)
    }

    /// The agent's pid.
    pub(crate) fn upid(&self) -> &Upid {
        self.handle.upid()
    }

    /// Stops the agent, then its node and system.
    pub(crate) async fn stop(&self) {
        self.handle.stop().await;
        self.node.shutdown();
        self.system.shutdown().await;
    }
}

/// A free port of loopback, as `host:port`: bound, then released for a master (or nobody) to
/// listen on later.
pub(crate) fn free_address() -> anyhow::Result<String> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .to_string())
}

/// A real master listening on `listen`, its data in `dir/master`, the certificate `master-1`,
/// once it leads.
pub(crate) async fn start_master(listen: &str, dir: &Path) -> anyhow::Result<MasterServer> {
    muster_master::testing::start_leading(MasterConfig {
        listen: listen.to_owned(),
        data_dir: dir.join("master"),
        ..MasterConfig::new(TestPki::shared().security(Role::Master, "master-1"))
    })
    .await
}

/// A child process, SIGKILLed and reaped when the test ends, however it ends.
pub(crate) struct Killed(pub(crate) Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the binary as agent `agent-1` of `master` (`host:port`), its data in `data_dir`,
/// listening on a free port, with `extra` flags; `guard` takes the child at once, so that it is
/// stopped however the test ends. Returns the guard with the first line the agent prints
/// (where it listens), read within [`WAIT`].
pub(crate) fn spawn_agent<G>(
    master: &str,
    data_dir: &Path,
    extra: &[&str],
    guard: impl FnOnce(Child) -> G,
) -> anyhow::Result<(G, String)> {
    let mut child = Command::new(BIN)
        .args(TestPki::shared().args(Role::Agent, "agent-1"))
        .args(["--listen", "127.0.0.1:0", "--master", master])
        .args(extra)
        .arg("--data-dir")
        .arg(data_dir)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot run muster-agent")?;
    let stdout = child.stdout.take().context("no stdout")?;
    let agent = guard(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let read = BufReader::new(stdout).read_line(&mut line).map(|_| line);
        let _ = tx.send(read);
    });
    let line = rx
        .recv_timeout(WAIT)
        .context("no line on stdout in time")??;
    Ok((agent, line))
}
