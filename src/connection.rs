//! How the CLI reaches a master: the addresses, TLS with a client certificate, the ACL
//! token, and a time limit on every call.
//!
//! `MUSTER_ADDR` (or `--master`) may list several masters, comma-separated. A call goes to the
//! first; a standby's answer naming the leader is followed; a master that cannot be reached,
//! or knows no leader, passes the call to the next. A master that takes the call and does not
//! answer within the time limit ends it with an error, rather than the call being made twice.
//!
//! Settings come from flags, then the `MUSTER_*` variables (as Nomad's `NOMAD_ADDR`,
//! `NOMAD_CACERT`, `NOMAD_CLIENT_CERT`, `NOMAD_CLIENT_KEY`, `NOMAD_TOKEN`). When none of the
//! TLS and token settings is given and a `muster dev` cluster is running, the settings it
//! wrote ([`crate::dev_settings`]) are used, so its walkthrough works in a second terminal as is.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use muster::master::MAX_OPERATOR_MESSAGE;
use muster::proto::cluster::operator_client::OperatorClient;
use muster::scheduler::protocol::leader_hint;
use muster_launch::security::ClientFlags;
use muster_security::guard::WithToken;
use muster_security::{Role, Security, TokenSecret};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::dev_settings;

/// The default master address.
pub(crate) const DEFAULT_ADDRESS: &str = "127.0.0.1:5050";

/// Where the CLI finds a master: global flags of every command that talks to one.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Target {
    /// Any master's address, or several comma-separated (tried in order when one is down);
    /// a standby's answer leads to the leader [default: the running dev cluster's, else
    /// 127.0.0.1:5050].
    #[arg(
        long,
        global = true,
        env = "MUSTER_ADDR",
        value_name = "HOST:PORT[,HOST:PORT..]"
    )]
    master: Option<String>,
    #[command(flatten)]
    client: ClientFlags,
    /// How long one call may take, e.g. 30s.
    #[arg(long, global = true, default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// The namespace of the jobs a command names or lists (`*` in lists and `events`: every
    /// namespace the token may read).
    #[arg(
        long,
        short = 'n',
        global = true,
        env = "MUSTER_NAMESPACE",
        default_value = "default"
    )]
    namespace: String,
}

/// An operator client that sends the token with each call.
pub(crate) type Client = OperatorClient<InterceptedService<Channel, WithToken>>;

/// Resolved settings: where to go and how.
pub(crate) struct Connection {
    /// The masters to try, in order (at least one).
    addresses: Vec<String>,
    security: Security,
    token: Option<TokenSecret>,
    timeout: Duration,
    /// The dev cluster's file, when the settings came from it (for error messages).
    from_dev: Option<PathBuf>,
    /// The namespace commands work in (`--namespace`).
    pub(crate) namespace: String,
}

/// The `host:port` of each master in a comma-separated list (see [`authority`]).
pub(crate) fn authorities(list: &str) -> anyhow::Result<Vec<String>> {
    let addresses = list
        .split(',')
        .filter(|a| !a.trim().is_empty())
        .map(authority)
        .collect::<anyhow::Result<Vec<_>>>()?;
    if addresses.is_empty() {
        bail!("no master address in {list:?}");
    }
    Ok(addresses)
}

/// `host:port` from `host:port`, `http://host:port` or `https://host:port`.
pub(crate) fn authority(address: &str) -> anyhow::Result<String> {
    let trimmed = address.trim();
    let authority = trimmed
        .strip_prefix("https://")
        .or_else(|| trimmed.strip_prefix("http://"))
        .unwrap_or(trimmed)
        .trim_end_matches('/');
    let valid = authority
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !valid {
        bail!("master address {address:?} is not HOST:PORT");
    }
    Ok(authority.to_owned())
}

