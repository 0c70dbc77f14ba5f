//! The TLS settings `muster-master` and `muster-agent` share: where the certificates are,
//! the refusal to start without them unless `--insecure`, and reloading them on SIGHUP.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use muster_security::{DEFAULT_CLUSTER, Role, Security, Tls, TlsFiles};
use serde::Deserialize;

use crate::settings::Layer;

/// TLS flags, as `muster tls cert create` writes the files; in a config file, the table
/// `[tls]` with the keys `ca`, `cert`, `key`, `cluster` and `insecure` (flags win, see
/// [`Layer`]).
#[derive(Debug, Clone, Default, clap::Args, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsFlags {
    /// The cluster CA's certificate (PEM), as written by `muster tls ca create`.
    #[arg(long, value_name = "FILE")]
    #[serde(rename = "ca")]
    pub tls_ca: Option<PathBuf>,
    /// This node's certificate (PEM), as written by `muster tls cert create`.
    #[arg(long, value_name = "FILE")]
    #[serde(rename = "cert")]
    pub tls_cert: Option<PathBuf>,
    /// This node's private key (PEM).
    #[arg(long, value_name = "FILE")]
    #[serde(rename = "key")]
    pub tls_key: Option<PathBuf>,
    /// The cluster's name in certificates (`<role>.<cluster>.muster`) [default: global].
    #[arg(long)]
    pub cluster: Option<String>,
    /// Run without TLS, roles or ACL tokens: anyone who reaches a port controls the cluster.
    /// For experiments on a private machine only.
    #[arg(long)]
    pub insecure: bool,
}

/// The flags over a config file's `[tls]`: each file the flags leave unset from the file, and
/// insecure if either says so.
impl Layer for TlsFlags {
    fn over(self, lower: TlsFlags) -> TlsFlags {
        TlsFlags {
            tls_ca: self.tls_ca.or(lower.tls_ca),
            tls_cert: self.tls_cert.or(lower.tls_cert),
            tls_key: self.tls_key.or(lower.tls_key),
            cluster: self.cluster.or(lower.cluster),
            insecure: self.insecure || lower.insecure,
        }
    }
}

impl TlsFlags {
    /// The node's security: TLS loaded from the three files, checked to carry `role`; or
    /// [`Security::Insecure`] with `--insecure`, logged as a warning.
    ///
    /// # Errors
    /// No TLS files and no `--insecure`; some files but not all; `--insecure` with files;
    /// files that do not load; a certificate of another role.
    pub fn security(&self, role: Role) -> anyhow::Result<Security> {
        self.security_for_any(&[role])
    }

    /// As [`security`](TlsFlags::security), for a program that may run with a certificate
    /// of any of `roles`.
    ///
    /// # Errors
    /// As [`security`](TlsFlags::security).
    pub fn security_for_any(&self, roles: &[Role]) -> anyhow::Result<Security> {
        let role = roles.first().copied().unwrap_or(Role::Agent);
        let given = [
            ("--tls-ca", &self.tls_ca),
            ("--tls-cert", &self.tls_cert),
            ("--tls-key", &self.tls_key),
        ];
        let missing: Vec<&str> = given
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(|(n, _)| *n)
            .collect();
        if self.insecure {
            if missing.len() < given.len() {
                bail!("--insecure and TLS files were both given; choose one");
            }
            tracing::warn!(
                "running with --insecure: no TLS, no roles, no tokens; anyone who can reach \
                 this port controls the cluster"
            );
            return Ok(Security::Insecure);
        }
        if missing.len() == given.len() {
            bail!(
                "no TLS material: pass --tls-ca, --tls-cert and --tls-key (create them with \
                 `muster tls ca create` and `muster tls cert create --role {role}`), or \
                 --insecure to run without security"
            );
        }
        if !missing.is_empty() {
            bail!("incomplete TLS material: missing {}", missing.join(", "));
        }
        let (Some(ca), Some(cert), Some(key)) = (&self.tls_ca, &self.tls_cert, &self.tls_key)
        else {
            bail!("incomplete TLS material");
        };
        let cluster = self.cluster.as_deref().unwrap_or(DEFAULT_CLUSTER);
        let tls = load(ca, cert, key, cluster, roles)?;
        tracing::info!(identity = %tls.identity(), cluster, "TLS on");
        Ok(Security::Tls(tls))
    }
}

/// Loads the three files and checks the certificate's role is one of `roles` (the first
/// named in the error).
fn load(
    ca: &std::path::Path,
    cert: &std::path::Path,
    key: &std::path::Path,
    cluster: &str,
    roles: &[Role],
) -> anyhow::Result<Tls> {
    let tls = Tls::load(
        TlsFiles {
            ca: ca.to_owned(),
            cert: cert.to_owned(),
            key: key.to_owned(),
        },
        cluster,
    )?;
    let found = tls.identity().role;
    if !roles.contains(&found) {
        let role = roles.first().copied().unwrap_or(Role::Client);
        bail!(
            "{} is a {found} certificate; this program needs a {role} certificate \
             (`muster tls cert create --role {role}`)",
            cert.display()
        );
    }
    Ok(tls)
}

