//! A cluster CA and the role certificates it issues, as PEM text (what `muster tls ca create`
//! and `muster tls cert create` write).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use crate::identity::Role;

/// How long a CA is valid by default (5 years, as `nomad tls ca create`).
pub const DEFAULT_CA_VALIDITY: Duration = Duration::from_secs(5 * 365 * 24 * 3600);
/// How long a role certificate is valid by default (1 year, as `nomad tls cert create`).
pub const DEFAULT_CERT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// A certificate and its private key, PEM-encoded.
#[derive(Clone)]
pub struct PemPair {
    /// The certificate.
    pub cert: String,
    /// Its private key (PKCS#8).
    pub key: String,
}

impl std::fmt::Debug for PemPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PemPair").finish_non_exhaustive()
    }
}

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// The CA certificate or key given to sign with does not parse.
    #[error("the CA certificate or key cannot be used: {0}")]
    BadCa(String),
    /// A name is not valid in a certificate.
    #[error("invalid name {name:?} in a certificate: {reason}")]
    BadName {
        /// The name.
        name: String,
        /// Why.
        reason: String,
    },
    /// Key generation or signing failed.
    #[error("cannot create the certificate: {0}")]
    Generate(String),
}

fn generate(e: rcgen::Error) -> CertError {
    CertError::Generate(e.to_string())
}

/// When a certificate made now for `validity` stops being valid, from one minute ago (to
/// allow for clocks a little behind).
fn validity_window(params: &mut CertificateParams, validity: Duration) {
    let now = std::time::SystemTime::now();
    let start = now
        .checked_sub(Duration::from_secs(60))
        .unwrap_or(std::time::UNIX_EPOCH);
    params.not_before = start.into();
    params.not_after = (now + validity).into();
}