impl Target {
    /// The settings to use, from the flags and variables, else a running dev cluster's.
    pub(crate) fn resolve(&self) -> anyhow::Result<Connection> {
        let client = &self.client;
        let nothing_set = client.ca_cert.is_none()
            && client.client_cert.is_none()
            && client.client_key.is_none()
            && client.token.is_none();
        let dev = dev_settings::settings_path();
        if nothing_set && let Some(text) = dev_settings::read(&dev)? {
            let vars = dev_settings::parse_exports(&text);
            let get = |key: &str| vars.get(key).filter(|v| !v.is_empty()).cloned();
            let flags = ClientFlags {
                ca_cert: get("MUSTER_CACERT").map(PathBuf::from),
                client_cert: get("MUSTER_CLIENT_CERT").map(PathBuf::from),
                client_key: get("MUSTER_CLIENT_KEY").map(PathBuf::from),
                token: get("MUSTER_TOKEN"),
                cluster: get("MUSTER_CLUSTER"),
            };
            let address = match &self.master {
                Some(address) => address.clone(),
                None => get("MUSTER_ADDR").unwrap_or_else(|| DEFAULT_ADDRESS.to_owned()),
            };
            return Ok(Connection {
                addresses: authorities(&address)?,
                security: flags.security().with_context(|| {
                    format!("in the dev cluster's settings {}", dev.file.display())
                })?,
                token: flags.token(),
                timeout: self.timeout,
                from_dev: Some(dev.file),
                namespace: self.namespace.clone(),
            });
        }
        Ok(Connection {
            addresses: authorities(self.master.as_deref().unwrap_or(DEFAULT_ADDRESS))?,
            security: client.security()?,
            token: client.token(),
            timeout: self.timeout,
            from_dev: None,
            namespace: self.namespace.clone(),
        })
    }
}

impl Connection {
    /// A client of the master at `address`.
    pub(crate) async fn client(&self, address: &str) -> anyhow::Result<Client> {
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .with_context(|| format!("master address {address:?} is not HOST:PORT"))?
            .connect_timeout(self.timeout.min(Duration::from_secs(10)))
            .timeout(self.timeout);
        let channel = match self.security.channel(endpoint, &[Role::Master]).await {
            Ok((channel, _)) => channel,
            Err(e) if self.security.is_insecure() && refuses_plaintext(address).await => {
                bail!(
                    "the master at {address} did not take a plaintext connection ({}): \
                     {PLAINTEXT_HINT}",
                    chain(&e)
                );
            }
            Err(e) => {
                let mut message = format!("cannot reach a master at {address}: {}", chain(&e));
                if let Some(dev) = &self.from_dev {
                    message.push_str(&format!(
                        " (settings from the dev cluster's {}; is `muster dev` still running? \
                         set MUSTER_ADDR and the TLS variables to use another cluster)",
                        dev.display()
                    ));
                }
                bail!(message);
            }
        };
        let token = WithToken::new(self.token.as_ref())?;
        Ok(OperatorClient::with_interceptor(channel, token)
            .max_decoding_message_size(MAX_OPERATOR_MESSAGE)
            .max_encoding_message_size(MAX_OPERATOR_MESSAGE))
    }

    /// Makes a leader-only `call`: at the first master, following a standby's answer that
    /// names the leader; a master that cannot be reached or knows no leader passes it to the
    /// next (see the module).
    pub(crate) async fn at_leader<T, F, Fut>(&self, call: F) -> anyhow::Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.each_master(|address| self.at_leader_from(address, &call))
            .await
    }

    /// Makes `call` at the first master that answers, whatever its role (a stale read).
    pub(crate) async fn at_any<T, F, Fut>(&self, call: F) -> anyhow::Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let call = &call;
        self.each_master(|address| async move {
            let client = self.client(address).await.map_err(Attempt::Next)?;
            match call(client).await {
                Ok(reply) => Ok(reply.into_inner()),
                Err(status) => Err(self.answered(address, status).await),
            }
        })
        .await
    }

    /// A read: with `stale`, [`at_any`](Self::at_any) master; else linearizable,
    /// [`at_leader`](Self::at_leader).
    pub(crate) async fn read<T, F, Fut>(&self, stale: bool, call: F) -> anyhow::Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        if stale {
            self.at_any(call).await
        } else {
            self.at_leader(call).await
        }
    }

    /// `attempt` at each master in turn until one settles it.
    async fn each_master<'a, T, A, Fut>(&'a self, attempt: A) -> anyhow::Result<T>
    where
        A: Fn(&'a str) -> Fut,
        Fut: Future<Output = Result<T, Attempt>>,
    {
        let mut passed = Vec::new();
        for address in &self.addresses {
            match attempt(address).await {
                Ok(answer) => return Ok(answer),
                Err(Attempt::Final(error)) => return Err(error),
                Err(Attempt::Next(error)) => passed.push(error),
            }
        }
        match passed.len() {
            1 => Err(passed.remove(0)),
            _ => {
                let why: Vec<String> = passed.iter().map(|e| format!("{e:#}")).collect();
                bail!("no master answered: {}", why.join("; "))
            }
        }
    }

    /// One leader-only `call` starting at `address`.
    async fn at_leader_from<T, F, Fut>(&self, address: &str, call: &F) -> Result<T, Attempt>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let client = self.client(address).await.map_err(Attempt::Next)?;
        let refused = match call(client).await {
            Ok(reply) => return Ok(reply.into_inner()),
            Err(status) => status,
        };
        let Some(leader) = leader_hint(&refused).filter(|leader| leader != address) else {
            return Err(self.answered(address, refused).await);
        };
        let client = self.client(&leader).await.map_err(Attempt::Next)?;
        match call(client).await {
            Ok(reply) => Ok(reply.into_inner()),
            Err(status) => Err(self.answered(&leader, status).await),
        }
    }
}

