//! ACL tokens: a secret for each person or program, and the policies saying what it may do.
//!
//! Secrets are 256 random bits shown once, at creation. The registry stores only their
//! SHA-256 hash; [`TokenTable::authenticate`] finds a presented secret by its hash and
//! compares in constant time.

use std::collections::HashMap;
use std::fmt;

use ring::rand::SecureRandom;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

use crate::policy::{Access, Acl, Capability};

/// A token's kind (Nomad's token type): a client token may do what its policies say; a
/// management token may do everything, tokens and policies included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenType {
    /// What its policies say.
    #[default]
    Client,
    /// Everything.
    Management,
}

impl TokenType {
    /// Its name in flags and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenType::Client => "client",
            TokenType::Management => "management",
        }
    }
}

impl fmt::Display for TokenType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one API call needs before it runs. A call on one namespace's jobs needs its
/// capability somewhere; the call itself then checks the namespace it touches with
/// [`Acl::allows`], and a list keeps only what the caller may see.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Permission {
    /// Any known token: the call shows only what the caller may see (a list of namespaces,
    /// the cluster's state).
    AnyToken,
    /// A namespace capability, in at least one namespace.
    Namespaced(Capability),
    /// At least this access to agents.
    Agent(Access),
    /// At least this access to the registry.
    Operator(Access),
    /// The scheduling API, for at least one namespace.
    Schedule,
    /// A management token (tokens, policies, namespaces).
    Manage,
}

impl Permission {
    /// What a token needs for it, for refusals ("needs submit-job in some namespace").
    pub fn needs(self) -> String {
        match self {
            Permission::AnyToken => "a token".to_owned(),
            Permission::Namespaced(capability) => {
                format!("a policy granting {capability} in some namespace")
            }
            Permission::Agent(access) => format!("a policy with agent {access}"),
            Permission::Operator(access) => format!("a policy with operator {access}"),
            Permission::Schedule => "a policy with a scheduler rule".to_owned(),
            Permission::Manage => "a management token".to_owned(),
        }
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
#[serde(from = "StoredToken")]
pub struct AclToken {
    /// Its public id.
    pub accessor: String,
    /// A name for people (`ci`, `alice`).
    pub name: String,
    /// Client or management.
    #[serde(rename = "type")]
    pub token_type: TokenType,
    /// The policies a client token carries, by name (built-in or stored).
    pub policies: Vec<String>,
    /// The SHA-256 of its secret, hex.
    pub secret_hash: String,
    /// When it was created, in milliseconds since the Unix epoch.
    pub created_ms: u64,
}

impl AclToken {
    /// Whether it is a management token.
    pub fn is_management(&self) -> bool {
        self.token_type == TokenType::Management
    }
}

/// A token as stored, by this version or by one before policies were rules: then it had one
/// `policy` name, `management` for a management token.
#[derive(Deserialize)]
struct StoredToken {
    accessor: String,
    name: String,
    #[serde(default, rename = "type")]
    token_type: Option<TokenType>,
    #[serde(default)]
    policies: Vec<String>,
    #[serde(default)]
    policy: Option<String>,
    secret_hash: String,
    created_ms: u64,
}

impl From<StoredToken> for AclToken {
    fn from(stored: StoredToken) -> AclToken {
        let (token_type, policies) = match (stored.token_type, stored.policy) {
            (Some(token_type), _) => (token_type, stored.policies),
            (None, Some(policy)) if policy == "management" => (TokenType::Management, Vec::new()),
            (None, Some(policy)) => (TokenType::Client, vec![policy]),
            (None, None) => (TokenType::Client, stored.policies),
        };
        AclToken {
            accessor: stored.accessor,
            name: stored.name,
            token_type,
            policies,
            secret_hash: stored.secret_hash,
            created_ms: stored.created_ms,
        }
    }
}

/// Who made an API call, as the guard found it: put in the request's extensions for the
/// handler, which checks the namespaces the call touches and redacts what the caller may not
/// see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The token's name (`insecure` without TLS).
    pub name: String,
    /// Its policies' names (`management` for a management token), for refusals.
    pub policies: Vec<String>,
    /// What it may do (everything without TLS: an insecure cluster trusts everyone).
    pub acl: Acl,
}

impl Caller {
    /// The caller of an insecure cluster: anyone, allowed everything.
    pub fn insecure() -> Caller {
        Caller {
            name: "insecure".into(),
            policies: vec![TokenType::Management.to_string()],
            acl: Acl::management(),
        }
    }

    /// Whether this caller may make a call that needs `permission`.
    pub fn may(&self, permission: Permission) -> bool {
        match permission {
            Permission::AnyToken => true,
            Permission::Namespaced(capability) => self.acl.allows_somewhere(capability),
            Permission::Agent(access) => self.acl.agent() >= access,
            Permission::Operator(access) => self.acl.operator() >= access,
            Permission::Schedule => self.acl.may_schedule_somewhere(),
            Permission::Manage => self.acl.is_management(),
        }
    }

    /// Whether this caller may do `capability` in `namespace`.
    pub fn allows(&self, capability: Capability, namespace: &str) -> bool {
        self.acl.allows(capability, namespace)
    }

    /// The refusal of `capability` in `namespace`, naming both.
    pub fn refusal(&self, capability: Capability, namespace: &str) -> tonic::Status {
        tonic::Status::permission_denied(format!(
            "token {} may not {capability} in namespace {namespace:?}",
            self.described()
        ))
    }

    /// The token for refusals: its name and its policies (`"ci" (policies: read)`).
    pub fn described(&self) -> String {
        format!("{:?} (policies: {})", self.name, self.policies.join(", "))
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
    fn a_token_stored_with_one_policy_name_reads_as_a_token_carrying_it() {
        let old =
            r#"{"accessor":"a1","name":"ci","policy":"submit","secret_hash":"h","created_ms":1}"#;
        let token: AclToken = serde_json::from_str(old).expect("reads");
        assert_eq!(token.token_type, TokenType::Client);
        assert_eq!(token.policies, ["submit"]);
        let root = r#"{"accessor":"a2","name":"root","policy":"management","secret_hash":"h","created_ms":1}"#;
        let root: AclToken = serde_json::from_str(root).expect("reads");
        assert!(root.is_management());
        let back: AclToken =
            serde_json::from_str(&serde_json::to_string(&token).expect("writes")).expect("reads");
        assert_eq!(back, token);
    }

    #[test]
    fn a_secret_is_found_by_its_hash_only() {
        let secret = TokenSecret::generate().expect("random");
        let token = AclToken {
            accessor: new_accessor().expect("random"),
            name: "ci".into(),
            token_type: TokenType::Client,
            policies: vec!["submit".into()],
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
