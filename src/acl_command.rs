//! `muster acl`: bootstrap the ACL system, and create, list and delete tokens.

use std::io::Write as _;

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
}

/// `muster acl token ...`
#[derive(Debug, Subcommand)]
pub(crate) enum TokenCommand {
    /// Create a token; its secret is shown once.
    Create {
        /// read (state, jobs, tasks; env values redacted), submit (run and stop jobs, read
        /// their env), operate (agents, registry), schedule (remote scheduler workers) or
        /// management (everything, tokens included).
        #[arg(long)]
        policy: String,
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
            command: TokenCommand::Create { policy, name },
        } => {
            let token = connection
                .at_leader(|mut client| {
                    let request = pb::CreateTokenRequest {
                        name: name.clone(),
                        policy: policy.clone(),
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
                            "policy": t.policy,
                            "created_ms": t.created_ms,
                        })
                    })
                    .collect();
                return print_json(&serde_json::json!({ "tokens": tokens }));
            }
            writeln!(
                out,
                "{:<18} {:<20} {:<12} CREATED",
                "ACCESSOR", "NAME", "POLICY"
            )?;
            for token in list.tokens {
                writeln!(
                    out,
                    "{:<18} {:<20} {:<12} {}",
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
    }
    Ok(())
}

/// A token as created, with its secret (the only time it is shown), as JSON.
fn token_document(token: &pb::AclTokenSecret) -> serde_json::Value {
    serde_json::json!({
        "accessor": token.accessor,
        "name": token.name,
        "policy": token.policy,
        "secret": token.secret,
    })
}
