//! ACL tokens, policies and namespaces, as operators manage them: bootstrap, create, list,
//! delete. Each change is a registry write; the guard in front of the APIs reads the applied
//! tokens and policies, and the namespaces bound what a policy grants. A namespace's changed
//! quota releases its blocked evaluations.

use muster_actor::{Context, Pid, Reply};
use muster_proto::cluster as pb;
use muster_registry::{Op, OpError, Outcome, Registrar};
use muster_security::acl::new_accessor;
use muster_security::{AclToken, Policy, TokenSecret, TokenType};

use super::leadership::Role;
use super::registry_writes::now_ms;
use super::{Master, answered_request};
use crate::error::ServiceError;

/// The first management token, once per cluster (`muster acl bootstrap`).
#[derive(Debug)]
pub struct BootstrapAcl {
    /// The token, with its secret (shown once).
    pub reply: Reply<Result<pb::AclTokenSecret, ServiceError>>,
}

/// A new token with a name and its policies.
#[derive(Debug)]
pub struct CreateToken {
    /// The token's name.
    pub name: String,
    /// Client or management.
    pub token_type: TokenType,
    /// The policies a client token carries (each built-in or stored).
    pub policies: Vec<String>,
    /// The token, with its secret (shown once).
    pub reply: Reply<Result<pb::AclTokenSecret, ServiceError>>,
}

/// Every token, without secrets.
#[derive(Debug)]
pub struct ListTokens {
    /// The tokens.
    pub reply: Reply<Result<pb::TokenList, ServiceError>>,
}

/// Delete the token with this accessor.
#[derive(Debug)]
pub struct DeleteToken {
    /// The token's accessor.
    pub accessor: String,
    /// Done once written.
    pub reply: Reply<Result<pb::DeleteTokenReply, ServiceError>>,
}

/// A change to the policies or namespaces ([`Op::ApplyPolicy`], [`Op::DeletePolicy`],
/// [`Op::ApplyNamespace`], [`Op::DeleteNamespace`]), checked by the operator API before.
#[derive(Debug)]
pub struct ChangeAccess {
    /// The change.
    pub op: Op,
    /// Done once written.
    pub reply: Reply<Result<(), ServiceError>>,
}

/// Every policy, the built-in ones included, by name.
#[derive(Debug)]
pub struct ListPolicies {
    /// The policies.
    pub reply: Reply<Result<pb::PolicyList, ServiceError>>,
}

/// Every namespace, `default` included.
#[derive(Debug)]
pub struct ListNamespaces {
    /// The namespaces, by name.
    pub reply: Reply<Result<Vec<muster_model::Namespace>, ServiceError>>,
}

answered_request!(
    BootstrapAcl,
    CreateToken,
    ListTokens,
    DeleteToken,
    ChangeAccess,
    ListPolicies,
    ListNamespaces,
);

/// The file in a master's data directory through which an operator who lost every management
/// token bootstraps the ACL system again (as Nomad's `acl-bootstrap-reset`): it holds the reset
/// index that a refused bootstrap names, and is read by the leader on the next bootstrap.
pub const ACL_BOOTSTRAP_RESET_FILE: &str = "acl-bootstrap-reset";

/// The reset index written in `file`, if there is one.
fn read_reset_index(file: &std::path::Path) -> Result<Option<u64>, ServiceError> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => {
            return Err(ServiceError::FailedPrecondition(format!(
                "cannot read the ACL reset file {}: {error}",
                file.display()
            )));
        }
    };
    text.trim().parse::<u64>().map(Some).map_err(|_| {
        ServiceError::FailedPrecondition(format!(
            "the ACL reset file {} holds {:?}, not a reset index (a whole number, as a refused \
             bootstrap names it)",
            file.display(),
            text.trim()
        ))
    })
}

/// A new token named `name`, and its secret.
fn new_token(
    name: String,
    token_type: TokenType,
    policies: Vec<String>,
) -> Result<(AclToken, TokenSecret), ServiceError> {
    let unavailable = |_| ServiceError::Unavailable("the system's random source failed".into());
    let secret = TokenSecret::generate().map_err(unavailable)?;
    let token = AclToken {
        accessor: new_accessor().map_err(unavailable)?,
        name,
        token_type,
        policies,
        secret_hash: secret.hash(),
        created_ms: now_ms(),
    };
    Ok((token, secret))
}

/// What a token may do, in one word list: `management`, or its policies.
fn policy_words(token: &AclToken) -> String {
    if token.is_management() {
        TokenType::Management.to_string()
    } else {
        token.policies.join(",")
    }
}

fn shown(token: &AclToken, secret: &TokenSecret) -> pb::AclTokenSecret {
    pb::AclTokenSecret {
        accessor: token.accessor.clone(),
        name: token.name.clone(),
        policy: policy_words(token),
        secret: secret.expose().to_owned(),
        r#type: token.token_type.to_string(),
        policies: token.policies.clone(),
    }
}

