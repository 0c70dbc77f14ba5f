//! The one helper tests use to reach a master's APIs as a client would: TLS with a client
//! certificate from the shared test CA ([`TestPki`]), and a token.

use muster_proto::cluster::operator_client::OperatorClient;
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

/// A channel to `address` (`host:port`) with `security`, verified to reach a master.
///
/// # Errors
/// The address is malformed, the master unreachable or the handshake refused.
pub async fn channel(address: &str, security: &Security) -> anyhow::Result<Channel> {
    let endpoint = Endpoint::from_shared(format!("http://{address}"))?
        .connect_timeout(std::time::Duration::from_secs(5));
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
    Ok(OperatorClient::with_interceptor(
        channel,
        WithToken::new(token)?,
    ))
}