/// How a client program (a remote scheduler, the CLI) reaches a secured cluster: the
/// `MUSTER_*` variables, as Nomad's `NOMAD_CACERT`, `NOMAD_CLIENT_CERT`, `NOMAD_CLIENT_KEY` and
/// `NOMAD_TOKEN`; flags win.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClientFlags {
    /// The cluster CA's certificate.
    #[arg(long, global = true, env = "MUSTER_CACERT", value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// This client's certificate (role client).
    #[arg(long, global = true, env = "MUSTER_CLIENT_CERT", value_name = "FILE")]
    pub client_cert: Option<PathBuf>,
    /// Its private key.
    #[arg(long, global = true, env = "MUSTER_CLIENT_KEY", value_name = "FILE")]
    pub client_key: Option<PathBuf>,
    /// The ACL token to send.
    #[arg(long, global = true, env = "MUSTER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The cluster's name in certificates [default: global].
    #[arg(long = "tls-cluster", global = true, env = "MUSTER_CLUSTER")]
    pub cluster: Option<String>,
}

impl ClientFlags {
    /// TLS with the client certificate when all three files are given; plaintext (for an
    /// `--insecure` cluster) when none is.
    ///
    /// # Errors
    /// Some files but not all, files that do not load, a certificate that is not a client's.
    pub fn security(&self) -> anyhow::Result<Security> {
        match (&self.ca_cert, &self.client_cert, &self.client_key) {
            (None, None, None) => Ok(Security::Insecure),
            (Some(ca), Some(cert), Some(key)) => {
                let cluster = self.cluster.as_deref().unwrap_or(DEFAULT_CLUSTER);
                Ok(Security::Tls(load(
                    ca,
                    cert,
                    key,
                    cluster,
                    &[Role::Client],
                )?))
            }
            _ => {
                let missing: Vec<&str> = [
                    ("MUSTER_CACERT", self.ca_cert.is_none()),
                    ("MUSTER_CLIENT_CERT", self.client_cert.is_none()),
                    ("MUSTER_CLIENT_KEY", self.client_key.is_none()),
                ]
                .into_iter()
                .filter(|(_, missing)| *missing)
                .map(|(name, _)| name)
                .collect();
                bail!("incomplete TLS settings: {} not set", missing.join(", "))
            }
        }
    }

    /// The token, if one is set.
    pub fn token(&self) -> Option<muster_security::TokenSecret> {
        self.token
            .as_deref()
            .filter(|t| !t.is_empty())
            .map(muster_security::TokenSecret::new)
    }
}

/// Reloads `security`'s certificates and key each time the process gets SIGHUP; new
/// connections use them, open ones keep theirs. A reload that fails keeps the old material
/// and logs why. Does nothing when insecure. Call from inside the tokio runtime.
///
/// # Errors
/// If the SIGHUP handler cannot be installed.
pub fn reload_on_sighup(security: &Security) -> anyhow::Result<()> {
    let Some(tls) = security.tls().cloned() else {
        return Ok(());
    };
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("cannot install the SIGHUP handler")?;
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match tls.reload() {
                Ok(()) => tracing::info!(identity = %tls.identity(), "TLS material reloaded"),
                Err(e) => {
                    tracing::error!(error = %e, "TLS reload failed; keeping the old material")
                }
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_tls_files_or_insecure_a_node_refuses_to_start() {
        let error = TlsFlags::default()
            .security(Role::Master)
            .expect_err("no material");
        let text = error.to_string();
        assert!(
            text.contains("--tls-ca") && text.contains("--insecure"),
            "{text}"
        );
    }

    #[test]
    fn partial_material_names_what_is_missing() {
        let flags = TlsFlags {
            tls_ca: Some("ca.pem".into()),
            ..TlsFlags::default()
        };
        let text = flags
            .security(Role::Agent)
            .expect_err("partial")
            .to_string();
        assert!(text.contains("--tls-cert, --tls-key"), "{text}");
    }

    #[test]
    fn insecure_is_explicit_and_exclusive() {
        let insecure = TlsFlags {
            insecure: true,
            ..TlsFlags::default()
        };
        assert!(
            insecure
                .security(Role::Master)
                .expect("insecure")
                .is_insecure()
        );
        let both = TlsFlags {
            tls_ca: Some("ca.pem".into()),
            ..insecure
        };
        assert!(both.security(Role::Master).is_err());
    }
}