/// A registry write's outcome as the API answers it.
fn written(
    written: Result<Result<Outcome, muster_registry::WriteError>, muster_actor::AskError>,
) -> Result<Outcome, ServiceError> {
    match written {
        Ok(Ok(outcome)) => Ok(outcome),
        Ok(Err(muster_registry::WriteError::Rejected(OpError::AclAlreadyBootstrapped {
            reset_index,
        }))) => Err(ServiceError::FailedPrecondition(format!(
            "ACL already bootstrapped (reset index: {reset_index}); to bootstrap again after \
             losing every management token, write {reset_index} into the file \
             {ACL_BOOTSTRAP_RESET_FILE} in the leading master's data directory and bootstrap \
             again"
        ))),
        Ok(Err(muster_registry::WriteError::Rejected(OpError::LastManagementToken(accessor)))) => {
            Err(ServiceError::FailedPrecondition(format!(
                "token {accessor:?} is the last management token; create another management \
                 token before deleting it"
            )))
        }
        Ok(Err(muster_registry::WriteError::Rejected(OpError::UnknownToken(accessor)))) => {
            Err(ServiceError::UnknownToken(accessor))
        }
        Ok(Err(muster_registry::WriteError::NotLeader { leader })) => {
            Err(ServiceError::not_leader(leader.map(|(_, address)| address)))
        }
        Ok(Err(e)) => Err(ServiceError::Unavailable(format!(
            "registry write failed: {e}"
        ))),
        Err(e) => Err(ServiceError::Unavailable(format!(
            "registrar unavailable: {e}"
        ))),
    }
}

impl Master {
    /// The leader's registrar, or why not: ACL changes and reads go through the leader.
    fn acl_registrar(&self) -> Result<Pid<Registrar>, ServiceError> {
        match &self.role {
            Role::Leading { registrar, .. } => Ok(registrar.clone()),
            _ => Err(self.not_leading()),
        }
    }

    /// [`BootstrapAcl`].
    pub(super) fn bootstrap_acl(
        &mut self,
        BootstrapAcl { reply }: BootstrapAcl,
        ctx: &mut Context<Self>,
    ) {
        let registrar = match self.acl_registrar() {
            Ok(registrar) => registrar,
            Err(e) => return reply.send(Err(e)),
        };
        let (token, secret) = match new_token("bootstrap".into(), TokenType::Management, Vec::new())
        {
            Ok(made) => made,
            Err(e) => return reply.send(Err(e)),
        };
        let reset_file = self.config.data_dir.join(ACL_BOOTSTRAP_RESET_FILE);
        let op = match read_reset_index(&reset_file) {
            Ok(None) => Op::BootstrapAcl(token.clone()),
            Ok(Some(reset_index)) => Op::BootstrapAclAgain {
                token: token.clone(),
                reset_index,
            },
            Err(refusal) => return reply.send(Err(refusal)),
        };
        let resetting = matches!(op, Op::BootstrapAclAgain { .. });
        let write = self.write_registry(&registrar, op);
        ctx.defer(write, move |_master: &mut Master, _ctx, outcome| {
            let answer = written(outcome).map(|_| shown(&token, &secret));
            if answer.is_ok() {
                tracing::info!(accessor = %token.accessor, reset = resetting, "ACL bootstrapped");
                if resetting && let Err(error) = std::fs::remove_file(&reset_file) {
                    // It names an index that is gone: it cannot be used again.
                    tracing::warn!(file = %reset_file.display(), %error, "could not remove the used ACL reset file");
                }
            }
            reply.send(answer);
        });
    }

    /// [`CreateToken`].
    pub(super) fn create_token(
        &mut self,
        CreateToken {
            name,
            token_type,
            policies,
            reply,
        }: CreateToken,
        ctx: &mut Context<Self>,
    ) {
        let registrar = match self.acl_registrar() {
            Ok(registrar) => registrar,
            Err(e) => return reply.send(Err(e)),
        };
        if token_type == TokenType::Client && policies.is_empty() {
            return reply.send(Err(ServiceError::InvalidArgument {
                field: "policies".into(),
                message: "a client token needs at least one policy (built-in: read, submit, \
                          operate, schedule; or one stored with `muster acl policy apply`)"
                    .into(),
            }));
        }
        let unknown = self.registry.reader().read(|state| {
            policies
                .iter()
                .find(|name| state.policy(name).is_none())
                .cloned()
        });
        if let Some(unknown) = unknown {
            return reply.send(Err(ServiceError::InvalidArgument {
                field: "policies".into(),
                message: format!(
                    "no policy named {unknown:?} (built-in: read, submit, operate, schedule; \
                     stored ones: `muster acl policy list`)"
                ),
            }));
        }
        if name.trim().is_empty() {
            return reply.send(Err(ServiceError::InvalidArgument {
                field: "name".into(),
                message: "a token needs a name".into(),
            }));
        }
        let (token, secret) = match new_token(name, token_type, policies) {
            Ok(made) => made,
            Err(e) => return reply.send(Err(e)),
        };
        let write = self.write_registry(&registrar, Op::CreateToken(token.clone()));
        ctx.defer(write, move |_master: &mut Master, _ctx, outcome| {
            let answer = written(outcome).map(|_| shown(&token, &secret));
            if answer.is_ok() {
                tracing::info!(accessor = %token.accessor, name = %token.name,
                    policies = %policy_words(&token), "token created");
            }
            reply.send(answer);
        });
    }

