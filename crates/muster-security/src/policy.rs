//! Policies: named sets of rules saying what a token may do, in the manner of Nomad's ACL
//! policies. A policy is written as TOML:
//!
//! ```toml
//! description = "Team A's developers"
//!
//! # Per namespace (a `*` matches any run of characters; the most specific pattern wins):
//! # `policy` is a shorthand (`read`: read-job; `write`: every capability; `deny`: none, over
//! # whatever another pattern or policy grants), `capabilities` adds to it.
//! [namespace.team-a]
//! capabilities = ["read-job", "submit-job", "stop-job", "read-logs", "read-secrets"]
//!
//! [namespace."*"]
//! policy = "read"
//!
//! [agent]      # read: list agents; write: drain them, change their eligibility
//! policy = "read"
//!
//! [operator]   # read: metrics and raft state; write: registry snapshots
//! policy = "read"
//!
//! [scheduler]  # the scheduling API, for evaluations of these namespaces' jobs
//! namespaces = ["team-a"]
//! ```
//!
//! A token carries one or more policies; what it may do is their union, resolved into an
//! [`Acl`]. The built-in policies (`read`, `submit`, `operate`, `schedule`) are shipped as
//! files like the one above (see [`Policy::built_in`]); `management` is a kind of token, not a
//! policy.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

/// The longest policy name.
pub const MAX_POLICY_NAME: usize = 128;

/// The built-in policies, by name, as their shipped files say.
const BUILT_IN: [(&str, &str); 4] = [
    ("read", include_str!("../policies/read.toml")),
    ("submit", include_str!("../policies/submit.toml")),
    ("operate", include_str!("../policies/operate.toml")),
    ("schedule", include_str!("../policies/schedule.toml")),
];

/// What a token may do to the jobs of one namespace (Nomad's namespace capabilities).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Capability {
    /// See its jobs, tasks and evaluations, with environment values redacted.
    ReadJob,
    /// Run and change its jobs (and plan them).
    SubmitJob,
    /// Stop its jobs.
    StopJob,
    /// Launch a one-off task under one of its jobs.
    DispatchJob,
    /// Read its tasks' output.
    ReadLogs,
    /// See its jobs' environment values.
    ReadSecrets,
}

impl Capability {
    /// Every capability.
    pub const ALL: [Capability; 6] = [
        Capability::ReadJob,
        Capability::SubmitJob,
        Capability::StopJob,
        Capability::DispatchJob,
        Capability::ReadLogs,
        Capability::ReadSecrets,
    ];

    /// Its name in policy files and messages (`read-job`).
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::ReadJob => "read-job",
            Capability::SubmitJob => "submit-job",
            Capability::StopJob => "stop-job",
            Capability::DispatchJob => "dispatch-job",
            Capability::ReadLogs => "read-logs",
            Capability::ReadSecrets => "read-secrets",
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How far a token may go with agents or with the registry itself.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Nothing.
    #[default]
    Deny,
    /// Look.
    Read,
    /// Look and change.
    Write,
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Access::Deny => "deny",
            Access::Read => "read",
            Access::Write => "write",
        })
    }
}

/// The rule for the namespaces one pattern matches.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceRule {
    /// A shorthand: `read` (read-job), `write` (every capability), `deny` (none, over every
    /// other grant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Access>,
    /// Capabilities on top of `policy`.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub capabilities: BTreeSet<Capability>,
}

impl NamespaceRule {
    /// The capabilities it grants, `policy` and `capabilities` together.
    fn granted(&self) -> BTreeSet<Capability> {
        let mut granted = self.capabilities.clone();
        match self.policy {
            Some(Access::Write) => granted.extend(Capability::ALL),
            Some(Access::Read) => {
                granted.insert(Capability::ReadJob);
            }
            Some(Access::Deny) | None => {}
        }
        granted
    }
}

/// A rule on agents or on the registry: one [`Access`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessRule {
    /// How far it goes.
    #[serde(default)]
    pub policy: Access,
}

/// The scheduling API's rule: the namespaces whose evaluations a token may dequeue and plan,
/// and the schedulers it may serve.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerRule {
    /// Namespace patterns (`*` for all).
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Patterns of the scheduler names it may serve (`gang`, `gpu-*`, `*`); absent: every
    /// name (as before schedulers had names), empty: none. Names count only in a rule for
    /// every namespace (`namespaces = ["*"]`), as serving a scheduler hands out every
    /// namespace's evaluations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub names: Option<Vec<String>>,
}

