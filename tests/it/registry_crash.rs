//! Durability of the registry under SIGKILL: a `muster-master` process is killed 20 times in a
//! row in the middle of a stream of agent registrations (each one a registry write), restarted
//! each time on the same data dir, and every registration it acknowledged must still be there.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Context as _;
use common::{DEADLINE, master_command, spawn_listening};
use muster::actor::{Node, System, Upid};
use muster::proto::cluster as pb;
use muster::proto::cluster::registration_reply::Result as Registration;
use muster::proto::model as model_pb;
use muster_security::Role;
use muster_security::TokenSecret;
use muster_security::testing::TestPki;
use tokio::process::Child;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::common;

const ROUNDS: usize = 20;
const WRITERS: usize = 8;

async fn start_master(address: &str, data_dir: &std::path::Path) -> anyhow::Result<Child> {
    // The port may still be held for a moment by the killed predecessor.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let mut command = master_command(1, address, data_dir)?;
        // The test plays its agents on one node, behind one certificate.
        command.args(["--agents-per-certificate", "1000000"]);
        match spawn_listening(command, "muster-master").await {
            Ok(child) => return Ok(child),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Registers agents one after another until the master stops answering, sending each
/// acknowledged id to `acked`.
async fn register_until_killed(
    node: Node,
    master: Upid,
    round: usize,
    writer: usize,
    acked: mpsc::UnboundedSender<String>,
) {
    let remote = node.remote(master);
    for n in 0.. {
        let request = pb::RegisterAgent {
            info: Some(model_pb::AgentInfo {
                // Distinct in every round: the same agent registering again keeps its id.
                hostname: format!("writer-{round}-{writer}-{n}"),
                address: format!("agent@127.0.0.1:{}", 10_000 + writer),
                ..model_pb::AgentInfo::default()
            }),
            ..Default::default()
        };
        let answer = remote
            .ask_timeout::<pb::RegisterAgent, pb::RegistrationReply>(
                Duration::from_secs(2),
                request,
            )
            .await;
        match answer.map(|a| a.result) {
            Ok(Some(Registration::AgentId(id))) => {
                if acked.send(id).is_err() {
                    return;
                }
            }
            // Not leading yet: ask again.
            Ok(Some(Registration::NotLeader(_))) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // Killed (or refused while going down): this writer is done.
            _ => return,
        }
    }
}

/// The agents the master at `address` has admitted, once it leads again.
async fn admitted_after_restart(
    address: &str,
    token: &TokenSecret,
) -> anyhow::Result<BTreeSet<String>> {
    let masters = [address.to_owned()];
    let (_, state) =
        common::leader_state_when(&masters, token, "the restarted master leading", |_| true)
            .await?;
    Ok(state
        .agents
        .into_iter()
        .map(|a| a.id)
        .chain(state.unreachable.into_iter().map(|a| a.id))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_registry_writes_survive_twenty_sigkills() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let data_dir = dir.path().join("master");
    let address = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await?
        .local_addr()?
        .to_string();
    let master: Upid = format!("master@{address}").parse()?;
    let system = System::new();
    let mut acknowledged = BTreeSet::new();
    let mut root = None;

    for round in 1..=ROUNDS {
        let mut child = start_master(&address, &data_dir).await?;
        // The management token, bootstrapped once, must survive every SIGKILL too.
        let token = match &root {
            Some(token) => token,
            None => root.insert(muster_master::testing::bootstrap(&address).await?),
        };
        let recovered = admitted_after_restart(&address, token).await?;
        let lost: Vec<&String> = acknowledged.difference(&recovered).collect();
        assert!(
            lost.is_empty(),
            "round {round}: acknowledged registrations lost after SIGKILL: {lost:?}"
        );

        let node = Node::bind(
            &system,
            "127.0.0.1:0",
            TestPki::shared().security(Role::Agent, "agent-1"),
        )
        .await?;
        let (acked_tx, mut acked_rx) = mpsc::unbounded_channel();
        for writer in 0..WRITERS {
            tokio::spawn(register_until_killed(
                node.clone(),
                master.clone(),
                round,
                writer,
                acked_tx.clone(),
            ));
        }
        drop(acked_tx);
        // Let some writes through, then kill at a different moment each round.
        let wanted = 10 + kill_point(round);
        let mut this_round = 0;
        while this_round < wanted {
            let id = tokio::time::timeout(DEADLINE, acked_rx.recv())
                .await
                .context("no registration acknowledged")?
                .context("every writer stopped")?;
            acknowledged.insert(id);
            this_round += 1;
        }
        child.start_kill()?;
        child.wait().await?;
        // Acknowledgements that raced the kill still count.
        while let Some(id) = acked_rx.recv().await {
            acknowledged.insert(id);
        }
        node.shutdown();
    }

    let child = start_master(&address, &data_dir).await?;
    let token = root.context("no round ran")?;
    let recovered = admitted_after_restart(&address, &token).await?;
    let lost: Vec<&String> = acknowledged.difference(&recovered).collect();
    assert!(lost.is_empty(), "acknowledged registrations lost: {lost:?}");
    assert!(acknowledged.len() >= ROUNDS * 10);
    drop(child);
    Ok(())
}

/// How many more acknowledgements to wait for before the kill: 0..=40, varying by round, the
/// same every run.
fn kill_point(round: usize) -> usize {
    (round * 7919) % 41
}
