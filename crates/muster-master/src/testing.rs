//! The helpers tests use to reach a master: its APIs as a client would (TLS with a client
//! certificate from the shared test CA ([`TestPki`]), and a token), and, in process, starting
//! one that leads, submitting jobs to it and reading their status.

use muster_proto::cluster::operator_client::OperatorClient;

use crate::MAX_OPERATOR_MESSAGE;
use muster_security::guard::WithToken;
use muster_security::testing::TestPki;
use muster_security::{Role, Security, TokenSecret};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// An operator client, as the tests use it.
pub type TestOperator = OperatorClient<InterceptedService<Channel, WithToken>>;

/// The client certificate's security (role client, name `test-client`).
pub fn client_security() -> Security {
    TestPki::shared().security(Role::Client, "test-client")
}

/// How long a call through [`channel`] may wait for its answer.
pub const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// A channel to `address` (`host:port`) with `security`, verified to reach a master.
///
/// # Errors
/// The address is malformed, the master unreachable or the handshake refused.
pub async fn channel(address: &str, security: &Security) -> anyhow::Result<Channel> {
    // A master paused or cut off mid-call must not hang a test: each call has its own limit
    // (a stream's answer must begin within it; the stream then runs as long as it runs).
    let endpoint = Endpoint::from_shared(format!("http://{address}"))?
        .connect_timeout(std::time::Duration::from_secs(5))
        .timeout(CALL_TIMEOUT);
    let (channel, _) = security.channel(endpoint, &[Role::Master]).await?;
    Ok(channel)
}

/// An operator client of the master at `address`, with the test client certificate and
/// `token`.
///
/// # Errors
/// As [`channel`].
pub async fn operator(address: &str, token: Option<&TokenSecret>) -> anyhow::Result<TestOperator> {
    let channel = channel(address, &client_security()).await?;
    Ok(
        OperatorClient::with_interceptor(channel, WithToken::new(token)?)
            .max_decoding_message_size(MAX_OPERATOR_MESSAGE)
            .max_encoding_message_size(MAX_OPERATOR_MESSAGE),
    )
}

/// How long [`bootstrap`] keeps trying while the cluster elects a leader.
const BOOTSTRAP_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Bootstraps the ACL system of the cluster at `address` (any master: a standby's answer leads
/// to the leader) and returns the management token. Retries while no leader is known.
///
/// # Errors
/// The cluster did not answer in time, or was bootstrapped already.
pub async fn bootstrap(address: &str) -> anyhow::Result<TokenSecret> {
    let deadline = tokio::time::Instant::now() + BOOTSTRAP_DEADLINE;
    let mut target = address.to_owned();
    loop {
        let status = match operator(&target, None).await {
            Ok(mut client) => {
                match client
                    .acl_bootstrap(muster_proto::cluster::AclBootstrapRequest {})
                    .await
                {
                    Ok(token) => return Ok(TokenSecret::new(token.into_inner().secret)),
                    Err(status) => Some(status),
                }
            }
            Err(_) => None,
        };
        if let Some(status) = &status {
            if status.code() == tonic::Code::FailedPrecondition
                && status.message().contains("already bootstrapped")
            {
                anyhow::bail!("{}", status.message());
            }
            if let Some(leader) = muster_scheduler::protocol::leader_hint(status) {
                target = leader;
            }
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("the cluster at {address} did not bootstrap its ACLs: {status:?}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A new token of `policy` (`read`, `submit`, ...) named `name`, made with `management` at
/// the leading master `address`.
///
/// # Errors
/// The master refused or could not be reached.
pub async fn create_token(
    address: &str,
    management: &TokenSecret,
    name: &str,
    policy: &str,
) -> anyhow::Result<TokenSecret> {
    let token = operator(address, Some(management))
        .await?
        .create_token(muster_proto::cluster::CreateTokenRequest {
            name: name.into(),
            policy: policy.into(),
            policies: Vec::new(),
        })
        .await?;
    Ok(TokenSecret::new(token.into_inner().secret))
}

/// How long the in-process helpers below wait for what they wait for.
pub const WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Starts a master on `config` and waits (up to [`WAIT`]) until it leads: a single-master
/// cluster for in-process tests.
///
/// # Errors
/// The master did not start, or did not lead in time.
pub async fn start_leading(config: crate::MasterConfig) -> anyhow::Result<crate::MasterServer> {
    let master = crate::MasterServer::start(config).await?;
    let deadline = tokio::time::Instant::now() + WAIT;
    while !master
        .pid()
        .ask(|reply| crate::requests::GetMetrics { reply }.into())
        .await?
        .is_leader
    {
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("the master did not lead within {WAIT:?}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    Ok(master)
}

/// Polls the status of job `name` on `master`, in process, until `done` holds (up to
/// [`WAIT`]); `what` names the wait in the error. A read the master answers with
/// "unavailable, retry" is retried.
///
/// # Errors
/// The master could not answer, or `done` did not hold in time (the last status is in the
/// error).
pub async fn job_when(
    master: &crate::MasterServer,
    name: &str,
    what: &str,
    done: impl Fn(&muster_proto::cluster::JobStatusReply) -> bool,
) -> anyhow::Result<muster_proto::cluster::JobStatusReply> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let status = match ask_job_status(master, name).await? {
            // A linearizable read whose leadership confirmation ran out while it was computed
            // (a loaded machine): the master says to retry, as a client would.
            Err(crate::error::ServiceError::Unavailable(why))
                if tokio::time::Instant::now() < deadline =>
            {
                tracing::debug!(%why, "job status unavailable; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                continue;
            }
            answer => answer.map_err(anyhow::Error::msg)?,
        };
        if done(&status) {
            return Ok(status);
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("{what} did not happen within {WAIT:?}: {status:#?}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Submits `job` at `master`, in process: the master's answer, a refusal included.
///
/// # Errors
/// The master could not be asked (it stopped).
pub async fn try_submit(
    master: &crate::MasterServer,
    job: muster_proto::model::Job,
) -> anyhow::Result<Result<muster_proto::cluster::SubmitJobReply, crate::ServiceError>> {
    Ok(master
        .pid()
        .ask(|reply| {
            crate::requests::SubmitJob {
                job: Some(job),
                reply,
            }
            .into()
        })
        .await?)
}

/// Submits `job` at `master`, in process, as [`try_submit`] does; a refusal is an error.
///
/// # Errors
/// The master could not be asked, or refused the job.
pub async fn submit(
    master: &crate::MasterServer,
    job: muster_proto::model::Job,
) -> anyhow::Result<()> {
    try_submit(master, job).await?.map_err(anyhow::Error::msg)?;
    Ok(())
}

/// The status of job `name` on `master`, in process: a linearizable read, asked once.
///
/// # Errors
/// The master could not be asked, or refused the read (no such job, not the leader).
pub async fn job_status(
    master: &crate::MasterServer,
    name: &str,
) -> anyhow::Result<muster_proto::cluster::JobStatusReply> {
    ask_job_status(master, name)
        .await?
        .map_err(anyhow::Error::msg)
}

/// Asks `master` once for the status of job `name` (a linearizable read): its answer, a
/// refusal included.
async fn ask_job_status(
    master: &crate::MasterServer,
    name: &str,
) -> anyhow::Result<Result<muster_proto::cluster::JobStatusReply, crate::ServiceError>> {
    Ok(master
        .pid()
        .ask(|reply| {
            crate::requests::JobStatus {
                name: name.to_owned(),
                stale: false,
                reply,
            }
            .into()
        })
        .await?)
}
