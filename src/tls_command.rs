//! `muster tls ca create` and `muster tls cert create`: a cluster CA and role certificates as
//! PEM files, as `nomad tls` writes them.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Subcommand;
use muster_security::certs::{self, CertRequest, PemPair};
use muster_security::{DEFAULT_CLUSTER, Role};

const DAY: u64 = 24 * 3600;

/// `muster tls ...`
#[derive(Debug, Subcommand)]
pub(crate) enum TlsCommand {
    /// The cluster CA.
    Ca {
        #[command(subcommand)]
        command: CaCommand,
    },
    /// Certificates for masters, agents and clients.
    Cert {
        #[command(subcommand)]
        command: CertCommand,
    },
}

/// `muster tls ca ...`
#[derive(Debug, Subcommand)]
pub(crate) enum CaCommand {
    /// Write a new CA: muster-ca.pem and muster-ca-key.pem (keep the key safe).
    Create {
        /// The cluster's name, in every certificate's role name `<role>.<cluster>.muster`.
        #[arg(long, default_value = DEFAULT_CLUSTER)]
        cluster: String,
        /// How long the CA is valid, in days.
        #[arg(long, default_value_t = 1825)]
        days: u64,
        /// Where to write the files.
        #[arg(long, default_value = ".")]
        out_dir: PathBuf,
    },
}

/// `muster tls cert ...`
#[derive(Debug, Subcommand)]
pub(crate) enum CertCommand {
    /// Write a certificate for one role, signed by the CA: <cluster>-<role>-muster-<name>.pem
    /// and its -key.pem.
    Create {
        /// master, agent or client. An agent certificate cannot pose as a master: each end
        /// checks the other's role.
        #[arg(long)]
        role: Role,
        /// The node it is for (its common name): a master's or agent's host name, a person's
        /// or program's name for a client. An agent is bound to this name when it first
        /// registers: no other certificate may speak for it afterwards. [default: this
        /// machine's host name; `cli` for clients]
        #[arg(long)]
        name: Option<String>,
        /// The CA certificate.
        #[arg(long, default_value = "muster-ca.pem")]
        ca: PathBuf,
        /// The CA's key.
        #[arg(long, default_value = "muster-ca-key.pem")]
        ca_key: PathBuf,
        /// The cluster's name (as given to `muster tls ca create`).
        #[arg(long, default_value = DEFAULT_CLUSTER)]
        cluster: String,
        /// How long the certificate is valid, in days.
        #[arg(long, default_value_t = 365)]
        days: u64,
        /// A further DNS name the certificate is valid for; repeat for each.
        #[arg(long = "additional-dnsname", value_name = "NAME")]
        dns_names: Vec<String>,
        /// A further IP address the certificate is valid for; repeat for each.
        #[arg(long = "additional-ipaddress", value_name = "IP")]
        ip_addresses: Vec<std::net::IpAddr>,
        /// Where to write the files.
        #[arg(long, default_value = ".")]
        out_dir: PathBuf,
    },
}

fn validity(days: u64) -> anyhow::Result<Duration> {
    if days == 0 {
        bail!("--days must be at least 1");
    }
    Ok(Duration::from_secs(days.saturating_mul(DAY)))
}

/// Refuses to overwrite `paths`.
fn fresh(paths: &[&Path]) -> anyhow::Result<()> {
    for path in paths {
        if path.exists() {
            bail!("{} exists; not overwriting it", path.display());
        }
    }
    Ok(())
}

fn write(dir: &Path, stem: &str, pair: &PemPair) -> anyhow::Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let cert = dir.join(format!("{stem}.pem"));
    let key = dir.join(format!("{stem}-key.pem"));
    fresh(&[&cert, &key])?;
    Ok(certs::write_pair(dir, stem, pair)?)
}

fn read(path: &Path, what: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the {what} {}", path.display()))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Runs a `muster tls` command.
pub(crate) fn run(command: TlsCommand) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match command {
        TlsCommand::Ca {
            command:
                CaCommand::Create {
                    cluster,
                    days,
                    out_dir,
                },
        } => {
            let pair = certs::create_ca(&cluster, validity(days)?)?;
            let (cert, key) = write(&out_dir, "muster-ca", &pair)?;
            writeln!(out, "==> CA certificate saved to: {}", cert.display())?;
            writeln!(out, "==> CA key saved to: {}", key.display())?;
        }
        TlsCommand::Cert {
            command:
                CertCommand::Create {
                    role,
                    name,
                    ca,
                    ca_key,
                    cluster,
                    days,
                    dns_names,
                    ip_addresses,
                    out_dir,
                },
        } => {
            let authority = PemPair {
                cert: read(&ca, "CA certificate")?,
                key: read(&ca_key, "CA key")?,
            };
            let name = name.unwrap_or_else(|| match role {
                Role::Client => "cli".to_owned(),
                Role::Master | Role::Agent => hostname(),
            });
            let extra: Vec<String> = dns_names
                .into_iter()
                .chain(ip_addresses.iter().map(ToString::to_string))
                .collect();
            let pair = certs::issue(
                &authority,
                &CertRequest {
                    role,
                    name: &name,
                    cluster: &cluster,
                    extra_names: &extra,
                    validity: validity(days)?,
                },
            )
            .with_context(|| {
                format!("with the CA {} and key {}", ca.display(), ca_key.display())
            })?;
            let stem = format!("{cluster}-{role}-muster-{name}");
            let (cert, key) = write(&out_dir, &stem, &pair)?;
            writeln!(
                out,
                "==> {role} certificate for {name:?} ({}) saved to: {}",
                role.dns_name(&cluster),
                cert.display()
            )?;
            writeln!(out, "==> {role} key saved to: {}", key.display())?;
        }
    }
    Ok(())
}
