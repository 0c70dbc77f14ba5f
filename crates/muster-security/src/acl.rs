//! ACL tokens: a secret for each person or program, a policy saying what it may do.
//!
//! Secrets are 256 random bits shown once, at creation. The registry stores only their
//! SHA-256 hash; [`TokenTable::authenticate`] finds a presented secret by its hash and
//! compares in constant time.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use ring::rand::SecureRandom;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

/// What a token may do, as Nomad's built-in policies name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Read state, jobs and tasks; job environments are redacted.
    Read,
    /// Run and stop jobs, and read them with their environments.
    Submit,
    /// Operate agents and the registry (drain, eligibility), and read.
    Operate,
    /// Run remote scheduler workers.
    Schedule,
    /// Everything, tokens included.
    Management,
}

impl Policy {
    /// Every policy, least to most.
    pub const ALL: [Policy; 5] = [
        Policy::Read,
        Policy::Submit,
        Policy::Operate,
        Policy::Schedule,
        Policy::Management,
    ];

    /// Its name in flags and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Read => "read",
            Policy::Submit => "submit",
            Policy::Operate => "operate",
            Policy::Schedule => "schedule",
            Policy::Management => "management",
        }
    }

    /// Whether a token of this policy may do what `permission` covers.
    pub fn grants(self, permission: Permission) -> bool {
        use Permission as P;
        match self {
            Policy::Management => true,
            Policy::Read => permission == P::Read,
            Policy::Submit => matches!(permission, P::Read | P::ReadSecrets | P::Submit),
            Policy::Operate => matches!(permission, P::Read | P::Operate),
            Policy::Schedule => permission == P::Schedule,
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy name that is not one of Muster's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown policy {0:?} (expected read, submit, operate, schedule or management)")]
pub struct UnknownPolicy(pub String);

impl FromStr for Policy {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownPolicy(s.to_owned()))
    }
}

/// What one API call needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Permission {
    /// Read state, jobs, tasks, evaluations (environments redacted).
    Read,
    /// Read jobs with their environments.
    ReadSecrets,
    /// Run and stop jobs, launch tasks.
    Submit,
    /// Operate agents and the registry.
    Operate,
    /// Dequeue evaluations and submit plans.
    Schedule,
    /// Create, list and delete tokens.
    Manage,
}

impl Permission {
    /// What the call does, for error messages ("submitting needs submit").
    pub fn doing(self) -> &'static str {
        match self {
            Permission::Read => "reading",
            Permission::ReadSecrets => "reading job environments",
            Permission::Submit => "submitting",
            Permission::Operate => "operating",
            Permission::Schedule => "scheduling",
            Permission::Manage => "managing tokens",
        }
    }

    /// The least policy that grants it.
    pub fn least_policy(self) -> Policy {
        Policy::ALL
            .into_iter()
            .find(|p| p.grants(self))
            .unwrap_or(Policy::Management)
    }
}

/// A token's secret, as its holder presents it. Shown once when created; never stored.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenSecret(String);

impl TokenSecret {
    /// A new random secret (256 bits, hex).
    ///
    /// # Errors
    /// If the system's random number generator fails.
    pub fn generate() -> Result<TokenSecret, ring::error::Unspecified> {
        let mut bytes = [0u8; 32];
        ring::rand::SystemRandom::new().fill(&mut bytes)?;
        Ok(TokenSecret(hex(&bytes)))
    }

    /// A secret as presented (from `--token`, `MUSTER_TOKEN` or a request header).
    pub fn new(secret: impl Into<String>) -> TokenSecret {
        TokenSecret(secret.into())
    }

    /// The secret's text, to show its holder once.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Its SHA-256, hex: what the registry stores.
    pub fn hash(&self) -> String {
        hex(ring::digest::digest(&ring::digest::SHA256, self.0.as_bytes()).as_ref())
    }
}

impl fmt::Debug for TokenSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenSecret(..)")
    }
}

