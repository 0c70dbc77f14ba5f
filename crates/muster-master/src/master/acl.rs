//! ACL tokens, as operators manage them: bootstrap, create, list, delete. Each change is a
//! registry write; the guard in front of the APIs reads the applied tokens.

use muster_actor::{Context, Pid, Reply};
use muster_proto::cluster as pb;
use muster_registry::{Op, OpError, Outcome, Registrar};
use muster_security::acl::new_accessor;
use muster_security::{AclToken, Policy, TokenSecret};

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

/// A new token with a name and a policy.
#[derive(Debug)]
pub struct CreateToken {
    /// The token's name.
    pub name: String,
    /// Its policy (`read`, `submit`, `schedule`, `management`, ...).
    pub policy: String,
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

answered_request!(BootstrapAcl, CreateToken, ListTokens, DeleteToken);

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

/// A new token of `policy` named `name`, and its secret.
fn new_token(name: String, policy: Policy) -> Result<(AclToken, TokenSecret), ServiceError> {
    let unavailable = |_| ServiceError::Unavailable("the system's random source failed".into());
    let secret = TokenSecret::generate().map_err(unavailable)?;
    let token = AclToken {
        accessor: new_accessor().map_err(unavailable)?,
        name,
        policy,
        secret_hash: secret.hash(),
        created_ms: now_ms(),
    };
    Ok((token, secret))
}

fn shown(token: &AclToken, secret: &TokenSecret) -> pb::AclTokenSecret {
    pb::AclTokenSecret {
        accessor: token.accessor.clone(),
        name: token.name.clone(),
        policy: token.policy.to_string(),
        secret: secret.expose().to_owned(),
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
        let (token, secret) = match new_token("bootstrap".into(), Policy::Management) {
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
            policy,
            reply,
        }: CreateToken,
        ctx: &mut Context<Self>,
    ) {
        let registrar = match self.acl_registrar() {
            Ok(registrar) => registrar,
            Err(e) => return reply.send(Err(e)),
        };
        let policy = match policy.parse::<Policy>() {
            Ok(policy) => policy,
            Err(e) => {
                return reply.send(Err(ServiceError::InvalidArgument {
                    field: "policy".into(),
                    message: e.to_string(),
                }));
            }
        };
        if name.trim().is_empty() {
            return reply.send(Err(ServiceError::InvalidArgument {
                field: "name".into(),
                message: "a token needs a name".into(),
            }));
        }
        let (token, secret) = match new_token(name, policy) {
            Ok(made) => made,
            Err(e) => return reply.send(Err(e)),
        };
        let write = self.write_registry(&registrar, Op::CreateToken(token.clone()));
        ctx.defer(write, move |_master: &mut Master, _ctx, outcome| {
            let answer = written(outcome).map(|_| shown(&token, &secret));
            if answer.is_ok() {
                tracing::info!(accessor = %token.accessor, name = %token.name,
                    policy = %token.policy, "token created");
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
                    policy: t.policy.to_string(),
                    created_ms: t.created_ms,
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
}
