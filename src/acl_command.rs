//! `muster acl`: bootstrap the ACL system; create, list and delete tokens; apply, list, show
//! and delete policies.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Subcommand;
use muster::proto::cluster as pb;

use crate::connection::Connection;
use crate::output::{Format, print_json};

/// `muster acl ...`
#[derive(Debug, Subcommand)]
pub(crate) enum AclCommand {
    /// Create the first management token (once per cluster; needs a client certificate).
    Bootstrap,
    /// Tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Policies: named rules a token carries (see docs/security.md for the file format).
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
}

/// `muster acl policy ...`
#[derive(Debug, Subcommand)]
pub(crate) enum PolicyCommand {
    /// Create or change a policy from its rules file (TOML).
    Apply {
        /// The policy's name: letters, digits, '-' and '_' (not a built-in one's).
        name: String,
        /// The rules file, or `-` for standard input.
        file: PathBuf,
    },
    /// List policies, the built-in ones included.
    List,
    /// Show a policy's rules.
    Info {
        /// The policy's name.
        name: String,
    },
    /// Delete a policy; tokens that carry it lose what it granted.
    Delete {
        /// The policy's name.
        name: String,
    },
}

/// `muster acl token ...`
#[derive(Debug, Subcommand)]
pub(crate) enum TokenCommand {
    /// Create a token; its secret is shown once.
    Create {
        /// A policy the token carries; repeat for several. Built-in: read (jobs, tasks,
        /// agents; env values redacted, no task output), submit (run, stop and read jobs with
        /// their env and output), operate (read, and drain agents), schedule (remote scheduler
        /// workers); or one stored with `muster acl policy apply`. `management` alone makes a
        /// management token (everything, tokens and policies included).
        #[arg(long = "policy", required = true)]
        policies: Vec<String>,
        /// A name for people.
        #[arg(long, default_value = "token")]
        name: String,
    },
    /// List tokens (never their secrets).
    List,
    /// Delete a token by its accessor: refused on every master from then on.
    Delete {
        /// The token's accessor, as `muster acl token list` shows it.
        accessor: String,
    },
}

fn print_secret(out: &mut impl std::io::Write, token: &pb::AclTokenSecret) -> std::io::Result<()> {
    writeln!(out, "Accessor  {}", token.accessor)?;
    writeln!(out, "Name      {}", token.name)?;
    writeln!(out, "Policy    {}", token.policy)?;
    writeln!(out, "Secret    {}", token.secret)?;
    writeln!(
        out,
        "The secret is shown only now; keep it (e.g. export MUSTER_TOKEN={}).",
        token.secret
    )
}

/// Runs a `muster acl` command.
pub(crate) async fn run(
    connection: &Connection,
    command: AclCommand,
    format: Format,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match command {
        AclCommand::Bootstrap => {
            let token = connection
                .at_leader(|mut client| async move {
                    client.acl_bootstrap(pb::AclBootstrapRequest {}).await
                })
                .await?;
            if format.is_json() {
                drop(out);
                return print_json(&token_document(&token));
            }
            print_secret(&mut out, &token)?;
        }
        AclCommand::Token {
            command: TokenCommand::Create { policies, name },
        } => {
            let (policy, policies) = match policies.as_slice() {
                [only] if only == "management" => (only.clone(), Vec::new()),
                _ => (String::new(), policies),
            };
            let token = connection
                .at_leader(|mut client| {
                    let request = pb::CreateTokenRequest {
                        name: name.clone(),
                        policy: policy.clone(),
                        policies: policies.clone(),
                    };
                    async move { client.create_token(request).await }
                })
                .await?;
            if format.is_json() {
                drop(out);
                return print_json(&token_document(&token));
            }
            print_secret(&mut out, &token)?;
        }
        AclCommand::Token {
            command: TokenCommand::List,
        } => {
            let list = connection
                .at_leader(|mut client| async move {
                    client.list_tokens(pb::ListTokensRequest {}).await
                })
                .await?;
            if format.is_json() {
                drop(out);
                let tokens: Vec<_> = list
                    .tokens
                    .iter()
                    .map(|t| {
                        serde_json::json!({
                            "accessor": t.accessor,
                            "name": t.name,
                            "type": t.r#type,
                            "policies": t.policies,
                            "policy": t.policy,
                            "created_ms": t.created_ms,
                        })
                    })
                    .collect();
                return print_json(&serde_json::json!({ "tokens": tokens }));
            }
            writeln!(
                out,
                "{:<18} {:<20} {:<24} CREATED",
                "ACCESSOR", "NAME", "POLICIES"
            )?;
            for token in list.tokens {
                writeln!(
                    out,
                    "{:<18} {:<20} {:<24} {}",
                    token.accessor,
                    token.name,
                    token.policy,
                    crate::when::when(token.created_ms)
                )?;
            }
        }
        AclCommand::Token {
            command: TokenCommand::Delete { accessor },
        } => {
            connection
                .at_leader(|mut client| {
                    let accessor = accessor.clone();
                    async move {
                        client
                            .delete_token(pb::DeleteTokenRequest { accessor })
                            .await
                    }
                })
                .await?;
            if format.is_json() {
                drop(out);
                return print_json(&serde_json::json!({ "deleted": accessor }));
            }
            writeln!(out, "token {accessor} deleted")?;
        }
        AclCommand::Policy { command } => {
            drop(out);
            policy(connection, command, format).await?;
        }
    }
    Ok(())
}