/// How one master's attempt at a call ended, when it did not answer it.
enum Attempt {
    /// The master answered with an error: the call ends with it.
    Final(anyhow::Error),
    /// The master could not take the call (unreachable, or knows no leader): the next may.
    Next(anyhow::Error),
}

/// What the CLI says after a plaintext call failed at a port that speaks TLS.
const PLAINTEXT_HINT: &str = "this CLI spoke plaintext, since no TLS settings were given and \
    no dev cluster was found; a master run with TLS needs MUSTER_CACERT (the cluster's CA), \
    MUSTER_CLIENT_CERT and MUSTER_CLIENT_KEY (a client certificate: `muster tls cert create \
    --role client`), or --ca-cert, --client-cert and --client-key, and a token in MUSTER_TOKEN";

/// How long the TLS probe waits for the port's answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether the port at `address` is not a plaintext HTTP/2 server: sent HTTP/2's connection
/// preface, a plaintext server answers with a SETTINGS frame (type 4, the frame header's
/// fourth byte), while a TLS server answers with an alert record (0x15) or closes the
/// connection.
async fn refuses_plaintext(address: &str) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
        stream
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .ok()?;
        let mut head = [0u8; 4];
        let mut read = 0;
        while read < head.len() {
            match stream.read(&mut head[read..]).await {
                Ok(0) | Err(_) => return Some(read == 0 || head[0] == 0x15),
                Ok(n) => read += n,
            }
        }
        Some(head[3] != 0x04)
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, probe).await,
        Ok(Some(true))
    )
}

impl Connection {
    /// What `status` from the master at `address` means for the call ([`answered`]); when a
    /// plaintext call failed below gRPC (no status from a server) at a port that speaks TLS,
    /// what is missing.
    async fn answered(&self, address: &str, status: tonic::Status) -> Attempt {
        let below_grpc = matches!(
            status.code(),
            tonic::Code::Unknown
                | tonic::Code::Internal
                | tonic::Code::Unavailable
                | tonic::Code::Cancelled
        ) && status.metadata().is_empty();
        if self.security.is_insecure() && below_grpc && refuses_plaintext(address).await {
            return Attempt::Final(anyhow::anyhow!(
                "the master at {address} did not take a plaintext call ({}): {PLAINTEXT_HINT}",
                status.message()
            ));
        }
        answered(address, status)
    }
}

/// What `status` from the master at `address` means for the call: `UNAVAILABLE` (a broken
/// connection, or no leader known) passes it on; any other answer ends it.
fn answered(address: &str, status: tonic::Status) -> Attempt {
    let error = anyhow::anyhow!("{}", status.message());
    if status.code() == tonic::Code::Unavailable {
        Attempt::Next(error.context(format!("the master at {address}")))
    } else {
        Attempt::Final(error)
    }
}

/// An error and its causes on one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_take_three_forms() {
        for given in [
            "127.0.0.1:5050",
            "http://127.0.0.1:5050",
            "https://127.0.0.1:5050/",
        ] {
            assert_eq!(authority(given).expect(given), "127.0.0.1:5050");
        }
        for bad in ["", "localhost", "a:b", ":5050"] {
            assert!(authority(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_list_of_masters_is_comma_separated() {
        assert_eq!(
            authorities("127.0.0.1:5051, https://10.0.0.2:5052,").expect("a list"),
            ["127.0.0.1:5051", "10.0.0.2:5052"]
        );
        assert!(authorities(" , ").is_err());
        let bad = authorities("127.0.0.1:5051,nowhere").expect_err("a bad entry");
        assert!(bad.to_string().contains("\"nowhere\""), "{bad}");
    }
}
