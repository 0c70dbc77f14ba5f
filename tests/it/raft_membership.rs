//! `muster operator raft` against three real `muster-master` processes with two real agents:
//! `list-peers` shows every master and the leader; `transfer-leadership` moves the leader and
//! the agents re-register with the new one; a fourth master started with `--join` becomes a
//! voter (the agents keep its address, which the leader names in its heartbeat replies), and
//! `remove-peer` takes it out again (the agents forget it); removing the leader is refused,
//! saying what to do first.

use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use muster::proto::cluster as pb;
use muster_security::TokenSecret;
use tokio::time::Instant;

use crate::common::{
    self, DEADLINE, Masters, cli_with_token, free_ports, leader_state_when, master_command,
    spawn_listening, start_agents,
};

/// `muster operator raft ARGS --json` with the test client's certificate and `token`, against
/// every master of `masters`: whether it succeeded, its stdout and its stderr.
async fn raft(
    masters: &[String],
    token: &TokenSecret,
    args: &[&str],
) -> anyhow::Result<(bool, String, String)> {
    let output = cli_with_token(masters, token)?
        .args(["operator", "raft"])
        .args(args)
        .arg("--json")
        .output()
        .await?;
    Ok((
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

/// `list-peers`, read.
async fn peers(
    masters: &[String],
    token: &TokenSecret,
) -> anyhow::Result<muster_api::RaftConfiguration> {
    let (ok, out, err) = raft(masters, token, &["list-peers"]).await?;
    ensure!(ok, "list-peers: {err}");
    serde_json::from_str(&out).with_context(|| format!("list-peers printed {out:?}"))
}

/// Polls `list-peers` until `done` holds.
async fn peers_until(
    masters: &[String],
    token: &TokenSecret,
    what: &str,
    done: impl Fn(&muster_api::RaftConfiguration) -> bool,
) -> anyhow::Result<muster_api::RaftConfiguration> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let last = peers(masters, token).await;
        if let Ok(list) = &last
            && done(list)
        {
            return last;
        }
        if Instant::now() > deadline {
            bail!("{what} did not happen within {DEADLINE:?}; last list-peers: {last:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn voters(list: &muster_api::RaftConfiguration) -> Vec<u64> {
    list.servers
        .iter()
        .filter(|s| s.voter)
        .map(|s| s.id)
        .collect()
}

fn all_connected(state: &pb::ClusterState, agents: usize) -> bool {
    state.agents.len() == agents && state.agents.iter().all(|a| a.connected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_moves_the_agents_follow_and_a_joined_master_comes_and_goes()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut masters = Masters::new(dir.path(), 3).await?;
    masters.start_all().await?;
    let root = muster_master::testing::bootstrap(&masters.addresses[0]).await?;
    let _agents = start_agents(dir.path(), &masters.addresses, 2, |n| {
        vec!["--hostname".into(), format!("host-{n}")]
    })
    .await?;
    let (first, _) = leader_state_when(&masters.addresses, &root, "both agents registered", |s| {
        all_connected(s, 2)
    })
    .await?;
    let first = first as u64 + 1;

    let list = peers_until(&masters.addresses, &root, "every master healthy", |list| {
        list.servers.len() == 3 && list.servers.iter().all(|s| s.healthy == Some(true))
    })
    .await?;
    assert_eq!(voters(&list), vec![1, 2, 3]);
    assert_eq!(list.answered_by, first, "the leader answers");
    let leaders: Vec<u64> = list
        .servers
        .iter()
        .filter(|s| s.leader)
        .map(|s| s.id)
        .collect();
    assert_eq!(leaders, vec![first]);

    // Removing the leader is refused, naming the way.
    let (ok, _, err) = raft(
        &masters.addresses,
        &root,
        &["remove-peer", &first.to_string()],
    )
    .await?;
    ensure!(!ok, "the leader was removed");
    ensure!(err.contains("transfer-leadership"), "the refusal: {err}");

    // Leadership moves where it is sent, and the agents follow it.
    let target = if first == 3 { 1 } else { first + 1 };
    let (ok, out, err) = raft(
        &masters.addresses,
        &root,
        &["transfer-leadership", "--to", &target.to_string()],
    )
    .await?;
    ensure!(ok, "transfer-leadership: {err}");
    let moved: serde_json::Value = serde_json::from_str(&out)?;
    assert_eq!(moved["leader"], target, "{out}");
    let (now, _) = leader_state_when(&masters.addresses, &root, "the agents follow", |s| {
        all_connected(s, 2)
    })
    .await?;
    assert_eq!(now as u64 + 1, target, "the leader is the one named");

    // A fourth master joins through a follower and becomes a voter...
    let address = free_ports(1).await?.remove(0);
    let mut joining = master_command(4, &address, &dir.path().join("master-4"))?;
    joining
        .args(["--id", "4", "--peer"])
        .arg(format!("4={address}"))
        .arg("--join")
        .arg(&masters.addresses[(first - 1) as usize]);
    let mut fourth = spawn_listening(joining, "master 4").await?;
    let list = peers_until(&masters.addresses, &root, "master 4 votes", |list| {
        voters(list) == [1, 2, 3, 4]
    })
    .await?;
    let joined = list
        .servers
        .iter()
        .find(|s| s.id == 4)
        .context("master 4")?;
    assert_eq!(joined.address, address);
    // The leader names it to the agents in its heartbeat replies; they keep it for a restart.
    let kept = dir.path().join("agent-0").join("meta").join("masters");
    let named = format!("master@{address}");
    common::poll_within("the agent keeps master 4", common::DEADLINE, || {
        let text = std::fs::read_to_string(&kept).unwrap_or_default();
        if text.lines().any(|line| line == named) {
            Ok(())
        } else {
            Err(format!("{}: {text:?}", kept.display()))
        }
    })
    .await?;

    // ... and leaves again.
    let (ok, out, err) = raft(&masters.addresses, &root, &["remove-peer", "4"]).await?;
    ensure!(ok, "remove-peer 4: {err}");
    let list: muster_api::RaftConfiguration = serde_json::from_str(&out)?;
    assert_eq!(voters(&list), vec![1, 2, 3], "{out}");
    common::poll_within("the agent forgets master 4", common::DEADLINE, || {
        let text = std::fs::read_to_string(&kept).unwrap_or_default();
        if text.lines().count() == 3 && !text.lines().any(|line| line == named) {
            Ok(())
        } else {
            Err(format!("{}: {text:?}", kept.display()))
        }
    })
    .await?;
    fourth.kill().await?;
    common::kill_marked_under(&dir.path().to_string_lossy());
    Ok(())
}