/// Runs a `muster acl policy` command.
async fn policy(
    connection: &Connection,
    command: PolicyCommand,
    format: Format,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match command {
        PolicyCommand::Apply { name, file } => {
            let rules = if file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())
                    .context("cannot read the policy from standard input")?
            } else {
                std::fs::read_to_string(&file)
                    .with_context(|| format!("cannot read the policy file {}", file.display()))?
            };
            // Checked here first, so a mistake names the file and the line.
            muster_security::Policy::parse(&rules)
                .with_context(|| format!("in {}", file.display()))?;
            connection
                .at_leader(|mut client| {
                    let request = pb::AclPolicy {
                        name: name.clone(),
                        rules: rules.clone(),
                        ..pb::AclPolicy::default()
                    };
                    async move { client.apply_policy(request).await }
                })
                .await?;
            if format.is_json() {
                drop(out);
                return print_json(&serde_json::json!({ "applied": name }));
            }
            writeln!(out, "policy {name} applied")?;
        }
        PolicyCommand::List => {
            let list = list_policies(connection).await?;
            if format.is_json() {
                drop(out);
                return print_json(
                    &serde_json::json!({ "policies": list.policies.iter().map(policy_document).collect::<Vec<_>>() }),
                );
            }
            writeln!(out, "{:<24} {:<9} DESCRIPTION", "NAME", "BUILT-IN")?;
            for policy in &list.policies {
                let built_in = if policy.built_in { "yes" } else { "no" };
                writeln!(
                    out,
                    "{:<24} {:<9} {}",
                    policy.name, built_in, policy.description
                )?;
            }
        }
        PolicyCommand::Info { name } => {
            let list = list_policies(connection).await?;
            let Some(policy) = list.policies.iter().find(|p| p.name == name) else {
                anyhow::bail!("no policy named {name:?}");
            };
            if format.is_json() {
                drop(out);
                return print_json(&policy_document(policy));
            }
            write!(out, "{}", policy.rules)?;
        }
        PolicyCommand::Delete { name } => {
            connection
                .at_leader(|mut client| {
                    let name = name.clone();
                    async move { client.delete_policy(pb::DeletePolicyRequest { name }).await }
                })
                .await?;
            if format.is_json() {
                drop(out);
                return print_json(&serde_json::json!({ "deleted": name }));
            }
            writeln!(out, "policy {name} deleted")?;
        }
    }
    Ok(())
}

async fn list_policies(connection: &Connection) -> anyhow::Result<pb::PolicyList> {
    connection
        .at_leader(
            |mut client| async move { client.list_policies(pb::ListPoliciesRequest {}).await },
        )
        .await
}

/// A policy as JSON.
fn policy_document(policy: &pb::AclPolicy) -> serde_json::Value {
    serde_json::json!({
        "name": policy.name,
        "description": policy.description,
        "built_in": policy.built_in,
        "rules": policy.rules,
    })
}

/// A token as created, with its secret (the only time it is shown), as JSON.
fn token_document(token: &pb::AclTokenSecret) -> serde_json::Value {
    serde_json::json!({
        "accessor": token.accessor,
        "name": token.name,
        "type": token.r#type,
        "policies": token.policies,
        "policy": token.policy,
        "secret": token.secret,
    })
}