/// A policy: what a token that carries it may do.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// What it is for, for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Rules by namespace pattern.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub namespace: BTreeMap<String, NamespaceRule>,
    /// What it may do to agents.
    #[serde(default)]
    pub agent: AccessRule,
    /// What it may do to the registry (metrics, raft state, snapshots).
    #[serde(default)]
    pub operator: AccessRule,
    /// Which namespaces' evaluations it may schedule.
    #[serde(default)]
    pub scheduler: SchedulerRule,
}

/// Why a policy's text or name is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The text is not a policy.
    #[error("the policy is not valid: {0}")]
    Syntax(String),
    /// A namespace or scheduler-name pattern holds a character names cannot.
    #[error(
        "pattern {0:?} is not valid (letters, digits, '-', '_' and '*' only, 1 to 64 \
         characters): a namespace or scheduler pattern"
    )]
    Pattern(String),
    /// The policy's name is not valid.
    #[error(
        "policy name {0:?} is not valid (letters, digits, '-' and '_' only, 1 to \
         {MAX_POLICY_NAME} characters)"
    )]
    Name(String),
    /// The name is a built-in policy's, which cannot be replaced or deleted.
    #[error(
        "{0:?} is a built-in policy; it cannot be changed or deleted (copy it under another name)"
    )]
    BuiltIn(String),
}

impl Policy {
    /// Reads a policy from its TOML text, and checks its namespace patterns.
    ///
    /// # Errors
    /// [`PolicyError::Syntax`] for text that is not a policy (an unknown capability or key
    /// is named), [`PolicyError::Pattern`] for a bad namespace pattern.
    pub fn parse(text: &str) -> Result<Policy, PolicyError> {
        let policy: Policy =
            toml::from_str(text).map_err(|e| PolicyError::Syntax(e.message().to_owned()))?;
        policy.validate()?;
        Ok(policy)
    }

    /// Checks its namespace patterns.
    ///
    /// # Errors
    /// [`PolicyError::Pattern`] naming the first bad one.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let names = self.scheduler.names.iter().flatten();
        for pattern in self
            .namespace
            .keys()
            .chain(&self.scheduler.namespaces)
            .chain(names)
        {
            if !valid_pattern(pattern) {
                return Err(PolicyError::Pattern(pattern.clone()));
            }
        }
        Ok(())
    }

    /// The policy as TOML, as `muster acl policy info` shows it.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot render the policy: {e}\n"))
    }

    /// The built-in policy called `name`, if there is one.
    pub fn built_in(name: &str) -> Option<&'static Policy> {
        static PARSED: std::sync::LazyLock<BTreeMap<&'static str, Policy>> =
            std::sync::LazyLock::new(|| {
                BUILT_IN
                    .iter()
                    .filter_map(|(name, text)| Some((*name, Policy::parse(text).ok()?)))
                    .collect()
            });
        PARSED.get(name)
    }

    /// The text of the built-in policy called `name`, as shipped.
    pub fn built_in_text(name: &str) -> Option<&'static str> {
        BUILT_IN
            .iter()
            .find(|(built_in, _)| *built_in == name)
            .map(|(_, text)| *text)
    }

    /// The names of the built-in policies.
    pub fn built_in_names() -> impl Iterator<Item = &'static str> {
        BUILT_IN.iter().map(|(name, _)| *name)
    }

    /// Checks a name for a policy an operator stores: valid, and not a built-in one.
    ///
    /// # Errors
    /// [`PolicyError::Name`] or [`PolicyError::BuiltIn`].
    pub fn check_name(name: &str) -> Result<(), PolicyError> {
        if name.is_empty()
            || name.len() > MAX_POLICY_NAME
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
        {
            return Err(PolicyError::Name(name.to_owned()));
        }
        if BUILT_IN.iter().any(|(built_in, _)| *built_in == name) || name == "management" {
            return Err(PolicyError::BuiltIn(name.to_owned()));
        }
        Ok(())
    }
}

fn valid_pattern(pattern: &str) -> bool {
    !pattern.is_empty()
        && pattern.len() <= 64
        && pattern
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '*'))
}

/// Whether `pattern` (with `*` for any run of characters) matches all of `text`.
fn glob_matches(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// How closely `pattern` matches: an exact name above any glob, then more literal characters
/// above fewer (Nomad's closest match). `None` if it does not match.
fn closeness(pattern: &str, namespace: &str) -> Option<(bool, usize)> {
    if pattern == namespace {
        return Some((true, pattern.len()));
    }
    glob_matches(pattern, namespace).then(|| (false, pattern.len() - pattern.matches('*').count()))
}

/// What a caller may do: the union of its token's policies, or everything for a management
/// token (and for anyone on an insecure cluster).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Acl {
    management: bool,
    /// Namespace pattern to what it grants; `None` where a policy denies it.
    namespaces: BTreeMap<String, Option<BTreeSet<Capability>>>,
    agent: Access,
    operator: Access,
    scheduler: BTreeSet<String>,
    /// Patterns of the scheduler names it may serve.
    scheduler_names: BTreeSet<String>,
}