    /// [`ListTokens`].
    pub(super) fn list_tokens(
        &mut self,
        ListTokens { reply }: ListTokens,
        _ctx: &mut Context<Self>,
    ) {
        if let Err(e) = self.acl_registrar() {
            return reply.send(Err(e));
        }
        let tokens = self.registry.reader().read(|state| {
            state
                .tokens
                .values()
                .map(|t| pb::AclTokenInfo {
                    accessor: t.accessor.clone(),
                    name: t.name.clone(),
                    policy: policy_words(t),
                    created_ms: t.created_ms,
                    r#type: t.token_type.to_string(),
                    policies: t.policies.clone(),
                })
                .collect()
        });
        reply.send(Ok(pb::TokenList { tokens }));
    }

    /// [`DeleteToken`].
    pub(super) fn delete_token(
        &mut self,
        DeleteToken { accessor, reply }: DeleteToken,
        ctx: &mut Context<Self>,
    ) {
        let registrar = match self.acl_registrar() {
            Ok(registrar) => registrar,
            Err(e) => return reply.send(Err(e)),
        };
        let write = self.write_registry(&registrar, Op::DeleteToken { accessor });
        ctx.defer(write, move |_master: &mut Master, _ctx, outcome| {
            reply.send(written(outcome).map(|_| pb::DeleteTokenReply {}));
        });
    }

    /// [`ChangeAccess`].
    pub(super) fn change_access(
        &mut self,
        ChangeAccess { op, reply }: ChangeAccess,
        ctx: &mut Context<Self>,
    ) {
        let registrar = match self.acl_registrar() {
            Ok(registrar) => registrar,
            Err(e) => return reply.send(Err(e)),
        };
        tracing::info!(change = ?op, "access change");
        // A namespace whose quota changes: its blocked evaluations may now place more.
        let requota = match &op {
            Op::ApplyNamespace(namespace) => {
                let was = self.registry.reader().read(|state| {
                    let stored = state.namespaces.get(&namespace.name);
                    stored.map(|ns| ns.quota.clone()).unwrap_or_default()
                });
                (was != namespace.quota).then(|| namespace.name.clone())
            }
            _ => None,
        };
        let write = self.write_registry(&registrar, op);
        ctx.defer(write, move |master: &mut Master, _ctx, outcome| {
            if let (Ok(Ok(_)), Some(namespace)) = (&outcome, requota) {
                let index = master.next_index();
                master.quota_freed(&namespace, true, index);
            }
            reply.send(match outcome {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(e.into()),
                Err(e) => Err(e.into()),
            });
        });
    }

    /// [`ListPolicies`].
    pub(super) fn list_policies(
        &mut self,
        ListPolicies { reply }: ListPolicies,
        _ctx: &mut Context<Self>,
    ) {
        if let Err(e) = self.acl_registrar() {
            return reply.send(Err(e));
        }
        let mut policies: Vec<pb::AclPolicy> = Policy::built_in_names()
            .filter_map(|name| {
                let policy = Policy::built_in(name)?;
                Some(pb::AclPolicy {
                    name: name.to_owned(),
                    rules: Policy::built_in_text(name).unwrap_or_default().to_owned(),
                    description: policy.description.clone(),
                    built_in: true,
                })
            })
            .collect();
        self.registry.reader().read(|state| {
            policies.extend(state.policies.values().map(|stored| pb::AclPolicy {
                name: stored.name.clone(),
                rules: stored.rules.clone(),
                description: stored.policy.description.clone(),
                built_in: false,
            }));
        });
        policies.sort_by(|a, b| a.name.cmp(&b.name));
        reply.send(Ok(pb::PolicyList { policies }));
    }

    /// [`ListNamespaces`], from this master's applied registry.
    pub(super) fn list_namespaces(
        &mut self,
        ListNamespaces { reply }: ListNamespaces,
        _ctx: &mut Context<Self>,
    ) {
        reply.send(Ok(self.registry.reader().read(|state| state.namespaces())));
    }
}