/// A random public id for a token (Nomad's accessor id): names it in lists and deletes
/// without revealing the secret.
///
/// # Errors
/// If the system's random number generator fails.
pub fn new_accessor() -> Result<String, ring::error::Unspecified> {
    let mut bytes = [0u8; 8];
    ring::rand::SystemRandom::new().fill(&mut bytes)?;
    Ok(hex(&bytes))
}

fn hex(bytes: &[u8]) -> String {
    use fmt::Write as _;
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(text, "{byte:02x}");
    }
    text
}

/// A token as the registry stores it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclToken {
    /// Its public id.
    pub accessor: String,
    /// A name for people (`ci`, `alice`).
    pub name: String,
    /// What it may do.
    pub policy: Policy,
    /// The SHA-256 of its secret, hex.
    pub secret_hash: String,
    /// When it was created, in milliseconds since the Unix epoch.
    pub created_ms: u64,
}

/// Who made an API call, as the guard found it: put in the request's extensions for the
/// handler (to redact environments for `read`, say).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The token's name (`insecure` without TLS).
    pub name: String,
    /// Its policy (`management` without TLS: an insecure cluster trusts everyone).
    pub policy: Policy,
}

impl Caller {
    /// The caller of an insecure cluster: anyone, allowed everything.
    pub fn insecure() -> Caller {
        Caller {
            name: "insecure".into(),
            policy: Policy::Management,
        }
    }

    /// Whether this caller may do what `permission` covers.
    pub fn may(&self, permission: Permission) -> bool {
        self.policy.grants(permission)
    }
}

/// Tokens by the hash of their secret.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenTable {
    by_hash: HashMap<String, AclToken>,
}

impl TokenTable {
    /// A table of `tokens`.
    pub fn new(tokens: impl IntoIterator<Item = AclToken>) -> TokenTable {
        TokenTable {
            by_hash: tokens
                .into_iter()
                .map(|t| (t.secret_hash.clone(), t))
                .collect(),
        }
    }

    /// The token whose secret is `secret`, if any.
    pub fn authenticate(&self, secret: &TokenSecret) -> Option<&AclToken> {
        let hash = secret.hash();
        self.by_hash
            .get(&hash)
            .filter(|t| bool::from(t.secret_hash.as_bytes().ct_eq(hash.as_bytes())))
    }

    /// Adds `token` (replacing one with the same secret).
    pub fn insert(&mut self, token: AclToken) {
        self.by_hash.insert(token.secret_hash.clone(), token);
    }

    /// Removes the token whose secret hashes to `secret_hash`.
    pub fn remove(&mut self, secret_hash: &str) -> Option<AclToken> {
        self.by_hash.remove(secret_hash)
    }

    /// How many tokens there are.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_policy_grants_what_its_name_says() {
        assert!(Policy::Read.grants(Permission::Read));
        assert!(!Policy::Read.grants(Permission::ReadSecrets));
        assert!(!Policy::Read.grants(Permission::Submit));
        assert!(Policy::Submit.grants(Permission::ReadSecrets));
        assert!(!Policy::Submit.grants(Permission::Manage));
        assert!(Policy::Operate.grants(Permission::Operate));
        assert!(!Policy::Operate.grants(Permission::Submit));
        assert!(!Policy::Schedule.grants(Permission::Read));
        assert!(Policy::Management.grants(Permission::Manage));
        assert_eq!(Permission::Submit.least_policy(), Policy::Submit);
        assert_eq!(Permission::Manage.least_policy(), Policy::Management);
    }

    #[test]
    fn a_secret_is_found_by_its_hash_only() {
        let secret = TokenSecret::generate().expect("random");
        let token = AclToken {
            accessor: new_accessor().expect("random"),
            name: "ci".into(),
            policy: Policy::Submit,
            secret_hash: secret.hash(),
            created_ms: 1,
        };
        assert_ne!(token.secret_hash, secret.expose());
        let table = TokenTable::new([token.clone()]);
        assert_eq!(table.authenticate(&secret), Some(&token));
        assert_eq!(table.authenticate(&TokenSecret::new("guess")), None);
        assert!(!format!("{secret:?}").contains(secret.expose()));
    }
}