impl Acl {
    /// Everything.
    pub fn management() -> Acl {
        Acl {
            management: true,
            ..Acl::default()
        }
    }

    /// The union of `policies`: capabilities add up, a namespace denied by one is denied,
    /// agent and operator access is the highest any grants.
    pub fn of<'a>(policies: impl IntoIterator<Item = &'a Policy>) -> Acl {
        let mut acl = Acl::default();
        for policy in policies {
            for (pattern, rule) in &policy.namespace {
                let entry = acl
                    .namespaces
                    .entry(pattern.clone())
                    .or_insert_with(|| Some(BTreeSet::new()));
                match (rule.policy, entry.as_mut()) {
                    (Some(Access::Deny), _) => *entry = None,
                    (_, Some(granted)) => granted.extend(rule.granted()),
                    (_, None) => {}
                }
            }
            acl.agent = acl.agent.max(policy.agent.policy);
            acl.operator = acl.operator.max(policy.operator.policy);
            acl.scheduler
                .extend(policy.scheduler.namespaces.iter().cloned());
            // Serving a scheduler hands out every namespace's evaluations: only a rule for
            // every namespace grants names (one for some namespaces alone cannot widen
            // another policy's names).
            if policy.scheduler.namespaces.iter().any(|n| n == "*") {
                match &policy.scheduler.names {
                    Some(names) => acl.scheduler_names.extend(names.iter().cloned()),
                    None => {
                        acl.scheduler_names.insert("*".to_owned());
                    }
                }
            }
        }
        acl
    }

    /// Whether this is a management token's: everything is allowed.
    pub fn is_management(&self) -> bool {
        self.management
    }

    /// Whether it grants `capability` in `namespace`, by the closest pattern that matches it.
    pub fn allows(&self, capability: Capability, namespace: &str) -> bool {
        if self.management {
            return true;
        }
        self.namespaces
            .iter()
            .filter_map(|(pattern, granted)| Some((closeness(pattern, namespace)?, granted)))
            .max_by_key(|(closeness, _)| *closeness)
            .and_then(|(_, granted)| granted.as_ref())
            .is_some_and(|granted| granted.contains(&capability))
    }

    /// Whether it grants `capability` in some namespace (the check a call makes before it
    /// knows which namespaces it will touch: a list filters by [`Acl::allows`] after).
    pub fn allows_somewhere(&self, capability: Capability) -> bool {
        self.management
            || self
                .namespaces
                .values()
                .any(|granted| granted.as_ref().is_some_and(|g| g.contains(&capability)))
    }

    /// How far it may go with agents.
    pub fn agent(&self) -> Access {
        if self.management {
            Access::Write
        } else {
            self.agent
        }
    }

    /// How far it may go with the registry (metrics, raft state, snapshots).
    pub fn operator(&self) -> Access {
        if self.management {
            Access::Write
        } else {
            self.operator
        }
    }

    /// Whether it may schedule evaluations of `namespace`'s jobs.
    pub fn may_schedule(&self, namespace: &str) -> bool {
        self.management
            || self
                .scheduler
                .iter()
                .any(|pattern| closeness(pattern, namespace).is_some())
    }

    /// Whether it may schedule every namespace's evaluations (a scheduler rule for `*`).
    pub fn may_schedule_everywhere(&self) -> bool {
        self.management || self.scheduler.contains("*")
    }

    /// Whether it may serve the scheduler named `name` (dequeue its evaluations).
    pub fn may_serve(&self, name: &str) -> bool {
        self.management
            || self
                .scheduler_names
                .iter()
                .any(|pattern| glob_matches(pattern, name))
    }

    /// Whether it may use the scheduling API at all.
    pub fn may_schedule_somewhere(&self) -> bool {
        self.management || !self.scheduler.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_policy_file_parses() {
        for name in Policy::built_in_names() {
            assert!(Policy::built_in(name).is_some(), "{name}");
        }
        let read = Acl::of([Policy::built_in("read").expect("read")]);
        assert!(read.allows(Capability::ReadJob, "anything"));
        assert!(!read.allows(Capability::ReadLogs, "default"));
        assert!(!read.allows(Capability::ReadSecrets, "default"));
        assert_eq!(read.agent(), Access::Read);
        let operate = Acl::of([Policy::built_in("operate").expect("operate")]);
        assert_eq!(operate.agent(), Access::Write);
        assert!(!operate.allows(Capability::SubmitJob, "default"));
        let submit = Acl::of([Policy::built_in("submit").expect("submit")]);
        assert!(submit.allows(Capability::ReadSecrets, "team-b"));
        assert!(!submit.may_schedule("default"));
        let schedule = Acl::of([Policy::built_in("schedule").expect("schedule")]);
        assert!(schedule.may_schedule("team-b"));
        assert!(!schedule.allows(Capability::ReadJob, "default"));
    }

    #[test]
    fn the_closest_pattern_decides_and_a_deny_wins_over_other_policies() {
        let team = Policy::parse(
            r#"
            [namespace.team-a]
            capabilities = ["read-job", "submit-job"]
            [namespace."team-*"]
            policy = "read"
            [namespace."*"]
            policy = "deny"
            "#,
        )
        .expect("parses");
        let acl = Acl::of([&team]);
        assert!(acl.allows(Capability::SubmitJob, "team-a"));
        assert!(acl.allows(Capability::ReadJob, "team-b"));
        assert!(!acl.allows(Capability::SubmitJob, "team-b"));
        assert!(!acl.allows(Capability::ReadJob, "default"));
        let deny_b = Policy::parse("[namespace.team-b]\npolicy = \"deny\"").expect("parses");
        let both = Acl::of([&team, &deny_b]);
        assert!(!both.allows(Capability::ReadJob, "team-b"));
        assert!(both.allows(Capability::ReadJob, "team-c"));
        assert!(both.allows_somewhere(Capability::SubmitJob));
        assert_eq!(both.agent(), Access::Deny);
    }

    #[test]
    fn a_bad_policy_is_refused_with_what_is_wrong() {
        let unknown = Policy::parse("[namespace.a]\ncapabilities = [\"fly\"]").unwrap_err();
        assert!(unknown.to_string().contains("fly"), "{unknown}");
        let key = Policy::parse("[agents]\npolicy = \"read\"").unwrap_err();
        assert!(key.to_string().contains("agents"), "{key}");
        let pattern = Policy::parse("[namespace.\"a/b\"]\npolicy = \"read\"").unwrap_err();
        assert_eq!(pattern, PolicyError::Pattern("a/b".into()));
        assert!(matches!(
            Policy::check_name("read"),
            Err(PolicyError::BuiltIn(_))
        ));
        assert!(matches!(
            Policy::check_name("a b"),
            Err(PolicyError::Name(_))
        ));
        assert_eq!(Policy::check_name("team-a"), Ok(()));
    }

    #[test]
    fn globs_match_whole_names() {
        assert!(glob_matches("*", "anything"));
        assert!(glob_matches("team-*", "team-a"));
        assert!(!glob_matches("team-*", "my-team-a"));
        assert!(glob_matches("*-prod", "web-prod"));
        assert!(!glob_matches("*-prod", "web-prod2"));
        assert!(glob_matches("a*b*c", "aXbYc"));
        assert!(!glob_matches("a*b*c", "aXbY"));
        assert!(glob_matches("ab*b", "abb"));
        assert!(!glob_matches("abc", "abcd"));
    }

    #[test]
    fn a_policy_reads_back_from_its_toml() {
        let policy = Policy::built_in("submit").expect("submit");
        assert_eq!(Policy::parse(&policy.to_toml()).as_ref(), Ok(policy));
    }

    #[test]
    fn a_scheduler_rule_names_the_schedulers_a_token_may_serve() -> Result<(), PolicyError> {
        let gang =
            Policy::parse("[scheduler]\nnamespaces = [\"*\"]\nnames = [\"gang\", \"gpu-*\"]")?;
        let acl = Acl::of([&gang]);
        assert!(acl.may_serve("gang") && acl.may_serve("gpu-a100"));
        assert!(!acl.may_serve("service") && !acl.may_serve("gangs"));
        // Absent names: every scheduler, as before schedulers had names.
        let any = Policy::parse("[scheduler]\nnamespaces = [\"*\"]")?;
        assert!(Acl::of([&any]).may_serve("service"));
        // No scheduling rule at all: none.
        assert!(!Acl::of([&Policy::default()]).may_serve("service"));
        // A rule for some namespaces grants no names: combined with one that names `gang`, the
        // token still serves `gang` alone.
        let team = Policy::parse("[scheduler]\nnamespaces = [\"team-a\"]")?;
        let both = Acl::of([&gang, &team]);
        assert!(both.may_serve("gang") && !both.may_serve("service"));
        let none = Policy::parse("[scheduler]\nnamespaces = [\"*\"]\nnames = []")?;
        assert!(!Acl::of([&none]).may_serve("gang"));
        assert!(Acl::management().may_serve("gang"));
        assert!(matches!(
            Policy::parse("[scheduler]\nnamespaces = [\"*\"]\nnames = [\"a/b\"]"),
            Err(PolicyError::Pattern(_))
        ));
        Ok(())
    }
}
