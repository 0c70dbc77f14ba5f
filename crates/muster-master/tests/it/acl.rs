//! ACL tokens on a real master over TLS: bootstrap once, no token no access, each policy
//! grants what its name says, environments are redacted for readers, a deleted token is
//! refused, and secrets are never listed.

use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use muster_master::testing::{self, bootstrap, create_token, operator};
use muster_master::{MasterConfig, MasterServer, REDACTED};
use muster_proto::cluster as pb;
use muster_proto::cluster::operator_client::OperatorClient;
use muster_proto::model as model_pb;
use muster_security::guard::WithToken;
use muster_security::testing::TestPki;
use muster_security::{Role, Security, TokenSecret};
use tonic::Code;

use crate::common::master_config;

async fn master(dir: &std::path::Path) -> anyhow::Result<MasterServer> {
    Ok(MasterServer::start(MasterConfig {
        workers: 0,
        ..master_config(dir)
    })
    .await?)
}

fn job() -> model_pb::Job {
    model_pb::Job {
        name: "shop".into(),
        scheduler: model_pb::SchedulerType::Service as i32,
        priority: 50,
        groups: vec![model_pb::TaskGroup {
            name: "web".into(),
            count: 1,
            resources: Some(model_pb::Resources {
                cpus: 0.1,
                mem_mb: 16,
            }),
            command: "true".into(),
            env: [("DB_PASSWORD".to_owned(), "hunter2".to_owned())].into(),
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    }
}

fn submit(job: model_pb::Job) -> pb::SubmitJobRequest {
    pb::SubmitJobRequest { job: Some(job) }
}

fn status(name: &str) -> pb::JobStatusRequest {
    pb::JobStatusRequest {
        name: name.into(),
        ..pb::JobStatusRequest::default()
    }
}

fn env_of(reply: &pb::JobStatusReply) -> Option<String> {
    reply
        .job
        .as_ref()?
        .groups
        .first()?
        .env
        .get("DB_PASSWORD")
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_policies_decide_every_call() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = master(dir.path()).await?;
    let address = master.address().to_owned();

    // No token at all: refused, saying how to give one.
    let mut anonymous = operator(&address, None).await?;
    let refused = anonymous
        .submit_job(submit(job()))
        .await
        .expect_err("no token");
    ensure!(refused.code() == Code::Unauthenticated, "{refused:?}");
    ensure!(
        refused
            .message()
            .starts_with("no token; set MUSTER_TOKEN or --token"),
        "{refused:?}"
    );

    // Bootstrap: once.
    let root = bootstrap(&address).await?;
    let again = anonymous
        .acl_bootstrap(pb::AclBootstrapRequest {})
        .await
        .expect_err("a second bootstrap");
    ensure!(again.code() == Code::FailedPrecondition, "{again:?}");
    ensure!(
        again.message().contains("ACL already bootstrapped"),
        "{again:?}"
    );

    let reader = create_token(&address, &root, "ci", "read").await?;
    let submitter = create_token(&address, &root, "deploy", "submit").await?;

    // A reader cannot submit; the error names its policy and what is needed.
    let refused = operator(&address, Some(&reader))
        .await?
        .submit_job(submit(job()))
        .await
        .expect_err("read submits");
    ensure!(refused.code() == Code::PermissionDenied, "{refused:?}");
    ensure!(
        refused.message()
            == "token \"ci\" (policies: read) may not make this call: it needs a policy granting submit-job in some namespace",
        "{refused:?}"
    );

    // A submitter can, and sees the environment; a reader sees it redacted.
    operator(&address, Some(&submitter))
        .await?
        .submit_job(submit(job()))
        .await?;
    let full = operator(&address, Some(&submitter))
        .await?
        .job_status(status("shop"))
        .await?
        .into_inner();
    ensure!(env_of(&full).as_deref() == Some("hunter2"), "{full:?}");
    let redacted = operator(&address, Some(&reader))
        .await?
        .job_status(status("shop"))
        .await?
        .into_inner();
    ensure!(
        env_of(&redacted).as_deref() == Some(REDACTED),
        "{redacted:?}"
    );

    // A read token reads no task output (read-logs); an operate token operates agents (the
    // call passes the check and meets the unknown agent), a read token does not.
    let logs = operator(&address, Some(&reader))
        .await?
        .task_logs(pb::ReadTaskOutput {
            task_id: "shop.web[0]-00000000".into(),
            ..pb::ReadTaskOutput::default()
        })
        .await
        .expect_err("read reads logs");
    ensure!(
        logs.code() == Code::PermissionDenied && logs.message().contains("read-logs"),
        "{logs:?}"
    );
    let operate = create_token(&address, &root, "ops", "operate").await?;
    let eligibility = |token| {
        let address = address.clone();
        async move {
            operator(&address, Some(token))
                .await?
                .set_agent_eligibility(pb::AgentEligibilityRequest {
                    agent_id: "agent-404".into(),
                    eligible: false,
                })
                .await
                .map_err(anyhow::Error::from)
        }
    };
    let as_operate = eligibility(&operate).await.expect_err("no such agent");
    let as_operate = as_operate
        .downcast_ref::<tonic::Status>()
        .context("a status")?;
    ensure!(as_operate.code() == Code::NotFound, "{as_operate:?}");
    let as_reader = eligibility(&reader).await.expect_err("read operates");
    let as_reader = as_reader
        .downcast_ref::<tonic::Status>()
        .context("a status")?;
    ensure!(
        as_reader.code() == Code::PermissionDenied && as_reader.message().contains("agent write"),
        "{as_reader:?}"
    );

    // Only management manages tokens; an unknown policy is named.
    let refused = operator(&address, Some(&submitter))
        .await?
        .list_tokens(pb::ListTokensRequest {})
        .await
        .expect_err("submit lists tokens");
    ensure!(refused.code() == Code::PermissionDenied, "{refused:?}");
    let bad = operator(&address, Some(&root))
        .await?
        .create_token(pb::CreateTokenRequest {
            name: "x".into(),
            policy: "admin".into(),
            policies: Vec::new(),
        })
        .await
        .expect_err("unknown policy");
    ensure!(bad.code() == Code::InvalidArgument, "{bad:?}");
    ensure!(bad.message().contains("\"admin\""), "{bad:?}");

    // Listed without secrets or hashes.
    let listed = operator(&address, Some(&root))
        .await?
        .list_tokens(pb::ListTokensRequest {})
        .await?
        .into_inner();
    ensure!(listed.tokens.len() == 4, "{listed:?}");
    let text = format!("{listed:?}");
    for secret in [&root, &reader, &submitter, &operate] {
        ensure!(!text.contains(secret.expose()), "a secret is listed");
        ensure!(!text.contains(&secret.hash()), "a hash is listed");
    }

    // A deleted token is refused from then on.
    let ci = listed
        .tokens
        .iter()
        .find(|t| t.name == "ci")
        .context("ci listed")?;
    operator(&address, Some(&root))
        .await?
        .delete_token(pb::DeleteTokenRequest {
            accessor: ci.accessor.clone(),
        })
        .await?;
    let refused = operator(&address, Some(&reader))
        .await?
        .get_state(pb::GetStateRequest::default())
        .await
        .expect_err("a deleted token");
    ensure!(refused.code() == Code::Unauthenticated, "{refused:?}");
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_apis_take_client_certificates_only() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = master(dir.path()).await?;
    let address = master.address().to_owned();
    let root = bootstrap(&address).await?;

    // An agent's certificate with a management token: still refused.
    let agent = TestPki::shared().security(Role::Agent, "agent-1");
    let channel = testing::channel(&address, &agent).await?;
    let mut client = OperatorClient::with_interceptor(channel, WithToken::new(Some(&root))?);
    let refused = client
        .submit_job(submit(job()))
        .await
        .expect_err("an agent certificate");
    ensure!(refused.code() == Code::PermissionDenied, "{refused:?}");
    ensure!(refused.message().contains("agent"), "{refused:?}");

    // Plaintext and another CA's client: no connection; the master serves others after.
    for stranger in [
        Security::Insecure,
        TestPki::foreign().security(Role::Client, "cli"),
    ] {
        let reached = match testing::channel(&address, &stranger).await {
            Err(_) => false,
            Ok(channel) => OperatorClient::with_interceptor(channel, WithToken::new(Some(&root))?)
                .get_state(pb::GetStateRequest::default())
                .await
                .is_ok(),
        };
        ensure!(!reached, "a stranger reached the API");
    }
    let state = tokio::time::timeout(
        Duration::from_secs(10),
        operator(&address, Some(&root))
            .await?
            .get_state(pb::GetStateRequest::default()),
    )
    .await??
    .into_inner();
    ensure!(state.is_leader && !state.insecure, "{state:?}");
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_token_is_refused_without_reaching_the_master() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = master(dir.path()).await?;
    let address = master.address().to_owned();
    bootstrap(&address).await?;
    let guess = TokenSecret::new("0".repeat(64));
    match operator(&address, Some(&guess))
        .await?
        .get_state(pb::GetStateRequest::default())
        .await
    {
        Err(status) if status.code() == Code::Unauthenticated => {}
        other => bail!("a guessed token was taken: {other:?}"),
    }
    master.shutdown().await;
    Ok(())
}

/// The last management token cannot be deleted, and one lost for good is replaced through the
/// reset file the refused bootstrap names, on the leader's disk, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_management_token_stays_and_a_lost_one_is_reset_on_the_leaders_disk()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = master(dir.path()).await?;
    let address = master.address().to_owned();
    let root = bootstrap(&address).await?;
    let accessor_of = |name: &'static str, listed: pb::TokenList| {
        listed
            .tokens
            .into_iter()
            .find(|t| t.name == name)
            .map(|t| t.accessor)
            .with_context(|| format!("{name} listed"))
    };
    let mut managing = operator(&address, Some(&root)).await?;
    let listed = managing.list_tokens(pb::ListTokensRequest {}).await?;
    let root_accessor = accessor_of("bootstrap", listed.into_inner())?;
    let refused = managing
        .delete_token(pb::DeleteTokenRequest {
            accessor: root_accessor.clone(),
        })
        .await
        .expect_err("the last management token deleted");
    ensure!(refused.code() == Code::FailedPrecondition, "{refused:?}");
    ensure!(
        refused.message().contains("last management token"),
        "{refused:?}"
    );
    // It still works.
    managing.list_tokens(pb::ListTokensRequest {}).await?;

    // Its secret is lost. A bootstrap is refused with the reset index; a wrong index in the
    // file is refused too; the right one makes a new management token, once.
    let mut anonymous = operator(&address, None).await?;
    let refused = anonymous
        .acl_bootstrap(pb::AclBootstrapRequest {})
        .await
        .expect_err("a second bootstrap");
    let reset_index: u64 = refused
        .message()
        .split("reset index: ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|index| index.parse().ok())
        .with_context(|| format!("no reset index in {refused:?}"))?;
    let reset_file = dir
        .path()
        .join("master")
        .join(muster_master::ACL_BOOTSTRAP_RESET_FILE);
    std::fs::write(&reset_file, format!("{}\n", reset_index + 1))?;
    let refused = anonymous
        .acl_bootstrap(pb::AclBootstrapRequest {})
        .await
        .expect_err("a reset naming another index");
    ensure!(
        refused
            .message()
            .contains(&format!("reset index: {reset_index}")),
        "{refused:?}"
    );
    std::fs::write(&reset_file, "not a number")?;
    let refused = anonymous
        .acl_bootstrap(pb::AclBootstrapRequest {})
        .await
        .expect_err("a reset file of no index");
    ensure!(
        refused.message().contains("not a reset index"),
        "{refused:?}"
    );
    std::fs::write(&reset_file, format!("{reset_index}\n"))?;
    let new_root = TokenSecret::new(
        anonymous
            .acl_bootstrap(pb::AclBootstrapRequest {})
            .await?
            .into_inner()
            .secret,
    );
    ensure!(!reset_file.exists(), "the used reset file was left behind");
    let mut managing = operator(&address, Some(&new_root)).await?;
    managing
        .delete_token(pb::DeleteTokenRequest {
            accessor: root_accessor,
        })
        .await?;
    let again = anonymous
        .acl_bootstrap(pb::AclBootstrapRequest {})
        .await
        .expect_err("a third bootstrap without a reset");
    ensure!(again.code() == Code::FailedPrecondition, "{again:?}");
    master.shutdown().await;
    Ok(())
}
