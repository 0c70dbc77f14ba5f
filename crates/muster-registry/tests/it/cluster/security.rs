//! Who the members serve: raft to master certificates only, and tokens on every member until
//! their deletion applies.

use super::*;

/// A forged raft `Vote` with a higher term, as would make a leader step down.
fn forged_vote(term: u64) -> muster_proto::registry::RaftPayload {
    let vote: openraft::raft::VoteRequest<NodeId> = openraft::raft::VoteRequest {
        vote: openraft::Vote::new(term, 99),
        last_log_id: None,
    };
    muster_proto::registry::RaftPayload {
        body: muster_registry::codec::encode(&vote)
            .unwrap_or_default()
            .into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_is_served_to_master_certificates_only() -> anyhow::Result<()> {
    use muster_proto::registry::raft_client::RaftClient;
    use muster_security::Security;

    let system = System::new();
    let dir = tempfile::tempdir()?;
    let (addresses, members) = three_members(&system, dir.path()).await?;
    let first = leader(&members).await?;
    let term = members[&first].registry.leadership().borrow().term;
    let target = format!("http://{}", addresses[&first]);

    // An agent's and a client's certificate: refused by the guard, before raft sees it.
    for role in [Role::Agent, Role::Client] {
        let security = TestPki::shared().security(role, "intruder");
        let endpoint = tonic::transport::Endpoint::from_shared(target.clone())?;
        let (channel, _) = security.channel(endpoint, &[Role::Master]).await?;
        let refused = RaftClient::new(channel)
            .vote(forged_vote(term + 100))
            .await
            .expect_err("a vote from a non-master");
        assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
        assert!(refused.message().contains(role.as_str()), "{refused:?}");
    }
    // Another CA's master certificate, and plaintext: no connection at all.
    for security in [
        TestPki::foreign().security(Role::Master, "master-1"),
        Security::Insecure,
    ] {
        let endpoint = tonic::transport::Endpoint::from_shared(target.clone())?
            .connect_timeout(Duration::from_secs(5));
        let reached = match security.channel(endpoint, &[Role::Master]).await {
            Err(_) => false,
            Ok((channel, _)) => RaftClient::new(channel)
                .vote(forged_vote(term + 100))
                .await
                .is_ok(),
        };
        assert!(!reached, "a stranger's vote reached raft");
    }

    // The leader kept its lead and its term.
    assert_eq!(leader(&members).await?, first);
    assert_eq!(members[&first].registry.leadership().borrow().term, term);
    for member in members.into_values() {
        member.stop().await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_authenticates_on_every_member_until_its_deletion_applies() -> anyhow::Result<()> {
    use muster_security::{AclToken, TokenSecret, TokenSource as _, TokenType};

    let system = System::new();
    let dir = tempfile::tempdir()?;
    let (_, members) = three_members(&system, dir.path()).await?;
    let first = leader(&members).await?;
    let secret = TokenSecret::generate().map_err(|_| anyhow::anyhow!("no randomness"))?;
    let token = AclToken {
        accessor: "acc-ci".into(),
        name: "ci".into(),
        token_type: TokenType::Client,
        policies: vec!["submit".into()],
        secret_hash: secret.hash(),
        created_ms: 1,
    };
    let written = members[&first]
        .registry
        .write(muster_registry::types::Batch {
            ops: vec![Op::BootstrapAcl(token)],
        })
        .await?;
    assert_eq!(written.results, [Ok(Outcome::TokenStored)]);

    let everywhere = |known: bool| {
        let members = &members;
        let secret = &secret;
        async move {
            let deadline = Instant::now() + DEADLINE;
            while !members
                .values()
                .all(|m| m.registry.reader().authenticate(secret).is_some() == known)
            {
                if Instant::now() > deadline {
                    bail!(
                        "the token's {} did not reach every member",
                        if known { "creation" } else { "deletion" }
                    );
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            anyhow::Ok(())
        }
    };
    everywhere(true).await?;
    members[&first]
        .registry
        .write(muster_registry::types::Batch {
            ops: vec![Op::DeleteToken {
                accessor: "acc-ci".into(),
            }],
        })
        .await?;
    everywhere(false).await?;
    for member in members.into_values() {
        member.stop().await;
    }
    Ok(())
}
