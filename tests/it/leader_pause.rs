//! A leader paused with SIGSTOP, with real `muster-master` and `muster-agent` processes: its
//! link stays up and it answers nothing, so nothing breaks for its agents to notice.
//!
//! - A standby takes over, announces itself, and the agents re-register with it, long before
//!   their 75-second silence timeout would have sent them looking.
//! - The paused master, resumed, answers no linearizable read (it no longer leads, and says
//!   who does), and the agents stay with the leader.
//!
//! The binaries come from the same target directory as this test: `cargo test --workspace`
//! builds them.

use anyhow::Context as _;
use common::{Masters, leader_state_when, leader_state_within, signal_child, start_agents};
use muster::proto::cluster as pb;

use crate::common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_leave_a_paused_leader_for_its_successor() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut masters = Masters::new(dir.path(), 3).await?;
    masters.start_all().await?;
    let root = muster_master::testing::bootstrap(&masters.addresses[0]).await?;
    let mut agents = start_agents(dir.path(), &masters.addresses, 2, |_| Vec::new()).await?;
    let (paused, before) =
        leader_state_when(&masters.addresses, &root, "two agents registered", |s| {
            s.agents.len() == 2 && s.agents.iter().all(|a| a.connected)
        })
        .await?;

    signal_child(
        masters.children[paused].as_ref().context("leader")?,
        libc::SIGSTOP,
    )?;
    let paused_at = std::time::Instant::now();
    // Before the transport's keepalive (20 s) could notice the silent master: the agents move
    // because the new leader told them, not because their link to the old one broke.
    let (leader, after) = leader_state_within(
        &masters.addresses,
        &root,
        "both agents with a new leader",
        std::time::Duration::from_secs(15),
        |s| !s.recovering && s.agents.iter().filter(|a| a.connected).count() == 2,
    )
    .await?;
    eprintln!(
        "agents re-registered with the new leader {:?} after the pause",
        paused_at.elapsed()
    );
    assert_ne!(leader, paused);
    assert!(after.term > before.term);

    // Resumed, the old leader serves no linearizable read: it names its successor.
    signal_child(
        masters.children[paused].as_ref().context("paused")?,
        libc::SIGCONT,
    )?;
    let mut old = muster_master::testing::operator(&masters.addresses[paused], Some(&root)).await?;
    let deadline = tokio::time::Instant::now() + common::DEADLINE;
    loop {
        match old.get_state(pb::GetStateRequest::default()).await {
            Err(refused) if refused.code() == tonic::Code::FailedPrecondition => {
                // Another master (the successor, unless leadership moved again meanwhile).
                let hint = muster::scheduler::protocol::leader_hint(&refused);
                assert!(
                    hint.as_ref()
                        .is_some_and(|h| *h != masters.addresses[paused]),
                    "{refused:?}"
                );
                break;
            }
            other => {
                anyhow::ensure!(
                    tokio::time::Instant::now() < deadline,
                    "the resumed master still answers as leader: {other:?}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
    // The agents stay with whoever leads now, never the resumed master of the old term.
    let (now_leading, state) =
        leader_state_when(&masters.addresses, &root, "agents with the leader", |s| {
            s.agents.iter().filter(|a| a.connected).count() == 2
        })
        .await?;
    assert!(now_leading != paused || state.term > after.term);
    assert!(state.term >= after.term);

    for child in agents
        .iter_mut()
        .chain(masters.children.iter_mut().flatten())
    {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
    Ok(())
}