/// A new self-signed CA for `cluster`.
///
/// # Errors
/// [`CertError::Generate`] if key generation fails.
pub fn create_ca(cluster: &str, validity: Duration) -> Result<PemPair, CertError> {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, format!("Muster CA {cluster}"));
    name.push(DnType::OrganizationName, "Muster");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity_window(&mut params, validity);
    let key = KeyPair::generate().map_err(generate)?;
    let cert = params.self_signed(&key).map_err(generate)?;
    Ok(PemPair {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// What to put in a role certificate.
#[derive(Clone, Debug)]
pub struct CertRequest<'a> {
    /// Its role.
    pub role: Role,
    /// The node it is issued to (its common name); an agent speaks for the agent id bound to
    /// this name.
    pub name: &'a str,
    /// The cluster (its role name is `<role>.<cluster>.muster`).
    pub cluster: &'a str,
    /// Further DNS names or IP addresses the certificate is valid for (`localhost` and
    /// `127.0.0.1` are always added).
    pub extra_names: &'a [String],
    /// How long it is valid.
    pub validity: Duration,
}

/// A certificate for `request`, signed by the CA `ca`, valid from a minute ago for
/// `request.validity`.
///
/// # Errors
/// [`CertError::BadCa`] if `ca` does not parse, [`CertError::BadName`] for a name that
/// cannot be in a certificate.
pub fn issue(ca: &PemPair, request: &CertRequest<'_>) -> Result<PemPair, CertError> {
    let now = std::time::SystemTime::now();
    let start = now
        .checked_sub(Duration::from_secs(60))
        .unwrap_or(std::time::UNIX_EPOCH);
    sign(ca, request, start, now + request.validity)
}

/// A certificate like [`issue`]'s whose validity ended an hour ago, after lasting
/// `request.validity` (for tests of expired certificates).
///
/// # Errors
/// As [`issue`].
pub fn issue_expired(ca: &PemPair, request: &CertRequest<'_>) -> Result<PemPair, CertError> {
    let end = std::time::SystemTime::now()
        .checked_sub(Duration::from_secs(3600))
        .unwrap_or(std::time::UNIX_EPOCH);
    let start = end
        .checked_sub(request.validity)
        .unwrap_or(std::time::UNIX_EPOCH);
    sign(ca, request, start, end)
}

/// The one way a role certificate is made: `request`'s names, valid from `start` to `end`.
fn sign(
    ca: &PemPair,
    request: &CertRequest<'_>,
    start: std::time::SystemTime,
    end: std::time::SystemTime,
) -> Result<PemPair, CertError> {
    let ca_key = KeyPair::from_pem(&ca.key).map_err(|e| CertError::BadCa(e.to_string()))?;
    let issuer =
        Issuer::from_ca_cert_pem(&ca.cert, ca_key).map_err(|e| CertError::BadCa(e.to_string()))?;
    let mut names = vec![
        request.role.dns_name(request.cluster),
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
    ];
    names.extend(request.extra_names.iter().cloned());
    let mut params = CertificateParams::default();
    for name in names {
        let san = match name.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(name.clone().try_into().map_err(|e: rcgen::Error| {
                CertError::BadName {
                    name: name.clone(),
                    reason: e.to_string(),
                }
            })?),
        };
        params.subject_alt_names.push(san);
    }
    let mut subject = DistinguishedName::new();
    subject.push(DnType::CommonName, request.name);
    subject.push(DnType::OrganizationName, "Muster");
    params.distinguished_name = subject;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    params.not_before = start.into();
    params.not_after = end.into();
    let key = KeyPair::generate().map_err(generate)?;
    let cert = params.signed_by(&key, &issuer).map_err(generate)?;
    Ok(PemPair {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// Writes `pair` as `<dir>/<stem>.pem` and `<dir>/<stem>-key.pem` (the key readable by its
/// owner only) and returns the two paths.
///
/// # Errors
/// The operating system's error, with the path.
pub fn write_pair(dir: &Path, stem: &str, pair: &PemPair) -> std::io::Result<(PathBuf, PathBuf)> {
    let cert = dir.join(format!("{stem}.pem"));
    let key = dir.join(format!("{stem}-key.pem"));
    let named = |path: &Path, e: std::io::Error| {
        std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
    };
    std::fs::write(&cert, &pair.cert).map_err(|e| named(&cert, e))?;
    write_private(&key, &pair.key).map_err(|e| named(&key, e))?;
    Ok((cert, key))
}

/// Writes `contents` to `path` as a new file readable and writable by this user alone (0600):
/// for keys, tokens and registry snapshots. A file already there is replaced, never written
/// through: a symlink planted at `path` is removed, not followed (`O_EXCL`, `O_NOFOLLOW`).
///
/// # Errors
/// The old file cannot be removed, or the new one created or written.
pub fn write_private(path: &Path, contents: impl AsRef<[u8]>) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    file.write_all(contents.as_ref())?;
    file.sync_all()
}

/// A throwaway CA and one certificate per role, written to `dir` (`muster dev` uses it):
/// the files for the master, the agent and the CLI, in that order.
///
/// # Errors
/// If a certificate cannot be made or a file written.
pub fn write_dev_pki(
    dir: &Path,
    cluster: &str,
) -> Result<[crate::TlsFiles; 3], Box<dyn std::error::Error + Send + Sync>> {
    std::fs::create_dir_all(dir)?;
    let ca = create_ca(cluster, DEFAULT_CERT_VALIDITY)?;
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, &ca.cert)?;
    let mut files = Vec::with_capacity(3);
    for (role, name) in [
        (Role::Master, "dev-master"),
        (Role::Agent, "dev-agent"),
        (Role::Client, "dev-cli"),
    ] {
        let pair = issue(
            &ca,
            &CertRequest {
                role,
                name,
                cluster,
                extra_names: &[],
                validity: DEFAULT_CERT_VALIDITY,
            },
        )?;
        let (cert, key) = write_pair(dir, name, &pair)?;
        files.push(crate::TlsFiles {
            ca: ca_file.clone(),
            cert,
            key,
        });
    }
    let [master, agent, client]: [crate::TlsFiles; 3] = files
        .try_into()
        .map_err(|_| "three certificates were made")?;
    Ok([master, agent, client])
}
