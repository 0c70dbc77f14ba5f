//! The registry's part in access control: tokens, policies and namespaces, and who a token's
//! secret speaks for.

use muster_model::namespace::DEFAULT_NAMESPACE;
use muster_model::{Namespace, namespace_of};
use muster_security::{Acl, AclToken, Caller, Policy, TokenSecret, TokenType};

use super::RegistryState;
use crate::types::{OpError, Outcome, StoredPolicy};

impl RegistryState {
    /// Who holds `secret`: its token's name and what its policies allow, as applied here. A
    /// policy a token names that is no longer stored grants nothing.
    pub fn caller_of(&self, secret: &TokenSecret) -> Option<Caller> {
        let token = self.token_table.authenticate(secret)?;
        let acl = if token.is_management() {
            Acl::management()
        } else {
            Acl::of(token.policies.iter().filter_map(|name| self.policy(name)))
        };
        let policies = if token.is_management() {
            vec![TokenType::Management.to_string()]
        } else {
            token.policies.clone()
        };
        Some(Caller {
            name: token.name.clone(),
            policies,
            acl,
        })
    }

    /// The policy called `name`: a built-in one, or one an operator stored.
    pub fn policy(&self, name: &str) -> Option<&Policy> {
        Policy::built_in(name).or_else(|| self.policies.get(name).map(|stored| &stored.policy))
    }

    /// The namespace called `name`, if it exists (`default` always does).
    pub fn namespace(&self, name: &str) -> Option<Namespace> {
        if name == DEFAULT_NAMESPACE {
            return Some(
                self.namespaces
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| Namespace {
                        name: DEFAULT_NAMESPACE.to_owned(),
                        description: "The namespace of jobs that name none".to_owned(),
                        quota: Default::default(),
                    }),
            );
        }
        self.namespaces.get(name).cloned()
    }

    /// Every namespace, `default` included, by name.
    pub fn namespaces(&self) -> Vec<Namespace> {
        let mut all: Vec<Namespace> = self.namespace(DEFAULT_NAMESPACE).into_iter().collect();
        all.extend(
            self.namespaces
                .values()
                .filter(|ns| ns.name != DEFAULT_NAMESPACE)
                .cloned(),
        );
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    pub(super) fn put_token(&mut self, token: AclToken) {
        if let Some(old) = self.tokens.insert(token.accessor.clone(), token.clone()) {
            self.token_table.remove(&old.secret_hash);
        }
        self.token_table.insert(token);
    }

    pub(super) fn delete_token(&mut self, accessor: String) -> Result<Outcome, OpError> {
        let Some(token) = self.tokens.get(&accessor) else {
            return Err(OpError::UnknownToken(accessor));
        };
        if token.is_management() && self.tokens.values().filter(|t| t.is_management()).count() == 1
        {
            return Err(OpError::LastManagementToken(accessor));
        }
        let token = self
            .tokens
            .remove(&accessor)
            .ok_or(OpError::UnknownToken(accessor))?;
        self.token_table.remove(&token.secret_hash);
        Ok(Outcome::TokenDeleted)
    }

    pub(super) fn apply_policy(&mut self, policy: StoredPolicy) -> Outcome {
        self.policies.insert(policy.name.clone(), policy);
        Outcome::Stored
    }

    pub(super) fn delete_policy(&mut self, name: String) -> Result<Outcome, OpError> {
        match self.policies.remove(&name) {
            Some(_) => Ok(Outcome::Deleted),
            None => Err(OpError::UnknownPolicy(name)),
        }
    }

    pub(super) fn apply_namespace(&mut self, namespace: Namespace) -> Outcome {
        self.namespaces.insert(namespace.name.clone(), namespace);
        Outcome::Stored
    }

    /// Deletes `name` with its stopped jobs (their versions, finished slots and ended
    /// evaluations); refused for `default`, or while a job in it is not stopped.
    pub(super) fn delete_namespace(&mut self, name: String) -> Result<Outcome, OpError> {
        if name == DEFAULT_NAMESPACE {
            return Err(OpError::DefaultNamespace);
        }
        if !self.namespaces.contains_key(&name) {
            return Err(OpError::UnknownNamespace(name));
        }
        let in_namespace = |job: &str| namespace_of(job) == name;
        let live = self
            .jobs
            .values()
            .filter(|job| in_namespace(&job.name) && !job.stopped)
            .count();
        if live > 0 {
            return Err(OpError::NamespaceNotEmpty { name, jobs: live });
        }
        let gone: Vec<String> = self
            .jobs
            .keys()
            .filter(|job| in_namespace(job))
            .cloned()
            .collect();
        for job in &gone {
            self.jobs.remove(job);
            self.job_versions.remove(job);
            self.batch_finished.remove(job);
        }
        self.evals
            .retain(|_, eval| !in_namespace(&eval.job) || !super::has_ended(eval.status));
        self.ended.retain(|job, _| !in_namespace(job));
        self.namespaces.remove(&name);
        Ok(Outcome::Deleted)
    }

    /// Whether a job may be stored under `id`: its namespace exists.
    pub(super) fn check_job_namespace(&self, id: &str) -> Result<(), OpError> {
        let namespace = namespace_of(id);
        if namespace == DEFAULT_NAMESPACE || self.namespaces.contains_key(namespace) {
            Ok(())
        } else {
            Err(OpError::UnknownNamespace(namespace.to_owned()))
        }
    }
}
