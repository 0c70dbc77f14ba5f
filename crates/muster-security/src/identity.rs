//! The role and node name a certificate carries.
//!
//! Every Muster certificate names its role as a DNS subject alternative name
//! `<role>.<cluster>.muster`, as Nomad's `server.<region>.nomad` does, and the node it was
//! issued to as its subject common name. A TLS handshake proves the certificate chains to the
//! cluster CA; [`Peer::from_certificate`] then reads what it may do.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// The cluster name used when none is configured (Nomad's default region is `global`).
pub const DEFAULT_CLUSTER: &str = "global";

/// What a certificate's holder is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// A master: serves raft, the agents and the APIs.
    Master,
    /// An agent: runs tasks.
    Agent,
    /// A person or program using the APIs (the CLI, remote scheduler workers).
    Client,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 3] = [Role::Master, Role::Agent, Role::Client];

    /// The role's name as it appears in certificates and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Master => "master",
            Role::Agent => "agent",
            Role::Client => "client",
        }
    }

    /// The DNS name a certificate of this role carries in `cluster`:
    /// `master.global.muster`, for example.
    pub fn dns_name(self, cluster: &str) -> String {
        format!("{}.{cluster}.muster", self.as_str())
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = IdentityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "master" => Ok(Role::Master),
            "agent" => Ok(Role::Agent),
            "client" => Ok(Role::Client),
            other => Err(IdentityError::UnknownRole(other.to_owned())),
        }
    }
}

/// Why a certificate gives no usable identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// The peer presented no certificate.
    #[error("the peer presented no certificate")]
    NoCertificate,
    /// The certificate is not valid DER.
    #[error("the peer's certificate cannot be parsed: {0}")]
    Unparsable(String),
    /// No `<role>.<cluster>.muster` name for this cluster.
    #[error("the certificate names no Muster role in cluster {cluster:?}")]
    NoRole {
        /// The cluster this node belongs to.
        cluster: String,
    },
    /// More than one role: such a certificate could pose as either.
    #[error("the certificate names more than one role ({0} and {1}); issue one per role")]
    SeveralRoles(Role, Role),
    /// The role is not one this connection accepts.
    #[error("a certificate of role {found} cannot be used here (expected {expected})")]
    WrongRole {
        /// What the certificate says.
        found: Role,
        /// What was expected.
        expected: String,
    },
    /// A role name that is not `master`, `agent` or `client`.
    #[error("unknown role {0:?} (expected master, agent or client)")]
    UnknownRole(String),
}

/// Who is on the other end of a verified connection.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Peer {
    /// The role its certificate carries.
    pub role: Role,
    /// The node its certificate was issued to (the subject common name), e.g. `node-7`.
    pub name: String,
    /// The DNS names and IP addresses its certificate is valid for (its subject alternative
    /// names, the role's name aside): the hosts it can prove it is (see
    /// [`Peer::proves_host`]). Shared, as a peer is handed along with each message.
    pub hosts: Arc<[String]>,
}

impl Peer {
    /// Reads the role and name from a DER certificate already verified against the cluster
    /// CA.
    ///
    /// # Errors
    /// [`IdentityError`] if the certificate does not parse or names no role, or several, in
    /// `cluster`.
    pub fn from_certificate(der: &[u8], cluster: &str) -> Result<Peer, IdentityError> {
        let (_, cert) =
            X509Certificate::from_der(der).map_err(|e| IdentityError::Unparsable(e.to_string()))?;
        let mut role = None;
        let mut hosts = Vec::new();
        if let Ok(Some(names)) = cert.subject_alternative_name() {
            for name in &names.value.general_names {
                let dns = match name {
                    GeneralName::DNSName(dns) => dns,
                    GeneralName::IPAddress(bytes) => {
                        if let Some(ip) = ip_of(bytes) {
                            hosts.push(ip.to_string());
                        }
                        continue;
                    }
                    _ => continue,
                };
                let Some(found) = Role::ALL
                    .into_iter()
                    .find(|r| dns.eq_ignore_ascii_case(&r.dns_name(cluster)))
                else {
                    hosts.push(dns.to_ascii_lowercase());
                    continue;
                };
                match role {
                    Some(first) if first != found => {
                        return Err(IdentityError::SeveralRoles(first, found));
                    }
                    _ => role = Some(found),
                }
            }
        }
        let role = role.ok_or_else(|| IdentityError::NoRole {
            cluster: cluster.to_owned(),
        })?;
        let name = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .unwrap_or_default()
            .to_owned();
        Ok(Peer {
            role,
            name,
            hosts: hosts.into(),
        })
    }

    /// A peer of `role` named `name` whose certificate proves no host (a test's, or one
    /// described without its certificate).
    pub fn named(role: Role, name: impl Into<String>) -> Peer {
        Peer {
            role,
            name: name.into(),
            hosts: Arc::from(Vec::new()),
        }
    }

    /// Whether its certificate is valid for `host` (an IP address or a DNS name, as in an
    /// address `host:port`): an address it may claim as its own.
    pub fn proves_host(&self, host: &str) -> bool {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        match host.parse::<std::net::IpAddr>() {
            Ok(ip) => self
                .hosts
                .iter()
                .any(|name| name.parse::<std::net::IpAddr>().is_ok_and(|n| n == ip)),
            Err(_) => self
                .hosts
                .iter()
                .any(|name| name.eq_ignore_ascii_case(host)),
        }
    }

    /// This peer, if its role is one of `accepted`.
    ///
    /// # Errors
    /// [`IdentityError::WrongRole`].
    pub fn expect(self, accepted: &[Role]) -> Result<Peer, IdentityError> {
        if accepted.contains(&self.role) {
            return Ok(self);
        }
        let expected = accepted
            .iter()
            .map(|r| r.as_str())
            .collect::<Vec<_>>()
            .join(" or ");
        Err(IdentityError::WrongRole {
            found: self.role,
            expected,
        })
    }
}

/// The address in a certificate's IP address name (4 or 16 bytes).
fn ip_of(bytes: &[u8]) -> Option<std::net::IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(std::net::IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(std::net::IpAddr::from),
        _ => None,
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?}", self.role, self.name)
    }
}
